//! Tool governance metrics (A5). Labels are closed sets (outcomes, layers); tool names,
//! agent ids and tokens go to events and traces only.

use metrics::{Unit, counter, describe_counter};
use troupe_proto::governance::{PolicyLayer, TokenRefusal};

/// Tool calls decided by the task's policy, by outcome.
pub const DECISIONS_TOTAL: &str = "troupe_tool_policy_decisions_total";
/// Tool calls refused because the policy denies the tool, by the layer that denied it.
pub const DENIALS_TOTAL: &str = "troupe_tool_policy_denials_total";

/// Authorization tokens issued, used (one call each) and revoked, by event.
pub const TOKENS_TOTAL: &str = "troupe_auth_tokens_total";
/// Tool calls that needed a token and had no valid one, by reason.
pub const TOKEN_REFUSALS_TOTAL: &str = "troupe_auth_token_refusals_total";

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
