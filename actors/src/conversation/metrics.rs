//! Conversation metrics. Labels are bounded enums; ids go to traces and events, and
//! per-conversation figures stay in `conversation.stats`.

use metrics::Unit;
use troupe_proto::{TaskStats, TaskStatus};

pub const LIVE: &str = "troupe_conversations_live";
/// Conversations active (not passivated) in this process: their actors are alive.
pub const ACTIVE: &str = "troupe_conversations_active";
/// Tasks started, by kind (`message`, `compact`).
pub const TASKS_STARTED: &str = "troupe_tasks_started_total";
/// Tasks finished, by status.
pub const TASKS_FINISHED: &str = "troupe_tasks_finished_total";
pub const TASK_DURATION: &str = "troupe_task_duration_seconds";
pub const TOOL_CALLS: &str = "troupe_tool_calls_total";
pub const TOKENS: &str = "troupe_tokens_total";
pub const FORCE_ABORTS: &str = "troupe_tasks_force_aborted_total";
pub const POLICY_CLAMPED: &str = "troupe_policy_clamped_total";
/// Tasks (running or queued) cancelled by a cancel-all of their conversation.
pub const CANCELLED_ALL: &str = "troupe_conversation_tasks_cancelled_total";
/// Conversations opened (or changed) with a model of their own.
pub const OWN_MODEL: &str = "troupe_conversations_own_model_total";
/// Scheduler slots given back by tasks waiting for a human.
pub const SLOT_YIELDS: &str = "troupe_task_slot_yields_total";
/// Model summaries of trimmed history, by outcome.
pub const MODEL_SUMMARIES: &str = "troupe_history_model_summaries_total";
/// The outcomes of [`MODEL_SUMMARIES`].
pub const MODEL_SUMMARY_OUTCOMES: [&str; 5] = ["written", "stale", "failed", "empty", "timed_out"];

/// Registers descriptions (Prometheus needs one per metric).
pub fn describe() {
    metrics::describe_gauge!(
        LIVE,
        Unit::Count,
        "Conversation actors alive in this process."
    );
    metrics::describe_counter!(
        TASKS_STARTED,
        Unit::Count,
        "Tasks started, by kind (message, compact)."
    );
    metrics::describe_counter!(
        TASKS_FINISHED,
        Unit::Count,
        "Tasks finished, by status (ok, error, max_steps, cancelled)."
    );
    metrics::describe_histogram!(
        TASK_DURATION,
        Unit::Seconds,
        "Task duration from its start to its end, the wait for a scheduler slot included, by status."
    );
    metrics::describe_counter!(TOOL_CALLS, Unit::Count, "Tool calls made by tasks.");
    metrics::describe_counter!(
        TOKENS,
        Unit::Count,
        "Model tokens of finished tasks, by direction (input, output)."
    );
    metrics::describe_counter!(
        FORCE_ABORTS,
        Unit::Count,
        "Tasks aborted because they ignored their cancellation (by close, cancel-all or task.cancel) past the close timeout."
    );
    metrics::describe_counter!(
        CANCELLED_ALL,
        Unit::Count,
        "Tasks (running or queued) cancelled by a cancel-all of their conversation."
    );
    metrics::describe_counter!(
        POLICY_CLAMPED,
        Unit::Count,
        "Conversations that asked for a wider policy than the session's, by policy (approval, sandbox)."
    );
    // A close timeout is rare: the series exists at 0 so that rates and alerts see it.
    metrics::counter!(FORCE_ABORTS).increment(0);
    for policy in ["approval", "sandbox"] {
        metrics::counter!(POLICY_CLAMPED, "policy" => policy).increment(0);
    }
    for kind in ["message", "compact"] {
        metrics::counter!(TASKS_STARTED, "kind" => kind).increment(0);
    }
    for status in TaskStatus::ALL {
        metrics::counter!(TASKS_FINISHED, "status" => status.as_str()).increment(0);
        let _ = metrics::histogram!(TASK_DURATION, "status" => status.as_str());
    }
    metrics::counter!(TOOL_CALLS).increment(0);
    for direction in ["input", "output"] {
        metrics::counter!(TOKENS, "direction" => direction).increment(0);
    }
    metrics::gauge!(LIVE).increment(0.0);
    metrics::describe_gauge!(
        ACTIVE,
        Unit::Count,
        "Conversations active in this process (their actors alive; passivated ones are not counted)."
    );
    metrics::gauge!(ACTIVE).increment(0.0);
    metrics::counter!(CANCELLED_ALL).increment(0);
    metrics::describe_counter!(
        MODEL_SUMMARIES,
        Unit::Count,
        "Model summaries of trimmed history (summarizer = model), by outcome (written; stale: the history changed meanwhile; failed, empty, timed_out: the local summary stayed)."
    );
    for outcome in MODEL_SUMMARY_OUTCOMES {
        metrics::counter!(MODEL_SUMMARIES, "outcome" => outcome).increment(0);
    }
    metrics::describe_counter!(
        OWN_MODEL,
        Unit::Count,
        "Conversations opened (or changed by set-context) with a model other than the session's."
    );
    metrics::counter!(OWN_MODEL).increment(0);
    metrics::describe_counter!(
        SLOT_YIELDS,
        Unit::Count,
        "Scheduler slots given back by tasks while they wait for a human (an approval); each asks for its slot again once answered."
    );
    metrics::counter!(SLOT_YIELDS).increment(0);
}

/// A task gave its slot back for a human's answer.
pub fn slot_yielded() {
    metrics::counter!(SLOT_YIELDS).increment(1);
}

/// A conversation chose a model of its own.
pub fn own_model() {
    metrics::counter!(OWN_MODEL).increment(1);
}

/// A model summary ended with `outcome` (one of [`MODEL_SUMMARY_OUTCOMES`]).
pub fn model_summary(outcome: &'static str) {
    metrics::counter!(MODEL_SUMMARIES, "outcome" => outcome).increment(1);
}

pub fn live(n: usize) {
    metrics::gauge!(LIVE).set(n as f64);
    metrics::gauge!(ACTIVE).set(n as f64);
}

/// A task started; `kind` is `message` or `compact`.
pub fn task_started(kind: &'static str) {
    metrics::counter!(TASKS_STARTED, "kind" => kind).increment(1);
}

pub fn task_finished(status: TaskStatus, stats: &TaskStats) {
    metrics::counter!(TASKS_FINISHED, "status" => status.as_str()).increment(1);
    metrics::histogram!(TASK_DURATION, "status" => status.as_str())
        .record(stats.duration_ms as f64 / 1000.0);
    metrics::counter!(TOOL_CALLS).increment(u64::from(stats.tool_calls));
    metrics::counter!(TOKENS, "direction" => "input").increment(stats.usage.input_tokens);
    metrics::counter!(TOKENS, "direction" => "output").increment(stats.usage.output_tokens);
}

/// A cancel-all of a conversation cancelled `n` tasks.
pub fn cancelled_all(n: usize) {
    metrics::counter!(CANCELLED_ALL).increment(n as u64);
}

pub fn force_aborted() {
    metrics::counter!(FORCE_ABORTS).increment(1);
}

/// A conversation's `policy` ("approval" or "sandbox") request was clamped (C2).
pub fn policy_clamped(policy: &'static str) {
    metrics::counter!(POLICY_CLAMPED, "policy" => policy).increment(1);
}
