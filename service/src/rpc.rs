//! JSON-RPC 2.0: one dispatcher for the three transports (HTTP `POST /rpc`, WebSocket
//! `/rpc/ws`, stdio).
//!
//! A frame goes through three steps: [`parse_frame`] (bytes → single call or batch, or a
//! parse error), [`parse_call`] (a JSON value → a valid call envelope, or an invalid-request
//! error), [`decode`] (method + params → a typed [`Request`], or method-not-found /
//! invalid-params). All three are pure. Only [`Rpc::call`] does anything, and it goes through
//! the [`SessionsApi`] like the REST routes do.
//!
//! Batches follow the specification: an empty array is one invalid-request error; the
//! members run concurrently; notifications (no `id`) get no response; a batch of
//! notifications answers nothing at all.

use super::api::{CreateSession, SendText};
use super::auth::Scope;
use super::error::RpcError;
use super::sessions_api::SessionsApi;
use super::stream::{self, Subscriber};
use futures::StreamExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use troupe_actors::conversation::ConversationMsg;
use troupe_proto::{
    AgentError, ApprovalDecision, ApprovalId, ConversationId, OpenConversation, SessionId,
    SetContext, TaskId,
};

/// Every method, as the method label of metrics takes it.
pub const METHODS: &[&str] = &[
    "session.create",
    "session.get",
    "session.list",
    "conversation.open",
    "conversation.message",
    "conversation.send",
    "conversation.close",
    "conversation.setContext",
    "conversation.list",
    "conversation.stats",
    "task.cancel",
    "task.list",
    "approval.list",
    "approval.respond",
    "messages.list",
    "messages.get",
    "project.setCurrentSession",
    "project.currentSession",
    "events.subscribe",
    "events.unsubscribe",
];

/// Default page size of `messages.list` and the REST listing.
pub const DEFAULT_PAGE: usize = 50;

/// A decoded call.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    SessionCreate(CreateSession),
    SessionGet {
        session_id: SessionId,
    },
    SessionList {
        project_id: Option<String>,
    },
    ConversationOpen {
        session_id: SessionId,
        params: OpenConversation,
    },
    /// `conversation.message` (waits) and `conversation.send` (does not).
    ConversationMessage {
        session_id: SessionId,
        send: SendText,
    },
    ConversationClose {
        session_id: SessionId,
        conversation_id: ConversationId,
    },
    ConversationSetContext {
        session_id: SessionId,
        conversation_id: ConversationId,
        update: SetContext,
    },
    ConversationList {
        session_id: SessionId,
    },
    ConversationStats {
        session_id: SessionId,
        conversation_id: ConversationId,
    },
    TaskCancel {
        session_id: SessionId,
        task_id: TaskId,
    },
    TaskList {
        session_id: SessionId,
        conversation_id: Option<ConversationId>,
    },
    ApprovalList {
        session_id: SessionId,
    },
    ApprovalRespond {
        session_id: SessionId,
        approval_id: ApprovalId,
        decision: ApprovalDecision,
    },
    MessagesList {
        session_id: SessionId,
        limit: Option<usize>,
        before: Option<u64>,
    },
    MessagesGet {
        session_id: SessionId,
        message_id: u64,
    },
    ProjectSetCurrent {
        project_id: String,
        session_id: SessionId,
    },
    ProjectCurrent {
        project_id: String,
    },
    EventsSubscribe {
        session_id: SessionId,
        after: Option<u64>,
    },
    EventsUnsubscribe {
        subscription: u64,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionParams {
    session_id: SessionId,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectParams {
    #[serde(default)]
    project_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequiredProject {
    project_id: String,
}

#[derive(Deserialize)]
struct OpenParams {
    session_id: SessionId,
    #[serde(flatten)]
    params: OpenConversation,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageParams {
    session_id: SessionId,
    #[serde(default)]
    conversation_id: Option<ConversationId>,
    text: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConversationParams {
    session_id: SessionId,
    conversation_id: ConversationId,
}

#[derive(Deserialize)]
struct SetContextParams {
    session_id: SessionId,
    conversation_id: ConversationId,
    #[serde(flatten)]
    update: SetContext,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskParams {
    session_id: SessionId,
    task_id: TaskId,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskListParams {
    session_id: SessionId,
    #[serde(default)]
    conversation_id: Option<ConversationId>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RespondParams {
    session_id: SessionId,
    approval_id: ApprovalId,
    decision: ApprovalDecision,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessagesParams {
    session_id: SessionId,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    before: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageGetParams {
    session_id: SessionId,
    message_id: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetCurrentParams {
    project_id: String,
    session_id: SessionId,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscribeParams {
    session_id: SessionId,
    #[serde(default)]
    after: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnsubscribeParams {
    subscription: u64,
}

fn params<T: DeserializeOwned>(value: Value) -> Result<T, RpcError> {
    serde_json::from_value(value).map_err(|e| RpcError::invalid_params(e.to_string()))
}

/// Method name and params → a typed request. Params are by name; a one-element array
/// holding the object is accepted too.
pub fn decode(method: &str, raw: Option<Value>) -> Result<Request, RpcError> {
    let value = match raw {
        None | Some(Value::Null) => json!({}),
        Some(Value::Array(mut items)) if items.len() == 1 && items[0].is_object() => {
            items.remove(0)
        }
        Some(v @ Value::Object(_)) => v,
        Some(_) => {
            return Err(RpcError::invalid_params(
                "params must be an object of named parameters",
            ));
        }
    };
    Ok(match method {
        "session.create" => Request::SessionCreate(params(value)?),
        "session.get" => Request::SessionGet {
            session_id: params::<SessionParams>(value)?.session_id,
        },
        "session.list" => Request::SessionList {
            project_id: params::<ProjectParams>(value)?.project_id,
        },
        "conversation.open" => {
            let p: OpenParams = params(value)?;
            Request::ConversationOpen {
                session_id: p.session_id,
                params: p.params,
            }
        }
        "conversation.message" | "conversation.send" => {
            let p: MessageParams = params(value)?;
            Request::ConversationMessage {
                session_id: p.session_id,
                send: SendText {
                    conversation_id: p.conversation_id,
                    text: p.text,
                    wait: method == "conversation.message",
                },
            }
        }
        "conversation.close" => {
            let p: ConversationParams = params(value)?;
            Request::ConversationClose {
                session_id: p.session_id,
                conversation_id: p.conversation_id,
            }
        }
        "conversation.setContext" => {
            let p: SetContextParams = params(value)?;
            Request::ConversationSetContext {
                session_id: p.session_id,
                conversation_id: p.conversation_id,
                update: p.update,
            }
        }
        "conversation.list" => Request::ConversationList {
            session_id: params::<SessionParams>(value)?.session_id,
        },
        "conversation.stats" => {
            let p: ConversationParams = params(value)?;
            Request::ConversationStats {
                session_id: p.session_id,
                conversation_id: p.conversation_id,
            }
        }
        "task.cancel" => {
            let p: TaskParams = params(value)?;
            Request::TaskCancel {
                session_id: p.session_id,
                task_id: p.task_id,
            }
        }
        "task.list" => {
            let p: TaskListParams = params(value)?;
            Request::TaskList {
                session_id: p.session_id,
                conversation_id: p.conversation_id,
            }
        }
        "approval.list" => Request::ApprovalList {
            session_id: params::<SessionParams>(value)?.session_id,
        },
        "approval.respond" => {
            let p: RespondParams = params(value)?;
            Request::ApprovalRespond {
                session_id: p.session_id,
                approval_id: p.approval_id,
                decision: p.decision,
            }
        }
        "messages.list" => {
            let p: MessagesParams = params(value)?;
            Request::MessagesList {
                session_id: p.session_id,
                limit: p.limit,
                before: p.before,
            }
        }
        "messages.get" => {
            let p: MessageGetParams = params(value)?;
            Request::MessagesGet {
                session_id: p.session_id,
                message_id: p.message_id,
            }
        }
        "project.setCurrentSession" => {
            let p: SetCurrentParams = params(value)?;
            Request::ProjectSetCurrent {
                project_id: p.project_id,
                session_id: p.session_id,
            }
        }
        "project.currentSession" => Request::ProjectCurrent {
            project_id: params::<RequiredProject>(value)?.project_id,
        },
        "events.subscribe" => {
            let p: SubscribeParams = params(value)?;
            Request::EventsSubscribe {
                session_id: p.session_id,
                after: p.after,
            }
        }
        "events.unsubscribe" => Request::EventsUnsubscribe {
            subscription: params::<UnsubscribeParams>(value)?.subscription,
        },
        other => return Err(RpcError::method_not_found(other)),
    })
}

/// A frame: one call or a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Single(Value),
    Batch(Vec<Value>),
}

/// Bytes → a frame; malformed JSON is a parse error (answered with `id: null`).
pub fn parse_frame(bytes: &[u8]) -> Result<Frame, RpcError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Array(items)) if items.is_empty() => {
            Err(RpcError::invalid_request("empty batch"))
        }
        Ok(Value::Array(items)) => Ok(Frame::Batch(items)),
        Ok(v) => Ok(Frame::Single(v)),
        Err(e) => Err(RpcError::parse(format!("invalid JSON: {e}"))),
    }
}

/// A valid call envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// `None` for a notification (no `id` member).
    pub id: Option<Value>,
    pub method: String,
    pub params: Option<Value>,
}

/// A JSON value → a call, or the invalid-request error and the id to answer it with.
pub fn parse_call(value: Value) -> Result<Call, (Value, RpcError)> {
    let Value::Object(mut obj) = value else {
        return Err((
            Value::Null,
            RpcError::invalid_request("a call is a JSON object"),
        ));
    };
    let id = obj.remove("id");
    let answer_id = match &id {
        Some(v @ (Value::String(_) | Value::Number(_) | Value::Null)) => v.clone(),
        Some(_) => {
            return Err((
                Value::Null,
                RpcError::invalid_request("id must be a string, a number or null"),
            ));
        }
        None => Value::Null,
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((
            answer_id,
            RpcError::invalid_request("jsonrpc must be \"2.0\""),
        ));
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        _ => {
            return Err((
                answer_id,
                RpcError::invalid_request("method must be a string"),
            ));
        }
    };
    let params = obj.remove("params");
    if let Some(p) = &params
        && !(p.is_object() || p.is_array())
    {
        return Err((
            answer_id,
            RpcError::invalid_request("params must be an object or an array"),
        ));
    }
    Ok(Call { id, method, params })
}

/// A success response.
pub fn response(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// An error response.
pub fn error_response(id: Value, error: RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

/// The `&'static` name of a method for metric labels (`unknown` otherwise).
pub fn method_label(method: &str) -> &'static str {
    METHODS
        .iter()
        .find(|m| **m == method)
        .copied()
        .unwrap_or("unknown")
}

fn outcome_label(result: &Result<Value, RpcError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => match e.code {
            super::error::PARSE_ERROR => "parse_error",
            super::error::INVALID_REQUEST => "invalid_request",
            super::error::METHOD_NOT_FOUND => "method_not_found",
            super::error::INVALID_PARAMS => "invalid_params",
            super::error::INTERNAL_ERROR => "internal",
            _ => "application_error",
        },
    }
}

/// Where a streaming connection's notifications go, and its subscriptions.
pub struct Notifier {
    out: mpsc::Sender<Value>,
    /// Cancelled when the connection ends; every subscription is a child of it.
    closed: CancellationToken,
    next: AtomicU64,
    subscriptions: Mutex<HashMap<u64, CancellationToken>>,
    transport: &'static str,
}

impl Notifier {
    pub fn new(
        out: mpsc::Sender<Value>,
        closed: CancellationToken,
        transport: &'static str,
    ) -> Self {
        Self {
            out,
            closed,
            next: AtomicU64::new(1),
            subscriptions: Mutex::new(HashMap::new()),
            transport,
        }
    }

    fn add(&self) -> (u64, CancellationToken) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let token = self.closed.child_token();
        if let Ok(mut subs) = self.subscriptions.lock() {
            subs.insert(id, token.clone());
        }
        (id, token)
    }

    fn remove(&self, id: u64) -> bool {
        let token = self
            .subscriptions
            .lock()
            .ok()
            .and_then(|mut subs| subs.remove(&id));
        token.map(|t| t.cancel()).is_some()
    }
}

/// The dispatcher.
#[derive(Clone, Debug)]
pub struct Rpc {
    pub sessions: SessionsApi,
    /// Largest page `messages.list` returns.
    pub max_page: usize,
}

impl Rpc {
    /// Answers one frame; `None` when there is nothing to send back (notifications only).
    pub async fn handle_frame(
        &self,
        scope: &Scope,
        bytes: &[u8],
        notifier: Option<&Arc<Notifier>>,
    ) -> Option<Value> {
        match parse_frame(bytes) {
            Err(e) => {
                metrics_for("unknown", &Err(e.clone()));
                Some(error_response(Value::Null, e))
            }
            Ok(Frame::Single(v)) => self.handle_value(scope, v, notifier).await,
            Ok(Frame::Batch(items)) => {
                let answers = futures::future::join_all(
                    items
                        .into_iter()
                        .map(|v| self.handle_value(scope, v, notifier)),
                )
                .await;
                let answers: Vec<Value> = answers.into_iter().flatten().collect();
                (!answers.is_empty()).then_some(Value::Array(answers))
            }
        }
    }

    async fn handle_value(
        &self,
        scope: &Scope,
        value: Value,
        notifier: Option<&Arc<Notifier>>,
    ) -> Option<Value> {
        let call = match parse_call(value) {
            Ok(c) => c,
            Err((id, e)) => {
                metrics_for("unknown", &Err(e.clone()));
                return Some(error_response(id, e));
            }
        };
        let span = tracing::info_span!("rpc", method = %method_label(&call.method));
        let result = match decode(&call.method, call.params) {
            Ok(request) => {
                tracing::Instrument::instrument(self.call(scope, request, notifier), span).await
            }
            Err(e) => Err(e),
        };
        metrics_for(method_label(&call.method), &result);
        let id = call.id?;
        Some(match result {
            Ok(v) => response(id, v),
            Err(e) => error_response(id, e),
        })
    }

    /// Runs one decoded request.
    pub async fn call(
        &self,
        scope: &Scope,
        request: Request,
        notifier: Option<&Arc<Notifier>>,
    ) -> Result<Value, RpcError> {
        let s = &self.sessions;
        let scope = scope.clone();
        Ok(match request {
            Request::SessionCreate(r) => to_json(s.create(scope, r).await?),
            Request::SessionGet { session_id } => to_json(s.get(scope, session_id).await?),
            Request::SessionList { project_id } => to_json(s.list(scope, project_id).await?),
            Request::ConversationOpen { session_id, params } => {
                let id = s.open(scope, session_id, params).await?;
                json!({ "conversation_id": id })
            }
            Request::ConversationMessage { session_id, send } => to_json(
                s.send(
                    scope,
                    session_id,
                    send.conversation_id,
                    send.text,
                    send.wait,
                )
                .await?,
            ),
            Request::ConversationClose {
                session_id,
                conversation_id,
            } => to_json(s.close(scope, session_id, conversation_id).await?),
            Request::ConversationSetContext {
                session_id,
                conversation_id,
                update,
            } => {
                s.set_context(scope, session_id, conversation_id, update)
                    .await?;
                json!({})
            }
            Request::ConversationList { session_id } => {
                to_json(s.conversations(scope, session_id).await?)
            }
            Request::ConversationStats {
                session_id,
                conversation_id,
            } => to_json(conversation_stats(s, scope, session_id, conversation_id).await?),
            Request::TaskCancel {
                session_id,
                task_id,
            } => {
                let handle = s.session(scope, session_id).await?;
                to_json(handle.cancel_task(task_id).await?)
            }
            Request::TaskList {
                session_id,
                conversation_id,
            } => {
                let handle = s.session(scope, session_id).await?;
                to_json(handle.tasks(conversation_id).await?)
            }
            Request::ApprovalList { session_id } => {
                let handle = s.session(scope, session_id).await?;
                to_json(handle.pending_approvals().await?)
            }
            Request::ApprovalRespond {
                session_id,
                approval_id,
                decision,
            } => {
                let handle = s.session(scope, session_id).await?;
                handle.respond_approval(approval_id, decision).await?;
                json!({})
            }
            Request::MessagesList {
                session_id,
                limit,
                before,
            } => {
                let limit = page_limit(limit, self.max_page)?;
                to_json(s.messages(scope, session_id, limit, before).await?)
            }
            Request::MessagesGet {
                session_id,
                message_id,
            } => to_json(s.message(scope, session_id, message_id).await?),
            Request::ProjectSetCurrent {
                project_id,
                session_id,
            } => to_json(s.set_current(scope, project_id, session_id).await?),
            Request::ProjectCurrent { project_id } => to_json(s.current(scope, project_id).await?),
            Request::EventsSubscribe { session_id, after } => {
                let notifier = notifier.ok_or_else(streaming_only)?;
                let id = self
                    .subscribe(scope, session_id, after.unwrap_or(0), notifier)
                    .await?;
                json!({ "subscription": id })
            }
            Request::EventsUnsubscribe { subscription } => {
                let notifier = notifier.ok_or_else(streaming_only)?;
                json!({ "unsubscribed": notifier.remove(subscription) })
            }
        })
    }

    /// Starts forwarding a session's events as `events.event` notifications.
    async fn subscribe(
        &self,
        scope: Scope,
        session_id: SessionId,
        after: u64,
        notifier: &Arc<Notifier>,
    ) -> Result<u64, AgentError> {
        let handle = self.sessions.session(scope, session_id).await?;
        let events = stream::events(&handle, after).await?;
        let (id, cancel) = notifier.add();
        let out = notifier.out.clone();
        let transport = notifier.transport;
        tokio::spawn(async move {
            let _gauge = Subscriber::new(transport);
            let mut events = std::pin::pin!(events);
            loop {
                let next = tokio::select! {
                    () = cancel.cancelled() => break,
                    n = events.next() => n,
                };
                let note = match next {
                    Some(Ok(e)) => json!({
                        "jsonrpc": "2.0",
                        "method": "events.event",
                        "params": {"subscription": id, "event": e},
                    }),
                    Some(Err(e)) => json!({
                        "jsonrpc": "2.0",
                        "method": "events.error",
                        "params": {"subscription": id, "error": RpcError::from(e)},
                    }),
                    None => break,
                };
                let last = note["method"] == "events.error";
                if out.send(note).await.is_err() || last {
                    break;
                }
            }
        });
        Ok(id)
    }
}

fn metrics_for(method: &'static str, result: &Result<Value, RpcError>) {
    super::metrics::rpc_call(method, outcome_label(result));
}

fn streaming_only() -> RpcError {
    RpcError::new(
        super::error::METHOD_NOT_FOUND,
        "events.subscribe and events.unsubscribe need a streaming transport (WebSocket /rpc/ws or stdio)",
    )
}

fn to_json<T: serde::Serialize>(value: T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// The page size asked for, checked: 1..=max, default [`DEFAULT_PAGE`] (capped by max).
pub fn page_limit(limit: Option<usize>, max: usize) -> Result<usize, AgentError> {
    match limit {
        None => Ok(DEFAULT_PAGE.min(max.max(1))),
        Some(0) => Err(AgentError::invalid("limit must be at least 1")),
        Some(n) if n > max => Err(AgentError::invalid(format!("limit must be at most {max}"))),
        Some(n) => Ok(n),
    }
}

/// A conversation's statistics (S11).
pub async fn conversation_stats(
    sessions: &SessionsApi,
    scope: Scope,
    session_id: SessionId,
    conversation_id: ConversationId,
) -> Result<troupe_proto::ConversationStats, AgentError> {
    let handle = sessions.session(scope, session_id).await?;
    let actor = handle
        .conversation_actor(conversation_id)
        .await?
        .ok_or_else(|| AgentError::not_found("conversation", conversation_id))?;
    ractor::call!(actor, |reply| ConversationMsg::Stats { reply })
        .map_err(|e| AgentError::internal(format!("conversation unavailable: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR};
    use proptest::prelude::*;

    #[test]
    fn envelopes() {
        assert_eq!(parse_frame(b"{").unwrap_err().code, PARSE_ERROR);
        assert_eq!(parse_frame(b"[]").unwrap_err().code, INVALID_REQUEST);
        let (id, e) = parse_call(json!(1)).unwrap_err();
        assert_eq!((id, e.code), (Value::Null, INVALID_REQUEST));
        let (id, e) = parse_call(json!({"jsonrpc": "1.0", "id": 7, "method": "x"})).unwrap_err();
        assert_eq!((id, e.code), (json!(7), INVALID_REQUEST));
        let (_, e) = parse_call(json!({"jsonrpc": "2.0", "id": {}, "method": "x"})).unwrap_err();
        assert_eq!(e.code, INVALID_REQUEST);
        let (_, e) =
            parse_call(json!({"jsonrpc": "2.0", "id": 1, "method": "x", "params": 3})).unwrap_err();
        assert_eq!(e.code, INVALID_REQUEST);
        let c = parse_call(json!({"jsonrpc": "2.0", "method": "x"})).unwrap();
        assert_eq!(c.id, None, "a notification");
        let c = parse_call(json!({"jsonrpc": "2.0", "method": "x", "id": null})).unwrap();
        assert_eq!(c.id, Some(Value::Null), "id null is still a request");
    }

    #[test]
    fn methods_decode_to_typed_requests() {
        let sid = SessionId::new();
        let r = decode(
            "conversation.message",
            Some(json!({"session_id": sid, "text": "hi"})),
        )
        .unwrap();
        assert!(matches!(
            r,
            Request::ConversationMessage {
                send: SendText { wait: true, .. },
                ..
            }
        ));
        let r = decode(
            "conversation.send",
            Some(json!([{"session_id": sid, "text": "hi"}])),
        )
        .unwrap();
        assert!(matches!(
            r,
            Request::ConversationMessage {
                send: SendText { wait: false, .. },
                ..
            }
        ));
        let r = decode(
            "conversation.open",
            Some(json!({"session_id": sid, "base_instructions": "be brief"})),
        )
        .unwrap();
        assert!(matches!(
            r,
            Request::ConversationOpen { ref params, .. } if params.base_instructions.as_deref() == Some("be brief")
        ));
        assert_eq!(decode("nope", None).unwrap_err().code, METHOD_NOT_FOUND);
        assert_eq!(
            decode("session.get", None).unwrap_err().code,
            INVALID_PARAMS
        );
        assert_eq!(
            decode("session.get", Some(json!({"session_id": "not-a-uuid"})))
                .unwrap_err()
                .code,
            INVALID_PARAMS
        );
        assert_eq!(
            decode("session.get", Some(json!({"session_id": sid, "extra": 1})))
                .unwrap_err()
                .code,
            INVALID_PARAMS
        );
        assert_eq!(
            decode("session.list", Some(json!([1, 2])))
                .unwrap_err()
                .code,
            INVALID_PARAMS
        );
        for m in METHODS {
            // Every listed method is known to the decoder (it fails on params, not the name).
            let r = decode(m, Some(json!({"session_id": 5})));
            assert!(
                !matches!(r, Err(ref e) if e.code == METHOD_NOT_FOUND),
                "{m}"
            );
        }
    }

    #[test]
    fn page_limits() {
        assert_eq!(page_limit(None, 1000).unwrap(), DEFAULT_PAGE);
        assert_eq!(page_limit(None, 10).unwrap(), 10);
        assert_eq!(page_limit(Some(3), 10).unwrap(), 3);
        assert!(page_limit(Some(0), 10).is_err());
        assert!(page_limit(Some(11), 10).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        /// Whatever the bytes, the frame parser answers (never panics), and anything that is
        /// a call decodes to a request or a JSON-RPC error with a standard code.
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(frame) = parse_frame(&bytes) {
                let values = match frame { Frame::Single(v) => vec![v], Frame::Batch(v) => v };
                for v in values {
                    if let Ok(call) = parse_call(v) {
                        let _ = decode(&call.method, call.params);
                    }
                }
            }
        }

        #[test]
        fn arbitrary_params_are_invalid_params_or_ok(
            method in proptest::sample::select(METHODS.to_vec()),
            params in arb_json(),
        ) {
            match decode(method, Some(params)) {
                Ok(_) => {}
                Err(e) => prop_assert_eq!(e.code, INVALID_PARAMS),
            }
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "[a-z_]{0,12}".prop_map(Value::String),
            Just(json!(SessionId::new())),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("session_id".to_owned()),
                        Just("conversation_id".to_owned()),
                        Just("text".to_owned()),
                        Just("limit".to_owned()),
                        "[a-z_]{1,8}",
                    ],
                    inner,
                    0..5
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
