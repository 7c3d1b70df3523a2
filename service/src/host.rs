//! SessionHost: one stored session as the service runs it (P1, S3, S5, O2). One per active
//! session, a child of the [`Registry`](super::registry::Registry).
//!
//! ```text
//! Registry
//! └─ SessionHost × active sessions     (this actor: the session's store rows and durable queue)
//!      └─ Session                      (troupe-actors: conversations, scheduler, rollout, ...)
//! ```
//!
//! The host is the only writer of its session's rows in the [`Store`], so its writes are
//! ordered and a reply that depends on one is sent after it; it waits for the store in its own
//! mailbox, which holds only this session's calls. It owns the session's **durable queue**:
//! a user message is stored (`running` when its conversation is idle, else `queued`) before it
//! is acknowledged, and the host hands each conversation one message at a time. When a task
//! ends, its reply and the message's outcome are stored together, `message_updated` is
//! emitted, and the conversation's next message starts (`queued` → `running`, stored first).
//! So every acknowledged message reaches `completed`, `failed`, `cancelled` or `aborted`.
//!
//! # Mailbox
//! - `Send` → [`admit`] (the one admission decision) → store the message → reply now, or when
//!   it ends if the caller waits → run it if its conversation is idle. A message that runs at
//!   once starts its task while its row is written (the write takes about as long as the
//!   task's way to its model request); the task waits at its
//!   [`StoredGate`](troupe_actors::task::StoredGate) for the row before it acts on the
//!   model's answer or routes anywhere. Its caller hears of it only once the row is stored,
//!   its `running` update is emitted then (its `task_started` may come before it), and a
//!   write that fails cancels the task, whose `TaskDone` then stores nothing. A crash before
//!   the row is stored leaves no message and nothing acted on, and a caller that had no
//!   answer.
//! - `TaskDone` → store the outcome and the reply ([`plan::outcome`]) → answer the waiter →
//!   emit `message_updated` → start the conversation's next message.
//! - `Open`, `SetContext`, `Close` → a task asks the session → `Opened`, `ContextChanged`,
//!   `Closed` → store the change, reply. A close cancels the conversation's queued messages;
//!   once nothing of it runs, the host forgets it (it keeps only open conversations).
//! - `Reopen` → a task reads the closed conversation's record and asks the session to restore
//!   it under its id (history from its rollout) → `Reopened` → store it open again, reply.
//! - `CancelAll` → the conversation's queued messages end `cancelled` (stored first), then a
//!   task asks the session to cancel what runs (its message ends `cancelled` by `TaskDone`)
//!   and replies with the total.
//! - `Session` → the running [`SessionHandle`] (for approvals, tasks, statistics, events).
//! - its session stops (a supervision event: the session is linked to its host) → start it
//!   again under its ids ([`plan::may_restart`]:
//!   at most [`RESTARTS_PER_WINDOW`] per [`RESTART_WINDOW`]) → `SessionRestarted`.
//! - a queued message whose start the store refuses (past its tries), and whose failure it
//!   refuses too, stays queued (first in line): its caller hears so, and `StartQueued`
//!   ([`plan::start_retry_delay`]: 1 s, doubling, then once a minute; one timer per
//!   conversation) tries its start again, once per try and without writing a failure again,
//!   so that it runs once the store takes writes again, without waiting for a restart. Only
//!   a store that says the message is no longer queued ends the tries.
//! - `Drain` → no new message and no queued one starts; answered once none runs. Queued ones
//!   stay queued in the store and run after the next start. `Shutdown` → the session is shut
//!   down (what still runs is cancelled, the rollout flushed).
//!
//! # Start
//! A host is started for a session that was just created (its session already runs), or to
//! activate a stored one on its first use or because it has pending messages. Activation
//! (`post_start`) starts the session again under its ids (open conversations reopened from
//! their rollout, closed ones not even read: a session with many closed conversations starts
//! as fast as one without; a task a crash interrupted is recorded as aborted there), then settles every
//! pending message ([`plan::recover`]): one that was running ends `aborted`; one that was
//! queued runs, unless its conversation closed (`cancelled`) or its text was never stored
//! because its conversation's storage policy keeps no content (`aborted`, with that reason).
//!
//! # Failure
//! If the session's actor stops on its own, the messages it was running end `aborted` (their
//! tasks were interrupted) and it is started again; queued ones wait for it. Past the restart
//! budget it stays down: its queued messages end `failed` and calls answer `Internal`. If the
//! host itself fails, its session stops with it (ractor stops a failed actor's children); the
//! registry forgets it and activates it again from the store, where its unfinished messages
//! still are. A session that stops again while it is being started is started again (within
//! the same budget), not taken for running.

mod conversations;
mod lifecycle;
pub mod plan;
mod queue;

use super::admission::QueueLimits;
use super::api::Sent;
use super::metrics;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tracing::Instrument;
use troupe_actors::clock::unix_now_ms as now_ms;
use troupe_actors::governance::RequestGovernance;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::store::{ConversationRecord, MessageRecord, SessionRecord};
use troupe_proto::{
    AgentError, Closed, ConversationId, MessageReply, OpenConversation, SetContext, StoragePolicy,
};
use troupe_store::Store;

/// At most this many restarts of one session per [`RESTART_WINDOW`].
pub const RESTARTS_PER_WINDOW: usize = 5;
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);

type Reply<T> = RpcReplyPort<Result<T, AgentError>>;

/// A session that was just created: it already runs (the host links it to itself); nothing
/// is loaded.
pub struct Created {
    pub handle: SessionHandle,
    pub root: ConversationRecord,
}

/// What every session starts from: a new one, and a stored one started again.
#[derive(Clone)]
pub struct SessionTemplate {
    pub config: SessionConfig,
    pub ports: SessionPorts,
    /// The process's modules: a message that came from one has its reply routed to them
    /// when it ends (A10).
    pub modules: Option<crate::modules::Modules>,
}

/// Start-up arguments.
pub struct HostArgs {
    pub record: SessionRecord,
    pub store: Arc<dyn Store>,
    pub template: SessionTemplate,
    /// `Some` for a new session; `None` activates a stored one.
    pub created: Option<Created>,
    /// Set when the service is draining: nothing new starts.
    pub draining: bool,
}

/// The host's mailbox.
pub enum HostMsg {
    /// The running session.
    Session { reply: Reply<SessionHandle> },
    /// Stores a user message and runs it (the root conversation when none is named).
    Send {
        conversation_id: Option<ConversationId>,
        text: String,
        wait: bool,
        /// Its request layer of the tool policy and the digests of the tokens it presented.
        governance: RequestGovernance,
        /// Told the stored message as soon as it is stored, before it runs (a caller that
        /// waits for the reply acknowledges the message meanwhile).
        accepted: Option<tokio::sync::oneshot::Sender<troupe_proto::store::MessageRecord>>,
        /// The module it came from (`{"id", "in_reply_to"}`), kept in its metadata: its reply
        /// is routed there when it ends, also after a restart.
        module: Option<serde_json::Value>,
        reply: Reply<Sent>,
    },
    /// Opens a conversation.
    Open {
        params: OpenConversation,
        reply: Reply<ConversationId>,
    },
    /// Changes a conversation's context.
    SetContext {
        conversation_id: ConversationId,
        update: SetContext,
        reply: Reply<()>,
    },
    /// Closes a conversation; idempotent.
    Close {
        conversation_id: ConversationId,
        reply: Reply<Closed>,
    },
    /// Opens a closed conversation of this session again, under its id and with its stored
    /// parameters, its history rebuilt from its rollout; an open one: nothing to do.
    Reopen {
        conversation_id: ConversationId,
        reply: Reply<()>,
    },
    /// Compacts a conversation (a task of its own, after its running one): admitted as a
    /// message is, since it takes a scheduler place; answered with the compaction's reply.
    Compact {
        conversation_id: ConversationId,
        reply: Reply<MessageReply>,
    },
    /// A compaction ended.
    CompactDone {
        conversation_id: ConversationId,
        result: Result<MessageReply, AgentError>,
        reply: Reply<MessageReply>,
    },
    /// Cancels a conversation's queued messages (they end `cancelled`) and its running task;
    /// answers how many.
    CancelAll {
        conversation_id: ConversationId,
        reply: Reply<usize>,
    },
    /// Stops starting messages; answered once none runs.
    Drain { reply: RpcReplyPort<()> },
    /// Shuts the session down.
    Shutdown { reply: RpcReplyPort<()> },
    /// A message's task ended (or could not run). `dispatch` names the start that ran it.
    TaskDone {
        conversation_id: ConversationId,
        dispatch: u64,
        result: Result<MessageReply, AgentError>,
    },
    /// The session opened a conversation for `Open`. `via`: the session actor that did (each
    /// of these answers names it: a run that stopped meanwhile was replaced by one started
    /// from what the host held before the answer, which the host then tells of the change).
    Opened {
        result: Result<ConversationRecord, AgentError>,
        via: ActorId,
        reply: Reply<ConversationId>,
    },
    /// The session applied (or refused) a context change.
    ContextChanged {
        conversation_id: ConversationId,
        result: Result<SetContext, AgentError>,
        via: ActorId,
        reply: Reply<()>,
    },
    /// The session closed a conversation (or could not).
    Closed {
        conversation_id: ConversationId,
        result: Result<Closed, AgentError>,
        via: ActorId,
        reply: Reply<Closed>,
    },
    /// The session opened a closed conversation again for `Reopen` (or could not).
    Reopened {
        result: Result<ConversationRecord, AgentError>,
        via: ActorId,
        reply: Reply<()>,
    },
    /// A stopped session was started again (or could not be).
    SessionRestarted {
        result: Result<SessionHandle, AgentError>,
    },
    /// Try again to start the conversation's next queued message, whose start the store
    /// refused (and its failure too) the last time.
    StartQueued { conversation_id: ConversationId },
}

/// A message whose task runs.
struct Running {
    /// Which start of a task this is: its `TaskDone` names it.
    dispatch: u64,
    /// Its stored row. `None` while the row of a message whose task started with its write
    /// is being written, and for good when that write failed: its task is then cancelled,
    /// having acted on nothing (its gate), and nothing of it is stored.
    message: Option<MessageRecord>,
    /// The caller, when it waits for the reply.
    waiter: Option<Reply<Sent>>,
}

/// A message waiting for its conversation.
struct Waiting {
    message: MessageRecord,
    text: String,
    /// Kept in memory; its request layer is in the message's metadata too, so a message run
    /// after a restart keeps it (its tokens do not: they are presented again).
    governance: RequestGovernance,
    waiter: Option<Reply<Sent>>,
    /// Starts of it the store refused, its failure refused too (it stays queued, first in
    /// line, and its start is tried again after [`plan::start_retry_delay`]); 0 for one
    /// never tried.
    refused_starts: u32,
}

/// A conversation as its host tracks it. The host keeps one for every open conversation,
/// passivated ones included, so it stays small: a running message is boxed.
struct ConversationSlot {
    record: ConversationRecord,
    running: Option<Box<Running>>,
    queue: VecDeque<Waiting>,
    /// A close was asked: nothing more starts or is admitted.
    closing: bool,
    /// Compactions asked and not ended: each holds (or waits for) the conversation's
    /// scheduler place, and its next message waits for them.
    compactions: u16,
    /// A `StartQueued` is on its way: a refused start is tried again by one timer at a time.
    retry_pending: bool,
}

impl ConversationSlot {
    fn new(record: ConversationRecord) -> Self {
        Self {
            record,
            running: None,
            queue: VecDeque::new(),
            closing: false,
            compactions: 0,
            retry_pending: false,
        }
    }

    /// Work of the conversation that is running or waiting: its messages and compactions.
    fn pending(&self) -> usize {
        usize::from(self.running.is_some()) + self.queue.len() + usize::from(self.compactions)
    }
}

/// Where the session's actor stands.
enum Liveness {
    Up(SessionHandle),
    /// Stopped on its own; being started again.
    Restarting,
    /// Could not be (re)started; calls answer this.
    Down(AgentError),
}

/// The host's state.
pub struct HostState {
    record: SessionRecord,
    store: Arc<dyn Store>,
    template: SessionTemplate,
    limits: QueueLimits,
    session: Liveness,
    conversations: HashMap<ConversationId, ConversationSlot>,
    draining: bool,
    drain_waiters: Vec<RpcReplyPort<()>>,
    /// When the session was last restarted after stopping on its own (newest last).
    restarts: Vec<Instant>,
    /// Session actors that stopped while the session was being started again: a restart
    /// that hands back one of them hands back a session that already stopped.
    stopped_while_restarting: Vec<ActorId>,
    /// Changes a stopped run of the session answered after the run that replaces it was
    /// started from what the host held: told to that run once it is up.
    resyncs: Vec<conversations::Resync>,
    /// Message updates (`message_status`) that happened while the session was being started
    /// again: emitted once it is up, so a client of the event stream hears every outcome.
    deferred_updates: Vec<MessageRecord>,
    /// The tasks started so far (the last start's number).
    dispatches: u64,
    /// Set by `pre_start`, consumed by `post_start`.
    created: Option<Created>,
    /// Keeps `troupe_sessions_active` counted while the host lives.
    _active: metrics::ActiveSession,
}

/// The SessionHost actor.
pub struct SessionHost;

#[ractor::async_trait]
impl Actor for SessionHost {
    type Msg = HostMsg;
    type State = HostState;
    type Arguments = HostArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<HostMsg>,
        args: HostArgs,
    ) -> Result<HostState, ActorProcessingErr> {
        Ok(HostState {
            limits: QueueLimits::of(&args.template.config),
            record: args.record,
            store: args.store,
            template: args.template,
            session: Liveness::Restarting,
            conversations: HashMap::new(),
            draining: args.draining,
            drain_waiters: Vec::new(),
            restarts: Vec::new(),
            stopped_while_restarting: Vec::new(),
            resyncs: Vec::new(),
            deferred_updates: Vec::new(),
            dispatches: 0,
            created: args.created,
            _active: metrics::ActiveSession::start(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<HostMsg>,
        state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        match state.created.take() {
            Some(created) => {
                // Its session stops with it, and it hears when the session stops.
                created.handle.actor().get_cell().link(myself.get_cell());
                state.session = Liveness::Up(created.handle);
                let root = created.root;
                state
                    .conversations
                    .insert(root.conversation_id, ConversationSlot::new(root));
            }
            None => state.activate(&myself).await?,
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<HostMsg>,
        msg: HostMsg,
        state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            HostMsg::Session { reply } => {
                let _ = reply.send(state.running().cloned());
            }
            HostMsg::Send {
                conversation_id,
                text,
                wait,
                governance,
                accepted,
                module,
                reply,
            } => {
                state
                    .send(
                        &myself,
                        conversation_id,
                        (text, wait, module),
                        governance,
                        accepted,
                        reply,
                    )
                    .await
            }
            HostMsg::TaskDone {
                conversation_id,
                dispatch,
                result,
            } => {
                state
                    .task_done(&myself, conversation_id, dispatch, result)
                    .await
            }
            HostMsg::Open { params, reply } => state.open(&myself, params, reply),
            HostMsg::Opened { result, via, reply } => {
                let r = state.opened(result, via).await;
                let _ = reply.send(r);
            }
            HostMsg::SetContext {
                conversation_id,
                update,
                reply,
            } => state.set_context(&myself, conversation_id, update, reply),
            HostMsg::ContextChanged {
                conversation_id,
                result,
                via,
                reply,
            } => {
                let r = state.context_changed(conversation_id, result, via).await;
                let _ = reply.send(r);
            }
            HostMsg::Close {
                conversation_id,
                reply,
            } => state.close(&myself, conversation_id, reply),
            HostMsg::Closed {
                conversation_id,
                result,
                via,
                reply,
            } => {
                let r = state.closed(&myself, conversation_id, result, via).await;
                let _ = reply.send(r);
            }
            HostMsg::Compact {
                conversation_id,
                reply,
            } => state.compact(&myself, conversation_id, reply),
            HostMsg::CompactDone {
                conversation_id,
                result,
                reply,
            } => {
                let _ = reply.send(result);
                state.compact_done(&myself, conversation_id).await;
            }
            HostMsg::CancelAll {
                conversation_id,
                reply,
            } => state.cancel_all(conversation_id, reply).await,
            HostMsg::Reopen {
                conversation_id,
                reply,
            } => state.reopen(&myself, conversation_id, reply),
            HostMsg::Reopened { result, via, reply } => {
                let r = state.reopened(result, via).await;
                let _ = reply.send(r);
            }
            HostMsg::Drain { reply } => {
                state.draining = true;
                state.drain_waiters.push(reply);
                state.maybe_drained();
            }
            HostMsg::Shutdown { reply } => {
                state.shutdown().await;
                let _ = reply.send(());
            }
            HostMsg::SessionRestarted { result } => {
                state.session_restarted(&myself, result).await;
            }
            HostMsg::StartQueued { conversation_id } => {
                if let Some(slot) = state.conversations.get_mut(&conversation_id) {
                    slot.retry_pending = false;
                }
                state.run_next(&myself, conversation_id).await;
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<HostMsg>,
        event: SupervisionEvent,
        state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, error) => {
                tracing::error!(session_id = %state.record.session_id, %error, "session failed");
                state.session_stopped(&myself, cell.get_id()).await;
            }
            SupervisionEvent::ActorTerminated(cell, last_state, _) => {
                // The stopped session's state (ractor hands it over) goes before a new one starts.
                drop(last_state);
                state.session_stopped(&myself, cell.get_id()).await;
            }
            _ => {}
        }
        Ok(())
    }
}

/// What the store keeps of a message's text under a conversation's policy: the text only
/// when the policy keeps content, its size always.
pub fn stored_content(policy: StoragePolicy, text: &str) -> (Option<String>, u64) {
    let chars = u64::try_from(text.chars().count()).unwrap_or(u64::MAX);
    (policy.keeps_content().then(|| text.to_owned()), chars)
}

/// Spawns work that outlives `handle` in the current span (the caller's, which ractor carries
/// with each message), so a task it runs is linked to the request that asked for it.
fn spawn_traced<F>(work: F) -> JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(work.instrument(tracing::Span::current()))
}

/// What a call that needs a session's run answers while the run is being started again.
fn restarting(session_id: troupe_proto::SessionId) -> AgentError {
    AgentError::Overloaded {
        resource: format!("session {session_id} (restarting: try again in a moment)"),
        limit: 0,
    }
}

impl HostState {
    fn running(&self) -> Result<&SessionHandle, AgentError> {
        match &self.session {
            Liveness::Up(h) => Ok(h),
            // Retryable, and said so: the run is back in a moment (a browser's event stream
            // reconnects after a 503, not after a 500).
            Liveness::Restarting => Err(restarting(self.record.session_id)),
            Liveness::Down(e) => Err(e.clone()),
        }
    }

    /// The run that takes new work now: an up run that is not being stopped. One being
    /// killed (its actor stopping, the host not told yet) takes none: what would run there
    /// waits for the run that replaces it, as while the session restarts. Read when a message
    /// is admitted and before a queued one's start is written: a run that begins to stop
    /// while that write is under way still gets the message, which then ends `aborted`.
    fn live_run(&self) -> Option<&SessionHandle> {
        match &self.session {
            Liveness::Up(h) if plan::takes_events(h.actor().get_status()) => Some(h),
            _ => None,
        }
    }

    fn maybe_drained(&mut self) {
        let running = self
            .conversations
            .values()
            .any(|c| c.running.is_some() || c.compactions > 0);
        if self.draining && !running {
            for w in self.drain_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }
}

// A message of actors on this process only (see `local_message!`).
troupe_actors::local_message!(HostMsg);

#[cfg(test)]
mod tests {
    /// A call made while the session's run is started again is told to retry (503), not
    /// that the service failed (500).
    #[test]
    fn a_restarting_session_answers_retry_later() {
        let e = super::restarting(troupe_proto::SessionId::new());
        assert_eq!(
            crate::error::http_status(e.kind()),
            axum::http::StatusCode::SERVICE_UNAVAILABLE
        );
        assert!(e.to_string().contains("restarting"), "{e}");
    }
}
