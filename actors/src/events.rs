//! Emitting events: an [`EventDraft`] is an envelope without its sequence number and time,
//! which the session's Rollout assigns. `EventSink` is the handle every producer holds; it
//! captures the trace and span ids of the producer's current span (S11).
//!
//! The draft itself lives in [`crate::event_draft`], which knows no actor: the Rollout takes
//! drafts from there and this module sends them to the Rollout, so neither imports the other
//! both ways.

use crate::directory::{RolloutTarget, Slot};
use crate::rollout::RolloutMsg;
use ractor::{ActorRef, MessagingErr};
use tokio::sync::watch;

pub use crate::event_draft::{EventDraft, current_trace_ids, sub_id};

/// Where producers send events: the session's Rollout, which numbers, records and publishes.
/// A live sink (from the session's [`Directory`](crate::directory::Directory)) reads the
/// current Rollout at each emit, so it follows a restarted one; a fixed sink
/// ([`EventSink::new`]) keeps the Rollout it was made with. Cheap to clone.
#[derive(Clone)]
pub struct EventSink {
    rollout: watch::Receiver<Slot<RolloutTarget>>,
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink").finish_non_exhaustive()
    }
}

impl EventSink {
    /// A sink bound to one Rollout for good (a Rollout outside a session, tests).
    pub fn new(rollout: ActorRef<RolloutMsg>) -> Self {
        // Nobody drains this sink's parked events: what its Rollout refuses is dropped.
        let (parked, _) = tokio::sync::mpsc::unbounded_channel();
        let (_, rx) = watch::channel(Slot {
            current: RolloutTarget {
                actor: rollout,
                parked,
            },
            generation: 0,
        });
        Self { rollout: rx }
    }

    pub(crate) fn live(rollout: watch::Receiver<Slot<RolloutTarget>>) -> Self {
        Self { rollout }
    }

    /// Sends one event, stamped with the current span's ids. Never blocks.
    ///
    /// A live sink whose Rollout has stopped parks the event; the Session hands parked events
    /// to the Rollout that replaces it, in order and before any later event (see
    /// [`crate::directory`]). Lost are: events the old Rollout had accepted (in its mailbox, or
    /// the one it was handling) but not yet handed to its writer when it failed; events of a
    /// sink whose session is gone; and with a fixed sink, every event its stopped Rollout
    /// refuses (these two are counted in `troupe_rollout_events_lost_total`).
    pub fn emit(&self, draft: EventDraft) {
        let draft = if draft.trace_id.is_none() {
            draft.traced()
        } else {
            draft
        };
        // The read lock is held until the event is sent or parked, so the Session cannot
        // publish a new Rollout between the two (it hands parked events over under the write
        // lock).
        let slot = self.rollout.borrow();
        let draft = match slot.current.actor.cast(RolloutMsg::Emit { draft }) {
            Ok(()) => return,
            Err(MessagingErr::SendErr(RolloutMsg::Emit { draft })) => draft,
            Err(error) => {
                crate::rollout::metrics::event_lost();
                tracing::warn!(%error, "event dropped: the rollout refused it");
                return;
            }
        };
        if slot.current.parked.send(draft).is_ok() {
            crate::rollout::metrics::event_parked();
        } else {
            crate::rollout::metrics::event_lost();
            tracing::warn!("event dropped: the rollout stopped and nothing replaces it");
        }
    }

    /// The Rollout behind this sink now.
    pub fn rollout(&self) -> ActorRef<RolloutMsg> {
        self.rollout.borrow().current.actor.clone()
    }
}
