//! Rollout metrics. Labels are bounded: event kinds (`EventKind::name()`), record levels and
//! writer operations, never ids.

use super::RecordLevel;
use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use std::time::Duration;
use troupe_proto::EventName;

pub const EVENTS_EMITTED: &str = "troupe_rollout_events_emitted_total";
pub const EVENTS_UNRECORDED: &str = "troupe_rollout_events_unrecorded_total";
pub const UNREGISTERED_EVENTS: &str = "troupe_rollout_unregistered_events_total";
pub const RECORDS_WRITTEN: &str = "troupe_rollout_records_written_total";
pub const BYTES_WRITTEN: &str = "troupe_rollout_bytes_written_total";
pub const FSYNCS: &str = "troupe_rollout_fsyncs_total";
pub const FSYNC_DURATION: &str = "troupe_rollout_fsync_duration_seconds";
pub const BATCH_SIZE: &str = "troupe_rollout_write_batch_size";
pub const WRITE_ERRORS: &str = "troupe_rollout_write_errors_total";
pub const UNREADABLE_LINES: &str = "troupe_rollout_unreadable_lines_total";
pub const SUBSCRIBER_LAGGED: &str = "troupe_rollout_subscriber_lagged_events_total";
pub const EVENTS_WITHHELD: &str = "troupe_rollout_events_withheld_total";
pub const PUBLISH_DELAY: &str = "troupe_rollout_publish_delay_seconds";
/// Events whose Rollout had stopped, kept for the one that replaces it.
pub const EVENTS_PARKED: &str = "troupe_rollout_events_parked_total";
/// Events dropped because no Rollout would take them.
pub const EVENTS_LOST: &str = "troupe_rollout_events_lost_total";
/// One group commit of the writer, whatever the storage, by whether it synced.
pub const FLUSH_DURATION: &str = "troupe_rollout_flush_duration_seconds";
/// Threads of the shared writer pool (constant once started).
pub const WRITER_THREADS: &str = "troupe_rollout_writer_threads";
/// Sessions whose rollout is attached to a writer of the pool now.
pub const WRITERS_ATTACHED: &str = "troupe_rollout_writers_attached";

/// What the file storage was doing when an I/O error struck (its `op` labels; other storages
/// name their own, see `SinkError::op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOp {
    CreateDir,
    Open,
    Encode,
    Append,
    Flush,
    Sync,
    /// Taking the session's Ttl lock or writing its index.
    Ttl,
    HighWater,
}

impl WriteOp {
    pub const ALL: [Self; 8] = [
        Self::CreateDir,
        Self::Open,
        Self::Encode,
        Self::Append,
        Self::Flush,
        Self::Sync,
        Self::Ttl,
        Self::HighWater,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::CreateDir => "create_dir",
            Self::Open => "open",
            Self::Encode => "encode",
            Self::Append => "append",
            Self::Flush => "flush",
            Self::Sync => "sync",
            Self::Ttl => "ttl",
            Self::HighWater => "high_water",
        }
    }
}

/// Registers descriptions (every exported metric needs one).
pub fn describe() {
    describe_counter!(
        EVENTS_EMITTED,
        Unit::Count,
        "Events numbered and published by the rollout, by kind."
    );
    describe_counter!(
        EVENTS_UNRECORDED,
        Unit::Count,
        "Events published but not recorded because the storage policy keeps nothing of them, by kind."
    );
    describe_counter!(
        UNREGISTERED_EVENTS,
        Unit::Count,
        "Events of conversations with no registered storage policy (recorded as policy none)."
    );
    describe_counter!(
        RECORDS_WRITTEN,
        Unit::Count,
        "Rollout records appended to storage, by level."
    );
    describe_counter!(
        BYTES_WRITTEN,
        Unit::Bytes,
        "Bytes of rollout records appended to storage (their encoded form)."
    );
    describe_counter!(
        FSYNCS,
        Unit::Count,
        "fsync calls made by the rollout writer."
    );
    describe_histogram!(
        FSYNC_DURATION,
        Unit::Seconds,
        "Time spent in one fsync of a rollout file."
    );
    describe_histogram!(
        BATCH_SIZE,
        Unit::Count,
        "Commands handled by the rollout writer in one group commit."
    );
    describe_counter!(
        WRITE_ERRORS,
        Unit::Count,
        "Storage errors of the rollout writer, by operation."
    );
    describe_counter!(
        EVENTS_WITHHELD,
        Unit::Count,
        "Events not published to live subscribers because the batch that should have recorded them failed, by kind."
    );
    describe_histogram!(
        PUBLISH_DELAY,
        Unit::Seconds,
        "Time from an event's numbering to its publication, after the commit that covers it."
    );
    describe_histogram!(
        FLUSH_DURATION,
        Unit::Seconds,
        "Time of one group commit of the rollout writer (its flush to storage), by sync (true at a sync point a turn's end waits for: fsynced in JSONL files always, in SQLite only with power_loss_durable, on PostgreSQL by the server's WAL flush)."
    );
    describe_counter!(
        UNREADABLE_LINES,
        Unit::Count,
        "Rollout lines skipped on read or sweep because they did not parse (torn writes)."
    );
    describe_counter!(
        SUBSCRIBER_LAGGED,
        Unit::Count,
        "Live events a slow subscriber missed (counted by subscribers)."
    );
    describe_counter!(
        EVENTS_PARKED,
        Unit::Count,
        "Events emitted while the rollout was stopped, handed to the rollout that replaced it."
    );
    describe_counter!(
        EVENTS_LOST,
        Unit::Count,
        "Events dropped because the rollout had stopped and nothing would replace it."
    );
    describe_gauge!(
        WRITER_THREADS,
        Unit::Count,
        "Threads of the rollout writer pool shared by every session (0 until the first session starts)."
    );
    describe_gauge!(
        WRITERS_ATTACHED,
        Unit::Count,
        "Sessions whose rollout is attached to a thread of the writer pool now."
    );
    gauge!(WRITER_THREADS).increment(0.0);
    gauge!(WRITERS_ATTACHED).increment(0.0);
    // Rare: the series exist at 0 so that an increase shows.
    counter!(EVENTS_PARKED).increment(0);
    counter!(EVENTS_LOST).increment(0);
    // Every other series exists from the start too, at 0: a write error's first increment
    // must be visible to `rate()`.
    for kind in EventName::ALL {
        counter!(EVENTS_EMITTED, "kind" => kind.as_str()).increment(0);
        counter!(EVENTS_UNRECORDED, "kind" => kind.as_str()).increment(0);
        counter!(EVENTS_WITHHELD, "kind" => kind.as_str()).increment(0);
    }
    for level in [
        RecordLevel::Full,
        RecordLevel::Headers,
        RecordLevel::Minimal,
    ] {
        counter!(RECORDS_WRITTEN, "level" => level.as_str()).increment(0);
    }
    // `write` is the SQLite storage's name for its appends.
    for op in WriteOp::ALL
        .map(WriteOp::as_str)
        .into_iter()
        .chain(["write"])
    {
        counter!(WRITE_ERRORS, "op" => op).increment(0);
    }
    for sync in ["true", "false"] {
        let _ = histogram!(FLUSH_DURATION, "sync" => sync);
    }
    for name in [
        UNREGISTERED_EVENTS,
        BYTES_WRITTEN,
        FSYNCS,
        UNREADABLE_LINES,
        SUBSCRIBER_LAGGED,
    ] {
        counter!(name).increment(0);
    }
    let _ = histogram!(FSYNC_DURATION);
    let _ = histogram!(BATCH_SIZE);
    let _ = histogram!(PUBLISH_DELAY);
}

pub fn event_emitted(kind: EventName) {
    counter!(EVENTS_EMITTED, "kind" => kind.as_str()).increment(1);
}

pub fn event_unrecorded(kind: EventName) {
    counter!(EVENTS_UNRECORDED, "kind" => kind.as_str()).increment(1);
}

pub fn unregistered_event() {
    counter!(UNREGISTERED_EVENTS).increment(1);
}

pub fn record_written(level: RecordLevel) {
    counter!(RECORDS_WRITTEN, "level" => level.as_str()).increment(1);
}

pub fn bytes_written(bytes: usize) {
    counter!(BYTES_WRITTEN).increment(u64::try_from(bytes).unwrap_or(u64::MAX));
}

pub fn fsynced(took: Duration) {
    counter!(FSYNCS).increment(1);
    histogram!(FSYNC_DURATION).record(took.as_secs_f64());
}

pub fn batch(size: usize) {
    // Precision loss above 2^53 commands is irrelevant for a histogram.
    #[allow(clippy::cast_precision_loss)]
    histogram!(BATCH_SIZE).record(size as f64);
}

/// `op` is `SinkError::op`: a bounded label.
pub fn write_error(op: &'static str) {
    counter!(WRITE_ERRORS, "op" => op).increment(1);
}

pub fn event_withheld(kind: EventName) {
    counter!(EVENTS_WITHHELD, "kind" => kind.as_str()).increment(1);
}

pub fn published(delay: Duration) {
    histogram!(PUBLISH_DELAY).record(delay.as_secs_f64());
}

/// A commit of the writer took `took`; `sync`: a sync point (a task's end, a close, a
/// flush), which its caller waits for and the storage makes as durable as it promises.
pub fn flushed(sync: bool, took: Duration) {
    let sync = if sync { "true" } else { "false" };
    histogram!(FLUSH_DURATION, "sync" => sync).record(took.as_secs_f64());
}

pub fn unreadable_lines(lines: u64) {
    counter!(UNREADABLE_LINES).increment(lines);
}

/// For subscribers: call with the count carried by `RecvError::Lagged`.
pub fn subscriber_lagged(missed: u64) {
    counter!(SUBSCRIBER_LAGGED).increment(missed);
}

pub fn event_parked() {
    counter!(EVENTS_PARKED).increment(1);
}

pub fn event_lost() {
    counter!(EVENTS_LOST).increment(1);
}

pub fn pool_threads(threads: usize) {
    gauge!(WRITER_THREADS).set(threads as f64);
}

pub fn writer_attached() {
    gauge!(WRITERS_ATTACHED).increment(1.0);
}

pub fn writer_detached() {
    gauge!(WRITERS_ATTACHED).decrement(1.0);
}
