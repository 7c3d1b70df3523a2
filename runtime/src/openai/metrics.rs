//! Model provider metrics. Labels are closed sets (provider, outcome, reason, token kind);
//! model names, URLs and ids go to traces only.

use super::retry::RetryReason;
use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};
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

/// Registers the descriptions (a Prometheus exporter rejects undescribed metrics).
pub fn describe() {
    describe_counter!(REQUESTS_TOTAL, "Model calls, by provider and outcome");
    describe_counter!(
        RETRIES_TOTAL,
        "Model HTTP attempts that were retried, by provider and reason"
    );
    describe_histogram!(
        TIME_TO_FIRST_BYTE_SECONDS,
        Unit::Seconds,
        "Time from sending a model request to its first stream event"
    );
    describe_counter!(
        TOKENS_TOTAL,
        Unit::Count,
        "Tokens reported by model providers, by kind (input, output, cached, reasoning)"
    );
}

/// How a model call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Cancelled,
    Timeout,
    /// A non-retryable status, or retries ran out.
    HttpError,
    Transport,
    /// Malformed, idle, cut short or failed by the server mid-stream.
    StreamError,
    /// The stream finished but its content was unusable (bad tool arguments, dialect).
    BadReply,
}

impl Outcome {
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
