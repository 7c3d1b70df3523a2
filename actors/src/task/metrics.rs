//! Tool-call metrics of the task runner. Labels are bounded: the tool's kind (a built-in
//! name, `mcp` or `unknown`, never an MCP tool's own name) and how the call ended.

use troupe_proto::AgentError;

pub const TOOL_OUTCOMES: &str = "troupe_tool_outcomes_total";
pub const PATCH_FILES: &str = "troupe_apply_patch_files_total";
pub const PLAN_UPDATES: &str = "troupe_plan_updates_total";

/// Registers descriptions (Prometheus needs one per metric).
pub fn describe() {
    metrics::describe_counter!(
        TOOL_OUTCOMES,
        "Tool calls by tool kind (built-in name, mcp, unknown) and outcome."
    );
    metrics::describe_counter!(
        PATCH_FILES,
        "Files changed by apply_patch, by operation (add, update, move, delete)."
    );
    metrics::describe_counter!(PLAN_UPDATES, "Plans recorded with update_plan.");
}

/// The tool label: built-in names as they are, anything else `mcp` or `unknown`.
pub fn tool_label(name: &str, offered: bool) -> &'static str {
    match name {
        crate::tools::SHELL => crate::tools::SHELL,
        crate::tools::UPDATE_PLAN => crate::tools::UPDATE_PLAN,
        crate::tools::APPLY_PATCH => crate::tools::APPLY_PATCH,
        crate::tools::WEB_SEARCH => crate::tools::WEB_SEARCH,
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

pub fn tool_finished(tool: &'static str, outcome: &'static str) {
    metrics::counter!(TOOL_OUTCOMES, "tool" => tool, "outcome" => outcome).increment(1);
}

pub fn patch_file(op: &'static str) {
    metrics::counter!(PATCH_FILES, "op" => op).increment(1);
}

pub fn plan_updated() {
    metrics::counter!(PLAN_UPDATES).increment(1);
}
