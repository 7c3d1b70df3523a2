//! Requests the session passes on to one of its conversations: a message, a compaction, a
//! context update, a close; an unknown conversation is `NotFound`.

use super::*;

impl SessionState {
    pub(super) fn forward_message(
        &self,
        id: ConversationId,
        text: String,
        request: crate::task::TaskRequest,
        reply: RpcReplyPort<Result<MessageReply, AgentError>>,
    ) {
        let Some(entry) = self.conversations.get(&id) else {
            let _ = reply.send(Err(AgentError::not_found("conversation", id)));
            return;
        };
        if let Err(MessagingErr::SendErr(ConversationMsg::Message { reply, .. })) =
            entry.actor.cast(ConversationMsg::Message {
                text,
                request,
                reply,
            })
        {
            let _ = reply.send(Err(AgentError::not_found("conversation", id)));
        }
    }

    pub(super) fn forward_compact(
        &self,
        id: ConversationId,
        reply: RpcReplyPort<Result<MessageReply, AgentError>>,
    ) {
        let Some(entry) = self.conversations.get(&id) else {
            let _ = reply.send(Err(AgentError::not_found("conversation", id)));
            return;
        };
        if let Err(MessagingErr::SendErr(ConversationMsg::Compact { reply })) =
            entry.actor.cast(ConversationMsg::Compact { reply })
        {
            let _ = reply.send(Err(AgentError::not_found("conversation", id)));
        }
    }

    pub(super) fn forward_set_context(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        id: ConversationId,
        update: SetContext,
        reply: RpcReplyPort<Result<(), AgentError>>,
    ) {
        let Some(entry) = self.conversations.get(&id) else {
            let _ = reply.send(Err(AgentError::not_found("conversation", id)));
            return;
        };
        let actor = entry.actor.clone();
        let session = myself.clone();
        // The parameters a restart would use follow only a change the conversation accepted
        // (a refused allowlist must not make its restart fail).
        tokio::spawn(async move {
            let applied = update.clone();
            let answer = ractor::call!(actor, |r| ConversationMsg::SetContext { update, reply: r })
                .unwrap_or_else(|_| Err(AgentError::not_found("conversation", id)));
            if answer.is_ok() {
                let _ = session.cast(SessionMsg::ContextApplied {
                    conversation_id: id,
                    update: applied,
                });
            }
            let _ = reply.send(answer);
        });
    }

    pub(super) fn forward_close(
        &self,
        myself: &ActorRef<SessionMsg>,
        id: ConversationId,
        reply: RpcReplyPort<Closed>,
    ) {
        let Some(entry) = self.conversations.get(&id) else {
            let _ = reply.send(Closed {
                conversation_id: id,
                outcome: CloseOutcome::AlreadyClosed,
            });
            return;
        };
        let actor = entry.actor.clone();
        let session = myself.clone();
        tokio::spawn(async move {
            let closed =
                ractor::call!(actor, |r| ConversationMsg::Close { reply: r }).unwrap_or(Closed {
                    conversation_id: id,
                    outcome: CloseOutcome::AlreadyClosed,
                });
            let _ = session.cast(SessionMsg::Forget {
                conversation_id: id,
            });
            let _ = reply.send(closed);
        });
    }
}
