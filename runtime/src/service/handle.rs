//! `SessionsHandle`: the typed front door to the [`Sessions`] registry, used by every
//! transport. Each method is one message; a registry that is gone answers `Internal`.

use super::api::{CreateSession, Sent};
use super::auth::Scope;
use super::sessions::{Resolved, Sessions, SessionsArgs, SessionsMsg};
use ractor::{Actor, ActorRef, RactorErr};
use tokio::task::JoinHandle;
use troupe_proto::store::{ConversationRecord, MessagePage, SessionRecord};
use troupe_proto::{AgentError, Closed, ConversationId, OpenConversation, SessionId, SetContext};

/// A running registry.
#[derive(Clone)]
pub struct SessionsHandle {
    actor: ActorRef<SessionsMsg>,
}

impl std::fmt::Debug for SessionsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionsHandle").finish_non_exhaustive()
    }
}

fn gone<T>(e: RactorErr<T>) -> AgentError {
    AgentError::internal(format!("sessions registry unavailable: {e}"))
}

macro_rules! ask {
    ($self:ident, $variant:ident { $($field:ident),* }) => {
        ractor::call!($self.actor, |reply| SessionsMsg::$variant { $($field,)* reply }).map_err(gone)?
    };
}

impl SessionsHandle {
    /// Starts the registry: loads the stored sessions.
    pub async fn start(args: SessionsArgs) -> Result<(Self, JoinHandle<()>), AgentError> {
        let (actor, join) = Actor::spawn(None, Sessions, args)
            .await
            .map_err(|e| AgentError::internal(format!("sessions registry failed to start: {e}")))?;
        Ok((Self { actor }, join))
    }

    pub fn actor(&self) -> &ActorRef<SessionsMsg> {
        &self.actor
    }

    pub async fn create(
        &self,
        scope: Scope,
        request: CreateSession,
    ) -> Result<SessionRecord, AgentError> {
        ask!(self, Create { scope, request })
    }

    pub async fn get(
        &self,
        scope: Scope,
        session_id: SessionId,
    ) -> Result<SessionRecord, AgentError> {
        ask!(self, Get { scope, session_id })
    }

    pub async fn list(
        &self,
        scope: Scope,
        project_id: Option<String>,
    ) -> Result<Vec<SessionRecord>, AgentError> {
        ask!(self, List { scope, project_id })
    }

    pub async fn resolve(
        &self,
        scope: Scope,
        session_id: SessionId,
    ) -> Result<Resolved, AgentError> {
        ask!(self, Resolve { scope, session_id })
    }

    pub async fn conversations(
        &self,
        scope: Scope,
        session_id: SessionId,
    ) -> Result<Vec<ConversationRecord>, AgentError> {
        ask!(self, Conversations { scope, session_id })
    }

    pub async fn open(
        &self,
        scope: Scope,
        session_id: SessionId,
        params: OpenConversation,
    ) -> Result<ConversationId, AgentError> {
        ask!(
            self,
            Open {
                scope,
                session_id,
                params
            }
        )
    }

    pub async fn set_context(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
        update: SetContext,
    ) -> Result<(), AgentError> {
        ask!(
            self,
            SetContext {
                scope,
                session_id,
                conversation_id,
                update
            }
        )
    }

    pub async fn close(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<Closed, AgentError> {
        ask!(
            self,
            Close {
                scope,
                session_id,
                conversation_id
            }
        )
    }

    pub async fn send(
        &self,
        scope: Scope,
        session_id: SessionId,
        conversation_id: Option<ConversationId>,
        text: String,
        wait: bool,
    ) -> Result<Sent, AgentError> {
        ask!(
            self,
            Send {
                scope,
                session_id,
                conversation_id,
                text,
                wait
            }
        )
    }

    pub async fn messages(
        &self,
        scope: Scope,
        session_id: SessionId,
        limit: usize,
        before: Option<u64>,
    ) -> Result<MessagePage, AgentError> {
        ask!(
            self,
            Messages {
                scope,
                session_id,
                limit,
                before
            }
        )
    }

    pub async fn set_current(
        &self,
        scope: Scope,
        project_id: String,
        session_id: SessionId,
    ) -> Result<SessionRecord, AgentError> {
        ask!(
            self,
            SetCurrent {
                scope,
                project_id,
                session_id
            }
        )
    }

    pub async fn current(
        &self,
        scope: Scope,
        project_id: String,
    ) -> Result<SessionRecord, AgentError> {
        ask!(self, Current { scope, project_id })
    }

    /// The store answers and the registry is up.
    pub async fn ready(&self) -> Result<(), AgentError> {
        ask!(self, Ready {})
    }

    /// Stops admitting messages; returns once none is in flight.
    pub async fn drain(&self) -> Result<(), AgentError> {
        ractor::call!(self.actor, |reply| SessionsMsg::Drain { reply }).map_err(gone)
    }

    /// Shuts every session down (cancelling what still runs) and flushes their rollouts.
    pub async fn shutdown(&self) -> Result<(), AgentError> {
        ractor::call!(self.actor, |reply| SessionsMsg::Shutdown { reply }).map_err(gone)
    }

    /// Stops the registry itself (after `shutdown`).
    pub fn stop(&self) {
        self.actor.stop(Some("service stopped".into()));
    }
}
