//! Rollout: the session's event sequencer and its durable, policy-aware record (S10, S11).
//!
//! TODO(skeleton): module doc with the mailbox protocol, supervision, file layout.

use crate::clock::Clock;
use crate::events::EventDraft;
use ractor::RpcReplyPort;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use troupe_proto::{
    AgentError, ConversationId, ErrorKind, EventEnvelope, EventKind, SessionId, StoragePolicy,
    TaskId, TaskStatus, Usage,
};

/// Start-up arguments.
pub struct RolloutArgs {
    pub session_id: SessionId,
    /// This session's directory: `<data>/rollout/<session_id>/`.
    pub dir: PathBuf,
    pub clock: Clock,
    /// How often Ttl conversations are swept.
    pub ttl_sweep_interval: Duration,
    /// Live events buffered per subscriber before it lags.
    pub subscriber_capacity: usize,
}

/// The Rollout's mailbox.
pub enum RolloutMsg {
    /// Declares a conversation's storage policy; must precede its first event.
    ConversationRegistered {
        conversation_id: ConversationId,
        policy: StoragePolicy,
    },
    /// Numbers one event, hands what its policy allows to the writer, then publishes it.
    Emit { draft: EventDraft },
    /// Durability barrier: answered once everything emitted before it is written and fsynced.
    Flush {
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    /// Reads a conversation's record back (after an implicit flush), oldest first.
    ReadConversation {
        conversation_id: ConversationId,
        reply: RpcReplyPort<Result<Vec<RolloutRecord>, AgentError>>,
    },
    /// A receiver of live events; a slow one lags, the record does not.
    Subscribe {
        reply: RpcReplyPort<broadcast::Receiver<Arc<EventEnvelope>>>,
    },
    /// Timer: downgrades Ttl content older than its ttl to headers.
    SweepTtl,
    /// Observation: the last sequence number assigned.
    LastSeq { reply: RpcReplyPort<u64> },
}

/// How much of an event a record keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordLevel {
    /// The whole event, content included.
    Full,
    /// Metadata only.
    Headers,
    /// Start, end, error: kind and status only.
    Minimal,
}

/// Content-free facts about an event, kept at every level that keeps the event at all.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RecordMeta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<TaskStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind>,
    /// Size of the content that was left out, in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chars: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// One line of a conversation's rollout file (`<conversation_id>.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub seq: u64,
    pub ts_ms: u64,
    pub conversation_id: Option<ConversationId>,
    pub task_id: Option<TaskId>,
    /// `EventKind::name()` of the event.
    pub kind: String,
    pub level: RecordLevel,
    /// The event itself, only at `RecordLevel::Full`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<EventKind>,
    pub meta: RecordMeta,
}
