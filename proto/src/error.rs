//! `AgentError`: the error kinds of S2 with structured detail, shared by every layer and sent
//! over the wire as-is. `ErrorKind` is the bounded, label-safe name of each kind.

use serde::{Deserialize, Serialize};

/// Everything that can end a request, a task or a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentError {
    /// The work was cancelled (by a caller, by `close`, by shutdown).
    #[error("cancelled: {reason}")]
    Cancelled { reason: String },
    /// Something did not finish in time.
    #[error("timed out after {after_ms} ms: {what}")]
    Timeout { what: String, after_ms: u64 },
    /// A human (or the approval timeout) refused a command.
    #[error("approval denied for `{}`: {reason}", command.join(" "))]
    ApprovalDenied {
        command: Vec<String>,
        reason: String,
    },
    /// The sandbox refused or could not enforce a policy.
    #[error("sandbox error: {message}")]
    SandboxError { message: String },
    /// An MCP server failed, died or answered with a protocol error.
    #[error("mcp error from `{server}`: {message}")]
    McpError { server: String, message: String },
    /// Two tools share a name but not a signature.
    #[error("tool conflict on `{name}`: {detail}")]
    ToolConflict { name: String, detail: String },
    /// A write would have stored what the conversation's storage policy forbids.
    #[error("storage policy violation: {message}")]
    StoragePolicyViolation { message: String },
    /// A bounded queue is full; retry later.
    #[error("overloaded: {resource} is full (limit {limit})")]
    Overloaded { resource: String, limit: u32 },
    /// An id that names nothing (or nothing any more).
    #[error("{what} not found: {id}")]
    NotFound { what: String, id: String },
    /// The request itself is malformed or names something illegal.
    #[error("invalid input: {message}")]
    InvalidInput { message: String },
    /// The model provider failed (transport, status, malformed stream, budget).
    #[error("model error: {message}")]
    ModelError { message: String, retryable: bool },
    /// A tool ran and failed.
    #[error("tool `{name}` failed: {message}")]
    ToolError { name: String, message: String },
    /// A bug or an invariant broken inside troupe.
    #[error("internal error: {message}")]
    Internal { message: String },
    /// The work was interrupted by a failure or a crash (its conversation or session stopped
    /// under it) and is not run again.
    #[error("interrupted: {reason}")]
    Interrupted { reason: String },
    /// A dispatch to an agent was refused before it ran (A4): a cycle, a chain too deep, an
    /// agent unknown or out of sight, no provider for it. `chain` is the execution chain it
    /// would have extended, outermost first.
    #[error("policy rejected ({}): {message} [chain: {}]", reason.as_str(), chain.join(" → "))]
    PolicyRejected {
        reason: crate::agent::PolicyReason,
        chain: Vec<String>,
        message: String,
    },
    /// An agent's answer did not match the JSON Schema of its `output` after it was asked
    /// again as often as allowed (A8): `problems` say where (paths and keywords, never the
    /// answer's values).
    #[error("guardrail failed: the answer did not match its schema after {attempts} attempts ({})", problems.join("; "))]
    GuardrailFailed {
        attempts: u32,
        problems: Vec<String>,
    },
}

/// The kind of an [`AgentError`], without detail: safe as a metric label and a wire code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    Cancelled,
    Timeout,
    ApprovalDenied,
    SandboxError,
    McpError,
    ToolConflict,
    StoragePolicyViolation,
    Overloaded,
    NotFound,
    InvalidInput,
    ModelError,
    ToolError,
    Internal,
    Interrupted,
    PolicyRejected,
    GuardrailFailed,
}

impl ErrorKind {
    /// Every kind, in declaration order (the known values of a metric label).
    pub const ALL: [Self; 16] = [
        Self::Cancelled,
        Self::Timeout,
        Self::ApprovalDenied,
        Self::SandboxError,
        Self::McpError,
        Self::ToolConflict,
        Self::StoragePolicyViolation,
        Self::Overloaded,
        Self::NotFound,
        Self::InvalidInput,
        Self::ModelError,
        Self::ToolError,
        Self::Internal,
        Self::Interrupted,
        Self::PolicyRejected,
        Self::GuardrailFailed,
    ];

    /// The snake_case name, as serialised.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Cancelled => "cancelled",
            Self::Timeout => "timeout",
            Self::ApprovalDenied => "approval_denied",
            Self::SandboxError => "sandbox_error",
            Self::McpError => "mcp_error",
            Self::ToolConflict => "tool_conflict",
            Self::StoragePolicyViolation => "storage_policy_violation",
            Self::Overloaded => "overloaded",
            Self::NotFound => "not_found",
            Self::InvalidInput => "invalid_input",
            Self::ModelError => "model_error",
            Self::ToolError => "tool_error",
            Self::Internal => "internal",
            Self::Interrupted => "interrupted",
            Self::PolicyRejected => "policy_rejected",
            Self::GuardrailFailed => "guardrail_failed",
        }
    }
}

impl AgentError {
    /// The kind, for labels and codes.
    pub const fn kind(&self) -> ErrorKind {
        match self {
            Self::Cancelled { .. } => ErrorKind::Cancelled,
            Self::Timeout { .. } => ErrorKind::Timeout,
            Self::ApprovalDenied { .. } => ErrorKind::ApprovalDenied,
            Self::SandboxError { .. } => ErrorKind::SandboxError,
            Self::McpError { .. } => ErrorKind::McpError,
            Self::ToolConflict { .. } => ErrorKind::ToolConflict,
            Self::StoragePolicyViolation { .. } => ErrorKind::StoragePolicyViolation,
            Self::Overloaded { .. } => ErrorKind::Overloaded,
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::InvalidInput { .. } => ErrorKind::InvalidInput,
            Self::ModelError { .. } => ErrorKind::ModelError,
            Self::ToolError { .. } => ErrorKind::ToolError,
            Self::Internal { .. } => ErrorKind::Internal,
            Self::Interrupted { .. } => ErrorKind::Interrupted,
            Self::PolicyRejected { .. } => ErrorKind::PolicyRejected,
            Self::GuardrailFailed { .. } => ErrorKind::GuardrailFailed,
        }
    }

    pub fn cancelled(reason: impl Into<String>) -> Self {
        Self::Cancelled {
            reason: reason.into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::Internal {
            message: message.into(),
        }
    }

    pub fn interrupted(reason: impl Into<String>) -> Self {
        Self::Interrupted {
            reason: reason.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidInput {
            message: message.into(),
        }
    }

    pub fn not_found(what: impl Into<String>, id: impl ToString) -> Self {
        Self::NotFound {
            what: what.into(),
            id: id.to_string(),
        }
    }

    pub fn timeout(what: impl Into<String>, after: std::time::Duration) -> Self {
        Self::Timeout {
            what: what.into(),
            after_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
        }
    }
}
