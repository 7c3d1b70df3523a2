//! The HTTP routes that are neither REST nor WebSocket: `POST /rpc`, `/healthz`, `/readyz`
//! and `/metrics`.

use crate::auth::Scope;
use crate::error::ApiError;
use crate::extract::body;
use crate::state::AppState;
use crate::supervisor::Health;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// `POST /rpc`: one call or a batch; 204 when only notifications were sent.
pub async fn rpc(
    State(app): State<AppState>,
    axum::Extension(scope): axum::Extension<Scope>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body(bytes, app.body_limit)?;
    Ok(match app.rpc.handle_frame(&scope, &bytes, None).await {
        Some(answer) => (
            [(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            )],
            answer,
        )
            .into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

/// Alive: every component runs or is being restarted. 503 with the reason once one could
/// not be recovered (the process is about to exit non-zero).
pub async fn healthz(State(app): State<AppState>) -> Response {
    match &*app.rpc.sessions.health().borrow() {
        Health::Ok => axum::Json(serde_json::json!({"status": "ok"})).into_response(),
        Health::Failed { component, reason } => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({
                "status": "failed",
                "component": component,
                "reason": reason,
            })),
        )
            .into_response(),
    }
}

/// Ready: the store answers, the registry is up, and the service is not shutting down.
pub async fn readyz(State(app): State<AppState>) -> Response {
    if app.shutdown.is_cancelled() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "shutting_down"})),
        )
            .into_response();
    }
    match app.rpc.sessions.ready().await {
        Ok(()) => axum::Json(serde_json::json!({"status": "ready"})).into_response(),
        Err(e) => {
            let mut r = ApiError::from(e);
            r.status = StatusCode::SERVICE_UNAVAILABLE;
            r.into_response()
        }
    }
}

/// Prometheus text format.
pub async fn metrics(State(app): State<AppState>) -> Response {
    match &app.prometheus {
        Some(handle) => {
            // A waiting request ages with nothing to tell of it: its age is taken now.
            troupe_actors::scheduler::metrics::publish_oldest_wait();
            (
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                handle.render(),
            )
                .into_response()
        }
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no metrics recorder is installed in this process",
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use crate::{ExtraRoutes, Service};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    use troupe_proto::AgentError;
    use troupe_proto::store::{
        A2aContextRecord, A2aPruned, A2aPushRecord, A2aTaskPage, A2aTaskQuery, A2aTaskRecord,
        ConversationRecord, FinishMessage, FinishedMessage, MessagePage, MessageRecord, NewMessage,
        SessionRecord, SessionStatus,
    };
    use troupe_proto::{ConversationId, SessionId};
    use troupe_runtime::config::TroupeConfig;

    /// The memory store, whose ping never answers once `hang` is set (a database server that
    /// accepts and then says nothing).
    struct SlowPing {
        store: troupe_store::memory::MemoryStore,
        hang: Arc<AtomicBool>,
    }

    #[async_trait::async_trait]
    impl troupe_store::BindingStore for SlowPing {
        async fn put_binding(
            &self,
            binding: troupe_proto::agent::AgentBinding,
        ) -> Result<(), AgentError> {
            self.store.put_binding(binding).await
        }
        async fn bindings(
            &self,
            session_id: Option<troupe_proto::SessionId>,
        ) -> Result<Vec<troupe_proto::agent::AgentBinding>, AgentError> {
            self.store.bindings(session_id).await
        }
        async fn remove_binding(
            &self,
            session_id: troupe_proto::SessionId,
            agent_id: &str,
        ) -> Result<(), AgentError> {
            self.store.remove_binding(session_id, agent_id).await
        }
    }

    #[async_trait::async_trait]
    impl troupe_store::TokenStore for SlowPing {
        async fn insert_token(
            &self,
            token: troupe_proto::governance::AuthToken,
        ) -> Result<(), AgentError> {
            self.store.insert_token(token).await
        }
        async fn token_by_digest(
            &self,
            digest: &str,
        ) -> Result<Option<troupe_proto::governance::AuthToken>, AgentError> {
            self.store.token_by_digest(digest).await
        }
        async fn use_token(&self, id: &str, uses: u32, now_ms: u64) -> Result<bool, AgentError> {
            self.store.use_token(id, uses, now_ms).await
        }
        async fn revoke_token(
            &self,
            id: &str,
            at_ms: u64,
        ) -> Result<Option<troupe_proto::governance::AuthToken>, AgentError> {
            self.store.revoke_token(id, at_ms).await
        }
        async fn tokens(&self) -> Result<Vec<troupe_proto::governance::AuthToken>, AgentError> {
            self.store.tokens().await
        }
    }

    #[async_trait::async_trait]
    impl troupe_store::Store for SlowPing {
        async fn create_session(&self, session: SessionRecord) -> Result<(), AgentError> {
            self.store.create_session(session).await
        }
        async fn get_session(
            &self,
            session_id: SessionId,
        ) -> Result<Option<SessionRecord>, AgentError> {
            self.store.get_session(session_id).await
        }
        async fn all_sessions(&self) -> Result<Vec<SessionRecord>, AgentError> {
            self.store.all_sessions().await
        }
        async fn project_sessions(
            &self,
            project_id: &str,
        ) -> Result<Vec<SessionRecord>, AgentError> {
            self.store.project_sessions(project_id).await
        }
        async fn put_conversation(
            &self,
            conversation: ConversationRecord,
        ) -> Result<(), AgentError> {
            self.store.put_conversation(conversation).await
        }
        async fn close_conversation(
            &self,
            conversation_id: ConversationId,
            closed_ms: u64,
        ) -> Result<(), AgentError> {
            self.store
                .close_conversation(conversation_id, closed_ms)
                .await
        }
        async fn conversations(
            &self,
            session_id: SessionId,
        ) -> Result<Vec<ConversationRecord>, AgentError> {
            self.store.conversations(session_id).await
        }
        async fn open_conversations(
            &self,
            session_id: SessionId,
        ) -> Result<Vec<ConversationRecord>, AgentError> {
            self.store.open_conversations(session_id).await
        }
        async fn conversation(
            &self,
            conversation_id: ConversationId,
        ) -> Result<Option<ConversationRecord>, AgentError> {
            self.store.conversation(conversation_id).await
        }
        async fn append_message(&self, message: NewMessage) -> Result<MessageRecord, AgentError> {
            self.store.append_message(message).await
        }
        async fn message(&self, message_id: u64) -> Result<Option<MessageRecord>, AgentError> {
            self.store.message(message_id).await
        }
        async fn start_message(&self, message_id: u64) -> Result<MessageRecord, AgentError> {
            self.store.start_message(message_id).await
        }
        async fn finish_message(
            &self,
            finish: FinishMessage,
        ) -> Result<FinishedMessage, AgentError> {
            self.store.finish_message(finish).await
        }
        async fn pending_messages(
            &self,
            session_id: SessionId,
        ) -> Result<Vec<MessageRecord>, AgentError> {
            self.store.pending_messages(session_id).await
        }
        async fn sessions_with_pending_messages(&self) -> Result<Vec<SessionId>, AgentError> {
            self.store.sessions_with_pending_messages().await
        }
        async fn messages(
            &self,
            session_id: SessionId,
            limit: usize,
            max_bytes: usize,
            before: Option<u64>,
        ) -> Result<MessagePage, AgentError> {
            self.store
                .messages(session_id, limit, max_bytes, before)
                .await
        }
        async fn sweep_due(&self, now_ms: u64) -> Result<u64, AgentError> {
            self.store.sweep_due(now_ms).await
        }
        async fn set_current_session(
            &self,
            project_id: &str,
            session_id: SessionId,
        ) -> Result<(), AgentError> {
            self.store.set_current_session(project_id, session_id).await
        }
        async fn current_session(&self, project_id: &str) -> Result<Option<SessionId>, AgentError> {
            self.store.current_session(project_id).await
        }
        async fn set_session_status(
            &self,
            session_id: SessionId,
            status: SessionStatus,
            at_ms: u64,
        ) -> Result<(), AgentError> {
            self.store
                .set_session_status(session_id, status, at_ms)
                .await
        }
        async fn ping(&self) -> Result<(), AgentError> {
            if self.hang.load(std::sync::atomic::Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            self.store.ping().await
        }
        async fn put_a2a_context(&self, context: A2aContextRecord) -> Result<(), AgentError> {
            self.store.put_a2a_context(context).await
        }
        async fn a2a_context(
            &self,
            context_id: &str,
        ) -> Result<Option<A2aContextRecord>, AgentError> {
            self.store.a2a_context(context_id).await
        }
        async fn a2a_open_contexts(&self) -> Result<Vec<A2aContextRecord>, AgentError> {
            self.store.a2a_open_contexts().await
        }
        async fn put_a2a_task(&self, task: A2aTaskRecord) -> Result<(), AgentError> {
            self.store.put_a2a_task(task).await
        }
        async fn a2a_task(&self, task_id: &str) -> Result<Option<A2aTaskRecord>, AgentError> {
            self.store.a2a_task(task_id).await
        }
        async fn a2a_live_tasks(&self) -> Result<Vec<A2aTaskRecord>, AgentError> {
            self.store.a2a_live_tasks().await
        }
        async fn a2a_tasks(&self, query: A2aTaskQuery) -> Result<A2aTaskPage, AgentError> {
            self.store.a2a_tasks(query).await
        }
        async fn put_a2a_push(&self, push: A2aPushRecord) -> Result<(), AgentError> {
            self.store.put_a2a_push(push).await
        }
        async fn delete_a2a_push(
            &self,
            task_id: &str,
            config_id: &str,
        ) -> Result<bool, AgentError> {
            self.store.delete_a2a_push(task_id, config_id).await
        }
        async fn a2a_pushes(&self, task_id: &str) -> Result<Vec<A2aPushRecord>, AgentError> {
            self.store.a2a_pushes(task_id).await
        }
        async fn prune_a2a(&self, keep_finished: usize) -> Result<A2aPruned, AgentError> {
            self.store.prune_a2a(keep_finished).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn readyz_answers_503_once_the_store_does_not_answer_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let config = TroupeConfig {
            data_dir: dir.path().to_owned(),
            ..TroupeConfig::default()
        };
        let ports = troupe_runtime::assembly::session_ports(
            &config,
            Arc::new(troupe_runtime::ScriptedModel::default()),
            Arc::new(troupe_actors::ports::ApproxTokens),
        );
        let hang = Arc::new(AtomicBool::new(false));
        let store = Arc::new(SlowPing {
            store: troupe_store::memory::MemoryStore::new(),
            hang: hang.clone(),
        });
        let service = Service::start(&config, store, ports, None).await.unwrap();
        let app = service.router(ExtraRoutes::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/readyz", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let http = reqwest::Client::new();
        let readyz = || async {
            let r = http.get(&url).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap())
        };
        assert_eq!(readyz().await.0, 200);

        hang.store(true, Ordering::SeqCst);
        let asked = tokio::time::Instant::now();
        // Bounded: without a bound of its own, /readyz would never answer.
        let (status, body) = tokio::time::timeout(Duration::from_secs(10), readyz())
            .await
            .expect("/readyz answered");
        let waited = asked.elapsed();
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["code"], "timeout", "{body}");
        assert_eq!(
            body["message"],
            "timed out after 2000 ms: the store did not answer its ping"
        );
        assert!(
            waited >= crate::sessions_api::PING_WITHIN && waited < Duration::from_secs(3),
            "{waited:?}"
        );

        hang.store(false, Ordering::SeqCst);
        assert_eq!(readyz().await.0, 200, "ready again once it answers");
        service.shutdown().await;
    }
}
