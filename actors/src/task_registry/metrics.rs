//! TaskRegistry metrics. Labels are closed enums; task and conversation ids go to traces only.

use metrics::{Unit, counter, describe_counter, describe_gauge, gauge};
use troupe_proto::TaskState;

/// Registered tasks now, by state (summed over sessions).
pub const TASKS_LIVE: &str = "troupe_tasks_live";
/// Cancellations requested, by scope.
pub const TASK_CANCELLATIONS_TOTAL: &str = "troupe_task_cancellations_total";
/// Tasks re-declared to a registry that replaced a failed one.
pub const TASKS_REINSTATED_TOTAL: &str = "troupe_tasks_reinstated_total";

/// Registers the descriptions (a Prometheus exporter rejects undescribed metrics).
pub fn describe() {
    describe_gauge!(
        TASKS_LIVE,
        Unit::Count,
        "Registered tasks, by state (queued, running, cancelling)"
    );
    describe_counter!(
        TASK_CANCELLATIONS_TOTAL,
        Unit::Count,
        "Tasks whose cancellation was requested, by scope"
    );
    describe_counter!(
        TASKS_REINSTATED_TOTAL,
        Unit::Count,
        "Running tasks re-declared to a task registry that replaced a failed one"
    );
    // Restarts are rare: the series exists at 0 so that an increase shows.
    counter!(TASKS_REINSTATED_TOTAL).increment(0);
    for scope in CancelScope::ALL {
        counter!(TASK_CANCELLATIONS_TOTAL, "scope" => scope.as_str()).increment(0);
    }
    for state in STATES {
        gauge!(TASKS_LIVE, "state" => state_label(state)).increment(0.0);
    }
}

pub fn reinstated() {
    counter!(TASKS_REINSTATED_TOTAL).increment(1);
}

/// What a cancellation was aimed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelScope {
    /// `Cancel` of one task.
    Task,
    /// `CancelConversation`.
    Conversation,
}

impl CancelScope {
    pub const ALL: [Self; 2] = [Self::Task, Self::Conversation];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Task => "task",
            Self::Conversation => "conversation",
        }
    }
}

/// The metric label of a task state.
pub const fn state_label(state: TaskState) -> &'static str {
    match state {
        TaskState::Queued => "queued",
        TaskState::Running => "running",
        TaskState::Cancelling => "cancelling",
    }
}

/// Every state, in the order of [`StateCounts`].
pub const STATES: [TaskState; 3] = [TaskState::Queued, TaskState::Running, TaskState::Cancelling];

/// Live tasks per state, indexed as [`STATES`].
pub type StateCounts = [usize; 3];

/// The index of a state in [`StateCounts`].
pub const fn state_index(state: TaskState) -> usize {
    match state {
        TaskState::Queued => 0,
        TaskState::Running => 1,
        TaskState::Cancelling => 2,
    }
}

/// Cancellations newly requested (a task already cancelling is not counted again).
pub fn cancelled(scope: CancelScope, n: usize) {
    if n > 0 {
        counter!(TASK_CANCELLATIONS_TOTAL, "scope" => scope.as_str()).increment(n as u64);
    }
}

/// Publishes live-task gauges as deltas, so that several sessions' registries add up instead
/// of overwriting each other.
#[derive(Debug, Default)]
pub struct LiveTasks {
    published: StateCounts,
}

impl LiveTasks {
    pub fn publish(&mut self, now: StateCounts) {
        for state in STATES {
            let i = state_index(state);
            if now[i] != self.published[i] {
                gauge!(TASKS_LIVE, "state" => state_label(state))
                    .increment(now[i] as f64 - self.published[i] as f64);
                self.published[i] = now[i];
            }
        }
    }
}

impl Drop for LiveTasks {
    /// A registry that fails runs no `post_stop`: its share of the gauges goes with its state.
    fn drop(&mut self) {
        self.publish(StateCounts::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registry_whose_state_drops_withdraws_what_it_reported() {
        let mut kept = LiveTasks::default();
        let gauges = crate::gauge_test::gauges_after(|| {
            kept.publish([1, 0, 0]);
            let mut failed = LiveTasks::default();
            failed.publish([2, 1, 1]);
            drop(failed);
        });
        let total: f64 = gauges.iter().map(|(_, v)| v).sum();
        assert_eq!(total, 1.0, "{gauges:?}");
        assert!(gauges.iter().all(|(name, _)| name.starts_with(TASKS_LIVE)));
    }
}
