//! McpPool metrics: names, descriptions and typed helpers. Labels are bounded enums, and the
//! server's name where it says which server is up, restarting or busy: server names come from
//! the configuration (one list for every session of a process), never from a model or a
//! client. Conversation ids and tool names go into spans and events, never into labels.

use crate::ports::ToolFailure;
use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use std::collections::BTreeSet;
use std::time::Duration;

/// MCP tool calls, by outcome.
pub const CALLS_TOTAL: &str = "troupe_mcp_calls_total";
/// MCP tool call latency (slot waits included), by outcome.
pub const CALL_SECONDS: &str = "troupe_mcp_call_duration_seconds";
/// Time a call waited for its slots and rate token.
pub const SLOT_WAIT_SECONDS: &str = "troupe_mcp_slot_wait_seconds";
/// Calls refused because a limit stayed full past the wait bound, by limit.
pub const OVERLOADED_TOTAL: &str = "troupe_mcp_overloaded_total";
/// Connect attempts (handshake and first tool listing), by outcome.
pub const CONNECTS_TOTAL: &str = "troupe_mcp_connects_total";
/// Connections that ended, by reason.
pub const CLOSED_TOTAL: &str = "troupe_mcp_connections_closed_total";
/// Live connections, by server (summed over sessions: one per session that uses it).
pub const CONNECTIONS: &str = "troupe_mcp_connections";
/// Restarts scheduled after a server died or failed to connect, by server.
pub const SERVER_RESTARTS_TOTAL: &str = "troupe_mcp_server_restarts_total";
/// Calls sent to a server and not yet answered, by server.
pub const CALLS_IN_FLIGHT: &str = "troupe_mcp_calls_in_flight";
/// Open views (summed over sessions).
pub const VIEWS: &str = "troupe_mcp_views";
/// Progress notifications received during calls.
pub const PROGRESS_TOTAL: &str = "troupe_mcp_progress_notifications_total";
/// Tools a server listed that are not offered, by reason.
pub const TOOLS_LEFT_OUT_TOTAL: &str = "troupe_mcp_tools_left_out_total";
/// Requests of servers to the client (elicitation, sampling), by kind and outcome.
pub const SERVER_REQUESTS_TOTAL: &str = "troupe_mcp_server_requests_total";
/// Views opened again on a pool that replaced a failed one, by who opened them.
pub const VIEWS_REOPENED_TOTAL: &str = "troupe_mcp_views_reopened_total";

/// Who opened a view again after a pool restart (a label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReopenedBy {
    /// A conversation, for its next tasks.
    Conversation,
    /// A running task, for its remaining calls.
    Task,
}

impl ReopenedBy {
    pub const ALL: [Self; 2] = [Self::Conversation, Self::Task];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Conversation => "conversation",
            Self::Task => "task",
        }
    }
}

/// Counts a view opened again on a new pool.
pub fn view_reopened(by: ReopenedBy) {
    counter!(VIEWS_REOPENED_TOTAL, "by" => by.as_str()).increment(1);
}

/// Registers descriptions; call once after installing a recorder.
pub fn describe() {
    describe_counter!(
        CALLS_TOTAL,
        Unit::Count,
        "MCP tool calls, by outcome (ok, tool_error or an error kind)."
    );
    describe_histogram!(
        CALL_SECONDS,
        Unit::Seconds,
        "MCP tool call latency including slot waits, by outcome."
    );
    describe_histogram!(
        SLOT_WAIT_SECONDS,
        Unit::Seconds,
        "Time an MCP call waited for its concurrency slots and rate token."
    );
    describe_counter!(
        OVERLOADED_TOTAL,
        Unit::Count,
        "MCP calls refused because a limit stayed full past the wait bound, by limit."
    );
    describe_counter!(
        CONNECTS_TOTAL,
        Unit::Count,
        "MCP connect attempts (handshake and first tool listing), by outcome."
    );
    describe_counter!(
        CLOSED_TOTAL,
        Unit::Count,
        "MCP connections that ended, by reason (idle, died, stale, shutdown)."
    );
    describe_gauge!(
        CONNECTIONS,
        Unit::Count,
        "Live MCP connections, by server (one per session using it): the servers up."
    );
    describe_counter!(
        SERVER_RESTARTS_TOTAL,
        Unit::Count,
        "MCP server restarts scheduled after the server died or failed to connect, by server."
    );
    describe_gauge!(
        CALLS_IN_FLIGHT,
        Unit::Count,
        "MCP tool calls sent to a server and not yet answered, by server."
    );
    describe_gauge!(
        VIEWS,
        Unit::Count,
        "Open MCP views (one per conversation view)."
    );
    describe_counter!(
        PROGRESS_TOTAL,
        Unit::Count,
        "Progress notifications received during MCP calls."
    );
    describe_counter!(
        SERVER_REQUESTS_TOTAL,
        Unit::Count,
        "Elicitation and sampling requests of MCP servers, by kind and outcome (accepted, declined, cancelled, failed, unattributed)."
    );
    describe_counter!(
        TOOLS_LEFT_OUT_TOTAL,
        Unit::Count,
        "Tools listed by MCP servers but not offered, by reason (requires_task, invalid_name)."
    );
    describe_counter!(
        VIEWS_REOPENED_TOTAL,
        Unit::Count,
        "MCP views opened again on a pool that replaced a failed one, by opener (conversation, task)."
    );
    for by in ReopenedBy::ALL {
        counter!(VIEWS_REOPENED_TOTAL, "by" => by.as_str()).increment(0);
    }
    // Every series exists from the start, at 0: a call outcome is `ok`, `tool_error` or an
    // error kind.
    for outcome in ["ok", "tool_error"]
        .into_iter()
        .chain(troupe_proto::ErrorKind::ALL.map(|k| k.as_str()))
    {
        counter!(CALLS_TOTAL, "outcome" => outcome).increment(0);
        let _ = histogram!(CALL_SECONDS, "outcome" => outcome);
    }
    let _ = histogram!(SLOT_WAIT_SECONDS);
    for limit in Limit::ALL {
        counter!(OVERLOADED_TOTAL, "limit" => limit.as_str()).increment(0);
    }
    for outcome in ["ok", "failed"] {
        counter!(CONNECTS_TOTAL, "outcome" => outcome).increment(0);
    }
    for reason in CloseReason::ALL {
        counter!(CLOSED_TOTAL, "reason" => reason.as_str()).increment(0);
    }
    gauge!(VIEWS).increment(0.0);
    counter!(PROGRESS_TOTAL).increment(0);
    for reason in LeftOut::ALL {
        counter!(TOOLS_LEFT_OUT_TOTAL, "reason" => reason.as_str()).increment(0);
    }
    for kind in RequestKind::ALL {
        for outcome in RequestOutcome::ALL {
            counter!(SERVER_REQUESTS_TOTAL, "kind" => kind.as_str(), "outcome" => outcome.as_str())
                .increment(0);
        }
    }
}

/// Registers the per-server series of the configured servers at 0, so that a server that
/// never connected or never got a call still has its series (a pool calls it at start).
pub fn servers_configured<'a>(servers: impl IntoIterator<Item = &'a str>) {
    for server in servers {
        gauge!(CONNECTIONS, "server" => server.to_owned()).increment(0.0);
        gauge!(CALLS_IN_FLIGHT, "server" => server.to_owned()).increment(0.0);
        counter!(SERVER_RESTARTS_TOTAL, "server" => server.to_owned()).increment(0);
    }
}

/// Which limit refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    ConversationConcurrency,
    ConversationRate,
    SessionConcurrency,
}

impl Limit {
    pub const ALL: [Self; 3] = [
        Self::ConversationConcurrency,
        Self::ConversationRate,
        Self::SessionConcurrency,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ConversationConcurrency => "conversation_concurrency",
            Self::ConversationRate => "conversation_rate",
            Self::SessionConcurrency => "session_concurrency",
        }
    }
}

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// No view referenced it for the idle timeout.
    Idle,
    /// The server went away (process exit, stream end).
    Died,
    /// A connect finished after the pool stopped wanting it.
    Stale,
    /// The pool stopped.
    Shutdown,
}

impl CloseReason {
    pub const ALL: [Self; 4] = [Self::Idle, Self::Died, Self::Stale, Self::Shutdown];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Died => "died",
            Self::Stale => "stale",
            Self::Shutdown => "shutdown",
        }
    }
}

/// Why a listed tool is not offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeftOut {
    /// It needs MCP task augmentation, which the pool does not support.
    RequiresTask,
    /// Its qualified name is not a legal tool name.
    InvalidName,
}

impl LeftOut {
    pub const ALL: [Self; 2] = [Self::RequiresTask, Self::InvalidName];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RequiresTask => "requires_task",
            Self::InvalidName => "invalid_name",
        }
    }
}

/// What a server asked its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    Elicitation,
    Sampling,
}

impl RequestKind {
    pub const ALL: [Self; 2] = [Self::Elicitation, Self::Sampling];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Elicitation => "elicitation",
            Self::Sampling => "sampling",
        }
    }
}

/// How a server's request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestOutcome {
    /// Approved: the content or the model's answer went back.
    Accepted,
    /// A human denied it.
    Declined,
    /// Nobody answered in time, or its call ended first.
    Cancelled,
    /// It could not be answered (bad request, no model, the model failed).
    Failed,
    /// It could not be tied to one task's call.
    Unattributed,
}

impl RequestOutcome {
    pub const ALL: [Self; 5] = [
        Self::Accepted,
        Self::Declined,
        Self::Cancelled,
        Self::Failed,
        Self::Unattributed,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Declined => "declined",
            Self::Cancelled => "cancelled",
            Self::Failed => "failed",
            Self::Unattributed => "unattributed",
        }
    }
}

pub fn server_request(kind: RequestKind, outcome: RequestOutcome) {
    counter!(SERVER_REQUESTS_TOTAL, "kind" => kind.as_str(), "outcome" => outcome.as_str())
        .increment(1);
}

/// A restart of `server` was scheduled.
pub fn server_restart(server: &str) {
    counter!(SERVER_RESTARTS_TOTAL, "server" => server.to_owned()).increment(1);
}

/// Counts a call in flight on a server while it lives.
#[derive(Debug)]
pub struct InFlight {
    server: String,
}

impl InFlight {
    pub fn start(server: &str) -> Self {
        gauge!(CALLS_IN_FLIGHT, "server" => server.to_owned()).increment(1.0);
        Self {
            server: server.to_owned(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        gauge!(CALLS_IN_FLIGHT, "server" => self.server.clone()).decrement(1.0);
    }
}

/// The outcome label of a finished call.
pub fn outcome(result: &Result<troupe_proto::ToolOutput, ToolFailure>) -> &'static str {
    match result {
        Ok(out) if out.is_error => "tool_error",
        Ok(_) => "ok",
        Err(failure) => failure.error.kind().as_str(),
    }
}

pub fn call_finished(outcome: &'static str, took: Duration) {
    counter!(CALLS_TOTAL, "outcome" => outcome).increment(1);
    histogram!(CALL_SECONDS, "outcome" => outcome).record(took.as_secs_f64());
}

pub fn slot_wait(waited: Duration) {
    histogram!(SLOT_WAIT_SECONDS).record(waited.as_secs_f64());
}

pub fn overloaded(limit: Limit) {
    counter!(OVERLOADED_TOTAL, "limit" => limit.as_str()).increment(1);
}

pub fn connect(ok: bool) {
    let outcome = if ok { "ok" } else { "failed" };
    counter!(CONNECTS_TOTAL, "outcome" => outcome).increment(1);
}

pub fn closed(reason: CloseReason) {
    counter!(CLOSED_TOTAL, "reason" => reason.as_str()).increment(1);
}

pub fn progress() {
    counter!(PROGRESS_TOTAL).increment(1);
}

pub fn left_out(reason: LeftOut) {
    counter!(TOOLS_LEFT_OUT_TOTAL, "reason" => reason.as_str()).increment(1);
}

/// Publishes the connection and view gauges as deltas, so that several sessions' pools add up
/// instead of overwriting each other.
#[derive(Debug, Default)]
pub struct Occupancy {
    /// Servers this pool reported connected.
    connected: BTreeSet<String>,
    views: usize,
}

impl Occupancy {
    /// `connected`: the servers with a live connection now.
    pub fn publish<'a>(&mut self, connected: impl IntoIterator<Item = &'a str>, views: usize) {
        let now: BTreeSet<String> = connected.into_iter().map(str::to_owned).collect();
        for gone in self.connected.difference(&now) {
            gauge!(CONNECTIONS, "server" => gone.clone()).decrement(1.0);
        }
        for new in now.difference(&self.connected) {
            gauge!(CONNECTIONS, "server" => new.clone()).increment(1.0);
        }
        self.connected = now;
        shift(VIEWS, &mut self.views, views);
    }
}

impl Drop for Occupancy {
    /// A pool that fails runs no `post_stop`: its share of the gauges goes with its state.
    fn drop(&mut self) {
        self.publish([], 0);
    }
}

fn shift(name: &'static str, published: &mut usize, now: usize) {
    if now != *published {
        gauge!(name).increment(now as f64 - *published as f64);
        *published = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    /// The `troupe_mcp_connections` gauges by server after `record`.
    fn connections(record: impl FnOnce()) -> Vec<(String, f64)> {
        let prefix = format!("{CONNECTIONS}{{server=");
        crate::gauge_test::gauges_after(record)
            .into_iter()
            .filter_map(|(name, v)| {
                let server = name.strip_prefix(&prefix)?.strip_suffix('}')?;
                Some((server.to_owned(), v))
            })
            .collect()
    }

    #[test]
    fn a_pool_whose_state_drops_withdraws_what_it_reported() {
        let mut kept = Occupancy::default();
        let got = connections(|| {
            kept.publish(["git"], 1);
            let mut failed = Occupancy::default();
            failed.publish(["fs", "git"], 2);
            drop(failed);
        });
        assert_eq!(got, [("fs".to_owned(), 0.0), ("git".to_owned(), 1.0)]);
    }

    #[test]
    fn pools_add_up_per_server_and_withdraw_what_they_reported() {
        // Both pools live on past the reading.
        let (mut a, mut b) = (Occupancy::default(), Occupancy::default());
        let got = connections(|| {
            a.publish(["fs", "git"], 2);
            b.publish(["fs"], 1);
            // Publishing the same set again changes nothing.
            a.publish(["git", "fs"], 2);
            // `git` dies in pool a; pool b stops.
            a.publish(["fs"], 2);
            b.publish([], 0);
        });
        assert_eq!(got, [("fs".to_owned(), 1.0), ("git".to_owned(), 0.0)]);
    }

    #[test]
    fn an_in_flight_call_counts_until_dropped() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        // A snapshot gives the change since the previous one: keep the running value.
        let mut now = 0.0;
        let mut value = || {
            if let Some((_, _, _, DebugValue::Gauge(v))) = snapshotter.snapshot().into_vec().pop() {
                now += v.into_inner();
            }
            now
        };
        metrics::with_local_recorder(&recorder, || {
            let first = InFlight::start("fs");
            let second = InFlight::start("fs");
            assert_eq!(value(), 2.0);
            drop(first);
            assert_eq!(value(), 1.0);
            drop(second);
            assert_eq!(value(), 0.0);
        });
    }
}
