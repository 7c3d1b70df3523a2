//! The HTTP side: the agent card route and the JSON-RPC route (plain JSON answers, SSE for
//! the streaming methods). Decoding is pure (`parse_call`); the work goes to the `A2aTasks`
//! actor.

use super::book::stored::task_of;
use super::book::{list_query, stored_page, trim};
use super::card::{CardInfo, agent_card, agent_card_v03, extended_card};
use super::error::A2aError;
use super::events::frame;
use super::metrics::{self, StreamGuard};
use super::model::{SendResult, StreamEvent, Task};
use super::push;
use super::request::{self, Request, SendParams};
use super::tasks::{A2aTasksMsg, Known, PushAnswer, Until};
use super::version::{self, Operation, Version};
use super::wire;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use ractor::ActorRef;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tracing::Instrument;
use troupe_store::Store;

/// The header that names the protocol version (spec 3.2.6).
pub const VERSION_HEADER: &str = "a2a-version";

/// What the routes share.
#[derive(Clone)]
pub struct A2aState {
    /// The current tasks actor, as its supervisor publishes it (a restart replaces it).
    pub(super) tasks: tokio::sync::watch::Receiver<Option<ActorRef<A2aTasksMsg>>>,
    /// The endpoint's records: what the actor no longer holds (finished tasks, idle
    /// contexts) is read here.
    pub(super) store: Arc<dyn Store>,
    pub(super) card: Arc<CardInfo>,
    /// Absolute URL of the JSON-RPC endpoint; derived from each request's Host when `None`.
    pub(super) public_url: Option<Arc<str>>,
    pub(super) rpc_path: Arc<str>,
    /// Longest a blocking send waits before answering with the task as it is.
    pub(super) blocking_wait: Duration,
    /// Longest a cancel waits for the task to stop.
    pub(super) cancel_wait: Duration,
    /// When this card was last changed (`Last-Modified`): its content is fixed from the
    /// endpoint's start, so the start time, in whole seconds as HTTP dates carry it.
    pub(super) card_modified: SystemTime,
}

/// `t` without its fraction of a second (an HTTP date's resolution), so that a client's
/// `If-Modified-Since` echoing our `Last-Modified` compares equal.
pub(super) fn whole_seconds(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// `GET /.well-known/agent-card.json`: the 1.0 card, or the 0.3 one for a request that says
/// `A2A-Version: 0.3`.
pub async fn card(State(s): State<A2aState>, req_headers: HeaderMap) -> Response {
    let v03 = headers_value(
        &req_headers,
        axum::http::HeaderName::from_static(VERSION_HEADER),
    )
    .is_some_and(|v| v.trim().starts_with("0.3"));
    serve_card(&s, &req_headers, v03)
}

/// `GET /.well-known/agent.json`: the 0.3 card, where 0.3-era clients look for it.
pub async fn legacy_card(State(s): State<A2aState>, req_headers: HeaderMap) -> Response {
    serve_card(&s, &req_headers, true)
}

/// The JSON-RPC URL a card names: the configured public one, else from the request's Host.
fn card_url(s: &A2aState, req_headers: &HeaderMap) -> String {
    match &s.public_url {
        Some(u) => u.to_string(),
        None => {
            let host = req_headers
                .get(axum::http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("127.0.0.1");
            let scheme = req_headers
                .get("x-forwarded-proto")
                .and_then(|h| h.to_str().ok())
                .filter(|p| *p == "https")
                .unwrap_or("http");
            format!("{scheme}://{host}{}", s.rpc_path)
        }
    }
}

fn serve_card(s: &A2aState, req_headers: &HeaderMap, v03: bool) -> Response {
    let url = card_url(s, req_headers);
    let card = if v03 {
        agent_card_v03(&s.card, &url)
    } else {
        agent_card(&s.card, &url)
    };
    let etag = etag(&card);
    let headers = [
        (
            axum::http::header::CACHE_CONTROL,
            "public, max-age=300".to_owned(),
        ),
        (axum::http::header::ETAG, etag.clone()),
        (
            axum::http::header::LAST_MODIFIED,
            httpdate::fmt_http_date(s.card_modified),
        ),
        // One URL, two documents: caches key on the header that chooses.
        (axum::http::header::VARY, VERSION_HEADER.to_owned()),
    ];
    let cached = not_modified(
        headers_value(req_headers, axum::http::header::IF_NONE_MATCH),
        headers_value(req_headers, axum::http::header::IF_MODIFIED_SINCE),
        &etag,
        s.card_modified,
    );
    if cached {
        return (axum::http::StatusCode::NOT_MODIFIED, headers).into_response();
    }
    (headers, Json(card)).into_response()
}

fn headers_value(h: &HeaderMap, name: axum::http::HeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A weak tag of the card's content (spec 8.6.1): same card, same tag, within this build.
fn etag(card: &Value) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    card.to_string().hash(&mut h);
    format!("W/\"{:016x}\"", h.finish())
}

/// Whether a conditional GET may be answered 304 (RFC 9110 13.2.2): `If-None-Match` decides
/// when present; otherwise `If-Modified-Since` at or after the card's `Last-Modified`. An
/// unreadable date is ignored, as the RFC asks.
fn not_modified(
    if_none_match: Option<&str>,
    if_modified_since: Option<&str>,
    etag: &str,
    modified: SystemTime,
) -> bool {
    match if_none_match {
        Some(_) => headers_match(if_none_match, etag),
        None => if_modified_since
            .and_then(|d| httpdate::parse_http_date(d).ok())
            .is_some_and(|since| modified <= since),
    }
}

/// `If-None-Match` (weak comparison, RFC 9110 13.1.2) against our tag.
fn headers_match(if_none_match: Option<&str>, etag: &str) -> bool {
    let bare = |t: &str| t.trim().trim_start_matches("W/").to_owned();
    if_none_match.is_some_and(|v| {
        v.split(',')
            .any(|t| t.trim() == "*" || bare(t) == bare(etag))
    })
}

/// A JSON-RPC call, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub id: Value,
    pub version: Version,
    pub op: Operation,
    pub request: Request,
}

/// Reads a JSON-RPC request body under the negotiated version. On failure: the id to answer
/// with (null when unknown), the error, and what is known for the metric labels.
pub fn parse_call(
    version_header: Option<&str>,
    body: &[u8],
) -> Result<Call, (Value, A2aError, Option<Version>, Option<Operation>)> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| (Value::Null, A2aError::Parse(e.to_string()), None, None))?;
    let Value::Object(obj) = v else {
        let msg = if v.is_array() {
            "batch requests are not supported"
        } else {
            "a request is a JSON object"
        };
        return Err((
            Value::Null,
            A2aError::InvalidRequest(msg.into()),
            None,
            None,
        ));
    };
    let id = match obj.get("id") {
        None => Value::Null,
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => id.clone(),
        Some(_) => {
            return Err((
                Value::Null,
                A2aError::InvalidRequest("id must be a string, a number or null".into()),
                None,
                None,
            ));
        }
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((
            id,
            A2aError::InvalidRequest("jsonrpc must be \"2.0\"".into()),
            None,
            None,
        ));
    }
    let Some(method) = obj.get("method").and_then(Value::as_str) else {
        return Err((
            id,
            A2aError::InvalidRequest("method is required".into()),
            None,
            None,
        ));
    };
    let version = version::negotiate(version_header).map_err(|e| (id.clone(), e, None, None))?;
    let op = version::resolve(version, method).map_err(|e| (id.clone(), e, Some(version), None))?;
    let params = obj.get("params").cloned().unwrap_or(Value::Null);
    let request =
        wire::decode(version, op, &params).map_err(|e| (id.clone(), e, Some(version), Some(op)))?;
    Ok(Call {
        id,
        version,
        op,
        request,
    })
}

/// Whether a request's `Content-Type` is JSON (`application/json` or a `+json` type, any
/// parameters, any case); the binding accepts nothing else (spec 9.5: -32005).
pub fn check_content_type(content_type: Option<&str>) -> Result<(), A2aError> {
    let Some(value) = content_type else {
        return Err(A2aError::ContentTypeNotSupported(
            "no Content-Type; send application/json".into(),
        ));
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let json = essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"));
    if json {
        Ok(())
    } else {
        Err(A2aError::ContentTypeNotSupported(format!(
            "{value:?}; send application/json"
        )))
    }
}

/// The `id` of a request body, when it has a readable one (to answer a request rejected
/// before it was parsed with the id its client waits for).
fn best_effort_id(body: &[u8]) -> Value {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("id").cloned())
        .filter(|id| id.is_string() || id.is_number())
        .unwrap_or(Value::Null)
}

/// `POST <rpc_path>`: one JSON-RPC call.
pub async fn rpc(State(s): State<A2aState>, headers: HeaderMap, body: Bytes) -> Response {
    let content_type = headers_value(&headers, axum::http::header::CONTENT_TYPE);
    if let Err(e) = check_content_type(content_type) {
        metrics::request("unknown", "unsupported", e.outcome());
        return Json(e.to_response(&best_effort_id(&body))).into_response();
    }
    let header = headers.get(VERSION_HEADER).and_then(|h| h.to_str().ok());
    let call = match parse_call(header, &body) {
        Ok(c) => c,
        Err((id, e, version, op)) => {
            metrics::request(
                op.map_or("unknown", Operation::label),
                version.map_or("unsupported", Version::as_str),
                e.outcome(),
            );
            return Json(e.to_response(&id)).into_response();
        }
    };
    let (method, version) = (call.op.label(), call.version.as_str());
    let span = tracing::info_span!("a2a", method, version);
    let url = card_url(&s, &headers);
    let result = execute(&s, call, &url).instrument(span).await;
    match result {
        Ok(r) => {
            metrics::request(method, version, "ok");
            r
        }
        Err((id, e)) => {
            tracing::debug!(method, error = %e, "a2a request failed");
            metrics::request(method, version, e.outcome());
            Json(e.to_response(&id)).into_response()
        }
    }
}

type Failed = (Value, A2aError);

/// `card_url`: the JSON-RPC URL an extended card names.
async fn execute(s: &A2aState, c: Call, card_url: &str) -> Result<Response, Failed> {
    let Call {
        id,
        version,
        op: _,
        request,
    } = c;
    let fail = |e: A2aError| (id.clone(), e);
    let answer = |result: Value| Json(json!({"jsonrpc": "2.0", "id": id, "result": result}));
    match request {
        Request::Send(p) => {
            let result = send(s, p).await.map_err(fail)?;
            Ok(answer(wire::send_result(version, &result)).into_response())
        }
        Request::Stream(p) => {
            let (task, rx) = stream(s, p).await.map_err(fail)?;
            Ok(sse(version, id, task, rx))
        }
        Request::Get(g) => {
            let task = get(s, &g.id, g.history_length).await.map_err(fail)?;
            Ok(answer(wire::task(version, &task)).into_response())
        }
        Request::List(l) => {
            let page = list(s, &l).await.map_err(fail)?;
            Ok(answer(wire::task_page(&page)).into_response())
        }
        Request::Cancel { id: task_id } => {
            let task = cancel(s, task_id).await.map_err(fail)?;
            Ok(answer(wire::task(version, &task)).into_response())
        }
        Request::Subscribe { id: task_id } => {
            let asked = ask(&s.tasks, |reply| A2aTasksMsg::Subscribe {
                task_id: task_id.clone(),
                reply,
            })
            .await
            .map_err(fail)?;
            let sub = match asked {
                Err(A2aError::TaskNotFound { .. }) => {
                    // Not live: a stored one is over.
                    return Err(fail(match stored(s, &task_id).await.map_err(fail)? {
                        Some(t) => A2aError::UnsupportedOperation(format!(
                            "task {task_id} is {}; nothing more will happen",
                            t.status.state.v1_name()
                        )),
                        None => A2aError::TaskNotFound { task_id },
                    }));
                }
                other => other.map_err(fail)?,
            };
            Ok(sse(version, id, sub.task, sub.events))
        }
        Request::Push(request) => {
            let done = push_request(s, request).await.map_err(fail)?;
            let result = match done {
                PushAnswer::Config(c) => push::encode(version, &c),
                PushAnswer::List(cs) => push::encode_list(version, &cs),
                PushAnswer::Deleted => match version {
                    Version::V1_0 => json!({}),
                    Version::V0_3 => Value::Null,
                },
            };
            Ok(answer(result).into_response())
        }
        // The route sits behind the token check: a caller that reaches it is authenticated.
        Request::ExtendedCard if s.card.bearer_auth => {
            Ok(answer(extended_card(&s.card, card_url, version == Version::V0_3)).into_response())
        }
        Request::ExtendedCard => Err(fail(A2aError::UnsupportedOperation(
            "this agent takes no token, so it has no extended agent card".into(),
        ))),
    }
}

/// An RPC to the current actor; a dead (or restarting) actor is an internal error.
async fn ask<T: Send + 'static>(
    tasks: &tokio::sync::watch::Receiver<Option<ActorRef<A2aTasksMsg>>>,
    msg: impl FnOnce(ractor::RpcReplyPort<T>) -> A2aTasksMsg,
) -> Result<T, A2aError> {
    let tasks = tasks
        .borrow()
        .clone()
        .ok_or_else(|| A2aError::Internal("a2a tasks restarting".into()))?;
    ractor::call!(tasks, msg).map_err(|e| A2aError::Internal(format!("a2a tasks unavailable: {e}")))
}

fn validate(p: &SendParams) -> Result<String, A2aError> {
    if let Some(config) = &p.push_config {
        // Checked before the task exists, so a bad webhook starts nothing.
        let mut probe = config.clone();
        probe.task_id = "new".into();
        push::validate(&probe)?;
    }
    request::input_text(p)
}

/// What the store holds about the task and the context a send names (the actor takes them
/// back when it does not hold them).
async fn known(s: &A2aState, p: &SendParams) -> Result<Known, A2aError> {
    let store_err = |e: troupe_proto::AgentError| A2aError::Internal(format!("store: {e}"));
    let mut known = Known::default();
    if let Some(task_id) = &p.message.task_id {
        known.task = s.store.a2a_task(task_id).await.map_err(store_err)?;
        if let Some(t) = &known.task
            && !t.terminal
        {
            known.pushes = s.store.a2a_pushes(task_id).await.map_err(store_err)?;
        }
    }
    let context_id = known
        .task
        .as_ref()
        .map(|t| t.context_id.clone())
        .or_else(|| p.message.context_id.clone());
    if let Some(c) = context_id {
        known.context = s.store.a2a_context(&c).await.map_err(store_err)?;
    }
    Ok(known)
}

/// Hands a send to the actor; answers once its task is stored.
async fn accept(
    s: &A2aState,
    p: SendParams,
    stream: bool,
) -> Result<super::tasks::Accepted, A2aError> {
    let input = validate(&p)?;
    let known = known(s, &p).await?;
    let mut accepted = ask(&s.tasks, |reply| A2aTasksMsg::Send {
        params: Box::new(p),
        input,
        stream,
        known: Box::new(known),
        reply,
    })
    .await??;
    // A store that fails is logged by the writer; the task runs all the same.
    if let Some(stored) = accepted.stored.take() {
        let _ = stored.await;
    }
    Ok(accepted)
}

/// SendMessage: blocks until the task settles unless asked to return at once; answers the
/// task, or the agent's plain Message reply.
async fn send(s: &A2aState, p: SendParams) -> Result<SendResult, A2aError> {
    let history_length = p.history_length;
    let return_immediately = p.return_immediately;
    let accepted = accept(s, p, false).await?;
    if return_immediately {
        return Ok(SendResult::Task(accepted.task));
    }
    let task_id = accepted.task.id.clone();
    wait(s, &task_id, Until::Settled, s.blocking_wait).await?;
    let live = ask(&s.tasks, |reply| A2aTasksMsg::Outcome {
        task_id: task_id.clone(),
        history_length,
        reply,
    })
    .await?;
    if let Some(outcome) = live {
        return Ok(outcome);
    }
    let record = s
        .store
        .a2a_task(&task_id)
        .await
        .map_err(|e| A2aError::Internal(format!("store: {e}")))?
        .ok_or(A2aError::TaskNotFound { task_id })?;
    Ok(super::book::send_result(
        &super::book::stored::record_of(&record)?,
        history_length,
    ))
}

async fn stream(
    s: &A2aState,
    p: SendParams,
) -> Result<(Task, mpsc::Receiver<StreamEvent>), A2aError> {
    let accepted = accept(s, p, true).await?;
    let rx = accepted
        .events
        .ok_or_else(|| A2aError::Internal("no stream for a streaming send".into()))?;
    Ok((accepted.task, rx))
}

/// A task from the store, as the client sees it.
async fn stored(s: &A2aState, task_id: &str) -> Result<Option<Task>, A2aError> {
    let record = s
        .store
        .a2a_task(task_id)
        .await
        .map_err(|e| A2aError::Internal(format!("store: {e}")))?;
    record.as_ref().map(task_of).transpose()
}

/// GetTask: the actor's version of a live task, else the store's.
async fn get(s: &A2aState, task_id: &str, history_length: Option<u32>) -> Result<Task, A2aError> {
    let live = ask(&s.tasks, |reply| A2aTasksMsg::Get {
        task_id: task_id.to_owned(),
        history_length,
        reply,
    })
    .await?;
    if let Some(t) = live {
        return Ok(t);
    }
    stored(s, task_id)
        .await?
        .map(|t| trim(&t, history_length, true))
        .ok_or_else(|| A2aError::TaskNotFound {
            task_id: task_id.to_owned(),
        })
}

/// ListTasks: a page of the store, live tasks in the actor's fresher version.
async fn list(s: &A2aState, l: &request::ListParams) -> Result<super::model::TaskPage, A2aError> {
    let page = s
        .store
        .a2a_tasks(list_query(l)?)
        .await
        .map_err(|e| A2aError::Internal(format!("store: {e}")))?;
    let live_ids: Vec<String> = page
        .tasks
        .iter()
        .filter(|t| !t.terminal)
        .map(|t| t.task_id.clone())
        .collect();
    let fresh = if live_ids.is_empty() {
        std::collections::HashMap::new()
    } else {
        ask(&s.tasks, |reply| A2aTasksMsg::Fresh {
            ids: live_ids,
            reply,
        })
        .await?
    };
    stored_page(l, &page, |id| fresh.get(id).cloned())
}

/// CancelTask: answers the task once it stopped (or, past `cancel_wait`, as it is).
async fn cancel(s: &A2aState, task_id: String) -> Result<Task, A2aError> {
    let asked = ask(&s.tasks, |reply| A2aTasksMsg::Cancel {
        task_id: task_id.clone(),
        reply,
    })
    .await?;
    if let Err(A2aError::TaskNotFound { .. }) = asked {
        // Not live: a stored one is over.
        return Err(match stored(s, &task_id).await? {
            Some(t) => A2aError::TaskNotCancelable {
                task_id,
                state: t.status.state.v1_name(),
            },
            None => A2aError::TaskNotFound { task_id },
        });
    }
    asked?;
    wait(s, &task_id, Until::Terminal, s.cancel_wait).await?;
    get(s, &task_id, None).await
}

/// A push config request: the actor's for a live task, the store's for a finished one.
async fn push_request(s: &A2aState, request: push::PushRequest) -> Result<PushAnswer, A2aError> {
    let asked = ask(&s.tasks, |reply| A2aTasksMsg::Push {
        request: request.clone(),
        reply,
    })
    .await??;
    if let Some(answer) = asked {
        return Ok(answer);
    }
    let store_err = |e: troupe_proto::AgentError| A2aError::Internal(format!("store: {e}"));
    let task_id = match &request {
        push::PushRequest::Set(c) => c.task_id.clone(),
        push::PushRequest::Get { task_id, .. }
        | push::PushRequest::List { task_id }
        | push::PushRequest::Delete { task_id, .. } => task_id.clone(),
    };
    let Some(task) = s.store.a2a_task(&task_id).await.map_err(store_err)? else {
        return Err(A2aError::TaskNotFound { task_id });
    };
    let configs = || async {
        let stored = s.store.a2a_pushes(&task_id).await.map_err(store_err)?;
        stored
            .iter()
            .map(push::config_of)
            .collect::<Result<Vec<_>, _>>()
    };
    match request {
        push::PushRequest::Set(_) => Err(A2aError::UnsupportedOperation(format!(
            "task {task_id} is {}; it sends no more notifications",
            task.state
        ))),
        push::PushRequest::Get { id, .. } => {
            let mut book = push::PushBook::default();
            for c in configs().await? {
                book.restore(c);
            }
            book.get(&task_id, id.as_deref()).map(PushAnswer::Config)
        }
        push::PushRequest::List { .. } => configs().await.map(PushAnswer::List),
        push::PushRequest::Delete { id, .. } => {
            s.store
                .delete_a2a_push(&task_id, &id)
                .await
                .map_err(store_err)?;
            Ok(PushAnswer::Deleted)
        }
    }
}

async fn wait(s: &A2aState, task_id: &str, until: Until, limit: Duration) -> Result<(), A2aError> {
    let done = ask(&s.tasks, |reply| A2aTasksMsg::WaitFor {
        task_id: task_id.to_owned(),
        until,
        reply,
    })
    .await?;
    // A timeout or a dropped waiter both answer with the task as it is now.
    let _ = tokio::time::timeout(limit, done).await;
    Ok(())
}

/// The SSE answer: the task first, then its events, closed after the last one.
fn sse(version: Version, id: Value, task: Task, rx: mpsc::Receiver<StreamEvent>) -> Response {
    Sse::new(event_stream(version, id, task, rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

struct StreamState {
    version: Version,
    id: Value,
    first: Option<StreamEvent>,
    rx: mpsc::Receiver<StreamEvent>,
    done: bool,
    _guard: StreamGuard,
}

fn event_stream(
    version: Version,
    id: Value,
    task: Task,
    rx: mpsc::Receiver<StreamEvent>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let state = StreamState {
        version,
        id,
        first: Some(StreamEvent::Task(task)),
        rx,
        done: false,
        _guard: StreamGuard::open(),
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let event = match st.first.take() {
            Some(e) => e,
            None => st.rx.recv().await?,
        };
        let (data, last) = frame(st.version, &st.id, &event);
        st.done = last;
        Some((Ok(Event::default().data(data.to_string())), st))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_content_types_are_read() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "APPLICATION/JSON",
            "application/a2a+json",
        ] {
            assert_eq!(check_content_type(Some(ok)), Ok(()), "{ok}");
        }
        for bad in [
            None,
            Some("text/plain"),
            Some("application/jsonl"),
            Some("json"),
            Some(""),
        ] {
            let e = check_content_type(bad).unwrap_err();
            assert_eq!(e.code(), -32005, "{bad:?}");
        }
    }

    #[test]
    fn conditional_card_requests() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let date = |t: SystemTime| httpdate::fmt_http_date(t);
        let tag = "W/\"abc\"";
        // If-None-Match decides when present, whatever the date says.
        assert!(not_modified(Some(tag), Some(&date(at)), tag, at));
        assert!(!not_modified(Some("W/\"other\""), Some(&date(at)), tag, at));
        // Otherwise the date: at or after the change is 304.
        assert!(not_modified(None, Some(&date(at)), tag, at));
        let later = at + Duration::from_secs(5);
        assert!(not_modified(None, Some(&date(later)), tag, at));
        let earlier = at - Duration::from_secs(5);
        assert!(!not_modified(None, Some(&date(earlier)), tag, at));
        assert!(!not_modified(None, Some("yesterday"), tag, at));
        assert!(!not_modified(None, None, tag, at));
        assert_eq!(
            whole_seconds(at + Duration::from_millis(999)),
            at,
            "HTTP dates have whole seconds"
        );
    }

    #[test]
    fn envelope_errors_carry_the_right_codes() {
        let code =
            |h: Option<&str>, body: &str| parse_call(h, body.as_bytes()).unwrap_err().1.code();
        assert_eq!(code(None, "{"), -32700);
        assert_eq!(code(None, "[]"), -32600);
        assert_eq!(
            code(None, r#"{"jsonrpc":"1.0","id":1,"method":"x"}"#),
            -32600
        );
        assert_eq!(
            code(None, r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#),
            -32600
        );
        assert_eq!(code(None, r#"{"jsonrpc":"2.0","id":1}"#), -32600);
        assert_eq!(
            code(
                Some("0.5"),
                r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage"}"#
            ),
            -32009
        );
        assert_eq!(
            code(None, r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage"}"#),
            -32009
        );
        assert_eq!(
            code(Some("1.0"), r#"{"jsonrpc":"2.0","id":1,"method":"Nope"}"#),
            -32601
        );
        assert_eq!(
            code(
                Some("1.0"),
                r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{}}"#
            ),
            -32602
        );
    }

    #[test]
    fn a_good_call_decodes() {
        let c = parse_call(
            Some("1.0"),
            br#"{"jsonrpc":"2.0","id":"a","method":"GetTask","params":{"id":"t","historyLength":1}}"#,
        )
        .unwrap();
        assert_eq!(c.id, json!("a"));
        assert_eq!(c.op, Operation::GetTask);
        let c = parse_call(
            None,
            br#"{"jsonrpc":"2.0","id":3,"method":"tasks/cancel","params":{"id":"t"}}"#,
        )
        .unwrap();
        assert_eq!(c.version, Version::V0_3);
        assert_eq!(c.request, Request::Cancel { id: "t".into() });
    }

    use proptest::prelude::*;

    /// Arbitrary JSON, with the keys and strings of A2A requests frequent enough to reach
    /// the inner decoders.
    fn json_value() -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            Just("message".to_owned()),
            Just("parts".to_owned()),
            Just("role".to_owned()),
            Just("text".to_owned()),
            Just("kind".to_owned()),
            Just("file".to_owned()),
            Just("data".to_owned()),
            Just("messageId".to_owned()),
            Just("id".to_owned()),
            Just("configuration".to_owned()),
            Just("historyLength".to_owned()),
            Just("pageSize".to_owned()),
            Just("status".to_owned()),
            Just("statusTimestampAfter".to_owned()),
            "[a-zA-Z]{1,8}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| json!(f)),
            prop_oneof![
                Just("ROLE_USER".to_owned()),
                Just("user".to_owned()),
                Just("text".to_owned()),
                Just("file".to_owned()),
                Just("TASK_STATE_WORKING".to_owned()),
                Just("2024-03-15T10:15:00Z".to_owned()),
                ".{0,12}",
            ]
            .prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map(key.clone(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    const METHODS: [&str; 14] = [
        "SendMessage",
        "SendStreamingMessage",
        "GetTask",
        "ListTasks",
        "CancelTask",
        "SubscribeToTask",
        "GetExtendedAgentCard",
        "message/send",
        "message/stream",
        "tasks/get",
        "tasks/cancel",
        "tasks/resubscribe",
        "tasks/pushNotificationConfig/set",
        "whatever",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn decoding_never_panics(
            method in proptest::sample::select(&METHODS[..]),
            version in proptest::option::of(prop_oneof![
                Just("1.0".to_owned()), Just("0.3".to_owned()), ".{0,6}"
            ]),
            params in json_value(),
        ) {
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
            let _ = parse_call(version.as_deref(), body.to_string().as_bytes());
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_call(Some("1.0"), &body);
        }
    }
}
