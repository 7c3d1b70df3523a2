//! The session's life under its host: activation (start again, settle pending messages),
//! restarts after it stops on its own, shutdown.

use super::{
    ConversationSlot, HostMsg, HostState, Liveness, RESTART_WINDOW, RESTARTS_PER_WINDOW,
    SessionTemplate, Waiting, plan,
};
use crate::metrics;
use ractor::{ActorId, ActorRef};
use std::collections::HashMap;
use std::time::Instant;
use troupe_actors::SessionHandle;
use troupe_proto::store::{ConversationRecord, SessionRecord, SessionStatus};
use troupe_proto::{AgentError, ConversationId};

/// Starts a stored session again under its ids, linked to its host; its conversations'
/// history comes back from the rollout.
async fn restart(
    host: &ActorRef<HostMsg>,
    template: &SessionTemplate,
    record: &SessionRecord,
    conversations: &[ConversationRecord],
) -> Result<SessionHandle, AgentError> {
    let (root, others) =
        plan::restore_plan(record, conversations, troupe_actors::clock::unix_now_ms());
    let mut config = template.config.clone();
    config.root_id = Some(record.root_conversation_id);
    if let Some(root) = root {
        config.root = root;
    }
    let handle = SessionHandle::start_linked(
        record.session_id,
        config,
        template.ports.clone(),
        host.get_cell(),
    )
    .await?;
    for (id, params) in others {
        if let Err(e) = handle.restore(id, params).await {
            let _ = handle.shutdown().await;
            return Err(e);
        }
    }
    Ok(handle)
}

impl HostState {
    /// Activation: start the stored session again, then settle its pending messages.
    pub(super) async fn activate(&mut self, myself: &ActorRef<HostMsg>) -> Result<(), AgentError> {
        let session_id = self.record.session_id;
        // Only the open conversations (and the root, open or not: its parameters start the
        // session): closed ones are read when one is reopened.
        let mut records = self.store.open_conversations(session_id).await?;
        let root = self.record.root_conversation_id;
        if !records.iter().any(|c| c.conversation_id == root)
            && let Some(closed_root) = self.store.conversation(root).await?
        {
            records.insert(0, closed_root);
        }
        let pending = self.store.pending_messages(session_id).await?;
        let started = restart(myself, &self.template, &self.record, &records).await;
        self.conversations = records
            .into_iter()
            .map(|c| (c.conversation_id, ConversationSlot::new(c)))
            .collect();
        match started {
            Ok(handle) => {
                self.session = Liveness::Up(handle);
                self.emit_deferred();
            }
            Err(e) => {
                tracing::error!(%session_id, error = %e, "stored session not started");
                self.session = Liveness::Down(e);
                self.set_status(SessionStatus::Failed).await;
            }
        }
        let records: HashMap<ConversationId, ConversationRecord> = self
            .conversations
            .iter()
            .map(|(id, c)| (*id, c.record.clone()))
            .collect();
        let mut requeued = 0usize;
        for message in pending {
            match plan::recover(&message, &records) {
                plan::Recovery::Requeue => {
                    let text = message.content.clone().unwrap_or_default();
                    let governance = match super::queue::stored_governance(&message) {
                        Ok(governance) => governance,
                        Err(e) => {
                            tracing::error!(%session_id, message_id = message.message_id, error = %e, "queued message not run: its request layer cannot be read");
                            let _ = self.finish(message, Err(e)).await;
                            continue;
                        }
                    };
                    if let Some(slot) = self.conversations.get_mut(&message.conversation_id) {
                        requeued += 1;
                        slot.queue.push_back(Waiting {
                            message,
                            text,
                            governance,
                            waiter: None,
                            refused_starts: 0,
                        });
                    }
                }
                plan::Recovery::Abort(reason) => {
                    let _ = self
                        .finish(message, Err(AgentError::interrupted(reason)))
                        .await;
                }
                plan::Recovery::Cancel => {
                    let _ = self
                        .finish(
                            message,
                            Err(AgentError::cancelled("its conversation was closed")),
                        )
                        .await;
                }
            }
        }
        tracing::info!(%session_id, requeued, "session activated");
        if let Err(e) = self.running().cloned() {
            self.fail_queued(&e).await;
        }
        let ids: Vec<ConversationId> = self.conversations.keys().copied().collect();
        for id in ids {
            self.run_next(myself, id).await;
        }
        // Messages that run again keep it active, whatever ended before them.
        let status = self.status_after(None);
        self.set_status(status).await;
        Ok(())
    }

    pub(super) async fn shutdown(&mut self) {
        self.draining = true;
        if let Liveness::Up(handle) = &self.session
            && let Err(e) = handle.shutdown().await
        {
            tracing::warn!(session_id = %self.record.session_id, error = %e, "session shutdown");
        }
        // The tasks the shutdown cancelled answer through `TaskDone`, still in this mailbox;
        // the service waits for them with a second drain.
        self.session = Liveness::Down(shutting_down());
        // Callers waiting on a queued message hear that it stays queued and runs after the
        // next start (not an internal error, which reads as if it were lost).
        for slot in self.conversations.values_mut() {
            for waiting in &mut slot.queue {
                if let Some(waiter) = waiting.waiter.take() {
                    let _ = waiter.send(Err(stays_queued(waiting.message.message_id)));
                }
            }
        }
    }

    /// The session's actor ended: start it again unless the service drains or it keeps
    /// stopping. What it was running is settled by the `TaskDone`s its end produces.
    pub(super) async fn session_stopped(&mut self, myself: &ActorRef<HostMsg>, actor: ActorId) {
        let current = matches!(&self.session, Liveness::Up(h) if h.actor().get_id() == actor);
        if !current {
            // An earlier run of this session, already replaced; or, while it is started again,
            // perhaps the new run, which `session_restarted` will be handed.
            if matches!(self.session, Liveness::Restarting) {
                self.stopped_while_restarting.push(actor);
            }
            return;
        }
        if self.draining {
            self.session = Liveness::Down(shutting_down());
            return;
        }
        tracing::warn!(session_id = %self.record.session_id, "session stopped on its own; starting it again");
        self.start_again(myself).await;
    }

    /// Starts the stopped session again, unless it was started again
    /// [`RESTARTS_PER_WINDOW`] times in the last [`RESTART_WINDOW`]: then it stays down, its
    /// queued messages end `failed` and the session is marked failed.
    async fn start_again(&mut self, myself: &ActorRef<HostMsg>) {
        let session_id = self.record.session_id;
        if !plan::may_restart(
            &mut self.restarts,
            Instant::now(),
            RESTARTS_PER_WINDOW,
            RESTART_WINDOW,
        ) {
            metrics::session_restart("given_up");
            tracing::error!(%session_id, "session keeps stopping; left down");
            let down = AgentError::internal(format!(
                "session {session_id} keeps stopping and was left down"
            ));
            self.session = Liveness::Down(down.clone());
            self.resyncs.clear();
            self.fail_queued(&down).await;
            self.set_status(SessionStatus::Failed).await;
            return;
        }
        self.session = Liveness::Restarting;
        // The run started now is restored from what the host holds now: the changes told of
        // while an earlier start was under way are in it already.
        self.resyncs.clear();
        let record = self.record.clone();
        let conversations: Vec<ConversationRecord> = self
            .conversations
            .values()
            .map(|c| c.record.clone())
            .collect();
        let template = self.template.clone();
        let myself = myself.clone();
        tokio::spawn(async move {
            let result = restart(&myself, &template, &record, &conversations).await;
            let _ = myself.cast(HostMsg::SessionRestarted { result });
        });
    }

    /// A restart ended. A session that could not be started, or that stopped before its
    /// host heard it had started, is started again within the same budget.
    pub(super) async fn session_restarted(
        &mut self,
        myself: &ActorRef<HostMsg>,
        result: Result<SessionHandle, AgentError>,
    ) {
        let session_id = self.record.session_id;
        let stopped = std::mem::take(&mut self.stopped_while_restarting);
        match result {
            Ok(handle) if self.draining => {
                self.session = Liveness::Down(shutting_down());
                self.resyncs.clear();
                tokio::spawn(async move {
                    let _ = handle.shutdown().await;
                });
            }
            Err(e) if self.draining => {
                // The service stops: what waits stays queued and runs after the next start.
                tracing::warn!(%session_id, error = %e, "session not restarted while draining");
                self.session = Liveness::Down(shutting_down());
                self.resyncs.clear();
            }
            Ok(handle) if stopped.contains(&handle.actor().get_id()) => {
                metrics::session_restart("failed");
                tracing::warn!(%session_id, "session stopped again while it was started");
                self.start_again(myself).await;
            }
            Ok(handle) => {
                metrics::session_restart("restarted");
                tracing::info!(%session_id, "session restarted");
                self.session = Liveness::Up(handle.clone());
                self.tell_missed(&handle).await;
                self.emit_deferred();
                let ids: Vec<ConversationId> = self.conversations.keys().copied().collect();
                for id in ids {
                    self.run_next(myself, id).await;
                }
            }
            Err(e) => {
                metrics::session_restart("failed");
                tracing::error!(%session_id, error = %e, "session could not be restarted");
                self.start_again(myself).await;
            }
        }
    }
}

/// What a caller waiting on queued message `message_id` hears when the service stops.
pub(super) fn stays_queued(message_id: u64) -> AgentError {
    AgentError::interrupted(format!(
        "the service is stopping: message {message_id} stays queued in the store and runs \
         after the next start (read it for its outcome; do not send it again)"
    ))
}

/// What calls answer once the service shuts the session down.
fn shutting_down() -> AgentError {
    AgentError::Overloaded {
        resource: "service (shutting down)".into(),
        limit: 0,
    }
}
