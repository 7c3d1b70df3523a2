//! `TaskBook`: the A2A endpoint's live records, a plain struct the `A2aTasks` actor owns.
//!
//! It maps each A2A `contextId` to a troupe conversation and each A2A task to the troupe task
//! that runs it, keeps every live task's A2A view (status, history, artifacts) and decides
//! what a request or a troupe event does to them. It performs no I/O: each method returns the
//! stream events to publish and what to ask of the session, and marks what changed
//! ([`TaskBook::take_dirty`]) for the actor to store.
//!
//! The book holds what may still change: live tasks, and the contexts whose conversation is
//! open or that have a live task. The store holds everything (`book/stored.rs` converts): a
//! finished task leaves the book once stored, a context once its idle conversation closed, and
//! the actor reads either back from the store when a request names it (`hydrate_*`). So the
//! book's size follows what is live, not how many tasks and contexts were ever made.
//!
//! A context runs one task at a time, in arrival order: a task that arrives while another of
//! its context runs stays SUBMITTED in the context's queue (and can be canceled there). A
//! task sent to its conversation stays SUBMITTED until its first step (it may wait for a
//! scheduler slot meanwhile), then it is WORKING. That is also how a troupe task is matched to
//! its A2A task: the next `task_started` of the conversation belongs to the context's
//! dispatched task. A context's conversation is `Open`, `Closing` (idle, being closed),
//! `Closed` or `Reopening`; a task is dispatched only to an open one, and a task queued in a
//! closed context reopens it.

use super::error::A2aError;
use super::events::final_state;
use super::model::{
    Artifact, ArtifactUpdate, Message, Part, PartContent, Status, StatusUpdate, StreamEvent, Task,
    TaskState,
};
use super::reply::{self, AnswerForm};
use super::request::SendParams;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::{BTreeSet, HashMap, VecDeque};
use troupe_proto::{
    AgentError, ApprovalDecision, ApprovalId, ConversationId, ErrorKind, EventEnvelope, EventKind,
    MessageReply, SessionId, TaskId, TaskStatus,
};

/// Longest contextId a client may name (it becomes a key of the book).
pub const MAX_CONTEXT_ID: usize = 256;

/// Most messages a task's history keeps. A long task (one status message per tool call, each
/// with the call's arguments) would otherwise grow its record without bound, and the record
/// is stored whole at each status change. Past this, the client's request that opened the
/// task stays and the oldest messages after it go (see [`cap_history`]), and
/// `metadata.troupe.historyDropped` counts what went.
pub const MAX_HISTORY: usize = 100;

/// Where a task is in its context's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Waiting behind another task of its context (or for its conversation to reopen).
    Queued,
    /// Sent to the conversation.
    Dispatched,
    /// The agent asked the client something and ended its turn: the client's next message
    /// to the task runs it again (INPUT_REQUIRED without a pending approval).
    Waiting,
    /// Terminal.
    Done,
}

/// One A2A task. What is not transient is stored whole (see `book/stored.rs`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub task: Task,
    pub conversation_id: ConversationId,
    /// Known once the conversation started it.
    pub troupe_task: Option<TaskId>,
    /// The troupe tasks of its earlier runs (before the client answered a question): a late
    /// word of one of them (its call's reply, an event) is not about the run now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_runs: Vec<TaskId>,
    /// What the conversation is asked next.
    pub input: String,
    pub phase: Phase,
    #[serde(default)]
    pub cancel_requested: bool,
    pub pending_approval: Option<ApprovalId>,
    /// The pending approval is an MCP elicitation: a data part answers it with content.
    #[serde(default)]
    pub pending_elicitation: bool,
    /// Messages written about this task so far (agent message ids are `<task>-m<n>`).
    #[serde(default)]
    messages: u32,
    #[serde(default)]
    pub created_ms: u64,
    /// The conversation answered the dispatch with NotFound once (it had been closed behind
    /// the book's back): the task was queued again behind a reopen; a second NotFound fails it.
    #[serde(default)]
    retried: bool,
    /// Files the task's tools made so far (they number its file artifacts).
    #[serde(default)]
    files: u32,
    /// The agent answered with a plain Message (the reply form's `"reply": "message"`): what
    /// a blocking send returns instead of the task.
    #[serde(default)]
    pub reply_message: Option<Message>,
    /// The conversation's reply, held until the task's `task_finished` event (or a grace).
    #[serde(skip)]
    pending_reply: Option<MessageReply>,
    /// The current step's text and whether it streams.
    #[serde(skip)]
    step: Step,
    /// Tool calls started and not finished: their name and arguments, by call id.
    #[serde(skip)]
    calls: HashMap<String, (String, serde_json::Value)>,
    /// The answer of the run's last dispatch when an output schema validated it (A8): a
    /// task that ends with that text sends it as data, never read as the reply form.
    #[serde(skip)]
    validated: Option<String>,
}

/// The text the current step of a task wrote so far, and what is done with it.
#[derive(Debug, Clone, Default)]
struct Step {
    text: String,
    mode: StepMode,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum StepMode {
    /// Nothing but white space yet.
    #[default]
    Undecided,
    /// Streamed: each piece is an artifact update.
    Streaming,
    /// It may be JSON (a data answer, the reply form): it arrives whole at the end.
    Held,
}

impl Record {
    fn next_message_id(&mut self) -> String {
        self.messages += 1;
        format!("{}-m{}", self.task.id, self.messages)
    }

    /// Adds `message` to the task's history, within [`MAX_HISTORY`].
    fn push_history(&mut self, message: Message) {
        self.task.history.push(message);
        let dropped = cap_history(&mut self.task.history, MAX_HISTORY);
        if dropped == 0 {
            return;
        }
        if let Some(md) = self
            .task
            .metadata
            .as_mut()
            .and_then(|m| m.get_mut("troupe"))
        {
            let before = md
                .get("historyDropped")
                .and_then(|v| v.as_u64())
                .unwrap_or(0);
            md["historyDropped"] = json!(before + dropped);
        }
    }

    fn set_troupe_task(&mut self, troupe_task: TaskId) {
        self.troupe_task = Some(troupe_task);
        if let Some(md) = self
            .task
            .metadata
            .as_mut()
            .and_then(|m| m.get_mut("troupe"))
        {
            md["taskId"] = json!(troupe_task.to_string());
        }
    }

    pub fn updated_ms(&self) -> u64 {
        self.task.status.timestamp_ms.unwrap_or(0)
    }
}

/// Where a context's conversation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conv {
    Open,
    /// Idle: being closed.
    Closing,
    Closed,
    /// Being opened again for a queued task.
    Reopening,
}

/// One context.
#[derive(Debug, Clone)]
pub struct Context {
    pub conversation_id: ConversationId,
    pub session_id: SessionId,
    pub created_ms: u64,
    /// When a task of the context last arrived or changed state.
    pub active_ms: u64,
    pub conv: Conv,
    queue: VecDeque<String>,
    active: Option<String>,
}

impl Context {
    /// Nothing of it runs or waits to run.
    pub fn idle(&self) -> bool {
        self.active.is_none() && self.queue.is_empty()
    }
}

/// What a `SendMessage` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum SendPlan {
    /// A new task in a known context.
    NewTask { context_id: String },
    /// A new task in a context that needs a conversation first (`None`: the server names it).
    NewContext { context_id: Option<String> },
    /// An answer to the approval an INPUT_REQUIRED task waits for.
    Answer {
        task_id: String,
        approval_id: ApprovalId,
        decision: ApprovalDecision,
    },
    /// The client's reply to what the agent asked: the task runs again with it.
    Continue { task_id: String },
}

/// What a `CancelTask` does.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelPlan {
    /// Canceled now (it had not started, or it waited for the client); these are its events.
    Canceled(Vec<StreamEvent>),
    /// Ask the session to cancel this troupe task.
    Forward(TaskId),
    /// Not started yet in troupe; canceled as soon as it starts.
    Deferred,
}

/// What a context needs before its next task can go.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Send this to the conversation.
    Dispatch(Dispatch),
    /// Its conversation is closed: reopen it (the context is now `Reopening`).
    Reopen(ConversationId),
    /// Nothing to do (busy, empty, or its conversation is on its way).
    Nothing,
}

/// Something to send to a conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    pub task_id: String,
    pub conversation_id: ConversationId,
    pub input: String,
}

/// What a returned message call does to its task.
#[derive(Debug, Clone, PartialEq)]
pub enum Finished {
    /// Ended now (or already): these events.
    Done(Vec<StreamEvent>),
    /// Waiting for the task's `task_finished` event; call `finish_due` after a grace.
    Deferred,
    /// The conversation was not open: the task went back to the front of its context's
    /// queue, behind a reopen.
    Requeued,
}

/// The effects of a troupe event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// (A2A task id, event) in order.
    pub events: Vec<(String, StreamEvent)>,
    /// A task that started after its cancellation was asked: cancel it now.
    pub cancel: Option<TaskId>,
}

/// What changed since the last [`TaskBook::take_dirty`]: to be stored.
#[derive(Debug, Default, PartialEq)]
pub struct Dirty {
    pub contexts: Vec<String>,
    pub tasks: Vec<String>,
}

/// The live records of one A2A endpoint.
#[derive(Debug, Default)]
pub struct TaskBook {
    tasks: HashMap<String, Record>,
    contexts: HashMap<String, Context>,
    by_conversation: HashMap<ConversationId, String>,
    by_troupe: HashMap<TaskId, String>,
    /// Changed since last stored (ordered, so writes go in a stable order).
    dirty_contexts: BTreeSet<String>,
    dirty_tasks: BTreeSet<String>,
}

impl TaskBook {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Contexts held (open conversations, or a live task).
    pub fn contexts_len(&self) -> usize {
        self.contexts.len()
    }

    /// Contexts whose conversation is open now.
    pub fn open_contexts(&self) -> usize {
        self.contexts
            .values()
            .filter(|c| matches!(c.conv, Conv::Open | Conv::Closing))
            .count()
    }

    pub fn record(&self, task_id: &str) -> Option<&Record> {
        self.tasks.get(task_id)
    }

    pub fn context(&self, context_id: &str) -> Option<&Context> {
        self.contexts.get(context_id)
    }

    pub fn has_context(&self, context_id: &str) -> bool {
        self.contexts.contains_key(context_id)
    }

    /// Takes what changed since the last call.
    pub fn take_dirty(&mut self) -> Dirty {
        Dirty {
            contexts: std::mem::take(&mut self.dirty_contexts)
                .into_iter()
                .collect(),
            tasks: std::mem::take(&mut self.dirty_tasks).into_iter().collect(),
        }
    }

    fn touch_task(&mut self, task_id: &str) {
        self.dirty_tasks.insert(task_id.to_owned());
    }

    fn touch_context(&mut self, context_id: &str, now_ms: u64) {
        if let Some(c) = self.contexts.get_mut(context_id) {
            c.active_ms = c.active_ms.max(now_ms);
            self.dirty_contexts.insert(context_id.to_owned());
        }
    }

    /// Decides what a send does, before anything changes. A task or context the book does
    /// not hold must have been hydrated from the store first.
    pub fn plan_send(&self, params: &SendParams) -> Result<SendPlan, A2aError> {
        let m = &params.message;
        if let Some(task_id) = &m.task_id {
            let rec = self
                .tasks
                .get(task_id)
                .ok_or_else(|| A2aError::TaskNotFound {
                    task_id: task_id.clone(),
                })?;
            if let Some(c) = &m.context_id
                && *c != rec.task.context_id
            {
                return Err(A2aError::InvalidParams(format!(
                    "contextId {c} does not match task {task_id}'s context"
                )));
            }
            let state = rec.task.status.state;
            if state.is_terminal() {
                return Err(A2aError::UnsupportedOperation(format!(
                    "task {task_id} is {}; send a new message without taskId",
                    state.v1_name()
                )));
            }
            return match (state, rec.pending_approval, rec.phase) {
                (TaskState::InputRequired, Some(approval_id), _) => Ok(SendPlan::Answer {
                    task_id: task_id.clone(),
                    approval_id,
                    decision: decision_of(params, rec.pending_elicitation),
                }),
                (TaskState::InputRequired, None, Phase::Waiting) => Ok(SendPlan::Continue {
                    task_id: task_id.clone(),
                }),
                _ => Err(A2aError::UnsupportedOperation(format!(
                    "task {task_id} is {} and takes no message until it needs input",
                    state.v1_name()
                ))),
            };
        }
        if let Some(c) = &m.context_id
            && c.len() > MAX_CONTEXT_ID
        {
            return Err(A2aError::InvalidParams(format!(
                "contextId is longer than {MAX_CONTEXT_ID} bytes"
            )));
        }
        Ok(match &m.context_id {
            Some(c) if self.contexts.contains_key(c) => SendPlan::NewTask {
                context_id: c.clone(),
            },
            other => SendPlan::NewContext {
                context_id: other.clone(),
            },
        })
    }

    /// Binds a context to the conversation opened for it.
    pub fn add_context(
        &mut self,
        context_id: String,
        conversation_id: ConversationId,
        session_id: SessionId,
        now_ms: u64,
    ) {
        self.insert_context(
            context_id.clone(),
            Context {
                conversation_id,
                session_id,
                created_ms: now_ms,
                active_ms: now_ms,
                conv: Conv::Open,
                queue: VecDeque::new(),
                active: None,
            },
        );
        self.dirty_contexts.insert(context_id);
    }

    fn insert_context(&mut self, context_id: String, context: Context) {
        self.by_conversation
            .insert(context.conversation_id, context_id.clone());
        self.contexts.insert(context_id, context);
    }

    /// Takes a context back from the store (unless the book holds it already).
    pub fn hydrate_context(
        &mut self,
        context_id: String,
        conversation_id: ConversationId,
        session_id: SessionId,
        created_ms: u64,
        active_ms: u64,
        open: bool,
    ) {
        if self.contexts.contains_key(&context_id) {
            return;
        }
        self.insert_context(
            context_id,
            Context {
                conversation_id,
                session_id,
                created_ms,
                active_ms,
                conv: if open { Conv::Open } else { Conv::Closed },
                queue: VecDeque::new(),
                active: None,
            },
        );
    }

    /// Takes a task back from the store (unless the book holds it already). Its context must
    /// be held. A queued one goes to the end of its context's queue.
    pub fn hydrate_task(&mut self, record: Record) {
        let id = record.task.id.clone();
        if self.tasks.contains_key(&id) {
            return;
        }
        if record.phase == Phase::Queued
            && let Some(ctx) = self.contexts.get_mut(&record.task.context_id)
        {
            ctx.queue.push_back(id.clone());
        }
        if let Some(t) = record.troupe_task {
            self.by_troupe.insert(t, id.clone());
        }
        self.tasks.insert(id, record);
    }

    /// Records a new SUBMITTED task at the end of its context's queue. The context must be
    /// held (`add_context`, `hydrate_context`).
    pub fn create_task(
        &mut self,
        task_id: String,
        context_id: &str,
        mut message: Message,
        input: String,
        now_ms: u64,
    ) -> Result<Task, A2aError> {
        let ctx = self
            .contexts
            .get_mut(context_id)
            .ok_or_else(|| A2aError::Internal(format!("context {context_id} is not open")))?;
        message.context_id = Some(context_id.to_owned());
        message.task_id = Some(task_id.clone());
        let task = Task {
            id: task_id.clone(),
            context_id: context_id.to_owned(),
            status: Status {
                state: TaskState::Submitted,
                message: None,
                timestamp_ms: Some(now_ms),
            },
            artifacts: Vec::new(),
            history: vec![message],
            metadata: Some(json!({
                "troupe": {"conversationId": ctx.conversation_id.to_string()}
            })),
        };
        ctx.queue.push_back(task_id.clone());
        self.tasks.insert(
            task_id.clone(),
            Record {
                task: task.clone(),
                conversation_id: ctx.conversation_id,
                troupe_task: None,
                earlier_runs: Vec::new(),
                input,
                phase: Phase::Queued,
                cancel_requested: false,
                pending_approval: None,
                pending_elicitation: false,
                pending_reply: None,
                messages: 0,
                created_ms: now_ms,
                retried: false,
                files: 0,
                reply_message: None,
                step: Step::default(),
                calls: HashMap::new(),
                validated: None,
            },
        );
        self.touch_context(context_id, now_ms);
        self.touch_task(&task_id);
        Ok(task)
    }

    /// What a context needs for its next task: a dispatch when its conversation is open and
    /// it is idle, a reopen when its conversation is closed and a task waits.
    pub fn next(&mut self, context_id: &str) -> Next {
        let Some(ctx) = self.contexts.get_mut(context_id) else {
            return Next::Nothing;
        };
        if ctx.active.is_some() {
            return Next::Nothing;
        }
        // Drop what cannot go any more (canceled while queued).
        let tasks = &self.tasks;
        ctx.queue
            .retain(|id| tasks.get(id).is_some_and(|r| r.phase == Phase::Queued));
        if ctx.queue.is_empty() {
            return Next::Nothing;
        }
        match ctx.conv {
            Conv::Open => {}
            Conv::Closed => {
                ctx.conv = Conv::Reopening;
                return Next::Reopen(ctx.conversation_id);
            }
            Conv::Closing | Conv::Reopening => return Next::Nothing,
        }
        let Some(task_id) = ctx.queue.pop_front() else {
            return Next::Nothing;
        };
        let conversation_id = ctx.conversation_id;
        ctx.active = Some(task_id.clone());
        let Some(rec) = self.tasks.get_mut(&task_id) else {
            return Next::Nothing;
        };
        rec.phase = Phase::Dispatched;
        rec.conversation_id = conversation_id;
        self.dirty_tasks.insert(task_id.clone());
        Next::Dispatch(Dispatch {
            task_id,
            conversation_id,
            input: rec.input.clone(),
        })
    }

    /// The context of a task (to dispatch its next task once it is done).
    pub fn context_of(&self, task_id: &str) -> Option<String> {
        self.tasks.get(task_id).map(|r| r.task.context_id.clone())
    }

    /// Contexts idle for at least `idle_ms` with an open conversation: they are `Closing`
    /// from now on; close their conversations. A context whose task waits for a human (an
    /// approval) is not idle: its troupe task runs.
    pub fn idle_contexts(&mut self, now_ms: u64, idle_ms: u64) -> Vec<(String, ConversationId)> {
        let due: Vec<String> = self
            .contexts
            .iter()
            .filter(|(_, c)| {
                c.conv == Conv::Open && c.idle() && now_ms.saturating_sub(c.active_ms) >= idle_ms
            })
            .map(|(id, _)| id.clone())
            .collect();
        due.into_iter()
            .filter_map(|id| {
                let c = self.contexts.get_mut(&id)?;
                c.conv = Conv::Closing;
                Some((id, c.conversation_id))
            })
            .collect()
    }

    /// A context's conversation closed (`Ok`), or could not be (`Err`: it stays open). Answers
    /// whether it has a task waiting (then `next` reopens it).
    pub fn context_closed(&mut self, context_id: &str, closed: bool) -> bool {
        let Some(c) = self.contexts.get_mut(context_id) else {
            return false;
        };
        if c.conv == Conv::Closing {
            c.conv = if closed { Conv::Closed } else { Conv::Open };
        }
        if closed {
            self.dirty_contexts.insert(context_id.to_owned());
        }
        !c.queue.is_empty()
    }

    /// A context's conversation is open again: the same one (`None`), or a new one that
    /// replaces it (`Some`: the old one could not be reopened). `false` when the context is
    /// gone.
    pub fn context_reopened(
        &mut self,
        context_id: &str,
        replacement: Option<ConversationId>,
        now_ms: u64,
    ) -> bool {
        let Some(c) = self.contexts.get_mut(context_id) else {
            return false;
        };
        c.conv = Conv::Open;
        if let Some(new) = replacement {
            let old = std::mem::replace(&mut c.conversation_id, new);
            self.by_conversation.remove(&old);
            self.by_conversation.insert(new, context_id.to_owned());
        }
        self.touch_context(context_id, now_ms);
        true
    }

    /// A context's conversation could not be opened again: its queued tasks fail with the
    /// reason.
    pub fn reopen_failed(
        &mut self,
        context_id: &str,
        error: &AgentError,
        now_ms: u64,
    ) -> Vec<(String, Vec<StreamEvent>)> {
        let Some(c) = self.contexts.get_mut(context_id) else {
            return Vec::new();
        };
        c.conv = Conv::Closed;
        let queued: Vec<String> = c.queue.drain(..).collect();
        queued
            .into_iter()
            .map(|id| {
                let events = self.complete(&id, TaskStatus::Error, "", Some(error), now_ms);
                (id, events)
            })
            .collect()
    }

    /// Forgets a context that is closed and holds no task: it lives on in the store. Answers
    /// whether it went.
    pub fn forget_context(&mut self, context_id: &str) -> bool {
        let gone = self.contexts.get(context_id).is_some_and(|c| {
            c.conv == Conv::Closed
                && c.idle()
                && !self.dirty_contexts.contains(context_id)
                && !self.tasks.values().any(|r| r.task.context_id == context_id)
        });
        if gone && let Some(c) = self.contexts.remove(context_id) {
            self.by_conversation.remove(&c.conversation_id);
        }
        gone
    }

    /// Forgets a terminal task once stored: it lives on in the store. Answers its context
    /// when it went. A task its context still waits for (its message call has not returned:
    /// its end came first, by its event) stays until `finished` frees the context.
    pub fn forget_task(&mut self, task_id: &str) -> Option<String> {
        let gone = self.tasks.get(task_id).is_some_and(|r| {
            r.phase == Phase::Done
                && !self.dirty_tasks.contains(task_id)
                && self
                    .contexts
                    .get(&r.task.context_id)
                    .is_none_or(|c| c.active.as_deref() != Some(task_id))
        });
        if !gone {
            return None;
        }
        let rec = self.tasks.remove(task_id)?;
        if let Some(t) = rec.troupe_task {
            self.by_troupe.remove(&t);
        }
        Some(rec.task.context_id)
    }

    /// Applies one troupe event of the session.
    pub fn apply(&mut self, env: &EventEnvelope, now_ms: u64) -> Applied {
        self.apply_event(env.conversation_id, env.task_id, &env.event, now_ms)
    }

    /// Applies one troupe event of the session, given as its parts.
    pub fn apply_event(
        &mut self,
        conversation_id: Option<ConversationId>,
        troupe_task: Option<TaskId>,
        event: &EventKind,
        now_ms: u64,
    ) -> Applied {
        let mut out = Applied::default();
        let Some(conversation_id) = conversation_id else {
            return out;
        };
        // The task this event is about: bound already, or (task_started) the context's
        // dispatched task.
        let task_id = match (event, troupe_task) {
            (EventKind::TaskStarted { .. }, Some(troupe_task)) => {
                let Some(a2a) = self.bind(conversation_id, troupe_task) else {
                    return out;
                };
                if self.tasks.get(&a2a).is_some_and(|r| r.cancel_requested) {
                    out.cancel = Some(troupe_task);
                }
                a2a
            }
            (_, Some(troupe_task)) => match self.by_troupe.get(&troupe_task) {
                Some(a2a) => a2a.clone(),
                None => return out,
            },
            (_, None) => return out,
        };
        let events = match event {
            // Started in troupe, but maybe still waiting for a scheduler slot: it is WORKING
            // from its first step on.
            EventKind::TaskStarted { .. } => {
                if let Some(r) = self.tasks.get_mut(&task_id) {
                    r.step = Step::default();
                    r.validated = None;
                }
                Vec::new()
            }
            EventKind::DispatchResult {
                text, validated, ..
            } => {
                if let Some(r) = self.tasks.get_mut(&task_id) {
                    r.validated = validated.then(|| text.clone());
                }
                Vec::new()
            }
            EventKind::StepStarted { .. } => match self.tasks.get(&task_id) {
                Some(r) if r.task.status.state == TaskState::Submitted => {
                    self.set_status(&task_id, TaskState::Working, None, now_ms)
                }
                _ => Vec::new(),
            },
            EventKind::AssistantChunk { delta } => self.answer_delta(&task_id, delta),
            EventKind::ToolCallStarted { call, .. } => {
                // The text so far was said before a tool call; the answer starts anew.
                if let Some(r) = self.tasks.get_mut(&task_id) {
                    r.step = Step::default();
                    r.calls.insert(
                        call.call_id.clone(),
                        (call.name.clone(), call.arguments.0.clone()),
                    );
                }
                let parts = vec![
                    Part::text(format!("Calling tool `{}`.", call.name)),
                    Part::data(json!({"toolCall": {
                        "callId": call.call_id,
                        "name": call.name,
                        "arguments": call.arguments.0,
                    }})),
                ];
                self.set_status(&task_id, TaskState::Working, Some(parts), now_ms)
            }
            EventKind::ToolCallFinished {
                call_id,
                output,
                is_error,
                ..
            } => self.tool_finished(&task_id, call_id, output, *is_error),
            EventKind::ApprovalRequested {
                approval_id,
                command,
                reason,
                subject,
            } => {
                if let Some(r) = self.tasks.get_mut(&task_id) {
                    r.pending_approval = Some(*approval_id);
                    r.pending_elicitation = subject.takes_content();
                }
                let parts = approval_parts(*approval_id, command, reason, subject);
                self.set_status(&task_id, TaskState::InputRequired, Some(parts), now_ms)
            }
            EventKind::ApprovalResolved { approval_id, .. } => {
                let waiting = self
                    .tasks
                    .get_mut(&task_id)
                    .filter(|r| r.pending_approval == Some(*approval_id));
                match waiting {
                    Some(r) => {
                        r.pending_approval = None;
                        if r.task.status.state == TaskState::InputRequired {
                            self.set_status(&task_id, TaskState::Working, None, now_ms)
                        } else {
                            Vec::new()
                        }
                    }
                    None => Vec::new(),
                }
            }
            EventKind::TaskFinished {
                status,
                text,
                error,
                ..
            } => self.complete(&task_id, *status, text, error.as_ref(), now_ms),
            EventKind::TaskAborted { .. } => {
                self.complete(&task_id, TaskStatus::Cancelled, "", None, now_ms)
            }
            _ => Vec::new(),
        };
        out.events = events.into_iter().map(|e| (task_id.clone(), e)).collect();
        out
    }

    /// The conversation answered a dispatched task (the message call returned): its context
    /// may run the next task. The task's end normally arrives as a `task_finished` event,
    /// after its other events; a reply that comes first waits (`Deferred`) so the stream
    /// keeps troupe's order, and `finish_due` ends the task from the reply if the event
    /// never comes (a lagging subscriber). A failed call ends the task at once, except a
    /// conversation found closed before the task started: the task is queued again, once,
    /// behind a reopen.
    pub fn finished(
        &mut self,
        task_id: &str,
        result: Result<MessageReply, AgentError>,
        now_ms: u64,
    ) -> Finished {
        let context_id = self.tasks.get(task_id).map(|r| r.task.context_id.clone());
        if let Some(ctx) = context_id.as_ref().and_then(|c| self.contexts.get_mut(c))
            && ctx.active.as_deref() == Some(task_id)
        {
            ctx.active = None;
        }
        if let Some(c) = &context_id {
            self.touch_context(c, now_ms);
        }
        match result {
            Ok(reply) => {
                let Some(r) = self.tasks.get_mut(task_id) else {
                    return Finished::Done(Vec::new());
                };
                if r.troupe_task.is_none() && !r.earlier_runs.contains(&reply.task_id) {
                    r.set_troupe_task(reply.task_id);
                    self.by_troupe.insert(reply.task_id, task_id.to_owned());
                }
                if r.task.status.state.is_terminal() || r.phase != Phase::Dispatched {
                    // Ended already (its event came first): stored once more, so that its
                    // context being free now lets it leave memory.
                    self.touch_task(task_id);
                    return Finished::Done(Vec::new());
                }
                r.pending_reply = Some(reply);
                Finished::Deferred
            }
            Err(AgentError::NotFound { what, .. })
                if what == "conversation" && self.requeue(task_id) =>
            {
                Finished::Requeued
            }
            Err(e) => {
                let status = if e.kind() == ErrorKind::Cancelled {
                    TaskStatus::Cancelled
                } else {
                    TaskStatus::Error
                };
                Finished::Done(self.complete(task_id, status, "", Some(&e), now_ms))
            }
        }
    }

    /// Puts a dispatched task that never started back at the front of its context's queue and
    /// marks the context's conversation closed; `false` when it was retried already.
    fn requeue(&mut self, task_id: &str) -> bool {
        let Some(rec) = self.tasks.get_mut(task_id) else {
            return false;
        };
        if rec.retried || rec.troupe_task.is_some() || rec.phase != Phase::Dispatched {
            return false;
        }
        rec.retried = true;
        rec.phase = Phase::Queued;
        let context_id = rec.task.context_id.clone();
        if let Some(ctx) = self.contexts.get_mut(&context_id) {
            ctx.queue.push_front(task_id.to_owned());
            if ctx.conv == Conv::Open {
                ctx.conv = Conv::Closed;
            }
        }
        self.touch_task(task_id);
        true
    }

    /// Ends a task from its deferred reply, unless its `task_finished` event ended it.
    pub fn finish_due(&mut self, task_id: &str, now_ms: u64) -> Vec<StreamEvent> {
        let Some(reply) = self
            .tasks
            .get_mut(task_id)
            .and_then(|r| r.pending_reply.take())
        else {
            return Vec::new();
        };
        self.complete(
            task_id,
            reply.status,
            &reply.text,
            reply.error.as_ref(),
            now_ms,
        )
    }

    /// Decides what a cancel does; a queued task (or one waiting for the client) is canceled
    /// at once.
    pub fn cancel(&mut self, task_id: &str, now_ms: u64) -> Result<CancelPlan, A2aError> {
        let rec = self
            .tasks
            .get_mut(task_id)
            .ok_or_else(|| A2aError::TaskNotFound {
                task_id: task_id.to_owned(),
            })?;
        let state = rec.task.status.state;
        if state.is_terminal() {
            return Err(A2aError::TaskNotCancelable {
                task_id: task_id.to_owned(),
                state: state.v1_name(),
            });
        }
        rec.cancel_requested = true;
        Ok(match (rec.phase, rec.troupe_task) {
            (Phase::Queued | Phase::Waiting, _) => CancelPlan::Canceled(self.complete(
                task_id,
                TaskStatus::Cancelled,
                "",
                None,
                now_ms,
            )),
            (_, Some(t)) => CancelPlan::Forward(t),
            (_, None) => CancelPlan::Deferred,
        })
    }

    /// The client's answer to what an INPUT_REQUIRED task asked: the question and the answer
    /// go into the task's history, in that order, and the task is optimistically WORKING.
    pub fn answered(
        &mut self,
        task_id: &str,
        mut message: Message,
        now_ms: u64,
    ) -> Vec<StreamEvent> {
        match self.tasks.get_mut(task_id) {
            Some(r) if r.task.status.state == TaskState::InputRequired => {
                r.pending_approval = None;
                if let Some(question) = r.task.status.message.take() {
                    r.push_history(question);
                }
                message.context_id = Some(r.task.context_id.clone());
                message.task_id = Some(task_id.to_owned());
                r.push_history(message);
                self.set_status(task_id, TaskState::Working, None, now_ms)
            }
            _ => Vec::new(),
        }
    }

    /// The client's reply to a task that waits for it (`Phase::Waiting`): recorded like an
    /// answer, and the task goes back into its context's queue with the reply as its input.
    pub fn continued(
        &mut self,
        task_id: &str,
        message: Message,
        input: String,
        now_ms: u64,
    ) -> Vec<StreamEvent> {
        let events = self.answered(task_id, message, now_ms);
        let Some(rec) = self.tasks.get_mut(task_id) else {
            return events;
        };
        rec.phase = Phase::Queued;
        rec.input = input;
        if let Some(earlier) = rec.troupe_task.take() {
            self.by_troupe.remove(&earlier);
            rec.earlier_runs.push(earlier);
        }
        rec.retried = false;
        let context_id = rec.task.context_id.clone();
        if let Some(ctx) = self.contexts.get_mut(&context_id) {
            ctx.queue.push_back(task_id.to_owned());
        }
        self.touch_context(&context_id, now_ms);
        self.touch_task(task_id);
        events
    }

    /// What a blocking send returns as soon as the task is settled (terminal or waiting).
    pub fn settled(&self, task_id: &str) -> bool {
        self.tasks.get(task_id).is_none_or(|r| {
            let s = r.task.status.state;
            s.is_terminal() || s.is_interrupted()
        })
    }

    pub fn terminal(&self, task_id: &str) -> bool {
        self.tasks
            .get(task_id)
            .is_none_or(|r| r.task.status.state.is_terminal())
    }

    fn bind(&mut self, conversation_id: ConversationId, troupe_task: TaskId) -> Option<String> {
        if let Some(a2a) = self.by_troupe.get(&troupe_task) {
            return Some(a2a.clone());
        }
        let context_id = self.by_conversation.get(&conversation_id)?;
        let active = self.contexts.get(context_id)?.active.clone()?;
        let rec = self.tasks.get_mut(&active)?;
        if rec.troupe_task.is_some() || rec.earlier_runs.contains(&troupe_task) {
            return None;
        }
        rec.set_troupe_task(troupe_task);
        self.by_troupe.insert(troupe_task, active.clone());
        self.touch_task(&active);
        Some(active)
    }

    /// Changes a live task's status, with a new agent message of these parts; an older
    /// status message moves into history.
    fn set_status(
        &mut self,
        task_id: &str,
        state: TaskState,
        parts: Option<Vec<Part>>,
        now_ms: u64,
    ) -> Vec<StreamEvent> {
        let Some(rec) = self.tasks.get_mut(task_id) else {
            return Vec::new();
        };
        let message = parts.map(|parts| {
            let id = rec.next_message_id();
            Message::agent(id, &rec.task.context_id, task_id, parts)
        });
        self.set_status_message(task_id, state, message, now_ms)
    }

    /// Changes a live task's status, with this status message.
    fn set_status_message(
        &mut self,
        task_id: &str,
        state: TaskState,
        message: Option<Message>,
        now_ms: u64,
    ) -> Vec<StreamEvent> {
        let Some(rec) = self.tasks.get_mut(task_id) else {
            return Vec::new();
        };
        if rec.task.status.state.is_terminal() {
            return Vec::new();
        }
        if let Some(old) = rec.task.status.message.take() {
            rec.push_history(old);
        }
        rec.task.status = Status {
            state,
            message,
            timestamp_ms: Some(now_ms),
        };
        let event = StreamEvent::Status(StatusUpdate {
            task_id: task_id.to_owned(),
            context_id: rec.task.context_id.clone(),
            status: rec.task.status.clone(),
        });
        let context_id = rec.task.context_id.clone();
        self.touch_task(task_id);
        self.touch_context(&context_id, now_ms);
        vec![event]
    }

    /// A piece of the answer as the model streams it: the answer artifact grows (its first
    /// piece of a step replaces what an earlier step said), and streams get the piece as an
    /// artifact update (`append` after the first). The task's end sends the whole answer
    /// again (`append: false`, `lastChunk: true`), so a client that missed a piece ends with
    /// the right text. A step whose text starts like JSON is held back: it may be a data
    /// answer or the reply form, which arrive whole at the end. Pieces are not stored: the
    /// end is.
    fn answer_delta(&mut self, task_id: &str, delta: &str) -> Vec<StreamEvent> {
        let Some(rec) = self.tasks.get_mut(task_id) else {
            return Vec::new();
        };
        if delta.is_empty() || rec.task.status.state.is_terminal() {
            return Vec::new();
        }
        rec.step.text.push_str(delta);
        let (piece, append) = match rec.step.mode {
            StepMode::Held => return Vec::new(),
            StepMode::Streaming => (delta.to_owned(), true),
            StepMode::Undecided if rec.step.text.trim().is_empty() => return Vec::new(),
            StepMode::Undecided if reply::held_back(&rec.step.text) => {
                rec.step.mode = StepMode::Held;
                return Vec::new();
            }
            StepMode::Undecided => {
                rec.step.mode = StepMode::Streaming;
                (rec.step.text.clone(), false)
            }
        };
        let answer_id = answer_artifact_id(task_id);
        let stored = match rec
            .task
            .artifacts
            .iter_mut()
            .find(|a| a.artifact_id == answer_id)
        {
            Some(a) => a,
            None => {
                rec.task
                    .artifacts
                    .push(answer_artifact(task_id, Vec::new()));
                let last = rec.task.artifacts.len() - 1;
                &mut rec.task.artifacts[last]
            }
        };
        match (append, stored.parts.first_mut()) {
            (
                true,
                Some(Part {
                    content: PartContent::Text(text),
                    ..
                }),
            ) => text.push_str(&piece),
            _ => stored.parts = vec![Part::text(piece.clone())],
        }
        vec![StreamEvent::Artifact(ArtifactUpdate {
            task_id: task_id.to_owned(),
            context_id: rec.task.context_id.clone(),
            artifact: answer_artifact(task_id, vec![Part::text(piece)]),
            append,
            last_chunk: false,
        })]
    }

    /// A tool call ended: the file it made, if any, as an artifact of its own.
    fn tool_finished(
        &mut self,
        task_id: &str,
        call_id: &str,
        output: &str,
        is_error: bool,
    ) -> Vec<StreamEvent> {
        let Some(rec) = self.tasks.get_mut(task_id) else {
            return Vec::new();
        };
        let Some((name, arguments)) = rec.calls.remove(call_id) else {
            return Vec::new();
        };
        if is_error || rec.task.status.state.is_terminal() {
            return Vec::new();
        }
        let Some(file) = reply::tool_file(&name, &arguments, output, rec.files + 1) else {
            return Vec::new();
        };
        rec.files += 1;
        let artifact = Artifact {
            artifact_id: format!("{task_id}-file-{}", rec.files),
            name: Some(file.name.to_owned()),
            description: None,
            parts: vec![file.part],
            metadata: None,
        };
        rec.task.artifacts.push(artifact.clone());
        let event = StreamEvent::Artifact(ArtifactUpdate {
            task_id: task_id.to_owned(),
            context_id: rec.task.context_id.clone(),
            artifact,
            append: false,
            last_chunk: true,
        });
        self.touch_task(task_id);
        vec![event]
    }

    /// Ends a task (once: later reports of the same end are ignored). An `ok` end's answer
    /// takes the form it asks for ([`reply::answer_form`]): the answer artifact (text, data,
    /// files, links), a plain Message, a question to the client (the task then waits for
    /// its reply instead of ending), or a rejection; an answer an output schema validated
    /// (its dispatch said so) is always the data it is ([`reply::data_form`]).
    pub(super) fn complete(
        &mut self,
        task_id: &str,
        status: TaskStatus,
        text: &str,
        error: Option<&AgentError>,
        now_ms: u64,
    ) -> Vec<StreamEvent> {
        let Some(rec) = self.tasks.get_mut(task_id) else {
            return Vec::new();
        };
        if rec.task.status.state.is_terminal() {
            return Vec::new();
        }
        rec.pending_approval = None;
        rec.pending_reply = None;
        rec.step = Step::default();
        let validated = rec.validated.take().is_some_and(|v| v == text);
        let form = match status {
            // An output schema's object is data, whatever its keys (`{"a2a": ...}` too).
            TaskStatus::Ok if !text.is_empty() && validated => reply::data_form(text),
            TaskStatus::Ok if !text.is_empty() => reply::answer_form(text),
            TaskStatus::Cancelled => AnswerForm::Artifact(Vec::new()),
            _ if text.is_empty() => AnswerForm::Artifact(Vec::new()),
            _ => AnswerForm::Artifact(vec![Part::text(text)]),
        };
        let mut events = Vec::new();
        let (state, note): (TaskState, Option<Vec<Part>>) = match form {
            AnswerForm::InputRequired(question) => {
                rec.phase = Phase::Waiting;
                return self.set_status(task_id, TaskState::InputRequired, Some(question), now_ms);
            }
            AnswerForm::Rejected(reason) => (TaskState::Rejected, Some(reason)),
            AnswerForm::Message(parts) => {
                let id = rec.next_message_id();
                let message = Message::agent(id, &rec.task.context_id, task_id, parts);
                rec.reply_message = Some(message.clone());
                events.push(StreamEvent::Message(message));
                (TaskState::Completed, None)
            }
            AnswerForm::Artifact(parts) => {
                if !parts.is_empty() {
                    let artifact = answer_artifact(task_id, parts);
                    match rec
                        .task
                        .artifacts
                        .iter_mut()
                        .find(|a| a.artifact_id == artifact.artifact_id)
                    {
                        Some(streamed) => *streamed = artifact.clone(),
                        None => rec.task.artifacts.push(artifact.clone()),
                    }
                    events.push(StreamEvent::Artifact(ArtifactUpdate {
                        task_id: task_id.to_owned(),
                        context_id: rec.task.context_id.clone(),
                        artifact,
                        append: false,
                        last_chunk: true,
                    }));
                }
                let note = match (status, error) {
                    (TaskStatus::Ok, _) => None,
                    (TaskStatus::MaxSteps, _) => {
                        Some("Stopped at the step limit before an answer.".to_owned())
                    }
                    (TaskStatus::Cancelled, _) => Some("Canceled.".to_owned()),
                    (TaskStatus::Error, Some(e)) => Some(e.to_string()),
                    (TaskStatus::Error, None) => Some("The task failed.".into()),
                };
                (final_state(status), note.map(|n| vec![Part::text(n)]))
            }
        };
        if let Some(md) = rec.task.metadata.as_mut().and_then(|m| m.get_mut("troupe")) {
            md["status"] = json!(status.as_str());
        }
        rec.phase = Phase::Done;
        // A message reply is also the task's last status message.
        let status_message = match &rec.reply_message {
            Some(m) if state == TaskState::Completed => Some(m.clone()),
            _ => None,
        };
        match status_message {
            Some(m) => events.extend(self.set_status_message(task_id, state, Some(m), now_ms)),
            None => events.extend(self.set_status(task_id, state, note, now_ms)),
        }
        events
    }

    /// Ends a task that a restart (or a failure of the endpoint) interrupted while troupe ran
    /// it: FAILED, with the reason; it is not run again (it may have had effects), as the
    /// service's durable queue treats a message that was running.
    pub fn interrupted(&mut self, task_id: &str, reason: &str, now_ms: u64) -> Vec<StreamEvent> {
        if let Some(ctx) = self
            .tasks
            .get(task_id)
            .and_then(|r| self.contexts.get_mut(&r.task.context_id))
            && ctx.active.as_deref() == Some(task_id)
        {
            ctx.active = None;
        }
        self.complete(
            task_id,
            TaskStatus::Error,
            "",
            Some(&AgentError::interrupted(reason)),
            now_ms,
        )
    }

    /// Ids of the held tasks in `phase`.
    pub fn tasks_in(&self, phase: Phase) -> Vec<String> {
        let mut ids: Vec<(u64, &String)> = self
            .tasks
            .iter()
            .filter(|(_, r)| r.phase == phase)
            .map(|(id, r)| (r.created_ms, id))
            .collect();
        ids.sort();
        ids.into_iter().map(|(_, id)| id.clone()).collect()
    }

    /// Ids of the held contexts.
    pub fn context_ids(&self) -> Vec<String> {
        let mut ids: Vec<&String> = self.contexts.keys().collect();
        ids.sort();
        ids.into_iter().cloned().collect()
    }
}

/// The id of a task's answer artifact.
fn answer_artifact_id(task_id: &str) -> String {
    format!("{task_id}-answer")
}

/// A task's answer artifact holding `parts`.
fn answer_artifact(task_id: &str, parts: Vec<Part>) -> Artifact {
    Artifact {
        artifact_id: answer_artifact_id(task_id),
        name: Some("answer".into()),
        description: None,
        parts,
        metadata: None,
    }
}

/// Trims `history` to `max` messages: the first one kept when it is the client's (the
/// request that opened the task), then the newest; what goes is the oldest of the rest, of
/// either role, so what is kept reads as one stretch of the exchange (never a client's answer
/// without the question before it, but at the stretch's start). Returns how many were dropped.
pub fn cap_history(history: &mut Vec<Message>, max: usize) -> u64 {
    let over = history.len().saturating_sub(max);
    if over == 0 {
        return 0;
    }
    let keep_first = max > 0
        && history
            .first()
            .is_some_and(|m| m.role == super::model::Role::User);
    let from = usize::from(keep_first);
    history.drain(from..from + over);
    over as u64
}

mod approval;
mod query;
pub mod stored;

use approval::{approval_parts, decision_of};
pub use query::{list_query, send_result, stored_page, trim};

#[cfg(test)]
#[path = "book_tests.rs"]
mod tests;
