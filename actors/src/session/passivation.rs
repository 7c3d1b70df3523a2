//! Passivation, the session's side (virtual conversations).
//!
//! ```text
//! Conversation idle for passivate_after ──PassivationOffered──► Session
//!   accepted? ── no ─► nothing (it stays live)
//!     └─ yes ─► entry Asked: requests for it are held ──Passivate──► Conversation
//!                 ├─ Stopped: it stops; entry Passivated (its parameters and statistics);
//!                 │           held requests reactivate it
//!                 └─ Busy:    work came first; held requests go to it, in order
//! a request for a Passivated entry ─► reactivate (restore from the rollout, as after a
//!   restart) ─► deliver it; a statistics read is answered from the entry instead
//! ```
//!
//! Nothing is lost in the race between a request and a passivation: whatever the Session
//! forwarded before it asked is ahead of `Passivate` in the conversation's mailbox (every
//! forward, and `Passivate`, is put in the mailbox during the Session's own turn, never from a
//! task spawned to do it; the conversation then is not idle and says no), and whatever comes after is held by the
//! Session until the answer. A dispatch the agent hub sent straight to the conversation
//! (`agents::direct`) may be ahead of `Passivate` too (the conversation then is busy and says
//! no), or arrive after it stopped: undelivered, it is handed to the Session, which holds or
//! reactivates as for any request. The conversation's stop (a supervision event) and its answer
//! may arrive in either order; the first settles the entry, the second finds nothing to do.
//!
//! What stays while a conversation is passivated: its index entry here, its storage policy
//! at the Rollout, its remembered approvals at the ApprovalStore and the session's event
//! stream (subscribers listen to the Rollout, which stays: they see its events again once it
//! is reactivated). Reactivation reads its restore window from the rollout and emits
//! `conversation_restarted` (reason "reactivated after passivation").

use super::*;
use crate::conversation::PassivateAnswer;

/// A passivated conversation's statistics as its session keeps them: the counters of
/// [`ConversationStats`] in 64 bytes (a session may hold a million of these; counts past
/// `u32::MAX` read as `u32::MAX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DormantStats {
    tasks: u32,
    tasks_failed: u32,
    tasks_cancelled: u32,
    tool_calls: u32,
    mcp_calls: u32,
    history_items: u32,
    usage: troupe_proto::Usage,
    mcp_latency_ms_total: u64,
}

impl DormantStats {
    pub(super) fn of(stats: &ConversationStats) -> Self {
        let small = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        Self {
            tasks: small(stats.tasks),
            tasks_failed: small(stats.tasks_failed),
            tasks_cancelled: small(stats.tasks_cancelled),
            tool_calls: small(stats.tool_calls),
            mcp_calls: small(stats.mcp_calls),
            history_items: small(stats.history_items),
            usage: stats.usage,
            mcp_latency_ms_total: stats.mcp_latency_ms_total,
        }
    }

    pub(super) fn read(&self, id: ConversationId) -> ConversationStats {
        ConversationStats {
            conversation_id: Some(id),
            tasks: self.tasks.into(),
            tasks_failed: self.tasks_failed.into(),
            tasks_cancelled: self.tasks_cancelled.into(),
            usage: self.usage,
            tool_calls: self.tool_calls.into(),
            mcp_calls: self.mcp_calls.into(),
            mcp_latency_ms_total: self.mcp_latency_ms_total,
            history_items: self.history_items.into(),
        }
    }
}

/// Where a conversation stands in the session's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Live,
    /// Asked to passivate; requests for it are held until it answers.
    Asked,
    Passivated,
}

/// What to do with a request for a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassivationRoute {
    Unknown,
    Forward,
    Hold,
    Reactivate,
}

/// Where a request for a conversation goes, by where it stands (`None`: not open).
pub fn request_route(standing: Option<Standing>) -> PassivationRoute {
    match standing {
        None => PassivationRoute::Unknown,
        Some(Standing::Live) => PassivationRoute::Forward,
        Some(Standing::Asked) => PassivationRoute::Hold,
        Some(Standing::Passivated) => PassivationRoute::Reactivate,
    }
}

/// Whether the session takes a conversation's offer to passivate: it is live (not already
/// asked), the offer comes from its current actor (not one that failed and was replaced),
/// it has no model client of its own, and the session is not shutting down.
pub fn passivation_accepted(
    shutting_down: bool,
    standing: Option<Standing>,
    same_actor: bool,
    own_model: bool,
) -> bool {
    !shutting_down && standing == Some(Standing::Live) && same_actor && !own_model
}

impl SessionState {
    pub(super) fn on_passivation_offered(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        id: ConversationId,
        actor: ActorId,
    ) {
        let standing = self.conversations.get(&id).map(ConversationEntry::standing);
        let Some(ConversationEntry::Live(live)) = self.conversations.get_mut(&id) else {
            return;
        };
        if !passivation_accepted(
            self.shutting_down,
            standing,
            live.actor.get_id() == actor,
            live.model.is_some(),
        ) {
            return;
        }
        live.held = Some(Vec::new());
        let session = myself.clone();
        // Sent from this turn of the Session, so behind everything it forwarded before.
        let (tx, rx) = ractor::concurrency::oneshot();
        let sent = live
            .actor
            .cast(ConversationMsg::Passivate { reply: tx.into() });
        tokio::spawn(async move {
            let answer = match sent {
                Ok(()) => rx.await.ok(),
                Err(_) => None,
            };
            let _ = session.cast(SessionMsg::PassivationAnswered {
                conversation_id: id,
                actor,
                answer,
            });
        });
    }

    pub(super) async fn on_passivation_answered(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        id: ConversationId,
        actor: ActorId,
        answer: Option<PassivateAnswer>,
    ) {
        let asked = match self.conversations.get_mut(&id) {
            Some(ConversationEntry::Live(live)) => {
                live.held.is_some() && live.actor.get_id() == actor
            }
            Some(ConversationEntry::Passivated(dormant)) => {
                // Its stop was seen first: the answer brings the statistics it stopped with.
                if let Some(PassivateAnswer::Stopped(stats)) = &answer
                    && dormant.actor == actor.pid()
                    && dormant.stats.is_none()
                {
                    dormant.stats = Some(DormantStats::of(stats));
                }
                false
            }
            None => false,
        };
        if !asked {
            return; // settled already (by its stop, or its failure and restart)
        }
        match answer {
            Some(PassivateAnswer::Stopped(stats)) => {
                let Some(ConversationEntry::Live(live)) = self.conversations.remove(&id) else {
                    return;
                };
                self.by_actor.remove(&actor);
                self.passivated(myself, id, *live, Some(DormantStats::of(&stats)))
                    .await;
            }
            // It had work, or it is gone (its stop or failure settles it as a supervision
            // event; until then its requests stay held).
            Some(PassivateAnswer::Busy) => {
                let held = match self.conversations.get_mut(&id) {
                    Some(ConversationEntry::Live(live)) => live.held.take(),
                    _ => None,
                };
                self.release_held(myself, id, held).await;
            }
            None => {}
        }
    }

    /// A conversation stopped for its passivation: keep only its parameters and statistics
    /// (`None` when its stop came before its answer), then reactivate it at once if requests
    /// came meanwhile.
    pub(super) async fn passivated(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        id: ConversationId,
        live: LiveConversation,
        stats: Option<DormantStats>,
    ) {
        metrics::passivated();
        tracing::debug!(session_id = %self.id, conversation_id = %id, "conversation passivated");
        let dormant = Dormant {
            params: live.params,
            stats,
            actor: live.actor.get_id().pid(),
        };
        self.conversations
            .insert(id, ConversationEntry::Passivated(Box::new(dormant)));
        self.release_held(myself, id, live.held).await;
    }

    /// Delivers the requests held during a passivation, in the order they came.
    pub(super) async fn release_held(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        id: ConversationId,
        held: Option<Vec<ConversationRequest>>,
    ) {
        for request in held.into_iter().flatten() {
            self.deliver(myself, id, request).await;
        }
    }

    /// Starts a passivated conversation again, its history restored from its rollout.
    pub(super) async fn reactivate(
        &mut self,
        cell: &ActorCell,
        id: ConversationId,
    ) -> Result<(), AgentError> {
        let Some(ConversationEntry::Passivated(dormant)) = self.conversations.remove(&id) else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        let params = dormant.params.clone();
        match self
            .spawn_conversation(
                cell,
                Some(id),
                params,
                None,
                Some(RestoreCause::Reactivation),
            )
            .await
        {
            Ok(_) => {
                metrics::reactivated();
                tracing::debug!(session_id = %self.id, conversation_id = %id, elapsed_ms = started.elapsed().as_millis() as u64, "conversation reactivated");
                Ok(())
            }
            Err(error) => {
                tracing::error!(session_id = %self.id, conversation_id = %id, %error, "conversation could not be reactivated");
                self.conversations
                    .insert(id, ConversationEntry::Passivated(dormant));
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dormant_statistics_read_back_as_they_were_kept() {
        let id = ConversationId::new();
        let stats = ConversationStats {
            conversation_id: Some(id),
            tasks: 3,
            tasks_failed: 1,
            tasks_cancelled: 1,
            usage: troupe_proto::Usage {
                input_tokens: 10_000_000_000,
                output_tokens: 7,
                cached_tokens: 2,
                reasoning_tokens: 1,
            },
            tool_calls: 4,
            mcp_calls: 2,
            mcp_latency_ms_total: 123,
            history_items: 9,
        };
        assert_eq!(DormantStats::of(&stats).read(id), stats);
        assert_eq!(std::mem::size_of::<DormantStats>(), 64);
        let huge = ConversationStats {
            tasks: u64::MAX,
            ..stats
        };
        assert_eq!(DormantStats::of(&huge).read(id).tasks, u64::from(u32::MAX));
    }

    #[test]
    fn requests_go_where_their_conversation_stands() {
        assert_eq!(request_route(None), PassivationRoute::Unknown);
        assert_eq!(
            request_route(Some(Standing::Live)),
            PassivationRoute::Forward
        );
        assert_eq!(request_route(Some(Standing::Asked)), PassivationRoute::Hold);
        assert_eq!(
            request_route(Some(Standing::Passivated)),
            PassivationRoute::Reactivate
        );
    }

    #[test]
    fn only_a_live_conversation_of_the_sessions_model_is_passivated_by_its_current_actor() {
        let live = Some(Standing::Live);
        assert!(passivation_accepted(false, live, true, false));
        assert!(
            !passivation_accepted(true, live, true, false),
            "shutting down"
        );
        assert!(
            !passivation_accepted(false, live, false, false),
            "a replaced actor"
        );
        assert!(
            !passivation_accepted(false, live, true, true),
            "an agent's model"
        );
        assert!(!passivation_accepted(
            false,
            Some(Standing::Asked),
            true,
            false
        ));
        assert!(!passivation_accepted(
            false,
            Some(Standing::Passivated),
            true,
            false
        ));
        assert!(!passivation_accepted(false, None, true, false));
    }
}
