//! `SessionsApi`: the typed front door every transport (JSON-RPC, REST, A2A) uses.
//!
//! Reads that need no running session (a session's record, the listings, a page of messages,
//! the current session of a project) go straight to the store, with the caller's scope
//! checked; nothing is activated for them. Work on a session goes to its host through the
//! current registry, which the supervisor publishes: a registry restart is followed at once.

use super::api::{CreateSession, Sent};
use super::auth::Scope;
use super::host::HostMsg;
use super::registry::{RegistryArgs, RegistryMsg, visible};
use super::stream::{self, StreamEvent};
use super::supervisor::{Health, ServiceSupervisor, SupervisorArgs, SupervisorMsg};
use futures::Stream;
use ractor::{Actor, ActorRef, RactorErr};
use std::sync::Arc;
use tokio::sync::watch;
use troupe_actors::SessionHandle;
use troupe_actors::token_book::TokenBookMsg;
use troupe_proto::agent::AgentListing;
use troupe_proto::governance::{IssueToken, IssuedToken, TokenInfo};
use troupe_proto::store::{
    ConversationRecord, MAX_PAGE_BYTES, MessagePage, MessageRecord, SessionRecord,
};
use troupe_proto::{
    AgentError, Closed, ConversationId, ConversationStats, OpenConversation, SessionId, SetContext,
};
use troupe_store::Store;

/// The service's sessions, as the transports see them. Cheap to clone.
#[derive(Clone)]
pub struct SessionsApi {
    store: Arc<dyn Store>,
    supervisor: ActorRef<SupervisorMsg>,
    /// A node of a cluster: its current lease keeper.
    lease_keeper: Option<super::lease_keeper::KeeperRef>,
    registry: watch::Receiver<Option<ActorRef<RegistryMsg>>>,
    health: watch::Receiver<Health>,
    /// The agents every session runs (`None`: no definition loaded).
    agents: Option<troupe_actors::agents::AgentPorts>,
    /// The authorization tokens of the service, over its store (A5).
    token_book: ActorRef<TokenBookMsg>,
    /// The process's modules (A10), set once at start.
    modules: Arc<std::sync::OnceLock<crate::modules::Modules>>,
    /// The agent files that did not load when none did (see [`Self::agents`]).
    agent_errors: Arc<std::sync::OnceLock<Vec<troupe_proto::agent::AgentLoadError>>>,
}

impl std::fmt::Debug for SessionsApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionsApi").finish_non_exhaustive()
    }
}

fn gone<T>(what: &str) -> impl FnOnce(RactorErr<T>) -> AgentError + '_ {
    move |e| AgentError::internal(format!("{what} unavailable: {e}"))
}

macro_rules! host_call {
    ($host:expr, $variant:ident { $($field:ident),* }) => {
        ractor::call!($host, |reply| HostMsg::$variant { $($field,)* reply })
            .map_err(gone("session host"))?
    };
}

/// The end of a message's task ([`SessionsApi::send_tracked`]).
#[derive(Debug)]
pub struct TaskEnd(tokio::sync::oneshot::Receiver<Result<Sent, AgentError>>);

impl TaskEnd {
    /// The task's reply, once it ended.
    pub async fn wait(self) -> Result<Sent, AgentError> {
        self.0
            .await
            .unwrap_or_else(|_| Err(AgentError::interrupted("the session host stopped")))
    }
}

impl std::future::IntoFuture for TaskEnd {
    type Output = Result<Sent, AgentError>;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Self::Output> + Send>>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.wait())
    }
}

impl SessionsApi {
    /// Starts the service's actors (the supervisor and its registry) over `store`.
    pub async fn start(args: RegistryArgs) -> Result<Self, AgentError> {
        Self::start_with_keeper(args, None).await
    }

    /// [`Self::start`] on a node of a cluster: the supervisor also runs its lease keeper.
    pub async fn start_with_keeper(
        mut args: RegistryArgs,
        keeper: Option<super::supervisor::KeeperSpec>,
    ) -> Result<Self, AgentError> {
        super::metrics::service_series_start_at_zero();
        let store = args.store.clone();
        // One book for the service: every session's tool calls are counted by it.
        let token_book = troupe_actors::token_book::spawn(store.clone()).await?;
        args.template.config.conversation.token_book = Some(token_book.clone());
        let agents = args.template.ports.agents.clone();
        let (registry_tx, registry) = watch::channel(None);
        let (health_tx, health) = watch::channel(Health::Ok);
        let lease_keeper = keeper
            .as_ref()
            .map(|k| super::lease_keeper::KeeperRef::new(k.tx.subscribe()));
        let (supervisor, _) = Actor::spawn(
            None,
            ServiceSupervisor,
            SupervisorArgs {
                registry: args,
                registry_tx,
                health_tx,
                keeper,
            },
        )
        .await
        .map_err(|e| AgentError::internal(format!("service failed to start: {e}")))?;
        Ok(Self {
            store,
            supervisor,
            registry,
            health,
            agents,
            token_book,
            modules: Arc::default(),
            agent_errors: Arc::default(),
            lease_keeper,
        })
    }

    /// Issues an authorization token (A5): only a caller that sees every project may.
    pub async fn issue_token(
        &self,
        scope: &Scope,
        request: IssueToken,
    ) -> Result<IssuedToken, AgentError> {
        Self::may_manage_tokens(scope)?;
        ractor::call!(self.token_book, |reply| TokenBookMsg::Issue {
            request,
            reply
        })
        .map_err(gone("token book"))?
    }

    /// Every authorization token, newest first (never their secrets).
    pub async fn tokens(&self, scope: &Scope) -> Result<Vec<TokenInfo>, AgentError> {
        Self::may_manage_tokens(scope)?;
        troupe_actors::token_book::list(&self.token_book).await
    }

    /// Revokes an authorization token by id.
    pub async fn revoke_token(&self, scope: &Scope, id: String) -> Result<TokenInfo, AgentError> {
        Self::may_manage_tokens(scope)?;
        troupe_actors::token_book::revoke(&self.token_book, id).await
    }

    /// Tokens authorize calls in every session: managing them takes a view of every project.
    fn may_manage_tokens(scope: &Scope) -> Result<(), AgentError> {
        match scope {
            Scope::All => Ok(()),
            Scope::Projects(_) => Err(AgentError::PolicyRejected {
                reason: troupe_proto::agent::PolicyReason::Unauthorized,
                chain: Vec::new(),
                message: "managing authorization tokens takes an API token that sees every project (\"*\")".into(),
            }),
        }
    }

    /// The store the service keeps its sessions in.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The service's health, as its supervisor publishes it.
    pub fn health(&self) -> watch::Receiver<Health> {
        self.health.clone()
    }

    /// The supervisor (fault injection in tests and drills).
    pub fn supervisor(&self) -> &ActorRef<SupervisorMsg> {
        &self.supervisor
    }

    /// Marks the service as failed because `component` could not be recovered.
    pub fn report_failure(&self, component: &'static str, reason: String) {
        let _ = self
            .supervisor
            .cast(SupervisorMsg::ComponentFailed { component, reason });
    }

    /// The current registry, if one runs (observation: tests and drills follow its restarts).
    pub fn current_registry(&self) -> Option<ActorRef<RegistryMsg>> {
        self.registry.borrow().clone()
    }

    /// The current lease keeper, on a node of a cluster (observation: tests and drills).
    pub fn current_lease_keeper(&self) -> Option<ActorRef<super::lease_keeper::LeaseKeeperMsg>> {
        self.lease_keeper.as_ref().and_then(|k| k.now())
    }

    fn registry(&self) -> Result<ActorRef<RegistryMsg>, AgentError> {
        self.registry
            .borrow()
            .clone()
            .ok_or_else(|| match &*self.health.borrow() {
                Health::Failed { reason, .. } => AgentError::internal(reason.clone()),
                Health::Ok => AgentError::internal("sessions registry restarting"),
            })
    }

    /// Another node took this session over: its host stops here.
    pub(crate) fn lease_lost(&self, session_id: troupe_proto::SessionId) {
        if let Ok(registry) = self.registry() {
            let _ = registry.cast(RegistryMsg::LeaseLost { session_id });
        }
    }

    /// The host of a session the scope sees, activating the session if needed.
    async fn host(
        &self,
        scope: Scope,
        session_id: SessionId,
    ) -> Result<ActorRef<HostMsg>, AgentError> {
        let registry = self.registry()?;
        ractor::call!(registry, |reply| RegistryMsg::Host {
            scope,
            session_id,
            reply
        })
        .map_err(gone("sessions registry"))?
    }

    /// A session's record, from the store.
    async fn record(
        &self,
        scope: &Scope,
        session_id: SessionId,
    ) -> Result<SessionRecord, AgentError> {
        visible(scope, session_id, self.store.get_session(session_id).await?)
    }

    pub async fn create(
        &self,
        scope: Scope,
        request: CreateSession,
    ) -> Result<SessionRecord, AgentError> {
        request.validate()?;
        let registry = self.registry()?;
        ractor::call!(registry, |reply| RegistryMsg::Create {
            scope,
            request,
            reply
        })
        .map_err(gone("sessions registry"))?
    }

    pub async fn get(
        &self,
        scope: Scope,
        session_id: SessionId,
    ) -> Result<SessionRecord, AgentError> {
        self.record(&scope, session_id).await
    }

    /// Sessions the scope sees (of one project when given), newest first. A project exists
    /// once a session was created in it (projects are not stored apart from their sessions):
    /// one with none is `NotFound`, as is one the scope does not see.
    pub async fn list(
        &self,
        scope: Scope,
        project_id: Option<String>,
    ) -> Result<Vec<SessionRecord>, AgentError> {
        if let Some(p) = &project_id {
            if !scope.sees(Some(p)) {
                return Err(AgentError::not_found("project", p));
            }
            let sessions = self.store.project_sessions(p).await?;
            if sessions.is_empty() {
                return Err(AgentError::not_found("project", p));
            }
            return Ok(sessions);
        }
        let mut all: Vec<SessionRecord> = self
            .store
            .all_sessions()
            .await?
            .into_iter()
            .filter(|r| scope.sees(r.project_id.as_deref()))
            .collect();
        all.reverse();
        Ok(all)
    }

    /// The running session (activated if needed), for approvals, tasks, statistics and
    /// event streams.
    pub async fn session(
        &self,
        scope: Scope,
        session_id: SessionId,
    ) -> Result<SessionHandle, AgentError> {
        let host = self.host(scope, session_id).await?;
        host_call!(host, Session {})
    }

    /// The agents (`agents.list`, `GET /api/agents`): with a session, as that session runs
    /// them (each provider asked its health) with its bindings; without, what each provider
    /// can tell without starting anything, with the bindings of every session the scope
    /// sees. The definition files that did not load are listed too, to a token that sees
    /// everything only (they name paths of the host, as `modules.list` hides them); a token
    /// bound to no project sees no agent.
    pub async fn agents(
        &self,
        scope: Scope,
        session_id: Option<SessionId>,
    ) -> Result<AgentListing, AgentError> {
        let mut listing = self.agents_unscoped(scope.clone(), session_id).await?;
        match &scope {
            Scope::All => {}
            Scope::Projects(projects) => {
                listing.errors.clear();
                if projects.is_empty() {
                    listing.agents.clear();
                }
            }
        }
        Ok(listing)
    }

    async fn agents_unscoped(
        &self,
        scope: Scope,
        session_id: Option<SessionId>,
    ) -> Result<AgentListing, AgentError> {
        let Some(ports) = &self.agents else {
            if let Some(id) = session_id {
                // The session must exist and be the scope's, agents or not.
                visible(&scope, id, self.store.get_session(id).await?)?;
            }
            return Ok(AgentListing {
                agents: Vec::new(),
                errors: self.agent_errors.get().cloned().unwrap_or_default(),
            });
        };
        // The definitions in force: a watched directory's latest, else those read at start.
        let catalog = ports
            .live
            .as_ref()
            .map_or_else(|| ports.catalog.clone(), |live| live.borrow().clone());
        let errors = catalog.errors.clone();
        if let Some(id) = session_id {
            let agents = self.session(scope, id).await?.agents().await?;
            return Ok(AgentListing { agents, errors });
        }
        let mut bindings = Vec::new();
        let mut seen = std::collections::BTreeMap::new();
        for binding in self.store.bindings(None).await? {
            let sees = match seen.get(&binding.session_id) {
                Some(sees) => *sees,
                None => {
                    let record = self.store.get_session(binding.session_id).await?;
                    let sees = record.is_some_and(|r| scope.sees(r.project_id.as_deref()));
                    seen.insert(binding.session_id, sees);
                    sees
                }
            };
            if sees {
                bindings.push(binding);
            }
        }
        let catalog = &*catalog;
        let supervisor = troupe_actors::agents::listing::supervisor_of(
            catalog,
            ports.settings.supervisor.as_deref(),
        )
        .ok()
        .flatten()
        .map(|d| d.id.clone());
        let agents = troupe_actors::agents::listing::agent_infos(
            catalog,
            |d| troupe_runtime::agents::probe(d, &ports.factories),
            &bindings,
            supervisor.as_deref(),
        );
        Ok(AgentListing { agents, errors })
    }

    /// Every event of a session the scope sees with `seq > after` (see [`stream::events`]).
    pub async fn events(
        &self,
        scope: Scope,
        session_id: SessionId,
        after: u64,
    ) -> Result<
        impl Stream<Item = Result<StreamEvent, AgentError>> + Send + 'static + use<>,
        AgentError,
    > {
        let handle = self.session(scope, session_id).await?;
        stream::events(&handle, after).await
    }

    /// A conversation's statistics (S11).
    pub async fn conversation_stats(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<ConversationStats, AgentError> {
        let handle = self.session(scope, session_id).await?;
        handle.conversation_stats(conversation_id).await
    }

    /// A session's conversations (open and closed), oldest first.
    pub async fn conversations(
        &self,
        scope: Scope,
        session_id: SessionId,
    ) -> Result<Vec<ConversationRecord>, AgentError> {
        self.record(&scope, session_id).await?;
        self.store.conversations(session_id).await
    }

    pub async fn open(
        &self,
        scope: Scope,
        session_id: SessionId,
        params: OpenConversation,
    ) -> Result<ConversationId, AgentError> {
        let host = self.host(scope, session_id).await?;
        host_call!(host, Open { params })
    }

    pub async fn set_context(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
        update: SetContext,
    ) -> Result<(), AgentError> {
        let host = self.host(scope, session_id).await?;
        host_call!(
            host,
            SetContext {
                conversation_id,
                update
            }
        )
    }

    pub async fn close(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<Closed, AgentError> {
        let host = self.host(scope, session_id).await?;
        host_call!(host, Close { conversation_id })
    }

    /// Opens a closed conversation again under its id, its history rebuilt from its rollout
    /// (an open one: nothing to do). `NotFound` unless it is a conversation of the session.
    pub async fn reopen(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<(), AgentError> {
        let host = self.host(scope, session_id).await?;
        host_call!(host, Reopen { conversation_id })
    }

    /// Cancels every task of a conversation (its running one and its queued messages);
    /// answers how many.
    pub async fn cancel_all(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<usize, AgentError> {
        let host = self.host(scope, session_id).await?;
        host_call!(host, CancelAll { conversation_id })
    }

    /// Replaces a conversation's history by a summary its model writes (a task of its own,
    /// after the running one); answers the compaction's reply once it ended.
    pub async fn compact(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<troupe_proto::MessageReply, AgentError> {
        let host = self.host(scope, session_id).await?;
        host_call!(host, Compact { conversation_id })
    }

    /// As [`send`](Self::send), for a text a program sent (an A2A peer): a `/hub` in it is
    /// governed as a dispatch, not taken as a person's choice.
    pub async fn send_from_peer(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: Option<ConversationId>,
        text: String,
        wait: bool,
    ) -> Result<Sent, AgentError> {
        let governance = troupe_actors::governance::RequestGovernance {
            peer: true,
            ..Default::default()
        };
        self.send_governed(scope, session_id, conversation_id, text, wait, governance)
            .await
    }

    /// Stores a user message and runs it; with `wait`, answers once it ended.
    pub async fn send(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: Option<ConversationId>,
        text: String,
        wait: bool,
        options: troupe_proto::governance::MessageOptions,
    ) -> Result<Sent, AgentError> {
        // The tokens stop here: what goes on are their digests.
        let governance = troupe_actors::governance::RequestGovernance::from(options);
        self.send_governed(scope, session_id, conversation_id, text, wait, governance)
            .await
    }

    async fn send_governed(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: Option<ConversationId>,
        text: String,
        wait: bool,
        governance: troupe_actors::governance::RequestGovernance,
    ) -> Result<Sent, AgentError> {
        let host = self.host(scope, session_id).await?;
        let accepted = None;
        let module = None;
        host_call!(
            host,
            Send {
                conversation_id,
                text,
                wait,
                governance,
                accepted,
                module
            }
        )
    }

    /// Stores a user message and runs it, as [`Self::send`] with `wait`, but answers as soon
    /// as the message is stored: the stored message, and the task's end to wait for.
    /// `module`: the module it came from, kept in its metadata (its reply is routed there).
    pub async fn send_tracked(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: Option<ConversationId>,
        text: String,
        module: Option<serde_json::Value>,
    ) -> Result<(MessageRecord, TaskEnd), AgentError> {
        let host = self.host(scope, session_id).await?;
        let (accepted, stored) = tokio::sync::oneshot::channel();
        let (reply, ended) = tokio::sync::oneshot::channel();
        host.cast(HostMsg::Send {
            conversation_id,
            text,
            wait: true,
            governance: Default::default(),
            accepted: Some(accepted),
            module,
            reply: reply.into(),
        })
        .map_err(|e| AgentError::internal(format!("session host unavailable: {e}")))?;
        let ended = TaskEnd(ended);
        match stored.await {
            Ok(message) => Ok((message, ended)),
            // Refused before it was stored: the reply says why.
            Err(_) => Err(ended.await.err().unwrap_or_else(|| {
                AgentError::internal("the session host answered without storing the message")
            })),
        }
    }

    /// A page of a session's messages, from the store: at most `limit` messages and
    /// [`MAX_PAGE_BYTES`] of content (a single larger message comes alone).
    pub async fn messages(
        &self,
        scope: Scope,
        session_id: SessionId,
        limit: usize,
        before: Option<u64>,
    ) -> Result<MessagePage, AgentError> {
        self.record(&scope, session_id).await?;
        self.store
            .messages(session_id, limit, MAX_PAGE_BYTES, before)
            .await
    }

    /// One message of a session, with its status, from the store.
    pub async fn message(
        &self,
        scope: Scope,
        session_id: SessionId,
        message_id: u64,
    ) -> Result<MessageRecord, AgentError> {
        self.record(&scope, session_id).await?;
        self.store
            .message(message_id)
            .await?
            .filter(|m| m.session_id == session_id)
            .ok_or_else(|| AgentError::not_found("message", message_id))
    }

    pub async fn set_current(
        &self,
        scope: Scope,
        project_id: String,
        session_id: SessionId,
    ) -> Result<SessionRecord, AgentError> {
        if !scope.sees(Some(&project_id)) {
            return Err(AgentError::not_found("project", project_id));
        }
        let record = self.record(&scope, session_id).await?;
        if record.project_id.as_deref() != Some(project_id.as_str()) {
            return Err(AgentError::not_found("session", session_id));
        }
        self.store
            .set_current_session(&project_id, session_id)
            .await?;
        Ok(record)
    }

    pub async fn current(
        &self,
        scope: Scope,
        project_id: String,
    ) -> Result<SessionRecord, AgentError> {
        if !scope.sees(Some(&project_id)) {
            return Err(AgentError::not_found("project", project_id));
        }
        let current = self.store.current_session(&project_id).await?;
        if current.is_none() && self.store.project_sessions(&project_id).await?.is_empty() {
            return Err(AgentError::not_found("project", project_id));
        }
        let id = current
            .ok_or_else(|| AgentError::not_found("current session of project", &project_id))?;
        self.record(&scope, id).await
    }

    /// The store answers, the registry runs, and the service is healthy.
    /// Hands the process's modules to the API (once, at start).
    /// The agent definition files that did not load, listed when no definition loaded.
    pub fn set_agent_errors(&self, errors: Vec<troupe_proto::agent::AgentLoadError>) {
        let _ = self.agent_errors.set(errors);
    }

    pub fn set_modules(&self, modules: crate::modules::Modules) {
        let _ = self.modules.set(modules);
    }

    /// The process's modules, when it has any.
    pub fn modules(&self) -> Option<&crate::modules::Modules> {
        self.modules.get()
    }

    /// The modules with their health, and the files of the modules directory that did not
    /// load (`modules.list`, `GET /api/modules`).
    /// A token scoped to projects sees the modules of those projects (`project`, default the
    /// module's id) and no file errors (they name paths of the host).
    pub async fn list_modules(&self, scope: &Scope) -> serde_json::Value {
        match self.modules.get() {
            Some(m) => {
                let modules: Vec<_> = m
                    .list()
                    .await
                    .into_iter()
                    .filter(|info| {
                        m.get(&info.id)
                            .is_some_and(|def| scope.sees(Some(def.project())))
                    })
                    .collect();
                let errors: Vec<String> = match scope {
                    Scope::All => m.errors().iter().map(ToString::to_string).collect(),
                    Scope::Projects(_) => Vec::new(),
                };
                serde_json::json!({ "modules": modules, "errors": errors })
            }
            None => serde_json::json!({"modules": [], "errors": []}),
        }
    }

    /// Ready: no component failed for good, and the registry and the store each answer
    /// their ping within [`PING_WITHIN`].
    pub async fn ready(&self) -> Result<(), AgentError> {
        if let Health::Failed { reason, .. } = &*self.health.borrow() {
            return Err(AgentError::internal(reason.clone()));
        }
        // Both at once: the answer comes within one bound.
        let registry = self.registry()?;
        let (registry, store) = tokio::join!(
            ping_registry(&registry),
            within_ping_bound("the store did not answer its ping", self.store.ping())
        );
        registry?;
        store
    }

    /// Looks for sessions with unfinished messages to take over now, instead of at the next
    /// periodic scan (a node of a cluster: another node left or was lost).
    pub fn scan(&self, trigger: super::registry::ScanTrigger) {
        if let Ok(registry) = self.registry() {
            let _ = registry.cast(RegistryMsg::Scan { trigger });
        }
    }

    /// Stops admitting messages; returns once none runs.
    pub async fn drain(&self) -> Result<(), AgentError> {
        let registry = self.registry()?;
        ractor::call!(registry, |reply| RegistryMsg::Drain { reply })
            .map_err(gone("sessions registry"))
    }

    /// Shuts every active session down (cancelling what still runs) and flushes their
    /// rollouts.
    pub async fn shutdown(&self) -> Result<(), AgentError> {
        let registry = self.registry()?;
        ractor::call!(registry, |reply| RegistryMsg::Shutdown { reply })
            .map_err(gone("sessions registry"))
    }

    /// Gives this node's session leases back (after `shutdown` and the drain that stores the
    /// last outcomes).
    pub async fn release_leases(&self) -> Result<(), AgentError> {
        let registry = self.registry()?;
        ractor::call!(registry, |reply| RegistryMsg::ReleaseLeases { reply })
            .map_err(gone("sessions registry"))
    }

    /// Stops the service's actors (after `shutdown`).
    pub async fn stop(&self) {
        let _ = ractor::call!(self.supervisor, |reply| SupervisorMsg::Stop { reply });
        self.supervisor.stop(Some("service stopped".into()));
    }
}

/// How long readiness waits for each of its pings: a database that hangs (a PostgreSQL server
/// that accepts and never answers), or a registry whose mailbox does not move, must not hang
/// `/readyz` with it. Well under the period of a probe, so that one answer comes before the
/// next probe.
pub const PING_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The registry's readiness: its answer to a ping, or a timeout if it gave none in time.
async fn ping_registry(registry: &ActorRef<RegistryMsg>) -> Result<(), AgentError> {
    within_ping_bound("the sessions registry did not answer its ping", async {
        ractor::call!(registry, |reply| RegistryMsg::Ping { reply })
            .map_err(gone("sessions registry"))
    })
    .await
}

/// `ping`'s answer, or a timeout saying `unanswered` if it gave none within [`PING_WITHIN`].
async fn within_ping_bound(
    unanswered: &str,
    ping: impl std::future::Future<Output = Result<(), AgentError>>,
) -> Result<(), AgentError> {
    tokio::time::timeout(PING_WITHIN, ping)
        .await
        .unwrap_or_else(|_| Err(AgentError::timeout(unanswered, PING_WITHIN)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::ActorProcessingErr;
    use std::time::Duration;

    /// A registry whose mailbox does not move: it takes each message and keeps its reply port
    /// unanswered (as one stuck behind a long `handle` would).
    struct Stuck;

    #[ractor::async_trait]
    impl Actor for Stuck {
        type Msg = RegistryMsg;
        type State = Vec<RegistryMsg>;
        type Arguments = ();

        async fn pre_start(
            &self,
            _myself: ActorRef<RegistryMsg>,
            (): (),
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(Vec::new())
        }

        async fn handle(
            &self,
            _myself: ActorRef<RegistryMsg>,
            msg: RegistryMsg,
            held: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            held.push(msg);
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_registry_that_does_not_answer_its_ping_is_not_ready_after_the_bound() {
        let (registry, _) = Actor::spawn(None, Stuck, ()).await.unwrap();
        let asked = tokio::time::Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(10), ping_registry(&registry))
            .await
            .expect("the ping is bounded");
        assert_eq!(asked.elapsed(), PING_WITHIN);
        let error = answer.expect_err("not ready");
        assert_eq!(error.kind(), troupe_proto::ErrorKind::Timeout, "{error}");
        assert_eq!(
            error.to_string(),
            "timed out after 2000 ms: the sessions registry did not answer its ping"
        );

        // A registry that is gone is not ready either, at once.
        registry.stop(None);
        while registry.get_status() != ractor::ActorStatus::Stopped {
            tokio::task::yield_now().await;
        }
        let asked = tokio::time::Instant::now();
        let error = ping_registry(&registry).await.expect_err("gone");
        assert_eq!(asked.elapsed(), Duration::ZERO);
        assert!(
            error.to_string().contains("sessions registry unavailable"),
            "{error}"
        );
    }
}
