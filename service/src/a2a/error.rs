//! A2A errors and their JSON-RPC codes (spec 5.4 and 9.5). Each error also carries a
//! `google.rpc.ErrorInfo` detail, which the 1.0 clients read back into typed errors.

use serde_json::{Value, json};
use troupe_proto::AgentError;

/// Everything an A2A request can fail with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum A2aError {
    #[error("Invalid JSON payload: {0}")]
    Parse(String),
    #[error("Request payload validation error: {0}")]
    InvalidRequest(String),
    #[error("Method not found: {0}")]
    MethodNotFound(String),
    #[error("Invalid parameters: {0}")]
    InvalidParams(String),
    #[error("Internal error: {0}")]
    Internal(String),
    #[error("Task not found: {task_id}")]
    TaskNotFound { task_id: String },
    #[error("Task cannot be canceled: {task_id} is {state}")]
    TaskNotCancelable {
        task_id: String,
        state: &'static str,
    },
    #[error("Push notifications are not supported")]
    PushNotificationNotSupported,
    #[error("Unsupported operation: {0}")]
    UnsupportedOperation(String),
    #[error("Content type not supported: {0}")]
    ContentTypeNotSupported(String),
    #[error("A2A version {requested:?} is not supported; supported: 1.0, 0.3")]
    VersionNotSupported { requested: String },
}

/// Where the A2A-specific error reasons are defined.
const DOMAIN: &str = "a2a-protocol.org";

impl A2aError {
    /// The JSON-RPC error code.
    pub const fn code(&self) -> i64 {
        match self {
            Self::Parse(_) => -32700,
            Self::InvalidRequest(_) => -32600,
            Self::MethodNotFound(_) => -32601,
            Self::InvalidParams(_) => -32602,
            Self::Internal(_) => -32603,
            Self::TaskNotFound { .. } => -32001,
            Self::TaskNotCancelable { .. } => -32002,
            Self::PushNotificationNotSupported => -32003,
            Self::UnsupportedOperation(_) => -32004,
            Self::ContentTypeNotSupported(_) => -32005,
            Self::VersionNotSupported { .. } => -32009,
        }
    }

    /// The `ErrorInfo.reason` (also the metric outcome, lower-cased).
    pub const fn reason(&self) -> &'static str {
        match self {
            Self::Parse(_) => "JSON_PARSE_ERROR",
            Self::InvalidRequest(_) => "INVALID_REQUEST",
            Self::MethodNotFound(_) => "METHOD_NOT_FOUND",
            Self::InvalidParams(_) => "INVALID_PARAMS",
            Self::Internal(_) => "INTERNAL_ERROR",
            Self::TaskNotFound { .. } => "TASK_NOT_FOUND",
            Self::TaskNotCancelable { .. } => "TASK_NOT_CANCELABLE",
            Self::PushNotificationNotSupported => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            Self::UnsupportedOperation(_) => "UNSUPPORTED_OPERATION",
            Self::ContentTypeNotSupported(_) => "CONTENT_TYPE_NOT_SUPPORTED",
            Self::VersionNotSupported { .. } => "VERSION_NOT_SUPPORTED",
        }
    }

    /// Bounded label for metrics.
    pub const fn outcome(&self) -> &'static str {
        match self {
            Self::Parse(_) => "parse_error",
            Self::InvalidRequest(_) => "invalid_request",
            Self::MethodNotFound(_) => "method_not_found",
            Self::InvalidParams(_) => "invalid_params",
            Self::Internal(_) => "internal_error",
            Self::TaskNotFound { .. } => "task_not_found",
            Self::TaskNotCancelable { .. } => "task_not_cancelable",
            Self::PushNotificationNotSupported => "push_notification_not_supported",
            Self::UnsupportedOperation(_) => "unsupported_operation",
            Self::ContentTypeNotSupported(_) => "content_type_not_supported",
            Self::VersionNotSupported { .. } => "version_not_supported",
        }
    }

    fn metadata(&self) -> Value {
        match self {
            Self::TaskNotFound { task_id } => json!({ "taskId": task_id }),
            Self::TaskNotCancelable { task_id, state } => {
                json!({ "taskId": task_id, "state": state })
            }
            Self::VersionNotSupported { requested } => {
                json!({ "requestedVersion": requested, "supportedVersions": "1.0,0.3" })
            }
            _ => json!({}),
        }
    }

    /// The JSON-RPC `error` object.
    pub fn to_error_object(&self) -> Value {
        json!({
            "code": self.code(),
            "message": self.to_string(),
            "data": [{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": self.reason(),
                "domain": DOMAIN,
                "metadata": self.metadata(),
            }],
        })
    }

    /// A whole JSON-RPC error response.
    pub fn to_response(&self, id: &Value) -> Value {
        json!({ "jsonrpc": "2.0", "id": id, "error": self.to_error_object() })
    }

    /// A troupe error met while serving a request.
    pub fn from_agent(e: &AgentError) -> Self {
        match e {
            AgentError::InvalidInput { message } => Self::InvalidParams(message.clone()),
            other => Self::Internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_specification() {
        let cases = [
            (
                A2aError::TaskNotFound {
                    task_id: "t".into(),
                },
                -32001,
            ),
            (
                A2aError::TaskNotCancelable {
                    task_id: "t".into(),
                    state: "TASK_STATE_COMPLETED",
                },
                -32002,
            ),
            (A2aError::PushNotificationNotSupported, -32003),
            (A2aError::UnsupportedOperation("x".into()), -32004),
            (
                A2aError::ContentTypeNotSupported("image/png".into()),
                -32005,
            ),
            (
                A2aError::VersionNotSupported {
                    requested: "0.5".into(),
                },
                -32009,
            ),
            (A2aError::Parse("x".into()), -32700),
            (A2aError::InvalidRequest("x".into()), -32600),
            (A2aError::MethodNotFound("x".into()), -32601),
            (A2aError::InvalidParams("x".into()), -32602),
            (A2aError::Internal("x".into()), -32603),
        ];
        for (e, code) in cases {
            assert_eq!(e.code(), code, "{e:?}");
            let obj = e.to_error_object();
            assert_eq!(obj["code"], code);
            assert_eq!(obj["data"][0]["reason"], e.reason());
        }
    }

    #[test]
    fn an_error_response_echoes_the_id() {
        let r = A2aError::TaskNotFound {
            task_id: "abc".into(),
        }
        .to_response(&json!(7));
        assert_eq!(r["id"], 7);
        assert_eq!(r["jsonrpc"], "2.0");
        assert_eq!(r["error"]["data"][0]["metadata"]["taskId"], "abc");
    }
}
