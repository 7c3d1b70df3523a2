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
}

/// One page of messages: at most `limit` messages older than the cursor, oldest first.
/// `next_before` is the cursor of the following (older) page, `None` when there is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagePage {
    pub messages: Vec<MessageRecord>,
    pub next_before: Option<u64>,
}
