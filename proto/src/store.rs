//! What the service's store keeps (P1, P2): sessions, conversations, messages and each
//! project's current session, as the REST and JSON-RPC APIs return them.

use crate::api::OpenConversation;
use crate::ids::{ConversationId, SessionId, TaskId};
use crate::item::Role;
use crate::json::Json;
use serde::{Deserialize, Serialize};

/// A session, as stored and as `GET /api/sessions/{id}` returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub session_id: SessionId,
    /// The project the session belongs to; `None` for a session outside any project.
    pub project_id: Option<String>,
    pub title: Option<String>,
    pub created_ms: u64,
    /// The root conversation, opened with the session.
    pub root_conversation_id: ConversationId,
    /// Free-form settings the session was created with (model, limits, ...).
    pub settings: Json,
    /// Where the session stands: `active` while it has work or none ended yet, else the
    /// outcome of its last message (see [`SessionStatus`]).
    #[serde(default)]
    pub status: SessionStatus,
    /// Unix ms of the last change the store recorded for the session (a message stored or
    /// ended, a conversation opened, changed or closed, a status change); `created_ms` until
    /// then.
    #[serde(default)]
    pub updated_ms: u64,
}

/// Where a session stands (P1). Set by the service's host of the session:
/// - `active` when created and whenever one of its messages is accepted, and as long as any
///   of its messages is queued or running;
/// - once none is left, the outcome of the message that ended last: `completed` (its task
///   answered), `failed` (its task failed, or was aborted by a crash or a restart),
///   `cancelled` (its task was cancelled, or its conversation closed before it ran);
/// - `failed` when the session cannot be started again (past its restart budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    #[default]
    Active,
    Completed,
    Failed,
    Cancelled,
}

impl SessionStatus {
    pub const ALL: [Self; 4] = [Self::Active, Self::Completed, Self::Failed, Self::Cancelled];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Parses [`SessionStatus::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// The status a session takes once its last pending message ended with `outcome`.
    pub const fn after(outcome: MessageStatus) -> Self {
        match outcome {
            MessageStatus::Queued | MessageStatus::Running => Self::Active,
            MessageStatus::Completed => Self::Completed,
            MessageStatus::Failed | MessageStatus::Aborted => Self::Failed,
            MessageStatus::Cancelled => Self::Cancelled,
        }
    }
}

/// What a stored message is (P1), so that a client can rebuild a whole exchange from the
/// message list. `content` and `metadata` by type:
/// - `text`: a user message, a reply, or what the model said between tool calls; metadata
///   `null`, or `{"reply_to": <user message id>}` for text written during a task;
/// - `tool_call`: content = the call's arguments (JSON text); metadata `{"tool", "call_id",
///   "reply_to"}`;
/// - `tool_result`: content = the tool's output; metadata `{"tool", "call_id", "is_error",
///   "reply_to"}`;
/// - `status`: how a user message ended when it did not complete; content = the error's
///   message; metadata `{"status", "code", "reply_to"}`.
///
/// The storage policy applies to `content` only; metadata never holds content (arguments,
/// outputs and error texts are content), so it is kept under every policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageKind {
    #[default]
    Text,
    ToolCall,
    ToolResult,
    Status,
}

impl MessageKind {
    pub const ALL: [Self; 4] = [Self::Text, Self::ToolCall, Self::ToolResult, Self::Status];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::ToolCall => "tool_call",
            Self::ToolResult => "tool_result",
            Self::Status => "status",
        }
    }

    /// Parses [`MessageKind::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

/// Whether a conversation is still open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConversationState {
    Open,
    Closed,
}

/// A conversation of a stored session; reopened (same id, same parameters) after a restart
/// while `state` is `open`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationRecord {
    pub conversation_id: ConversationId,
    pub session_id: SessionId,
    pub params: OpenConversation,
    pub is_root: bool,
    pub state: ConversationState,
    pub created_ms: u64,
    pub closed_ms: Option<u64>,
}

/// Where a user message stands. Every message the service acknowledged reaches one of the
/// terminal states, whatever crashes: `queued` and `running` are the only others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageStatus {
    /// Accepted and stored; waits for its conversation's running task to end. Runs after a
    /// restart if the process stops first.
    Queued,
    /// Its task started (it may still wait for the session's scheduler slot).
    Running,
    /// Its task ended with a reply (`ok` or `max_steps`).
    Completed,
    /// Its task ended with an error, or could not run.
    Failed,
    /// Its task was cancelled, or its conversation closed before it ran.
    Cancelled,
    /// Its task was interrupted by a crash or a failure and is not run again.
    Aborted,
}

impl MessageStatus {
    pub const ALL: [Self; 6] = [
        Self::Queued,
        Self::Running,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
        Self::Aborted,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Aborted => "aborted",
        }
    }

    /// Parses [`MessageStatus::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Whether nothing more will happen to the message.
    pub const fn is_terminal(self) -> bool {
        !matches!(self, Self::Queued | Self::Running)
    }
}

/// One user or assistant message. `content` is `None` when the conversation's storage policy
/// does not keep content (or a Ttl sweep removed it); `chars` still tells its size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageRecord {
    /// Assigned by the store, strictly increasing within the store: the pagination cursor.
    pub message_id: u64,
    pub session_id: SessionId,
    pub conversation_id: ConversationId,
    pub task_id: Option<TaskId>,
    pub role: Role,
    pub content: Option<String>,
    pub chars: u64,
    pub created_ms: u64,
    /// A user message's outcome; `None` for an assistant message.
    pub status: Option<MessageStatus>,
    /// The assistant message that answered this user message, once there is one.
    pub reply_message_id: Option<u64>,
    /// What the message is (`type` on the wire); `text` for every message stored before
    /// types existed.
    #[serde(rename = "type", default)]
    pub kind: MessageKind,
    /// What a client needs besides the content to place the message (see [`MessageKind`]).
    #[serde(default)]
    pub metadata: Option<Json>,
}

/// A message to append; the store assigns `message_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewMessage {
    pub session_id: SessionId,
    pub conversation_id: ConversationId,
    pub task_id: Option<TaskId>,
    pub role: Role,
    pub content: Option<String>,
    pub chars: u64,
    pub created_ms: u64,
    /// A user message's status when stored (`queued` or `running`); `None` for a reply.
    /// Storing a user message (one with a status) makes its session `active`.
    pub status: Option<MessageStatus>,
    #[serde(rename = "type", default)]
    pub kind: MessageKind,
    #[serde(default)]
    pub metadata: Option<Json>,
}

/// The end of a user message: its outcome and, when its task answered, the reply to store,
/// written together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinishMessage {
    pub message_id: u64,
    /// A terminal status.
    pub status: MessageStatus,
    pub task_id: Option<TaskId>,
    /// Stored before the reply, in order: what the task did on the way (its tool calls and
    /// results, the model's text between them) and, when the message did not complete, a
    /// `status` message saying how it ended.
    #[serde(default)]
    pub items: Vec<NewMessage>,
    pub reply: Option<NewMessage>,
    /// The session's status after this end (P1), written in the same transaction; `None`
    /// leaves it as it is.
    #[serde(default)]
    pub session_status: Option<SessionStatus>,
}

/// A user message once ended, and its stored reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinishedMessage {
    pub message: MessageRecord,
    /// The stored [`FinishMessage::items`], in order.
    #[serde(default)]
    pub items: Vec<MessageRecord>,
    pub reply: Option<MessageRecord>,
}

/// A stored message's new status, as the event stream reports it (`message_updated`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageOutcome {
    pub message_id: u64,
    pub status: MessageStatus,
    pub task_id: Option<TaskId>,
    pub reply_message_id: Option<u64>,
}

/// The most message content, in bytes (UTF-8), one page of messages holds: 4 MiB. A page
/// stops at `limit` messages or before the message that would take its content past this
/// budget, whichever comes first, but always holds at least one message (when `limit` is at
/// least 1), so a single message larger than the budget comes alone in its page.
pub const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// One page of messages: at most `limit` messages older than the cursor, oldest first, and
/// no more content than the page's byte budget ([`MAX_PAGE_BYTES`] over the APIs) unless
/// the page is a single message. `next_before` is the cursor of the following (older) page,
/// `None` when there is none: following it visits every message exactly once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagePage {
    pub messages: Vec<MessageRecord>,
    pub next_before: Option<u64>,
}

/// One A2A context as the A2A endpoint keeps it (P5): the conversation its tasks run in.
/// Its conversation is closed once the context has been idle for a while and reopened, under
/// the same id and from its record, on the context's next message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct A2aContextRecord {
    /// The client's (or the server's) name for the context, at most 256 bytes.
    pub context_id: String,
    /// The session the conversation belongs to.
    pub session_id: SessionId,
    pub conversation_id: ConversationId,
    pub created_ms: u64,
    /// When a task of the context last arrived or changed state: idleness is measured from
    /// it.
    pub active_ms: u64,
    /// Whether the conversation is open now.
    pub open: bool,
}

/// One A2A task as the A2A endpoint keeps it. The store reads only the columns; `body` is
/// the endpoint's own serialisation of the task (status, history, artifacts and what it
/// needs to go on), written and read back whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct A2aTaskRecord {
    pub task_id: String,
    pub context_id: String,
    /// The A2A state's name (`TASK_STATE_WORKING`, ...): what `ListTasks` filters on.
    pub state: String,
    /// No further change will happen: finished tasks are the ones retention forgets.
    pub terminal: bool,
    pub created_ms: u64,
    /// The time of its current status: `ListTasks` orders by it, newest first.
    pub updated_ms: u64,
    pub body: Json,
    /// Under a `ttl` policy, what `body` becomes at `expires_ms`: the task without its text.
    /// The store's ttl sweep (`Store::sweep_due`) swaps it in, and clears both, once due.
    #[serde(default)]
    pub redacted: Option<Json>,
    /// When `body`'s content is due (Unix ms); set together with `redacted`.
    #[serde(default)]
    pub expires_ms: Option<u64>,
}

/// One push notification config of an A2A task; `body` is the endpoint's serialisation of it
/// (the webhook's URL, token and credentials).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct A2aPushRecord {
    pub task_id: String,
    pub config_id: String,
    pub created_ms: u64,
    pub body: Json,
}

/// Which A2A tasks a listing returns: all filters must hold. Tasks come newest first, by
/// (`updated_ms`, `task_id`) descending.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct A2aTaskQuery {
    pub context_id: Option<String>,
    pub state: Option<String>,
    /// Only tasks whose `updated_ms` is at least this.
    pub updated_after_ms: Option<u64>,
    /// Only tasks strictly after this (`updated_ms`, `task_id`) in that order: the cursor of
    /// the next page.
    pub after: Option<(u64, String)>,
    pub limit: usize,
}

/// One page of A2A tasks and how many match the filters (the cursor aside).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct A2aTaskPage {
    pub tasks: Vec<A2aTaskRecord>,
    pub total: u64,
}

/// What one A2A retention pass forgot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct A2aPruned {
    /// Finished tasks (with their push configs).
    pub tasks: u64,
    /// Closed contexts left without a task.
    pub contexts: u64,
}
