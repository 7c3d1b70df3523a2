//! Session: the root of a session's supervision tree (S1, S5, O2).
//!
//! ```text
//! Session
//! ├─ Rollout        (replaced on failure; seq continues from storage)
//! ├─ Scheduler      (replaced on failure; running tasks re-declare their grants)
//! ├─ TaskRegistry   (replaced on failure; running tasks are registered again)
//! ├─ ApprovalStore  (replaced on failure; pending requests are asked again)
//! ├─ McpPool        (when the session runs one; replaced on failure, servers restart lazily)
//! └─ Conversation × N   (the root one from the start)
//! ```
//!
//! Mailbox: `Open` spawns a linked Conversation; `Message` forwards to it with the caller's
//! reply port; `SetContext` and `Close` are forwarded by a helper task that, once the
//! conversation answered, tells the session (`ContextApplied`: the parameters a restart would
//! use now include the change; `Forget`: the conversation is gone) before replying, so any
//! later request from the same caller sees the outcome. A conversation that fails is restarted
//! from its rollout with the same id and parameters; its siblings are not touched.
//!
//! Services: every reference to a service actor is read from the session's
//! [`directory`](crate::directory), which the Session alone writes. A service actor that
//! stops (fails, or stops on its own) outside shutdown is replaced and the new one published
//! there; then each conversation is told `ServicesChanged` (no references: it reads the
//! directory). What each replacement keeps:
//! - Rollout: starts with the storage policy of every open conversation, continues `seq`
//!   after storage's last one, and first receives the events emitted while there was none
//!   (see `EventSink::emit` for what is lost).
//! - Scheduler: starts knowing the open conversations and grants nothing until each has
//!   re-declared its running task's grant (or said it has none): single-flight and any limit
//!   hold across the restart (see `scheduler`).
//! - TaskRegistry: each conversation registers its running task again (see `task_registry`).
//! - ApprovalStore: a request pending at the old store is asked again at the new one.
//! - McpPool: conversations and running tasks open new views on it.
//!
//! `Restore` opens a conversation of a previous run under its known id, its history rebuilt
//! from the rollout as after a failure (tasks that were running are recorded as aborted and
//! not run again); with `SessionConfig::root_id` the root conversation starts that way.
//! `Shutdown` closes every conversation (each with its close timeout), flushes the rollout
//! and stops the tree.

mod forward;
pub mod metrics;
mod passivation;
mod spawn;
mod supervision;

use crate::approval_store::{ApprovalMsg, ApprovalStore, ApprovalStoreArgs};
use crate::clock::Clock;
use crate::conversation::{
    Conversation, ConversationArgs, ConversationMsg, ConversationSettings, RestoreCause, Services,
};
pub use crate::directory::ServiceRefs;
use crate::directory::{DirectoryWriter, RolloutChannel};
use crate::events::{EventDraft, EventSink};
use crate::history::Summarizer;
use crate::mcp_pool::{McpLimits, McpPoolArgs, McpPoolHandle};
use crate::ports::{
    CommandRunner, McpConnector, McpPort, McpServerConfig, ModelClient, TokenCounter,
};
use crate::rollout::storage::RolloutStorage;
use crate::rollout::{FileRolloutStorage, Rollout, RolloutArgs, RolloutMsg};
use crate::scheduler::{Scheduler, SchedulerArgs, SchedulerMsg, SchedulerStart};
use crate::task_registry::{TaskRegistry, TaskRegistryArgs, TaskRegistryMsg};
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort,
    SupervisionEvent,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use troupe_proto::{
    AgentError, CloseOutcome, Closed, ConversationId, ConversationStats, MessageReply,
    OpenConversation, SessionId, SetContext, StoragePolicy,
};

use self::forward::ConversationRequest;
pub use self::passivation::{PassivationRoute, Standing, passivation_accepted, request_route};
use self::spawn::*;

/// How a session is set up.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Root of durable data; the rollout lives in `<data_dir>/rollout/<session_id>/` unless
    /// `SessionPorts::rollout_storage` says otherwise.
    pub data_dir: PathBuf,
    pub scheduler: SchedulerArgs,
    pub conversation: ConversationSettings,
    /// How long an approval request waits for a human.
    pub approval_timeout: Duration,
    pub approval_sweep_interval: Duration,
    /// How often whoever owns the session's storage (`troupe serve`, `troupe chat`) sweeps
    /// Ttl content that came due; the session itself does not sweep.
    pub ttl_sweep_interval: Duration,
    /// Live events buffered per subscriber before it lags.
    pub subscriber_capacity: usize,
    /// Parameters of the root conversation.
    pub root: OpenConversation,
    /// The root conversation's id: a session restored after a restart gives its old one, and
    /// the root is rebuilt from its rollout (opened as new if it has none). `None`: a new id.
    pub root_id: Option<ConversationId>,
    /// Open conversations allowed at once; one more is `Overloaded`.
    pub max_conversations: usize,
    /// MCP servers of the session, pooled by the McpPool (S12) when a connector is plugged in.
    pub mcp_servers: Vec<McpServerConfig>,
    pub mcp_limits: McpLimits,
    /// Workspace roots offered to MCP servers (`roots/list`).
    pub mcp_roots: Vec<String>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("data"),
            scheduler: SchedulerArgs::default(),
            conversation: ConversationSettings::default(),
            approval_timeout: Duration::from_secs(300),
            approval_sweep_interval: Duration::from_secs(30),
            ttl_sweep_interval: Duration::from_secs(60),
            subscriber_capacity: 1024,
            root: OpenConversation::default(),
            root_id: None,
            max_conversations: 1_000_000,
            mcp_servers: Vec::new(),
            mcp_limits: McpLimits::default(),
            mcp_roots: Vec::new(),
        }
    }
}

/// The ports a session plugs in.
#[derive(Clone)]
pub struct SessionPorts {
    pub model: Arc<dyn ModelClient>,
    /// An MCP port to use as is (tests, embedders); when `None` and a connector is given,
    /// the session runs its own McpPool over `SessionConfig::mcp_servers`.
    pub mcp: Option<Arc<dyn McpPort>>,
    /// Opens MCP connections for the session's pool.
    pub mcp_connector: Option<Arc<dyn McpConnector>>,
    pub exec: Option<Arc<dyn CommandRunner>>,
    /// Whether tool calls and dispatches run (`Effects::Live`, what every session but a
    /// replay uses) or are played back from a recording.
    pub effects: crate::ports::Effects,
    pub summarizer: Arc<dyn Summarizer>,
    /// Estimates prompts (T5); `ApproxTokens` when no tokenizer is plugged in.
    pub tokens: Arc<dyn TokenCounter>,
    /// Where the rollout is kept; `None`: JSONL files under `<data_dir>/rollout`.
    pub rollout_storage: Option<Arc<dyn RolloutStorage>>,
    /// The session's agents (A1–A4); `None` (or no definition): no AgentHub, and messages
    /// are answered by their conversation as without agents.
    pub agents: Option<crate::agents::AgentPorts>,
}

/// Start-up arguments.
pub struct SessionArgs {
    pub session_id: SessionId,
    pub config: SessionConfig,
    pub ports: SessionPorts,
}

/// The Session's mailbox.
pub enum SessionMsg {
    /// Opens a conversation.
    Open {
        params: OpenConversation,
        reply: RpcReplyPort<Result<ConversationId, AgentError>>,
    },
    /// Opens a conversation of a previous run under its id, rebuilt from the rollout. Already
    /// open: nothing to do.
    Restore {
        conversation_id: ConversationId,
        params: OpenConversation,
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    /// Runs one task in a conversation.
    Message {
        conversation_id: ConversationId,
        text: String,
        /// Its request layer of the tool policy and the authorization tokens it presents.
        options: crate::governance::RequestGovernance,
        /// Set when the message is still being stored ([`crate::task::StoredGate`]).
        stored: Option<crate::task::StoredGate>,
        reply: RpcReplyPort<Result<MessageReply, AgentError>>,
    },
    /// Opens the conversation of an in-process agent, with its own model client (`None`: the
    /// session's); with `restore`, reopens that one from the rollout (already open: nothing
    /// to do). Answers its id.
    OpenAgent {
        restore: Option<ConversationId>,
        params: OpenConversation,
        model: Option<Arc<dyn ModelClient>>,
        reply: RpcReplyPort<Result<ConversationId, AgentError>>,
    },
    /// Runs a dispatched message in an agent's conversation: its task carries the dispatch
    /// (chain, cancellation).
    Dispatch {
        conversation_id: ConversationId,
        text: String,
        origin: crate::agents::DispatchOrigin,
        reply: crate::conversation::Answer,
    },
    /// Compacts a conversation's history.
    Compact {
        conversation_id: ConversationId,
        reply: RpcReplyPort<Result<MessageReply, AgentError>>,
    },
    /// Changes a conversation's context.
    SetContext {
        conversation_id: ConversationId,
        update: SetContext,
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    /// Closes a conversation; idempotent.
    Close {
        conversation_id: ConversationId,
        reply: RpcReplyPort<Closed>,
    },
    /// A close completed: drop the conversation from the map.
    Forget { conversation_id: ConversationId },
    /// Open conversations, root first.
    List {
        reply: RpcReplyPort<Vec<ConversationId>>,
    },
    /// The root conversation's id.
    Root { reply: RpcReplyPort<ConversationId> },
    /// The actor of an open conversation (for supervision-level tools and tests).
    Conversation {
        conversation_id: ConversationId,
        reply: RpcReplyPort<Option<ActorRef<ConversationMsg>>>,
    },
    /// A conversation's statistics (S11): from its actor when it is live, from the session's
    /// index when it is passivated (it is not reactivated for a read). Dropped unanswered
    /// when it is not open.
    Stats {
        conversation_id: ConversationId,
        reply: RpcReplyPort<ConversationStats>,
    },
    /// Where a conversation stands, without reactivating it (observation, tests).
    Standing {
        conversation_id: ConversationId,
        reply: RpcReplyPort<Option<Standing>>,
    },
    /// References to the service actors now.
    Services { reply: RpcReplyPort<ServiceRefs> },
    /// A context change a conversation accepted: keep the restart parameters in step.
    ContextApplied {
        conversation_id: ConversationId,
        update: SetContext,
    },
    /// The session's own McpPool, if it runs one (observation, tests).
    McpPool {
        reply: RpcReplyPort<Option<McpPoolHandle>>,
    },
    /// Emits an event of the session through its current Rollout (the service's own events,
    /// such as a stored message's outcome).
    Emit { draft: EventDraft },
    /// A conversation has been idle for `passivate_after` (from its actor `actor`).
    PassivationOffered {
        conversation_id: ConversationId,
        actor: ActorId,
    },
    /// The conversation asked to passivate answered (`None`: it was gone before it could
    /// answer).
    PassivationAnswered {
        conversation_id: ConversationId,
        actor: ActorId,
        answer: Option<crate::conversation::PassivateAnswer>,
    },
    /// Closes everything, flushes the rollout, stops the tree.
    Shutdown { reply: RpcReplyPort<()> },
}

/// An open conversation in the session's index: its actor, or (passivated) only what starts
/// it again. Both variants are one pointer, so a passivated conversation costs the map slot
/// and its boxed parameters.
enum ConversationEntry {
    Live(Box<LiveConversation>),
    Passivated(Box<Dormant>),
}

/// What the session keeps of a passivated conversation.
struct Dormant {
    /// What starts it again.
    params: OpenConversation,
    /// Its statistics when it stopped, which answer statistics reads while it sleeps (`None`
    /// when its stop was seen before its answer, until the answer comes).
    stats: Option<self::passivation::DormantStats>,
    /// The actor that stopped (its process-local id), whose late answer may still bring
    /// `stats`.
    actor: u64,
}

struct LiveConversation {
    actor: ActorRef<ConversationMsg>,
    params: OpenConversation,
    /// An agent's own model client, kept for its restarts.
    model: Option<Arc<dyn ModelClient>>,
    /// `Some` while the conversation is asked to passivate: the requests for it that came
    /// meanwhile, delivered in order once it answered (to it, or to its reactivation).
    held: Option<Vec<ConversationRequest>>,
}

impl ConversationEntry {
    fn params(&self) -> &OpenConversation {
        match self {
            Self::Live(live) => &live.params,
            Self::Passivated(dormant) => &dormant.params,
        }
    }

    fn params_mut(&mut self) -> &mut OpenConversation {
        match self {
            Self::Live(live) => &mut live.params,
            Self::Passivated(dormant) => &mut dormant.params,
        }
    }

    fn standing(&self) -> Standing {
        match self {
            Self::Live(live) if live.held.is_some() => Standing::Asked,
            Self::Live(_) => Standing::Live,
            Self::Passivated(_) => Standing::Passivated,
        }
    }

    /// An agent's conversation told its definition as it is now: its instructions and model
    /// for its next tasks, kept for its restarts and its reactivation. Nothing when nothing
    /// changed.
    fn redefine(&mut self, params: OpenConversation, model: Option<Arc<dyn ModelClient>>) {
        match self {
            Self::Live(live) => {
                let same_client = match (&live.model, &model) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                };
                if same_client
                    && live.params.base_instructions == params.base_instructions
                    && live.params.model == params.model
                    && live.params.provider == params.provider
                {
                    return;
                }
                live.params.base_instructions = params.base_instructions.clone();
                live.params.model = params.model.clone();
                live.params.provider = params.provider.clone();
                live.model = model.clone();
                let _ = live.actor.cast(ConversationMsg::Redefine {
                    base_instructions: params.base_instructions,
                    provider: params.provider,
                    model_name: params.model,
                    model,
                });
            }
            Self::Passivated(dormant) => {
                let stored = &mut dormant.params;
                stored.base_instructions = params.base_instructions;
                stored.model = params.model;
                stored.provider = params.provider;
            }
        }
    }

    fn live(&self) -> Option<&LiveConversation> {
        match self {
            Self::Live(live) => Some(live),
            Self::Passivated(_) => None,
        }
    }
}

/// The Session's state.
pub struct SessionState {
    id: SessionId,
    config: SessionConfig,
    ports: SessionPorts,
    clock: Clock,
    /// The Rollout's storage, kept for its restarts.
    rollout_storage: Arc<dyn RolloutStorage>,
    /// The one place the service actors are published; everyone else reads it.
    directory: DirectoryWriter,
    root: ConversationId,
    conversations: HashMap<ConversationId, ConversationEntry>,
    by_actor: HashMap<ActorId, ConversationId>,
    /// The session's McpPool, when it runs one.
    mcp_pool: Option<McpPoolHandle>,
    /// The session's AgentHub, when it has agents.
    agent_hub: Option<ActorRef<crate::agents::hub::AgentHubMsg>>,
    shutting_down: bool,
    /// Keeps this session counted in `troupe_sessions_live` while the state exists.
    _live: metrics::Live,
    /// Reports what the service's reloads rejected, while the session lives.
    _rejections: Option<RejectionReporter>,
}

/// Reports, as `config_rejected` warnings of the session, the capability folders and
/// configuration changes a running service did not take (A7): each once, when it is new.
/// Stops with the session.
struct RejectionReporter(tokio::task::JoinHandle<()>);

impl Drop for RejectionReporter {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl RejectionReporter {
    fn start(
        mut live: tokio::sync::watch::Receiver<Arc<crate::conversation::Reloadable>>,
        events: EventSink,
    ) -> Self {
        Self(tokio::spawn(async move {
            let mut seen = live.borrow_and_update().clone();
            while live.changed().await.is_ok() {
                let now = live.borrow_and_update().clone();
                for error in new_rejections(&seen, &now) {
                    tracing::warn!(%error, "configuration rejected");
                    events.emit(EventDraft::session(troupe_proto::EventKind::Warning {
                        code: troupe_proto::WarningCode::ConfigRejected,
                        message: error.to_string(),
                    }));
                }
                seen = now;
            }
        }))
    }
}

/// The rejections `now` has that `before` did not. Pure.
pub fn new_rejections<'a>(
    before: &crate::conversation::Reloadable,
    now: &'a crate::conversation::Reloadable,
) -> Vec<&'a troupe_proto::agent::AgentLoadError> {
    now.capabilities
        .errors
        .iter()
        .filter(|e| !before.capabilities.errors.contains(e))
        .chain(now.rejected.iter().filter(|e| !before.rejected.contains(e)))
        .collect()
}

/// The Session actor.
pub struct Session;

#[ractor::async_trait]
impl Actor for Session {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SessionArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let clock = Clock::new();
        let cell = myself.get_cell();
        let rollout_storage = args.ports.rollout_storage.clone().unwrap_or_else(|| {
            Arc::new(FileRolloutStorage::new(
                args.config.data_dir.join("rollout"),
            ))
        });
        let rollout = spawn_rollout(
            args.session_id,
            &args.config,
            rollout_storage.clone(),
            clock,
            Vec::new(),
            &cell,
        )
        .await?;
        // The ApprovalStore needs its event sink before the rest of the directory exists.
        let rollout = RolloutChannel::new(rollout);
        let scheduler = spawn_scheduler(&args.config, Vec::new(), &cell).await?;
        let registry = spawn_registry(&cell).await?;
        let approvals = spawn_approvals(&args.config, clock, rollout.events(), &cell).await?;
        let ports = args.ports;
        let directory =
            DirectoryWriter::new(rollout, scheduler, registry, approvals, ports.mcp.clone());
        let mut mcp_pool = None;
        if ports.mcp.is_none()
            && let Some(connector) = ports.mcp_connector.clone()
            && !args.config.mcp_servers.is_empty()
        {
            let pool = spawn_mcp_pool(
                &args.config,
                connector,
                ports.model.clone(),
                clock,
                &directory,
                &cell,
            )
            .await?;
            directory.replace_mcp(Some(Arc::new(pool.clone())));
            mcp_pool = Some(pool);
        }
        let mut state = SessionState {
            id: args.session_id,
            config: args.config,
            ports,
            mcp_pool,
            clock,
            rollout_storage,
            directory,
            root: ConversationId::new(),
            conversations: HashMap::new(),
            by_actor: HashMap::new(),
            agent_hub: None,
            shutting_down: false,
            _live: metrics::Live::start(),
            _rejections: None,
        };
        state._rejections = state
            .config
            .conversation
            .live
            .clone()
            .map(|live| RejectionReporter::start(live, state.directory.events()));
        let hub = spawn_agent_hub(&myself, &state).await?;
        state.agent_hub = hub.as_ref().map(|h| h.actor.clone());
        state.directory.replace_agents(hub);
        let root_params = state.config.root.clone();
        let root_id = state.config.root_id;
        let restore = root_id.map(|_| RestoreCause::Restart);
        let root = state
            .spawn_conversation(&cell, root_id, root_params, None, restore)
            .await?;
        state.root = root;
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SessionMsg::Open { params, reply } => {
                let opened = state.open(&myself.get_cell(), params).await;
                let _ = reply.send(opened);
            }
            SessionMsg::Restore {
                conversation_id,
                params,
                reply,
            } => {
                let restored = state
                    .restore(&myself.get_cell(), conversation_id, params)
                    .await;
                let _ = reply.send(restored);
            }
            SessionMsg::Message {
                conversation_id,
                text,
                options,
                stored,
                reply,
            } => {
                let request = crate::task::TaskRequest {
                    origin: None,
                    options,
                    stored,
                };
                let request = ConversationRequest::Message {
                    text,
                    request,
                    reply: reply.into(),
                };
                state.deliver(&myself, conversation_id, request).await;
            }
            SessionMsg::OpenAgent {
                restore,
                params,
                model,
                reply,
            } => {
                let opened = state
                    .open_agent(&myself.get_cell(), restore, params, model)
                    .await;
                let _ = reply.send(opened);
            }
            SessionMsg::Dispatch {
                conversation_id,
                text,
                origin,
                reply,
            } => {
                let request = crate::task::TaskRequest {
                    origin: Some(origin),
                    options: crate::governance::RequestGovernance::default(),
                    stored: None,
                };
                let request = ConversationRequest::Message {
                    text,
                    request,
                    reply,
                };
                state.deliver(&myself, conversation_id, request).await;
            }
            SessionMsg::SetContext {
                conversation_id,
                update,
                reply,
            } => {
                let request = ConversationRequest::SetContext { update, reply };
                state.deliver(&myself, conversation_id, request).await;
            }
            SessionMsg::Compact {
                conversation_id,
                reply,
            } => {
                let request = ConversationRequest::Compact { reply };
                state.deliver(&myself, conversation_id, request).await;
            }
            SessionMsg::Close {
                conversation_id,
                reply,
            } => {
                let request = ConversationRequest::Close { reply };
                state.deliver(&myself, conversation_id, request).await;
            }
            SessionMsg::Forget { conversation_id } => state.forget(conversation_id),
            SessionMsg::List { reply } => {
                let _ = reply.send(state.list());
            }
            SessionMsg::Root { reply } => {
                let _ = reply.send(state.root);
            }
            SessionMsg::Conversation {
                conversation_id,
                reply,
            } => {
                let request = ConversationRequest::Actor { reply };
                state.deliver(&myself, conversation_id, request).await;
            }
            SessionMsg::Stats {
                conversation_id,
                reply,
            } => {
                if let Some(ConversationEntry::Passivated(dormant)) =
                    state.conversations.get(&conversation_id)
                    && let Some(stats) = &dormant.stats
                {
                    let _ = reply.send(stats.read(conversation_id));
                } else {
                    let request = ConversationRequest::Stats { reply };
                    state.deliver(&myself, conversation_id, request).await;
                }
            }
            SessionMsg::Standing {
                conversation_id,
                reply,
            } => {
                let standing = state
                    .conversations
                    .get(&conversation_id)
                    .map(ConversationEntry::standing);
                let _ = reply.send(standing);
            }
            SessionMsg::Services { reply } => {
                let _ = reply.send(state.directory.snapshot());
            }
            SessionMsg::ContextApplied {
                conversation_id,
                update,
            } => {
                if let Some(entry) = state.conversations.get_mut(&conversation_id) {
                    entry.params_mut().apply(&update);
                }
            }
            SessionMsg::McpPool { reply } => {
                let _ = reply.send(state.mcp_pool.clone());
            }
            SessionMsg::Emit { draft } => {
                state.directory.events().emit(draft);
            }
            SessionMsg::PassivationOffered {
                conversation_id,
                actor,
            } => state.on_passivation_offered(&myself, conversation_id, actor),
            SessionMsg::PassivationAnswered {
                conversation_id,
                actor,
                answer,
            } => {
                state
                    .on_passivation_answered(&myself, conversation_id, actor, answer)
                    .await;
            }
            SessionMsg::Shutdown { reply } => {
                state.shutdown().await;
                let _ = reply.send(());
                myself.stop(Some("shutdown".into()));
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                tracing::error!(session_id = %state.id, actor = %cell.get_id(), error = %err, "child failed");
                state.child_down(&myself.get_cell(), &cell, true).await?;
            }
            SupervisionEvent::ActorTerminated(cell, last_state, reason) => {
                tracing::debug!(session_id = %state.id, actor = %cell.get_id(), ?reason, "child stopped");
                // ractor hands a stopped child's state to its supervisor. Drop it before a
                // replacement starts: a Rollout's state holds its writer, whose sink (and the
                // session's writer lease) a new Rollout waits for.
                drop(last_state);
                state.child_down(&myself.get_cell(), &cell, false).await?;
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.shutting_down = true;
        Ok(())
    }
}

impl SessionState {
    fn conversation_services(&self) -> Services {
        let directory = self.directory.directory();
        Services {
            session_id: self.id,
            events: directory.events(),
            directory,
            clock: self.clock,
            model: self.ports.model.clone(),
            exec: self.ports.exec.clone(),
            effects: self.ports.effects.clone(),
            summarizer: self.ports.summarizer.clone(),
            tokens: self.ports.tokens.clone(),
            settings: Arc::new(ConversationSettings {
                mcp_servers: self
                    .config
                    .mcp_servers
                    .iter()
                    .map(|s| s.name.clone())
                    .collect(),
                ..self.config.conversation.clone()
            }),
        }
    }

    async fn spawn_conversation(
        &mut self,
        cell: &ActorCell,
        id: Option<ConversationId>,
        params: OpenConversation,
        model: Option<Arc<dyn ModelClient>>,
        restore: Option<RestoreCause>,
    ) -> Result<ConversationId, AgentError> {
        let conversation_id = id.unwrap_or_default();
        let args = ConversationArgs {
            conversation_id,
            params: params.clone(),
            services: self.conversation_services(),
            restore: restore.is_some(),
            restore_cause: restore.unwrap_or_default(),
            model: model.clone(),
        };
        let (actor, _) = Actor::spawn_linked(None, Conversation, args, cell.clone())
            .await
            .map_err(|e| open_error(&e))?;
        self.by_actor.insert(actor.get_id(), conversation_id);
        self.conversations.insert(
            conversation_id,
            ConversationEntry::Live(Box::new(LiveConversation {
                actor,
                params,
                model,
                held: None,
            })),
        );
        Ok(conversation_id)
    }

    /// An in-process agent's conversation: opened, or (`restore`) reopened from the rollout
    /// when it is not open.
    async fn open_agent(
        &mut self,
        cell: &ActorCell,
        restore: Option<ConversationId>,
        params: OpenConversation,
        model: Option<Arc<dyn ModelClient>>,
    ) -> Result<ConversationId, AgentError> {
        if let Some(id) = restore
            && let Some(entry) = self.conversations.get_mut(&id)
        {
            // Open (or passivated) already: its definition may have changed since (A7).
            entry.redefine(params, model);
            return Ok(id);
        }
        self.admit_conversation()?;
        let cause = restore.map(|_| RestoreCause::Restart);
        self.spawn_conversation(cell, restore, params, model, cause)
            .await
    }

    async fn open(
        &mut self,
        cell: &ActorCell,
        params: OpenConversation,
    ) -> Result<ConversationId, AgentError> {
        self.admit_conversation()?;
        self.spawn_conversation(cell, None, params, None, None)
            .await
    }

    async fn restore(
        &mut self,
        cell: &ActorCell,
        conversation_id: ConversationId,
        params: OpenConversation,
    ) -> Result<(), AgentError> {
        if self.conversations.contains_key(&conversation_id) {
            return Ok(());
        }
        self.admit_conversation()?;
        self.spawn_conversation(
            cell,
            Some(conversation_id),
            params,
            None,
            Some(RestoreCause::Restart),
        )
        .await
        .map(|_| ())
    }

    /// Whether one more conversation may open.
    fn admit_conversation(&self) -> Result<(), AgentError> {
        if self.shutting_down {
            return Err(AgentError::cancelled("session is shutting down"));
        }
        if self.conversations.len() >= self.config.max_conversations {
            return Err(AgentError::Overloaded {
                resource: "open conversations".into(),
                limit: u32::try_from(self.config.max_conversations).unwrap_or(u32::MAX),
            });
        }
        Ok(())
    }

    fn forget(&mut self, id: ConversationId) {
        if let Some(ConversationEntry::Live(live)) = self.conversations.remove(&id) {
            self.by_actor.remove(&live.actor.get_id());
        }
    }

    fn list(&self) -> Vec<ConversationId> {
        let mut ids: Vec<ConversationId> = self.conversations.keys().copied().collect();
        ids.sort_by_key(|id| (*id != self.root, *id));
        ids
    }

    async fn shutdown(&mut self) {
        self.shutting_down = true;
        // Dispatches in flight are cancelled and the agents' processes stopped first: a
        // conversation waiting for an agent then ends at once.
        if let Some(hub) = &self.agent_hub {
            let _ = ractor::call!(hub, |r| crate::agents::hub::AgentHubMsg::Shutdown {
                reply: r
            });
        }
        // A passivated conversation has nothing running: there is nothing to close.
        let closes = self.conversations.values().filter_map(|e| {
            let actor = e.live()?.actor.clone();
            Some(async move { ractor::call!(actor, |r| ConversationMsg::Close { reply: r }) })
        });
        futures::future::join_all(closes).await;
        if let Some(pool) = &self.mcp_pool {
            pool.shutdown().await;
        }
        let rollout = self.directory.snapshot().rollout;
        if let Err(e) = ractor::call!(rollout, |r| RolloutMsg::Flush { reply: r }) {
            tracing::error!(error = %e, "rollout flush at shutdown failed");
        }
        // Drain, not stop: whatever is still queued for the rollout is written first.
        if let Err(e) = rollout.drain_and_wait(Some(Duration::from_secs(30))).await {
            tracing::error!(error = %e, "rollout did not drain at shutdown");
        }
    }
}

/// A conversation that fails to start reports why: its own `AgentError` when it has one.
fn open_error(e: &ractor::SpawnErr) -> AgentError {
    match e {
        ractor::SpawnErr::StartupFailed(inner) => match inner.downcast_ref::<AgentError>() {
            Some(agent) => agent.clone(),
            None => AgentError::internal(format!("conversation failed to start: {inner}")),
        },
        other => AgentError::internal(format!("conversation failed to start: {other}")),
    }
}

// A message of actors on this process only (see `local_message!`).
crate::local_message!(SessionMsg);
