//! Tasks: how one ended, its statistics, and where a registered one stands (S4, S5, T1).

use crate::ids::{ConversationId, TaskId};
use crate::item::Usage;
use serde::{Deserialize, Serialize};

/// How a task ended (T1 statuses plus cancellation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Ok,
    Error,
    MaxSteps,
    Cancelled,
}

impl TaskStatus {
    /// Every status (the known values of a metric label).
    pub const ALL: [Self; 4] = [Self::Ok, Self::Error, Self::MaxSteps, Self::Cancelled];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::MaxSteps => "max_steps",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Statistics of one task (S5).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TaskStats {
    /// Provider-reported (or, for the scripted model, counted) usage.
    pub usage: Usage,
    /// Local estimate of the prompt tokens, summed over steps.
    pub estimated_prompt_tokens: u64,
    /// Local count of the completion tokens of the steps whose provider reported no usage
    /// (T5): those steps' output is in here, not in `usage`.
    #[serde(default)]
    pub estimated_completion_tokens: u64,
    /// Steps whose provider reported usage (the rest were counted locally).
    #[serde(default)]
    pub steps_with_usage: u32,
    /// Index of this turn in its conversation, from 1 (T1); unique within the conversation,
    /// also across restores and compactions (a compaction is a turn too). 0 in records
    /// written before turns were numbered here.
    #[serde(default)]
    pub turn: u32,
    /// Model calls (steps) of this turn that answered (a call that failed is not counted; 0:
    /// none did).
    pub steps: u32,
    pub tool_calls: u32,
    pub duration_ms: u64,
    /// W3C trace id of the task's span.
    pub trace_id: String,
    /// Of `tool_calls`, those that went to an MCP server (S11).
    #[serde(default)]
    pub mcp_calls: u32,
    /// Time spent in those MCP calls (slot waits and retries included), in milliseconds.
    #[serde(default)]
    pub mcp_latency_ms: u64,
}

/// The state of a registered task (S4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for a scheduler slot.
    Queued,
    Running,
    /// Cancellation was requested; the task has not stopped yet.
    Cancelling,
}

/// A task, as listed for observation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInfo {
    pub task_id: TaskId,
    pub conversation_id: ConversationId,
    pub sub_id: String,
    pub started_at_ms: u64,
    pub state: TaskState,
}
