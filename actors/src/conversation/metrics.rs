//! Conversation metrics. Labels are bounded enums; ids go to traces and events.

use troupe_proto::{TaskStats, TaskStatus};

pub const LIVE: &str = "troupe_conversations_live";
pub const TASKS: &str = "troupe_tasks_total";
pub const TASK_DURATION: &str = "troupe_task_duration_seconds";
pub const TOOL_CALLS: &str = "troupe_tool_calls_total";
pub const TOKENS: &str = "troupe_tokens_total";
pub const FORCE_ABORTS: &str = "troupe_tasks_force_aborted_total";
pub const POLICY_CLAMPED: &str = "troupe_policy_clamped_total";

/// Registers descriptions (Prometheus needs one per metric).
pub fn describe() {
    metrics::describe_gauge!(LIVE, "Conversation actors alive in this process.");
    metrics::describe_counter!(TASKS, "Tasks finished, by status.");
    metrics::describe_histogram!(
        TASK_DURATION,
        metrics::Unit::Seconds,
        "Task duration, by status."
    );
    metrics::describe_counter!(TOOL_CALLS, "Tool calls made by tasks.");
    metrics::describe_counter!(TOKENS, "Model tokens, by direction (input, output).");
    metrics::describe_counter!(
        FORCE_ABORTS,
        "Tasks aborted because they ignored cancellation past the close timeout."
    );
    metrics::describe_counter!(
        POLICY_CLAMPED,
        "Conversations that asked for a wider policy than the session's, by policy (approval, sandbox)."
    );
}

pub fn live(n: usize) {
    metrics::gauge!(LIVE).set(n as f64);
}

pub fn task_finished(status: TaskStatus, stats: &TaskStats) {
    metrics::counter!(TASKS, "status" => status.as_str()).increment(1);
    metrics::histogram!(TASK_DURATION, "status" => status.as_str())
        .record(stats.duration_ms as f64 / 1000.0);
    metrics::counter!(TOOL_CALLS).increment(u64::from(stats.tool_calls));
    metrics::counter!(TOKENS, "direction" => "input").increment(stats.usage.input_tokens);
    metrics::counter!(TOKENS, "direction" => "output").increment(stats.usage.output_tokens);
}

pub fn force_aborted() {
    metrics::counter!(FORCE_ABORTS).increment(1);
}

/// A conversation's `policy` ("approval" or "sandbox") request was clamped (C2).
pub fn policy_clamped(policy: &'static str) {
    metrics::counter!(POLICY_CLAMPED, "policy" => policy).increment(1);
}
