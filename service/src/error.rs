//! How an [`AgentError`] leaves the service: an HTTP status with the body
//! `{code, message, details}` (REST), or a JSON-RPC error `{code, message, data}`.
//!
//! Both mappings are total over [`ErrorKind`] (a new kind does not build until it has a code
//! here), and both are documented in the README.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use troupe_proto::{AgentError, ErrorKind};

/// JSON-RPC 2.0 standard codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;

/// Application codes (the JSON-RPC server-error range -32000..-32099).
pub const NOT_FOUND: i64 = -32001;
pub const OVERLOADED: i64 = -32002;
pub const APPROVAL_DENIED: i64 = -32003;
pub const CANCELLED: i64 = -32004;
pub const TIMEOUT: i64 = -32005;
pub const CONFLICT: i64 = -32006;
pub const STORAGE_POLICY_VIOLATION: i64 = -32007;
pub const SANDBOX_ERROR: i64 = -32008;
pub const MCP_ERROR: i64 = -32009;
pub const MODEL_ERROR: i64 = -32010;
pub const TOOL_ERROR: i64 = -32011;
pub const INTERRUPTED: i64 = -32012;
/// The answers to one request would pass the service's answer budget.
pub const ANSWER_TOO_LARGE: i64 = -32013;
pub const POLICY_REJECTED: i64 = -32014;
pub const GUARDRAIL_FAILED: i64 = -32015;

/// The JSON-RPC code of an error kind.
pub const fn rpc_code(kind: ErrorKind) -> i64 {
    match kind {
        ErrorKind::NotFound => NOT_FOUND,
        ErrorKind::Overloaded => OVERLOADED,
        ErrorKind::ApprovalDenied => APPROVAL_DENIED,
        ErrorKind::Cancelled => CANCELLED,
        ErrorKind::Timeout => TIMEOUT,
        ErrorKind::ToolConflict => CONFLICT,
        ErrorKind::StoragePolicyViolation => STORAGE_POLICY_VIOLATION,
        ErrorKind::SandboxError => SANDBOX_ERROR,
        ErrorKind::McpError => MCP_ERROR,
        ErrorKind::ModelError => MODEL_ERROR,
        ErrorKind::ToolError => TOOL_ERROR,
        ErrorKind::InvalidInput => INVALID_PARAMS,
        ErrorKind::Internal => INTERNAL_ERROR,
        ErrorKind::Interrupted => INTERRUPTED,
        ErrorKind::PolicyRejected => POLICY_REJECTED,
        ErrorKind::GuardrailFailed => GUARDRAIL_FAILED,
    }
}

/// The HTTP status of an error kind.
pub const fn http_status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
        ErrorKind::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
        ErrorKind::Cancelled | ErrorKind::ToolConflict => StatusCode::CONFLICT,
        ErrorKind::ApprovalDenied | ErrorKind::PolicyRejected => StatusCode::FORBIDDEN,
        ErrorKind::StoragePolicyViolation | ErrorKind::GuardrailFailed => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        ErrorKind::McpError | ErrorKind::ModelError => StatusCode::BAD_GATEWAY,
        ErrorKind::SandboxError
        | ErrorKind::ToolError
        | ErrorKind::Internal
        | ErrorKind::Interrupted => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The body of every HTTP error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// `not_found`, `invalid_input`, ... (an [`ErrorKind`] name), or one of the HTTP-only
    /// codes `unauthorized`, `payload_too_large`, `bad_request`, `method_not_allowed`.
    pub code: String,
    pub message: String,
    /// The [`AgentError`] itself when there is one, else `null`.
    pub details: serde_json::Value,
}

/// An error answered over HTTP.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody {
                code: code.to_owned(),
                message: message.into(),
                details: serde_json::Value::Null,
            },
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required",
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is larger than {limit} bytes"),
        )
    }

    pub fn request_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            "the request body did not arrive in time (server.body_timeout)",
        )
    }

    pub fn route_not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "no such route")
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "this route does not take that method",
        )
    }
}

impl From<AgentError> for ApiError {
    fn from(e: AgentError) -> Self {
        let kind = e.kind();
        Self {
            status: http_status(kind),
            body: ErrorBody {
                code: kind.as_str().to_owned(),
                message: e.to_string(),
                details: serde_json::to_value(&e).unwrap_or(serde_json::Value::Null),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// Middleware: an error answered without the JSON body (a rejection of axum's own
/// extractors: a WebSocket route without `Upgrade`, an unreadable body, ...) gets it, keeping
/// its status and its text as the message (the console's HTML pages are left as they are). Every error of the service is `{code, message,
/// details}`.
pub async fn json_errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json") || t.starts_with("text/html"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    let mut answer = ApiError::new(status, status_code_name(status), message).into_response();
    for name in [header::ALLOW, header::RETRY_AFTER, header::WWW_AUTHENTICATE] {
        if let Some(v) = parts.headers.get(&name) {
            answer.headers_mut().insert(name, v.clone());
        }
    }
    answer
}

/// The `code` of an error that only has a status.
pub fn status_code_name(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::REQUEST_TIMEOUT => "request_timeout",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UPGRADE_REQUIRED => "upgrade_required",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded",
        s if s.is_server_error() => "internal",
        _ => "bad_request",
    }
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn parse(message: impl Into<String>) -> Self {
        Self::new(PARSE_ERROR, message)
    }

    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(INVALID_REQUEST, message)
    }

    pub fn method_not_found(method: &str) -> Self {
        Self::new(METHOD_NOT_FOUND, format!("no method `{method}`"))
    }

    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }
}

impl From<AgentError> for RpcError {
    fn from(e: AgentError) -> Self {
        Self {
            code: rpc_code(e.kind()),
            message: e.to_string(),
            data: serde_json::to_value(&e).ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [ErrorKind; 16] = [
        ErrorKind::Cancelled,
        ErrorKind::Timeout,
        ErrorKind::ApprovalDenied,
        ErrorKind::SandboxError,
        ErrorKind::McpError,
        ErrorKind::ToolConflict,
        ErrorKind::StoragePolicyViolation,
        ErrorKind::Overloaded,
        ErrorKind::NotFound,
        ErrorKind::InvalidInput,
        ErrorKind::ModelError,
        ErrorKind::ToolError,
        ErrorKind::Internal,
        ErrorKind::Interrupted,
        ErrorKind::PolicyRejected,
        ErrorKind::GuardrailFailed,
    ];

    #[test]
    fn application_codes_are_distinct_and_in_the_server_range() {
        let mut codes: Vec<i64> = KINDS
            .iter()
            .map(|k| rpc_code(*k))
            .filter(|c| *c != INVALID_PARAMS && *c != INTERNAL_ERROR)
            .collect();
        assert!(codes.iter().all(|c| (-32099..=-32000).contains(c)));
        let n = codes.len();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), n);
        assert_eq!(n, 14);
    }

    #[test]
    fn agent_errors_carry_themselves() {
        let e = AgentError::not_found("session", "x");
        let api = ApiError::from(e.clone());
        assert_eq!(api.status, StatusCode::NOT_FOUND);
        assert_eq!(api.body.code, "not_found");
        assert_eq!(api.body.details["not_found"]["id"], "x");
        let rpc = RpcError::from(e);
        assert_eq!(rpc.code, NOT_FOUND);
        assert_eq!(
            rpc.data.unwrap()["not_found"]["what"],
            serde_json::json!("session")
        );
        assert!(KINDS.iter().all(|k| http_status(*k).as_u16() >= 400));
    }
}
