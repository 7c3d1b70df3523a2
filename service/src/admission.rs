//! Admission of user messages: the one place that decides whether the service takes a message.
//!
//! A session's [`SessionHost`](super::host::SessionHost) owns its durable queue and hands its
//! conversations one message at a time, so the actors below it (a Conversation's queue, the
//! Scheduler's) never see more than the host admitted and never have to refuse: a refusal is
//! decided here, before anything is stored, and travels as an `Overloaded` error.

use troupe_actors::SessionConfig;
use troupe_proto::AgentError;

/// The bounds a session's host admits messages within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Tasks running at once per session (the scheduler's limit).
    pub running: usize,
    /// Conversations with work that may wait for a scheduler slot beyond those running.
    pub task_queue: usize,
    /// Messages that may wait behind a conversation's running message.
    pub conversation_queue: usize,
}

impl QueueLimits {
    pub fn of(config: &SessionConfig) -> Self {
        Self {
            running: config.scheduler.limit.max(1),
            task_queue: config.scheduler.queue_capacity,
            conversation_queue: config.conversation.max_queued_messages,
        }
    }

    /// Conversations of a session that may have work at once: each holds or waits for one
    /// scheduler place.
    pub fn busy_conversations(self) -> usize {
        self.running.saturating_add(self.task_queue)
    }
}

/// What happens to an admitted message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// Its conversation is idle: it is stored as `running` and its task starts now.
    RunNow,
    /// Its conversation is busy: it is stored as `queued` and runs after the ones before it.
    Queue,
}

/// Where a session stands when a message arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// The service is shutting down.
    pub draining: bool,
    /// Messages of the conversation that are running or queued.
    pub conversation_pending: usize,
    /// Conversations of the session with a running or queued message.
    pub busy_conversations: usize,
}

/// Whether a message is taken, and how. A message to a busy conversation waits in that
/// conversation's queue (bounded by `conversation_queue`); one to an idle conversation takes a
/// scheduler place, of which a session has `running + task_queue`.
pub fn admit(limits: QueueLimits, load: Load) -> Result<Admitted, AgentError> {
    if load.draining {
        return Err(AgentError::Overloaded {
            resource: "service (shutting down)".into(),
            limit: 0,
        });
    }
    if load.conversation_pending > 0 {
        if load.conversation_pending > limits.conversation_queue {
            return Err(AgentError::Overloaded {
                resource: "conversation message queue".into(),
                limit: u32::try_from(limits.conversation_queue).unwrap_or(u32::MAX),
            });
        }
        return Ok(Admitted::Queue);
    }
    if load.busy_conversations >= limits.busy_conversations() {
        return Err(AgentError::Overloaded {
            resource: "scheduler queue".into(),
            limit: u32::try_from(limits.task_queue).unwrap_or(u32::MAX),
        });
    }
    Ok(Admitted::RunNow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: QueueLimits = QueueLimits {
        running: 1,
        task_queue: 1,
        conversation_queue: 2,
    };

    fn load(conversation_pending: usize, busy_conversations: usize) -> Load {
        Load {
            draining: false,
            conversation_pending,
            busy_conversations,
        }
    }

    fn resource(r: Result<Admitted, AgentError>) -> String {
        match r {
            Err(AgentError::Overloaded { resource, .. }) => resource,
            other => panic!("not overloaded: {other:?}"),
        }
    }

    #[test]
    fn an_idle_conversation_takes_a_scheduler_place() {
        assert_eq!(admit(LIMITS, load(0, 0)), Ok(Admitted::RunNow));
        assert_eq!(admit(LIMITS, load(0, 1)), Ok(Admitted::RunNow));
        assert_eq!(resource(admit(LIMITS, load(0, 2))), "scheduler queue");
    }

    #[test]
    fn a_busy_conversation_queues_behind_its_own_message() {
        assert_eq!(admit(LIMITS, load(1, 2)), Ok(Admitted::Queue));
        assert_eq!(admit(LIMITS, load(2, 2)), Ok(Admitted::Queue));
        assert_eq!(
            resource(admit(LIMITS, load(3, 2))),
            "conversation message queue"
        );
    }

    #[test]
    fn draining_admits_nothing() {
        let draining = Load {
            draining: true,
            ..load(0, 0)
        };
        assert_eq!(resource(admit(LIMITS, draining)), "service (shutting down)");
    }

    proptest! {
        /// Whatever arrives, what is admitted stays within the bounds: no conversation holds
        /// more than one running and `conversation_queue` queued messages, and no more than
        /// `running + task_queue` conversations are busy.
        #[test]
        fn admitted_work_stays_within_the_bounds(
            arrivals in prop::collection::vec(0usize..6, 1..200),
            running in 1usize..3,
            task_queue in 0usize..3,
            conversation_queue in 0usize..3,
        ) {
            let limits = QueueLimits { running, task_queue, conversation_queue };
            let mut pending = [0usize; 6];
            for c in arrivals {
                let busy = pending.iter().filter(|n| **n > 0).count();
                if admit(limits, load(pending[c], busy)).is_ok() {
                    pending[c] += 1;
                }
                let busy = pending.iter().filter(|n| **n > 0).count();
                prop_assert!(busy <= running + task_queue);
                prop_assert!(pending.iter().all(|n| *n <= conversation_queue + 1));
            }
        }
    }
}
