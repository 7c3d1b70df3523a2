//! `TaskBook`: the A2A endpoint's records, a plain struct the `A2aTasks` actor owns.
//!
//! It maps each A2A `contextId` to a troupe conversation and each A2A task to the troupe task
//! that runs it, keeps every task's A2A view (status, history, artifacts) and decides what a
//! request or a troupe event does to them. It performs no I/O: each method returns the
//! stream events to publish and what to ask of the session, and the actor does it.
//!
//! A context runs one task at a time, in arrival order: a task that arrives while another of
//! its context runs stays SUBMITTED in the context's queue (and can be canceled there). A
//! task sent to its conversation stays SUBMITTED until its first step (it may wait for a
//! scheduler slot meanwhile), then it is WORKING. That
//! is also how a troupe task is matched to its A2A task: the next `task_started` of the
//! conversation belongs to the context's dispatched task.

use super::error::A2aError;
use super::events::final_state;
use super::model::{
    Artifact, ArtifactUpdate, Message, Part, PartContent, Status, StatusUpdate, StreamEvent, Task,
    TaskState,
};
use super::request::SendParams;
use serde_json::json;
use std::collections::{HashMap, VecDeque};
use troupe_proto::{
    AgentError, ApprovalDecision, ApprovalId, ConversationId, ErrorKind, EventEnvelope, EventKind,
    MessageReply, TaskId, TaskStatus,
};

/// Longest contextId a client may name (it becomes a key of the book).
pub const MAX_CONTEXT_ID: usize = 256;

/// Where a task is in its context's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting behind another task of its context.
    Queued,
    /// Sent to the conversation.
    Dispatched,
    /// Terminal.
    Done,
}

/// One A2A task.
#[derive(Debug, Clone)]
pub struct Record {
    pub task: Task,
    pub conversation_id: ConversationId,
    /// Known once the conversation started it.
    pub troupe_task: Option<TaskId>,
    /// What the conversation is asked.
    pub input: String,
    pub phase: Phase,
    pub cancel_requested: bool,
    pub pending_approval: Option<ApprovalId>,
    /// The pending approval is an MCP elicitation: a data part answers it with content.
    pub pending_elicitation: bool,
    /// The conversation's reply, held until the task's `task_finished` event (or a grace).
    pending_reply: Option<MessageReply>,
    /// Messages written about this task so far (agent message ids are `<task>-m<n>`).
    messages: u32,
    /// The answer artifact has text of the current step: the next delta appends to it (a
    /// tool call closes it, and the next step's text replaces it).
    answer_open: bool,
}

impl Record {
    fn next_message_id(&mut self) -> String {
        self.messages += 1;
        format!("{}-m{}", self.task.id, self.messages)
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

    fn updated_ms(&self) -> u64 {
        self.task.status.timestamp_ms.unwrap_or(0)
    }
}

#[derive(Debug, Clone)]
struct Context {
    conversation_id: ConversationId,
    queue: VecDeque<String>,
    active: Option<String>,
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
}

/// What a `CancelTask` does.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelPlan {
    /// Canceled now (it had not started); these are its events.
    Canceled(Vec<StreamEvent>),
    /// Ask the session to cancel this troupe task.
    Forward(TaskId),
    /// Not started yet in troupe; canceled as soon as it starts.
    Deferred,
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
}

/// The effects of a troupe event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// (A2A task id, event) in order.
    pub events: Vec<(String, StreamEvent)>,
    /// A task that started after its cancellation was asked: cancel it now.
    pub cancel: Option<TaskId>,
}

/// The records of one A2A endpoint.
#[derive(Debug)]
pub struct TaskBook {
    tasks: HashMap<String, Record>,
    contexts: HashMap<String, Context>,
    by_conversation: HashMap<ConversationId, String>,
    by_troupe: HashMap<TaskId, String>,
    /// Terminal tasks, oldest first: the first forgotten past `max_finished`.
    finished: VecDeque<String>,
    max_finished: usize,
}

impl TaskBook {
    pub fn new(max_finished: usize) -> Self {
        Self {
            tasks: HashMap::new(),
            contexts: HashMap::new(),
            by_conversation: HashMap::new(),
            by_troupe: HashMap::new(),
            finished: VecDeque::new(),
            max_finished: max_finished.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub fn record(&self, task_id: &str) -> Option<&Record> {
        self.tasks.get(task_id)
    }

    pub fn has_context(&self, context_id: &str) -> bool {
        self.contexts.contains_key(context_id)
    }

    /// Decides what a send does, before anything changes.
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
            return match (state, rec.pending_approval) {
                (TaskState::InputRequired, Some(approval_id)) => Ok(SendPlan::Answer {
                    task_id: task_id.clone(),
                    approval_id,
                    decision: decision_of(params, rec.pending_elicitation),
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
    pub fn add_context(&mut self, context_id: String, conversation_id: ConversationId) {
        self.by_conversation
            .insert(conversation_id, context_id.clone());
        self.contexts.insert(
            context_id,
            Context {
                conversation_id,
                queue: VecDeque::new(),
                active: None,
            },
        );
    }

    /// Records a new SUBMITTED task at the end of its context's queue. The context must be
    /// known (`add_context`).
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
            task_id,
            Record {
                task: task.clone(),
                conversation_id: ctx.conversation_id,
                troupe_task: None,
                input,
                phase: Phase::Queued,
                cancel_requested: false,
                pending_approval: None,
                pending_elicitation: false,
                pending_reply: None,
                messages: 0,
                answer_open: false,
            },
        );
        Ok(task)
    }

    /// The next task a context may send to its conversation, if it is idle.
    pub fn next_dispatch(&mut self, context_id: &str) -> Option<Dispatch> {
        let ctx = self.contexts.get_mut(context_id)?;
        if ctx.active.is_some() {
            return None;
        }
        while let Some(task_id) = ctx.queue.pop_front() {
            let Some(rec) = self.tasks.get_mut(&task_id) else {
                continue;
            };
            if rec.phase != Phase::Queued {
                continue;
            }
            rec.phase = Phase::Dispatched;
            ctx.active = Some(task_id.clone());
            return Some(Dispatch {
                task_id,
                conversation_id: ctx.conversation_id,
                input: rec.input.clone(),
            });
        }
        None
    }

    /// The context of a task (to dispatch its next task once it is done).
    pub fn context_of(&self, task_id: &str) -> Option<String> {
        self.tasks.get(task_id).map(|r| r.task.context_id.clone())
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
            EventKind::TaskStarted { .. } => Vec::new(),
            EventKind::StepStarted { .. } => match self.tasks.get(&task_id) {
                Some(r) if r.task.status.state == TaskState::Submitted => {
                    self.set_status(&task_id, TaskState::Working, None, now_ms)
                }
                _ => Vec::new(),
            },
            EventKind::AssistantChunk { delta } => self.answer_delta(&task_id, delta),
            EventKind::ToolCallStarted { call } => {
                // The text so far was said before a tool call; the answer starts anew.
                if let Some(r) = self.tasks.get_mut(&task_id) {
                    r.answer_open = false;
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
    /// never comes (a lagging subscriber). A failed call ends the task at once.
    pub fn finished(
        &mut self,
        task_id: &str,
        result: Result<MessageReply, AgentError>,
        now_ms: u64,
    ) -> Finished {
        if let Some(ctx) = self
            .tasks
            .get(task_id)
            .and_then(|r| self.contexts.get_mut(&r.task.context_id))
            && ctx.active.as_deref() == Some(task_id)
        {
            ctx.active = None;
        }
        match result {
            Ok(reply) => {
                let Some(r) = self.tasks.get_mut(task_id) else {
                    return Finished::Done(Vec::new());
                };
                if r.troupe_task.is_none() {
                    r.set_troupe_task(reply.task_id);
                    self.by_troupe.insert(reply.task_id, task_id.to_owned());
                }
                if r.task.status.state.is_terminal() {
                    return Finished::Done(Vec::new());
                }
                r.pending_reply = Some(reply);
                Finished::Deferred
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

    /// Decides what a cancel does; a queued task is canceled at once.
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
            (Phase::Queued, _) => CancelPlan::Canceled(self.complete(
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
                    r.task.history.push(question);
                }
                message.context_id = Some(r.task.context_id.clone());
                message.task_id = Some(task_id.to_owned());
                r.task.history.push(message);
                self.set_status(task_id, TaskState::Working, None, now_ms)
            }
            _ => Vec::new(),
        }
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
        if rec.troupe_task.is_some() {
            return None;
        }
        rec.set_troupe_task(troupe_task);
        self.by_troupe.insert(troupe_task, active.clone());
        Some(active)
    }

    /// Changes a live task's status; an older status message moves into history.
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
        if rec.task.status.state.is_terminal() {
            return Vec::new();
        }
        let message = parts.map(|parts| {
            let id = rec.next_message_id();
            Message::agent(id, &rec.task.context_id, task_id, parts)
        });
        if let Some(old) = rec.task.status.message.take() {
            rec.task.history.push(old);
        }
        rec.task.status = Status {
            state,
            message,
            timestamp_ms: Some(now_ms),
        };
        vec![StreamEvent::Status(StatusUpdate {
            task_id: task_id.to_owned(),
            context_id: rec.task.context_id.clone(),
            status: rec.task.status.clone(),
        })]
    }

    /// A piece of the answer as the model streams it: the answer artifact grows (its first
    /// piece of a step replaces what an earlier step said), and streams get the piece as an
    /// artifact update (`append` after the first). The task's end sends the whole answer
    /// again (`append: false`, `lastChunk: true`), so a client that missed a piece ends with
    /// the right text.
    fn answer_delta(&mut self, task_id: &str, delta: &str) -> Vec<StreamEvent> {
        let Some(rec) = self.tasks.get_mut(task_id) else {
            return Vec::new();
        };
        if delta.is_empty() || rec.task.status.state.is_terminal() {
            return Vec::new();
        }
        let append = rec.answer_open;
        rec.answer_open = true;
        let answer_id = answer_artifact_id(task_id);
        let stored = match rec
            .task
            .artifacts
            .iter_mut()
            .find(|a| a.artifact_id == answer_id)
        {
            Some(a) => a,
            None => {
                rec.task.artifacts.push(answer_artifact(task_id, ""));
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
            ) => text.push_str(delta),
            _ => stored.parts = vec![Part::text(delta)],
        }
        let mut piece = answer_artifact(task_id, delta);
        piece.parts = vec![Part::text(delta)];
        vec![StreamEvent::Artifact(ArtifactUpdate {
            task_id: task_id.to_owned(),
            context_id: rec.task.context_id.clone(),
            artifact: piece,
            append,
            last_chunk: false,
        })]
    }

    /// Ends a task (once: later reports of the same end are ignored).
    fn complete(
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
        let mut events = Vec::new();
        if !text.is_empty() && status != TaskStatus::Cancelled {
            let artifact = answer_artifact(task_id, text);
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
        if let Some(md) = rec.task.metadata.as_mut().and_then(|m| m.get_mut("troupe")) {
            md["status"] = json!(status.as_str());
        }
        let note = match (status, error) {
            (TaskStatus::Ok, _) => None,
            (TaskStatus::MaxSteps, _) => Some("Stopped at the step limit before an answer.".into()),
            (TaskStatus::Cancelled, _) => Some("Canceled.".to_owned()),
            (TaskStatus::Error, Some(e)) => Some(e.to_string()),
            (TaskStatus::Error, None) => Some("The task failed.".into()),
        };
        rec.phase = Phase::Done;
        rec.pending_approval = None;
        rec.pending_reply = None;
        events.extend(self.set_status(
            task_id,
            final_state(status),
            note.map(|n| vec![Part::text(n)]),
            now_ms,
        ));
        self.finished.push_back(task_id.to_owned());
        events
    }

    /// Forgets the oldest terminal tasks past the limit; answers the ids forgotten.
    pub fn evict(&mut self) -> Vec<String> {
        let mut gone = Vec::new();
        while self.finished.len() > self.max_finished {
            let Some(id) = self.finished.pop_front() else {
                break;
            };
            if let Some(rec) = self.tasks.remove(&id) {
                if let Some(t) = rec.troupe_task {
                    self.by_troupe.remove(&t);
                }
                gone.push(id);
            }
        }
        gone
    }
}

/// The id of a task's answer artifact.
fn answer_artifact_id(task_id: &str) -> String {
    format!("{task_id}-answer")
}

/// A task's answer artifact holding `text`.
fn answer_artifact(task_id: &str, text: &str) -> Artifact {
    Artifact {
        artifact_id: answer_artifact_id(task_id),
        name: Some("answer".into()),
        description: None,
        parts: vec![Part::text(text)],
        metadata: None,
    }
}

mod approval;
mod query;

use approval::{approval_parts, decision_of};

#[cfg(test)]
#[path = "book_tests.rs"]
mod tests;
