//! Closing a conversation: refuse new work, cancel what runs, wait for its tasks (at most
//! the close timeout), then report the outcome to every caller that asked and stop.

use super::*;

impl ConversationState {
    pub(super) fn on_close(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        reply: RpcReplyPort<Closed>,
    ) {
        if let Some(waiters) = &mut self.closing {
            waiters.push(reply);
            return;
        }
        self.closing = Some(vec![reply]);
        for q in self.queue.drain(..) {
            let _ = q
                .reply
                .send(Err(AgentError::cancelled("conversation closed")));
        }
        match &self.running {
            None => self.finish_close(myself, CloseOutcome::Closed),
            Some(r) => {
                r.cancel.cancel();
                let task_id = r.task_id;
                let timer = myself.send_after(self.services.settings.close_timeout, move || {
                    ConversationMsg::CloseTimedOut { task_id }
                });
                self.close_timer = Some(timer.abort_handle());
            }
        }
    }

    pub(super) fn on_close_timed_out(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        task_id: TaskId,
    ) {
        let Some(mut running) = self.running.take_if(|r| r.task_id == task_id) else {
            return; // the task ended in time
        };
        running.abort.abort();
        let waited = self.services.settings.close_timeout;
        tracing::warn!(conversation_id = %self.id, task_id = %task_id, "task ignored cancellation; aborted");
        metrics::force_aborted();
        running.span.in_scope(|| {
            self.services.events.emit(EventDraft::task(
                self.id,
                task_id,
                EventKind::TaskAborted {
                    waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                },
            ));
        });
        self.stats.tasks += 1;
        self.stats.tasks_cancelled += 1;
        // Released here, so that the slot is free by the time close answers.
        let _ = self
            .services
            .directory
            .scheduler()
            .cast(SchedulerMsg::Release { task_id });
        let _ = self
            .services
            .directory
            .registry()
            .cast(TaskRegistryMsg::Deregister { task_id });
        if let Some(reply) = running.reply.take() {
            let _ = reply.send(Err(AgentError::cancelled(
                "aborted: the task ignored cancellation past the close timeout",
            )));
        }
        self.finish_close(myself, CloseOutcome::ForceAborted);
    }

    pub(super) fn finish_close(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        outcome: CloseOutcome,
    ) {
        if let Some(timer) = self.close_timer.take() {
            timer.abort();
        }
        if let Some(view) = self.view.take() {
            tokio::spawn(async move { view.release().await });
        }
        let _ = self
            .services
            .directory
            .approvals()
            .get()
            .cast(ApprovalMsg::ConversationClosed {
                conversation_id: self.id,
            });
        let _ = self
            .services
            .directory
            .registry()
            .cast(TaskRegistryMsg::ConversationGone {
                conversation_id: self.id,
            });
        self.services.events.emit(EventDraft::conversation(
            self.id,
            EventKind::ConversationClosed { outcome },
        ));
        for reply in self.closing.take().unwrap_or_default() {
            let _ = reply.send(Closed {
                conversation_id: self.id,
                outcome,
            });
        }
        // Stay "closing" so late messages are refused until the actor is gone.
        self.closing = Some(Vec::new());
        myself.stop(Some("closed".into()));
    }
}
