//! Tool governance metrics (A5). Labels are closed sets (outcomes, layers); tool names,
//! agent ids and tokens go to events and traces only.

use metrics::{Unit, counter, describe_counter};
use troupe_proto::governance::PolicyLayer;

/// Tool calls decided by the task's policy, by outcome.
pub const DECISIONS_TOTAL: &str = "troupe_tool_policy_decisions_total";
/// Tool calls refused because the policy denies the tool, by the layer that denied it.
pub const DENIALS_TOTAL: &str = "troupe_tool_policy_denials_total";

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
}

pub fn decided(decision: Decision) {
    counter!(DECISIONS_TOTAL, "outcome" => decision.as_str()).increment(1);
}

pub fn denied(layer: PolicyLayer) {
    counter!(DENIALS_TOTAL, "layer" => layer.as_str()).increment(1);
}
