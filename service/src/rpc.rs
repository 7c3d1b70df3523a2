//! JSON-RPC 2.0: one dispatcher for the three transports (HTTP `POST /rpc`, WebSocket
//! `/rpc/ws`, stdio).
//!
//! A frame goes through three steps: [`parse_frame`] (bytes → single call or batch, or a
//! parse error), [`parse_call`] (a JSON value → a valid call envelope, or an invalid-request
//! error), both in `envelope.rs`, then [`decode`] (method + params → a typed [`Request`], or
//! method-not-found / invalid-params; `methods.rs`). All three are pure. Only [`Rpc::call`]
//! (here) does anything, and it goes through the [`SessionsApi`] like the REST routes do; a
//! streaming transport's subscriptions are in [`Notifier`].
//!
//! Batches follow the specification: an empty array is one invalid-request error; the
//! members run concurrently ([`BATCH_CONCURRENCY`] at a time); notifications (no `id`) get
//! no response; a batch of notifications answers nothing at all.
//!
//! What one client can make the service hold is bounded: a batch holds at most
//! [`MAX_BATCH_CALLS`] calls (more is one invalid-request error), and the answer to a frame
//! at most [`MAX_ANSWER_BYTES`]: a call whose answer would pass the budget is answered
//! [`error::ANSWER_TOO_LARGE`] instead (what it did stands; a read did nothing), and so is
//! every later member of its batch, which is then not run. Answers are built as text, the
//! client's ids copied exactly. Pages of messages are read and serialised [`PAGE_READS`] at
//! a time across the service, so what they hold is bounded too.

mod envelope;
mod methods;
mod notifier;
pub mod outbox;

pub use envelope::{
    Call, Frame, Id, MAX_BATCH_CALLS, error_response, parse_call, parse_frame, response,
};
pub use methods::{METHODS, Request, decode, method_label};
pub use notifier::Notifier;

use crate::api::page_limit;
use crate::auth::Scope;
use crate::error::{self, RpcError};
use crate::sessions_api::SessionsApi;
use futures::StreamExt;
use serde_json::json;
use serde_json::value::RawValue;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use troupe_proto::{AgentError, SessionId};

/// Members of one batch running at once.
pub const BATCH_CONCURRENCY: usize = 4;
/// Largest answer to one frame (a call or a whole batch), in bytes.
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// The dispatcher.
#[derive(Clone, Debug)]
pub struct Rpc {
    pub sessions: SessionsApi,
    /// Largest page `messages.list` returns.
    pub max_page: usize,
    /// Pages being read and serialised at once, service-wide (REST and JSON-RPC): with
    /// [`PAGE_READS`] permits, what pages hold in memory is bounded whatever the clients do.
    pub pages: Arc<tokio::sync::Semaphore>,
}

/// Pages of messages read and serialised at once across the service.
pub const PAGE_READS: usize = 4;

impl Rpc {
    pub fn new(sessions: SessionsApi, max_page: usize) -> Self {
        Self {
            sessions,
            max_page,
            pages: Arc::new(tokio::sync::Semaphore::new(PAGE_READS)),
        }
    }

    /// Waits for a turn to read and serialise a page (held until the page is serialised).
    pub async fn page_permit(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.pages.acquire().await.ok()
    }
}

impl Rpc {
    /// Answers one frame, as JSON text; `None` when there is nothing to send back
    /// (notifications only).
    pub async fn handle_frame(
        &self,
        scope: &Scope,
        bytes: &[u8],
        notifier: Option<&Arc<Notifier>>,
    ) -> Option<String> {
        match parse_frame(bytes) {
            Err(e) => {
                metrics_for("unknown", &Err::<(), _>(e.clone()));
                Some(error_response(&Id::NULL, &e))
            }
            Ok(Frame::Single(raw)) => {
                let (id, answer) = self.handle_call(scope, raw, notifier, None).await?;
                Some(if answer.len() > MAX_ANSWER_BYTES {
                    error_response(&id, &too_large(answer.len()))
                } else {
                    answer
                })
            }
            Ok(Frame::Batch(items)) => {
                let over = AtomicBool::new(false);
                // The calls as futures first (they start when polled): a closure in the
                // stream would borrow each member for any lifetime, which `Send` rejects.
                let calls: Vec<_> = items
                    .into_iter()
                    .map(|raw| self.handle_call(scope, raw, notifier, Some(&over)))
                    .collect();
                let mut answers = futures::stream::iter(calls).buffered(BATCH_CONCURRENCY);
                let mut out = String::from("[");
                while let Some(answer) = answers.next().await {
                    let Some((id, answer)) = answer else {
                        continue;
                    };
                    let answer = if over.load(Ordering::Relaxed)
                        || out.len() + answer.len() + 2 > MAX_ANSWER_BYTES
                    {
                        // Past the budget: this member and every later one are answered
                        // -32013; those not started yet are not run, those already running
                        // (at most `BATCH_CONCURRENCY - 1`) finish, and what they did stands.
                        over.store(true, Ordering::Relaxed);
                        error_response(&id, &too_large(answer.len()))
                    } else {
                        answer
                    };
                    if out.len() > 1 {
                        out.push(',');
                    }
                    out.push_str(&answer);
                }
                out.push(']');
                (out.len() > 2).then_some(out)
            }
        }
    }

    /// One member of a frame: its id and its answer, or `None` for a notification. Once
    /// `over` is set (its batch's answer is full), a call is answered without being run.
    async fn handle_call(
        &self,
        scope: &Scope,
        raw: &RawValue,
        notifier: Option<&Arc<Notifier>>,
        over: Option<&AtomicBool>,
    ) -> Option<(Id, String)> {
        let call = match parse_call(raw) {
            Ok(c) => c,
            Err((id, e)) => {
                metrics_for("unknown", &Err::<(), _>(e.clone()));
                let answer = error_response(&id, &e);
                return Some((id, answer));
            }
        };
        if over.is_some_and(|o| o.load(Ordering::Relaxed)) {
            let e = too_large(0);
            metrics_for(method_label(&call.method), &Err::<(), _>(e.clone()));
            let id = call.id?;
            let answer = error_response(&id, &e);
            return Some((id, answer));
        }
        let span = tracing::info_span!("rpc", method = %method_label(&call.method));
        let result = match decode(&call.method, call.params) {
            Ok(request) => {
                tracing::Instrument::instrument(self.call(scope, request, notifier), span).await
            }
            Err(e) => Err(e),
        };
        metrics_for(method_label(&call.method), &result);
        let id = call.id?;
        let answer = match &result {
            Ok(v) => response(&id, v),
            Err(e) => error_response(&id, e),
        };
        Some((id, answer))
    }

    /// Runs one decoded request.
    pub async fn call(
        &self,
        scope: &Scope,
        request: Request,
        notifier: Option<&Arc<Notifier>>,
    ) -> Result<Box<RawValue>, RpcError> {
        let s = &self.sessions;
        let scope = scope.clone();
        Ok(match request {
            Request::SessionCreate(r) => to_json(s.create(scope, r).await?),
            Request::SessionGet { session_id } => to_json(s.get(scope, session_id).await?),
            Request::SessionList { project_id } => to_json(s.list(scope, project_id).await?),
            Request::ConversationOpen { session_id, params } => {
                let id = s.open(scope, session_id, params).await?;
                to_json(json!({ "conversation_id": id }))
            }
            Request::ConversationMessage { session_id, send } => to_json(
                s.send(
                    scope,
                    session_id,
                    send.conversation_id,
                    send.text.clone(),
                    send.wait,
                    send.options(),
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
                to_json(json!({}))
            }
            Request::ConversationList { session_id } => {
                to_json(s.conversations(scope, session_id).await?)
            }
            Request::ConversationStats {
                session_id,
                conversation_id,
            } => to_json(
                s.conversation_stats(scope, session_id, conversation_id)
                    .await?,
            ),
            Request::ConversationCancelAll {
                session_id,
                conversation_id,
            } => {
                let cancelled = s.cancel_all(scope, session_id, conversation_id).await?;
                to_json(json!({ "cancelled": cancelled }))
            }
            Request::ConversationCompact {
                session_id,
                conversation_id,
            } => to_json(s.compact(scope, session_id, conversation_id).await?),
            Request::TaskCancel {
                session_id,
                task_id,
            } => {
                let handle = s.session(scope, session_id).await?;
                to_json(handle.cancel_task(task_id).await?)
            }
            Request::AgentsList { session_id } => to_json(s.agents(scope, session_id).await?),
            Request::ModulesList => to_json(s.list_modules(&scope).await),
            Request::TokensIssue(request) => to_json(s.issue_token(&scope, request).await?),
            Request::TokensList => to_json(s.tokens(&scope).await?),
            Request::TokensRevoke { id } => to_json(s.revoke_token(&scope, id).await?),
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
                to_json(json!({}))
            }
            Request::MessagesList {
                session_id,
                limit,
                before,
            } => {
                let limit = page_limit(limit, self.max_page)?;
                let _permit = self.page_permit().await;
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
                to_json(json!({ "subscription": id }))
            }
            Request::EventsUnsubscribe { subscription } => {
                let notifier = notifier.ok_or_else(streaming_only)?;
                to_json(json!({ "unsubscribed": notifier.remove(subscription) }))
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
        let events = self.sessions.events(scope, session_id, after).await?;
        Ok(notifier.forward(events))
    }
}

fn metrics_for<T>(method: &'static str, result: &Result<T, RpcError>) {
    crate::metrics::rpc_call(method, outcome_label(result));
}

fn streaming_only() -> RpcError {
    RpcError::new(
        error::METHOD_NOT_FOUND,
        "events.subscribe and events.unsubscribe need a streaming transport (WebSocket /rpc/ws or stdio)",
    )
}

/// A result as JSON text, serialised once (never through a `Value`).
fn to_json<T: serde::Serialize>(value: T) -> Box<RawValue> {
    serde_json::value::to_raw_value(&value).unwrap_or_else(|e| {
        tracing::error!(error = %e, "an answer did not serialise");
        RawValue::NULL.to_owned()
    })
}

fn too_large(bytes: usize) -> RpcError {
    RpcError::new(
        error::ANSWER_TOO_LARGE,
        format!(
            "answer too large: the answers to one request may hold {MAX_ANSWER_BYTES} bytes; \
             this one would pass it ({bytes} bytes for this call, 0 when it was not run); ask for less (smaller pages, \
             fewer calls per batch)"
        ),
    )
}

/// Every value [`outcome_label`] gives (the known values of the metric label).
pub const OUTCOMES: [&str; 8] = [
    "ok",
    "parse_error",
    "invalid_request",
    "method_not_found",
    "invalid_params",
    "internal",
    "answer_too_large",
    "application_error",
];

fn outcome_label<T>(result: &Result<T, RpcError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => match e.code {
            error::PARSE_ERROR => "parse_error",
            error::INVALID_REQUEST => "invalid_request",
            error::METHOD_NOT_FOUND => "method_not_found",
            error::INVALID_PARAMS => "invalid_params",
            error::INTERNAL_ERROR => "internal",
            error::ANSWER_TOO_LARGE => "answer_too_large",
            _ => "application_error",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    }
}
