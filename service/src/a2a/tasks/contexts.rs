//! Contexts' conversations over time: closed once idle for `idle_close`, reopened (under the
//! same id, with their history) when a task is queued in a closed one, and replaced by a new
//! conversation when the old one cannot be reopened (it is gone from the session). The timer
//! also applies retention to the stored finished tasks.

use super::{A2aTasksMsg, A2aTasksState, metrics, now_ms};
use crate::a2a::book::Phase;
use crate::a2a::persist::Write;
use ractor::ActorRef;
use troupe_proto::{AgentError, ConversationId};

impl A2aTasksState {
    /// Opens a context's closed conversation again (or, gone, a new one in its place).
    pub(super) fn reopen(
        &mut self,
        myself: &ActorRef<A2aTasksMsg>,
        context_id: &str,
        conversation_id: ConversationId,
    ) {
        tracing::debug!(%context_id, %conversation_id, "a2a context reopening");
        let backend = self.backend.clone();
        let params = self.config.open.clone();
        let me = myself.clone();
        let context_id = context_id.to_owned();
        tokio::spawn(async move {
            let result = match backend.reopen(conversation_id, params.clone()).await {
                Ok(()) => Ok(None),
                Err(AgentError::NotFound { .. }) => backend.open(params).await.map(Some),
                Err(e) => Err(e),
            };
            let _ = me.cast(A2aTasksMsg::ContextReopened { context_id, result });
        });
    }

    pub(super) fn on_context_reopened(
        &mut self,
        myself: &ActorRef<A2aTasksMsg>,
        context_id: &str,
        result: Result<Option<ConversationId>, AgentError>,
    ) {
        match result {
            Ok(replacement) => {
                match replacement {
                    Some(new) => {
                        tracing::warn!(%context_id, conversation_id = %new, "a2a context's conversation could not be reopened; a new one replaces it");
                        metrics::context_event("replaced");
                    }
                    None => {
                        tracing::info!(%context_id, "a2a context reopened");
                        metrics::context_event("reopened");
                    }
                }
                if self
                    .book
                    .context_reopened(context_id, replacement, now_ms())
                {
                    self.dispatch(myself, context_id);
                }
            }
            Err(e) => {
                tracing::warn!(%context_id, error = %e, "a2a context could not be reopened; its queued tasks fail");
                for (task_id, events) in self.book.reopen_failed(context_id, &e, now_ms()) {
                    self.publish(&task_id, events);
                }
            }
        }
    }

    pub(super) fn on_context_closed(
        &mut self,
        myself: &ActorRef<A2aTasksMsg>,
        context_id: &str,
        result: Result<(), AgentError>,
    ) {
        let closed = match result {
            Ok(()) => {
                tracing::info!(%context_id, "a2a context idle: its conversation closed");
                metrics::context_event("closed_idle");
                true
            }
            Err(e) => {
                tracing::warn!(%context_id, error = %e, "a2a idle context's conversation did not close");
                false
            }
        };
        if self.book.context_closed(context_id, closed) {
            // A task arrived while it closed: it reopens.
            self.dispatch(myself, context_id);
        }
    }

    /// The timer: closes the conversations of idle contexts, applies retention, and sends on
    /// queued tasks the endpoint could not start before (its session was not running).
    pub(super) async fn on_sweep(&mut self, myself: &ActorRef<A2aTasksMsg>) {
        let idle_ms = u64::try_from(self.config.idle_close.as_millis()).unwrap_or(u64::MAX);
        for (context_id, conversation_id) in self.book.idle_contexts(now_ms(), idle_ms) {
            let backend = self.backend.clone();
            let me = myself.clone();
            tokio::spawn(async move {
                let result = backend.close(conversation_id).await;
                let _ = me.cast(A2aTasksMsg::ContextClosed { context_id, result });
            });
        }
        if self.finished_since_prune > 0 {
            self.finished_since_prune = 0;
            self.persister.write(
                Write::Prune {
                    keep_finished: self.config.keep_finished,
                },
                None,
            );
        }
        if self.forwarder.is_none() && !self.book.tasks_in(Phase::Queued).is_empty() {
            self.resume(myself).await;
        }
    }
}
