//! A2A endpoint metrics. Labels are closed sets: the operation, the protocol version and the
//! outcome (`ok` or the error's reason); task and context ids go to traces only.

use metrics::{Unit, counter, describe_counter, describe_gauge, gauge};

/// JSON-RPC requests, by method, version and outcome.
pub const REQUESTS_TOTAL: &str = "troupe_a2a_requests_total";
/// SSE streams open now.
pub const STREAMS_OPEN: &str = "troupe_a2a_streams_open";
/// A2A tasks held in memory (live ones, and finished ones until stored).
pub const TASKS: &str = "troupe_a2a_tasks";
/// A2A contexts whose conversation is open now.
pub const CONTEXTS_OPEN: &str = "troupe_a2a_contexts_open";
/// What happened to contexts' conversations, by event.
pub const CONTEXT_EVENTS: &str = "troupe_a2a_context_events_total";
/// The `event`s of [`CONTEXT_EVENTS`]: opened (a new context), closed_idle (its
/// conversation closed after the idle time), reopened (its next message opened it again),
/// replaced (it could not be reopened and a new conversation took its place).
pub const CONTEXT_EVENT_KINDS: [&str; 4] = ["opened", "closed_idle", "reopened", "replaced"];
/// Records written to the store, by record and outcome.
pub const STORE_WRITES: &str = "troupe_a2a_store_writes_total";
/// The `record`s of [`STORE_WRITES`].
pub const STORE_RECORDS: [&str; 4] = ["task", "context", "push_config", "prune"];
/// Records retention forgot, by what.
pub const PRUNED: &str = "troupe_a2a_pruned_total";
/// Live tasks found in the store when the endpoint started, by what became of them.
pub const RECOVERED: &str = "troupe_a2a_tasks_recovered_total";
/// The `outcome`s of [`RECOVERED`]: requeued (it had not reached troupe: it runs),
/// interrupted (troupe was running it: it ends FAILED, not run again), waiting (it waits for
/// the client's reply, as before).
pub const RECOVERED_OUTCOMES: [&str; 3] = ["requeued", "interrupted", "waiting"];
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
        "A2A tasks held in memory: the live ones (finished ones are read from the store)"
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
    describe_gauge!(
        CONTEXTS_OPEN,
        Unit::Count,
        "A2A contexts whose conversation is open (an idle one is closed and reopened on its next message)"
    );
    gauge!(CONTEXTS_OPEN).increment(0.0);
    describe_counter!(
        CONTEXT_EVENTS,
        Unit::Count,
        "A2A contexts' conversations, by event: opened, closed_idle, reopened, replaced"
    );
    for event in CONTEXT_EVENT_KINDS {
        counter!(CONTEXT_EVENTS, "event" => event).increment(0);
    }
    describe_counter!(
        STORE_WRITES,
        Unit::Count,
        "A2A records written to the store, by record (task, context, push_config, prune) and outcome (ok, failed)"
    );
    for record in STORE_RECORDS {
        for outcome in ["ok", "failed"] {
            counter!(STORE_WRITES, "record" => record, "outcome" => outcome).increment(0);
        }
    }
    describe_counter!(
        PRUNED,
        Unit::Count,
        "A2A records retention forgot, by what (tasks: finished tasks past the kept number; contexts: closed contexts left without a task)"
    );
    for what in ["tasks", "contexts"] {
        counter!(PRUNED, "what" => what).increment(0);
    }
    describe_counter!(
        RECOVERED,
        Unit::Count,
        "Live A2A tasks found in the store when the endpoint started, by outcome: requeued, interrupted, waiting"
    );
    for outcome in RECOVERED_OUTCOMES {
        counter!(RECOVERED, "outcome" => outcome).increment(0);
    }
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

pub fn contexts_open(n: usize) {
    gauge!(CONTEXTS_OPEN).set(n as f64);
}

/// `event`: one of [`CONTEXT_EVENT_KINDS`].
pub fn context_event(event: &'static str) {
    counter!(CONTEXT_EVENTS, "event" => event).increment(1);
}

/// `record`: one of [`STORE_RECORDS`].
pub fn stored(record: &'static str, ok: bool) {
    let outcome = if ok { "ok" } else { "failed" };
    counter!(STORE_WRITES, "record" => record, "outcome" => outcome).increment(1);
}

pub fn pruned(tasks: u64, contexts: u64) {
    counter!(PRUNED, "what" => "tasks").increment(tasks);
    counter!(PRUNED, "what" => "contexts").increment(contexts);
}

/// `outcome`: one of [`RECOVERED_OUTCOMES`].
pub fn recovered(outcome: &'static str) {
    counter!(RECOVERED, "outcome" => outcome).increment(1);
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
