//! Requests and replies of the session API: open, message, close, set-context, and the
//! observation types they return. Approvals are in [`crate::approval`], tasks in
//! [`crate::task`].

use crate::error::AgentError;
use crate::ids::{ConversationId, TaskId};
use crate::item::Usage;
use crate::policy::{ApprovalPolicy, SandboxPolicy, StoragePolicy};
use crate::task::{TaskStats, TaskStatus};
use serde::{Deserialize, Serialize};

/// Parameters of `conversation.open` (C6). Every field is optional on the wire.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct OpenConversation {
    /// Replaces the built-in system prompt for this conversation (C3).
    pub base_instructions: Option<String>,
    /// Enters history once, as the earliest user message (C4).
    pub user_instructions: Option<String>,
    /// Qualified MCP tool names this conversation may see (C5); `None` = all.
    pub mcp_tool_allowlist: Option<Vec<String>>,
    pub include_plan_tool: bool,
    pub include_apply_patch_tool: bool,
    pub tools_web_search_request: bool,
    pub storage_policy: StoragePolicy,
    /// May only narrow the session's policy (C2).
    pub approval_policy: Option<ApprovalPolicy>,
    /// May only narrow the session's policy (C2).
    pub sandbox_policy: Option<SandboxPolicy>,
    /// The model this conversation asks (S1, C1), on the session's provider and endpoint;
    /// `None`: the session's model.
    pub model: Option<String>,
    /// The provider this conversation expects (`openai-responses`, `openai-chat`,
    /// `scripted`): it must be the session's (one endpoint per session); anything else is
    /// refused at open. `None`: the session's.
    pub provider: Option<String>,
}

impl OpenConversation {
    /// These parameters as a store keeps them under their own storage policy: under
    /// `headers_only` and `none` the instruction texts are content the policy forbids on disk,
    /// so both are left out; a conversation reopened from the store (after a restart) runs
    /// without them. `full` and `ttl` keep them.
    #[must_use]
    pub fn kept_by_policy(self) -> Self {
        if self.storage_policy.keeps_content() {
            self
        } else {
            self.without_instructions()
        }
    }

    /// Whether any instruction text is set.
    pub const fn has_instructions(&self) -> bool {
        self.base_instructions.is_some() || self.user_instructions.is_some()
    }

    /// These parameters without their instruction texts (what a Ttl sweep leaves once due).
    #[must_use]
    pub fn without_instructions(mut self) -> Self {
        self.base_instructions = None;
        self.user_instructions = None;
        self
    }
}

/// Reply to `open`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Opened {
    pub conversation_id: ConversationId,
}

/// `conversation.message`: one user message, answered by one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SendMessage {
    pub conversation_id: ConversationId,
    pub text: String,
}

/// Reply to `message`: the final text and the task's statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageReply {
    pub conversation_id: ConversationId,
    pub task_id: TaskId,
    pub status: TaskStatus,
    pub text: String,
    pub stats: TaskStats,
    /// Set when `status` is `error` or `cancelled`.
    pub error: Option<AgentError>,
}

/// How a close went. Closing twice is not an error (S5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CloseOutcome {
    /// Closed now; any running task stopped when asked.
    Closed,
    /// Closed now; a task ignored cancellation and was aborted after the timeout.
    ForceAborted,
    /// Was already closed (or never existed in this session).
    AlreadyClosed,
}

/// Reply to `close`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Closed {
    pub conversation_id: ConversationId,
    pub outcome: CloseOutcome,
}

/// `conversation.setContext`: fields left `None` are unchanged (C6).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SetContext {
    pub base_instructions: Option<String>,
    pub user_instructions: Option<String>,
    pub mcp_tool_allowlist: Option<Vec<String>>,
    pub include_plan_tool: Option<bool>,
    pub include_apply_patch_tool: Option<bool>,
    pub tools_web_search_request: Option<bool>,
    /// Another model for the conversation's next tasks (the running one keeps its own).
    pub model: Option<String>,
}

impl OpenConversation {
    /// Applies a context update (C6: fields the update leaves unset are unchanged).
    pub fn apply(&mut self, update: &SetContext) {
        if let Some(v) = &update.base_instructions {
            self.base_instructions = Some(v.clone());
        }
        if let Some(v) = &update.user_instructions {
            self.user_instructions = Some(v.clone());
        }
        if let Some(v) = &update.mcp_tool_allowlist {
            self.mcp_tool_allowlist = Some(v.clone());
        }
        if let Some(v) = update.include_plan_tool {
            self.include_plan_tool = v;
        }
        if let Some(v) = update.include_apply_patch_tool {
            self.include_apply_patch_tool = v;
        }
        if let Some(v) = update.tools_web_search_request {
            self.tools_web_search_request = v;
        }
        if let Some(v) = &update.model {
            self.model = Some(v.clone());
        }
    }
}

/// Per-conversation statistics (S11).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConversationStats {
    pub conversation_id: Option<ConversationId>,
    pub tasks: u64,
    pub tasks_failed: u64,
    pub tasks_cancelled: u64,
    pub usage: Usage,
    pub tool_calls: u64,
    pub mcp_calls: u64,
    pub mcp_latency_ms_total: u64,
    pub history_items: u64,
}
