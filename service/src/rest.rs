//! REST routes (P2) and the per-session SSE stream (P3, P4). Every error is an HTTP status
//! with the body `{code, message, details}`; ids that do not parse are unknown ids (404).

use crate::api::{CreateSession, CurrentSession, SendText, SetCurrent, page_limit};
use crate::auth::Scope;
use crate::error::ApiError;
use crate::extract::{EventsQuery, PathIds, conversation_id, json_body, query, session_id};
use crate::state::AppState;
use crate::stream::Subscriber;
use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use std::convert::Infallible;
use troupe_proto::AgentError;

/// `POST /api/sessions` → 201 with the session.
pub async fn create_session(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: CreateSession = json_body(bytes, app.body_limit)?;
    let record = app.rpc.sessions.create(scope, request).await?;
    Ok((StatusCode::CREATED, Json(record)).into_response())
}

/// `GET /api/sessions/{id}`.
pub async fn get_session(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds(id): PathIds<String>,
) -> Result<Response, ApiError> {
    let record = app.rpc.sessions.get(scope, session_id(&id)?).await?;
    Ok(Json(record).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesQuery {
    limit: Option<usize>,
    before: Option<u64>,
}

/// `GET /api/sessions/{id}/messages?limit=&before=`: the newest `limit` messages older than
/// `before`, oldest first, with the cursor of the next (older) page.
pub async fn list_messages(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds(id): PathIds<String>,
    q: Result<Query<MessagesQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = session_id(&id)?;
    let q = query(q)?;
    let limit = page_limit(q.limit, app.rpc.max_page)?;
    // Held until the page is serialised (`Json` serialises at once).
    let _permit = app.rpc.page_permit().await;
    let page = app
        .rpc
        .sessions
        .messages(scope, id, limit, q.before)
        .await?;
    Ok(Json(page).into_response())
}

/// `GET /api/sessions/{id}/messages/{message_id}`: one message, with its status (and the id
/// of its reply once it has one).
pub async fn get_message(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds((id, message_id)): PathIds<(String, String)>,
) -> Result<Response, ApiError> {
    let id = session_id(&id)?;
    let message_id: u64 = message_id
        .parse()
        .map_err(|_| ApiError::from(AgentError::not_found("message", &message_id)))?;
    let message = app.rpc.sessions.message(scope, id, message_id).await?;
    Ok(Json(message).into_response())
}

/// `POST /api/sessions/{id}/messages` `{text, conversation_id?, wait?}`: 200 with the reply
/// when waiting (the default), else 202 once the message is stored.
pub async fn post_message(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds(id): PathIds<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let id = session_id(&id)?;
    let send: SendText = json_body(bytes, app.body_limit)?;
    let wait = send.wait;
    let sent = app
        .rpc
        .sessions
        .send(
            scope,
            id,
            send.conversation_id,
            send.text.clone(),
            wait,
            send.options(),
        )
        .await?;
    let status = if wait {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(sent)).into_response())
}

/// `POST /api/sessions/{id}/conversations/{cid}/cancel`: cancels the conversation's running
/// task and its queued messages; 200 with `{"cancelled": n}`.
pub async fn cancel_conversation(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds((id, cid)): PathIds<(String, String)>,
) -> Result<Response, ApiError> {
    let id = session_id(&id)?;
    let conversation_id = conversation_id(&cid)?;
    let cancelled = app
        .rpc
        .sessions
        .cancel_all(scope, id, conversation_id)
        .await?;
    Ok(Json(serde_json::json!({ "cancelled": cancelled })).into_response())
}

/// `POST /api/sessions/{id}/conversations/{cid}/compact`: the history replaced by a summary
/// the model writes, as `conversation.compact`; 200 with the compaction's reply.
pub async fn compact_conversation(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds((id, cid)): PathIds<(String, String)>,
) -> Result<Response, ApiError> {
    let id = session_id(&id)?;
    let conversation_id = conversation_id(&cid)?;
    let reply = app.rpc.sessions.compact(scope, id, conversation_id).await?;
    Ok(Json(reply).into_response())
}

/// `PUT /api/sessions/{id}/conversations/{cid}/context` with the fields to change (C6, as
/// `conversation.setContext`: an absent field is unchanged, `null` puts its default back,
/// `refresh_mcp: true` reads the MCP tools again); 200 with `{}`.
pub async fn set_context(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds((id, cid)): PathIds<(String, String)>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let id = session_id(&id)?;
    let conversation_id = conversation_id(&cid)?;
    let update: troupe_proto::SetContext = json_body(bytes, app.body_limit)?;
    app.rpc
        .sessions
        .set_context(scope, id, conversation_id, update)
        .await?;
    Ok(Json(serde_json::json!({})).into_response())
}

/// `GET /api/agents`: the agents, with what each provider can tell without a session and
/// the bindings of every session the token sees (`{agents, errors}`, as `agents.list`).
pub async fn list_agents(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
) -> Result<Response, ApiError> {
    let listing = app.rpc.sessions.agents(scope, None).await?;
    Ok(Json(listing).into_response())
}

/// `GET /api/modules`: the modules with their health, and the files of the modules
/// directory that did not load (`{modules, errors}`, as `modules.list`).
pub async fn list_modules(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
) -> Result<Response, ApiError> {
    Ok(Json(app.rpc.sessions.list_modules(&scope).await).into_response())
}

/// `POST /api/tokens`: issues an authorization token (A5); `201` with `{token, info}`, the
/// secret shown this once.
pub async fn issue_token(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: troupe_proto::governance::IssueToken = json_body(bytes, app.body_limit)?;
    let issued = app.rpc.sessions.issue_token(&scope, request).await?;
    Ok((StatusCode::CREATED, Json(issued)).into_response())
}

/// `GET /api/tokens`: every authorization token, newest first, without secrets.
pub async fn list_tokens(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
) -> Result<Response, ApiError> {
    Ok(Json(app.rpc.sessions.tokens(&scope).await?).into_response())
}

/// `DELETE /api/tokens/{id}`: revokes a token; answers it.
pub async fn revoke_token(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds(id): PathIds<String>,
) -> Result<Response, ApiError> {
    Ok(Json(app.rpc.sessions.revoke_token(&scope, id).await?).into_response())
}

/// `GET /api/sessions/{id}/agents`: the agents as the session runs them, with its bindings.
pub async fn session_agents(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds(id): PathIds<String>,
) -> Result<Response, ApiError> {
    let listing = app
        .rpc
        .sessions
        .agents(scope, Some(session_id(&id)?))
        .await?;
    Ok(Json(listing).into_response())
}

/// `GET /api/sessions/{id}/events/head`: the seq of the session's newest event (`0` before
/// any), where a reader starts its stream (`?after=`) to get only what comes next. In a
/// cluster it is answered by the node that runs the session (forwarded like every call of
/// it), so that a console page served by another node starts its stream at the right place.
pub async fn events_head(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds(id): PathIds<String>,
) -> Result<Response, ApiError> {
    let id = session_id(&id)?;
    let last_seq = app
        .rpc
        .sessions
        .session(scope, id)
        .await?
        .last_seq()
        .await?;
    Ok(Json(serde_json::json!({"session_id": id, "last_seq": last_seq})).into_response())
}

/// `GET /api/projects/{pid}/sessions`: newest first.
pub async fn project_sessions(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds(pid): PathIds<String>,
) -> Result<Response, ApiError> {
    let sessions = app.rpc.sessions.list(scope, Some(pid)).await?;
    Ok(Json(sessions).into_response())
}

/// `GET /api/projects/{pid}/current-session`: 404 when none is set.
pub async fn current_session(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds(pid): PathIds<String>,
) -> Result<Response, ApiError> {
    let session = app.rpc.sessions.current(scope, pid.clone()).await?;
    Ok(Json(CurrentSession {
        project_id: pid,
        session,
    })
    .into_response())
}

/// `PUT /api/projects/{pid}/current-session` `{session_id}`.
pub async fn set_current_session(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds(pid): PathIds<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let SetCurrent { session_id } = json_body(bytes, app.body_limit)?;
    let session = app
        .rpc
        .sessions
        .set_current(scope, pid.clone(), session_id)
        .await?;
    Ok(Json(CurrentSession {
        project_id: pid,
        session,
    })
    .into_response())
}

/// Where a stream resumes: `Last-Event-ID` (a reconnecting EventSource), else `?after=`,
/// else from the start.
pub fn resume_from(headers: &HeaderMap, after: Option<u64>) -> Result<u64, ApiError> {
    match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| ApiError::bad_request("Last-Event-ID must be an event seq")),
        None => Ok(after.unwrap_or(0)),
    }
}

/// `GET /api/sessions/{id}/events`: Server-Sent Events, `id:` = seq, `event:` = type.
/// A stream that cannot go on (it fell behind) sends `event: stream_error` and ends; the
/// client reconnects with its `Last-Event-ID`.
pub async fn events_sse(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds(id): PathIds<String>,
    headers: HeaderMap,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = session_id(&id)?;
    let after = resume_from(&headers, query(q)?.after)?;
    let events = app.session_events(scope, id, after).await?;
    let gauge = Subscriber::new("sse");
    let sse = events.map(move |item| {
        let _alive = &gauge;
        Ok::<Event, Infallible>(match item {
            Ok(e) => Event::default()
                .id(e.seq.to_string())
                .event(e.event_type.clone())
                .json_data(&e)
                .unwrap_or_else(|_| Event::default().comment("unencodable event")),
            Err(e) => Event::default()
                .event("stream_error")
                .json_data(ApiError::from(e).body)
                .unwrap_or_else(|_| Event::default().comment("stream error")),
        })
    });
    Ok(Sse::new(sse)
        .keep_alive(KeepAlive::default())
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_point() {
        let mut h = HeaderMap::new();
        assert_eq!(resume_from(&h, None).unwrap(), 0);
        assert_eq!(resume_from(&h, Some(4)).unwrap(), 4);
        h.insert("last-event-id", "9".parse().unwrap());
        assert_eq!(resume_from(&h, Some(4)).unwrap(), 9, "the header wins");
        h.insert("last-event-id", "x".parse().unwrap());
        assert_eq!(
            resume_from(&h, None).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
    }
}
