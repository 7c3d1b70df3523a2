//! Policies attached to a session or a conversation: storage (S10), approvals and sandbox (C2),
//! and the structured approval key (S9).

use crate::ids::ConversationId;
use serde::{Deserialize, Serialize};

/// What the rollout may keep of a conversation (S10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StoragePolicy {
    /// Everything: messages, tool arguments and outputs.
    #[default]
    Full,
    /// Metadata only: times, kinds, tool names, counts and sizes; no content.
    HeadersOnly,
    /// Only task start, task end and errors (by kind), no content at all.
    None,
    /// Full, then downgraded to headers-only by a sweep once older than `secs`.
    Ttl { secs: u64 },
}

impl StoragePolicy {
    /// Whether content (text, arguments, outputs) may be written now.
    pub const fn keeps_content(self) -> bool {
        matches!(self, Self::Full | Self::Ttl { .. })
    }
}

/// When a command needs a human's approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    /// Ask for every command that is not already approved. The strictest.
    #[default]
    Always,
    /// Ask only when a command fails inside the sandbox and would need to leave it.
    OnFailure,
    /// Never ask: run what the sandbox allows, refuse the rest.
    Never,
}

/// What a command may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SandboxPolicy {
    /// Read anywhere, write nowhere. The strictest.
    #[default]
    ReadOnly,
    /// Write inside the conversation's workspace only.
    WorkspaceWrite,
    /// No restriction.
    FullAccess,
}

/// The structured key of an approval (S9): a command path, optionally scoped to one
/// conversation (none = shared by the session) and optionally expiring.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CommandKey {
    /// argv of the command (or the qualified tool name and its arguments).
    pub path: Vec<String>,
    /// `None`: every conversation of the session may reuse the approval.
    pub conversation: Option<ConversationId>,
    /// Unix milliseconds after which the approval no longer holds.
    pub expires_at_ms: Option<u64>,
}

/// What a turn does when its prompt is over `max-prompt-tokens` (T5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OverBudget {
    /// End the turn with an error; nothing is sent.
    #[default]
    Reject,
    /// Leave out the oldest history items (never the instructions, the summary or this
    /// turn's items) until the prompt fits; reject if it still does not.
    Trim,
}

/// What a turn does when a tool call fails (T6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ToolErrorPolicy {
    /// Give the error to the model as the observation and go on.
    #[default]
    Skip,
    /// End the turn with status `error`.
    Terminate,
    /// Run the call again, up to `attempts` more times, then go on as `skip`.
    Retry { attempts: u32 },
}
