//! Scheduler metrics. Labels are closed enums; task and conversation ids go to traces only.

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use std::time::Duration;

/// Time from enqueue to grant, in seconds (0 for an immediate grant).
pub const QUEUE_WAIT_SECONDS: &str = "troupe_scheduler_queue_wait_seconds";
/// Acquire requests, by outcome.
pub const ACQUIRES_TOTAL: &str = "troupe_scheduler_acquires_total";
/// Grants and waiting requests that ended, by how.
pub const RELEASES_TOTAL: &str = "troupe_scheduler_releases_total";
/// Tasks holding a slot now (summed over sessions).
pub const RUNNING: &str = "troupe_scheduler_running";
/// Requests waiting for a slot now (summed over sessions).
pub const WAITING: &str = "troupe_scheduler_waiting";
/// Grants re-declared to a scheduler that replaced a failed one.
pub const REINSTATED_TOTAL: &str = "troupe_scheduler_grants_reinstated_total";
/// Waits of a replacing scheduler for the holders of the old grants, by how they ended.
pub const RECOVERIES_TOTAL: &str = "troupe_scheduler_recoveries_total";

/// Registers the descriptions (a Prometheus exporter rejects undescribed metrics).
pub fn describe() {
    describe_histogram!(
        QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Time a task waited for a scheduler slot"
    );
    describe_counter!(
        ACQUIRES_TOTAL,
        Unit::Count,
        "Scheduler acquire requests, by outcome"
    );
    describe_counter!(
        RELEASES_TOTAL,
        Unit::Count,
        "Scheduler grants or waiting requests that ended, by reason"
    );
    describe_gauge!(RUNNING, Unit::Count, "Tasks holding a scheduler slot");
    describe_gauge!(
        WAITING,
        Unit::Count,
        "Requests waiting for a scheduler slot (the queue depth)"
    );
    describe_counter!(
        REINSTATED_TOTAL,
        Unit::Count,
        "Grants of running tasks re-declared to a scheduler that replaced a failed one"
    );
    describe_counter!(
        RECOVERIES_TOTAL,
        Unit::Count,
        "Waits of a replacing scheduler for the holders of the old grants, by outcome (complete, timed_out)"
    );
    // Restarts are rare: the series exist at 0 so that an increase shows.
    counter!(REINSTATED_TOTAL).increment(0);
    for outcome in RecoveryOutcome::ALL {
        counter!(RECOVERIES_TOTAL, "outcome" => outcome.as_str()).increment(0);
    }
    // The queue is empty and nothing runs until the first task: both read 0, not nothing.
    gauge!(RUNNING).increment(0.0);
    gauge!(WAITING).increment(0.0);
    let _ = histogram!(QUEUE_WAIT_SECONDS);
}

/// How a replacing scheduler's wait for the old grants' holders ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryOutcome {
    /// Every holder answered (or stopped).
    Complete,
    /// `recovery_timeout` ran out first.
    TimedOut,
}

impl RecoveryOutcome {
    pub const ALL: [Self; 2] = [Self::Complete, Self::TimedOut];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::TimedOut => "timed_out",
        }
    }
}

pub fn reinstated() {
    counter!(REINSTATED_TOTAL).increment(1);
}

pub fn recovery(outcome: RecoveryOutcome) {
    counter!(RECOVERIES_TOTAL, "outcome" => outcome.as_str()).increment(1);
}

/// How an `Acquire` was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireOutcome {
    Granted,
    Queued,
    Overloaded,
    /// Duplicate task id, or a holder that had already stopped.
    Rejected,
}

impl AcquireOutcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Granted => "granted",
            Self::Queued => "queued",
            Self::Overloaded => "overloaded",
            Self::Rejected => "rejected",
        }
    }
}

/// Why a grant or a waiting request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReason {
    /// `Release` of a running task.
    Released,
    /// `Release` of a waiting task.
    Withdrawn,
    /// The holder stopped or failed.
    HolderDied,
    /// The caller stopped waiting before its turn (or before the grant reached it).
    CallerGone,
}

impl ReleaseReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::Withdrawn => "withdrawn",
            Self::HolderDied => "holder_died",
            Self::CallerGone => "caller_gone",
        }
    }
}

pub fn acquire(outcome: AcquireOutcome) {
    counter!(ACQUIRES_TOTAL, "outcome" => outcome.as_str()).increment(1);
}

pub fn release(reason: ReleaseReason, n: usize) {
    if n > 0 {
        counter!(RELEASES_TOTAL, "reason" => reason.as_str()).increment(n as u64);
    }
}

pub fn queue_wait(waited: Duration) {
    histogram!(QUEUE_WAIT_SECONDS).record(waited.as_secs_f64());
}

/// Publishes the running/waiting gauges as deltas, so that several sessions' schedulers add
/// up instead of overwriting each other.
#[derive(Debug, Default)]
pub struct Occupancy {
    running: usize,
    waiting: usize,
}

impl Occupancy {
    pub fn publish(&mut self, running: usize, waiting: usize) {
        shift(RUNNING, &mut self.running, running);
        shift(WAITING, &mut self.waiting, waiting);
    }
}

impl Drop for Occupancy {
    /// A scheduler that fails runs no `post_stop`: its share of the gauges goes with its state.
    fn drop(&mut self) {
        self.publish(0, 0);
    }
}

fn shift(name: &'static str, published: &mut usize, now: usize) {
    if now != *published {
        gauge!(name).increment(now as f64 - *published as f64);
        *published = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheduler_whose_state_drops_withdraws_what_it_reported() {
        let mut kept = Occupancy::default();
        let gauges = crate::gauge_test::gauges_after(|| {
            kept.publish(1, 0);
            let mut failed = Occupancy::default();
            failed.publish(2, 3);
            drop(failed);
        });
        assert_eq!(
            gauges,
            [(RUNNING.to_owned(), 1.0), (WAITING.to_owned(), 0.0)]
        );
    }
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[test]
    fn the_restart_series_exist_from_the_start() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            describe();
            recovery(RecoveryOutcome::TimedOut);
        });
        let mut series: Vec<(String, Option<String>, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| [REINSTATED_TOTAL, RECOVERIES_TOTAL].contains(&key.key().name()))
            .map(|(key, _, _, value)| {
                let label = key.key().labels().next().map(|l| l.value().to_owned());
                let DebugValue::Counter(n) = value else {
                    panic!("not a counter")
                };
                (key.key().name().to_owned(), label, n)
            })
            .collect();
        series.sort();
        assert_eq!(
            series,
            vec![
                (REINSTATED_TOTAL.to_owned(), None, 0),
                (RECOVERIES_TOTAL.to_owned(), Some("complete".into()), 0),
                (RECOVERIES_TOTAL.to_owned(), Some("timed_out".into()), 1),
            ]
        );
    }
}
