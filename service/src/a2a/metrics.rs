//! A2A endpoint metrics. Labels are closed sets: the operation, the protocol version and the
//! outcome (`ok` or the error's reason); task and context ids go to traces only.

use metrics::{Unit, counter, describe_counter, describe_gauge, gauge};

/// JSON-RPC requests, by method, version and outcome.
pub const REQUESTS_TOTAL: &str = "troupe_a2a_requests_total";
/// SSE streams open now.
pub const STREAMS_OPEN: &str = "troupe_a2a_streams_open";
/// A2A task records kept (live and finished).
pub const TASKS: &str = "troupe_a2a_tasks";
/// Push notification delivery attempts' outcomes.
pub const PUSH_DELIVERIES: &str = "troupe_a2a_push_deliveries_total";
/// The outcomes of [`PUSH_DELIVERIES`].
pub const PUSH_OUTCOMES: [&str; 4] = ["delivered", "retried", "refused", "failed"];

/// Registers the descriptions (a Prometheus exporter rejects undescribed metrics).
pub fn describe() {
    describe_counter!(
        REQUESTS_TOTAL,
        Unit::Count,
        "A2A JSON-RPC requests, by method, protocol version and outcome"
    );
    describe_gauge!(STREAMS_OPEN, Unit::Count, "A2A SSE streams open");
    describe_gauge!(
        TASKS,
        Unit::Count,
        "A2A task records kept (live and finished)"
    );
    // Every operation's successes exist from the start, at 0, in both versions (failures,
    // by reason, appear with the first).
    use super::version::{Operation, Version};
    for op in Operation::ALL {
        for version in [Version::V0_3, Version::V1_0] {
            counter!(REQUESTS_TOTAL, "method" => op.label(), "version" => version.as_str(), "outcome" => "ok")
                .increment(0);
        }
    }
    gauge!(STREAMS_OPEN).increment(0.0);
    gauge!(TASKS).increment(0.0);
    describe_counter!(
        PUSH_DELIVERIES,
        Unit::Count,
        "A2A push notifications, by outcome: delivered, retried (an attempt failed and another follows), refused (the receiver answered a final 4xx), failed (every attempt failed)"
    );
    for outcome in PUSH_OUTCOMES {
        counter!(PUSH_DELIVERIES, "outcome" => outcome).increment(0);
    }
}

/// A push notification attempt ended with `outcome` (one of [`PUSH_OUTCOMES`]).
pub fn push_delivery(outcome: &'static str) {
    counter!(PUSH_DELIVERIES, "outcome" => outcome).increment(1);
}

/// `method`: an operation label or `unknown`; `version`: `1.0`, `0.3` or `unsupported`;
/// `outcome`: `ok` or an error's outcome label.
pub fn request(method: &'static str, version: &'static str, outcome: &'static str) {
    counter!(REQUESTS_TOTAL, "method" => method, "version" => version, "outcome" => outcome)
        .increment(1);
}

pub fn tasks(n: usize) {
    gauge!(TASKS).set(n as f64);
}

/// Counts a stream while it lives.
#[derive(Debug)]
pub struct StreamGuard;

impl StreamGuard {
    pub fn open() -> Self {
        gauge!(STREAMS_OPEN).increment(1.0);
        Self
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        gauge!(STREAMS_OPEN).decrement(1.0);
    }
}
