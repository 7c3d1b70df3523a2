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
//! members run concurrently; notifications (no `id`) get no response; a batch of
//! notifications answers nothing at all.

mod envelope;
mod methods;
mod notifier;

pub use envelope::{Call, Frame, error_response, parse_call, parse_frame, response};
pub use methods::{METHODS, Request, decode, method_label};
pub use notifier::Notifier;

use crate::api::page_limit;
use crate::auth::Scope;
use crate::error::{self, RpcError};
use crate::sessions_api::SessionsApi;
use serde_json::{Value, json};
use std::sync::Arc;
use troupe_proto::{AgentError, SessionId};

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
            } => to_json(
                s.conversation_stats(scope, session_id, conversation_id)
                    .await?,
            ),
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
        let events = self.sessions.events(scope, session_id, after).await?;
        Ok(notifier.forward(events))
    }
}

fn metrics_for(method: &'static str, result: &Result<Value, RpcError>) {
    crate::metrics::rpc_call(method, outcome_label(result));
}

fn streaming_only() -> RpcError {
    RpcError::new(
        error::METHOD_NOT_FOUND,
        "events.subscribe and events.unsubscribe need a streaming transport (WebSocket /rpc/ws or stdio)",
    )
}

fn to_json<T: serde::Serialize>(value: T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

fn outcome_label(result: &Result<Value, RpcError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => match e.code {
            error::PARSE_ERROR => "parse_error",
            error::INVALID_REQUEST => "invalid_request",
            error::METHOD_NOT_FOUND => "method_not_found",
            error::INVALID_PARAMS => "invalid_params",
            error::INTERNAL_ERROR => "internal",
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
