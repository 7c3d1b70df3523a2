//! Closing a conversation: refuse new work, cancel what runs, wait for its tasks (at most
//! the close timeout), then report the outcome to every caller that asked and stop.
//! Cancelling without closing (`CancelAll`, or the TaskRegistry's cancel): the same wait and
//! the same force-abort, after which the conversation goes on with its next message.

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
                self.arm_abort_timer(myself, task_id);
            }
        }
    }

    /// Cancels the running task and every queued message; returns how many.
    pub(super) fn on_cancel_all(&mut self) -> usize {
        let queued = self.queue.len();
        for q in self.queue.drain(..) {
            let _ = q.reply.send(Err(AgentError::cancelled(
                "cancelled with every task of its conversation",
            )));
        }
        // The runner reports the token (`CancelSeen`), which starts the abort timer.
        let running = self.running.as_ref().map_or(0, |r| {
            let newly = !r.cancel.is_cancelled();
            r.cancel.cancel();
            usize::from(newly)
        });
        let n = queued + running;
        tracing::info!(conversation_id = %self.id, queued, running, "every task of the conversation cancelled");
        metrics::cancelled_all(n);
        n
    }

    /// Starts the abort timer of the running task `task_id`, once: it has the close timeout
    /// to end after its cancellation.
    pub(super) fn arm_abort_timer(&mut self, myself: &ActorRef<ConversationMsg>, task_id: TaskId) {
        let runs = self.running.as_ref().is_some_and(|r| r.task_id == task_id);
        if !abort_timer_needed(runs, self.abort_timer.is_some()) {
            return;
        }
        let timer = myself.send_after(self.services.settings.close_timeout, move || {
            ConversationMsg::CancelTimedOut { task_id }
        });
        self.abort_timer = Some(timer.abort_handle());
    }

    pub(super) fn on_cancel_timed_out(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        task_id: TaskId,
    ) {
        let Some(mut running) = self.running.take_if(|r| r.task_id == task_id) else {
            return; // the task ended in time (a later task's timer, if armed, stays known)
        };
        self.abort_timer = None;
        running.abort.abort();
        let waited = self.services.settings.close_timeout;
        let waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        tracing::warn!(conversation_id = %self.id, task_id = %task_id, waited_ms, "task ignored cancellation; aborted");
        metrics::force_aborted();
        running.span.in_scope(|| {
            self.services.events.emit(EventDraft::task(
                self.id,
                task_id,
                EventKind::Warning {
                    code: WarningCode::CancelIgnored,
                    message: format!(
                        "task {task_id} ignored its cancellation for {waited_ms} ms (the close \
                         timeout) and was aborted"
                    ),
                },
            ));
            self.services.events.emit(EventDraft::task(
                self.id,
                task_id,
                EventKind::TaskAborted { waited_ms },
            ));
        });
        self.withdraw_approvals(task_id, "its task was aborted");
        crate::context::add_aborted_task(&mut self.stats);
        // Released here, so that the slot is free by the time close answers (a lent slot is
        // its dispatcher's).
        self.let_go(task_id, running.slot);
        if let Some(reply) = running.reply.take() {
            let _ = reply.send(Err(AgentError::cancelled(
                "aborted: the task ignored cancellation past the close timeout",
            )));
        }
        self.after_task(myself, CloseOutcome::ForceAborted);
    }

    /// Withdraws the pending approvals of a task that will not wait for them any more.
    pub(super) fn withdraw_approvals(&self, task_id: TaskId, why: &str) {
        let _ = self
            .services
            .directory
            .approvals()
            .get()
            .cast(ApprovalMsg::TaskCancelled {
                conversation_id: self.id,
                task_id,
                reason: why.to_owned(),
            });
    }

    pub(super) fn finish_close(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        outcome: CloseOutcome,
    ) {
        if let Some(timer) = self.abort_timer.take() {
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
