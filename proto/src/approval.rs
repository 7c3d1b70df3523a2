//! Approvals (S9): a human's decision, what is asked, and a pending request as listed.

use crate::ids::{ApprovalId, ConversationId, TaskId};
use crate::json::Json;
use serde::{Deserialize, Serialize};

/// A human's answer to a pending approval (S9).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// Run this one command, remember nothing.
    ApproveOnce,
    /// Remember the command for this conversation, optionally for `ttl_secs`.
    ApproveForConversation { ttl_secs: Option<u64> },
    /// Remember the command for every conversation of the session, optionally for `ttl_secs`.
    ApproveForSession { ttl_secs: Option<u64> },
    /// Refuse.
    Deny { reason: Option<String> },
    /// Nobody answered in time; counts as a denial.
    TimedOut,
    /// Accept an MCP elicitation with this content (an object matching its requested schema).
    /// Answers elicitations only; like `ApproveOnce`, it remembers nothing.
    ApproveWithContent { content: Json },
}

impl ApprovalDecision {
    pub const fn approves(&self) -> bool {
        matches!(
            self,
            Self::ApproveOnce
                | Self::ApproveForConversation { .. }
                | Self::ApproveForSession { .. }
                | Self::ApproveWithContent { .. }
        )
    }
}

/// What an approval request asks a human to allow.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalSubject {
    /// Run the command in `command` (the shell built-in, S9).
    #[default]
    Command,
    /// Run the command in `command` again without the sandbox, which stopped it (the
    /// `on-failure` approval policy). Remembered apart from [`Self::Command`]: a decision to
    /// let a command run in the sandbox never lets it run without one.
    CommandWithoutSandbox,
    /// Apply the patch of an `apply_patch` call; `command` names it (`apply_patch`, then one
    /// entry per file: `add a.rs`, `update b.rs`, ...). Remembered apart from commands: an
    /// approved patch never lets a command of the same words run, and the reverse.
    Patch,
    /// An MCP server asks the user for input (`elicitation/create`) during a tool call.
    /// Approving accepts: `ApproveWithContent` gives the content; the other approvals send the
    /// schema's defaults (refused when a required field has none). Denying declines; no answer
    /// in time cancels. Never remembered.
    McpElicitation {
        server: String,
        /// What the server asks, for the human.
        message: String,
        /// The JSON Schema (a flat object of primitive fields) the answer must match.
        schema: Json,
    },
    /// An MCP server asks to use the conversation's model (`sampling/createMessage`) during a
    /// tool call. Approving runs the model on the server's messages; denying returns an error
    /// to the server. Approvals for the conversation or the session are remembered per server.
    McpSampling {
        server: String,
        /// The request's params as the server sent them (messages, system prompt, limits).
        request: Json,
    },
    /// A remote agent asks the human a question during a dispatch (an A2A task that stopped
    /// in `input-required` without a troupe approval request). Answered by
    /// `ApproveWithContent` with `{"answer": "<text>"}`, which goes back to the agent;
    /// denying, or no answer in time, ends the dispatch. Never remembered.
    AgentQuestion {
        agent_id: String,
        /// What the agent asks, as it worded it.
        question: String,
    },
}

impl ApprovalSubject {
    /// Whether it asks to run a command or apply a patch here (nobody answering is a
    /// denial), rather than a server's or an agent's question (nobody answering times out).
    pub const fn is_command(&self) -> bool {
        matches!(
            self,
            Self::Command | Self::CommandWithoutSandbox | Self::Patch
        )
    }

    /// Approving it takes content (an elicitation's fields, a question's answer): no key
    /// answers it and no other request shares it.
    pub const fn takes_content(&self) -> bool {
        matches!(
            self,
            Self::McpElicitation { .. } | Self::AgentQuestion { .. }
        )
    }
}

/// The answer to an [`ApprovalSubject::AgentQuestion`], as `ApproveWithContent` carries it.
pub fn agent_answer(text: impl Into<String>) -> ApprovalDecision {
    ApprovalDecision::ApproveWithContent {
        content: Json(serde_json::json!({ "answer": text.into() })),
    }
}

/// The text of an answer to an [`ApprovalSubject::AgentQuestion`]: `content.answer`.
pub fn answer_text(decision: &ApprovalDecision) -> Option<&str> {
    match decision {
        ApprovalDecision::ApproveWithContent { content } => {
            content.0.get("answer").and_then(serde_json::Value::as_str)
        }
        _ => None,
    }
}

/// `approval.respond`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RespondApproval {
    pub approval_id: ApprovalId,
    pub decision: ApprovalDecision,
}

/// A pending approval, as listed for a human.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingApproval {
    pub approval_id: ApprovalId,
    pub conversation_id: ConversationId,
    pub task_id: Option<TaskId>,
    /// The command; for an MCP request, `["mcp", server, "elicitation" | "sampling"]`.
    pub command: Vec<String>,
    pub reason: String,
    pub requested_at_ms: u64,
    /// When the request times out into a denial.
    pub deadline_ms: u64,
    /// What is asked; a command unless an MCP server is asking.
    #[serde(default)]
    pub subject: ApprovalSubject,
    /// Where the command runs, when its call named a directory (`null`: the workspace root).
    #[serde(default)]
    pub workdir: Option<String>,
}
