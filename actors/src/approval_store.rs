//! ApprovalStore: approved command keys with scope and expiry, and pending requests (S9).
//!
//! TODO(skeleton): module doc with the mailbox protocol and supervision.

use crate::clock::Clock;
use crate::events::EventSink;
use ractor::RpcReplyPort;
use std::time::Duration;
use troupe_proto::{
    AgentError, ApprovalDecision, ApprovalId, CommandKey, ConversationId, PendingApproval, TaskId,
};

/// Start-up arguments.
pub struct ApprovalStoreArgs {
    pub clock: Clock,
    /// How often expired keys are swept.
    pub sweep_interval: Duration,
    /// How long a request waits for a human before it is denied.
    pub request_timeout: Duration,
    /// Where `approval_requested` / `approval_resolved` events go.
    pub events: Option<EventSink>,
}

/// How a request was granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Granted {
    /// An existing key covered the command; no human was asked.
    Remembered,
    /// A human approved it now.
    Decided(ApprovalDecision),
}

/// The ApprovalStore's mailbox.
pub enum ApprovalMsg {
    /// Runs `command` for `conversation_id`? Answered at once when a live key covers it;
    /// otherwise a pending request is opened, an `approval_requested` event emitted, and the
    /// answer comes with the human's decision, or `ApprovalDenied` when `timeout` (default:
    /// the store's) runs out.
    Request {
        conversation_id: ConversationId,
        task_id: Option<TaskId>,
        command: Vec<String>,
        reason: String,
        timeout: Option<Duration>,
        reply: RpcReplyPort<Result<Granted, AgentError>>,
    },
    /// A human's decision on a pending request; `NotFound` if it is unknown or already over.
    Respond {
        approval_id: ApprovalId,
        decision: ApprovalDecision,
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    /// Timer: a pending request ran out of time.
    RequestTimedOut { approval_id: ApprovalId },
    /// Timer: drops expired keys.
    Sweep,
    /// Whether a live key covers the command, without asking anyone.
    IsApproved {
        conversation_id: ConversationId,
        command: Vec<String>,
        reply: RpcReplyPort<bool>,
    },
    /// Pending requests, oldest first (optionally of one conversation).
    ListPending {
        conversation_id: Option<ConversationId>,
        reply: RpcReplyPort<Vec<PendingApproval>>,
    },
    /// Live keys, for observation.
    ListKeys { reply: RpcReplyPort<Vec<CommandKey>> },
    /// The conversation closed: deny its pending requests and drop its scoped keys.
    ConversationClosed { conversation_id: ConversationId },
}
