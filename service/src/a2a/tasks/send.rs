//! A client's message: a new task (in a known context, or in a new one whose conversation
//! opens first), an answer to the approval a task waits for, or the reply to what the agent
//! asked.

use super::{A2aTasksMsg, A2aTasksState, Accepted, Known, Reply, metrics, now_ms};
use crate::a2a::book::SendPlan;
use crate::a2a::book::stored::record_of;
use crate::a2a::error::A2aError;
use crate::a2a::push::config_of;
use crate::a2a::request::SendParams;
use ractor::ActorRef;
use troupe_proto::{AgentError, ConversationId, SessionId, TaskId};

/// A send waiting for its new context's conversation.
pub struct Parked {
    params: SendParams,
    input: String,
    stream: bool,
    reply: Reply<Accepted>,
    /// The context the client named (`None`: the server names it after the conversation).
    context_id: Option<String>,
}

impl A2aTasksState {
    pub(super) fn on_send(
        &mut self,
        myself: &ActorRef<A2aTasksMsg>,
        params: SendParams,
        input: String,
        stream: bool,
        known: Known,
        reply: Reply<Accepted>,
    ) {
        if let Err(e) = self.hydrate(&params, known) {
            let _ = reply.send(Err(e));
            return;
        }
        let plan = match self.book.plan_send(&params) {
            Ok(p) => p,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        // A config the task cannot take refuses the send before its answer is applied.
        if let (SendPlan::Answer { task_id, .. } | SendPlan::Continue { task_id }, Some(config)) =
            (&plan, &params.push_config)
        {
            let mut config = config.clone();
            config.task_id.clone_from(task_id);
            if let Err(e) = self.push.admits(&config) {
                let _ = reply.send(Err(e));
                return;
            }
        }
        match plan {
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
                let events = self.book.answered(&task_id, params.message, now_ms());
                self.follow_up(
                    myself,
                    &task_id,
                    events,
                    params.push_config,
                    stream,
                    params.history_length,
                    reply,
                );
            }
            SendPlan::Continue { task_id } => {
                tracing::info!(%task_id, "a2a task continues with the client's reply");
                let events = self
                    .book
                    .continued(&task_id, params.message, input, now_ms());
                if let Some(context_id) = self.book.context_of(&task_id) {
                    self.dispatch(myself, &context_id);
                }
                self.follow_up(
                    myself,
                    &task_id,
                    events,
                    params.push_config,
                    stream,
                    params.history_length,
                    reply,
                );
            }
            SendPlan::NewTask { context_id } => {
                self.accept(myself, params, input, stream, &context_id, reply);
            }
            SendPlan::NewContext { context_id } => {
                let id = self.next_parked;
                self.next_parked += 1;
                self.parked.insert(
                    id,
                    Parked {
                        params,
                        input,
                        stream,
                        reply,
                        context_id,
                    },
                );
                let backend = self.backend.clone();
                let open = self.config.open.clone();
                let me = myself.clone();
                tokio::spawn(async move {
                    let result = async {
                        let conversation_id = backend.open(open).await?;
                        let session_id = backend.session_id().await?;
                        Ok::<_, AgentError>((conversation_id, session_id))
                    }
                    .await;
                    let _ = me.cast(A2aTasksMsg::ContextOpened { parked: id, result });
                });
            }
        }
    }

    /// Takes what the store knows of the named task and context into the book when it does
    /// not hold them; a finished task is refused here (the book does not take it back).
    fn hydrate(&mut self, params: &SendParams, known: Known) -> Result<(), A2aError> {
        if let Some(c) = known.context {
            self.book.hydrate_context(
                c.context_id,
                c.conversation_id,
                c.session_id,
                c.created_ms,
                c.active_ms,
                c.open,
            );
        }
        let Some(task_id) = &params.message.task_id else {
            return Ok(());
        };
        if self.book.record(task_id).is_some() {
            return Ok(());
        }
        let Some(stored) = known.task.filter(|t| t.task_id == *task_id) else {
            return Ok(()); // unknown: the plan says TaskNotFound
        };
        if stored.terminal {
            return Err(A2aError::UnsupportedOperation(format!(
                "task {task_id} is {}; send a new message without taskId",
                stored.state
            )));
        }
        if !self.book.has_context(&stored.context_id) {
            return Err(A2aError::Internal(format!(
                "the context of task {task_id} is not stored"
            )));
        }
        self.book.hydrate_task(record_of(&stored)?);
        for p in &known.pushes {
            match config_of(p) {
                Ok(c) => self.push.restore(c),
                Err(e) => tracing::warn!(%task_id, error = %e, "a2a stored push config unreadable"),
            }
        }
        Ok(())
    }

    /// The answer to a send that went to an existing task.
    #[allow(clippy::too_many_arguments)]
    fn follow_up(
        &mut self,
        myself: &ActorRef<A2aTasksMsg>,
        task_id: &str,
        events: Vec<crate::a2a::model::StreamEvent>,
        push_config: Option<crate::a2a::push::PushConfig>,
        stream: bool,
        history_length: Option<u32>,
        reply: Reply<Accepted>,
    ) {
        if let Some(mut config) = push_config {
            config.task_id = task_id.to_owned();
            if let Err(e) = self.set_push(config) {
                let _ = reply.send(Err(e));
                return;
            }
        }
        self.publish(task_id, events);
        let events = stream.then(|| self.add_stream(task_id));
        self.store_changes(myself);
        let stored = Some(self.stored_mark());
        let answer = self
            .book
            .view(task_id, history_length, true)
            .map(|task| Accepted {
                task,
                events,
                stored,
            })
            .ok_or_else(|| A2aError::TaskNotFound {
                task_id: task_id.to_owned(),
            });
        let _ = reply.send(answer);
    }

    /// A new task in a context the book holds: SUBMITTED, stored, then sent on when its
    /// context is free.
    fn accept(
        &mut self,
        myself: &ActorRef<A2aTasksMsg>,
        params: SendParams,
        input: String,
        stream: bool,
        context_id: &str,
        reply: Reply<Accepted>,
    ) {
        let task_id = TaskId::new().to_string();
        let created =
            self.book
                .create_task(task_id.clone(), context_id, params.message, input, now_ms());
        let task = match created {
            Ok(t) => t,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        tracing::info!(%task_id, %context_id, "a2a task submitted");
        // The context and the task are queued to the writer before anything that needs them.
        self.store_changes(myself);
        if let Some(mut config) = params.push_config {
            config.task_id.clone_from(&task_id);
            if let Err(e) = self.set_push(config) {
                let _ = reply.send(Err(e));
                return;
            }
        }
        let events = stream.then(|| self.add_stream(&task_id));
        self.dispatch(myself, context_id);
        let task = self
            .book
            .view(&task_id, params.history_length, true)
            .unwrap_or(task);
        self.store_changes(myself);
        let stored = Some(self.stored_mark());
        let _ = reply.send(Ok(Accepted {
            task,
            events,
            stored,
        }));
    }

    pub(super) fn on_context_opened(
        &mut self,
        myself: &ActorRef<A2aTasksMsg>,
        parked: u64,
        result: Result<(ConversationId, SessionId), AgentError>,
    ) {
        let Some(p) = self.parked.remove(&parked) else {
            return;
        };
        let (conversation_id, session_id) = match result {
            Ok(ids) => ids,
            Err(e) => {
                let _ = p.reply.send(Err(A2aError::from_agent(&e)));
                return;
            }
        };
        // A context the server names is its conversation's id.
        let context_id = p.context_id.unwrap_or_else(|| conversation_id.to_string());
        if self.book.has_context(&context_id) {
            // Another send opened the same new context meanwhile: its conversation serves.
            let backend = self.backend.clone();
            tokio::spawn(async move {
                let _ = backend.close(conversation_id).await;
            });
        } else {
            tracing::info!(%context_id, %conversation_id, "a2a context opened");
            metrics::context_event("opened");
            self.book
                .add_context(context_id.clone(), conversation_id, session_id, now_ms());
        }
        self.accept(myself, p.params, p.input, p.stream, &context_id, p.reply);
    }
}
