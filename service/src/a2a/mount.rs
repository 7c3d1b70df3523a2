//! The A2A endpoint inside `troupe serve`: every A2A context runs in the current session of
//! one project (`[server.a2a] project`, created on the first A2A call), reached through the
//! Sessions registry so that A2A messages are stored like any other (the user message before
//! the task starts, the reply when it ends) and drained on shutdown.
//!
//! The card is public; `POST /a2a` sits behind the service's bearer-token check, and a token
//! must be bound to the A2A project (or `*`) to use it: other tokens get 403.

use super::{A2a, A2aBackend, A2aConfig, CardInfo};
use crate::ExtraRoutes;
use crate::api::CreateSession;
use crate::auth::Scope;
use crate::error::ApiError;
use crate::sessions_api::SessionsApi;
use async_trait::async_trait;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use tokio::sync::OnceCell;
use troupe_actors::rollout::stream::EventStream;
use troupe_proto::{
    AgentError, ApprovalDecision, ApprovalId, ConversationId, MessageReply, OpenConversation,
    SessionId, TaskId,
};
use troupe_runtime::config::A2aServerConfig;

/// An [`A2aBackend`] over one session of the registry: the project's current session, found
/// (or created and made current) on the first call, so a service that never sees A2A traffic
/// has no A2A session.
#[derive(Debug, Clone)]
pub struct RegistryBackend {
    sessions: SessionsApi,
    project: Arc<str>,
    session: Arc<OnceCell<SessionId>>,
}

impl RegistryBackend {
    pub fn new(sessions: SessionsApi, project: &str) -> Self {
        Self {
            sessions,
            project: Arc::from(project),
            session: Arc::new(OnceCell::new()),
        }
    }

    /// The A2A session's id (finding or creating it).
    pub async fn session_id(&self) -> Result<SessionId, AgentError> {
        self.session
            .get_or_try_init(|| current_or_new(&self.sessions, &self.project))
            .await
            .copied()
    }

    async fn handle(&self) -> Result<troupe_actors::SessionHandle, AgentError> {
        let session_id = self.session_id().await?;
        self.sessions.session(Scope::All, session_id).await
    }
}

/// The project's current session, created (and made current) when it has none.
async fn current_or_new(sessions: &SessionsApi, project: &str) -> Result<SessionId, AgentError> {
    match sessions.current(Scope::All, project.to_owned()).await {
        Ok(record) => Ok(record.session_id),
        Err(AgentError::NotFound { .. }) => {
            let record = sessions
                .create(
                    Scope::All,
                    CreateSession {
                        project_id: Some(project.to_owned()),
                        title: Some("A2A".into()),
                        settings: None,
                        root: None,
                    },
                )
                .await?;
            sessions
                .set_current(Scope::All, project.to_owned(), record.session_id)
                .await?;
            tracing::info!(session_id = %record.session_id, project, "created the A2A session");
            Ok(record.session_id)
        }
        Err(e) => Err(e),
    }
}

#[async_trait]
impl A2aBackend for RegistryBackend {
    async fn session_id(&self) -> Result<SessionId, AgentError> {
        RegistryBackend::session_id(self).await
    }

    async fn open(&self, params: OpenConversation) -> Result<ConversationId, AgentError> {
        let session_id = self.session_id().await?;
        self.sessions.open(Scope::All, session_id, params).await
    }

    /// The stored record's parameters reopen it (`_params` are what it was opened with).
    async fn reopen(
        &self,
        conversation_id: ConversationId,
        _params: OpenConversation,
    ) -> Result<(), AgentError> {
        let session_id = self.session_id().await?;
        self.sessions
            .reopen(Scope::All, session_id, conversation_id)
            .await
    }

    async fn close(&self, conversation_id: ConversationId) -> Result<(), AgentError> {
        let session_id = self.session_id().await?;
        self.sessions
            .close(Scope::All, session_id, conversation_id)
            .await
            .map(drop)
    }

    async fn cancel_conversation(&self, conversation_id: ConversationId) -> Result<(), AgentError> {
        let session_id = self.session_id().await?;
        self.sessions
            .cancel_all(Scope::All, session_id, conversation_id)
            .await
            .map(drop)
    }

    async fn message(
        &self,
        conversation_id: ConversationId,
        text: String,
    ) -> Result<MessageReply, AgentError> {
        let session_id = self.session_id().await?;
        let sent = self
            .sessions
            .send_from_peer(Scope::All, session_id, Some(conversation_id), text, true)
            .await?;
        sent.reply
            .ok_or_else(|| AgentError::internal("the registry answered without the task's reply"))
    }

    async fn cancel_task(&self, task_id: TaskId) -> Result<(), AgentError> {
        self.handle().await?.cancel_task(task_id).await.map(|_| ())
    }

    async fn respond_approval(
        &self,
        approval_id: ApprovalId,
        decision: ApprovalDecision,
    ) -> Result<(), AgentError> {
        self.handle()
            .await?
            .respond_approval(approval_id, decision)
            .await
    }

    async fn pending_approvals(&self) -> Result<Vec<troupe_proto::PendingApproval>, AgentError> {
        self.handle().await?.pending_approvals().await
    }

    async fn events(&self, after_seq: Option<u64>) -> Result<EventStream, AgentError> {
        let handle = self.handle().await?;
        A2aBackend::events(&handle, after_seq).await
    }
}

/// Starts the endpoint over the registry, each context's conversation opened with
/// `conversation`; `bearer_auth`: the card says requests need a token.
/// `extended_skills`: what the extended card adds for authenticated clients.
pub async fn mount(
    sessions: SessionsApi,
    config: &A2aServerConfig,
    conversation: troupe_proto::OpenConversation,
    bearer_auth: bool,
    extended_skills: Vec<serde_json::Value>,
) -> Result<(A2a, ExtraRoutes), AgentError> {
    let backend = RegistryBackend::new(sessions.clone(), &config.project);
    let store = sessions.store().clone();
    let give_up: super::supervisor::GiveUp =
        Arc::new(move |reason| sessions.report_failure("a2a", reason));
    let endpoint = A2a::start(
        Arc::new(backend),
        store,
        A2aConfig {
            card: CardInfo {
                name: config.name.clone(),
                bearer_auth,
                extended_skills,
                ..CardInfo::default()
            },
            public_url: config.public_url.clone(),
            tasks: super::TasksConfig {
                idle_close: config.idle_close,
                keep_finished: config.keep_finished,
                open: conversation,
                ..super::TasksConfig::default()
            },
            ..A2aConfig::default()
        },
        Some(give_up),
    )
    .await?;
    let project: Arc<str> = Arc::from(config.project.as_str());
    let routes = ExtraRoutes {
        public: endpoint.card_router(),
        protected: endpoint
            .rpc_router()
            .route_layer(middleware::from_fn_with_state(project, require_project)),
    };
    Ok((endpoint, routes))
}

/// 403 unless the caller's token reaches the A2A project (runs after the token check, which
/// put the caller's scope into the request).
async fn require_project(State(project): State<Arc<str>>, req: Request, next: Next) -> Response {
    let allowed = req
        .extensions()
        .get::<Scope>()
        .is_some_and(|scope| scope.sees(Some(&project)));
    if allowed {
        next.run(req).await
    } else {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token is not bound to the A2A project `{project}`"),
        )
        .into_response()
    }
}
