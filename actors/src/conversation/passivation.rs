//! Passivation, the conversation's side: an idle conversation arms a timer of
//! `passivate_after`; when it fires and nothing happened since, it offers itself to the
//! Session (`SessionMsg::PassivationOffered`). The Session, which holds back every request
//! for it meanwhile, asks `Passivate`: the conversation answers `Stopped` with its statistics
//! and stops if it is still idle (whatever the Session forwarded before asking came first in
//! this mailbox), `Busy` otherwise. A statistics read is not activity: it neither wakes an idle
//! conversation's timer nor keeps it from passivating. The Session keeps its index entry and reactivates it from its rollout
//! on the next request (see `session::passivation`).

use super::*;

impl ConversationState {
    pub(super) fn is_idle(&self) -> bool {
        is_idle(
            self.running.is_some(),
            self.queue.len(),
            self.closing.is_some(),
            self.summary_task.as_ref().is_some_and(|t| !t.is_finished()),
        )
    }

    /// Its statistics as they stand (S11).
    pub(super) fn stats_now(&self) -> ConversationStats {
        let mut stats = self.stats.clone();
        stats.history_items = self.history.len() as u64;
        stats
    }

    /// Arms the idle timer for the latest activity, when the conversation is idle and none is
    /// armed for it (the previous one is aborted: it would be stale).
    pub(super) fn arm_idle_timer(&mut self, myself: &ActorRef<ConversationMsg>) {
        let armed = self.idle_timer.as_ref().map(|(epoch, _)| *epoch);
        let Some(after) = self.passivate_after else {
            return;
        };
        if !idle_timer_needed(Some(after), self.is_idle(), armed, self.activity) {
            return;
        }
        if let Some((_, old)) = self.idle_timer.take() {
            old.abort();
        }
        let epoch = self.activity;
        let timer = myself.send_after(after, move || ConversationMsg::IdleTimedOut { epoch });
        self.idle_timer = Some((epoch, timer.abort_handle()));
    }

    /// Tells the Session this conversation has been idle for `passivate_after`.
    pub(super) fn offer_passivation(&self, myself: &ActorRef<ConversationMsg>) {
        let Some(session) = myself.try_get_supervisor() else {
            return;
        };
        // A conversation started under another parent (a test's) is not offered anywhere.
        let _ = session.send_message(crate::session::SessionMsg::PassivationOffered {
            conversation_id: self.id,
            actor: myself.get_id(),
        });
    }
}
