//! `SessionHandle`: the typed, async front door to a session, used by the CLI, the API and
//! tests. Each method is one message to the Session (or one of its services); mailbox errors
//! (the session is gone) become `AgentError`s, never panics.

use crate::approval_store::ApprovalMsg;
use crate::rollout::RolloutMsg;
use crate::session::{ServiceRefs, Session, SessionArgs, SessionConfig, SessionMsg, SessionPorts};
use crate::task_registry::TaskRegistryMsg;
use ractor::{Actor, ActorRef, RactorErr};
use std::sync::Arc;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use troupe_proto::{
    AgentError, ApprovalDecision, ApprovalId, Closed, ConversationId, EventEnvelope, MessageReply,
    OpenConversation, PendingApproval, SessionId, SetContext, TaskId, TaskInfo,
};

/// A running session.
#[derive(Clone)]
pub struct SessionHandle {
    id: SessionId,
    actor: ActorRef<SessionMsg>,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle")
            .field("id", &self.id)
            .finish()
    }
}

fn gone<T>(e: RactorErr<T>) -> AgentError {
    AgentError::internal(format!("session unavailable: {e}"))
}

impl SessionHandle {
    /// Starts a session (and its root conversation).
    pub async fn start(
        session_id: SessionId,
        config: SessionConfig,
        ports: SessionPorts,
    ) -> Result<(Self, JoinHandle<()>), AgentError> {
        let args = SessionArgs {
            session_id,
            config,
            ports,
        };
        let (actor, join) = Actor::spawn(None, Session, args)
            .await
            .map_err(|e| AgentError::internal(format!("session failed to start: {e}")))?;
        Ok((
            Self {
                id: session_id,
                actor,
            },
            join,
        ))
    }

    pub fn id(&self) -> SessionId {
        self.id
    }

    /// The Session actor, for supervision-level use.
    pub fn actor(&self) -> &ActorRef<SessionMsg> {
        &self.actor
    }

    pub async fn root(&self) -> Result<ConversationId, AgentError> {
        ractor::call!(self.actor, |reply| SessionMsg::Root { reply }).map_err(gone)
    }

    pub async fn open(&self, params: OpenConversation) -> Result<ConversationId, AgentError> {
        ractor::call!(self.actor, |reply| SessionMsg::Open { params, reply }).map_err(gone)?
    }

    /// Runs one task; waits for its final reply. A conversation that fails mid-task answers
    /// `Internal` (it is restarted from its rollout).
    pub async fn message(
        &self,
        conversation_id: ConversationId,
        text: impl Into<String>,
    ) -> Result<MessageReply, AgentError> {
        let text = text.into();
        match ractor::call!(self.actor, |reply| SessionMsg::Message {
            conversation_id,
            text,
            reply
        }) {
            Ok(r) => r,
            Err(RactorErr::Messaging(ractor::MessagingErr::ChannelClosed)) => {
                Err(AgentError::internal(
                    "the conversation stopped before answering (it failed and was restarted, or it was aborted)",
                ))
            }
            Err(e) => Err(gone(e)),
        }
    }

    /// Replaces a conversation's history by a summary the model writes (C3: a one-turn
    /// override that is never stored). The reply's text is the summary.
    pub async fn compact(
        &self,
        conversation_id: ConversationId,
    ) -> Result<MessageReply, AgentError> {
        match ractor::call!(self.actor, |reply| SessionMsg::Compact {
            conversation_id,
            reply
        }) {
            Ok(r) => r,
            Err(e) => Err(gone(e)),
        }
    }

    pub async fn set_context(
        &self,
        conversation_id: ConversationId,
        update: SetContext,
    ) -> Result<(), AgentError> {
        ractor::call!(self.actor, |reply| SessionMsg::SetContext {
            conversation_id,
            update,
            reply
        })
        .map_err(gone)?
    }

    /// Closes a conversation. Idempotent: closing twice answers `already_closed`.
    pub async fn close(&self, conversation_id: ConversationId) -> Result<Closed, AgentError> {
        ractor::call!(self.actor, |reply| SessionMsg::Close {
            conversation_id,
            reply
        })
        .map_err(gone)
    }

    pub async fn list(&self) -> Result<Vec<ConversationId>, AgentError> {
        ractor::call!(self.actor, |reply| SessionMsg::List { reply }).map_err(gone)
    }

    /// The actor of an open conversation, if it is open.
    pub async fn conversation_actor(
        &self,
        conversation_id: ConversationId,
    ) -> Result<Option<ActorRef<crate::conversation::ConversationMsg>>, AgentError> {
        ractor::call!(self.actor, |reply| SessionMsg::Conversation {
            conversation_id,
            reply
        })
        .map_err(gone)
    }

    /// The session's own McpPool (`None` when it runs none), for observation and tests.
    pub async fn mcp_pool(&self) -> Result<Option<crate::mcp_pool::McpPoolHandle>, AgentError> {
        ractor::call!(self.actor, |reply| SessionMsg::McpPool { reply }).map_err(gone)
    }

    pub async fn services(&self) -> Result<ServiceRefs, AgentError> {
        ractor::call!(self.actor, |reply| SessionMsg::Services { reply }).map_err(gone)
    }

    /// Live events of the whole session. A slow receiver lags (`RecvError::Lagged`); the
    /// durable record does not.
    pub async fn subscribe(&self) -> Result<broadcast::Receiver<Arc<EventEnvelope>>, AgentError> {
        let s = self.services().await?;
        ractor::call!(s.rollout, |reply| RolloutMsg::Subscribe { reply }).map_err(gone)
    }

    /// Waits until everything emitted so far is on disk.
    pub async fn flush(&self) -> Result<(), AgentError> {
        let s = self.services().await?;
        ractor::call!(s.rollout, |reply| RolloutMsg::Flush { reply }).map_err(gone)?
    }

    pub async fn pending_approvals(&self) -> Result<Vec<PendingApproval>, AgentError> {
        let s = self.services().await?;
        ractor::call!(s.approvals, |reply| ApprovalMsg::ListPending {
            conversation_id: None,
            reply
        })
        .map_err(gone)
    }

    pub async fn respond_approval(
        &self,
        approval_id: ApprovalId,
        decision: ApprovalDecision,
    ) -> Result<(), AgentError> {
        let s = self.services().await?;
        ractor::call!(s.approvals, |reply| ApprovalMsg::Respond {
            approval_id,
            decision,
            reply
        })
        .map_err(gone)?
    }

    pub async fn tasks(
        &self,
        conversation_id: Option<ConversationId>,
    ) -> Result<Vec<TaskInfo>, AgentError> {
        let s = self.services().await?;
        ractor::call!(s.registry, |reply| TaskRegistryMsg::List {
            conversation_id,
            reply
        })
        .map_err(gone)
    }

    pub async fn cancel_task(&self, task_id: TaskId) -> Result<TaskInfo, AgentError> {
        let s = self.services().await?;
        ractor::call!(s.registry, |reply| TaskRegistryMsg::Cancel {
            task_id,
            reply
        })
        .map_err(gone)?
    }

    /// Closes every conversation, flushes the rollout and stops the session.
    pub async fn shutdown(&self) -> Result<(), AgentError> {
        ractor::call!(self.actor, |reply| SessionMsg::Shutdown { reply }).map_err(gone)
    }
}
