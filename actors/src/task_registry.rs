//! TaskRegistry: the session's index of live tasks (S4).
//!
//! TODO(skeleton): module doc with the mailbox protocol and supervision.

use crate::clock::Clock;
use ractor::RpcReplyPort;
use tokio_util::sync::CancellationToken;
use troupe_proto::{AgentError, ConversationId, TaskId, TaskInfo, TaskState};

/// Start-up arguments.
#[derive(Debug, Clone)]
pub struct TaskRegistryArgs {
    pub clock: Clock,
}

/// The TaskRegistry's mailbox.
pub enum TaskRegistryMsg {
    /// Records a new task. The registry keeps only its cancellation token: no reference back to
    /// the conversation, so nothing forms a cycle.
    Register {
        task_id: TaskId,
        conversation_id: ConversationId,
        sub_id: String,
        cancel: CancellationToken,
    },
    /// The task moved to another state (queued → running).
    StateChanged { task_id: TaskId, state: TaskState },
    /// The task is over. Idempotent.
    Deregister { task_id: TaskId },
    /// Cancels one task; `NotFound` if it is not registered.
    Cancel {
        task_id: TaskId,
        reply: RpcReplyPort<Result<TaskInfo, AgentError>>,
    },
    /// Cancels every task of a conversation; answers how many.
    CancelConversation {
        conversation_id: ConversationId,
        reply: RpcReplyPort<usize>,
    },
    /// Drops every entry of a conversation that is gone (it failed or closed).
    ConversationGone { conversation_id: ConversationId },
    /// Lists tasks, of one conversation or all, oldest first.
    List {
        conversation_id: Option<ConversationId>,
        reply: RpcReplyPort<Vec<TaskInfo>>,
    },
}
