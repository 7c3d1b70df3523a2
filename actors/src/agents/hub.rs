//! AgentHub: a session's agents, their bindings and the dispatches in flight (A1–A4). One
//! per session with agents, a child of the Session, published in the session's directory.
//!
//! What a task needs before its first step is not asked of the hub: its execution chain, the
//! agents it may dispatch to and its `dispatch_agent` tool, and for a user's message how the
//! supervisor routes it, are read from the [`AgentViews`] the hub publishes beside it (built
//! again when the definitions change; [`AgentViews::view`]).
//!
//! # Mailbox
//! - `Dispatch`: admits or refuses a dispatch ([`decide::admit`], then the wait graph of the
//!   [`LeaseBook`]). A refusal is a `policy_rejected` event and `PolicyRejected` to the caller;
//!   an admission issues the lease (id + deadline), arms the lease timer if the lease is the
//!   first to expire, emits `dispatch_sent` and either starts the dispatch's worker (a tokio
//!   task, never awaited in `handle`) or, for an in-process agent bound to a conversation
//!   whose actor the hub knows alive, sends it straight to that conversation
//!   ([`decide::dispatch_path`], [`super::direct`]): no worker, no Session on the way, and the
//!   agent's task's end comes back as `Finished`.
//! - `Bind` / `Bound` / `BindFailed`: the worker's binding, one opener per agent at a time
//!   ([`decide::bind_plan`]); others wait for it. `OpenAbandoned`: the opener stopped first
//!   (cancelled, expired): the first dispatch still waiting opens it instead. `Bound` emits
//!   `session_created`, `session_bound`, `session_resumed` (and a `binding_replaced` warning
//!   when a binding could not be resumed); the worker has written the binding to the store
//!   before.
//! - `Finished`: the dispatch's end (its worker's, or its agent's conversation's):
//!   `dispatch_result`, the lease returned, the caller answered. An in-process agent's first
//!   dispatch on a binding (through its worker and the Session) has the hub look the
//!   conversation's actor up once, off the mailbox (`Learned`); it is looked up again after
//!   its actor stopped (passivated, restarted).
//! - `LeaseTick`: the lease timer, armed for the earliest deadline in flight. Every lease
//!   still held and past its deadline is reclaimed: the child cancelled (its cancel token),
//!   `dispatch_result` with status `expired` and a `lease_expired` warning, the caller
//!   answered `Timeout` at once; the timer is armed again for the next deadline. The child's
//!   late end is then ignored.
//! - `List`: agents with health (asked of each provider off the mailbox) and bindings.
//! - `Shutdown`: every provider's `shutdown`, then the hub stops.
//!
//! # Children and failure
//! No child actors. Workers (and direct dispatches' answers) hold the hub's reference; if
//! the hub fails, the Session starts a new one (bindings are read again from the store); the
//! failed one's dispatches end with it (ractor runs no `post_stop` for a failed actor: its
//! state's drop does it): their agents' tasks are cancelled, their callers see their reply
//! port close, and its workers' reports go nowhere. A dispatch whose dispatcher is cancelled
//! ends `cancelled` at once: the dispatching task tells the hub it stopped waiting
//! (`DispatcherCancelled`), which ends its dispatches then (leases and waits released); their
//! agents' tasks are cancelled with them (their cancel tokens are the dispatcher's children:
//! one still queued in the agent's conversation ends as soon as it starts, and its late answer
//! is ignored).
//!
//! # Scheduling (no self-lock)
//! A dispatcher computes nothing while its agent works (a slot is for computing), so its
//! scheduler slot serves the agent:
//! - an in-process agent's task runs on the dispatcher's slot, lent for the dispatch: it asks
//!   the scheduler for none and gives none back, and the dispatcher goes on with its slot when
//!   the agent has answered. With a single slot per session the agent runs while its
//!   dispatcher waits, and nested agents likewise (each runs on the slot it was lent). A
//!   lent slot is not given back while the agent's task waits for a human: it is its
//!   dispatcher's;
//! - an external agent (ACP, A2A) computes elsewhere and takes no slot: the hub gives the
//!   dispatcher's back for the wait, and the dispatcher asks for it again once answered.
//!
//! ([`decide::slot_lent`] tells which way a dispatch goes.) An agent's task that ends,
//! however it ends, holds nothing of the slot; a dispatch whose lease expires cancels it, and
//! its dispatcher goes on (or ends) with its slot.

use super::decide::{self, BindPlan, BindingEntry, Refusal, Visibility};
use super::leases::{Lease, LeaseBook, Node};
use super::metrics::{self, BindingOutcome};
use super::model::ModelAgent;
use super::provider::{
    AgentInput, AgentOutput, AgentProvider, AgentRunContext, ProviderEnv, ResumeError,
    SessionContext, SessionReplaced,
};
use super::route::{VisibleAgent, router_instructions};
use super::{AgentPorts, DispatchParent, RouterMode};
use crate::clock::Clock;
use crate::conversation::ConversationMsg;
use crate::events::{EventDraft, EventSink};
use crate::ports::{BindingStore, ModelClient};
use crate::session::SessionMsg;
use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use troupe_proto::agent::{
    AgentBinding, AgentCatalog, AgentDefinition, AgentHealth, AgentInfo, DispatchStatus,
    ExecutionChain, PolicyReason, ProviderKind,
};
use troupe_proto::{AgentError, DispatchId, EventKind, SessionId, StoragePolicy, WarningCode};

/// Start-up arguments.
pub struct AgentHubArgs {
    pub session_id: SessionId,
    /// The Session: in-process agents open their conversations through it.
    pub session: ActorRef<SessionMsg>,
    pub ports: AgentPorts,
    /// What providers get of the session.
    pub env: ProviderEnv,
    /// The session's model: in-process agents without an endpoint of their own use it.
    pub model: Arc<dyn ModelClient>,
    /// What in-process agents' conversations keep (the session's root's policy).
    pub storage_policy: StoragePolicy,
    /// What tasks see of the agents ([`AgentViews::new`]), published beside the hub.
    pub views: Arc<AgentViews>,
}

/// A task's view of the agents ([`AgentViews::view`]).
#[derive(Clone)]
pub struct AgentView {
    /// The task's execution chain: its dispatch's, or the supervisor's alone.
    pub chain: ExecutionChain,
    /// The agents it may dispatch to: those its `dispatch_agent` tool lists.
    pub visible: Arc<[VisibleAgent]>,
    /// Its `dispatch_agent` tool with its schema's text, built from `visible` with it (`None`:
    /// no agent in sight, no tool). A user's task shares the one its view set built once; an
    /// agent's task gets its own.
    pub dispatch_tool: Option<crate::tools::OfferedTools>,
    /// How a user's message is routed; `None` for an agent's task.
    pub router: Option<Arc<Router>>,
    /// For an agent's task, its id, role, tool rules, output schema and instructions as its
    /// definition says now (the agent layer of the task's tool policy, A5, A7, A8).
    pub own: Option<AgentRules>,
}

/// What an agent's own definition says to its task.
#[derive(Debug, Clone)]
pub struct AgentRules {
    pub id: String,
    pub role: String,
    pub tools: troupe_proto::agent::ToolRules,
    /// Its output guardrail (A8), when its file has one.
    pub output: Option<troupe_proto::agent::OutputSpec>,
    /// An in-process agent's instructions as its file says now: they replace those its
    /// conversation was opened with, so that an edited file applies to the next task (A7).
    pub instructions: Option<String>,
}

impl AgentRules {
    fn of(def: &AgentDefinition) -> Self {
        Self {
            id: def.id.clone(),
            role: def.role.clone(),
            tools: def.tools.clone(),
            output: def.output.clone(),
            instructions: match &def.provider {
                troupe_proto::agent::ProviderSpec::Model { instructions, .. } => {
                    instructions.clone()
                }
                _ => None,
            },
        }
    }
}

/// The session's hub as the directory publishes it: the actor, and the views its tasks read
/// without asking it.
#[derive(Clone)]
pub struct HubRef {
    pub actor: ActorRef<AgentHubMsg>,
    pub views: Arc<AgentViews>,
}

/// What tasks read of the agents: the catalog, the supervisor (the chains' origin) and how it
/// routes. A task asks it for its [`AgentView`] without a message to the hub (the session
/// publishes it with the hub, see `Directory::agents`). It changes only when the hub takes
/// new definitions from a watched directory (A7): the hub replaces the whole set at once.
pub struct AgentViews {
    set: tokio::sync::watch::Sender<Arc<ViewSet>>,
}

/// One version of the views.
pub struct ViewSet {
    catalog: Arc<AgentCatalog>,
    /// The chain's origin: the supervisor's id (the built-in one's name without a definition).
    origin: String,
    router: Arc<Router>,
    /// What the router sees, shared by every user's task.
    routed: Arc<[VisibleAgent]>,
    /// The `dispatch_agent` tool of a user's task, built once per version of the views.
    routed_tool: Option<crate::tools::OfferedTools>,
}

impl ViewSet {
    fn of(catalog: Arc<AgentCatalog>, ports: &AgentPorts, model: &Arc<dyn ModelClient>) -> Self {
        let chosen = super::listing::supervisor_of(&catalog, ports.settings.supervisor.as_deref());
        // A supervisor meant but unusable (configured or chosen by role, its file or a
        // worker's broken, or not a model agent) stays the origin, seeing what it would see
        // (no agent when it did not load): routing never widens into the built-in one.
        let missing = match &chosen {
            Err(unusable) => {
                tracing::warn!(supervisor = %unusable.id, why = %unusable.why, "the supervisor cannot route: routing sees only what it would");
                Some(unusable.id.clone())
            }
            Ok(_) => None,
        };
        let supervisor = chosen.ok().flatten();
        let origin = missing.unwrap_or_else(|| {
            supervisor
                .map_or(super::listing::BUILTIN_SUPERVISOR, |d| d.id.as_str())
                .to_owned()
        });
        let visibility = decide::visible_from(&catalog, &ExecutionChain::start(&origin));
        let agents = visible_agents(&catalog, &visibility, Some(&origin));
        let own = supervisor.and_then(|d| match &d.provider {
            troupe_proto::agent::ProviderSpec::Model { instructions, .. } => instructions.clone(),
            _ => None,
        });
        let supervisor_model = supervisor.and_then(|d| supervisor_model(d, ports, model));
        let router = Router {
            mode: ports.settings.router,
            instructions: router_instructions(own.as_deref(), &agents),
            model: supervisor_model,
            agents: agents.clone(),
        };
        let routed_tool = dispatch_tools(&agents);
        Self {
            catalog,
            origin,
            router: Arc::new(router),
            routed: agents.into(),
            routed_tool,
        }
    }
}

impl AgentViews {
    /// The views of `catalog`'s agents (the version the hub starts with too); `model` is the
    /// session's (a supervisor asking for another model by name gets it from there).
    pub fn new(
        catalog: Arc<AgentCatalog>,
        ports: &AgentPorts,
        model: &Arc<dyn ModelClient>,
    ) -> Self {
        let (set, _) = tokio::sync::watch::channel(Arc::new(ViewSet::of(catalog, ports, model)));
        Self { set }
    }

    /// New definitions: the views every task reads from now on.
    fn replace(
        &self,
        catalog: Arc<AgentCatalog>,
        ports: &AgentPorts,
        model: &Arc<dyn ModelClient>,
    ) {
        self.set
            .send_replace(Arc::new(ViewSet::of(catalog, ports, model)));
    }

    /// The definitions the views are made of.
    pub fn catalog(&self) -> Arc<AgentCatalog> {
        self.set.borrow().catalog.clone()
    }

    /// The chains' origin.
    pub fn origin(&self) -> String {
        self.set.borrow().origin.clone()
    }

    /// The view of a task: `origin` is its dispatch (its chain and id), `None` for a user's
    /// message (the supervisor's chain, routed).
    pub fn view(&self, origin: Option<&ExecutionChain>) -> AgentView {
        let set = self.set.borrow().clone();
        match origin {
            None => AgentView {
                chain: ExecutionChain::start(&set.origin),
                visible: set.routed.clone(),
                dispatch_tool: set.routed_tool.clone(),
                router: Some(set.router.clone()),
                own: None,
            },
            Some(chain) => {
                let visibility = decide::visible_from(&set.catalog, chain);
                let visible = visible_agents(&set.catalog, &visibility, chain.current());
                AgentView {
                    dispatch_tool: dispatch_tools(&visible),
                    visible: visible.into(),
                    chain: chain.clone(),
                    router: None,
                    own: chain
                        .current()
                        .and_then(|id| set.catalog.get(id))
                        .map(AgentRules::of),
                }
            }
        }
    }
}

/// The `dispatch_agent` tool for `visible`, its schema's text computed; `None` for no agent.
fn dispatch_tools(visible: &[VisibleAgent]) -> Option<crate::tools::OfferedTools> {
    (!visible.is_empty())
        .then(|| crate::tools::OfferedTools::new(vec![super::route::dispatch_tool(visible)]))
}

/// How the supervisor routes a user's message.
#[derive(Clone)]
pub struct Router {
    pub mode: RouterMode,
    /// The routing step's system prompt.
    pub instructions: String,
    /// The supervisor's model when it has one of its own; `None`: the conversation's.
    pub model: Option<Arc<dyn ModelClient>>,
    /// The agents it may route to.
    pub agents: Vec<VisibleAgent>,
}

/// A dispatch, as a task asks for it.
pub struct DispatchRequest {
    pub agent_id: String,
    pub input: String,
    /// The dispatcher's chain (from its [`AgentView`]).
    pub chain: ExecutionChain,
    /// A human named the agent (`/hub`): any agent is in sight.
    pub by_human: bool,
    pub parent: DispatchParent,
    /// The dispatcher's own dispatch, when it is an agent's task.
    pub parent_dispatch: Option<DispatchId>,
    /// The dispatcher's cancellation: the dispatch's own is a child of it.
    pub cancel: CancellationToken,
    /// The dispatcher's span: `troupe.dispatch` is its child.
    pub span: tracing::Span,
    /// The dispatcher's tool governance (its policy and the tokens it was given).
    pub governance: Arc<crate::governance::TaskGovernance>,
    /// The dispatcher's scheduler slot: lent to an in-process agent's task, given back for
    /// the wait on an external agent (see Scheduling above).
    pub slot: crate::task::SlotLease,
    /// The dispatcher's `[tools]` (global and role layers): an external agent's own layers
    /// are read from it ([`crate::governance::external_agent`]).
    pub tool_config: Arc<troupe_proto::governance::ToolPolicyConfig>,
    /// The process's token book, where an external agent's call to an
    /// `authorizationRequired` tool uses a token (`None`: no token can be used).
    pub token_book: Option<crate::token_book::TokenBookRef>,
    /// The dispatcher's conversation's storage policy: an in-process agent whose
    /// conversation keeps more is refused the dispatch.
    pub storage_policy: StoragePolicy,
}

/// The hub's mailbox.
pub enum AgentHubMsg {
    /// Dispatches to an agent; answered with its reply, a refusal, a failure, or `Timeout`
    /// when the lease expires first.
    Dispatch {
        request: DispatchRequest,
        reply: RpcReplyPort<Result<AgentOutput, AgentError>>,
    },
    /// A worker bound its agent.
    Bound {
        agent_id: String,
        dispatch_id: DispatchId,
        bound: Bound,
    },
    /// A worker could not open or resume its agent's provider session.
    BindFailed { agent_id: String, error: AgentError },
    /// The dispatch that was to open (or resume) its agent's provider session stopped before
    /// it did (cancelled, expired, panicked): the open goes to the next dispatch waiting for
    /// it, which the opener's end does not concern.
    OpenAbandoned { agent_id: String },
    /// A dispatch's worker ended.
    Finished {
        dispatch_id: DispatchId,
        result: Result<AgentOutput, AgentError>,
    },
    /// The task that dispatched stopped waiting (it was cancelled): its dispatches still in
    /// flight end `cancelled` now, their leases and waits released, whatever their agents'
    /// tasks do next (a queued one ends as it starts: its cancel token is the dispatcher's).
    DispatcherCancelled { parent: DispatchParent },
    /// Timer: leases may have expired.
    LeaseTick,
    /// The actor of an in-process agent's conversation (its provider session), looked up
    /// after a dispatch reached it through the Session: later dispatches go straight to it.
    Learned {
        agent_id: String,
        provider_session_id: String,
        actor: Option<ActorRef<ConversationMsg>>,
    },
    /// The agents, their health and this session's bindings.
    List { reply: RpcReplyPort<Vec<AgentInfo>> },
    /// Shuts every provider down; the hub stops.
    Shutdown { reply: RpcReplyPort<()> },
    /// The watched agents directory changed (A7): these definitions are in force from the
    /// next task on.
    CatalogChanged { catalog: Arc<AgentCatalog> },
}

/// A plan handed to a dispatch that waited for another to open its agent's provider
/// session: the session to use once that one bound it, or the open itself when that one
/// stopped first, with the guard that hands it on again if this one stops too (dropped
/// unread, the guard reports it).
struct Handed {
    plan: BindPlan,
    opening: Option<OpeningGuard>,
}

/// Where a worker hears how to bind.
type BindReply = tokio::sync::oneshot::Sender<Result<Handed, AgentError>>;

/// A worker's bind plan: decided with its dispatch, or to come when the provider session
/// another dispatch is opening is bound.
enum PlanSource {
    Ready(Result<BindPlan, AgentError>),
    Wait(tokio::sync::oneshot::Receiver<Result<Handed, AgentError>>),
}

/// How a worker got its provider session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// Opened and bound (`previous`: the binding it replaces; `alert`: why that one could not
    /// be kept).
    Opened {
        binding: AgentBinding,
        previous: Option<String>,
        alert: Option<String>,
    },
    /// A stored binding taken up again.
    Resumed { binding: AgentBinding },
    /// Opened for this dispatch alone.
    Fresh { provider_session_id: String },
}

/// An agent's provider, initialized once (again after a failure).
struct ProviderCell {
    provider: Arc<dyn AgentProvider>,
    init: tokio::sync::OnceCell<()>,
}

impl ProviderCell {
    async fn ready(&self) -> Result<&dyn AgentProvider, AgentError> {
        self.init
            .get_or_try_init(|| self.provider.initialize())
            .await?;
        Ok(self.provider.as_ref())
    }
}

/// A dispatch in flight: what the hub needs beside its lease.
struct Flight {
    agent_id: String,
    reply: Option<RpcReplyPort<Result<AgentOutput, AgentError>>>,
    cancel: CancellationToken,
    parent: DispatchParent,
    kind: ProviderKind,
    provider_session_id: Option<String>,
    /// Its provider session is the agent's binding (not one for this dispatch alone): the
    /// hub learns its conversation for the next dispatches.
    bound: bool,
    started: Instant,
    span: tracing::Span,
    /// The agent ran under an output schema (A8): its answer, when JSON, is the validated one.
    guarded: bool,
}

/// Whether a dispatch's answer is JSON an output schema validated: the agent is guarded
/// and answered JSON (its other answer, a question to a human after the retries, is prose).
fn validated_answer(guarded: bool, result: &Result<AgentOutput, AgentError>) -> bool {
    guarded
        && result
            .as_ref()
            .is_ok_and(|o| serde_json::from_str::<serde_json::Value>(&o.text).is_ok())
}

impl Drop for AgentHubState {
    /// A hub that fails (or is killed) gets no `post_stop`: what it had in flight ends here.
    fn drop(&mut self) {
        self.abandon_flights();
    }
}

/// An in-process agent's conversation, as the hub knows it.
struct KnownConversation {
    provider_session_id: String,
    id: troupe_proto::ConversationId,
    actor: ActorRef<ConversationMsg>,
}

/// The hub's state.
pub struct AgentHubState {
    session_id: SessionId,
    /// The definitions in force: replaced as a watched directory changes (A7).
    catalog: Arc<AgentCatalog>,
    ports: AgentPorts,
    /// What providers are built with when the definitions change.
    session: ActorRef<SessionMsg>,
    model: Arc<dyn ModelClient>,
    storage_policy: StoragePolicy,
    clock: Clock,
    events: EventSink,
    env: ProviderEnv,
    views: Arc<AgentViews>,
    /// By agent id; `Err`: why it has no provider.
    providers: BTreeMap<String, Result<Arc<ProviderCell>, String>>,
    /// Providers replaced by a reload that dispatches in flight still use: each is shut down
    /// once none holds it (or with the hub).
    retired: Vec<Arc<ProviderCell>>,
    bindings: BTreeMap<String, BindingEntry>,
    /// Dispatches waiting for another to open their agent's provider session.
    waiting: BTreeMap<String, Vec<(DispatchId, BindReply)>>,
    leases: LeaseBook,
    /// The deadline the lease timer is armed for.
    lease_timer: Option<u64>,
    flights: BTreeMap<DispatchId, Flight>,
    /// By agent id: the conversation an in-process agent is bound to (its provider session
    /// id) and its actor, for dispatches sent straight to it.
    conversations: BTreeMap<String, KnownConversation>,
    /// Agents whose conversation's actor is being looked up.
    learning: std::collections::BTreeSet<String>,
}

/// The AgentHub actor.
pub struct AgentHub;

#[ractor::async_trait]
impl Actor for AgentHub {
    type Msg = AgentHubMsg;
    type State = AgentHubState;
    type Arguments = AgentHubArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: AgentHubArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        // The version its views were made of: one read for both, so a reload between two
        // reads cannot leave them apart.
        let catalog = args.views.catalog();
        // Every stored binding of the session, its agent defined now or not: one that a reload
        // defines again resumes its binding.
        let stored = args.ports.bindings.bindings(Some(args.session_id)).await?;
        let mut bindings: BTreeMap<String, BindingEntry> = catalog
            .agents
            .keys()
            .map(|id| (id.clone(), BindingEntry::default()))
            .collect();
        for binding in stored {
            let entry = bindings.entry(binding.agent_id.clone()).or_default();
            entry.stored = Some(binding);
        }
        let providers = catalog
            .agents
            .values()
            .map(|def| {
                let built = build_provider(
                    def,
                    &args.ports,
                    &args.env,
                    &args.session,
                    args.storage_policy,
                );
                (def.id.clone(), built)
            })
            .collect();
        if let Some(live) = args.ports.live.clone() {
            watch_catalog(myself.clone(), live);
        }
        Ok(AgentHubState {
            session_id: args.session_id,
            catalog,
            clock: args.env.clock,
            events: args.env.events.clone(),
            env: args.env,
            ports: args.ports,
            session: args.session,
            model: args.model,
            storage_policy: args.storage_policy,
            views: args.views,
            providers,
            retired: Vec::new(),
            bindings,
            waiting: BTreeMap::new(),
            leases: LeaseBook::default(),
            lease_timer: None,
            flights: BTreeMap::new(),
            conversations: BTreeMap::new(),
            learning: std::collections::BTreeSet::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AgentHubMsg::Dispatch { request, reply } => state.dispatch(&myself, request, reply),
            AgentHubMsg::Bound {
                agent_id,
                dispatch_id,
                bound,
            } => state.bound(&agent_id, dispatch_id, bound),
            AgentHubMsg::BindFailed { agent_id, error } => state.bind_failed(&agent_id, &error),
            AgentHubMsg::OpenAbandoned { agent_id } => state.open_abandoned(&myself, &agent_id),
            AgentHubMsg::Finished {
                dispatch_id,
                result,
            } => {
                state.finished(&myself, dispatch_id, result);
                state.shut_down_idle_retired();
            }
            AgentHubMsg::DispatcherCancelled { parent } => {
                state.dispatcher_cancelled(&myself, parent);
            }
            AgentHubMsg::LeaseTick => state.lease_tick(&myself),
            AgentHubMsg::Learned {
                agent_id,
                provider_session_id,
                actor,
            } => state.learned(agent_id, provider_session_id, actor),
            AgentHubMsg::List { reply } => state.list(reply),
            AgentHubMsg::Shutdown { reply } => {
                state.shutdown().await;
                let _ = reply.send(());
                myself.stop(Some("shutdown".into()));
            }
            AgentHubMsg::CatalogChanged { catalog } => state.reload(catalog),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.abandon_flights();
        Ok(())
    }
}

/// Forwards the changes of a watched agents directory to the hub, as long as both live.
fn watch_catalog(
    hub: ActorRef<AgentHubMsg>,
    mut live: tokio::sync::watch::Receiver<Arc<AgentCatalog>>,
) {
    tokio::spawn(async move {
        while live.changed().await.is_ok() {
            let catalog = live.borrow_and_update().clone();
            if hub.cast(AgentHubMsg::CatalogChanged { catalog }).is_err() {
                return;
            }
        }
    });
}

/// The provider of `def`: the in-process one for `model`, else the factory of its kind's.
fn build_provider(
    def: &AgentDefinition,
    ports: &AgentPorts,
    env: &ProviderEnv,
    session: &ActorRef<SessionMsg>,
    storage_policy: StoragePolicy,
) -> Result<Arc<ProviderCell>, String> {
    let kind = def.provider.kind();
    let provider: Arc<dyn AgentProvider> = match kind {
        ProviderKind::Model => Arc::new(ModelAgent::new(
            def,
            session.clone(),
            ports.models.get(&def.id).cloned(),
            storage_policy,
        )),
        _ => {
            let factory = ports
                .factories
                .iter()
                .find(|f| f.kind() == kind)
                .ok_or_else(|| format!("no {kind} provider is plugged in"))?;
            factory
                .build(def, env)
                .map_err(|e| format!("its {kind} provider could not be built: {e}"))?
        }
    };
    Ok(Arc::new(ProviderCell {
        provider,
        init: tokio::sync::OnceCell::new(),
    }))
}

/// The supervisor's own model client: one built for its endpoint, or the session's asking
/// for its `model`; `None`: the conversation's model.
fn supervisor_model(
    def: &AgentDefinition,
    ports: &AgentPorts,
    session: &Arc<dyn ModelClient>,
) -> Option<Arc<dyn ModelClient>> {
    if let Some(own) = ports.models.get(&def.id) {
        return Some(own.clone());
    }
    match &def.provider {
        troupe_proto::agent::ProviderSpec::Model {
            model: Some(name), ..
        } => session.with_model(name),
        _ => None,
    }
}

fn visible_agents(
    catalog: &AgentCatalog,
    visibility: &Visibility,
    except: Option<&str>,
) -> Vec<VisibleAgent> {
    visibility
        .ids(catalog, except)
        .iter()
        .filter_map(|id| catalog.get(id))
        .map(VisibleAgent::of)
        .collect()
}

impl AgentHubState {
    /// The dispatcher's node in the wait graph.
    fn node_of(&self, request: &DispatchRequest) -> Node {
        match (request.chain.depth(), request.chain.current()) {
            (0, _) | (_, None) => Node::Conversation(request.parent.conversation_id),
            (_, Some(agent)) => self.agent_node(agent, request.parent_dispatch),
        }
    }

    /// An agent's node: itself when bound per session, its dispatch when bound per dispatch.
    fn agent_node(&self, agent_id: &str, dispatch: Option<DispatchId>) -> Node {
        match (self.catalog.get(agent_id), dispatch) {
            (Some(def), Some(id))
                if def.session.binding_scope == troupe_proto::agent::BindingScope::Dispatch =>
            {
                Node::Dispatch(id)
            }
            _ => Node::Agent(agent_id.to_owned()),
        }
    }

    /// Admission: the policy checks, then the wait graph.
    fn admit(
        &self,
        request: &DispatchRequest,
        dispatch_id: DispatchId,
    ) -> Result<(Node, Node), Refusal> {
        let visibility = if request.by_human {
            Visibility::Any
        } else {
            decide::visible_from(&self.catalog, &request.chain)
        };
        // A human naming the supervisor a message starts from is no cycle (see
        // `decide::names_origin`): its checks start from an empty chain.
        let checked = if decide::names_origin(&request.chain, &request.agent_id, request.by_human) {
            ExecutionChain(Vec::new())
        } else {
            request.chain.clone()
        };
        decide::admit(
            &self.catalog,
            &checked,
            &request.agent_id,
            &visibility,
            self.ports.settings.max_depth,
            |id| matches!(self.providers.get(id), Some(Ok(_))),
        )?;
        if let Some(def) = self.catalog.get(&request.agent_id) {
            decide::storage_allows(
                def.provider.kind(),
                &request.agent_id,
                self.storage_policy,
                request.storage_policy,
            )?;
        }
        let from = self.node_of(request);
        let to = self.agent_node(&request.agent_id, Some(dispatch_id));
        if let Some(path) = self.leases.wait_cycle(&from, &to) {
            let path: Vec<String> = path.iter().map(ToString::to_string).collect();
            return Err(Refusal {
                reason: PolicyReason::WaitCycle,
                message: format!(
                    "`{}` already waits for `{from}` ({} → {from}): dispatching would deadlock",
                    request.agent_id,
                    path.join(" → ")
                ),
            });
        }
        Ok((from, to))
    }

    fn emit(&self, parent: DispatchParent, event: EventKind) {
        self.events.emit(EventDraft::task(
            parent.conversation_id,
            parent.task_id,
            event,
        ));
    }

    fn dispatch(
        &mut self,
        myself: &ActorRef<AgentHubMsg>,
        request: DispatchRequest,
        reply: RpcReplyPort<Result<AgentOutput, AgentError>>,
    ) {
        let dispatch_id = DispatchId::new();
        let chain = decide::dispatch_chain(&request.chain, &request.agent_id, request.by_human);
        let (from, to) = match self.admit(&request, dispatch_id) {
            Ok(nodes) => nodes,
            Err(refusal) => {
                tracing::info!(agent_id = %request.agent_id, chain = %chain, reason = refusal.reason.as_str(), "dispatch refused");
                metrics::rejected(refusal.reason);
                self.emit(
                    request.parent,
                    EventKind::PolicyRejected {
                        agent_id: request.agent_id.clone(),
                        chain: chain.clone(),
                        reason: refusal.reason,
                        message: refusal.message.clone(),
                        tool: None,
                    },
                );
                let _ = reply.send(Err(AgentError::PolicyRejected {
                    reason: refusal.reason,
                    chain: chain.0,
                    message: refusal.message,
                }));
                return;
            }
        };
        let Some((def, Ok(cell))) = self
            .catalog
            .get(&request.agent_id)
            .cloned()
            .zip(self.providers.get(&request.agent_id).cloned())
        else {
            let _ = reply.send(Err(AgentError::internal(
                "an admitted agent has no provider",
            )));
            return;
        };
        let ttl = self.ports.settings.lease_ttl;
        let kind = def.provider.kind();
        // An in-process agent's task runs on the dispatcher's slot; an external agent takes
        // none, so the dispatcher's goes back for the wait.
        let slot_lent = decide::slot_lent(kind);
        if !slot_lent {
            request.slot.give_back();
        }
        let span = tracing::info_span!(
            parent: &request.span,
            "troupe.dispatch",
            otel.name = %format!("dispatch {}", request.agent_id),
            otel.kind = "internal",
            otel.status_code = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
            "gen_ai.operation.name" = "invoke_agent",
            "gen_ai.agent.name" = %request.agent_id,
            dispatch_id = %dispatch_id,
            agent_id = %request.agent_id,
            provider = kind.as_str(),
            provider_session_id = tracing::field::Empty,
            depth = chain.depth(),
            conversation_id = %request.parent.conversation_id,
            task_id = %request.parent.task_id,
        );
        let deadline_ms = self.clock.now_ms().saturating_add(millis(ttl));
        self.leases.issue(Lease {
            id: dispatch_id,
            agent_id: request.agent_id.clone(),
            from,
            to,
            deadline_ms,
        });
        self.arm_lease_timer(myself, deadline_ms);
        let cancel = request.cancel.child_token();
        // The provider session this dispatch will use, when that is known now: this run's, or
        // a stored one it resumes (not one a `resume = false` agent, or a changed provider,
        // replaces).
        let resumes = def.session.resume;
        let known = self.bindings.get(&request.agent_id).and_then(|b| {
            b.live.clone().or_else(|| {
                b.stored
                    .as_ref()
                    .filter(|s| resumes && s.provider == kind)
                    .map(|s| s.provider_session_id.clone())
            })
        });
        metrics::dispatch_started();
        span.in_scope(|| {
            self.emit(
                request.parent,
                EventKind::DispatchSent {
                    dispatch_id,
                    agent_id: request.agent_id.clone(),
                    provider: kind,
                    provider_session_id: known,
                    chain: chain.clone(),
                    lease_ttl_ms: millis(ttl),
                    input: request.input.clone(),
                },
            );
        });
        self.flights.insert(
            dispatch_id,
            Flight {
                agent_id: request.agent_id.clone(),
                reply: Some(reply),
                cancel: cancel.clone(),
                parent: request.parent,
                kind,
                provider_session_id: None,
                bound: true,
                started: Instant::now(),
                span: span.clone(),
                guarded: kind == ProviderKind::Model && def.output.is_some(),
            },
        );
        let plan = self.plan(&request.agent_id, dispatch_id);
        let ready = match &plan {
            PlanSource::Ready(Ok(plan)) => Some(plan),
            _ => None,
        };
        let known = self.conversations.get(&request.agent_id);
        let path = decide::dispatch_path(
            kind,
            ready,
            known.map(|k| (k.provider_session_id.as_str(), alive(&k.actor))),
        );
        super::metrics::dispatch_path(path.as_str());
        if let (decide::DispatchPath::Direct, Some(known)) = (path, known) {
            let origin = super::DispatchOrigin {
                dispatch_id,
                agent_id: request.agent_id,
                chain,
                cancel,
                span: span.clone(),
                governance: request.governance,
                slot_lent,
            };
            let direct = super::direct::DirectDispatch::new(
                self.session.clone(),
                known.id,
                request.input,
                origin,
                super::direct::HubAnswer::new(myself.clone(), dispatch_id),
            );
            // Not taken (its actor just stopped): it goes through the Session on drop.
            let _ = span.in_scope(|| known.actor.cast(ConversationMsg::Dispatch(direct)));
            return;
        }
        let worker = Worker {
            hub: myself.clone(),
            store: self.ports.bindings.clone(),
            clock: self.clock,
            session_id: self.session_id,
            def,
            cell,
            dispatch_id,
            chain,
            parent: request.parent,
            input: request.input,
            governance: request.governance,
            slot_lent,
            tool_config: request.tool_config,
            token_book: request.token_book,
            cancel,
            events: self.events.clone(),
            env: self.env.clone(),
            span: span.clone(),
        };
        tokio::spawn(worker.run(plan).instrument(span));
    }

    /// How dispatch `dispatch_id` gets its agent's provider session, decided when it is
    /// admitted (no round trip from its worker): at once, or when the dispatch opening it now
    /// has bound it (`BindPlan::Wait` is never handed out).
    fn plan(&mut self, agent_id: &str, dispatch_id: DispatchId) -> PlanSource {
        let Some(def) = self.catalog.get(agent_id) else {
            return PlanSource::Ready(Err(AgentError::not_found("agent", agent_id)));
        };
        let entry = self.bindings.entry(agent_id.to_owned()).or_default();
        let plan = decide::bind_plan(
            entry,
            def.session.binding_scope,
            def.session.resume,
            def.provider.kind(),
        );
        match &plan {
            BindPlan::Wait => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                self.waiting
                    .entry(agent_id.to_owned())
                    .or_default()
                    .push((dispatch_id, tx));
                return PlanSource::Wait(rx);
            }
            BindPlan::Resume { .. } | BindPlan::Open { .. } => entry.opening = true,
            BindPlan::Use(id) => self.uses(dispatch_id, id),
            BindPlan::Fresh => {}
        }
        PlanSource::Ready(Ok(plan))
    }

    /// A dispatch runs in its agent's live provider session: its result names it.
    fn uses(&mut self, dispatch_id: DispatchId, provider_session_id: &str) {
        if let Some(flight) = self.flights.get_mut(&dispatch_id) {
            flight.provider_session_id = Some(provider_session_id.to_owned());
            flight
                .span
                .record("provider_session_id", provider_session_id);
        }
    }

    fn bound(&mut self, agent_id: &str, dispatch_id: DispatchId, bound: Bound) {
        let parent = self.flights.get(&dispatch_id).map(|f| f.parent);
        let emit = |state: &Self, event: EventKind| match parent {
            Some(parent) => state.emit(parent, event),
            None => state.events.emit(EventDraft::session(event)),
        };
        let kind = self
            .catalog
            .get(agent_id)
            .map_or(ProviderKind::Model, |d| d.provider.kind());
        let psid = match &bound {
            Bound::Opened { binding, .. } | Bound::Resumed { binding } => {
                binding.provider_session_id.clone()
            }
            Bound::Fresh {
                provider_session_id,
            } => provider_session_id.clone(),
        };
        if let Some(flight) = self.flights.get_mut(&dispatch_id) {
            flight.provider_session_id = Some(psid.clone());
            flight.bound = !matches!(bound, Bound::Fresh { .. });
            flight.span.record("provider_session_id", psid.as_str());
        }
        let dispatch = Some(dispatch_id);
        match bound {
            Bound::Fresh { .. } => {
                metrics::binding(kind, BindingOutcome::Fresh);
                emit(
                    self,
                    EventKind::SessionCreated {
                        agent_id: agent_id.to_owned(),
                        provider: kind,
                        provider_session_id: psid,
                        dispatch_id: dispatch,
                    },
                );
                return;
            }
            Bound::Resumed { binding } => {
                metrics::binding(kind, BindingOutcome::Resumed);
                emit(
                    self,
                    EventKind::SessionResumed {
                        agent_id: agent_id.to_owned(),
                        provider: kind,
                        provider_session_id: psid.clone(),
                        dispatch_id: dispatch,
                    },
                );
                let entry = self.bindings.entry(agent_id.to_owned()).or_default();
                entry.stored = Some(binding);
            }
            Bound::Opened {
                binding,
                previous,
                alert,
            } => {
                if let Some(why) = &alert {
                    metrics::binding(kind, BindingOutcome::Replaced);
                    tracing::warn!(%agent_id, previous = ?previous, provider_session_id = %psid, "binding replaced: {why}");
                    emit(
                        self,
                        EventKind::Warning {
                            code: WarningCode::BindingReplaced,
                            message: format!(
                                "the binding of `{agent_id}` to {} could not be resumed ({why}); a new one replaces it: {psid}",
                                previous.as_deref().unwrap_or("its provider session")
                            ),
                        },
                    );
                } else {
                    metrics::binding(kind, BindingOutcome::Created);
                }
                emit(
                    self,
                    EventKind::SessionCreated {
                        agent_id: agent_id.to_owned(),
                        provider: kind,
                        provider_session_id: psid.clone(),
                        dispatch_id: dispatch,
                    },
                );
                emit(
                    self,
                    EventKind::SessionBound {
                        agent_id: agent_id.to_owned(),
                        provider: kind,
                        provider_session_id: psid.clone(),
                        replaced: previous,
                        dispatch_id: dispatch,
                    },
                );
                let entry = self.bindings.entry(agent_id.to_owned()).or_default();
                entry.stored = Some(binding);
            }
        }
        let entry = self.bindings.entry(agent_id.to_owned()).or_default();
        entry.live = Some(psid.clone());
        entry.opening = false;
        for (waiting, waiter) in self.waiting.remove(agent_id).unwrap_or_default() {
            self.uses(waiting, &psid);
            let _ = waiter.send(Ok(Handed {
                plan: BindPlan::Use(psid.clone()),
                opening: None,
            }));
        }
    }

    /// Nothing in flight outlives the hub, however it stops: its agents' tasks are cancelled
    /// (their cancel tokens), its callers hear their reply port close.
    fn abandon_flights(&mut self) {
        for (_, flight) in std::mem::take(&mut self.flights) {
            flight.cancel.cancel();
            metrics::dispatch_ended(
                flight.kind,
                DispatchStatus::Cancelled,
                flight.started.elapsed(),
            );
        }
    }

    fn bind_failed(&mut self, agent_id: &str, error: &AgentError) {
        if let Some(kind) = self.catalog.get(agent_id).map(|d| d.provider.kind()) {
            metrics::binding(kind, BindingOutcome::Failed);
        }
        if let Some(entry) = self.bindings.get_mut(agent_id) {
            entry.opening = false;
        }
        for (_, waiter) in self.waiting.remove(agent_id).unwrap_or_default() {
            let _ = waiter.send(Err(error.clone()));
        }
    }

    /// The dispatch opening `agent_id`'s binding stopped before it reported: the first
    /// dispatch still waiting is handed the open (with a guard of its own), the others go on
    /// waiting for it. A waiter that stopped meanwhile is skipped.
    fn open_abandoned(&mut self, myself: &ActorRef<AgentHubMsg>, agent_id: &str) {
        if let Some(entry) = self.bindings.get_mut(agent_id) {
            entry.opening = false;
        }
        let mut waiters = self
            .waiting
            .remove(agent_id)
            .unwrap_or_default()
            .into_iter();
        let Some(def) = self.catalog.get(agent_id) else {
            let error = AgentError::not_found("agent", agent_id);
            for (_, waiter) in waiters {
                let _ = waiter.send(Err(error.clone()));
            }
            return;
        };
        let entry = self.bindings.entry(agent_id.to_owned()).or_default();
        for (dispatch_id, waiter) in waiters.by_ref() {
            let plan = decide::bind_plan(
                entry,
                def.session.binding_scope,
                def.session.resume,
                def.provider.kind(),
            );
            let opens = matches!(plan, BindPlan::Open { .. } | BindPlan::Resume { .. });
            let opening = opens.then(|| OpeningGuard {
                hub: myself.clone(),
                agent_id: agent_id.to_owned(),
                reported: false,
            });
            entry.opening = opens;
            match waiter.send(Ok(Handed { plan, opening })) {
                Ok(()) if opens => {
                    tracing::debug!(%agent_id, %dispatch_id, "the binding's open handed on");
                    break;
                }
                Ok(()) => {}
                Err(unread) => {
                    // That dispatch stopped waiting: its guard must not report again.
                    if let Ok(Handed {
                        opening: Some(mut guard),
                        ..
                    }) = unread
                    {
                        guard.reported = true;
                    }
                    entry.opening = false;
                }
            }
        }
        let rest: Vec<_> = waiters.collect();
        if !rest.is_empty() {
            self.waiting.insert(agent_id.to_owned(), rest);
        }
    }

    fn finished(
        &mut self,
        myself: &ActorRef<AgentHubMsg>,
        dispatch_id: DispatchId,
        result: Result<AgentOutput, AgentError>,
    ) {
        if self.leases.finish(dispatch_id).is_none() {
            tracing::debug!(%dispatch_id, "a reclaimed dispatch ended late");
            return;
        }
        let Some(mut flight) = self.flights.remove(&dispatch_id) else {
            return;
        };
        let status = match &result {
            Ok(_) => DispatchStatus::Ok,
            Err(e) => DispatchStatus::of_error(e),
        };
        if flight.kind == ProviderKind::Model
            && flight.bound
            && result.is_ok()
            && let Some(psid) = &flight.provider_session_id
        {
            self.learn(myself, &flight.agent_id, psid);
        }
        self.end(dispatch_id, &mut flight, status, result);
    }

    /// Ends the dispatches of a task that stopped waiting for them (see
    /// [`AgentHubMsg::DispatcherCancelled`]).
    fn dispatcher_cancelled(&mut self, myself: &ActorRef<AgentHubMsg>, parent: DispatchParent) {
        let ids: Vec<DispatchId> = self
            .flights
            .iter()
            .filter(|(_, f)| f.parent == parent)
            .map(|(id, _)| *id)
            .collect();
        for dispatch_id in ids {
            if let Some(flight) = self.flights.get(&dispatch_id) {
                flight.cancel.cancel();
            }
            self.finished(
                myself,
                dispatch_id,
                Err(AgentError::cancelled("the dispatching task was cancelled")),
            );
        }
    }

    /// Looks up, off the mailbox, the actor of the conversation an in-process agent answered
    /// from, unless it is known alive or being looked up.
    fn learn(&mut self, myself: &ActorRef<AgentHubMsg>, agent_id: &str, psid: &str) {
        let known = self
            .conversations
            .get(agent_id)
            .is_some_and(|k| k.provider_session_id == psid && alive(&k.actor));
        if known || self.learning.contains(agent_id) {
            return;
        }
        let Ok(conversation_id) = ModelAgent::conversation(psid) else {
            return;
        };
        self.learning.insert(agent_id.to_owned());
        let (hub, session) = (myself.clone(), self.session.clone());
        let (agent_id, provider_session_id) = (agent_id.to_owned(), psid.to_owned());
        tokio::spawn(async move {
            let actor = ractor::call!(session, |reply| SessionMsg::Conversation {
                conversation_id,
                reply
            })
            .ok()
            .flatten();
            let _ = hub.cast(AgentHubMsg::Learned {
                agent_id,
                provider_session_id,
                actor,
            });
        });
    }

    fn learned(
        &mut self,
        agent_id: String,
        provider_session_id: String,
        actor: Option<ActorRef<ConversationMsg>>,
    ) {
        self.learning.remove(&agent_id);
        match actor {
            Some(actor) => {
                if let Ok(id) = ModelAgent::conversation(&provider_session_id) {
                    let known = KnownConversation {
                        provider_session_id,
                        id,
                        actor,
                    };
                    self.conversations.insert(agent_id, known);
                }
            }
            None => {
                self.conversations.remove(&agent_id);
            }
        }
    }

    /// Arms the lease timer for `deadline_ms` if it is the earliest.
    fn arm_lease_timer(&mut self, myself: &ActorRef<AgentHubMsg>, deadline_ms: u64) {
        if !decide::arm_lease_timer(self.lease_timer, deadline_ms) {
            return;
        }
        self.lease_timer = Some(deadline_ms);
        let after = Duration::from_millis(deadline_ms.saturating_sub(self.clock.now_ms()));
        myself.send_after(after, || AgentHubMsg::LeaseTick);
    }

    /// Reclaims every lease past its deadline; arms the timer for the next one.
    fn lease_tick(&mut self, myself: &ActorRef<AgentHubMsg>) {
        let now = self.clock.now_ms();
        if self.lease_timer.is_some_and(|armed| armed > now) {
            // A timer armed for a later deadline, superseded: the armed one is to come.
            return;
        }
        self.lease_timer = None;
        for dispatch_id in self.leases.expired(now) {
            self.lease_due(dispatch_id);
        }
        if let Some(next) = self.leases.earliest() {
            self.arm_lease_timer(myself, next);
        }
    }

    /// Emits `dispatch_result`, counts it, answers the dispatcher.
    fn end(
        &self,
        dispatch_id: DispatchId,
        flight: &mut Flight,
        status: DispatchStatus,
        result: Result<AgentOutput, AgentError>,
    ) {
        let took = flight.started.elapsed();
        metrics::dispatch_ended(flight.kind, status, took);
        let agent_id = flight.agent_id.clone();
        if let Err(e) = &result {
            flight.span.record("otel.status_code", "error");
            flight.span.record("error.type", e.kind().as_str());
        }
        flight.span.in_scope(|| {
            self.emit(
                flight.parent,
                EventKind::DispatchResult {
                    dispatch_id,
                    agent_id,
                    provider_session_id: flight.provider_session_id.clone(),
                    status,
                    text: result.as_ref().map(|o| o.text.clone()).unwrap_or_default(),
                    error: result.as_ref().err().cloned(),
                    duration_ms: millis(took),
                    validated: validated_answer(flight.guarded, &result),
                },
            );
        });
        if let Some(reply) = flight.reply.take() {
            let _ = reply.send(result);
        }
    }

    /// Reclaims the expired lease of `dispatch_id`.
    fn lease_due(&mut self, dispatch_id: DispatchId) {
        let agent_id = self
            .leases
            .get(dispatch_id)
            .map(|l| l.agent_id.clone())
            .unwrap_or_default();
        let Some(mut flight) = self.flights.remove(&dispatch_id) else {
            self.leases.finish(dispatch_id);
            return;
        };
        // The child is cancelled; the lease is reclaimed now, whatever the child does next.
        flight.cancel.cancel();
        metrics::lease_expired();
        let ttl = self.ports.settings.lease_ttl;
        tracing::warn!(%dispatch_id, %agent_id, ?ttl, "dispatch lease expired; its child is cancelled");
        self.emit(
            flight.parent,
            EventKind::Warning {
                code: WarningCode::LeaseExpired,
                message: format!(
                    "the lease of dispatch {dispatch_id} to `{agent_id}` expired after {} ms: the agent is cancelled and the lease reclaimed",
                    millis(ttl)
                ),
            },
        );
        self.leases.finish(dispatch_id);
        let error = AgentError::timeout(
            format!("the dispatch to `{agent_id}` (lease {dispatch_id})"),
            ttl,
        );
        self.end(
            dispatch_id,
            &mut flight,
            DispatchStatus::Expired,
            Err(error),
        );
    }

    fn list(&self, reply: RpcReplyPort<Vec<AgentInfo>>) {
        let catalog = self.catalog.clone();
        let providers = self.providers.clone();
        let bindings: Vec<AgentBinding> = self
            .bindings
            .values()
            .filter_map(|b| b.stored.clone())
            .collect();
        let origin = self.views.origin();
        let supervisor = (self.catalog.get(&origin).is_some()).then_some(origin);
        // Providers may take a moment to answer: asked off the mailbox.
        tokio::spawn(async move {
            let mut health = BTreeMap::new();
            for (id, provider) in &providers {
                let h = match provider {
                    Ok(cell) => cell.provider.health().await,
                    Err(why) => AgentHealth::unavailable(why.clone()),
                };
                health.insert(id.clone(), h);
            }
            let infos = super::listing::agent_infos(
                &catalog,
                |d| health.get(&d.id).cloned().unwrap_or_else(AgentHealth::ok),
                &bindings,
                supervisor.as_deref(),
            );
            let _ = reply.send(infos);
        });
    }

    async fn shutdown(&mut self) {
        for flight in self.flights.values() {
            flight.cancel.cancel();
        }
        let shutdowns = self
            .providers
            .values()
            .filter_map(|p| p.as_ref().ok())
            .chain(&self.retired)
            .map(|cell| cell.provider.shutdown());
        futures::future::join_all(shutdowns).await;
    }

    /// New definitions are in force (A7): what the next task sees (its rules, instructions,
    /// output schema, workers), the next dispatch's provider when its provider changed, the
    /// router. Files that did not load are reported once, as `config_rejected` warnings.
    fn reload(&mut self, catalog: Arc<AgentCatalog>) {
        if Arc::ptr_eq(&catalog, &self.catalog) || *catalog == *self.catalog {
            // The tasks' views may have been made of an older version than the hub read (a
            // reload between the two reads at the session's start): they follow.
            if *self.views.catalog() != *catalog {
                self.views.replace(catalog, &self.ports, &self.model);
            }
            return;
        }
        for error in catalog
            .errors
            .iter()
            .filter(|e| !self.catalog.errors.contains(e))
        {
            tracing::warn!(%error, "agent definition rejected; the last good version stays");
            self.events.emit(EventDraft::session(EventKind::Warning {
                code: WarningCode::ConfigRejected,
                message: error.to_string(),
            }));
        }
        for (id, def) in &catalog.agents {
            let same = self
                .catalog
                .get(id)
                .is_some_and(|old| old.provider == def.provider);
            if !same {
                let built = build_provider(
                    def,
                    &self.ports,
                    &self.env,
                    &self.session,
                    self.storage_policy,
                );
                if let Some(Ok(old)) = self.providers.insert(id.clone(), built) {
                    self.retired.push(old);
                }
                self.conversations.remove(id);
            }
            self.bindings.entry(id.clone()).or_default();
        }
        let gone: Vec<String> = self
            .providers
            .keys()
            .filter(|id| !catalog.agents.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            if let Some(Ok(old)) = self.providers.remove(&id) {
                self.retired.push(old);
            }
            self.conversations.remove(&id);
        }
        self.views
            .replace(catalog.clone(), &self.ports, &self.model);
        tracing::info!(agents = catalog.agents.len(), "agent definitions reloaded");
        self.catalog = catalog;
        self.shut_down_idle_retired();
    }

    /// Shuts down the retired providers no dispatch holds any more (an external agent's
    /// processes stop; its provider session is resumed by the new provider's next dispatch).
    fn shut_down_idle_retired(&mut self) {
        let (idle, held): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retired)
            .into_iter()
            .partition(|cell| Arc::strong_count(cell) == 1);
        self.retired = held;
        for cell in idle {
            metrics::retired_provider_stopped();
            tokio::spawn(async move { cell.provider.shutdown().await });
        }
    }
}

/// Whether an actor still takes messages.
fn alive(actor: &ActorRef<ConversationMsg>) -> bool {
    matches!(
        actor.get_status(),
        ractor::ActorStatus::Running | ractor::ActorStatus::Upgrading
    )
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One dispatch's work, off the hub's mailbox: the provider's initialization, the binding,
/// the agent's answer; its end goes back to the hub as `Finished`.
struct Worker {
    hub: ActorRef<AgentHubMsg>,
    store: Arc<dyn BindingStore>,
    clock: Clock,
    session_id: SessionId,
    def: AgentDefinition,
    cell: Arc<ProviderCell>,
    dispatch_id: DispatchId,
    chain: ExecutionChain,
    parent: DispatchParent,
    input: String,
    /// The dispatcher's tool governance: an in-process agent's task narrows it.
    governance: Arc<crate::governance::TaskGovernance>,
    /// The dispatcher kept its slot for the agent's task.
    slot_lent: bool,
    tool_config: Arc<troupe_proto::governance::ToolPolicyConfig>,
    token_book: Option<crate::token_book::TokenBookRef>,
    cancel: CancellationToken,
    events: EventSink,
    env: ProviderEnv,
    span: tracing::Span,
}

/// Tells the hub the open was abandoned if its holder stops before it reported (so that a
/// dispatch waiting for the same binding opens it instead).
struct OpeningGuard {
    hub: ActorRef<AgentHubMsg>,
    agent_id: String,
    reported: bool,
}

impl Drop for OpeningGuard {
    fn drop(&mut self) {
        if !self.reported {
            let _ = self.hub.cast(AgentHubMsg::OpenAbandoned {
                agent_id: self.agent_id.clone(),
            });
        }
    }
}

impl Worker {
    async fn run(self, plan: PlanSource) {
        // A plan to open or resume is this worker's to report, whatever happens first: a
        // dispatch cancelled before its work began too (its guard goes with the unpolled work
        // and reports it), or the agent's binding would stay opening for good.
        let opening = matches!(
            &plan,
            PlanSource::Ready(Ok(BindPlan::Resume { .. } | BindPlan::Open { .. }))
        )
        .then(|| self.guard());
        // Past the lease's time the hub reclaims it (it cancels the dispatch, whose work
        // then ends here). A worker that panics ends its dispatch at once.
        let run = async {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => Err(AgentError::cancelled("the dispatch was cancelled")),
                r = self.work(plan, opening) => r,
            }
        };
        let result = std::panic::AssertUnwindSafe(run)
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(AgentError::internal("the dispatch's worker panicked")));
        // Its hold on the provider goes first: a provider a reload retired is shut down once
        // no dispatch holds it, which the hub checks when it hears this.
        let (hub, dispatch_id) = (self.hub.clone(), self.dispatch_id);
        drop(self);
        let _ = hub.cast(AgentHubMsg::Finished {
            dispatch_id,
            result,
        });
    }

    async fn work(
        &self,
        plan: PlanSource,
        opening: Option<OpeningGuard>,
    ) -> Result<AgentOutput, AgentError> {
        let provider = self.cell.ready().await?;
        let (provider_session_id, fresh) = self.bind(provider, plan, opening).await?;
        let replaced = SessionReplaced::default();
        // An in-process agent's task computes its own policy (its layers, then the
        // dispatcher's); an external agent's tool calls answer to its layers and the
        // dispatcher's, computed here.
        let governance = match self.def.provider.kind() {
            ProviderKind::Model => self.governance.clone(),
            _ => Arc::new(crate::governance::external_agent(
                &self.tool_config,
                &self.def,
                &self.governance,
            )),
        };
        let ctx = AgentRunContext {
            session_id: self.session_id,
            agent_id: &self.def.id,
            provider_session_id: &provider_session_id,
            dispatch_id: self.dispatch_id,
            chain: &self.chain,
            parent: self.parent,
            cancel: &self.cancel,
            events: &self.events,
            approvals: &self.env.approvals,
            approval_timeout: self.env.approval_timeout,
            span: &self.span,
            replaced: &replaced,
            slot_lent: self.slot_lent,
            governance: &governance,
            token_book: self.token_book.as_ref(),
        };
        let result = provider
            .handle(
                AgentInput {
                    text: self.input.clone(),
                },
                &ctx,
            )
            .await;
        if let Some((id, why)) = replaced.get() {
            self.rebind(&provider_session_id, id, why, fresh).await;
        }
        result
    }

    /// The provider session changed under the dispatch: bound in its place (a dispatch's own
    /// session is only noted on the dispatch).
    async fn rebind(&self, previous: &str, id: &str, why: &str, fresh: bool) {
        if fresh {
            self.report(Bound::Fresh {
                provider_session_id: id.to_owned(),
            });
            return;
        }
        let binding = self.binding(id, self.clock.now_ms());
        self.persist(&binding).await;
        self.report(Bound::Opened {
            binding,
            previous: Some(previous.to_owned()),
            alert: Some(why.to_owned()),
        });
    }

    /// The provider session of this dispatch, as the hub's plan says, and whether it is the
    /// dispatch's own (never bound).
    async fn bind(
        &self,
        provider: &dyn AgentProvider,
        plan: PlanSource,
        mut opening: Option<OpeningGuard>,
    ) -> Result<(String, bool), AgentError> {
        let fresh = self.def.session.binding_scope == troupe_proto::agent::BindingScope::Dispatch;
        let plan = match plan {
            PlanSource::Ready(plan) => plan?,
            PlanSource::Wait(rx) => {
                let handed = rx.await.map_err(|_| {
                    AgentError::interrupted("the agent hub stopped before the agent was bound")
                })??;
                if handed.opening.is_some() {
                    opening = handed.opening;
                }
                handed.plan
            }
        };
        self.bind_plan(provider, plan, opening)
            .await
            .map(|id| (id, fresh))
    }

    async fn bind_plan(
        &self,
        provider: &dyn AgentProvider,
        plan: BindPlan,
        mut opening: Option<OpeningGuard>,
    ) -> Result<String, AgentError> {
        let agent_id = self.def.id.clone();
        let ctx = SessionContext {
            session_id: self.session_id,
            agent_id: &self.def.id,
            dispatch_id: self.dispatch_id,
            cancel: &self.cancel,
        };
        let (previous, alert) = match plan {
            BindPlan::Use(id) => return Ok(id),
            BindPlan::Wait => {
                return Err(AgentError::internal(
                    "a bind plan of `wait` reached a worker",
                ));
            }
            BindPlan::Fresh => {
                let id = provider.open_session(&ctx).await?;
                self.report(Bound::Fresh {
                    provider_session_id: id.clone(),
                });
                return Ok(id);
            }
            BindPlan::Resume {
                provider_session_id: id,
                created_ms,
            } => {
                let mut guard = opening.take().unwrap_or_else(|| self.guard());
                match provider.resume_session(&id, &ctx).await {
                    Ok(()) => {
                        let binding = self.binding(&id, created_ms);
                        self.persist(&binding).await;
                        guard.reported = true;
                        self.report(Bound::Resumed { binding });
                        return Ok(id);
                    }
                    Err(ResumeError::NotResumable(why)) => {
                        guard.reported = true;
                        (Some(id), Some(why))
                    }
                    Err(ResumeError::Replaced {
                        provider_session_id: new,
                        reason,
                    }) => {
                        let binding = self.binding(&new, self.clock.now_ms());
                        self.persist(&binding).await;
                        guard.reported = true;
                        self.report(Bound::Opened {
                            binding,
                            previous: Some(id),
                            alert: Some(reason),
                        });
                        return Ok(new);
                    }
                    Err(ResumeError::Failed(error)) => {
                        guard.reported = true;
                        let _ = self.hub.cast(AgentHubMsg::BindFailed {
                            agent_id,
                            error: error.clone(),
                        });
                        return Err(error);
                    }
                }
            }
            BindPlan::Open { previous, alert } => (previous, alert),
        };
        let mut guard = opening.take().unwrap_or_else(|| self.guard());
        match provider.open_session(&ctx).await {
            Ok(id) => {
                let binding = self.binding(&id, self.clock.now_ms());
                self.persist(&binding).await;
                guard.reported = true;
                self.report(Bound::Opened {
                    binding,
                    previous,
                    alert,
                });
                Ok(id)
            }
            Err(error) => {
                guard.reported = true;
                let _ = self.hub.cast(AgentHubMsg::BindFailed {
                    agent_id,
                    error: error.clone(),
                });
                Err(error)
            }
        }
    }

    fn guard(&self) -> OpeningGuard {
        OpeningGuard {
            hub: self.hub.clone(),
            agent_id: self.def.id.clone(),
            reported: false,
        }
    }

    fn report(&self, bound: Bound) {
        let _ = self.hub.cast(AgentHubMsg::Bound {
            agent_id: self.def.id.clone(),
            dispatch_id: self.dispatch_id,
            bound,
        });
    }

    fn binding(&self, provider_session_id: &str, created_ms: u64) -> AgentBinding {
        let now = self.clock.now_ms();
        AgentBinding {
            session_id: self.session_id,
            agent_id: self.def.id.clone(),
            provider: self.def.provider.kind(),
            provider_session_id: provider_session_id.to_owned(),
            created_ms: created_ms.min(now),
            updated_ms: now,
        }
    }

    /// Writes the binding before the hub announces it; a store that fails costs the next run
    /// its resume, not this dispatch.
    async fn persist(&self, binding: &AgentBinding) {
        if let Err(error) = self.store.put_binding(binding.clone()).await {
            tracing::error!(agent_id = %binding.agent_id, %error, "the binding could not be stored; the next run will not resume it");
        }
    }
}

// A message of actors on this process only (see `local_message!`).
crate::local_message!(AgentHubMsg);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::playback::{NoBindings, RecordedModel};
    use troupe_proto::agent::ProviderSpec;

    fn model_agent(id: &str, workers: &[&str]) -> AgentDefinition {
        AgentDefinition {
            id: id.into(),
            role: format!("{id}s"),
            description: Some(format!("does what a {id} does")),
            provider: ProviderSpec::Model {
                model: None,
                provider: None,
                base_url: None,
                instructions: None,
            },
            session: Default::default(),
            tools: Default::default(),
            workers: workers.iter().map(|w| (*w).to_owned()).collect(),
            governance: None,
            output: None,
        }
    }

    #[test]
    fn a_view_offers_the_dispatch_tool_of_what_it_sees_built_once_for_users() {
        let catalog = AgentCatalog {
            agents: [
                model_agent("lead", &["coder"]),
                model_agent("coder", &[]),
                model_agent("reviewer", &[]),
            ]
            .into_iter()
            .map(|d| (d.id.clone(), d))
            .collect(),
            ..AgentCatalog::default()
        };
        let ports = AgentPorts {
            catalog: Arc::new(catalog.clone()),
            settings: super::super::AgentSettings::default(),
            factories: Vec::new(),
            models: BTreeMap::new(),
            bindings: Arc::new(NoBindings),
            live: None,
        };
        let model: Arc<dyn ModelClient> = Arc::new(RecordedModel::new(Vec::new()));
        let views = AgentViews::new(Arc::new(catalog), &ports, &model);
        let tool_of = |visible: &[VisibleAgent]| {
            crate::tools::OfferedTools::new(vec![super::super::route::dispatch_tool(visible)])
        };

        // A user's task: the tool of every agent the router sees, the same one each time.
        let user = views.view(None);
        assert!(!user.visible.is_empty());
        let tool = user.dispatch_tool.clone().expect("agents in sight: a tool");
        assert_eq!(tool, tool_of(&user.visible));
        let again = views.view(None).dispatch_tool.unwrap();
        assert!(Arc::ptr_eq(&tool.specs, &again.specs), "built once");
        assert!(Arc::ptr_eq(&tool.schemas, &again.schemas));

        // An agent's task: the tool of what it sees from its chain, or none.
        let origin = views.origin();
        for agent in ["lead", "coder", "reviewer"] {
            let chain = ExecutionChain::start(&origin).then(agent);
            let view = views.view(Some(&chain));
            match &view.dispatch_tool {
                None => assert!(view.visible.is_empty(), "{agent}"),
                Some(tool) => assert_eq!(*tool, tool_of(&view.visible), "{agent}"),
            }
        }
        let lead = views.view(Some(&ExecutionChain::start(&origin).then("lead")));
        assert!(lead.dispatch_tool.is_some(), "a lead sees its worker");

        // New definitions (a reload): the tool lists what the router sees now.
        let fewer = AgentCatalog {
            agents: [model_agent("coder", &[])]
                .into_iter()
                .map(|d| (d.id.clone(), d))
                .collect(),
            ..AgentCatalog::default()
        };
        views.replace(Arc::new(fewer), &ports, &model);
        let user = views.view(None);
        let reloaded = user.dispatch_tool.clone().unwrap();
        assert_eq!(reloaded, tool_of(&user.visible));
        assert_ne!(reloaded, tool, "built again with the new definitions");
        assert!(
            user.visible.iter().all(|a| a.id == "coder"),
            "{:?}",
            user.visible
        );
    }
}
