//! `SessionHandle`: the typed, async front door to a session, used by the CLI, the API and
//! tests. Each method is one message to the Session (or one of its services); mailbox errors
//! (the session is gone) become `AgentError`s, never panics.

use crate::approval_store::ApprovalMsg;
use crate::rollout::stream::{EventSource, EventStream, RESUME_PAGE};
use crate::rollout::{RolloutMsg, RolloutRecord};
use crate::session::{ServiceRefs, Session, SessionArgs, SessionConfig, SessionMsg, SessionPorts};
use crate::task_registry::TaskRegistryMsg;
use ractor::{Actor, ActorRef, RactorErr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use troupe_proto::governance::MessageOptions;
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

    /// Emits an event of the session (numbered and recorded by its Rollout like any other).
    /// Never waits; a session that is gone drops it.
    pub fn emit(&self, draft: crate::events::EventDraft) {
        let _ = self.actor.cast(SessionMsg::Emit { draft });
    }

    /// Starts a session supervised by `supervisor`: it stops with it, and `supervisor`
    /// hears when it stops or fails.
    pub async fn start_linked(
        session_id: SessionId,
        config: SessionConfig,
        ports: SessionPorts,
        supervisor: ractor::ActorCell,
    ) -> Result<Self, AgentError> {
        let args = SessionArgs {
            session_id,
            config,
            ports,
        };
        let (actor, _) = Actor::spawn_linked(None, Session, args, supervisor)
            .await
            .map_err(|e| AgentError::internal(format!("session failed to start: {e}")))?;
        Ok(Self {
            id: session_id,
            actor,
        })
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

    /// Opens a conversation of a previous run under its id (after a restart of the process):
    /// its history is rebuilt from the rollout as after a failure, a task it was running is
    /// recorded as aborted (`task_aborted`, interrupted by a restart) and not run again, and
    /// `seq` continues after storage's last one. Already open: nothing to do.
    pub async fn restore(
        &self,
        conversation_id: ConversationId,
        params: OpenConversation,
    ) -> Result<(), AgentError> {
        ractor::call!(self.actor, |reply| SessionMsg::Restore {
            conversation_id,
            params,
            reply
        })
        .map_err(gone)?
    }

    /// Runs one task; waits for its final reply. A conversation that fails mid-task answers
    /// `Internal` (it is restarted from its rollout).
    pub async fn message(
        &self,
        conversation_id: ConversationId,
        text: impl Into<String>,
    ) -> Result<MessageReply, AgentError> {
        self.message_with(conversation_id, text, MessageOptions::default())
            .await
    }

    /// [`message`](Self::message) with a request layer of the tool policy and authorization
    /// tokens (A5).
    pub async fn message_with(
        &self,
        conversation_id: ConversationId,
        text: impl Into<String>,
        options: MessageOptions,
    ) -> Result<MessageReply, AgentError> {
        let text = text.into();
        // The tokens stop here: the session sees their digests only.
        self.message_governed(
            conversation_id,
            text,
            crate::governance::RequestGovernance::from(options),
        )
        .await
    }

    /// [`message_with`](Self::message_with) whose tokens are digests already (the service
    /// turns them into digests where they enter).
    pub async fn message_governed(
        &self,
        conversation_id: ConversationId,
        text: impl Into<String>,
        options: crate::governance::RequestGovernance,
    ) -> Result<MessageReply, AgentError> {
        self.message_stored_later(conversation_id, text, options, None)
            .await
    }

    /// [`message_governed`](Self::message_governed) for a message still being stored: its
    /// task takes its slot, then waits at `stored` before doing anything
    /// ([`crate::task::StoredGate`]).
    pub async fn message_stored_later(
        &self,
        conversation_id: ConversationId,
        text: impl Into<String>,
        options: crate::governance::RequestGovernance,
        stored: Option<crate::task::StoredGate>,
    ) -> Result<MessageReply, AgentError> {
        let text = text.into();
        match ractor::call!(self.actor, |reply| SessionMsg::Message {
            conversation_id,
            text,
            options,
            stored,
            reply
        }) {
            Ok(r) => r,
            Err(RactorErr::Messaging(ractor::MessagingErr::ChannelClosed)) => {
                Err(AgentError::interrupted(
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

    /// An open conversation's statistics (S11). A passivated conversation is answered from
    /// what it stopped with, without being reactivated.
    pub async fn conversation_stats(
        &self,
        conversation_id: ConversationId,
    ) -> Result<troupe_proto::ConversationStats, AgentError> {
        let asked = self
            .actor
            .call(
                |reply| SessionMsg::Stats {
                    conversation_id,
                    reply,
                },
                None,
            )
            .await;
        match asked {
            Ok(ractor::rpc::CallResult::Success(stats)) => Ok(stats),
            Ok(_) => Err(AgentError::not_found("conversation", conversation_id)),
            Err(e) => Err(AgentError::internal(format!("session unavailable: {e}"))),
        }
    }

    /// Where an open conversation stands (live, asked to passivate, passivated) without
    /// reactivating it; `None` when it is not open. Observation and tests.
    pub async fn standing(
        &self,
        conversation_id: ConversationId,
    ) -> Result<Option<crate::session::Standing>, AgentError> {
        ractor::call!(self.actor, |reply| SessionMsg::Standing {
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

    /// Live events of the whole session, each published once storage has committed it. A
    /// slow receiver lags (`RecvError::Lagged`); the durable record does not. To miss nothing,
    /// use [`SessionHandle::events`].
    pub async fn subscribe(&self) -> Result<broadcast::Receiver<Arc<EventEnvelope>>, AgentError> {
        let s = self.services().await?;
        ractor::call!(s.rollout, |reply| RolloutMsg::Subscribe { reply }).map_err(gone)
    }

    /// The session's events with `seq > after_seq`: what storage keeps of the past, then live
    /// events, in strictly increasing `seq`, nothing twice, nothing missing that storage keeps
    /// (P4). Subscribed before this returns. Live events come as `Full` records with the event;
    /// stored ones as their policy kept them. It survives a restart of the Rollout and ends
    /// when the session ends; an error is its last item.
    pub async fn events(&self, after_seq: u64) -> Result<EventStream, AgentError> {
        let rollout = self.services().await?.rollout;
        let source = SessionSource {
            session: self.clone(),
            rollout,
        };
        EventStream::open(source, after_seq, RESUME_PAGE).await
    }

    /// The last sequence number the session assigned: [`SessionHandle::events`] after it
    /// yields what happens from now on.
    pub async fn last_seq(&self) -> Result<u64, AgentError> {
        let s = self.services().await?;
        ractor::call!(s.rollout, |reply| RolloutMsg::LastSeq { reply }).map_err(gone)
    }

    /// One page of the session's stored records: up to `limit` with `seq > after_seq`, in
    /// order, all of them committed.
    pub async fn events_after(
        &self,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let s = self.services().await?;
        ractor::call!(s.rollout, |reply| RolloutMsg::ReadAfter {
            after_seq,
            limit,
            reply
        })
        .map_err(gone)?
    }

    /// Waits until everything emitted so far is on disk.
    pub async fn flush(&self) -> Result<(), AgentError> {
        let s = self.services().await?;
        ractor::call!(s.rollout, |reply| RolloutMsg::Flush { reply }).map_err(gone)?
    }

    /// The session's agents with their health (each provider asked) and this session's
    /// bindings; empty when the session has no agents.
    pub async fn agents(&self) -> Result<Vec<troupe_proto::agent::AgentInfo>, AgentError> {
        let s = self.services().await?;
        match s.agents {
            Some(hub) => {
                ractor::call!(hub, |reply| crate::agents::hub::AgentHubMsg::List { reply })
                    .map_err(gone)
            }
            None => Ok(Vec::new()),
        }
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

    /// Cancels the running task of a conversation and every message queued in it; answers
    /// how many were cancelled. A task that ignores its cancellation is aborted after the
    /// close timeout. The conversation stays open. `NotFound` if it is not open.
    pub async fn cancel_conversation(
        &self,
        conversation_id: ConversationId,
    ) -> Result<usize, AgentError> {
        self.ask_conversation(conversation_id, |reply| {
            crate::conversation::ConversationMsg::CancelAll { reply }
        })
        .await
    }

    /// Calls an open conversation's actor (reactivating it if it was passivated). An actor
    /// that stopped between the look-up and the call (passivated, or restarted after a
    /// failure) is looked up again. `NotFound` if it is not open.
    pub async fn ask_conversation<T: Send + 'static>(
        &self,
        conversation_id: ConversationId,
        make: impl Fn(ractor::RpcReplyPort<T>) -> crate::conversation::ConversationMsg,
    ) -> Result<T, AgentError> {
        for _ in 0..3 {
            let actor = self
                .conversation_actor(conversation_id)
                .await?
                .ok_or_else(|| AgentError::not_found("conversation", conversation_id))?;
            if let Ok(ractor::rpc::CallResult::Success(answer)) = actor.call(&make, None).await {
                return Ok(answer);
            }
        }
        Err(AgentError::not_found("conversation", conversation_id))
    }

    /// Closes every conversation, flushes the rollout and stops the session.
    pub async fn shutdown(&self) -> Result<(), AgentError> {
        ractor::call!(self.actor, |reply| SessionMsg::Shutdown { reply }).map_err(gone)
    }
}

/// An event stream's source: the session's Rollout of the moment.
struct SessionSource {
    session: SessionHandle,
    rollout: ActorRef<RolloutMsg>,
}

/// How long a stream waits for the Session to replace a Rollout that stopped.
const RECONNECT_ATTEMPTS: u32 = 100;
const RECONNECT_PAUSE: Duration = Duration::from_millis(20);

#[async_trait::async_trait]
impl EventSource for SessionSource {
    async fn subscribe(&mut self) -> Result<broadcast::Receiver<Arc<EventEnvelope>>, AgentError> {
        self.rollout.subscribe().await
    }

    async fn read_after(
        &mut self,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        self.rollout.read_after(after_seq, limit).await
    }

    /// A failed Rollout is restarted by the Session under a new actor: wait for it. A session
    /// that is gone (or shutting down) ends the stream.
    async fn reconnect(&mut self) -> Result<bool, AgentError> {
        if self.rollout.get_status() == ractor::ActorStatus::Running {
            return Ok(false);
        }
        for _ in 0..RECONNECT_ATTEMPTS {
            let Ok(services) = self.session.services().await else {
                return Ok(false);
            };
            if services.rollout.get_id() != self.rollout.get_id() {
                tracing::info!(session_id = %self.session.id, "event stream follows the restarted rollout");
                self.rollout = services.rollout;
                return Ok(true);
            }
            tokio::time::sleep(RECONNECT_PAUSE).await;
        }
        Ok(false)
    }
}
