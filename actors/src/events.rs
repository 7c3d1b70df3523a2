//! Emitting events: an `EventDraft` is an envelope without its sequence number and time, which
//! the session's Rollout assigns. `EventSink` is the handle every producer holds; it captures
//! the trace and span ids of the producer's current span (S11).

use crate::directory::{RolloutTarget, Slot};
use crate::rollout::RolloutMsg;
use opentelemetry::trace::TraceContextExt;
use ractor::{ActorRef, MessagingErr};
use tokio::sync::watch;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use troupe_proto::{ConversationId, EventKind, TaskId};

/// An event before the rollout numbers it.
#[derive(Debug, Clone)]
pub struct EventDraft {
    pub conversation_id: Option<ConversationId>,
    pub task_id: Option<TaskId>,
    pub sub_id: Option<String>,
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    pub event: EventKind,
}

impl EventDraft {
    /// A session-level event.
    pub fn session(event: EventKind) -> Self {
        Self {
            conversation_id: None,
            task_id: None,
            sub_id: None,
            trace_id: None,
            span_id: None,
            event,
        }
    }

    /// An event of a conversation, outside any task.
    pub fn conversation(conversation_id: ConversationId, event: EventKind) -> Self {
        Self {
            conversation_id: Some(conversation_id),
            ..Self::session(event)
        }
    }

    /// An event of a task.
    pub fn task(conversation_id: ConversationId, task_id: TaskId, event: EventKind) -> Self {
        Self {
            conversation_id: Some(conversation_id),
            task_id: Some(task_id),
            sub_id: Some(sub_id(conversation_id, task_id)),
            ..Self::session(event)
        }
    }

    /// Stamps the ids of the current tracing span (if it has an OpenTelemetry context).
    pub fn traced(mut self) -> Self {
        let (trace_id, span_id) = current_trace_ids();
        self.trace_id = trace_id;
        self.span_id = span_id;
        self
    }
}

/// The legacy correlation id older consumers read: `<conversation>/<task>`.
pub fn sub_id(conversation_id: ConversationId, task_id: TaskId) -> String {
    format!("{conversation_id}/{task_id}")
}

/// W3C trace and span ids of the current span, when an OpenTelemetry layer is installed.
pub fn current_trace_ids() -> (Option<String>, Option<String>) {
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    if sc.is_valid() {
        (
            Some(sc.trace_id().to_string()),
            Some(sc.span_id().to_string()),
        )
    } else {
        (None, None)
    }
}

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
