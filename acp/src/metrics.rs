//! ACP metrics. Labels are bounded enums (how a turn ended, why a process stopped, how a
//! permission was answered, which side of the protocol); agent and session ids go to traces
//! and events only.

use crate::error::AcpErrorKind;
use crate::event::PermissionDecision;
use std::time::Duration;

pub const TURNS: &str = "troupe_acp_turns_total";
pub const TURN_DURATION: &str = "troupe_acp_turn_duration_seconds";
pub const PROCESS_STARTS: &str = "troupe_acp_process_starts_total";
pub const PROCESS_EXITS: &str = "troupe_acp_process_exits_total";
pub const PROCESSES: &str = "troupe_acp_processes";
pub const PERMISSIONS: &str = "troupe_acp_permission_requests_total";
pub const SESSIONS_OPENED: &str = "troupe_acp_sessions_opened_total";
pub const SERVED_PROMPTS: &str = "troupe_acp_served_prompts_total";

/// How a turn through the client ended: the agent's stop reason, or the error's kind.
pub const TURN_OUTCOMES: [&str; 12] = [
    "end_turn",
    "max_tokens",
    "max_turn_requests",
    "refusal",
    "cancelled",
    "error_spawn",
    "error_handshake",
    "error_refused",
    "error_exited",
    "error_busy",
    "error_cancelled",
    "error_stopped",
];

/// Why an agent's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    /// troupe stopped it (SIGTERM, or SIGKILL after the grace period).
    Shutdown,
    /// It ended on its own: a crash.
    Crashed,
}

impl ExitReason {
    pub const ALL: [Self; 2] = [Self::Shutdown, Self::Crashed];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Shutdown => "shutdown",
            Self::Crashed => "crashed",
        }
    }
}

/// How a prompt served by `troupe acp` ended.
pub const SERVED_OUTCOMES: [&str; 5] = [
    "end_turn",
    "max_turn_requests",
    "cancelled",
    "other",
    "error",
];

/// How a session was opened.
pub const SESSION_ORIGINS: [&str; 4] = ["new", "loaded", "resumed", "replaced"];

/// Registers descriptions, and every series at 0.
pub fn describe() {
    metrics::describe_counter!(
        TURNS,
        metrics::Unit::Count,
        "Prompt turns sent to external ACP agents, by outcome (stop reason or error kind)."
    );
    metrics::describe_histogram!(
        TURN_DURATION,
        metrics::Unit::Seconds,
        "Wall time of a prompt turn sent to an external ACP agent."
    );
    metrics::describe_counter!(
        PROCESS_STARTS,
        metrics::Unit::Count,
        "External ACP agent processes started, by result (ok: initialized; failed)."
    );
    metrics::describe_counter!(
        PROCESS_EXITS,
        metrics::Unit::Count,
        "External ACP agent processes that ended, by reason (shutdown or crashed)."
    );
    metrics::describe_gauge!(
        PROCESSES,
        metrics::Unit::Count,
        "External ACP agent processes running now."
    );
    metrics::describe_counter!(
        PERMISSIONS,
        metrics::Unit::Count,
        "Permission requests from external ACP agents, by decision."
    );
    metrics::describe_counter!(
        SESSIONS_OPENED,
        metrics::Unit::Count,
        "Sessions opened on external ACP agents, by origin (new, loaded, resumed, replaced)."
    );
    metrics::describe_counter!(
        SERVED_PROMPTS,
        metrics::Unit::Count,
        "Prompts served by `troupe acp` (troupe as an ACP agent), by stop reason."
    );
    for outcome in TURN_OUTCOMES {
        metrics::counter!(TURNS, "outcome" => outcome).increment(0);
    }
    for outcome in SERVED_OUTCOMES {
        metrics::counter!(SERVED_PROMPTS, "stop_reason" => outcome).increment(0);
    }
    let _ = metrics::histogram!(TURN_DURATION);
    for result in ["ok", "failed"] {
        metrics::counter!(PROCESS_STARTS, "result" => result).increment(0);
    }
    for reason in ExitReason::ALL {
        metrics::counter!(PROCESS_EXITS, "reason" => reason.as_str()).increment(0);
    }
    metrics::gauge!(PROCESSES).set(0.0);
    for decision in PermissionDecision::ALL {
        metrics::counter!(PERMISSIONS, "decision" => decision.as_str()).increment(0);
    }
    for origin in SESSION_ORIGINS {
        metrics::counter!(SESSIONS_OPENED, "origin" => origin).increment(0);
    }
}

/// The outcome label of an error.
pub const fn error_outcome(kind: AcpErrorKind) -> &'static str {
    match kind {
        AcpErrorKind::Spawn => "error_spawn",
        AcpErrorKind::Handshake => "error_handshake",
        AcpErrorKind::Refused => "error_refused",
        AcpErrorKind::Exited => "error_exited",
        AcpErrorKind::Busy => "error_busy",
        AcpErrorKind::Cancelled => "error_cancelled",
        AcpErrorKind::Stopped => "error_stopped",
    }
}

pub fn turn_finished(outcome: &'static str, took: Duration) {
    metrics::counter!(TURNS, "outcome" => outcome).increment(1);
    metrics::histogram!(TURN_DURATION).record(took.as_secs_f64());
}

pub fn process_started(ok: bool) {
    let result = if ok { "ok" } else { "failed" };
    metrics::counter!(PROCESS_STARTS, "result" => result).increment(1);
    if ok {
        metrics::gauge!(PROCESSES).increment(1.0);
    }
}

pub fn process_exited(reason: ExitReason) {
    metrics::counter!(PROCESS_EXITS, "reason" => reason.as_str()).increment(1);
    metrics::gauge!(PROCESSES).decrement(1.0);
}

pub fn permission_answered(decision: PermissionDecision) {
    metrics::counter!(PERMISSIONS, "decision" => decision.as_str()).increment(1);
}

pub fn session_opened(origin: &'static str) {
    metrics::counter!(SESSIONS_OPENED, "origin" => origin).increment(1);
}

pub fn prompt_served(stop_reason: &'static str) {
    metrics::counter!(SERVED_PROMPTS, "stop_reason" => stop_reason).increment(1);
}
