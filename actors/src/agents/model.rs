//! The in-process provider (`"type": "model"`): an agent that is a conversation of the
//! session, with its own instructions and model (and the session's tools). Its provider
//! session is that conversation: opened at the first dispatch, reopened from the rollout when
//! a later run resumes the binding, and each dispatch is one message to it, carrying the
//! dispatch (its chain, its cancel token) so that what the agent dispatches in turn extends
//! the chain and a cancelled or expired dispatch stops its task. A conversation that was
//! closed under its binding (a client closed it by its id) is opened again with its history
//! at the next dispatch, or replaced by a new one (said as a replaced binding) if it cannot be.

use super::DispatchOrigin;
use super::provider::{
    AgentInput, AgentOutput, AgentProvider, AgentRunContext, ResumeError, SessionContext,
};
use crate::ports::ModelClient;
use crate::session::SessionMsg;
use async_trait::async_trait;
use ractor::ActorRef;
use std::sync::Arc;
use troupe_proto::agent::{AgentDefinition, AgentHealth, ProviderSpec};
use troupe_proto::{
    AgentError, ConversationId, MessageReply, OpenConversation, StoragePolicy, TaskStatus,
};

/// What an agent's task's end answers its dispatch: its text (a task that ran out of steps
/// answers what it has), or why it did not end well.
pub fn agent_output(reply: MessageReply) -> Result<AgentOutput, AgentError> {
    match reply.status {
        TaskStatus::Ok | TaskStatus::MaxSteps => Ok(AgentOutput {
            text: reply.text,
            usage: Some(reply.stats.usage),
        }),
        TaskStatus::Cancelled => Err(reply
            .error
            .unwrap_or_else(|| AgentError::cancelled("the agent's task was cancelled"))),
        TaskStatus::Error => Err(reply
            .error
            .unwrap_or_else(|| AgentError::internal("the agent's task failed"))),
    }
}

/// An in-process agent of one session.
pub struct ModelAgent {
    session: ActorRef<SessionMsg>,
    params: OpenConversation,
    /// Its own model client (its definition names another endpoint); `None`: the session's,
    /// asking for the definition's `model` if it names one.
    model: Option<Arc<dyn ModelClient>>,
    /// Whether its conversation has heard this definition (opened or resumed under it). A
    /// provider built again for a changed file tells the conversation it finds already bound
    /// before its first dispatch (A7).
    told: std::sync::atomic::AtomicBool,
}

impl ModelAgent {
    /// The agent of `def` in the session of `session`; its conversation keeps what
    /// `storage_policy` allows.
    pub fn new(
        def: &AgentDefinition,
        session: ActorRef<SessionMsg>,
        model: Option<Arc<dyn ModelClient>>,
        storage_policy: StoragePolicy,
    ) -> Self {
        let mut params = OpenConversation {
            storage_policy,
            ..OpenConversation::default()
        };
        if let ProviderSpec::Model {
            model: named,
            provider,
            instructions,
            ..
        } = &def.provider
        {
            params.base_instructions.clone_from(instructions);
            // A client of its own serves its model already.
            if model.is_none() {
                params.model.clone_from(named);
                params.provider.clone_from(provider);
            }
        }
        Self {
            session,
            params,
            model,
            told: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The conversation a provider session id names.
    pub fn conversation(provider_session_id: &str) -> Result<ConversationId, String> {
        provider_session_id
            .parse()
            .map_err(|_| format!("`{provider_session_id}` is not a conversation id"))
    }

    /// One message to the agent's conversation, carrying its dispatch.
    async fn dispatch(
        &self,
        conversation_id: ConversationId,
        text: String,
        origin: DispatchOrigin,
    ) -> Result<MessageReply, AgentError> {
        ractor::call!(self.session, |reply| SessionMsg::Dispatch {
            conversation_id,
            text,
            origin,
            reply: crate::conversation::Answer::Port(reply),
        })
        .map_err(|_| AgentError::interrupted("the agent's conversation stopped before answering"))?
    }

    /// Opens the agent's conversation, or (`restore`) reopens it, or tells it this definition
    /// when it is open already.
    async fn open(&self, restore: Option<ConversationId>) -> Result<ConversationId, AgentError> {
        self.told.store(true, std::sync::atomic::Ordering::Relaxed);
        let (params, model) = (self.params.clone(), self.model.clone());
        ractor::call!(self.session, |reply| SessionMsg::OpenAgent {
            restore,
            params,
            model,
            reply
        })
        .map_err(|e| AgentError::internal(format!("session unavailable: {e}")))?
    }
}

#[async_trait]
impl AgentProvider for ModelAgent {
    async fn initialize(&self) -> Result<(), AgentError> {
        Ok(())
    }

    async fn open_session(&self, _ctx: &SessionContext<'_>) -> Result<String, AgentError> {
        self.open(None).await.map(|id| id.to_string())
    }

    async fn resume_session(
        &self,
        provider_session_id: &str,
        _ctx: &SessionContext<'_>,
    ) -> Result<(), ResumeError> {
        let id = Self::conversation(provider_session_id).map_err(ResumeError::NotResumable)?;
        // Open already: nothing to do; else rebuilt from the rollout under its id.
        self.open(Some(id))
            .await
            .map(drop)
            .map_err(|e| ResumeError::NotResumable(e.to_string()))
    }

    async fn handle(
        &self,
        input: AgentInput,
        ctx: &AgentRunContext<'_>,
    ) -> Result<AgentOutput, AgentError> {
        let conversation_id =
            Self::conversation(ctx.provider_session_id).map_err(AgentError::invalid)?;
        if !self.told.load(std::sync::atomic::Ordering::Relaxed) {
            // Bound under an earlier version of the file: the conversation learns this one.
            self.open(Some(conversation_id)).await?;
        }
        let origin = DispatchOrigin {
            dispatch_id: ctx.dispatch_id,
            agent_id: ctx.agent_id.to_owned(),
            chain: ctx.chain.clone(),
            cancel: ctx.cancel.clone(),
            span: ctx.span.clone(),
            governance: ctx.governance.clone(),
            slot_lent: ctx.slot_lent,
        };
        let reply = match self
            .dispatch(conversation_id, input.text.clone(), origin.clone())
            .await
        {
            Err(AgentError::NotFound { what, id })
                if what == "conversation" && id == conversation_id.to_string() =>
            {
                // Its conversation was closed (a client closed it by its id): it is opened
                // again with its history, or, if that fails, replaced by a new one.
                let reopened = match self.open(Some(conversation_id)).await {
                    Ok(id) => id,
                    Err(e) => {
                        let new = self.open(None).await?;
                        ctx.session_replaced(
                            &new.to_string(),
                            &format!("its conversation was closed and could not be reopened: {e}"),
                        );
                        new
                    }
                };
                self.dispatch(reopened, input.text, origin).await
            }
            other => other,
        }?;
        agent_output(reply)
    }

    async fn health(&self) -> AgentHealth {
        AgentHealth::ok()
    }

    async fn shutdown(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::{TaskId, TaskStats};

    fn reply(status: TaskStatus, error: Option<AgentError>) -> MessageReply {
        MessageReply {
            conversation_id: ConversationId::new(),
            task_id: TaskId::new(),
            status,
            text: "done".into(),
            stats: TaskStats::default(),
            error,
            items: Vec::new(),
            item_times_ms: Vec::new(),
        }
    }

    #[test]
    fn a_task_that_ended_or_ran_out_of_steps_answers_its_text() {
        for status in [TaskStatus::Ok, TaskStatus::MaxSteps] {
            let out = agent_output(reply(status, None)).expect("an answer");
            assert_eq!(out.text, "done");
            assert!(out.usage.is_some());
        }
    }

    #[test]
    fn a_cancelled_or_failed_task_answers_its_error_or_a_default_one() {
        let err = agent_output(reply(TaskStatus::Cancelled, None)).expect_err("cancelled");
        assert!(matches!(err, AgentError::Cancelled { .. }), "{err:?}");
        let err = agent_output(reply(TaskStatus::Error, None)).expect_err("failed");
        assert!(matches!(err, AgentError::Internal { .. }), "{err:?}");
        let own = AgentError::invalid("bad input");
        let err = agent_output(reply(TaskStatus::Error, Some(own.clone()))).expect_err("failed");
        assert_eq!(err, own);
    }
}
