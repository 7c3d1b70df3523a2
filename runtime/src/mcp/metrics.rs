//! MCP client metrics: what one connection saw on the wire, named `troupe_mcp_client_*` so
//! they never mix with the pool's `troupe_mcp_*` view of the same calls. Labels are closed sets
//! (transport, outcome); server names, tool names and request ids go to traces only.

use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};
use std::time::Duration;

/// Connections whose handshake completed, by transport.
pub const CONNECTIONS_OPENED_TOTAL: &str = "troupe_mcp_client_connections_opened_total";
/// Connections that failed before or during the handshake, by transport.
pub const CONNECT_FAILURES_TOTAL: &str = "troupe_mcp_client_connect_failures_total";
/// Connections that ended (closed by us, process exit, transport closed), by transport.
pub const CONNECTIONS_CLOSED_TOTAL: &str = "troupe_mcp_client_connections_closed_total";
/// Tool calls, by transport and outcome.
pub const CALLS_TOTAL: &str = "troupe_mcp_client_calls_total";
/// Tool call latency, by transport and outcome.
pub const CALL_DURATION_SECONDS: &str = "troupe_mcp_client_call_duration_seconds";
/// `notifications/cancelled` sent for abandoned calls (cancelled or timed out), by transport
/// and whether the write went through.
pub const CANCEL_NOTICES_TOTAL: &str = "troupe_mcp_client_cancel_notifications_total";

/// `notifications/cancelled` written by this process: a client-side record tests can read
/// without a metrics recorder.
static CANCEL_NOTICES_SENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many `notifications/cancelled` this process has written to MCP servers.
pub fn cancel_notices_sent() -> u64 {
    CANCEL_NOTICES_SENT.load(std::sync::atomic::Ordering::Relaxed)
}

/// Registers the descriptions (a Prometheus exporter rejects undescribed metrics).
pub fn describe() {
    describe_counter!(
        CONNECTIONS_OPENED_TOTAL,
        Unit::Count,
        "MCP connections whose handshake completed, by transport"
    );
    describe_counter!(
        CONNECT_FAILURES_TOTAL,
        Unit::Count,
        "MCP connections that failed to start or to complete the handshake, by transport"
    );
    describe_counter!(
        CONNECTIONS_CLOSED_TOTAL,
        Unit::Count,
        "MCP connections that ended (closed, process exited, transport closed), by transport"
    );
    describe_counter!(
        CALLS_TOTAL,
        Unit::Count,
        "MCP tool calls, by transport and outcome"
    );
    describe_counter!(
        CANCEL_NOTICES_TOTAL,
        Unit::Count,
        "notifications/cancelled sent for abandoned MCP calls, by transport and outcome (sent, failed)"
    );
    describe_histogram!(
        CALL_DURATION_SECONDS,
        Unit::Seconds,
        "Time from sending an MCP tool call to its result, error, cancellation or timeout"
    );
    // Every series exists from the start, at 0.
    for transport in Transport::ALL {
        let transport = transport.as_str();
        counter!(CONNECTIONS_OPENED_TOTAL, "transport" => transport).increment(0);
        counter!(CONNECT_FAILURES_TOTAL, "transport" => transport).increment(0);
        counter!(CONNECTIONS_CLOSED_TOTAL, "transport" => transport).increment(0);
        for outcome in CallOutcome::ALL {
            let outcome = outcome.as_str();
            counter!(CALLS_TOTAL, "transport" => transport, "outcome" => outcome).increment(0);
            let _ =
                histogram!(CALL_DURATION_SECONDS, "transport" => transport, "outcome" => outcome);
        }
        for outcome in ["sent", "failed"] {
            counter!(CANCEL_NOTICES_TOTAL, "transport" => transport, "outcome" => outcome)
                .increment(0);
        }
    }
}

/// How an MCP server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    StreamableHttp,
}

impl Transport {
    pub const ALL: [Self; 2] = [Self::Stdio, Self::StreamableHttp];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Stdio => "stdio",
            Self::StreamableHttp => "streamable_http",
        }
    }
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    Ok,
    /// The server answered with `isError: true`.
    ToolError,
    /// A JSON-RPC error or an unusable answer.
    ProtocolError,
    /// The connection ended before the answer.
    Closed,
    Timeout,
    Cancelled,
}

impl CallOutcome {
    pub const ALL: [Self; 6] = [
        Self::Ok,
        Self::ToolError,
        Self::ProtocolError,
        Self::Closed,
        Self::Timeout,
        Self::Cancelled,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ToolError => "tool_error",
            Self::ProtocolError => "protocol_error",
            Self::Closed => "closed",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
        }
    }
}

pub fn connection_opened(transport: Transport) {
    counter!(CONNECTIONS_OPENED_TOTAL, "transport" => transport.as_str()).increment(1);
}

pub fn connect_failed(transport: Transport) {
    counter!(CONNECT_FAILURES_TOTAL, "transport" => transport.as_str()).increment(1);
}

pub fn connection_closed(transport: Transport) {
    counter!(CONNECTIONS_CLOSED_TOTAL, "transport" => transport.as_str()).increment(1);
}

pub fn call(transport: Transport, outcome: CallOutcome, elapsed: Duration) {
    let (transport, outcome) = (transport.as_str(), outcome.as_str());
    counter!(CALLS_TOTAL, "transport" => transport, "outcome" => outcome).increment(1);
    histogram!(CALL_DURATION_SECONDS, "transport" => transport, "outcome" => outcome)
        .record(elapsed.as_secs_f64());
}

pub fn cancel_notice(transport: Transport, sent: bool) {
    let outcome = if sent { "sent" } else { "failed" };
    if sent {
        CANCEL_NOTICES_SENT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    counter!(CANCEL_NOTICES_TOTAL, "transport" => transport.as_str(), "outcome" => outcome)
        .increment(1);
}
