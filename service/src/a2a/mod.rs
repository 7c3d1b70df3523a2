//! The A2A protocol endpoint (P5): an agent card and the JSON-RPC binding of A2A 1.0, with
//! the 0.3 method names and shapes for clients that send no `A2A-Version` header.
//!
//! ```text
//! GET  /.well-known/agent-card.json   card (public; 1.0, or 0.3 with `A2A-Version: 0.3`)
//! GET  /.well-known/agent.json        the 0.3 card (public)
//! POST /a2a (or /a2a/)                JSON-RPC: SendMessage, SendStreamingMessage (SSE),
//!                                     GetTask, ListTasks, CancelTask, SubscribeToTask (SSE)
//!                                     0.3: message/send, message/stream, tasks/get,
//!                                     tasks/cancel, tasks/resubscribe
//!        │
//!        ▼
//! A2aSupervisor → A2aTasks actor (TaskBook: the live contexts and tasks)
//!        │  open / reopen / close / message / cancel / respond_approval / events
//!        ├──────────────▶ A2aBackend (the session every A2A context runs in)
//!        │ changes, in order
//!        ▼
//! Persister ──▶ Store (a2a_contexts, a2a_tasks, a2a_push_configs)
//!                 ▲ finished tasks, idle contexts: read by the handlers
//! ```
//!
//! A context is a conversation of that session (a context the server names has the
//! conversation's id); each message starts one A2A task, run by one troupe task; tasks of a
//! context run one after another. Every context, task and push config is stored, so a restart
//! (or a failure of the actor, which its supervisor ([`supervisor`]) replaces) loses none:
//! memory holds only what is live. A context's conversation is closed once idle for
//! `idle_close` and reopened, with its history, on its next message; the store keeps the
//! newest `keep_finished` finished tasks.

mod backend;
mod book;
pub mod card;
pub mod error;
pub mod events;
mod http;
pub mod metrics;
pub mod mount;
pub mod persist;
pub mod push;
pub mod reply;
pub mod request;
pub mod supervisor;
mod tasks;
pub mod version;
pub mod wire;
pub mod wire_v03;
pub mod wire_v1;

/// A2A's data model: shared with the client of remote agents (`troupe_a2a`).
pub use troupe_a2a::model;

pub use backend::A2aBackend;
pub use book::TaskBook;
pub use card::CardInfo;
pub use error::A2aError;
pub use http::{Call, VERSION_HEADER, parse_call};
pub use tasks::{A2aTasks, A2aTasksArgs, A2aTasksMsg, TasksConfig};

use axum::Router;
use axum::routing::{get, post};
use ractor::{Actor, ActorRef};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use troupe_proto::AgentError;
use troupe_store::Store;

/// Where the agent card is served (spec 8.2).
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

/// Where 0.2/0.3-era clients look for the card: the 0.3 card is served there.
pub const LEGACY_CARD_PATH: &str = "/.well-known/agent.json";

/// How the endpoint is set up.
#[derive(Debug, Clone)]
pub struct A2aConfig {
    pub card: CardInfo,
    /// The JSON-RPC route.
    pub rpc_path: String,
    /// Absolute URL of the JSON-RPC endpoint for the card; from the request's Host if `None`.
    pub public_url: Option<String>,
    pub tasks: TasksConfig,
    /// Longest a blocking SendMessage waits before answering with the task as it is.
    pub blocking_wait: Duration,
    /// Longest a CancelTask waits for the task to stop before answering.
    pub cancel_wait: Duration,
}

impl Default for A2aConfig {
    fn default() -> Self {
        Self {
            card: CardInfo::default(),
            rpc_path: "/a2a".into(),
            public_url: None,
            tasks: TasksConfig::default(),
            blocking_wait: Duration::from_secs(600),
            cancel_wait: Duration::from_secs(10),
        }
    }
}

/// A running A2A endpoint.
pub struct A2a {
    state: http::A2aState,
    supervisor: ActorRef<supervisor::A2aSupervisorMsg>,
    join: JoinHandle<()>,
}

impl std::fmt::Debug for A2a {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2a")
            .field("rpc_path", &self.state.rpc_path)
            .finish_non_exhaustive()
    }
}

impl A2a {
    /// Starts the endpoint's actor over `backend`, its records in `store`, under its
    /// supervisor; `give_up` is called if the actor keeps failing and is left down.
    pub async fn start(
        backend: Arc<dyn A2aBackend>,
        store: Arc<dyn Store>,
        config: A2aConfig,
        give_up: Option<supervisor::GiveUp>,
    ) -> Result<Self, AgentError> {
        metrics::describe();
        let persister = persist::Persister::start(store.clone());
        let (tasks_tx, tasks) = tokio::sync::watch::channel(None);
        let (supervisor, join) = Actor::spawn(
            None,
            supervisor::A2aSupervisor,
            supervisor::A2aSupervisorArgs {
                backend,
                store: store.clone(),
                persister,
                config: config.tasks,
                tasks_tx,
                give_up,
            },
        )
        .await
        .map_err(|e| AgentError::internal(format!("a2a endpoint failed to start: {e}")))?;
        Ok(Self {
            supervisor,
            state: http::A2aState {
                tasks,
                store,
                card: Arc::new(config.card),
                public_url: config.public_url.map(Arc::from),
                rpc_path: Arc::from(config.rpc_path),
                blocking_wait: config.blocking_wait,
                cancel_wait: config.cancel_wait,
                card_modified: http::whole_seconds(std::time::SystemTime::now()),
            },
            join,
        })
    }

    /// The public route: the agent card.
    pub fn card_router(&self) -> Router {
        Router::new()
            .route(CARD_PATH, get(http::card))
            .route(LEGACY_CARD_PATH, get(http::legacy_card))
            .with_state(self.state.clone())
    }

    /// The JSON-RPC route; the service wraps it in its authentication.
    /// Served with and without a trailing slash: clients that build their HTTP client from
    /// the card's URL as a base post to `/a2a/`.
    pub fn rpc_router(&self) -> Router {
        let path = self.state.rpc_path.trim_end_matches('/');
        let router = Router::new().route(&format!("{path}/"), post(http::rpc));
        let router = if path.is_empty() {
            router
        } else {
            router.route(path, post(http::rpc))
        };
        router.with_state(self.state.clone())
    }

    /// Both routes, unauthenticated.
    pub fn router(&self) -> Router {
        self.card_router().merge(self.rpc_router())
    }

    /// The current tasks actor, if one runs (tests, drills).
    pub fn actor(&self) -> Option<ActorRef<A2aTasksMsg>> {
        self.state.tasks.borrow().clone()
    }

    /// The supervisor (fault injection in tests and drills).
    pub fn supervisor(&self) -> &ActorRef<supervisor::A2aSupervisorMsg> {
        &self.supervisor
    }

    /// Stops the actor and its supervisor; open streams end.
    pub async fn stop(self) {
        self.supervisor.stop(None);
        let _ = self.join.await;
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_durable;
#[cfg(test)]
mod tests_replies;
