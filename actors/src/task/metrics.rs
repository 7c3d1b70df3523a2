//! Metrics of the task runner: turns and tool calls. Labels are bounded: the tool's kind (a
//! built-in name, `mcp` or `unknown`, never an MCP tool's own name), how a call ended, and a
//! task's status.

use metrics::Unit;
use std::time::Duration;
use troupe_proto::{AgentError, TaskStatus};

pub const TOOL_OUTCOMES: &str = "troupe_tool_outcomes_total";
/// Tool call latency (approval waits included), by tool kind and outcome.
pub const TOOL_CALL_DURATION: &str = "troupe_tool_call_duration_seconds";
/// From the scheduler's grant to the task's end, by status.
pub const TURN_DURATION: &str = "troupe_turn_duration_seconds";
pub const PATCH_FILES: &str = "troupe_apply_patch_files_total";
pub const PLAN_UPDATES: &str = "troupe_plan_updates_total";
/// Commands that failed in the sandbox under `on-failure`, by whether a human let them run
/// again without it.
pub const SANDBOX_RETRIES: &str = "troupe_sandbox_retries_total";

/// Registers descriptions (Prometheus needs one per metric).
pub fn describe() {
    metrics::describe_counter!(
        TOOL_OUTCOMES,
        Unit::Count,
        "Tool calls by tool kind (built-in name, mcp, unknown) and outcome."
    );
    metrics::describe_histogram!(
        TOOL_CALL_DURATION,
        Unit::Seconds,
        "Tool call duration, approval waits included, by tool kind and outcome."
    );
    metrics::describe_histogram!(
        TURN_DURATION,
        Unit::Seconds,
        "Turn duration: from the scheduler slot's grant to the task's end (model calls and tools), by status."
    );
    metrics::describe_counter!(
        PATCH_FILES,
        Unit::Count,
        "Files changed by apply_patch, by operation (add, update, move, delete)."
    );
    metrics::describe_counter!(
        PLAN_UPDATES,
        Unit::Count,
        "Plans recorded with update_plan."
    );
    // Every series exists from the start, at 0 (`mcp` and `unknown` tools included).
    for tool in TOOL_LABELS {
        for outcome in OUTCOME_LABELS {
            metrics::counter!(TOOL_OUTCOMES, "tool" => tool, "outcome" => outcome).increment(0);
            let _ = metrics::histogram!(TOOL_CALL_DURATION, "tool" => tool, "outcome" => outcome);
        }
    }
    for status in TaskStatus::ALL {
        let _ = metrics::histogram!(TURN_DURATION, "status" => status.as_str());
    }
    for op in ["add", "update", "move", "delete"] {
        metrics::counter!(PATCH_FILES, "op" => op).increment(0);
    }
    metrics::counter!(PLAN_UPDATES).increment(0);
    metrics::describe_counter!(
        SANDBOX_RETRIES,
        Unit::Count,
        "Commands that failed in the sandbox under approval_policy on-failure, by outcome (approved: run again without the sandbox; not_approved)."
    );
    for outcome in ["approved", "not_approved"] {
        metrics::counter!(SANDBOX_RETRIES, "outcome" => outcome).increment(0);
    }
}

/// A command failed in the sandbox under `on-failure`; `approved`: it runs again without.
pub fn sandbox_retry(approved: bool) {
    let outcome = if approved { "approved" } else { "not_approved" };
    metrics::counter!(SANDBOX_RETRIES, "outcome" => outcome).increment(1);
}

/// Every value [`tool_label`] gives.
const TOOL_LABELS: [&str; 10] = [
    crate::tools::SHELL,
    crate::tools::UPDATE_PLAN,
    crate::tools::APPLY_PATCH,
    crate::tools::WEB_SEARCH,
    crate::capabilities::INSPECT,
    crate::capabilities::RUN,
    crate::agents::route::DISPATCH_TOOL,
    crate::modules::DISPATCH_MODULE_TOOL,
    "mcp",
    "unknown",
];

/// Every value [`outcome_label`] gives.
const OUTCOME_LABELS: [&str; 7] = [
    "ok",
    "error",
    "denied",
    "sandbox_refused",
    "cancelled",
    "invalid",
    "failed",
];

/// The tool label: built-in names as they are, anything else `mcp` or `unknown`.
pub fn tool_label(name: &str, offered: bool) -> &'static str {
    match name {
        crate::tools::SHELL => crate::tools::SHELL,
        crate::tools::UPDATE_PLAN => crate::tools::UPDATE_PLAN,
        crate::tools::APPLY_PATCH => crate::tools::APPLY_PATCH,
        crate::tools::WEB_SEARCH => crate::tools::WEB_SEARCH,
        crate::capabilities::INSPECT if offered => crate::capabilities::INSPECT,
        crate::capabilities::RUN if offered => crate::capabilities::RUN,
        crate::agents::route::DISPATCH_TOOL if offered => crate::agents::route::DISPATCH_TOOL,
        crate::modules::DISPATCH_MODULE_TOOL if offered => crate::modules::DISPATCH_MODULE_TOOL,
        _ if offered => "mcp",
        _ => "unknown",
    }
}

/// How a tool call ended, as a label.
pub fn outcome_label(result: &Result<bool, &AgentError>) -> &'static str {
    match result {
        Ok(false) => "ok",
        // The tool ran and answered with an error (a command's non-zero exit).
        Ok(true) => "error",
        Err(AgentError::ApprovalDenied { .. }) => "denied",
        Err(AgentError::SandboxError { .. }) => "sandbox_refused",
        Err(AgentError::Cancelled { .. }) => "cancelled",
        Err(AgentError::InvalidInput { .. }) => "invalid",
        Err(_) => "failed",
    }
}

pub fn tool_finished(tool: &'static str, outcome: &'static str, took: Duration) {
    metrics::counter!(TOOL_OUTCOMES, "tool" => tool, "outcome" => outcome).increment(1);
    metrics::histogram!(TOOL_CALL_DURATION, "tool" => tool, "outcome" => outcome)
        .record(took.as_secs_f64());
}

/// A turn that held a scheduler slot ended.
pub fn turn_finished(status: TaskStatus, took: Duration) {
    metrics::histogram!(TURN_DURATION, "status" => status.as_str()).record(took.as_secs_f64());
}

pub fn patch_file(op: &'static str) {
    metrics::counter!(PATCH_FILES, "op" => op).increment(1);
}

pub fn plan_updated() {
    metrics::counter!(PLAN_UPDATES).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_offered_built_in_has_its_own_label_and_the_rest_are_mcp_or_unknown() {
        for name in [
            crate::tools::SHELL,
            crate::tools::UPDATE_PLAN,
            crate::tools::APPLY_PATCH,
            crate::tools::WEB_SEARCH,
            crate::capabilities::INSPECT,
            crate::capabilities::RUN,
            crate::agents::route::DISPATCH_TOOL,
            crate::modules::DISPATCH_MODULE_TOOL,
        ] {
            assert_eq!(tool_label(name, true), name);
            assert!(TOOL_LABELS.contains(&tool_label(name, true)));
        }
        assert_eq!(tool_label("github__search", true), "mcp");
        assert_eq!(
            tool_label(crate::modules::DISPATCH_MODULE_TOOL, false),
            "unknown"
        );
        assert_eq!(tool_label("made_up", false), "unknown");
    }
}
