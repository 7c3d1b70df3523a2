//! Scheduler: who may run a task now (S3).
//!
//! TODO(skeleton): module doc with the mailbox protocol and supervision.

use ractor::{ActorCell, RpcReplyPort};
use troupe_proto::{AgentError, ConversationId, TaskId};

/// Start-up arguments.
#[derive(Debug, Clone)]
pub struct SchedulerArgs {
    /// Tasks that may run at once in the session; 1 = single-flight (the default).
    pub limit: usize,
    /// Requests that may wait for a slot; one more is answered `Overloaded` at once.
    pub queue_capacity: usize,
}

impl Default for SchedulerArgs {
    fn default() -> Self {
        Self {
            limit: 1,
            queue_capacity: 1024,
        }
    }
}

/// The Scheduler's mailbox.
pub enum SchedulerMsg {
    /// Asks for a slot for `task_id`. Answered `Ok(())` when granted (FIFO, fair across
    /// conversations), or at once with `Overloaded` when the wait queue is full. The grant is
    /// released by `Release`, or when `holder` dies (the scheduler monitors it).
    Acquire {
        task_id: TaskId,
        conversation_id: ConversationId,
        holder: ActorCell,
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    /// Gives a slot back, or withdraws a waiting request. Idempotent.
    Release { task_id: TaskId },
    /// Observation: running and waiting tasks.
    Snapshot { reply: RpcReplyPort<SchedulerSnapshot> },
}

/// What the scheduler holds, for observation and tests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SchedulerSnapshot {
    pub running: Vec<TaskId>,
    pub waiting: Vec<TaskId>,
    pub limit: usize,
}
