//! One dispatch to a remote agent: send, follow the task until it settles, answer what it
//! asks, cancel it when the dispatch is.
//!
//! ```text
//! message ─▶ stream (or send + poll) ─▶ Tracker ─▶ settled?
//!   answered ─▶ the reply                 ended ─▶ the error (failed, rejected, canceled)
//!   input-required ─▶ ask a human ─▶ reply in the task ─▶ follow again (bounded rounds)
//!   auth-required ─▶ cancel the task, error (troupe holds no credentials to give)
//! a stream that ends unsettled ─▶ SubscribeToTask (bounded attempts) ─▶ GetTask polls
//! ctx.cancel / shutdown ─▶ CancelTask (bounded wait) ─▶ Cancelled
//! ```
//!
//! The hub may drop a dispatch's `handle` the moment the dispatch is cancelled, before it
//! gets to run its own clean-up: the task being followed is held by a [`Followed`] guard
//! which, dropped while the remote task is still unsettled, cancels it from a task of its
//! own (and shows what the agent answered).

use super::A2aSettings;
use super::input::{self, InputRequest};
use super::reply::{Settled, Tracker, Update};
use crate::client::{A2aClient, ClientError, EventStream, SendOptions};
use crate::metrics;
use crate::model::{Message, Part, Role, SendResult, StreamEvent, TaskState};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use troupe_actors::agents::{AgentOutput, AgentRunContext, DispatchParent};
use troupe_actors::event_draft::EventDraft;
use troupe_actors::events::EventSink;
use troupe_proto::{AgentError, DispatchId, EventKind, Json};

/// Longest wait, once cancelled, for a stream to name its task (so that it can be canceled).
const NAME_WAIT: Duration = Duration::from_secs(1);

pub(super) struct Run<'a, 'c> {
    pub client: &'a Arc<A2aClient>,
    pub settings: &'a A2aSettings,
    pub agent_id: &'a str,
    pub ctx: &'a AgentRunContext<'c>,
    /// The provider's shutdown.
    pub stopped: &'a CancellationToken,
}

/// Why following stopped before the task settled.
enum Stop {
    Cancelled,
    Failed(AgentError),
}

impl From<ClientError> for Stop {
    fn from(e: ClientError) -> Self {
        Self::Failed(e.into())
    }
}

impl Run<'_, '_> {
    pub async fn go(&self, text: String) -> Result<AgentOutput, AgentError> {
        let span = tracing::info_span!(parent: self.ctx.span, "troupe.a2a.dispatch",
            agent_id = self.agent_id, context_id = self.ctx.provider_session_id,
            version = self.client.version().as_str());
        self.dispatch(text).instrument(span).await
    }

    async fn dispatch(&self, text: String) -> Result<AgentOutput, AgentError> {
        let context_id = self.ctx.provider_session_id;
        let mut tracker = Followed {
            tracker: Tracker::default(),
            client: self.client.clone(),
            cancel_timeout: self.settings.cancel_timeout,
            shown: Shown {
                events: self.ctx.events.clone(),
                parent: self.ctx.parent,
                dispatch_id: self.ctx.dispatch_id,
                agent_id: self.agent_id.to_owned(),
                provider_session_id: context_id.to_owned(),
            },
            done: false,
        };
        let mut message = Message {
            message_id: uuid::Uuid::new_v4().to_string(),
            context_id: Some(context_id.to_owned()),
            task_id: None,
            role: Role::User,
            parts: vec![Part::text(text)],
            metadata: None,
            reference_task_ids: Vec::new(),
            extensions: Vec::new(),
        };
        let mut rounds = 0;
        loop {
            let settled = match self.exchange(&message, &mut tracker).await {
                Ok(s) => s,
                Err(Stop::Cancelled) => return Err(self.cancelled(&mut tracker).await),
                // The task is left as it is: the agent may still finish it.
                Err(Stop::Failed(e)) => {
                    tracker.done = true;
                    return Err(e);
                }
            };
            let (task_id, asked) = match settled {
                Settled::Answered { text } => {
                    tracker.done = true;
                    return Ok(AgentOutput { text, usage: None });
                }
                Settled::Ended { state, text } => {
                    tracker.done = true;
                    return Err(self.ended(state, &text));
                }
                Settled::Waiting {
                    task_id,
                    state: TaskState::AuthRequired,
                    ..
                } => {
                    metrics::input_request("auth");
                    self.cancel_remote(&task_id, &mut tracker).await;
                    return Err(AgentError::ToolError {
                        name: "a2a_agent".into(),
                        message: format!(
                            "agent `{}` asks for authentication troupe cannot give (its task \
                             {task_id} was canceled)",
                            self.agent_id
                        ),
                    });
                }
                Settled::Waiting {
                    task_id, message, ..
                } => (task_id, message),
            };
            rounds += 1;
            if rounds > self.settings.max_input_rounds {
                self.cancel_remote(&task_id, &mut tracker).await;
                return Err(AgentError::ToolError {
                    name: "a2a_agent".into(),
                    message: format!(
                        "agent `{}` asked for input more than {} times in one dispatch",
                        self.agent_id, self.settings.max_input_rounds
                    ),
                });
            }
            let request = input::classify(self.agent_id, asked.as_ref());
            metrics::input_request(request.kind());
            tracing::info!(task_id = %task_id, kind = request.kind(), "a2a agent waits for input");
            let answer = self.ask(&request).await;
            match input::reply_parts(&request, answer) {
                Ok(parts) => {
                    tracker.resume();
                    message = input::reply_message(
                        uuid::Uuid::new_v4().to_string(),
                        context_id,
                        &task_id,
                        parts,
                    );
                }
                Err(e) => {
                    self.cancel_remote(&task_id, &mut tracker).await;
                    return Err(e);
                }
            }
        }
    }

    /// Asks the session's human, unless the provider shuts down first.
    async fn ask(
        &self,
        request: &InputRequest,
    ) -> Result<troupe_actors::approval_store::Granted, AgentError> {
        tokio::select! {
            biased;
            () = self.stopped.cancelled() => Err(AgentError::cancelled("the agent was shut down while a human was asked")),
            answer = self.ctx.ask_approval(request.ask().clone()) => answer,
        }
    }

    /// Sends `message` and follows its task until it settles.
    async fn exchange(&self, message: &Message, tracker: &mut Followed) -> Result<Settled, Stop> {
        let streaming = self.client.card().is_some_and(|c| c.streaming);
        if streaming {
            let stream = self.interruptible(self.client.stream(message)).await??;
            self.follow(stream, tracker).await
        } else {
            let options = SendOptions {
                return_immediately: true,
                history_length: Some(0),
                ..SendOptions::default()
            };
            let result = self
                .interruptible(self.client.send(message, &options))
                .await??;
            let updates = match &result {
                SendResult::Message(m) => tracker.apply(&StreamEvent::Message(m.clone())),
                SendResult::Task(t) => tracker.apply_task(t),
            };
            self.show(updates);
            if let Some(s) = tracker.settled() {
                return Ok(s);
            }
            let task_id = tracker.task_id().map(str::to_owned).ok_or_else(|| {
                Stop::Failed(AgentError::internal("a task answer without a task id"))
            })?;
            self.poll(&task_id, tracker).await
        }
    }

    /// Reads a stream until the task settles; a stream that ends first is resubscribed,
    /// and after that the task is polled.
    async fn follow(
        &self,
        mut stream: EventStream,
        tracker: &mut Followed,
    ) -> Result<Settled, Stop> {
        let mut attempts = 0;
        loop {
            let next = tokio::select! {
                biased;
                () = self.ctx.cancel.cancelled() => None,
                () = self.stopped.cancelled() => None,
                item = stream.next() => Some(item),
            };
            let Some(item) = next else {
                // Cancelled: learn the task's id if the stream has not named it yet.
                if tracker.task_id().is_none() {
                    let _ = tokio::time::timeout(NAME_WAIT, async {
                        while tracker.task_id().is_none() {
                            match stream.next().await {
                                Some(Ok(item)) => {
                                    tracker.apply(&item.event);
                                }
                                _ => break,
                            }
                        }
                    })
                    .await;
                }
                return Err(Stop::Cancelled);
            };
            let broke = match item {
                Some(Ok(item)) => {
                    let updates = tracker.apply(&item.event);
                    self.show(updates);
                    if let Some(s) = tracker.settled() {
                        return Ok(s);
                    }
                    if !item.last {
                        continue;
                    }
                    "the agent marked an event final before the task settled".to_owned()
                }
                Some(Err(e @ ClientError::Rpc { .. })) => return Err(e.into()),
                Some(Err(e)) => e.to_string(),
                None => "the stream closed before the task settled".to_owned(),
            };
            let Some(task_id) = tracker.task_id().map(str::to_owned) else {
                return Err(Stop::Failed(AgentError::ToolError {
                    name: "a2a_agent".into(),
                    message: format!("agent `{}`: {broke}, naming no task", self.agent_id),
                }));
            };
            tracing::warn!(task_id = %task_id, attempts, "a2a stream broke: {broke}");
            if attempts < self.settings.resubscribe_attempts {
                attempts += 1;
                match self
                    .interruptible(self.client.resubscribe(&task_id))
                    .await?
                {
                    Ok(s) => {
                        stream = s;
                        continue;
                    }
                    Err(e) => tracing::warn!(task_id = %task_id, "a2a resubscribe failed: {e}"),
                }
            }
            return self.poll(&task_id, tracker).await;
        }
    }

    /// Asks for the task with growing pauses until it settles.
    async fn poll(&self, task_id: &str, tracker: &mut Followed) -> Result<Settled, Stop> {
        let mut delay = self.settings.poll_min;
        loop {
            self.interruptible(tokio::time::sleep(delay)).await?;
            let task = self
                .interruptible(self.client.get_task(task_id, Some(0)))
                .await??;
            let updates = tracker.apply_task(&task);
            self.show(updates);
            if let Some(s) = tracker.settled() {
                return Ok(s);
            }
            delay = (delay * 2).min(self.settings.poll_max);
        }
    }

    /// `fut`, unless the dispatch is cancelled or the provider shuts down first.
    async fn interruptible<T>(&self, fut: impl Future<Output = T>) -> Result<T, Stop> {
        tokio::select! {
            biased;
            () = self.ctx.cancel.cancelled() => Err(Stop::Cancelled),
            () = self.stopped.cancelled() => Err(Stop::Cancelled),
            out = fut => Ok(out),
        }
    }

    /// The dispatch was cancelled (or the provider shuts down): the remote task is too.
    async fn cancelled(&self, tracker: &mut Followed) -> AgentError {
        match tracker.task_id().map(str::to_owned) {
            Some(task_id) => self.cancel_remote(&task_id, tracker).await,
            None => tracing::warn!("a2a dispatch cancelled before the agent named its task"),
        }
        if self.stopped.is_cancelled() {
            AgentError::cancelled(format!("agent `{}` was shut down", self.agent_id))
        } else {
            AgentError::cancelled("the dispatch was cancelled")
        }
    }

    /// CancelTask, waited for at most `cancel_timeout`; what it answers is shown.
    async fn cancel_remote(&self, task_id: &str, tracker: &mut Followed) {
        tracker.done = true;
        if let Some(task) = cancel_task(self.client, task_id, self.settings.cancel_timeout).await {
            let updates = tracker.apply_task(&task);
            self.show(updates);
        }
    }

    fn ended(&self, state: TaskState, text: &str) -> AgentError {
        let why = if text.is_empty() {
            String::new()
        } else {
            format!(": {text}")
        };
        match state {
            TaskState::Canceled => {
                AgentError::cancelled(format!("agent `{}` canceled its task{why}", self.agent_id))
            }
            TaskState::Rejected => AgentError::ToolError {
                name: "a2a_agent".into(),
                message: format!("agent `{}` rejected the task{why}", self.agent_id),
            },
            _ => AgentError::ToolError {
                name: "a2a_agent".into(),
                message: format!("agent `{}`'s task failed{why}", self.agent_id),
            },
        }
    }

    fn show(&self, updates: Vec<Update>) {
        for u in updates {
            self.ctx.emit(update_event(
                self.ctx.dispatch_id,
                self.agent_id,
                self.ctx.provider_session_id,
                u,
            ));
        }
    }
}

fn update_event(
    dispatch_id: DispatchId,
    agent_id: &str,
    provider_session_id: &str,
    u: Update,
) -> EventKind {
    EventKind::AgentUpdate {
        dispatch_id,
        agent_id: agent_id.to_owned(),
        provider_session_id: provider_session_id.to_owned(),
        update: u.kind,
        text: u.text,
        data: u.data.map(Json),
    }
}

/// CancelTask, waited for at most `timeout`: the task as the agent left it, if it answered.
async fn cancel_task(
    client: &A2aClient,
    task_id: &str,
    timeout: Duration,
) -> Option<crate::model::Task> {
    match tokio::time::timeout(timeout, client.cancel_task(task_id)).await {
        Ok(Ok(task)) => {
            tracing::info!(
                task_id,
                state = task.status.state.v1_name(),
                "a2a task canceled"
            );
            Some(task)
        }
        Ok(Err(e)) => {
            tracing::warn!(task_id, "a2a cancel refused: {e}");
            None
        }
        Err(_) => {
            tracing::warn!(task_id, "a2a cancel unanswered");
            None
        }
    }
}

/// Where the events of a dispatch go, owned (for the clean-up that outlives `handle`).
struct Shown {
    events: EventSink,
    parent: DispatchParent,
    dispatch_id: DispatchId,
    agent_id: String,
    provider_session_id: String,
}

/// The task a dispatch follows. Dropped before the dispatch is `done` (the hub dropped
/// `handle` when the dispatch was cancelled, or the session ended), an unsettled remote task
/// is canceled from a task of its own.
struct Followed {
    tracker: Tracker,
    client: Arc<A2aClient>,
    cancel_timeout: Duration,
    shown: Shown,
    /// The dispatch has ended its business with the task (settled, canceled, or left).
    done: bool,
}

impl std::ops::Deref for Followed {
    type Target = Tracker;
    fn deref(&self) -> &Tracker {
        &self.tracker
    }
}

impl std::ops::DerefMut for Followed {
    fn deref_mut(&mut self) -> &mut Tracker {
        &mut self.tracker
    }
}

impl Drop for Followed {
    fn drop(&mut self) {
        if self.done || self.tracker.state().is_some_and(TaskState::is_terminal) {
            return;
        }
        let Some(task_id) = self.tracker.task_id().map(str::to_owned) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(%task_id, "a2a task left running: no runtime to cancel it from");
            return;
        };
        let client = self.client.clone();
        let timeout = self.cancel_timeout;
        let mut tracker = std::mem::take(&mut self.tracker);
        let shown = Shown {
            events: self.shown.events.clone(),
            parent: self.shown.parent,
            dispatch_id: self.shown.dispatch_id,
            agent_id: std::mem::take(&mut self.shown.agent_id),
            provider_session_id: std::mem::take(&mut self.shown.provider_session_id),
        };
        runtime.spawn(
            async move {
                if let Some(task) = cancel_task(&client, &task_id, timeout).await {
                    for u in tracker.apply_task(&task) {
                        shown.events.emit(EventDraft::task(
                            shown.parent.conversation_id,
                            shown.parent.task_id,
                            update_event(
                                shown.dispatch_id,
                                &shown.agent_id,
                                &shown.provider_session_id,
                                u,
                            ),
                        ));
                    }
                }
            }
            .in_current_span(),
        );
    }
}
