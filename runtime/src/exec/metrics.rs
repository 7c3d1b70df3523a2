//! Command runner metrics. Labels are bounded: the sandbox policy and how a command ended;
//! commands, paths and ids go to traces only.

use std::time::Duration;
use troupe_proto::SandboxPolicy;

pub const COMMANDS: &str = "troupe_exec_commands_total";
pub const DURATION: &str = "troupe_exec_duration_seconds";
pub const SANDBOX_REFUSALS: &str = "troupe_sandbox_refusals_total";

/// How a command run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Exited with status 0.
    Ok,
    /// Exited with another status or was killed by a signal.
    Failed,
    TimedOut,
    Cancelled,
    /// The sandbox could not be enforced; the command never ran.
    Refused,
    /// The program (or the launcher) could not be started, or its `workdir` is missing.
    SpawnFailed,
}

impl Outcome {
    pub const ALL: [Self; 6] = [
        Self::Ok,
        Self::Failed,
        Self::TimedOut,
        Self::Cancelled,
        Self::Refused,
        Self::SpawnFailed,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
            Self::Refused => "refused",
            Self::SpawnFailed => "spawn_failed",
        }
    }
}

/// The policy as a label value.
pub const fn policy_label(policy: SandboxPolicy) -> &'static str {
    match policy {
        SandboxPolicy::ReadOnly => "read_only",
        SandboxPolicy::WorkspaceWrite => "workspace_write",
        SandboxPolicy::FullAccess => "full_access",
    }
}

/// Registers descriptions (Prometheus needs one per metric).
pub fn describe() {
    metrics::describe_counter!(
        COMMANDS,
        metrics::Unit::Count,
        "Shell commands run, by sandbox policy and outcome."
    );
    metrics::describe_histogram!(
        DURATION,
        metrics::Unit::Seconds,
        "Shell command wall time, by sandbox policy."
    );
    metrics::describe_counter!(
        SANDBOX_REFUSALS,
        metrics::Unit::Count,
        "Commands refused because their sandbox policy could not be fully enforced, by policy."
    );
    // Every series exists from the start, at 0.
    for policy in [
        SandboxPolicy::ReadOnly,
        SandboxPolicy::WorkspaceWrite,
        SandboxPolicy::FullAccess,
    ] {
        let policy = policy_label(policy);
        for outcome in Outcome::ALL {
            metrics::counter!(COMMANDS, "policy" => policy, "outcome" => outcome.as_str())
                .increment(0);
        }
        let _ = metrics::histogram!(DURATION, "policy" => policy);
        metrics::counter!(SANDBOX_REFUSALS, "policy" => policy).increment(0);
    }
}

pub fn command_finished(policy: SandboxPolicy, outcome: Outcome, took: Duration) {
    let policy = policy_label(policy);
    metrics::counter!(COMMANDS, "policy" => policy, "outcome" => outcome.as_str()).increment(1);
    metrics::histogram!(DURATION, "policy" => policy).record(took.as_secs_f64());
    if outcome == Outcome::Refused {
        metrics::counter!(SANDBOX_REFUSALS, "policy" => policy).increment(1);
    }
}
