//! MCP client metrics: what one connection saw on the wire, named `troupe_mcp_client_*` so
//! they never mix with the pool's `troupe_mcp_*` view of the same calls. Labels are closed sets
//! (transport, outcome); server names, tool names and request ids go to traces only.

use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};
use std::time::Duration;
use troupe_actors::ports::McpOAuthGrant;

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

/// OAuth tokens renewed (refresh-token grant, or the client-credentials grant asked again), by
/// grant, what triggered it (`missing`, `expiring`, `rejected`: a 401) and outcome (`ok`,
/// `login_required`, `failed`).
pub const OAUTH_RENEWALS_TOTAL: &str = "troupe_mcp_client_oauth_renewals_total";
/// OAuth failures that kept a connection or a call from an MCP server, by reason.
pub const OAUTH_FAILURES_TOTAL: &str = "troupe_mcp_client_oauth_failures_total";

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
    describe_counter!(
        OAUTH_RENEWALS_TOTAL,
        Unit::Count,
        "OAuth access tokens renewed for MCP servers, by grant, trigger (missing, expiring, rejected) and outcome (ok, login_required, failed)"
    );
    describe_counter!(
        OAUTH_FAILURES_TOTAL,
        Unit::Count,
        "OAuth failures that kept troupe from an MCP server, by reason (login_required, token_rejected, insufficient_scope, unavailable, config)"
    );
    // Every series exists from the start, at 0.
    for grant in McpOAuthGrant::ALL {
        for trigger in RenewalTrigger::ALL {
            for outcome in RenewalOutcome::ALL {
                counter!(OAUTH_RENEWALS_TOTAL, "grant" => grant.as_str(), "trigger" => trigger.as_str(), "outcome" => outcome.as_str())
                    .increment(0);
            }
        }
    }
    for reason in OAuthFailureReason::ALL {
        counter!(OAUTH_FAILURES_TOTAL, "reason" => reason.as_str()).increment(0);
    }
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

/// What made troupe renew an OAuth access token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewalTrigger {
    /// There was none yet (the client-credentials grant's first token).
    Missing,
    /// It expires within the refresh margin (or has expired).
    Expiring,
    /// The server answered 401 to it.
    Rejected,
}

impl RenewalTrigger {
    pub const ALL: [Self; 3] = [Self::Missing, Self::Expiring, Self::Rejected];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Expiring => "expiring",
            Self::Rejected => "rejected",
        }
    }
}

/// How a renewal ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewalOutcome {
    Ok,
    /// The authorization server refused the grant (a revoked refresh token, wrong client
    /// credentials): a person has to log in again or fix the configuration.
    LoginRequired,
    /// The token endpoint could not be reached or answered an error worth retrying.
    Failed,
}

impl RenewalOutcome {
    pub const ALL: [Self; 3] = [Self::Ok, Self::LoginRequired, Self::Failed];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::LoginRequired => "login_required",
            Self::Failed => "failed",
        }
    }
}

/// Why OAuth kept troupe from a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OAuthFailureReason {
    /// Nobody logged in, or the login can no longer be used.
    LoginRequired,
    /// The server refused a fresh token.
    TokenRejected,
    /// The server wants a scope the token does not have.
    InsufficientScope,
    /// Discovery or the token endpoint failed (network, server error).
    Unavailable,
    /// The configuration is unusable (a missing client id or secret variable).
    Config,
}

impl OAuthFailureReason {
    pub const ALL: [Self; 5] = [
        Self::LoginRequired,
        Self::TokenRejected,
        Self::InsufficientScope,
        Self::Unavailable,
        Self::Config,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::LoginRequired => "login_required",
            Self::TokenRejected => "token_rejected",
            Self::InsufficientScope => "insufficient_scope",
            Self::Unavailable => "unavailable",
            Self::Config => "config",
        }
    }
}

pub fn oauth_renewal(grant: McpOAuthGrant, trigger: RenewalTrigger, outcome: RenewalOutcome) {
    counter!(OAUTH_RENEWALS_TOTAL, "grant" => grant.as_str(), "trigger" => trigger.as_str(), "outcome" => outcome.as_str())
        .increment(1);
}

pub fn oauth_failure(reason: OAuthFailureReason) {
    counter!(OAUTH_FAILURES_TOTAL, "reason" => reason.as_str()).increment(1);
}
