//! What the HTTP handlers read from a request: the body (within the limit), a JSON body, a
//! session id from the path, a query string. Each failure is an [`ApiError`] with its status:
//! 413 over the limit, 400 unreadable, 404 for an id that names no session.

use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::Query;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::http::StatusCode;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use troupe_proto::{AgentError, SessionId};

/// The body, or 413 (over the limit) / 400 (unreadable) with the error body.
pub fn body(bytes: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    bytes.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else if crate::listen::timed_out(&e) {
            ApiError::request_timeout()
        } else {
            ApiError::bad_request(e.body_text())
        }
    })
}

/// A JSON object body read as `T` (an empty body reads as `{}`), or 400 / 413. Anything
/// but an object (an array would fill a struct's fields in order) is 400.
pub fn json_body<T: DeserializeOwned>(
    bytes: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = body(bytes, limit)?;
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &bytes
    };
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("bad body: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("bad body: must be a JSON object"));
    }
    serde_json::from_value(value).map_err(|e| ApiError::bad_request(format!("bad body: {e}")))
}

/// Path parameters; a segment that does not decode (bad percent-encoding, not UTF-8) names
/// nothing: 404, like an id that does not parse.
#[derive(Debug)]
pub struct PathIds<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for PathIds<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(t)) => Ok(Self(t)),
            Err(_) => Err(ApiError::from(AgentError::not_found(
                "path",
                parts.uri.path(),
            ))),
        }
    }
}

/// A session id from the path; one that does not parse names no session.
pub fn session_id(raw: &str) -> Result<SessionId, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::from(AgentError::not_found("session", raw)))
}

/// A conversation id from the path; one that does not parse names no conversation.
pub fn conversation_id(raw: &str) -> Result<troupe_proto::ConversationId, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::from(AgentError::not_found("conversation", raw)))
}

/// A query string of type `T`, or 400.
pub fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(t)| t)
        .map_err(|e| ApiError::bad_request(e.body_text()))
}

/// `?after=` of the event streams (SSE and WebSocket).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    pub after: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_objects() {
        let ok: Result<serde_json::Value, _> = json_body(Ok(Bytes::from_static(b" ")), 10);
        assert_eq!(ok.unwrap(), serde_json::json!({}));
        for bad in [&b"[\"p\", \"t\"]"[..], b"\"x\"", b"3", b"null"] {
            let e = json_body::<serde_json::Value>(Ok(Bytes::copy_from_slice(bad)), 100);
            assert_eq!(e.unwrap_err().status, StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn bad_ids_are_unknown_ids() {
        assert_eq!(
            session_id("nope").unwrap_err().status,
            StatusCode::NOT_FOUND
        );
    }
}
