//! Model provider metrics. Labels are closed sets (provider, outcome, reason, token kind) and
//! the model names of the configuration and of the server's answers; URLs and ids go to traces
//! only.
//!
//! Two of them follow the OpenTelemetry GenAI semantic conventions (v1.41.1) under their
//! Prometheus names: `gen_ai.client.operation.duration` (unit `s`) is
//! `gen_ai_client_operation_duration_seconds` and `gen_ai.client.token.usage` (unit `{token}`)
//! is `gen_ai_client_token_usage`, histograms with the conventions' bucket advice; their
//! attributes become labels with dots as underscores (`gen_ai_operation_name`,
//! `gen_ai_provider_name`, `gen_ai_request_model`, `gen_ai_response_model`, `gen_ai_token_type`,
//! `error_type`).

use super::retry::RetryReason;
use metrics::{Label, Unit, counter, describe_counter, describe_histogram, histogram};
use std::time::Duration;
use troupe_proto::Usage;

/// Model calls (steps), by provider and outcome.
pub const REQUESTS_TOTAL: &str = "troupe_model_requests_total";
/// Retried HTTP attempts, by provider and reason.
pub const RETRIES_TOTAL: &str = "troupe_model_retries_total";
/// From sending an attempt to its first stream event, by provider.
pub const TIME_TO_FIRST_BYTE_SECONDS: &str = "troupe_model_time_to_first_byte_seconds";
/// Tokens reported by providers, by provider and kind.
pub const TOKENS_TOTAL: &str = "troupe_model_tokens_total";
/// GenAI `gen_ai.client.operation.duration`: one model call, retries included.
pub const GEN_AI_OPERATION_DURATION: &str = "gen_ai_client_operation_duration_seconds";
/// GenAI `gen_ai.client.token.usage`: tokens of one model call, by token type.
pub const GEN_AI_TOKEN_USAGE: &str = "gen_ai_client_token_usage";

/// The conventions' bucket advice for `gen_ai.client.operation.duration`, in seconds.
pub const GEN_AI_DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
/// The conventions' bucket advice for `gen_ai.client.token.usage`, in tokens.
pub const GEN_AI_TOKEN_BUCKETS: [f64; 14] = [
    1.0,
    4.0,
    16.0,
    64.0,
    256.0,
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
];

/// `gen_ai.operation.name` of every call troupe makes: the chat and Responses APIs are both
/// chat completions in the conventions' terms.
const GEN_AI_OPERATION: &str = "chat";

/// Registers the descriptions (a Prometheus exporter rejects undescribed metrics).
pub fn describe() {
    describe_counter!(
        REQUESTS_TOTAL,
        Unit::Count,
        "Model calls, by provider and outcome"
    );
    describe_counter!(
        RETRIES_TOTAL,
        Unit::Count,
        "Model HTTP attempts that were retried, by provider and reason"
    );
    describe_histogram!(
        GEN_AI_OPERATION_DURATION,
        Unit::Seconds,
        "GenAI operation duration (gen_ai.client.operation.duration): one model call, retries included"
    );
    describe_histogram!(
        GEN_AI_TOKEN_USAGE,
        Unit::Count,
        "Number of input and output tokens used per model call (gen_ai.client.token.usage), by gen_ai_token_type"
    );
    describe_histogram!(
        TIME_TO_FIRST_BYTE_SECONDS,
        Unit::Seconds,
        "Time from sending a model request to its first stream event (time to first token), by provider"
    );
    describe_counter!(
        TOKENS_TOTAL,
        Unit::Count,
        "Tokens reported by model providers, by kind (input, output, cached, reasoning)"
    );
    // Every series of both providers exists from the start, at 0.
    for provider in PROVIDERS {
        for outcome in Outcome::ALL {
            counter!(REQUESTS_TOTAL, "provider" => provider, "outcome" => outcome.as_str())
                .increment(0);
        }
        for reason in RetryReason::ALL {
            counter!(RETRIES_TOTAL, "provider" => provider, "reason" => reason.as_str())
                .increment(0);
        }
        let _ = histogram!(TIME_TO_FIRST_BYTE_SECONDS, "provider" => provider);
        for kind in TOKEN_KINDS {
            counter!(TOKENS_TOTAL, "provider" => provider, "kind" => kind).increment(0);
        }
    }
}

/// The `provider` label values: the two APIs the client speaks.
pub const PROVIDERS: [&str; 2] = ["openai-chat", "openai-responses"];

/// The `kind` label values of [`TOKENS_TOTAL`].
const TOKEN_KINDS: [&str; 4] = ["input", "output", "cached", "reasoning"];

/// How a model call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Cancelled,
    Timeout,
    /// A non-retryable status, or retries ran out.
    HttpError,
    Transport,
    /// Malformed, idle, cut short, over a size bound or failed by the server mid-stream.
    StreamError,
    /// The stream finished but its content was unusable (bad tool arguments, dialect).
    BadReply,
}

impl Outcome {
    pub const ALL: [Self; 7] = [
        Self::Ok,
        Self::Cancelled,
        Self::Timeout,
        Self::HttpError,
        Self::Transport,
        Self::StreamError,
        Self::BadReply,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Cancelled => "cancelled",
            Self::Timeout => "timeout",
            Self::HttpError => "http_error",
            Self::Transport => "transport",
            Self::StreamError => "stream_error",
            Self::BadReply => "bad_reply",
        }
    }
}

pub fn request(provider: &'static str, outcome: Outcome) {
    counter!(REQUESTS_TOTAL, "provider" => provider, "outcome" => outcome.as_str()).increment(1);
}

pub fn retry(provider: &'static str, reason: RetryReason) {
    counter!(RETRIES_TOTAL, "provider" => provider, "reason" => reason.as_str()).increment(1);
}

pub fn time_to_first_byte(provider: &'static str, elapsed: Duration) {
    histogram!(TIME_TO_FIRST_BYTE_SECONDS, "provider" => provider).record(elapsed.as_secs_f64());
}

pub fn tokens(provider: &'static str, usage: &Usage) {
    for (kind, n) in [
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
        ("cached", usage.cached_tokens),
        ("reasoning", usage.reasoning_tokens),
    ] {
        if n > 0 {
            counter!(TOKENS_TOTAL, "provider" => provider, "kind" => kind).increment(n);
        }
    }
}

/// The GenAI attributes of one model call, as labels.
#[derive(Debug, Clone, Copy)]
pub struct GenAiCall<'a> {
    /// `gen_ai.provider.name`: `openai` for both APIs, whatever server speaks them (the
    /// conventions name the API's provider when the real one is not known).
    pub provider: &'static str,
    /// `gen_ai.request.model`: the configured model.
    pub request_model: &'a str,
    /// `gen_ai.response.model`: the model the server says answered, when it says.
    pub response_model: Option<&'a str>,
}

impl GenAiCall<'_> {
    fn labels(&self) -> Vec<Label> {
        let mut labels = vec![
            Label::new("gen_ai_operation_name", GEN_AI_OPERATION),
            Label::new("gen_ai_provider_name", self.provider),
            Label::new("gen_ai_request_model", self.request_model.to_owned()),
        ];
        if let Some(model) = self.response_model {
            labels.push(Label::new("gen_ai_response_model", model.to_owned()));
        }
        labels
    }
}

/// A model call ended after `took`; `error_type` names how it failed (absent on success).
pub fn gen_ai_operation(call: GenAiCall<'_>, took: Duration, error_type: Option<&'static str>) {
    let mut labels = call.labels();
    if let Some(error) = error_type {
        labels.push(Label::new("error_type", error));
    }
    histogram!(GEN_AI_OPERATION_DURATION, labels).record(took.as_secs_f64());
}

/// The usage a provider reported for one call: `input` and `output` token types.
pub fn gen_ai_tokens(call: GenAiCall<'_>, usage: &Usage) {
    for (kind, n) in [
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
    ] {
        let mut labels = call.labels();
        labels.push(Label::new("gen_ai_token_type", kind));
        #[allow(clippy::cast_precision_loss)] // token counts stay far below 2^53
        histogram!(GEN_AI_TOKEN_USAGE, labels).record(n as f64);
    }
}
