//! Scheduler metrics. Labels are closed enums; task and conversation ids go to traces only.

use crossbeam_skiplist::SkipSet;
use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::time::Instant;

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
/// How long the request that has waited longest for a slot has waited, in seconds: the
/// maximum over the sessions of this process (0 when none waits). A sum of waiting requests
/// hides one stuck session among busy ones; this does not.
pub const OLDEST_WAIT_SECONDS: &str = "troupe_scheduler_oldest_wait_seconds";
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
    describe_gauge!(
        OLDEST_WAIT_SECONDS,
        Unit::Seconds,
        "How long the request that has waited longest for a scheduler slot has waited, in any session (0 when none waits)"
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
    gauge!(OLDEST_WAIT_SECONDS).set(0.0);
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

/// Since when each scheduler's oldest request has waited: only the schedulers that have
/// a waiting request are on it.
///
/// Shared by the schedulers of the process, because this is telemetry, not state: no decision
/// reads it, as none reads the recorder's gauges that every actor writes. The oldest wait is a
/// maximum over the sessions, which cannot be added up from each scheduler's deltas as
/// `Occupancy`'s sums are, so each scheduler leaves its oldest waiter's enqueue time here and
/// the maximum is taken when the metrics are read ([`publish_oldest_wait`], called by
/// `/metrics`). Read, not on a timer: a request ages without any event in its scheduler, so
/// the value has to be computed when it is read anyway; computing it only then costs nothing
/// between scrapes and is never stale, where a timer would wake every few seconds and still
/// lag by as much.
///
/// A lock-free ordered set (no lock: the actors share nothing they would wait on): entries
/// are `(enqueue time, scheduler)`, so the oldest wait is the first entry, whatever the
/// number of waiting schedulers. A scheduler whose oldest waiter changes adds its new entry
/// before it removes its old one, so a reader never misses a scheduler that waits.
#[derive(Debug, Default)]
pub struct WaitBoard {
    /// Each waiting scheduler's oldest enqueue time, with the key its [`OldestWait`] holds.
    since: SkipSet<(Instant, u64)>,
    /// The next key to hand out.
    next_key: AtomicU64,
}

impl WaitBoard {
    /// The board of this process, read by [`publish_oldest_wait`].
    pub fn process() -> Arc<Self> {
        static PROCESS: LazyLock<Arc<WaitBoard>> = LazyLock::new(Arc::default);
        PROCESS.clone()
    }

    /// A place on the board for one scheduler.
    pub fn join(self: &Arc<Self>) -> OldestWait {
        OldestWait {
            board: self.clone(),
            key: self.next_key.fetch_add(1, Ordering::Relaxed),
            published: None,
        }
    }

    /// The longest wait on the board at `now`.
    pub fn oldest_wait(&self, now: Instant) -> Duration {
        longest_wait(now, self.since.front().map(|entry| entry.value().0))
    }

    /// Moves scheduler `key`'s entry from `was` to `now`.
    fn replace(&self, key: u64, was: Option<Instant>, now: Option<Instant>) {
        if let Some(t) = now {
            self.since.insert((t, key));
        }
        if let Some(t) = was {
            self.since.remove(&(t, key));
        }
    }
}

/// The longest of the waits that began at `since`, at `now` (zero when there is none).
pub fn longest_wait(now: Instant, since: impl IntoIterator<Item = Instant>) -> Duration {
    since
        .into_iter()
        .map(|t| now.saturating_duration_since(t))
        .max()
        .unwrap_or_default()
}

/// Sets the oldest-wait gauge from this process's board: called right before the metrics
/// are rendered.
pub fn publish_oldest_wait() {
    let waited = WaitBoard::process().oldest_wait(Instant::now());
    gauge!(OLDEST_WAIT_SECONDS).set(waited.as_secs_f64());
}

/// One scheduler's place on a [`WaitBoard`]: since when its oldest request has waited.
#[derive(Debug)]
pub struct OldestWait {
    board: Arc<WaitBoard>,
    key: u64,
    /// What is on the board now: the entry to remove when it changes (an unchanged value
    /// touches nothing).
    published: Option<Instant>,
}

impl OldestWait {
    /// Puts `since` (the enqueue time of the scheduler's oldest waiting request, `None` when
    /// none waits) on the board.
    pub fn publish(&mut self, since: Option<Instant>) {
        if since != self.published {
            self.board.replace(self.key, self.published, since);
            self.published = since;
        }
    }
}

impl Drop for OldestWait {
    /// A scheduler that fails runs no `post_stop`: its waiters leave the board with its state.
    fn drop(&mut self) {
        self.publish(None);
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
    fn the_longest_wait_is_the_oldest_one_and_zero_without_any() {
        // Far enough from the clock's origin that every `ago` exists.
        let now = Instant::now() + Duration::from_secs(1000);
        let ago = |s| now - Duration::from_secs(s);
        assert_eq!(longest_wait(now, []), Duration::ZERO);
        assert_eq!(
            longest_wait(now, [ago(5), ago(700), ago(30)]),
            Duration::from_secs(700)
        );
        // A time after `now` (read by another thread a moment later) is no wait, not a panic.
        assert_eq!(
            longest_wait(now, [now + Duration::from_secs(1)]),
            Duration::ZERO
        );
    }

    /// The board holds each scheduler's oldest waiter: the maximum is over the schedulers,
    /// one that stops waiting or is dropped (a failed scheduler) leaves it.
    #[test]
    fn the_board_keeps_the_oldest_wait_of_any_scheduler() {
        let board = Arc::new(WaitBoard::default());
        // Far enough from the clock's origin that every `ago` exists.
        let now = Instant::now() + Duration::from_secs(1000);
        let ago = |s| now - Duration::from_secs(s);
        let (mut busy, mut stuck) = (board.join(), board.join());
        busy.publish(Some(ago(2)));
        stuck.publish(Some(ago(900)));
        assert_eq!(board.oldest_wait(now), Duration::from_secs(900));
        stuck.publish(None);
        assert_eq!(board.oldest_wait(now), Duration::from_secs(2));
        stuck.publish(Some(ago(60)));
        drop(stuck);
        assert_eq!(board.oldest_wait(now), Duration::from_secs(2));
        busy.publish(None);
        assert_eq!(board.oldest_wait(now), Duration::ZERO);
        // Two schedulers whose oldest requests came at the same instant are two entries:
        // one withdrawing leaves the other's.
        let (mut one, mut other) = (board.join(), board.join());
        one.publish(Some(ago(40)));
        other.publish(Some(ago(40)));
        one.publish(None);
        assert_eq!(board.oldest_wait(now), Duration::from_secs(40));
        // Moving to a later waiter replaces the entry, it does not add one.
        other.publish(Some(ago(10)));
        assert_eq!(board.oldest_wait(now), Duration::from_secs(10));
        assert_eq!(board.since.len(), 1);
    }

    /// A scheduler whose oldest waiter changes is on the board all along: a reader on
    /// another thread never finds the board empty while it waits.
    #[test]
    fn a_scheduler_moving_its_entry_is_never_missed() {
        let board = Arc::new(WaitBoard::default());
        let now = Instant::now() + Duration::from_secs(1000);
        let ago = move |s| now - Duration::from_secs(s);
        let mut waiting = board.join();
        waiting.publish(Some(ago(9)));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mover = {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !done.load(Ordering::Relaxed) {
                    waiting.publish(Some(ago(1 + i % 2)));
                    i += 1;
                }
            })
        };
        for _ in 0..200_000 {
            assert!(
                board.oldest_wait(now) > Duration::ZERO,
                "the board was empty"
            );
        }
        done.store(true, Ordering::Relaxed);
        mover.join().unwrap();
    }

    #[test]
    fn the_oldest_wait_reads_zero_from_the_start() {
        let gauges = crate::gauge_test::gauges_after(describe);
        assert!(
            gauges.contains(&(OLDEST_WAIT_SECONDS.to_owned(), 0.0)),
            "{gauges:?}"
        );
    }

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
