//! What a call to a remote A2A agent can end with, other than its answer.

use crate::version::Operation;
use crate::wire::WireError;
use serde_json::Value;
use troupe_proto::AgentError;

/// A2A's `TaskNotFoundError` (spec 5.4).
pub const TASK_NOT_FOUND: i64 = -32001;
/// A2A's `TaskNotCancelableError`.
pub const TASK_NOT_CANCELABLE: i64 = -32002;
/// A2A's `UnsupportedOperationError`.
pub const UNSUPPORTED_OPERATION: i64 = -32004;

/// Why a call to a remote agent failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    /// No HTTP answer: the connection failed, broke or timed out.
    #[error("cannot reach the A2A agent at {url}: {message}")]
    Transport { url: String, message: String },
    /// An HTTP status that is not a JSON-RPC answer (401, 404, 502, ...).
    #[error("the A2A agent at {url} answered HTTP {status}: {body}")]
    Http {
        url: String,
        status: u16,
        /// The start of the body, for the reader.
        body: String,
    },
    /// A JSON-RPC error from the agent.
    #[error("the A2A agent refused {operation}: {message} (code {code})")]
    Rpc {
        operation: &'static str,
        code: i64,
        message: String,
        data: Option<Value>,
    },
    /// An answer that is not what A2A says it should be.
    #[error("the A2A agent's answer to {operation} is not valid A2A: {message}")]
    Invalid {
        operation: &'static str,
        message: String,
    },
    /// No card, or a card without an interface troupe speaks.
    #[error("{0}")]
    Card(String),
    /// The operation does not exist in the protocol version spoken with this agent.
    #[error("{operation} does not exist in A2A {version}")]
    Unsupported {
        operation: &'static str,
        version: &'static str,
    },
}

impl ClientError {
    /// The bounded metric label of this error.
    pub const fn outcome(&self) -> &'static str {
        match self {
            Self::Transport { .. } => "transport_error",
            Self::Http { .. } => "http_error",
            Self::Rpc { .. } => "rpc_error",
            Self::Invalid { .. } => "invalid_answer",
            Self::Card(_) => "card_error",
            Self::Unsupported { .. } => "unsupported",
        }
    }

    /// The JSON-RPC error code, when the agent answered one.
    pub const fn rpc_code(&self) -> Option<i64> {
        match self {
            Self::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub(crate) fn invalid(op: Operation, e: &WireError) -> Self {
        Self::Invalid {
            operation: op.label(),
            message: e.0.clone(),
        }
    }
}

/// Every outcome label of [`ClientError::outcome`], and `ok`.
pub const OUTCOMES: [&str; 7] = [
    "ok",
    "transport_error",
    "http_error",
    "rpc_error",
    "invalid_answer",
    "card_error",
    "unsupported",
];

impl From<ClientError> for AgentError {
    fn from(e: ClientError) -> Self {
        AgentError::ToolError {
            name: "a2a_agent".into(),
            message: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_a_listed_outcome_and_reads_as_a_sentence() {
        let errors = [
            ClientError::Transport {
                url: "http://127.0.0.1:1/a2a".into(),
                message: "connection refused".into(),
            },
            ClientError::Http {
                url: "http://x/a2a".into(),
                status: 401,
                body: "unauthorized".into(),
            },
            ClientError::Rpc {
                operation: "get_task",
                code: TASK_NOT_FOUND,
                message: "Task not found".into(),
                data: None,
            },
            ClientError::Invalid {
                operation: "send_message",
                message: "task.id is required".into(),
            },
            ClientError::Card("no card".into()),
            ClientError::Unsupported {
                operation: "list_tasks",
                version: "0.3",
            },
        ];
        for e in &errors {
            assert!(OUTCOMES.contains(&e.outcome()), "{e:?}");
        }
        assert_eq!(
            errors[2].to_string(),
            "the A2A agent refused get_task: Task not found (code -32001)"
        );
        assert_eq!(errors[2].rpc_code(), Some(TASK_NOT_FOUND));
        assert!(matches!(
            AgentError::from(errors[1].clone()),
            AgentError::ToolError { ref message, .. } if message.contains("HTTP 401")
        ));
    }
}
