//! Sessions: the service's registry of sessions (P1, S5, O2).
//!
//! ```text
//! Sessions (one per service)
//! └─ Session × N   started with SessionHandle::start, one per stored session
//!      └─ (its own supervision tree: Rollout, Scheduler, TaskRegistry, ApprovalStore, ...)
//! ```
//!
//! It is the only writer of the [`Store`]: every write happens in `handle`, so writes are
//! ordered and a reply that depends on a write is sent after it. It never waits for a session
//! in `handle`: work that does (starting a session, opening, closing, running a task) runs in
//! a spawned tokio task that sends a past-tense notification back with the caller's reply
//! port; the store write and the reply happen when that notification is handled.
//!
//! # Mailbox
//! - `Create` → task: start the session → `Started` → store the session and its root
//!   conversation, register, reply.
//! - `Open` → task: open → `Opened` → store the conversation, reply.
//! - `SetContext` → task: update → `ContextChanged` → store the new parameters, reply.
//! - `Close` → task: close (waits for the running task up to its close timeout) → `Closed` →
//!   mark it closed in the store, reply.
//! - `Send` → admission ([`admit`]: the conversation's queue and the session's scheduler
//!   queue are mirrored here, so a full queue answers `Overloaded` at once and stores
//!   nothing) → store the user message → reply now when the caller does not wait → task: run
//!   it → `TaskDone` → store the assistant reply (content only under `Full`/`Ttl`), reply when
//!   the caller waits.
//! - `Get`, `List`, `Conversations`, `Messages`, `Current`, `SetCurrent`, `Resolve`, `Ready`:
//!   answered at once (store reads are short).
//! - `Drain`: stop admitting messages; answered once none is in flight.
//! - `Shutdown`: shuts every session down (running tasks are cancelled, rollouts flushed).
//!
//! Every request carries the caller's [`Scope`]; a session outside it is `NotFound`.
//!
//! # Start-up
//! `pre_start` loads every stored session with its conversations and starts each again
//! under its ids ([`restore_plan`]): the root conversation through `SessionConfig::root_id`,
//! every other open one through `SessionHandle::restore`; their history comes back from the
//! rollout, and a task a crash interrupted is recorded as aborted, not run again. A session
//! that cannot be restarted stays registered without a running session (its records,
//! messages and current-session binding are served; work on it answers `Internal`).
//!
//! # Failure
//! A session's own supervisor restarts its conversations and services. A session that stops
//! on its own anyway (its actor failed) is started again here under its ids, as at start-up
//! (`SessionStopped` → task: [`restart`] → `SessionRestarted`), at most
//! [`RESTARTS_PER_WINDOW`] times per [`RESTART_WINDOW`]; past that it stays down and calls on
//! it answer `Internal`. While the service drains, stopped sessions stay stopped. If this
//! actor fails, the service stops taking work: `troupe serve` exits non-zero and a restart
//! reloads everything from the store.

use super::api::{CreateSession, Sent};
use super::auth::Scope;
use crate::store::Store;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::task::JoinHandle;
use tracing::Instrument;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::store::{
    ConversationRecord, ConversationState, MessagePage, MessageRecord, NewMessage, SessionRecord,
};
use troupe_proto::{
    AgentError, CloseOutcome, Closed, ConversationId, ErrorKind, Json, MessageReply,
    OpenConversation, Role, SessionId, SetContext, StoragePolicy,
};

/// What every new session starts from.
#[derive(Clone)]
pub struct SessionTemplate {
    pub config: SessionConfig,
    pub ports: SessionPorts,
}

/// Queue limits mirrored for admission (see [`admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Tasks running at once per session (the scheduler's limit).
    pub running: usize,
    /// Tasks waiting for a slot per session (the scheduler's queue).
    pub task_queue: usize,
    /// Messages waiting behind a conversation's running task.
    pub conversation_queue: usize,
}

impl Limits {
    pub fn of(config: &SessionConfig) -> Self {
        Self {
            running: config.scheduler.limit.max(1),
            task_queue: config.scheduler.queue_capacity,
            conversation_queue: config.conversation.max_queued_messages,
        }
    }
}

/// Start-up arguments.
pub struct SessionsArgs {
    pub store: Arc<dyn Store>,
    pub template: SessionTemplate,
}

/// A session, what the transports need to work on it directly.
#[derive(Clone)]
pub struct Resolved {
    pub record: SessionRecord,
    pub handle: SessionHandle,
    /// Every conversation the session ever had (closed ones too), oldest first.
    pub conversations: Vec<ConversationId>,
}

type Reply<T> = RpcReplyPort<Result<T, AgentError>>;

/// The registry's mailbox.
pub enum SessionsMsg {
    /// Creates a session and its root conversation.
    Create {
        scope: Scope,
        request: CreateSession,
        reply: Reply<SessionRecord>,
    },
    /// A session's record.
    Get {
        scope: Scope,
        session_id: SessionId,
        reply: Reply<SessionRecord>,
    },
    /// Sessions visible to the caller (of one project when given), newest first.
    List {
        scope: Scope,
        project_id: Option<String>,
        reply: Reply<Vec<SessionRecord>>,
    },
    /// A session's running handle, for approvals, tasks, statistics and event streams.
    Resolve {
        scope: Scope,
        session_id: SessionId,
        reply: Reply<Resolved>,
    },
    /// A session's conversations, oldest first.
    Conversations {
        scope: Scope,
        session_id: SessionId,
        reply: Reply<Vec<ConversationRecord>>,
    },
    /// Opens a conversation.
    Open {
        scope: Scope,
        session_id: SessionId,
        params: OpenConversation,
        reply: Reply<ConversationId>,
    },
    /// Changes a conversation's context.
    SetContext {
        scope: Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
        update: SetContext,
        reply: Reply<()>,
    },
    /// Closes a conversation; idempotent.
    Close {
        scope: Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
        reply: Reply<Closed>,
    },
    /// Stores a user message and runs it (the root conversation when none is named).
    Send {
        scope: Scope,
        session_id: SessionId,
        conversation_id: Option<ConversationId>,
        text: String,
        wait: bool,
        reply: Reply<Sent>,
    },
    /// A page of a session's messages.
    Messages {
        scope: Scope,
        session_id: SessionId,
        limit: usize,
        before: Option<u64>,
        reply: Reply<MessagePage>,
    },
    /// Points a project at one of its sessions.
    SetCurrent {
        scope: Scope,
        project_id: String,
        session_id: SessionId,
        reply: Reply<SessionRecord>,
    },
    /// A project's current session.
    Current {
        scope: Scope,
        project_id: String,
        reply: Reply<SessionRecord>,
    },
    /// The store answers and this registry is up.
    Ready { reply: Reply<()> },
    /// A session's actor stopped (its watcher saw it end).
    SessionStopped {
        session_id: SessionId,
        actor: ractor::ActorId,
    },
    /// A stopped session was started again (or could not be).
    SessionRestarted {
        session_id: SessionId,
        result: Result<(SessionHandle, JoinHandle<()>), AgentError>,
    },
    /// Stops admitting messages; answered once none is in flight.
    Drain { reply: RpcReplyPort<()> },
    /// Shuts every session down.
    Shutdown { reply: RpcReplyPort<()> },
    /// A session started for `Create`.
    Started {
        record: SessionRecord,
        root: ConversationRecord,
        handle: SessionHandle,
        reply: Reply<SessionRecord>,
    },
    /// A conversation opened for `Open`.
    Opened {
        record: ConversationRecord,
        reply: Reply<ConversationId>,
    },
    /// A context update was applied by the conversation.
    ContextChanged {
        session_id: SessionId,
        conversation_id: ConversationId,
        result: Result<SetContext, AgentError>,
        reply: Reply<()>,
    },
    /// A close finished.
    Closed {
        session_id: SessionId,
        result: Result<Closed, AgentError>,
        reply: Reply<Closed>,
    },
    /// A message's task ended (or could not run).
    TaskDone {
        user: MessageRecord,
        result: Result<MessageReply, AgentError>,
        /// The caller, when it waits for the reply.
        reply: Option<Reply<Sent>>,
    },
}

/// A conversation as the registry tracks it.
#[derive(Debug, Clone)]
struct Conv {
    record: ConversationRecord,
    /// Messages sent and not yet answered (running + queued).
    in_flight: usize,
}

/// A session as the registry tracks it.
struct Entry {
    record: SessionRecord,
    /// `None` for a stored session that is not running.
    handle: Option<SessionHandle>,
    conversations: HashMap<ConversationId, Conv>,
}

impl Entry {
    fn active(&self) -> usize {
        self.conversations
            .values()
            .filter(|c| c.in_flight > 0)
            .count()
    }
}

/// The registry's pure core: sessions, conversations, in-flight counts.
#[derive(Default)]
pub struct Registry {
    sessions: HashMap<SessionId, Entry>,
    in_flight: usize,
}

impl Registry {
    fn visible(&self, scope: &Scope, session_id: SessionId) -> Result<&Entry, AgentError> {
        self.sessions
            .get(&session_id)
            .filter(|e| scope.sees(e.record.project_id.as_deref()))
            .ok_or_else(|| AgentError::not_found("session", session_id))
    }

    fn running(&self, scope: &Scope, session_id: SessionId) -> Result<&SessionHandle, AgentError> {
        self.visible(scope, session_id)?
            .handle
            .as_ref()
            .ok_or_else(|| {
                AgentError::internal(format!(
                    "session {session_id} is stored but not running in this process"
                ))
            })
    }

    /// An open conversation of a visible session.
    fn open_conversation(
        &self,
        scope: &Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<&Conv, AgentError> {
        self.visible(scope, session_id)?
            .conversations
            .get(&conversation_id)
            .filter(|c| c.record.state == ConversationState::Open)
            .ok_or_else(|| AgentError::not_found("conversation", conversation_id))
    }

    /// Sessions visible to `scope`, of `project` when given, newest first.
    fn list(&self, scope: &Scope, project: Option<&str>) -> Vec<SessionRecord> {
        let mut out: Vec<SessionRecord> = self
            .sessions
            .values()
            .map(|e| &e.record)
            .filter(|r| scope.sees(r.project_id.as_deref()))
            .filter(|r| project.is_none() || r.project_id.as_deref() == project)
            .cloned()
            .collect();
        out.sort_by_key(|r| std::cmp::Reverse((r.created_ms, r.session_id)));
        out
    }

    fn conv_mut(
        &mut self,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Option<&mut Conv> {
        self.sessions
            .get_mut(&session_id)?
            .conversations
            .get_mut(&conversation_id)
    }

    fn begin(&mut self, session_id: SessionId, conversation_id: ConversationId) {
        if let Some(c) = self.conv_mut(session_id, conversation_id) {
            c.in_flight += 1;
            self.in_flight += 1;
        }
    }

    fn end(&mut self, session_id: SessionId, conversation_id: ConversationId) {
        if let Some(c) = self.conv_mut(session_id, conversation_id)
            && c.in_flight > 0
        {
            c.in_flight -= 1;
            self.in_flight = self.in_flight.saturating_sub(1);
        }
    }
}

/// Whether one more message may be sent to a conversation. Mirrors the actors' own bounds:
/// a conversation runs one task and queues `conversation_queue` more; a conversation with a
/// task takes one scheduler place, and a session has `running + task_queue` places.
pub fn admit(
    limits: Limits,
    draining: bool,
    active_conversations: usize,
    conversation_in_flight: usize,
) -> Result<(), AgentError> {
    if draining {
        return Err(AgentError::Overloaded {
            resource: "service (shutting down)".into(),
            limit: 0,
        });
    }
    if conversation_in_flight > 0 {
        if conversation_in_flight > limits.conversation_queue {
            return Err(AgentError::Overloaded {
                resource: "conversation message queue".into(),
                limit: u32::try_from(limits.conversation_queue).unwrap_or(u32::MAX),
            });
        }
        return Ok(());
    }
    let places = limits.running.saturating_add(limits.task_queue);
    if active_conversations >= places {
        return Err(AgentError::Overloaded {
            resource: "scheduler queue".into(),
            limit: u32::try_from(limits.task_queue).unwrap_or(u32::MAX),
        });
    }
    Ok(())
}

/// What the store keeps of a message's text under a conversation's policy: the text only
/// when the policy keeps content, its size always.
pub fn stored_content(policy: StoragePolicy, text: &str) -> (Option<String>, u64) {
    let chars = u64::try_from(text.chars().count()).unwrap_or(u64::MAX);
    (policy.keeps_content().then(|| text.to_owned()), chars)
}

/// A conversation's parameters after a context update (C6: unset fields are unchanged).
pub fn apply_context(mut params: OpenConversation, update: &SetContext) -> OpenConversation {
    params.apply(update);
    params
}

/// A reply whose task never started because a queue was full is that error, not a reply.
fn refused(reply: &MessageReply) -> Option<AgentError> {
    match &reply.error {
        Some(e) if e.kind() == ErrorKind::Overloaded && reply.stats.steps == 0 => Some(e.clone()),
        _ => None,
    }
}

/// Spawns work that outlives `handle` in the current span (the caller's, which ractor carries
/// with each message), so a task it runs is linked to the request that asked for it.
fn spawn_traced<F>(work: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(work.instrument(tracing::Span::current()))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The registry's state.
pub struct SessionsState {
    core: Registry,
    store: Arc<dyn Store>,
    template: SessionTemplate,
    limits: Limits,
    draining: bool,
    drain_waiters: Vec<RpcReplyPort<()>>,
    /// When each session was last restarted after stopping on its own (newest last).
    restarts: HashMap<SessionId, Vec<std::time::Instant>>,
}

/// At most this many restarts of one session per [`RESTART_WINDOW`].
pub const RESTARTS_PER_WINDOW: usize = 5;
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// Whether a session that stopped may be restarted now, given its recent restarts (pruned
/// to the window).
pub fn may_restart(
    recent: &mut Vec<std::time::Instant>,
    now: std::time::Instant,
    per_window: usize,
    window: Duration,
) -> bool {
    recent.retain(|t| now.duration_since(*t) < window);
    if recent.len() >= per_window {
        return false;
    }
    recent.push(now);
    true
}

/// Tells the registry when a session's actor ends.
fn watch(myself: &ActorRef<SessionsMsg>, handle: &SessionHandle, join: JoinHandle<()>) {
    let myself = myself.clone();
    let session_id = handle.id();
    let actor = handle.actor().get_id();
    tokio::spawn(async move {
        let _ = join.await;
        let _ = myself.cast(SessionsMsg::SessionStopped { session_id, actor });
    });
}

/// The registry actor.
pub struct Sessions;

#[ractor::async_trait]
impl Actor for Sessions {
    type Msg = SessionsMsg;
    type State = SessionsState;
    type Arguments = SessionsArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SessionsArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        super::metrics::session_restarts_start_at_zero();
        let mut core = load(args.store.as_ref()).await?;
        restart_all(&myself, &mut core, &args.template).await;
        tracing::info!(
            sessions = core.sessions.len(),
            "sessions loaded from the store"
        );
        Ok(SessionsState {
            core,
            store: args.store,
            limits: Limits::of(&args.template.config),
            template: args.template,
            draining: false,
            drain_waiters: Vec::new(),
            restarts: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        use SessionsMsg as M;
        match msg {
            M::Create {
                scope,
                request,
                reply,
            } => state.create(&myself, &scope, request, reply),
            M::Started {
                record,
                root,
                handle,
                reply,
            } => {
                let r = state.started(record, root, handle).await;
                let _ = reply.send(r);
            }
            M::Get {
                scope,
                session_id,
                reply,
            } => {
                let _ = reply.send(
                    state
                        .core
                        .visible(&scope, session_id)
                        .map(|e| e.record.clone()),
                );
            }
            M::List {
                scope,
                project_id,
                reply,
            } => {
                let _ = reply.send(state.list(&scope, project_id));
            }
            M::Resolve {
                scope,
                session_id,
                reply,
            } => {
                let _ = reply.send(state.resolve(&scope, session_id));
            }
            M::Conversations {
                scope,
                session_id,
                reply,
            } => {
                let _ = reply.send(state.conversations(&scope, session_id));
            }
            M::Open {
                scope,
                session_id,
                params,
                reply,
            } => {
                state.open(&myself, &scope, session_id, params, reply);
            }
            M::Opened { record, reply } => {
                let r = state.opened(record).await;
                let _ = reply.send(r);
            }
            M::SetContext {
                scope,
                session_id,
                conversation_id,
                update,
                reply,
            } => {
                state.set_context(&myself, &scope, session_id, conversation_id, update, reply);
            }
            M::ContextChanged {
                session_id,
                conversation_id,
                result,
                reply,
            } => {
                let r = state
                    .context_changed(session_id, conversation_id, result)
                    .await;
                let _ = reply.send(r);
            }
            M::Close {
                scope,
                session_id,
                conversation_id,
                reply,
            } => {
                state.close(&myself, &scope, session_id, conversation_id, reply);
            }
            M::Closed {
                session_id,
                result,
                reply,
            } => {
                let r = state.closed(session_id, result).await;
                let _ = reply.send(r);
            }
            M::Send {
                scope,
                session_id,
                conversation_id,
                text,
                wait,
                reply,
            } => {
                state
                    .send(
                        &myself,
                        &scope,
                        session_id,
                        conversation_id,
                        text,
                        wait,
                        reply,
                    )
                    .await;
            }
            M::TaskDone {
                user,
                result,
                reply,
            } => state.task_done(user, result, reply).await,
            M::Messages {
                scope,
                session_id,
                limit,
                before,
                reply,
            } => {
                let r = match state.core.visible(&scope, session_id) {
                    Ok(_) => state.store.messages(session_id, limit, before).await,
                    Err(e) => Err(e),
                };
                let _ = reply.send(r);
            }
            M::SetCurrent {
                scope,
                project_id,
                session_id,
                reply,
            } => {
                let r = state.set_current(&scope, project_id, session_id).await;
                let _ = reply.send(r);
            }
            M::Current {
                scope,
                project_id,
                reply,
            } => {
                let r = state.current(&scope, &project_id).await;
                let _ = reply.send(r);
            }
            M::Ready { reply } => {
                let _ = reply.send(state.store.ping().await);
            }
            M::SessionStopped { session_id, actor } => {
                state.session_stopped(&myself, session_id, actor);
            }
            M::SessionRestarted { session_id, result } => {
                state.session_restarted(&myself, session_id, result);
            }
            M::Drain { reply } => {
                state.draining = true;
                state.drain_waiters.push(reply);
                state.maybe_drained();
            }
            M::Shutdown { reply } => {
                state.shutdown().await;
                let _ = reply.send(());
            }
        }
        Ok(())
    }
}

/// What restarting a stored session takes: the root conversation's parameters (the session's
/// root reopens under its id) and the other open conversations, oldest first.
pub fn restore_plan(
    record: &SessionRecord,
    conversations: &[ConversationRecord],
) -> (
    Option<OpenConversation>,
    Vec<(ConversationId, OpenConversation)>,
) {
    let root = conversations
        .iter()
        .find(|c| c.conversation_id == record.root_conversation_id)
        .map(|c| c.params.clone());
    let mut others: Vec<&ConversationRecord> = conversations
        .iter()
        .filter(|c| c.conversation_id != record.root_conversation_id)
        .filter(|c| c.state == ConversationState::Open)
        .collect();
    others.sort_by_key(|c| (c.created_ms, c.conversation_id));
    (
        root,
        others
            .into_iter()
            .map(|c| (c.conversation_id, c.params.clone()))
            .collect(),
    )
}

/// Starts a stored session again under its ids; its conversations' history comes back from
/// the rollout.
async fn restart(
    template: &SessionTemplate,
    record: &SessionRecord,
    conversations: &[ConversationRecord],
) -> Result<(SessionHandle, JoinHandle<()>), AgentError> {
    let (root, others) = restore_plan(record, conversations);
    let mut config = template.config.clone();
    config.root_id = Some(record.root_conversation_id);
    if let Some(root) = root {
        config.root = root;
    }
    let (handle, join) =
        SessionHandle::start(record.session_id, config, template.ports.clone()).await?;
    for (id, params) in others {
        if let Err(e) = handle.restore(id, params).await {
            let _ = handle.shutdown().await;
            return Err(e);
        }
    }
    Ok((handle, join))
}

/// Loads every stored session and its conversations.
async fn load(store: &dyn Store) -> Result<Registry, AgentError> {
    let mut core = Registry::default();
    for record in store.all_sessions().await? {
        let conversations = store
            .conversations(record.session_id)
            .await?
            .into_iter()
            .map(|c| {
                (
                    c.conversation_id,
                    Conv {
                        record: c,
                        in_flight: 0,
                    },
                )
            })
            .collect();
        core.sessions.insert(
            record.session_id,
            Entry {
                record,
                handle: None,
                conversations,
            },
        );
    }
    Ok(core)
}

/// Starts every loaded session again (a few at a time); one that cannot start stays
/// registered without a running session.
async fn restart_all(
    myself: &ActorRef<SessionsMsg>,
    core: &mut Registry,
    template: &SessionTemplate,
) {
    use futures::StreamExt;
    let jobs: Vec<(SessionRecord, Vec<ConversationRecord>)> = core
        .sessions
        .values()
        .map(|e| {
            (
                e.record.clone(),
                e.conversations.values().map(|c| c.record.clone()).collect(),
            )
        })
        .collect();
    type Started = Result<(SessionHandle, JoinHandle<()>), AgentError>;
    let started: Vec<(SessionId, Started)> = futures::stream::iter(jobs)
        .map(|(record, conversations)| async move {
            let r = restart(template, &record, &conversations).await;
            (record.session_id, r)
        })
        .buffer_unordered(4)
        .collect()
        .await;
    for (session_id, result) in started {
        match result {
            Ok((handle, join)) => {
                watch(myself, &handle, join);
                if let Some(entry) = core.sessions.get_mut(&session_id) {
                    entry.handle = Some(handle);
                }
            }
            Err(e) => {
                tracing::error!(session_id = %session_id, error = %e, "stored session not restarted");
            }
        }
    }
}

impl SessionsState {
    fn create(
        &self,
        myself: &ActorRef<SessionsMsg>,
        scope: &Scope,
        request: CreateSession,
        reply: Reply<SessionRecord>,
    ) {
        let project_id = match scope.project_for_new(request.project_id) {
            Ok(p) => p,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        if self.draining {
            let _ = reply.send(Err(AgentError::Overloaded {
                resource: "service (shutting down)".into(),
                limit: 0,
            }));
            return;
        }
        let mut config = self.template.config.clone();
        if let Some(root) = request.root {
            config.root = root;
        }
        let ports = self.template.ports.clone();
        let myself = myself.clone();
        let settings = request
            .settings
            .unwrap_or_else(|| Json(serde_json::json!({})));
        let title = request.title;
        spawn_traced(async move {
            let session_id = SessionId::new();
            let root_params = config.root.clone();
            let started = async {
                let (handle, join) = SessionHandle::start(session_id, config, ports).await?;
                let root = handle.root().await?;
                Ok::<_, AgentError>((handle, join, root))
            };
            match started.await {
                Ok((handle, join, root)) => {
                    watch(&myself, &handle, join);
                    let created_ms = now_ms();
                    let record = SessionRecord {
                        session_id,
                        project_id,
                        title,
                        created_ms,
                        root_conversation_id: root,
                        settings,
                    };
                    let root = ConversationRecord {
                        conversation_id: root,
                        session_id,
                        params: root_params,
                        is_root: true,
                        state: ConversationState::Open,
                        created_ms,
                        closed_ms: None,
                    };
                    if let Err(e) = myself.cast(SessionsMsg::Started {
                        record,
                        root,
                        handle,
                        reply,
                    }) {
                        tracing::error!(error = %e, "sessions registry gone");
                    }
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        });
    }

    /// A session's actor ended: forget its handle; start it again unless the service drains
    /// or it keeps stopping.
    fn session_stopped(
        &mut self,
        myself: &ActorRef<SessionsMsg>,
        session_id: SessionId,
        actor: ractor::ActorId,
    ) {
        let Some(entry) = self.core.sessions.get_mut(&session_id) else {
            return;
        };
        // A watcher of an earlier run of this session (already replaced) says nothing new.
        if entry
            .handle
            .as_ref()
            .is_none_or(|h| h.actor().get_id() != actor)
        {
            return;
        }
        entry.handle = None;
        if self.draining {
            return;
        }
        let recent = self.restarts.entry(session_id).or_default();
        if !may_restart(
            recent,
            std::time::Instant::now(),
            RESTARTS_PER_WINDOW,
            RESTART_WINDOW,
        ) {
            super::metrics::session_restart("given_up");
            tracing::error!(%session_id, "session keeps stopping; left down");
            return;
        }
        tracing::warn!(%session_id, "session stopped on its own; starting it again");
        let record = entry.record.clone();
        let conversations: Vec<ConversationRecord> = entry
            .conversations
            .values()
            .map(|c| c.record.clone())
            .collect();
        let template = self.template.clone();
        let myself = myself.clone();
        tokio::spawn(async move {
            let result = restart(&template, &record, &conversations).await;
            let _ = myself.cast(SessionsMsg::SessionRestarted { session_id, result });
        });
    }

    fn session_restarted(
        &mut self,
        myself: &ActorRef<SessionsMsg>,
        session_id: SessionId,
        result: Result<(SessionHandle, JoinHandle<()>), AgentError>,
    ) {
        match result {
            Ok((handle, join)) => {
                let live = self
                    .core
                    .sessions
                    .get_mut(&session_id)
                    .filter(|_| !self.draining);
                match live {
                    Some(entry) => {
                        super::metrics::session_restart("restarted");
                        tracing::info!(%session_id, "session restarted");
                        watch(myself, &handle, join);
                        entry.handle = Some(handle);
                    }
                    None => {
                        tokio::spawn(async move {
                            let _ = handle.shutdown().await;
                        });
                    }
                }
            }
            Err(e) => {
                super::metrics::session_restart("failed");
                tracing::error!(%session_id, error = %e, "session could not be restarted");
            }
        }
    }

    async fn started(
        &mut self,
        record: SessionRecord,
        root: ConversationRecord,
        handle: SessionHandle,
    ) -> Result<SessionRecord, AgentError> {
        let stored = async {
            self.store.create_session(record.clone()).await?;
            self.store.put_conversation(root.clone()).await
        };
        if let Err(e) = stored.await {
            tracing::error!(session_id = %record.session_id, error = %e, "session not stored");
            tokio::spawn(async move {
                let _ = handle.shutdown().await;
            });
            return Err(e);
        }
        tracing::info!(session_id = %record.session_id, project_id = ?record.project_id, "session created");
        let conversations = HashMap::from([(
            root.conversation_id,
            Conv {
                record: root,
                in_flight: 0,
            },
        )]);
        self.core.sessions.insert(
            record.session_id,
            Entry {
                record: record.clone(),
                handle: Some(handle),
                conversations,
            },
        );
        Ok(record)
    }

    fn list(
        &self,
        scope: &Scope,
        project_id: Option<String>,
    ) -> Result<Vec<SessionRecord>, AgentError> {
        if let Some(p) = &project_id
            && !scope.sees(Some(p))
        {
            return Err(AgentError::not_found("project", p));
        }
        Ok(self.core.list(scope, project_id.as_deref()))
    }

    fn resolve(&self, scope: &Scope, session_id: SessionId) -> Result<Resolved, AgentError> {
        let handle = self.core.running(scope, session_id)?.clone();
        let entry = self.core.visible(scope, session_id)?;
        let mut conversations: Vec<&Conv> = entry.conversations.values().collect();
        conversations.sort_by_key(|c| (c.record.created_ms, c.record.conversation_id));
        Ok(Resolved {
            record: entry.record.clone(),
            handle,
            conversations: conversations
                .iter()
                .map(|c| c.record.conversation_id)
                .collect(),
        })
    }

    fn conversations(
        &self,
        scope: &Scope,
        session_id: SessionId,
    ) -> Result<Vec<ConversationRecord>, AgentError> {
        let entry = self.core.visible(scope, session_id)?;
        let mut out: Vec<ConversationRecord> = entry
            .conversations
            .values()
            .map(|c| c.record.clone())
            .collect();
        out.sort_by_key(|c| (c.created_ms, c.conversation_id));
        Ok(out)
    }

    fn open(
        &self,
        myself: &ActorRef<SessionsMsg>,
        scope: &Scope,
        session_id: SessionId,
        params: OpenConversation,
        reply: Reply<ConversationId>,
    ) {
        let handle = match self.core.running(scope, session_id) {
            Ok(h) => h.clone(),
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let myself = myself.clone();
        spawn_traced(async move {
            match handle.open(params.clone()).await {
                Ok(conversation_id) => {
                    let record = ConversationRecord {
                        conversation_id,
                        session_id,
                        params,
                        is_root: false,
                        state: ConversationState::Open,
                        created_ms: now_ms(),
                        closed_ms: None,
                    };
                    let _ = myself.cast(SessionsMsg::Opened { record, reply });
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        });
    }

    async fn opened(&mut self, record: ConversationRecord) -> Result<ConversationId, AgentError> {
        let id = record.conversation_id;
        self.store.put_conversation(record.clone()).await?;
        if let Some(entry) = self.core.sessions.get_mut(&record.session_id) {
            entry.conversations.insert(
                id,
                Conv {
                    record,
                    in_flight: 0,
                },
            );
        }
        Ok(id)
    }

    fn set_context(
        &self,
        myself: &ActorRef<SessionsMsg>,
        scope: &Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
        update: SetContext,
        reply: Reply<()>,
    ) {
        let checked = self
            .core
            .open_conversation(scope, session_id, conversation_id)
            .and_then(|_| self.core.running(scope, session_id));
        let handle = match checked {
            Ok(h) => h.clone(),
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let myself = myself.clone();
        spawn_traced(async move {
            let result = handle
                .set_context(conversation_id, update.clone())
                .await
                .map(|()| update);
            let _ = myself.cast(SessionsMsg::ContextChanged {
                session_id,
                conversation_id,
                result,
                reply,
            });
        });
    }

    async fn context_changed(
        &mut self,
        session_id: SessionId,
        conversation_id: ConversationId,
        result: Result<SetContext, AgentError>,
    ) -> Result<(), AgentError> {
        let update = result?;
        let Some(conv) = self.core.conv_mut(session_id, conversation_id) else {
            return Ok(());
        };
        let mut record = conv.record.clone();
        record.params = apply_context(record.params, &update);
        self.store.put_conversation(record.clone()).await?;
        if let Some(conv) = self.core.conv_mut(session_id, conversation_id) {
            conv.record = record;
        }
        Ok(())
    }

    fn close(
        &self,
        myself: &ActorRef<SessionsMsg>,
        scope: &Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
        reply: Reply<Closed>,
    ) {
        let handle = match self.core.running(scope, session_id) {
            Ok(h) => h.clone(),
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let myself = myself.clone();
        spawn_traced(async move {
            let result = handle.close(conversation_id).await;
            let _ = myself.cast(SessionsMsg::Closed {
                session_id,
                result,
                reply,
            });
        });
    }

    async fn closed(
        &mut self,
        session_id: SessionId,
        result: Result<Closed, AgentError>,
    ) -> Result<Closed, AgentError> {
        let closed = result?;
        if closed.outcome == CloseOutcome::AlreadyClosed {
            return Ok(closed);
        }
        let at = now_ms();
        if let Some(conv) = self.core.conv_mut(session_id, closed.conversation_id) {
            conv.record.state = ConversationState::Closed;
            conv.record.closed_ms = Some(at);
            self.store
                .close_conversation(closed.conversation_id, at)
                .await?;
        }
        Ok(closed)
    }

    #[allow(clippy::too_many_arguments)]
    async fn send(
        &mut self,
        myself: &ActorRef<SessionsMsg>,
        scope: &Scope,
        session_id: SessionId,
        conversation_id: Option<ConversationId>,
        text: String,
        wait: bool,
        reply: Reply<Sent>,
    ) {
        let admitted = self.admit_send(scope, session_id, conversation_id);
        let (handle, conversation_id, policy) = match admitted {
            Ok(a) => a,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let (content, chars) = stored_content(policy, &text);
        let stored = self
            .store
            .append_message(NewMessage {
                session_id,
                conversation_id,
                task_id: None,
                role: Role::User,
                content,
                chars,
                created_ms: now_ms(),
            })
            .await;
        let user = match stored {
            Ok(m) => m,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        self.core.begin(session_id, conversation_id);
        let waiter = if wait {
            Some(reply)
        } else {
            let _ = reply.send(Ok(Sent {
                message: user.clone(),
                reply: None,
                assistant: None,
            }));
            None
        };
        let myself = myself.clone();
        spawn_traced(async move {
            let result = handle.message(conversation_id, text).await;
            let _ = myself.cast(SessionsMsg::TaskDone {
                user,
                result,
                reply: waiter,
            });
        });
    }

    fn admit_send(
        &self,
        scope: &Scope,
        session_id: SessionId,
        conversation_id: Option<ConversationId>,
    ) -> Result<(SessionHandle, ConversationId, StoragePolicy), AgentError> {
        let handle = self.core.running(scope, session_id)?.clone();
        let entry = self.core.visible(scope, session_id)?;
        let conversation_id = conversation_id.unwrap_or(entry.record.root_conversation_id);
        let conv = self
            .core
            .open_conversation(scope, session_id, conversation_id)?;
        admit(self.limits, self.draining, entry.active(), conv.in_flight)?;
        Ok((handle, conversation_id, conv.record.params.storage_policy))
    }

    async fn task_done(
        &mut self,
        user: MessageRecord,
        result: Result<MessageReply, AgentError>,
        reply: Option<Reply<Sent>>,
    ) {
        let policy = self
            .core
            .conv_mut(user.session_id, user.conversation_id)
            .map(|c| c.record.params.storage_policy)
            .unwrap_or(StoragePolicy::None);
        let outcome = match result {
            Ok(r) => match refused(&r) {
                Some(e) => Err(e),
                None => {
                    let (content, chars) = stored_content(policy, &r.text);
                    self.store
                        .append_message(NewMessage {
                            session_id: user.session_id,
                            conversation_id: user.conversation_id,
                            task_id: Some(r.task_id),
                            role: Role::Assistant,
                            content,
                            chars,
                            created_ms: now_ms(),
                        })
                        .await
                        .map(|assistant| Sent {
                            message: user.clone(),
                            reply: Some(r),
                            assistant: Some(assistant),
                        })
                }
            },
            Err(e) => Err(e),
        };
        if let Err(e) = &outcome {
            tracing::debug!(session_id = %user.session_id, conversation_id = %user.conversation_id, error = %e, "message ended without a stored reply");
        }
        self.core.end(user.session_id, user.conversation_id);
        if let Some(reply) = reply {
            let _ = reply.send(outcome);
        }
        self.maybe_drained();
    }

    fn maybe_drained(&mut self) {
        if self.draining && self.core.in_flight == 0 {
            for w in self.drain_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }

    async fn set_current(
        &self,
        scope: &Scope,
        project_id: String,
        session_id: SessionId,
    ) -> Result<SessionRecord, AgentError> {
        if !scope.sees(Some(&project_id)) {
            return Err(AgentError::not_found("project", project_id));
        }
        let entry = self.core.visible(scope, session_id)?;
        if entry.record.project_id.as_deref() != Some(project_id.as_str()) {
            return Err(AgentError::not_found("session", session_id));
        }
        self.store
            .set_current_session(&project_id, session_id)
            .await?;
        Ok(entry.record.clone())
    }

    async fn current(&self, scope: &Scope, project_id: &str) -> Result<SessionRecord, AgentError> {
        if !scope.sees(Some(project_id)) {
            return Err(AgentError::not_found("project", project_id));
        }
        let id = self
            .store
            .current_session(project_id)
            .await?
            .ok_or_else(|| AgentError::not_found("current session of project", project_id))?;
        Ok(self.core.visible(scope, id)?.record.clone())
    }

    async fn shutdown(&mut self) {
        self.draining = true;
        let handles: Vec<SessionHandle> = self
            .core
            .sessions
            .values()
            .filter_map(|e| e.handle.clone())
            .collect();
        tracing::info!(sessions = handles.len(), "shutting sessions down");
        let done = futures::future::join_all(handles.iter().map(|h| h.shutdown())).await;
        for (h, r) in handles.iter().zip(done) {
            if let Err(e) = r {
                tracing::warn!(session_id = %h.id(), error = %e, "session shutdown");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::handle::SessionsHandle;
    use crate::store::memory::MemoryStore;
    use troupe_actors::history::LocalSummarizer;
    use troupe_actors::ports::ApproxTokens;

    fn template(dir: &std::path::Path) -> SessionTemplate {
        SessionTemplate {
            config: SessionConfig {
                data_dir: dir.to_owned(),
                ..SessionConfig::default()
            },
            ports: SessionPorts {
                model: Arc::new(crate::ScriptedModel::default()),
                mcp: None,
                mcp_connector: None,
                exec: None,
                summarizer: Arc::new(LocalSummarizer::default()),
                tokens: Arc::new(ApproxTokens),
                rollout_storage: None,
            },
        }
    }

    async fn registry(store: Arc<dyn Store>, dir: &std::path::Path) -> SessionsHandle {
        SessionsHandle::start(SessionsArgs {
            store,
            template: template(dir),
        })
        .await
        .unwrap()
        .0
    }

    #[tokio::test]
    async fn writes_go_to_the_store_and_come_back_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let sessions = registry(store.clone(), dir.path()).await;
        let scope = Scope::projects(["p"]);
        let s = sessions
            .create(scope.clone(), CreateSession::default())
            .await
            .unwrap();
        assert_eq!(s.project_id.as_deref(), Some("p"));
        let sent = sessions
            .send(scope.clone(), s.session_id, None, "hi".into(), true)
            .await
            .unwrap();
        assert_eq!(sent.reply.unwrap().text, "You said: hi");
        let page = store.messages(s.session_id, 10, None).await.unwrap();
        assert_eq!(page.messages.len(), 2);
        assert!(matches!(
            sessions.get(Scope::projects(["q"]), s.session_id).await,
            Err(AgentError::NotFound { .. })
        ));
        sessions.shutdown().await.unwrap();
        sessions.stop();

        // A new registry over the same store runs the session again, history and all.
        let again = registry(store, dir.path()).await;
        assert_eq!(again.get(scope.clone(), s.session_id).await.unwrap(), s);
        let page = again
            .messages(scope.clone(), s.session_id, 10, None)
            .await
            .unwrap();
        assert_eq!(page.messages.len(), 2);
        let sent = again
            .send(scope.clone(), s.session_id, None, "again".into(), true)
            .await
            .unwrap();
        assert_eq!(sent.message.conversation_id, s.root_conversation_id);
        let stats = crate::service::rpc::conversation_stats(
            &again,
            scope,
            s.session_id,
            s.root_conversation_id,
        )
        .await
        .unwrap();
        assert!(
            stats.history_items >= 4,
            "the first exchange is in its history: {stats:?}"
        );
        again.shutdown().await.unwrap();
        again.stop();
    }

    const LIMITS: Limits = Limits {
        running: 1,
        task_queue: 1,
        conversation_queue: 2,
    };

    #[test]
    fn restarts_are_limited_per_window() {
        let t0 = std::time::Instant::now();
        let window = Duration::from_secs(60);
        let mut recent = Vec::new();
        for i in 0..3 {
            assert!(may_restart(
                &mut recent,
                t0 + Duration::from_secs(i),
                3,
                window
            ));
        }
        assert!(!may_restart(
            &mut recent,
            t0 + Duration::from_secs(10),
            3,
            window
        ));
        assert_eq!(recent.len(), 3, "a refusal is not counted");
        // Once the first restart is out of the window, one more is allowed.
        assert!(may_restart(
            &mut recent,
            t0 + Duration::from_secs(60),
            3,
            window
        ));
        assert!(!may_restart(
            &mut recent,
            t0 + Duration::from_secs(60),
            3,
            window
        ));
    }

    #[test]
    fn a_restart_reopens_the_root_and_the_open_conversations() {
        let session_id = SessionId::new();
        let root = ConversationId::new();
        let conv = |id, is_root, state, created_ms| ConversationRecord {
            conversation_id: id,
            session_id,
            params: OpenConversation {
                base_instructions: Some(format!("{created_ms}")),
                ..OpenConversation::default()
            },
            is_root,
            state,
            created_ms,
            closed_ms: None,
        };
        let (open, closed, later) = (
            ConversationId::new(),
            ConversationId::new(),
            ConversationId::new(),
        );
        let record = SessionRecord {
            session_id,
            project_id: None,
            title: None,
            created_ms: 1,
            root_conversation_id: root,
            settings: Json(serde_json::json!({})),
        };
        let (root_params, others) = restore_plan(
            &record,
            &[
                conv(later, false, ConversationState::Open, 9),
                conv(closed, false, ConversationState::Closed, 3),
                conv(root, true, ConversationState::Open, 1),
                conv(open, false, ConversationState::Open, 2),
            ],
        );
        assert_eq!(root_params.unwrap().base_instructions.as_deref(), Some("1"));
        let ids: Vec<ConversationId> = others.iter().map(|(id, _)| *id).collect();
        assert_eq!(
            ids,
            vec![open, later],
            "open ones, oldest first, not the closed one"
        );
    }

    #[test]
    fn admission_mirrors_the_queues() {
        // An idle conversation takes a scheduler place: 2 places in all.
        assert!(admit(LIMITS, false, 0, 0).is_ok());
        assert!(admit(LIMITS, false, 1, 0).is_ok());
        assert!(matches!(
            admit(LIMITS, false, 2, 0),
            Err(AgentError::Overloaded { ref resource, .. }) if resource == "scheduler queue"
        ));
        // A busy conversation queues behind its own task, whatever the scheduler holds.
        assert!(admit(LIMITS, false, 2, 1).is_ok());
        assert!(admit(LIMITS, false, 2, 2).is_ok());
        assert!(matches!(
            admit(LIMITS, false, 2, 3),
            Err(AgentError::Overloaded { ref resource, .. }) if resource == "conversation message queue"
        ));
        assert!(
            admit(LIMITS, true, 0, 0).is_err(),
            "draining admits nothing"
        );
    }

    #[test]
    fn content_follows_the_policy() {
        assert_eq!(
            stored_content(StoragePolicy::Full, "héllo"),
            (Some("héllo".into()), 5)
        );
        assert_eq!(
            stored_content(StoragePolicy::Ttl { secs: 1 }, "x"),
            (Some("x".into()), 1)
        );
        assert_eq!(
            stored_content(StoragePolicy::HeadersOnly, "héllo"),
            (None, 5)
        );
        assert_eq!(stored_content(StoragePolicy::None, "ab"), (None, 2));
    }

    #[test]
    fn context_updates_change_only_what_they_name() {
        let params = OpenConversation {
            base_instructions: Some("a".into()),
            include_plan_tool: true,
            ..OpenConversation::default()
        };
        let out = apply_context(
            params.clone(),
            &SetContext {
                user_instructions: Some("u".into()),
                include_plan_tool: Some(false),
                ..SetContext::default()
            },
        );
        assert_eq!(out.base_instructions.as_deref(), Some("a"));
        assert_eq!(out.user_instructions.as_deref(), Some("u"));
        assert!(!out.include_plan_tool);
        assert_eq!(
            apply_context(params.clone(), &SetContext::default()),
            params
        );
    }
}
