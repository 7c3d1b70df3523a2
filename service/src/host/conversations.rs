//! Conversations: opening, changing the context of and closing them, each asked of the
//! session by a task and stored when it answers.

use super::{ConversationSlot, HostMsg, HostState, Liveness, Reply, Waiting, now_ms, spawn_traced};
use ractor::{ActorId, ActorRef};
use troupe_actors::SessionHandle;
use troupe_proto::store::{ConversationRecord, ConversationState};
use troupe_proto::{AgentError, Closed, ConversationId, OpenConversation, SetContext};

impl HostState {
    pub(super) fn open(
        &self,
        myself: &ActorRef<HostMsg>,
        params: OpenConversation,
        reply: Reply<ConversationId>,
    ) {
        let handle = match self.running() {
            Ok(h) => h.clone(),
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let session_id = self.record.session_id;
        let via = handle.actor().get_id();
        let myself = myself.clone();
        spawn_traced(async move {
            let result =
                handle
                    .open(params.clone())
                    .await
                    .map(|conversation_id| ConversationRecord {
                        conversation_id,
                        session_id,
                        params,
                        is_root: false,
                        state: ConversationState::Open,
                        created_ms: now_ms(),
                        closed_ms: None,
                    });
            let _ = myself.cast(HostMsg::Opened { result, via, reply });
        });
    }

    pub(super) async fn opened(
        &mut self,
        result: Result<ConversationRecord, AgentError>,
        via: ActorId,
    ) -> Result<ConversationId, AgentError> {
        let record = result?;
        let id = record.conversation_id;
        self.store.put_conversation(record.clone()).await?;
        self.conversations.insert(id, ConversationSlot::new(record));
        self.resync(via, Resync::Open(id)).await;
        Ok(id)
    }

    pub(super) fn set_context(
        &self,
        myself: &ActorRef<HostMsg>,
        conversation_id: ConversationId,
        update: SetContext,
        reply: Reply<()>,
    ) {
        let open = self
            .conversations
            .get(&conversation_id)
            .is_some_and(|c| c.record.state == ConversationState::Open);
        let checked = if open {
            self.running().cloned()
        } else {
            Err(AgentError::not_found("conversation", conversation_id))
        };
        let handle = match checked {
            Ok(h) => h,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let via = handle.actor().get_id();
        let myself = myself.clone();
        spawn_traced(async move {
            let result = handle
                .set_context(conversation_id, update.clone())
                .await
                .map(|()| update);
            let _ = myself.cast(HostMsg::ContextChanged {
                conversation_id,
                result,
                via,
                reply,
            });
        });
    }

    pub(super) async fn context_changed(
        &mut self,
        conversation_id: ConversationId,
        result: Result<SetContext, AgentError>,
        via: ActorId,
    ) -> Result<(), AgentError> {
        let update = result?;
        let Some(slot) = self.conversations.get(&conversation_id) else {
            return Ok(());
        };
        let mut record = slot.record.clone();
        record.params.apply(&update);
        // Under a Ttl policy past its expiry, the instructions the sweep dropped stay dropped.
        record.params = record.params.stored_at(record.created_ms, now_ms());
        self.store.put_conversation(record.clone()).await?;
        if let Some(slot) = self.conversations.get_mut(&conversation_id) {
            slot.record = record;
        }
        self.resync(via, Resync::Context(conversation_id, update))
            .await;
        Ok(())
    }

    /// Asks the session to close a conversation. Its queued messages wait (none starts) until
    /// the session answered: then they are cancelled once the store has recorded the close,
    /// or start again if the session refused it. If the store could not record it, they wait
    /// for the close to be asked again.
    pub(super) fn close(
        &mut self,
        myself: &ActorRef<HostMsg>,
        conversation_id: ConversationId,
        reply: Reply<Closed>,
    ) {
        let handle = match self.running() {
            Ok(h) => h.clone(),
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        if let Some(slot) = self.conversations.get_mut(&conversation_id) {
            slot.closing = true;
        }
        let via = handle.actor().get_id();
        let myself = myself.clone();
        spawn_traced(async move {
            let result = handle.close(conversation_id).await;
            let _ = myself.cast(HostMsg::Closed {
                conversation_id,
                result,
                via,
                reply,
            });
        });
    }

    pub(super) async fn closed(
        &mut self,
        myself: &ActorRef<HostMsg>,
        conversation_id: ConversationId,
        result: Result<Closed, AgentError>,
        via: ActorId,
    ) -> Result<Closed, AgentError> {
        let closed = match result {
            Ok(c) => c,
            Err(e) => {
                if let Some(slot) = self.conversations.get_mut(&conversation_id) {
                    slot.closing = false;
                }
                self.run_next(myself, conversation_id).await;
                return Err(e);
            }
        };
        let open = match self.conversations.get(&conversation_id) {
            Some(slot) => slot.record.state == ConversationState::Open,
            // Forgotten once closed, or never this session's: the store tells which (a
            // second close is answered `already_closed`, an unknown id `not_found`).
            None => {
                let known = self.store.conversation(conversation_id).await?;
                if known.is_none_or(|c| c.session_id != self.record.session_id) {
                    return Err(AgentError::not_found("conversation", conversation_id));
                }
                false
            }
        };
        if !open {
            return Ok(closed);
        }
        let at = now_ms();
        // Recorded first: a close the store cannot record is not done. The conversation stays
        // closing (none of its queued messages starts, and they stay queued in the store, as
        // the conversation stays open there), the caller hears the error, and the next close,
        // which the session answers at once, records it and cancels what waits.
        self.store.close_conversation(conversation_id, at).await?;
        self.resync(via, Resync::Close(conversation_id)).await;
        let Some(slot) = self.conversations.get_mut(&conversation_id) else {
            return Ok(closed);
        };
        slot.record.state = ConversationState::Closed;
        slot.record.closed_ms = Some(at);
        let queued: Vec<Waiting> = slot.queue.drain(..).collect();
        for w in queued {
            let sent = self
                .finish(w.message, Err(AgentError::cancelled("conversation closed")))
                .await;
            if let Some(waiter) = w.waiter {
                let _ = waiter.send(sent);
            }
        }
        self.forget_if_closed(conversation_id);
        Ok(closed)
    }

    /// Forgets a closed conversation once nothing of it runs (its running task's `TaskDone`
    /// may come after the close): the host keeps only what it may run, so its memory follows
    /// the open conversations, not every conversation the session ever had.
    pub(super) fn forget_if_closed(&mut self, conversation_id: ConversationId) {
        let idle_and_closed = self
            .conversations
            .get(&conversation_id)
            .is_some_and(|s| s.record.state == ConversationState::Closed && s.pending() == 0);
        if idle_and_closed {
            self.conversations.remove(&conversation_id);
        }
    }

    /// Reopens a closed conversation (see [`HostMsg::Reopen`]).
    pub(super) fn reopen(
        &self,
        myself: &ActorRef<HostMsg>,
        conversation_id: ConversationId,
        reply: Reply<()>,
    ) {
        match self.conversations.get(&conversation_id) {
            Some(slot) if slot.record.state == ConversationState::Open && !slot.closing => {
                let _ = reply.send(Ok(()));
                return;
            }
            Some(_) => {
                let _ = reply.send(Err(AgentError::invalid(format!(
                    "conversation {conversation_id} is closing; reopen it once it closed"
                ))));
                return;
            }
            None => {}
        }
        let handle = match self.running() {
            Ok(h) => h.clone(),
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let store = self.store.clone();
        let session_id = self.record.session_id;
        let via = handle.actor().get_id();
        let myself = myself.clone();
        spawn_traced(async move {
            let result = async {
                let mut record = store
                    .conversation(conversation_id)
                    .await?
                    .filter(|c| c.session_id == session_id)
                    .ok_or_else(|| AgentError::not_found("conversation", conversation_id))?;
                handle
                    .restore(conversation_id, record.params.clone())
                    .await?;
                record.state = ConversationState::Open;
                record.closed_ms = None;
                Ok(record)
            }
            .await;
            let _ = myself.cast(HostMsg::Reopened { result, via, reply });
        });
    }

    pub(super) async fn reopened(
        &mut self,
        result: Result<ConversationRecord, AgentError>,
        via: ActorId,
    ) -> Result<(), AgentError> {
        let record = result?;
        let id = record.conversation_id;
        self.store.put_conversation(record.clone()).await?;
        tracing::info!(conversation_id = %id, "conversation reopened");
        crate::metrics::conversation_reopened();
        self.conversations
            .entry(id)
            .or_insert_with(|| ConversationSlot::new(record));
        self.resync(via, Resync::Open(id)).await;
        Ok(())
    }

    /// A change that the session run `via` answered, made known to the run that replaced it,
    /// if one did: a run started again after `via` stopped was restored from what the host
    /// held when it started, which may predate the change (the answer was still on its way
    /// to the host). Told at once to a run that is up, after its start to one being started;
    /// a session that is down reads the store when it is activated again.
    pub(super) async fn resync(&mut self, via: ActorId, change: Resync) {
        match &self.session {
            Liveness::Up(h) if h.actor().get_id() == via => {}
            Liveness::Up(h) => {
                let h = h.clone();
                self.tell(&h, change).await;
            }
            Liveness::Restarting => self.resyncs.push(change),
            Liveness::Down(_) => {}
        }
    }

    /// Tells the run that has just started the changes it may have missed.
    pub(super) async fn tell_missed(&mut self, h: &SessionHandle) {
        for change in std::mem::take(&mut self.resyncs) {
            self.tell(h, change).await;
        }
    }

    async fn tell(&self, h: &SessionHandle, change: Resync) {
        let session_id = self.record.session_id;
        tracing::info!(%session_id, ?change, "telling the restarted session a change it missed");
        let told = match &change {
            // What the host holds now, if it still holds it open (restoring an open one is
            // nothing to do). Awaited, as a context change is: the messages the host runs next
            // in the new run may be for this conversation.
            Resync::Open(id) => match self.conversations.get(id) {
                Some(slot) if slot.record.state == ConversationState::Open => {
                    let params = super::plan::as_stored(&slot.record, now_ms());
                    h.restore(*id, params).await
                }
                _ => Ok(()),
            },
            Resync::Context(id, update) => h.set_context(*id, update.clone()).await,
            // Not awaited here: a close waits for the conversation's running task, and the
            // host's mailbox would wait with it.
            Resync::Close(id) => {
                let (h, id) = (h.clone(), *id);
                spawn_traced(async move {
                    let told = h.close(id).await.map(drop);
                    resynced(session_id, &Resync::Close(id), told);
                });
                return;
            }
        };
        resynced(session_id, &change, told);
    }
}

/// Counts (and logs) how telling a change went; a run that does not have the conversation at
/// all has nothing to change, which is as good as told.
fn resynced(session_id: troupe_proto::SessionId, change: &Resync, told: Result<(), AgentError>) {
    match told {
        Err(error) if error.kind() != troupe_proto::ErrorKind::NotFound => {
            crate::metrics::session_resync("failed");
            tracing::warn!(%session_id, ?change, %error, "the restarted session could not be told a change");
        }
        _ => crate::metrics::session_resync("told"),
    }
}

/// A change to a conversation that a session run answered (see [`HostState::resync`]).
#[derive(Debug)]
pub(super) enum Resync {
    Open(ConversationId),
    Context(ConversationId, SetContext),
    Close(ConversationId),
}

impl HostState {
    /// Ends the conversation's queued messages `cancelled`, then asks the session to cancel
    /// its running task (whose message ends `cancelled` when its `TaskDone` comes).
    pub(super) async fn cancel_all(
        &mut self,
        conversation_id: ConversationId,
        reply: Reply<usize>,
    ) {
        let open = self
            .conversations
            .get(&conversation_id)
            .is_some_and(|c| c.record.state == ConversationState::Open);
        let handle = match self.running() {
            Ok(h) if open => h.clone(),
            Ok(_) => {
                let _ = reply.send(Err(AgentError::not_found("conversation", conversation_id)));
                return;
            }
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let queued: Vec<Waiting> = self
            .conversations
            .get_mut(&conversation_id)
            .map(|slot| slot.queue.drain(..).collect())
            .unwrap_or_default();
        let n = queued.len();
        for w in queued {
            let sent = self
                .finish(
                    w.message,
                    Err(AgentError::cancelled(
                        "cancelled with every task of its conversation",
                    )),
                )
                .await;
            if let Some(waiter) = w.waiter {
                let _ = waiter.send(sent);
            }
        }
        spawn_traced(async move {
            let running = handle.cancel_conversation(conversation_id).await;
            let _ = reply.send(running.map(|r| r + n));
        });
    }
}
