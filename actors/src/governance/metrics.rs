//! Tool governance metrics (A5). Labels are closed sets (outcomes, layers); tool names,
//! agent ids and tokens go to events and traces only.

use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};
use std::time::Duration;
use troupe_proto::agent::GuardrailAction;
use troupe_proto::governance::{PolicyLayer, TokenRefusal};

/// Tool calls decided by the task's policy, by outcome.
pub const DECISIONS_TOTAL: &str = "troupe_tool_policy_decisions_total";
/// Tool calls refused because the policy denies the tool, by the layer that denied it.
pub const DENIALS_TOTAL: &str = "troupe_tool_policy_denials_total";

/// Authorization tokens issued, used (one call each) and revoked, by event.
pub const TOKENS_TOTAL: &str = "troupe_auth_tokens_total";
/// Tool calls that needed a token and had no valid one, by reason.
pub const TOKEN_REFUSALS_TOTAL: &str = "troupe_auth_token_refusals_total";

/// Answers checked by an output guardrail, by outcome (valid, invalid).
pub const GUARDRAIL_CHECKS_TOTAL: &str = "troupe_guardrail_checks_total";
/// Time to extract, repair, validate and mask one answer.
pub const GUARDRAIL_CHECK_DURATION: &str = "troupe_guardrail_check_duration_seconds";
/// Models asked again after an invalid answer.
pub const GUARDRAIL_RETRIES_TOTAL: &str = "troupe_guardrail_retries_total";
/// Guardrails whose retries were spent, by what the task did (reject, ask_human).
pub const GUARDRAIL_FAILURES_TOTAL: &str = "troupe_guardrail_failures_total";

/// What became of a tool call at the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Allowed, no token needed.
    Allowed,
    /// Allowed with a valid authorization token (one use counted).
    Authorized,
    /// Denied by a layer.
    Denied,
    /// Needed a token and had no valid one.
    Unauthorized,
}

impl Decision {
    pub const ALL: [Self; 4] = [
        Self::Allowed,
        Self::Authorized,
        Self::Denied,
        Self::Unauthorized,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Authorized => "authorized",
            Self::Denied => "denied",
            Self::Unauthorized => "unauthorized",
        }
    }
}

/// Registers the descriptions, and every series at 0.
pub fn describe() {
    describe_counter!(
        DECISIONS_TOTAL,
        Unit::Count,
        "Tool calls decided by the task's tool policy, by outcome (allowed, authorized, denied, unauthorized)"
    );
    describe_counter!(
        DENIALS_TOTAL,
        Unit::Count,
        "Tool calls refused by the tool policy, by the layer that denied them (global, role, agent, request)"
    );
    for decision in Decision::ALL {
        counter!(DECISIONS_TOTAL, "outcome" => decision.as_str()).increment(0);
    }
    for layer in PolicyLayer::ALL {
        counter!(DENIALS_TOTAL, "layer" => layer.as_str()).increment(0);
    }
    describe_counter!(
        TOKENS_TOTAL,
        Unit::Count,
        "Authorization tokens issued, used (one tool call each) and revoked, by event"
    );
    describe_counter!(
        TOKEN_REFUSALS_TOTAL,
        Unit::Count,
        "Tool calls that needed an authorization token and had no valid one, by reason"
    );
    for event in ["issued", "used", "revoked"] {
        counter!(TOKENS_TOTAL, "event" => event).increment(0);
    }
    for reason in TokenRefusal::ALL {
        counter!(TOKEN_REFUSALS_TOTAL, "reason" => reason.as_str()).increment(0);
    }
    describe_counter!(
        GUARDRAIL_CHECKS_TOTAL,
        Unit::Count,
        "Agent answers checked against their output schema, by outcome (valid, invalid)"
    );
    describe_histogram!(
        GUARDRAIL_CHECK_DURATION,
        Unit::Seconds,
        "Time to extract, repair, validate and mask one answer"
    );
    describe_counter!(
        GUARDRAIL_RETRIES_TOTAL,
        Unit::Count,
        "Models asked again with the validation errors of their answer"
    );
    describe_counter!(
        GUARDRAIL_FAILURES_TOTAL,
        Unit::Count,
        "Output guardrails whose retries were spent, by action (reject, ask_human)"
    );
    for outcome in ["valid", "invalid"] {
        counter!(GUARDRAIL_CHECKS_TOTAL, "outcome" => outcome).increment(0);
    }
    counter!(GUARDRAIL_RETRIES_TOTAL).increment(0);
    for action in GuardrailAction::ALL {
        counter!(GUARDRAIL_FAILURES_TOTAL, "action" => action.as_str()).increment(0);
    }
    let _ = histogram!(GUARDRAIL_CHECK_DURATION);
}

pub fn guardrail_checked(valid: bool, took: Duration) {
    let outcome = if valid { "valid" } else { "invalid" };
    counter!(GUARDRAIL_CHECKS_TOTAL, "outcome" => outcome).increment(1);
    histogram!(GUARDRAIL_CHECK_DURATION).record(took.as_secs_f64());
}

pub fn guardrail_retried() {
    counter!(GUARDRAIL_RETRIES_TOTAL).increment(1);
}

pub fn guardrail_failed(action: GuardrailAction) {
    counter!(GUARDRAIL_FAILURES_TOTAL, "action" => action.as_str()).increment(1);
}

pub fn token_issued() {
    counter!(TOKENS_TOTAL, "event" => "issued").increment(1);
}

pub fn token_used() {
    counter!(TOKENS_TOTAL, "event" => "used").increment(1);
}

pub fn token_revoked() {
    counter!(TOKENS_TOTAL, "event" => "revoked").increment(1);
}

pub fn token_refused(reason: TokenRefusal) {
    counter!(TOKEN_REFUSALS_TOTAL, "reason" => reason.as_str()).increment(1);
}

pub fn decided(decision: Decision) {
    counter!(DECISIONS_TOTAL, "outcome" => decision.as_str()).increment(1);
}

pub fn denied(layer: PolicyLayer) {
    counter!(DENIALS_TOTAL, "layer" => layer.as_str()).increment(1);
}
