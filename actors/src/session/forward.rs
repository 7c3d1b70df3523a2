//! Requests the session passes on to one of its conversations: a message, a compaction, a
//! context update, a close, a statistics read, a look-up of its actor. A passivated conversation is reactivated
//! first, and one being asked to passivate holds them (see `passivation`); an unknown
//! conversation is `NotFound`.

use super::*;

/// A request for one conversation, as the session delivers it.
pub(crate) enum ConversationRequest {
    /// Runs one task (a user message, or a dispatch to an agent).
    Message {
        text: String,
        request: crate::task::TaskRequest,
        reply: crate::conversation::Answer,
    },
    Compact {
        reply: RpcReplyPort<Result<MessageReply, AgentError>>,
    },
    SetContext {
        update: SetContext,
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    Close {
        reply: RpcReplyPort<Closed>,
    },
    /// Its statistics (a passivated one whose statistics the session does not hold).
    Stats {
        reply: RpcReplyPort<ConversationStats>,
    },
    /// Its actor (cancel-all and tests call it directly).
    Actor {
        reply: RpcReplyPort<Option<ActorRef<ConversationMsg>>>,
    },
}

impl ConversationRequest {
    /// Answers a request its conversation cannot take (a close: already closed).
    pub(super) fn refuse(self, id: ConversationId, error: AgentError) {
        match self {
            Self::Message { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Self::Compact { reply } => {
                let _ = reply.send(Err(error));
            }
            Self::SetContext { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Self::Close { reply } => {
                let _ = reply.send(Closed {
                    conversation_id: id,
                    outcome: CloseOutcome::AlreadyClosed,
                });
            }
            Self::Actor { reply } => {
                let _ = reply.send(None);
            }
            Self::Stats { .. } => {} // dropped: the caller reads it as not found
        }
    }
}

impl SessionState {
    /// Delivers a request to its conversation: now when it is live, after its reactivation
    /// when it is passivated, or once it answered when it is being asked to passivate.
    pub(super) async fn deliver(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        id: ConversationId,
        request: ConversationRequest,
    ) {
        let standing = self.conversations.get(&id).map(ConversationEntry::standing);
        match request_route(standing) {
            PassivationRoute::Unknown => {
                request.refuse(id, AgentError::not_found("conversation", id));
            }
            PassivationRoute::Forward => self.forward(myself, id, request),
            PassivationRoute::Hold => {
                if let Some(ConversationEntry::Live(live)) = self.conversations.get_mut(&id)
                    && let Some(held) = &mut live.held
                {
                    held.push(request);
                }
            }
            PassivationRoute::Reactivate => match self.reactivate(&myself.get_cell(), id).await {
                Ok(()) => self.forward(myself, id, request),
                Err(error) => request.refuse(id, error),
            },
        }
    }

    /// Passes a request on to a live conversation's actor.
    pub(super) fn forward(
        &self,
        myself: &ActorRef<SessionMsg>,
        id: ConversationId,
        request: ConversationRequest,
    ) {
        let Some(actor) = self
            .conversations
            .get(&id)
            .and_then(ConversationEntry::live)
            .map(|live| live.actor.clone())
        else {
            request.refuse(id, AgentError::not_found("conversation", id));
            return;
        };
        match request {
            ConversationRequest::Message {
                text,
                request,
                reply,
            } => {
                if let Err(MessagingErr::SendErr(ConversationMsg::Message { reply, .. })) = actor
                    .cast(ConversationMsg::Message {
                        text,
                        request,
                        reply,
                    })
                {
                    let _ = reply.send(Err(AgentError::not_found("conversation", id)));
                }
            }
            ConversationRequest::Compact { reply } => {
                if let Err(MessagingErr::SendErr(ConversationMsg::Compact { reply })) =
                    actor.cast(ConversationMsg::Compact { reply })
                {
                    let _ = reply.send(Err(AgentError::not_found("conversation", id)));
                }
            }
            ConversationRequest::SetContext { update, reply } => {
                forward_set_context(myself, actor, id, update, reply);
            }
            ConversationRequest::Close { reply } => forward_close(myself, actor, id, reply),
            ConversationRequest::Actor { reply } => {
                let _ = reply.send(Some(actor));
            }
            ConversationRequest::Stats { reply } => {
                let _ = actor.cast(ConversationMsg::Stats { reply });
            }
        }
    }
}

fn forward_set_context(
    myself: &ActorRef<SessionMsg>,
    actor: ActorRef<ConversationMsg>,
    id: ConversationId,
    update: SetContext,
    reply: RpcReplyPort<Result<(), AgentError>>,
) {
    let session = myself.clone();
    let applied = update.clone();
    // Put in the conversation's mailbox now, from the Session's turn: a `Passivate` the
    // Session sends later is behind it (the conversation then has work and says no).
    let (tx, rx) = ractor::concurrency::oneshot();
    let sent = actor.cast(ConversationMsg::SetContext {
        update,
        reply: tx.into(),
    });
    // The parameters a restart would use follow only a change the conversation accepted
    // (a refused allowlist must not make its restart fail).
    tokio::spawn(async move {
        let answer = match sent {
            Ok(()) => rx.await.ok(),
            Err(_) => None,
        }
        .unwrap_or_else(|| Err(AgentError::not_found("conversation", id)));
        if answer.is_ok() {
            let _ = session.cast(SessionMsg::ContextApplied {
                conversation_id: id,
                update: applied,
            });
        }
        let _ = reply.send(answer);
    });
}

fn forward_close(
    myself: &ActorRef<SessionMsg>,
    actor: ActorRef<ConversationMsg>,
    id: ConversationId,
    reply: RpcReplyPort<Closed>,
) {
    let session = myself.clone();
    // In the conversation's mailbox now, ahead of any later `Passivate` (see set-context).
    let (tx, rx) = ractor::concurrency::oneshot();
    let sent = actor.cast(ConversationMsg::Close { reply: tx.into() });
    tokio::spawn(async move {
        let closed = match sent {
            Ok(()) => rx.await.ok(),
            Err(_) => None,
        }
        .unwrap_or(Closed {
            conversation_id: id,
            outcome: CloseOutcome::AlreadyClosed,
        });
        let _ = session.cast(SessionMsg::Forget {
            conversation_id: id,
        });
        let _ = reply.send(closed);
    });
}
