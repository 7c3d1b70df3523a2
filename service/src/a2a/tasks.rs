//! `A2aTasks`: the actor that owns the A2A endpoint's records (a [`TaskBook`]) and talks to
//! the session on its behalf. HTTP handlers only send it messages.
//!
//! ```text
//! handler ── Send{params} ──────▶ plan: new context? open a conversation (awaited here);
//!                                 new task → SUBMITTED, queued in its context;
//!                                 context idle → spawn message(conversation, text) ──┐
//!         ◀─ Accepted{task, events?, settled} ─                                     │
//! handler ── Get / List / Subscribe / Cancel / WaitFor ─▶ answered from the book    │
//! forwarder (tokio task) ── SessionEvent{event} ─▶ book.apply → publish to streams    │
//! spawned call ── MessageAnswered{task, result} ◀────────────────────────────────────┘
//!                                 → dispatch the context's next task; the task ends with
//!                                   its task_finished event, or FinishDue after a grace
//! ```
//!
//! Streams get events through bounded channels: a subscriber that falls behind by a whole
//! buffer is dropped (its stream ends; it may subscribe again), so a stuck client never
//! holds the actor up. Children: none; the forwarder task is aborted when the actor stops.
//! A failure of this actor loses the records (they live in memory); the session and its
//! conversations keep running.

use super::backend::A2aBackend;
use super::book::{CancelPlan, Dispatch, Finished, SendPlan, TaskBook};
use super::error::A2aError;
use super::events::closes_stream;
use super::metrics;
use super::model::{StreamEvent, Task, TaskPage};
use super::push::{Deliveries, PushBook, PushConfig, PushRequest, RetryPolicy};
use super::request::{ListParams, SendParams};
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
use troupe_proto::{AgentError, ConversationId, EventKind, MessageReply, OpenConversation, TaskId};

/// Settings of the task records.
#[derive(Debug, Clone)]
pub struct TasksConfig {
    /// Terminal tasks kept for GetTask/ListTasks; the oldest are forgotten first.
    pub max_finished: usize,
    /// Events buffered per stream before a slow client is dropped.
    pub subscriber_buffer: usize,
    /// Parameters of each context's conversation.
    pub open: OpenConversation,
    /// How long a task's reply waits for its `task_finished` event before ending the task
    /// by itself (the event carries the end in order with the task's other events).
    pub finish_grace: Duration,
    /// How push notifications are retried.
    pub push_retry: RetryPolicy,
}

impl Default for TasksConfig {
    fn default() -> Self {
        Self {
            max_finished: 10_000,
            subscriber_buffer: 256,
            open: OpenConversation::default(),
            finish_grace: Duration::from_millis(250),
            push_retry: RetryPolicy::default(),
        }
    }
}

/// Start-up arguments.
pub struct A2aTasksArgs {
    pub backend: Arc<dyn A2aBackend>,
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

/// The actor's state.
pub struct A2aTasksState {
    book: TaskBook,
    backend: Arc<dyn A2aBackend>,
    config: TasksConfig,
    streams: HashMap<String, Vec<mpsc::Sender<StreamEvent>>>,
    waiters: Vec<Waiter>,
    forwarder: Option<JoinHandle<()>>,
    push: PushBook,
    deliveries: Deliveries,
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
}

/// A stream of an existing task: its current state, then its events.
#[derive(Debug)]
pub struct Subscription {
    pub task: Task,
    pub events: mpsc::Receiver<StreamEvent>,
}

/// The actor's mailbox.
pub enum A2aTasksMsg {
    /// Starts a task for a client message, or answers the approval its task waits for.
    Send {
        params: SendParams,
        input: String,
        stream: bool,
        reply: RpcReplyPort<Result<Accepted, A2aError>>,
    },
    /// A task as the client sees it.
    Get {
        task_id: String,
        history_length: Option<u32>,
        reply: RpcReplyPort<Option<Task>>,
    },
    /// One page of tasks.
    List {
        params: ListParams,
        reply: RpcReplyPort<Result<TaskPage, A2aError>>,
    },
    /// Cancels a task; answers once the cancellation is under way.
    Cancel {
        task_id: String,
        reply: RpcReplyPort<Result<(), A2aError>>,
    },
    /// Streams a live task.
    Subscribe {
        task_id: String,
        reply: RpcReplyPort<Result<Subscription, A2aError>>,
    },
    /// A push notification config request.
    Push {
        request: PushRequest,
        reply: RpcReplyPort<Result<PushAnswer, A2aError>>,
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
        let _ = myself;
        // The session's events are followed from the first message on (see
        // `ensure_forwarding`): a backend that creates its session lazily is not forced to
        // create it at start-up.
        let push_retry = args.config.push_retry;
        Ok(A2aTasksState {
            book: TaskBook::new(args.config.max_finished),
            backend: args.backend,
            config: args.config,
            streams: HashMap::new(),
            waiters: Vec::new(),
            forwarder: None,
            push: PushBook::default(),
            deliveries: Deliveries::new(push_retry),
        })
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
                reply,
            } => {
                let r = match state.ensure_forwarding(&myself).await {
                    Ok(()) => state.on_send(&myself, params, input, stream).await,
                    Err(e) => Err(e),
                };
                let _ = reply.send(r);
            }
            A2aTasksMsg::Get {
                task_id,
                history_length,
                reply,
            } => {
                let _ = reply.send(state.book.view(&task_id, history_length, true));
            }
            A2aTasksMsg::List { params, reply } => {
                let _ = reply.send(state.book.list(&params));
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
                state.forget_old();
            }
        }
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

    async fn on_send(
        &mut self,
        myself: &ActorRef<A2aTasksMsg>,
        params: SendParams,
        input: String,
        stream: bool,
    ) -> Result<Accepted, A2aError> {
        let context_id = match self.book.plan_send(&params)? {
            SendPlan::Answer {
                task_id,
                approval_id,
                decision,
            } => {
                tracing::info!(%task_id, %approval_id, approves = decision.approves(), "a2a approval answer");
                let backend = self.backend.clone();
                tokio::spawn(async move {
                    if let Err(e) = backend.respond_approval(approval_id, decision).await {
                        tracing::warn!(%approval_id, error = %e, "a2a approval answer failed");
                    }
                });
                if let Some(mut config) = params.push_config {
                    config.task_id.clone_from(&task_id);
                    self.set_push(config)?;
                }
                let events = self.book.answered(&task_id, params.message, now_ms());
                self.publish(&task_id, events);
                let events = stream.then(|| self.add_stream(&task_id));
                let task = self.book.view(&task_id, params.history_length, true);
                return task
                    .map(|task| Accepted { task, events })
                    .ok_or(A2aError::TaskNotFound { task_id });
            }
            SendPlan::NewTask { context_id } => context_id,
            SendPlan::NewContext { context_id } => {
                let conversation_id = self
                    .backend
                    .open(self.config.open.clone())
                    .await
                    .map_err(|e| A2aError::from_agent(&e))?;
                // A context the server names is its conversation's id.
                let context_id = context_id.unwrap_or_else(|| conversation_id.to_string());
                tracing::info!(%context_id, %conversation_id, "a2a context opened");
                self.book.add_context(context_id.clone(), conversation_id);
                context_id
            }
        };
        let task_id = TaskId::new().to_string();
        let task = self.book.create_task(
            task_id.clone(),
            &context_id,
            params.message,
            input,
            now_ms(),
        )?;
        tracing::info!(%task_id, %context_id, "a2a task submitted");
        if let Some(mut config) = params.push_config {
            config.task_id.clone_from(&task_id);
            self.set_push(config)?;
        }
        let events = stream.then(|| self.add_stream(&task_id));
        self.dispatch(myself, &context_id);
        metrics::tasks(self.book.len());
        let task = self
            .book
            .view(&task_id, params.history_length, true)
            .unwrap_or(task);
        Ok(Accepted { task, events })
    }

    fn on_cancel(&mut self, task_id: &str) -> Result<(), A2aError> {
        match self.book.cancel(task_id, now_ms())? {
            CancelPlan::Canceled(events) => {
                tracing::info!(%task_id, "a2a task canceled before it started");
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

    fn on_push(&mut self, request: PushRequest) -> Result<PushAnswer, A2aError> {
        let known = |book: &TaskBook, task_id: &str| {
            book.record(task_id)
                .map(|r| r.task.status.state)
                .ok_or_else(|| A2aError::TaskNotFound {
                    task_id: task_id.to_owned(),
                })
        };
        match request {
            PushRequest::Set(config) => {
                if known(&self.book, &config.task_id)?.is_terminal() {
                    return Err(A2aError::UnsupportedOperation(format!(
                        "task {} is over; it sends no more notifications",
                        config.task_id
                    )));
                }
                self.set_push(config).map(PushAnswer::Config)
            }
            PushRequest::Get { task_id, id } => {
                known(&self.book, &task_id)?;
                self.push
                    .get(&task_id, id.as_deref())
                    .map(PushAnswer::Config)
            }
            PushRequest::List { task_id } => {
                known(&self.book, &task_id)?;
                Ok(PushAnswer::List(self.push.of(&task_id).to_vec()))
            }
            PushRequest::Delete { task_id, id } => {
                known(&self.book, &task_id)?;
                if self.push.delete(&task_id, &id) {
                    tracing::info!(%task_id, config_id = %id, "a2a push config deleted");
                }
                self.deliveries.close(&task_id, &id);
                Ok(PushAnswer::Deleted)
            }
        }
    }

    /// Stores a task's push config; one that replaces another restarts its worker.
    fn set_push(&mut self, config: PushConfig) -> Result<PushConfig, A2aError> {
        let stored = self.push.set(config)?;
        self.deliveries.close(&stored.task_id, &stored.id);
        tracing::info!(task_id = %stored.task_id, config_id = %stored.id, "a2a push config set");
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
        }
        if let Some(context_id) = self.book.context_of(&task_id) {
            self.dispatch(myself, &context_id);
        }
        self.forget_old();
    }

    fn forget_old(&mut self) {
        for gone in self.book.evict() {
            self.streams.remove(&gone);
            self.push.forget(&gone);
            self.deliveries.close_task(&gone);
        }
        metrics::tasks(self.book.len());
    }

    /// Sends the context's next task to its conversation, if the context is idle.
    fn dispatch(&mut self, myself: &ActorRef<A2aTasksMsg>, context_id: &str) {
        let Some(Dispatch {
            task_id,
            conversation_id,
            input,
        }) = self.book.next_dispatch(context_id)
        else {
            return;
        };
        tracing::debug!(%task_id, %conversation_id, "a2a task dispatched");
        let backend = self.backend.clone();
        let me = myself.clone();
        tokio::spawn(run_message(backend, me, task_id, conversation_id, input));
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
        self.streams.entry(task_id.to_owned()).or_default().push(tx);
        rx
    }

    /// Sends a task's new events to its streams, then wakes whoever waits for its state.
    fn publish(&mut self, task_id: &str, events: Vec<StreamEvent>) {
        if events.is_empty() {
            return;
        }
        let terminal = events
            .iter()
            .any(|e| e.state().is_some_and(|s| s.is_terminal()));
        if let Some(subs) = self.streams.get_mut(task_id) {
            subs.retain(|tx| {
                events.iter().all(|e| match tx.try_send(e.clone()) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        tracing::warn!(%task_id, "a2a stream fell behind; dropped");
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                })
            });
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
            | EventKind::ApprovalRequested { .. }
            | EventKind::ApprovalResolved { .. }
            | EventKind::TaskFinished { .. }
            | EventKind::TaskAborted { .. }
    )
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
    loop {
        while let Some(item) = events.next().await {
            match item {
                Ok(record) => {
                    last_seq = Some(record.seq);
                    let Some(event) = record.event.filter(relevant) else {
                        continue;
                    };
                    let msg = A2aTasksMsg::SessionEvent {
                        conversation_id: record.conversation_id,
                        task_id: record.task_id,
                        event,
                    };
                    if me.cast(msg).is_err() {
                        return;
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
