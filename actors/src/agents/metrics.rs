//! Agent metrics (A1–A4). Labels are closed sets (provider kinds, decisions, outcomes,
//! reasons); agent ids, dispatch ids and provider session ids go to traces and events only.

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use std::time::Duration;
use troupe_proto::agent::{DispatchStatus, PolicyReason, ProviderKind, RouteDecision, RouteSource};

/// Dispatches that ended, by provider kind and status.
pub const DISPATCHES_TOTAL: &str = "troupe_agent_dispatches_total";
/// Time from a dispatch's admission to its end, by provider kind.
pub const DISPATCH_DURATION: &str = "troupe_agent_dispatch_duration_seconds";
/// Dispatches in flight now (leases held), summed over sessions.
pub const DISPATCHES_IN_FLIGHT: &str = "troupe_agent_dispatches_in_flight";
/// Dispatches refused before they ran, by reason.
pub const POLICY_REJECTIONS_TOTAL: &str = "troupe_agent_policy_rejections_total";
/// Route decisions, by decision and source.
pub const ROUTE_DECISIONS_TOTAL: &str = "troupe_agent_route_decisions_total";
/// Binding operations, by provider kind and outcome.
pub const BINDINGS_TOTAL: &str = "troupe_agent_bindings_total";
/// Leases reclaimed on expiry (their child cancelled).
pub const LEASES_EXPIRED_TOTAL: &str = "troupe_agent_leases_expired_total";
/// Admitted dispatches by the way they reached their agent (`direct`, `worker`).
pub const DISPATCH_PATHS_TOTAL: &str = "troupe_agent_dispatch_paths_total";
/// Providers a reload replaced, shut down once no dispatch held them.
pub const RETIRED_PROVIDERS_STOPPED_TOTAL: &str = "troupe_agent_retired_providers_stopped_total";

/// What became of a binding at a dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindingOutcome {
    /// A new provider session, bound.
    Created,
    /// A bound one taken up again.
    Resumed,
    /// One that could not be resumed, replaced by a new one.
    Replaced,
    /// A provider session for one dispatch, not bound.
    Fresh,
    /// Opening or resuming failed.
    Failed,
}

impl BindingOutcome {
    pub const ALL: [Self; 5] = [
        Self::Created,
        Self::Resumed,
        Self::Replaced,
        Self::Fresh,
        Self::Failed,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Resumed => "resumed",
            Self::Replaced => "replaced",
            Self::Fresh => "fresh",
            Self::Failed => "failed",
        }
    }
}

/// Registers the descriptions, and every series at 0 (a dashboard reads 0, not "no data").
pub fn describe() {
    describe_counter!(
        DISPATCHES_TOTAL,
        Unit::Count,
        "Dispatches to agents that ended, by provider kind and status (ok, error, cancelled, expired)"
    );
    describe_histogram!(
        DISPATCH_DURATION,
        Unit::Seconds,
        "Time from a dispatch's admission to its end, by provider kind"
    );
    describe_gauge!(
        DISPATCHES_IN_FLIGHT,
        Unit::Count,
        "Dispatches to agents in flight (leases held)"
    );
    describe_counter!(
        POLICY_REJECTIONS_TOTAL,
        Unit::Count,
        "Dispatches refused before they ran, by reason"
    );
    describe_counter!(
        ROUTE_DECISIONS_TOTAL,
        Unit::Count,
        "Supervisor route decisions, by decision and source (model, rules, hub)"
    );
    describe_counter!(
        BINDINGS_TOTAL,
        Unit::Count,
        "Agent binding operations, by provider kind and outcome"
    );
    describe_counter!(
        LEASES_EXPIRED_TOTAL,
        Unit::Count,
        "Dispatch leases reclaimed on expiry, their child cancelled"
    );
    for kind in ProviderKind::ALL {
        for status in DispatchStatus::ALL {
            counter!(DISPATCHES_TOTAL, "provider" => kind.as_str(), "status" => status.as_str())
                .increment(0);
        }
        for outcome in BindingOutcome::ALL {
            counter!(BINDINGS_TOTAL, "provider" => kind.as_str(), "outcome" => outcome.as_str())
                .increment(0);
        }
        let _ = histogram!(DISPATCH_DURATION, "provider" => kind.as_str());
    }
    for reason in PolicyReason::DISPATCH {
        counter!(POLICY_REJECTIONS_TOTAL, "reason" => reason.as_str()).increment(0);
    }
    for decision in RouteDecision::ALL {
        for source in RouteSource::ALL {
            counter!(ROUTE_DECISIONS_TOTAL, "decision" => decision.as_str(), "source" => source.as_str()).increment(0);
        }
    }
    counter!(LEASES_EXPIRED_TOTAL).increment(0);
    gauge!(DISPATCHES_IN_FLIGHT).increment(0.0);
    describe_counter!(
        DISPATCH_PATHS_TOTAL,
        Unit::Count,
        "Admitted dispatches by the way they reached their agent: direct (straight to an in-process agent's conversation) or worker"
    );
    for path in ["direct", "worker"] {
        counter!(DISPATCH_PATHS_TOTAL, "path" => path).increment(0);
    }
    describe_counter!(
        RETIRED_PROVIDERS_STOPPED_TOTAL,
        Unit::Count,
        "Agent providers a reload replaced (a changed or removed definition), shut down once no dispatch held them"
    );
    counter!(RETIRED_PROVIDERS_STOPPED_TOTAL).increment(0);
}

/// A provider a reload replaced was shut down.
pub fn retired_provider_stopped() {
    counter!(RETIRED_PROVIDERS_STOPPED_TOTAL).increment(1);
}

/// A dispatch admitted, on its way by `path` (`direct` or `worker`).
pub fn dispatch_path(path: &'static str) {
    counter!(DISPATCH_PATHS_TOTAL, "path" => path).increment(1);
}

pub fn dispatch_started() {
    gauge!(DISPATCHES_IN_FLIGHT).increment(1.0);
}

pub fn dispatch_ended(kind: ProviderKind, status: DispatchStatus, took: Duration) {
    gauge!(DISPATCHES_IN_FLIGHT).decrement(1.0);
    counter!(DISPATCHES_TOTAL, "provider" => kind.as_str(), "status" => status.as_str())
        .increment(1);
    histogram!(DISPATCH_DURATION, "provider" => kind.as_str()).record(took.as_secs_f64());
}

pub fn rejected(reason: PolicyReason) {
    counter!(POLICY_REJECTIONS_TOTAL, "reason" => reason.as_str()).increment(1);
}

pub fn routed(decision: RouteDecision, source: RouteSource) {
    counter!(ROUTE_DECISIONS_TOTAL, "decision" => decision.as_str(), "source" => source.as_str())
        .increment(1);
}

pub fn binding(kind: ProviderKind, outcome: BindingOutcome) {
    counter!(BINDINGS_TOTAL, "provider" => kind.as_str(), "outcome" => outcome.as_str())
        .increment(1);
}

pub fn lease_expired() {
    counter!(LEASES_EXPIRED_TOTAL).increment(1);
}
