//! Start-up: what was live comes back from the store. The open contexts and every task that
//! had not finished are read (nothing else: the finished tasks and closed contexts stay in the
//! store until a request names them), with their push configs. Then each task goes on as the
//! service's durable queue would have it: one that had not reached troupe (queued in its
//! context) runs; one that troupe was running ends FAILED, not run again (it may have had
//! effects), and its conversation's leftovers are cancelled; one that waited for the client's
//! reply keeps waiting. A store that cannot be read fails the start rather than starting
//! with none of them.

use super::{A2aTasksMsg, A2aTasksState, metrics, now_ms};
use crate::a2a::book::Phase;
use crate::a2a::book::stored::record_of;
use crate::a2a::push::config_of;
use ractor::ActorRef;
use troupe_proto::AgentError;
use troupe_store::Store;

/// Longest the start waits for one conversation's leftovers to be cancelled.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a task that troupe was running when the endpoint stopped ends FAILED.
pub const INTERRUPTED: &str = "its task was interrupted by a restart of the service (or of the A2A endpoint) and is not run again";

impl A2aTasksState {
    /// Reads back the open contexts and the live tasks (in `pre_start`). A store that cannot
    /// be read fails the start (the process's, or the actor's restart, which its supervisor
    /// tries again a few times before it gives up and says so): starting with nothing would
    /// leave every live task unfinished for good.
    pub(super) async fn recover(&mut self, store: &dyn Store) -> Result<(), AgentError> {
        // What a failed predecessor queued is stored before it is read.
        if let Err(e) = self.persister.barrier().await {
            tracing::warn!(error = %e, "a2a store writer unavailable at start");
        }
        match store.a2a_open_contexts().await {
            Ok(contexts) => {
                for c in contexts {
                    self.book.hydrate_context(
                        c.context_id,
                        c.conversation_id,
                        c.session_id,
                        c.created_ms,
                        c.active_ms,
                        true,
                    );
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "a2a open contexts could not be read");
                return Err(e);
            }
        }
        let live = store.a2a_live_tasks().await.inspect_err(|e| {
            tracing::error!(error = %e, "a2a live tasks could not be read");
        })?;
        let (mut requeued, mut interrupted, mut waiting) = (0usize, 0usize, 0usize);
        for stored in live {
            let record = match record_of(&stored) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(task_id = %stored.task_id, error = %e, "a2a stored task unreadable");
                    continue;
                }
            };
            let context_id = record.task.context_id.clone();
            if !self.book.has_context(&context_id) {
                match store.a2a_context(&context_id).await {
                    Ok(Some(c)) => self.book.hydrate_context(
                        c.context_id,
                        c.conversation_id,
                        c.session_id,
                        c.created_ms,
                        c.active_ms,
                        c.open,
                    ),
                    other => {
                        tracing::error!(task_id = %stored.task_id, %context_id, ?other, "a2a stored task has no stored context");
                        continue;
                    }
                }
            }
            let task_id = record.task.id.clone();
            let (phase, conversation_id) = (record.phase, record.conversation_id);
            self.book.hydrate_task(record);
            match store.a2a_pushes(&task_id).await {
                Ok(pushes) => {
                    for p in &pushes {
                        match config_of(p) {
                            Ok(c) => self.push.restore(c),
                            Err(e) => {
                                tracing::warn!(%task_id, error = %e, "a2a stored push config unreadable")
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(%task_id, error = %e, "a2a push configs could not be read")
                }
            }
            match phase {
                Phase::Queued => {
                    requeued += 1;
                    metrics::recovered("requeued");
                }
                Phase::Waiting => {
                    waiting += 1;
                    metrics::recovered("waiting");
                }
                // Ended once this node runs the session (`resume`): another node may own it
                // and run the task still.
                Phase::Dispatched | Phase::Done => {
                    interrupted += 1;
                    self.to_interrupt.push((task_id, conversation_id));
                }
            }
        }
        tracing::info!(
            contexts = self.book.contexts_len(),
            requeued,
            interrupted,
            waiting,
            "a2a records restored"
        );
        Ok(())
    }

    /// After start (and whenever queued tasks could not go): stores what the recovery
    /// changed, follows the session's events, cancels what interrupted tasks left in their
    /// conversations, and sends queued tasks on.
    pub(super) async fn resume(&mut self, myself: &ActorRef<A2aTasksMsg>) {
        self.store_changes(myself);
        let queued = self.book.tasks_in(Phase::Queued);
        if queued.is_empty() && self.to_cancel.is_empty() && self.to_interrupt.is_empty() {
            return;
        }
        // Only the node that runs the A2A session (its lease, on several nodes) settles its
        // tasks: another node's running task is not this node's to end.
        if let Err(e) = self.ensure_forwarding(myself).await {
            tracing::warn!(error = %e, "a2a session not reachable yet; queued tasks wait");
            return;
        }
        if !self.to_interrupt.is_empty() {
            let now = now_ms();
            for (task_id, conversation_id) in std::mem::take(&mut self.to_interrupt) {
                metrics::recovered("interrupted");
                let events = self.book.interrupted(&task_id, INTERRUPTED, now);
                self.publish(&task_id, events);
                self.to_cancel.push(conversation_id);
            }
            self.store_changes(myself);
        }
        // Before anything new goes to those conversations (a cancel would take it too).
        for conversation_id in std::mem::take(&mut self.to_cancel) {
            let cancelled = tokio::time::timeout(
                CANCEL_WAIT,
                self.backend.cancel_conversation(conversation_id),
            )
            .await;
            match cancelled {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(%conversation_id, error = %e, "nothing left to cancel");
                }
                Err(_) => tracing::warn!(%conversation_id, "a2a leftover cancel took too long"),
            }
        }
        let mut contexts: Vec<String> = queued
            .iter()
            .filter_map(|t| self.book.context_of(t))
            .collect();
        contexts.sort();
        contexts.dedup();
        for context_id in contexts {
            self.dispatch(myself, &context_id);
        }
    }
}
