//! `A2aTasks`: the actor that owns the A2A endpoint's live records (a [`TaskBook`]) and talks
//! to the session on its behalf. HTTP handlers only send it messages (and read the store for
//! what the book no longer holds: finished tasks, idle contexts).
//!
//! ```text
//! handler ── Send{params, known} ─▶ plan: new context? open its conversation (a spawned call;
//!                                   the send waits, parked, for ContextOpened);
//!                                   new task → SUBMITTED, queued in its context, stored;
//!                                   context idle → stored `dispatched`, then spawn
//!                                   message(conversation, text) ───────────────────────┐
//!         ◀─ Accepted{task, events?, stored} ─                                          │
//! handler ── Get / Fresh / Subscribe / Cancel / Push / WaitFor ─▶ answered from the book │
//! forwarder (tokio task) ── SessionEvent{event} ─▶ book.apply → publish to streams      │
//! spawned call ── MessageAnswered{task, result} ◀────────────────────────────────────────┘
//!                                   → dispatch the context's next task; the task ends with
//!                                     its task_finished event, or FinishDue after a grace
//! timer ── Sweep ─▶ close the conversations of contexts idle for `idle_close` (spawned
//!                   calls → ContextClosed); retention of finished tasks in the store
//! a task queued in a closed context ─▶ reopen its conversation (spawned → ContextReopened)
//! the writer ── Stored{task | context} ─▶ a finished task, a closed context leaves memory
//! ```
//!
//! Every change the book marks is queued to the endpoint's writer ([`Persister`]) at the end
//! of the message that made it, in order; a send answers once its new task is stored, so a
//! client that got a task id finds it after any crash. At start (`pre_start`) the actor takes
//! back from the store what was live: the open contexts and the tasks that had not finished.
//! A task that had not reached troupe runs; one that troupe was running ends FAILED (it is
//! not run again: it may have had effects), as the service's durable queue settles a message
//! that was running; one that waited for the client's reply waits on. Their push configs
//! come back with them.
//!
//! Streams get events through bounded channels: a subscriber that falls behind by a whole
//! buffer is dropped (its stream ends; it may subscribe again), so a stuck client never
//! holds the actor up. Children: none; the forwarder task is aborted when the actor stops.
//! The actor's supervisor replaces it when it fails; the new one starts from the store.

mod contexts;
mod recover;
mod send;

use super::backend::A2aBackend;
use super::book::{CancelPlan, Finished, Next, TaskBook};
use super::error::A2aError;
use super::events::closes_stream;
use super::metrics;
use super::model::{SendResult, StreamEvent, Task};
use super::persist::{Persister, Write};
use super::push::{Deliveries, PushBook, PushConfig, PushRequest, RetryPolicy};
use super::request::SendParams;
use super::wire;
use futures::StreamExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use troupe_actors::clock::unix_now_ms as now_ms;
use troupe_actors::rollout::stream::EventStream;
use troupe_proto::store::{A2aContextRecord, A2aPushRecord, A2aTaskRecord};
use troupe_proto::{AgentError, ConversationId, EventKind, MessageReply, OpenConversation, TaskId};
use troupe_store::Store;

pub use send::Parked;

/// Settings of the task records.
#[derive(Debug, Clone)]
pub struct TasksConfig {
    /// Finished tasks kept in the store for GetTask/ListTasks; the oldest are forgotten first.
    pub keep_finished: usize,
    /// A context's conversation closes after this long without a task arriving or changing
    /// state, and reopens on its next message.
    pub idle_close: Duration,
    /// Events buffered per stream; past them a slow client misses text pieces (the whole
    /// answer comes at the end), never a state or the end.
    pub subscriber_buffer: usize,
    /// Parameters of each context's conversation.
    pub open: OpenConversation,
    /// How long a task's reply waits for its `task_finished` event before ending the task
    /// by itself (the event carries the end in order with the task's other events, and the
    /// files its tools made; the gap-free event stream brings it, so the reply is only a
    /// safety net for a stream that stopped).
    pub finish_grace: Duration,
    /// How push notifications are retried.
    pub push_retry: RetryPolicy,
}

impl Default for TasksConfig {
    fn default() -> Self {
        Self {
            keep_finished: 10_000,
            idle_close: Duration::from_secs(600),
            subscriber_buffer: 256,
            open: OpenConversation::default(),
            finish_grace: Duration::from_secs(2),
            push_retry: RetryPolicy::default(),
        }
    }
}

impl TasksConfig {
    /// How often idle contexts are looked for: a quarter of the idle time, between 10 ms and
    /// a minute.
    pub fn sweep_every(&self) -> Duration {
        (self.idle_close / 4).clamp(Duration::from_millis(10), Duration::from_secs(60))
    }
}

/// Start-up arguments.
pub struct A2aTasksArgs {
    pub backend: Arc<dyn A2aBackend>,
    pub store: Arc<dyn Store>,
    pub persister: Persister,
    pub config: TasksConfig,
}

/// What a waiter waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Terminal or interrupted (a blocking send returns).
    Settled,
    /// Terminal (a cancel returns).
    Terminal,
}

struct Waiter {
    task_id: String,
    until: Until,
    done: oneshot::Sender<()>,
}

/// Whether `event` is a piece of an answer that a later event repeats whole (an artifact
/// chunk that is not the last): what a slow stream may go without.
pub fn is_text_piece(event: &StreamEvent) -> bool {
    matches!(event, StreamEvent::Artifact(update) if !update.last_chunk)
}

/// Feeds one stream from its queue: every event in order, except that a piece of an answer
/// is skipped while the client is behind (its buffer full), since the task's end sends the
/// whole answer again. Status changes, whole artifacts and the end always go through: a slow
/// client gets them late, but always. Ends when the queue closes (the task ended, its
/// events all passed) or the client left.
async fn forward_stream(
    task_id: String,
    mut queued: mpsc::UnboundedReceiver<StreamEvent>,
    out: mpsc::Sender<StreamEvent>,
) {
    let mut skipped = 0u64;
    while let Some(event) = queued.recv().await {
        let sent = if is_text_piece(&event) {
            match out.try_send(event) {
                Ok(()) => Ok(()),
                Err(mpsc::error::TrySendError::Full(_)) => {
                    skipped += 1;
                    Ok(())
                }
                Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
            }
        } else {
            out.send(event).await.map_err(drop)
        };
        if sent.is_err() {
            break;
        }
    }
    if skipped > 0 {
        tracing::info!(%task_id, skipped, "a2a stream fell behind; text pieces skipped, the whole answer sent");
    }
}

/// The actor's state.
pub struct A2aTasksState {
    book: TaskBook,
    backend: Arc<dyn A2aBackend>,
    persister: Persister,
    config: TasksConfig,
    /// How task records keep their content: the contexts' storage policy.
    storage_policy: troupe_proto::StoragePolicy,
    /// Each stream's queue to its forwarder (see [`forward_stream`]).
    streams: HashMap<String, Vec<mpsc::UnboundedSender<StreamEvent>>>,
    waiters: Vec<Waiter>,
    forwarder: Option<JoinHandle<()>>,
    push: PushBook,
    deliveries: Deliveries,
    /// Sends waiting for their new context's conversation.
    parked: HashMap<u64, Parked>,
    next_parked: u64,
    /// Tasks finished since the last retention pass.
    finished_since_prune: usize,
    /// Conversations whose troupe task a restart interrupted: cancelled once the session runs.
    to_cancel: Vec<ConversationId>,
    /// Tasks a restart found running (with their conversation): ended `failed` once this
    /// node runs the A2A session, never before (on several nodes another may run them still).
    to_interrupt: Vec<(String, ConversationId)>,
}

/// What a push config request answers.
#[derive(Debug, Clone, PartialEq)]
pub enum PushAnswer {
    Config(PushConfig),
    List(Vec<PushConfig>),
    Deleted,
}

/// A send the actor took.
#[derive(Debug)]
pub struct Accepted {
    pub task: Task,
    /// The task's later events, when the send asked to stream.
    pub events: Option<mpsc::Receiver<StreamEvent>>,
    /// Answers once the new task is stored.
    pub stored: Option<oneshot::Receiver<()>>,
}

/// A stream of an existing task: its current state, then its events.
#[derive(Debug)]
pub struct Subscription {
    pub task: Task,
    pub events: mpsc::Receiver<StreamEvent>,
}

/// What the store holds about the task or context a send names, read by the handler before
/// the send reaches the actor: the book uses it for what it does not hold.
#[derive(Debug, Default)]
pub struct Known {
    pub context: Option<A2aContextRecord>,
    pub task: Option<A2aTaskRecord>,
    pub pushes: Vec<A2aPushRecord>,
}

type Reply<T> = RpcReplyPort<Result<T, A2aError>>;

/// The actor's mailbox.
pub enum A2aTasksMsg {
    /// Starts a task for a client message, or answers the approval (or the question) its
    /// task waits for.
    Send {
        params: Box<SendParams>,
        input: String,
        stream: bool,
        known: Box<Known>,
        reply: Reply<Accepted>,
    },
    /// A task as the client sees it, if the book holds it (else the store has it).
    Get {
        task_id: String,
        history_length: Option<u32>,
        reply: RpcReplyPort<Option<Task>>,
    },
    /// What a blocking send answers for a settled task: the task, or the agent's plain
    /// Message reply; `None` when the book does not hold it.
    Outcome {
        task_id: String,
        history_length: Option<u32>,
        reply: RpcReplyPort<Option<SendResult>>,
    },
    /// The book's versions of these tasks (live ones are fresher than the store's).
    Fresh {
        ids: Vec<String>,
        reply: RpcReplyPort<HashMap<String, Task>>,
    },
    /// Cancels a task; answers once the cancellation is under way. `TaskNotFound` when the
    /// book does not hold it.
    Cancel { task_id: String, reply: Reply<()> },
    /// Streams a live task. `TaskNotFound` when the book does not hold it.
    Subscribe {
        task_id: String,
        reply: Reply<Subscription>,
    },
    /// A push notification config request; `None` when the book does not hold the task.
    Push {
        request: PushRequest,
        reply: Reply<Option<PushAnswer>>,
    },
    /// Answers (through the receiver) when the task reaches `until`.
    WaitFor {
        task_id: String,
        until: Until,
        reply: RpcReplyPort<oneshot::Receiver<()>>,
    },
    /// An event of the session, from the forwarder.
    SessionEvent {
        conversation_id: Option<ConversationId>,
        task_id: Option<TaskId>,
        event: EventKind,
    },
    /// A dispatched task's message call returned.
    MessageAnswered {
        task_id: String,
        result: Result<MessageReply, AgentError>,
    },
    /// The grace for a task's `task_finished` event is over.
    FinishDue { task_id: String },
    /// A new context's conversation opened (or could not): the parked send goes on.
    ContextOpened {
        parked: u64,
        result: Result<(ConversationId, troupe_proto::SessionId), AgentError>,
    },
    /// A closed context's conversation is open again (`Some`: a new one replaced it).
    ContextReopened {
        context_id: String,
        result: Result<Option<ConversationId>, AgentError>,
    },
    /// An idle context's conversation closed (or could not).
    ContextClosed {
        context_id: String,
        result: Result<(), AgentError>,
    },
    /// A record was stored: a finished task, a closed context may leave memory.
    Stored {
        task_id: Option<String>,
        context_id: Option<String>,
    },
    /// Timer: close idle contexts, apply retention.
    Sweep,
    /// How much the book holds: (tasks, contexts, contexts with an open conversation); for
    /// observation (tests, drills).
    Held {
        reply: RpcReplyPort<(usize, usize, usize)>,
    },
    /// Fault injection: panics inside `handle`, to exercise its supervisor in tests and drills.
    InjectPanic,
}

/// The actor.
pub struct A2aTasks;

#[ractor::async_trait]
impl Actor for A2aTasks {
    type Msg = A2aTasksMsg;
    type State = A2aTasksState;
    type Arguments = A2aTasksArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: A2aTasksArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let push_retry = args.config.push_retry;
        let storage_policy = args.config.open.storage_policy;
        let mut state = A2aTasksState {
            book: TaskBook::new(),
            backend: args.backend,
            persister: args.persister,
            config: args.config,
            storage_policy,
            streams: HashMap::new(),
            waiters: Vec::new(),
            forwarder: None,
            push: PushBook::default(),
            deliveries: Deliveries::new(push_retry),
            parked: HashMap::new(),
            next_parked: 0,
            finished_since_prune: 0,
            to_cancel: Vec::new(),
            to_interrupt: Vec::new(),
        };
        let _ = myself;
        // What was live comes back from the store (see `recover`).
        state.recover(args.store.as_ref()).await?;
        Ok(state)
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        myself.send_interval(state.config.sweep_every(), || A2aTasksMsg::Sweep);
        state.resume(&myself).await;
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(f) = state.forwarder.take() {
            f.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            A2aTasksMsg::InjectPanic => panic!("injected fault in the A2A tasks actor"),
            A2aTasksMsg::Send {
                params,
                input,
                stream,
                known,
                reply,
            } => match state.ensure_forwarding(&myself).await {
                Ok(()) => state.on_send(&myself, *params, input, stream, *known, reply),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            A2aTasksMsg::Get {
                task_id,
                history_length,
                reply,
            } => {
                let _ = reply.send(state.book.view(&task_id, history_length, true));
            }
            A2aTasksMsg::Outcome {
                task_id,
                history_length,
                reply,
            } => {
                let outcome = state
                    .book
                    .record(&task_id)
                    .map(|r| super::book::send_result(r, history_length));
                let _ = reply.send(outcome);
            }
            A2aTasksMsg::Fresh { ids, reply } => {
                let fresh = ids
                    .into_iter()
                    .filter_map(|id| state.book.view(&id, None, true).map(|t| (id, t)))
                    .collect();
                let _ = reply.send(fresh);
            }
            A2aTasksMsg::Cancel { task_id, reply } => {
                let _ = reply.send(state.on_cancel(&task_id));
            }
            A2aTasksMsg::Subscribe { task_id, reply } => {
                let _ = reply.send(state.on_subscribe(&task_id));
            }
            A2aTasksMsg::Push { request, reply } => {
                let _ = reply.send(state.on_push(request));
            }
            A2aTasksMsg::WaitFor {
                task_id,
                until,
                reply,
            } => {
                let _ = reply.send(state.wait_for(task_id, until));
            }
            A2aTasksMsg::SessionEvent {
                conversation_id,
                task_id,
                event,
            } => state.on_event(conversation_id, task_id, &event),
            A2aTasksMsg::MessageAnswered { task_id, result } => {
                state.on_answered(&myself, task_id, result);
            }
            A2aTasksMsg::FinishDue { task_id } => {
                let events = state.book.finish_due(&task_id, now_ms());
                state.publish(&task_id, events);
            }
            A2aTasksMsg::ContextOpened { parked, result } => {
                state.on_context_opened(&myself, parked, result);
            }
            A2aTasksMsg::ContextReopened { context_id, result } => {
                state.on_context_reopened(&myself, &context_id, result);
            }
            A2aTasksMsg::ContextClosed { context_id, result } => {
                state.on_context_closed(&myself, &context_id, result);
            }
            A2aTasksMsg::Stored {
                task_id,
                context_id,
            } => state.on_stored(task_id.as_deref(), context_id.as_deref()),
            A2aTasksMsg::Sweep => state.on_sweep(&myself).await,
            A2aTasksMsg::Held { reply } => {
                let b = &state.book;
                let _ = reply.send((b.len(), b.contexts_len(), b.open_contexts()));
            }
        }
        state.store_changes(&myself);
        Ok(())
    }
}

impl A2aTasksState {
    /// Subscribes to the session's events before the first message runs, so no event of a
    /// task started here is missed.
    async fn ensure_forwarding(&mut self, myself: &ActorRef<A2aTasksMsg>) -> Result<(), A2aError> {
        if self.forwarder.is_some() {
            return Ok(());
        }
        let events = self
            .backend
            .events(None)
            .await
            .map_err(|e| A2aError::from_agent(&e))?;
        self.forwarder = Some(tokio::spawn(forward(
            events,
            self.backend.clone(),
            myself.clone(),
        )));
        Ok(())
    }

    /// Queues what the book changed to the writer; a finished task and a closed context are
    /// told back once stored, to leave memory.
    fn store_changes(&mut self, myself: &ActorRef<A2aTasksMsg>) {
        let dirty = self.book.take_dirty();
        for context_id in dirty.contexts {
            let Some(c) = self.book.context(&context_id) else {
                continue;
            };
            let record = super::book::stored::context_record(&context_id, c);
            let done = (!record.open).then(|| {
                let me = myself.clone();
                let id = context_id.clone();
                Box::new(move |r: Result<(), AgentError>| {
                    if r.is_ok() {
                        let _ = me.cast(A2aTasksMsg::Stored {
                            task_id: None,
                            context_id: Some(id),
                        });
                    }
                }) as super::persist::Done
            });
            self.persister.write(Write::Context(record), done);
        }
        for task_id in dirty.tasks {
            let Some(rec) = self.book.record(&task_id) else {
                continue;
            };
            let record = match super::book::stored::task_record(rec, self.storage_policy, now_ms())
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(%task_id, error = %e, "a2a task not stored");
                    continue;
                }
            };
            let done = record.terminal.then(|| {
                self.finished_since_prune += 1;
                let me = myself.clone();
                let id = task_id.clone();
                Box::new(move |r: Result<(), AgentError>| {
                    if r.is_ok() {
                        let _ = me.cast(A2aTasksMsg::Stored {
                            task_id: Some(id),
                            context_id: None,
                        });
                    }
                }) as super::persist::Done
            });
            self.persister.write(Write::Task(record), done);
        }
        metrics::tasks(self.book.len());
        metrics::contexts_open(self.book.open_contexts());
    }

    /// A oneshot that answers once everything queued to the writer so far is stored.
    fn stored_mark(&self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.persister.write(
            Write::Barrier,
            Some(Box::new(move |_| {
                let _ = tx.send(());
            })),
        );
        rx
    }

    fn on_stored(&mut self, task_id: Option<&str>, context_id: Option<&str>) {
        if let Some(id) = task_id
            && let Some(context_id) = self.book.forget_task(id)
        {
            self.streams.remove(id);
            self.push.forget(id);
            self.deliveries.close_task(id);
            // Its context may be closed and idle, held only for it.
            self.book.forget_context(&context_id);
        }
        if let Some(id) = context_id {
            self.book.forget_context(id);
        }
    }

    fn on_cancel(&mut self, task_id: &str) -> Result<(), A2aError> {
        match self.book.cancel(task_id, now_ms())? {
            CancelPlan::Canceled(events) => {
                tracing::info!(%task_id, "a2a task canceled before it ran");
                self.publish(task_id, events);
            }
            CancelPlan::Forward(troupe_task) => {
                tracing::info!(%task_id, %troupe_task, "a2a cancel forwarded");
                self.forward_cancel(troupe_task);
            }
            CancelPlan::Deferred => {
                tracing::info!(%task_id, "a2a cancel deferred until the task starts");
            }
        }
        Ok(())
    }

    fn on_push(&mut self, request: PushRequest) -> Result<Option<PushAnswer>, A2aError> {
        let held =
            |book: &TaskBook, task_id: &str| book.record(task_id).map(|r| r.task.status.state);
        match request {
            PushRequest::Set(config) => match held(&self.book, &config.task_id) {
                None => Ok(None),
                Some(s) if s.is_terminal() => Err(A2aError::UnsupportedOperation(format!(
                    "task {} is over; it sends no more notifications",
                    config.task_id
                ))),
                Some(_) => self.set_push(config).map(|c| Some(PushAnswer::Config(c))),
            },
            PushRequest::Get { task_id, id } => {
                if held(&self.book, &task_id).is_none() {
                    return Ok(None);
                }
                self.push
                    .get(&task_id, id.as_deref())
                    .map(|c| Some(PushAnswer::Config(c)))
            }
            PushRequest::List { task_id } => Ok(held(&self.book, &task_id)
                .map(|_| PushAnswer::List(self.push.of(&task_id).to_vec()))),
            PushRequest::Delete { task_id, id } => {
                if held(&self.book, &task_id).is_none() {
                    return Ok(None);
                }
                if self.push.delete(&task_id, &id) {
                    tracing::info!(%task_id, config_id = %id, "a2a push config deleted");
                }
                self.deliveries.close(&task_id, &id);
                self.persister.write(
                    Write::DeletePush {
                        task_id,
                        config_id: id,
                    },
                    None,
                );
                Ok(Some(PushAnswer::Deleted))
            }
        }
    }

    /// Stores a task's push config; one that replaces another restarts its worker. The
    /// task's record must be queued to the writer already (the store keeps a config only for
    /// a stored task).
    fn set_push(&mut self, config: PushConfig) -> Result<PushConfig, A2aError> {
        let stored = self.push.set(config)?;
        self.deliveries.close(&stored.task_id, &stored.id);
        tracing::info!(task_id = %stored.task_id, config_id = %stored.id, "a2a push config set");
        self.persister.write(
            Write::Push(super::push::stored_config(&stored, now_ms())),
            None,
        );
        Ok(stored)
    }

    fn on_subscribe(&mut self, task_id: &str) -> Result<Subscription, A2aError> {
        let task = self
            .book
            .view(task_id, None, true)
            .ok_or_else(|| A2aError::TaskNotFound {
                task_id: task_id.to_owned(),
            })?;
        if task.status.state.is_terminal() {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {task_id} is {}; nothing more will happen",
                task.status.state.v1_name()
            )));
        }
        let events = self.add_stream(task_id);
        Ok(Subscription { task, events })
    }

    fn wait_for(&mut self, task_id: String, until: Until) -> oneshot::Receiver<()> {
        let (done, rx) = oneshot::channel();
        let reached = match until {
            Until::Settled => self.book.settled(&task_id),
            Until::Terminal => self.book.terminal(&task_id),
        };
        if reached {
            let _ = done.send(());
        } else {
            self.waiters.push(Waiter {
                task_id,
                until,
                done,
            });
        }
        rx
    }

    fn on_event(
        &mut self,
        conversation_id: Option<ConversationId>,
        task_id: Option<TaskId>,
        event: &EventKind,
    ) {
        let applied = self
            .book
            .apply_event(conversation_id, task_id, event, now_ms());
        if let Some(troupe_task) = applied.cancel {
            self.forward_cancel(troupe_task);
        }
        let mut by_task: Vec<(String, Vec<StreamEvent>)> = Vec::new();
        for (task_id, e) in applied.events {
            match by_task.last_mut() {
                Some((t, es)) if *t == task_id => es.push(e),
                _ => by_task.push((task_id, vec![e])),
            }
        }
        for (task_id, events) in by_task {
            self.publish(&task_id, events);
        }
    }

    fn on_answered(
        &mut self,
        myself: &ActorRef<A2aTasksMsg>,
        task_id: String,
        result: Result<MessageReply, AgentError>,
    ) {
        match self.book.finished(&task_id, result, now_ms()) {
            Finished::Done(events) => self.publish(&task_id, events),
            Finished::Deferred => {
                let due = task_id.clone();
                myself.send_after(self.config.finish_grace, move || A2aTasksMsg::FinishDue {
                    task_id: due,
                });
            }
            Finished::Requeued => {
                tracing::info!(%task_id, "a2a context's conversation was closed; reopening it");
            }
        }
        if let Some(context_id) = self.book.context_of(&task_id) {
            self.dispatch(myself, &context_id);
        }
    }

    /// Sends the context's next task to its conversation (if it is idle), reopening the
    /// conversation first when it is closed.
    fn dispatch(&mut self, myself: &ActorRef<A2aTasksMsg>, context_id: &str) {
        match self.book.next(context_id) {
            Next::Dispatch(d) => {
                tracing::debug!(task_id = %d.task_id, conversation_id = %d.conversation_id, "a2a task dispatched");
                // The task is stored `dispatched` before troupe is asked to run it: a crash in
                // between leaves it dispatched, which the next start ends FAILED; it is never
                // run twice (stored `queued`, it would run again after troupe had run it).
                self.store_changes(myself);
                let stored = self.stored_mark();
                let backend = self.backend.clone();
                let me = myself.clone();
                tokio::spawn(async move {
                    let _ = stored.await;
                    run_message(backend, me, d.task_id, d.conversation_id, d.input).await;
                });
            }
            Next::Reopen(conversation_id) => self.reopen(myself, context_id, conversation_id),
            Next::Nothing => {}
        }
    }

    fn forward_cancel(&self, troupe_task: TaskId) {
        let backend = self.backend.clone();
        tokio::spawn(async move {
            // NotFound: it ended meanwhile; its end reaches the book anyway.
            if let Err(e) = backend.cancel_task(troupe_task).await {
                tracing::debug!(%troupe_task, error = %e, "a2a cancel not delivered");
            }
        });
    }

    fn add_stream(&mut self, task_id: &str) -> mpsc::Receiver<StreamEvent> {
        let (tx, rx) = mpsc::channel(self.config.subscriber_buffer.max(1));
        let (queue, queued) = mpsc::unbounded_channel();
        tokio::spawn(forward_stream(task_id.to_owned(), queued, tx));
        self.streams
            .entry(task_id.to_owned())
            .or_default()
            .push(queue);
        rx
    }

    /// Sends a task's new events to its streams and webhooks, then wakes whoever waits for
    /// its state.
    fn publish(&mut self, task_id: &str, events: Vec<StreamEvent>) {
        if events.is_empty() {
            return;
        }
        let terminal = events
            .iter()
            .any(|e| e.state().is_some_and(|s| s.is_terminal()));
        if let Some(subs) = self.streams.get_mut(task_id) {
            // A stream whose client left is forgotten; a slow one is its forwarder's affair.
            subs.retain(|tx| events.iter().all(|e| tx.send(e.clone()).is_ok()));
            if terminal || subs.is_empty() {
                // Dropping the senders ends the streams once they drained.
                self.streams.remove(task_id);
            }
        }
        // Each webhook gets the events in the shape of the version that registered it.
        for config in self.push.of(task_id) {
            for e in &events {
                let last = closes_stream(config.version, e);
                self.deliveries
                    .send(config, wire::stream_event(config.version, e, last));
            }
        }
        if terminal {
            self.deliveries.close_task(task_id);
        }
        let book = &self.book;
        let (ready, waiting): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition(|w| match w.until {
                Until::Settled => book.settled(&w.task_id),
                Until::Terminal => book.terminal(&w.task_id),
            });
        self.waiters = waiting;
        for w in ready {
            let _ = w.done.send(());
        }
    }
}

async fn run_message(
    backend: Arc<dyn A2aBackend>,
    me: ActorRef<A2aTasksMsg>,
    task_id: String,
    conversation_id: ConversationId,
    input: String,
) {
    let result = backend.message(conversation_id, input).await;
    let _ = me.cast(A2aTasksMsg::MessageAnswered { task_id, result });
}

/// Whether the book cares about an event kind (the rest never reaches the mailbox).
pub const fn relevant(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::TaskStarted { .. }
            | EventKind::StepStarted { .. }
            | EventKind::AssistantChunk { .. }
            | EventKind::ToolCallStarted { .. }
            | EventKind::ToolCallFinished { .. }
            | EventKind::ApprovalRequested { .. }
            | EventKind::ApprovalResolved { .. }
            | EventKind::TaskFinished { .. }
            | EventKind::TaskAborted { .. }
            // Whether the answer an agent gave is one its output schema validated (A8).
            | EventKind::DispatchResult { .. }
    )
}

/// The approvals the forwarder passed on, by troupe task: what an approval's end read back
/// without its content stands for.
#[derive(Default)]
pub(super) struct Asked(HashMap<TaskId, Vec<troupe_proto::ApprovalId>>);

impl Asked {
    fn note(&mut self, task: Option<TaskId>, event: &EventKind) {
        let Some(task) = task else { return };
        match event {
            EventKind::ApprovalRequested { approval_id, .. } => {
                let ids = self.0.entry(task).or_default();
                if !ids.contains(approval_id) {
                    ids.push(*approval_id);
                }
            }
            // A task that ended asks nothing more.
            EventKind::TaskFinished { .. } | EventKind::TaskAborted { .. } => {
                self.0.remove(&task);
            }
            _ => {}
        }
    }
}

/// What an event read back as headers only (its conversation keeps no content: the stream
/// refilled from storage after the reader fell behind) stands for, as far as the book needs
/// it: a task's start and steps by their kind; an approval requested or resolved by asking
/// the approval store what waits now. A task's end needs its text: its reply ends it instead
/// (`finish_due`).
pub(super) async fn headers_only(
    record: &troupe_actors::rollout::RolloutRecord,
    backend: &dyn A2aBackend,
    asked: &mut Asked,
) -> Vec<EventKind> {
    use troupe_proto::EventName;
    match record.kind {
        EventName::TaskStarted => vec![EventKind::TaskStarted {
            input: String::new(),
        }],
        EventName::StepStarted => vec![EventKind::StepStarted {
            turn: 0,
            step: record.meta.steps.unwrap_or(1),
        }],
        EventName::TaskAborted => vec![EventKind::TaskAborted {
            waited_ms: record.meta.duration_ms.unwrap_or(0),
        }],
        EventName::ApprovalRequested | EventName::ApprovalResolved => {
            let Some(task) = record.task_id else {
                return Vec::new();
            };
            let pending = match backend.pending_approvals().await {
                Ok(pending) => pending,
                Err(error) => {
                    tracing::warn!(%error, "a2a: the pending approvals could not be read");
                    return Vec::new();
                }
            };
            let waiting: Vec<_> = pending
                .into_iter()
                .filter(|p| p.task_id == Some(task))
                .collect();
            let mut out = Vec::new();
            if record.kind == EventName::ApprovalRequested {
                for p in waiting {
                    let event = EventKind::ApprovalRequested {
                        approval_id: p.approval_id,
                        command: p.command,
                        reason: p.reason,
                        subject: p.subject,
                    };
                    let known = asked
                        .0
                        .get(&task)
                        .is_some_and(|ids| ids.contains(&p.approval_id));
                    if !known {
                        asked.note(Some(task), &event);
                        out.push(event);
                    }
                }
            } else if let Some(ids) = asked.0.get_mut(&task) {
                // Those no longer waiting were answered (the decision is not the book's
                // concern: the task goes on or ends by its own events).
                ids.retain(|id| {
                    let still = waiting.iter().any(|p| p.approval_id == *id);
                    if !still {
                        out.push(EventKind::ApprovalResolved {
                            approval_id: *id,
                            decision: troupe_proto::ApprovalDecision::Deny { reason: None },
                        });
                    }
                    still
                });
            }
            out
        }
        _ => Vec::new(),
    }
}

/// How long the forwarder waits before opening the session's events again after they ended
/// or failed.
const REOPEN_AFTER: Duration = Duration::from_millis(500);

/// Moves the session's events into the mailbox, from the session's gap-free stream: a reader
/// that falls behind is refilled from storage, so no stored event (an approval request, a
/// task's end) is ever skipped; only live text deltas that storage does not keep can be
/// missed, and the task's answer still arrives whole at its end. When the stream ends or fails
/// (the session's Rollout restarted, the session was replaced), it opens it again after the
/// last `seq` it passed on.
async fn forward(mut events: EventStream, backend: Arc<dyn A2aBackend>, me: ActorRef<A2aTasksMsg>) {
    let mut last_seq = None;
    let mut asked = Asked::default();
    loop {
        while let Some(item) = events.next().await {
            match item {
                Ok(record) => {
                    last_seq = Some(record.seq);
                    let events = match record.event {
                        Some(event) if relevant(&event) => {
                            asked.note(record.task_id, &event);
                            vec![event]
                        }
                        Some(_) => continue,
                        // Read back without its content (a policy that keeps none).
                        None => {
                            if matches!(
                                record.kind,
                                troupe_proto::EventName::TaskFinished
                                    | troupe_proto::EventName::TaskAborted
                            ) && let Some(task) = record.task_id
                            {
                                asked.0.remove(&task);
                            }
                            headers_only(&record, backend.as_ref(), &mut asked).await
                        }
                    };
                    for event in events {
                        let msg = A2aTasksMsg::SessionEvent {
                            conversation_id: record.conversation_id,
                            task_id: record.task_id,
                            event,
                        };
                        if me.cast(msg).is_err() {
                            return;
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, ?last_seq, "a2a event stream failed; reopening");
                    break;
                }
            }
        }
        loop {
            tokio::time::sleep(REOPEN_AFTER).await;
            match backend.events(last_seq).await {
                Ok(stream) => {
                    events = stream;
                    break;
                }
                Err(e) => tracing::warn!(error = %e, "a2a cannot reopen the session's events"),
            }
        }
    }
}

// A message of actors on this process only (see `local_message!`).
troupe_actors::local_message!(A2aTasksMsg);
