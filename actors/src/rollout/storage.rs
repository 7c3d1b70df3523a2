//! The Rollout's storage port: where its writer thread puts records, and where they are read
//! back (conversation restore, event-stream resume).
//!
//! Two implementations: the JSONL directory of this module's parent (the default, used by
//! `troupe chat`) and SQLite in `troupe-runtime` (used by `troupe serve`, next to the rest of the
//! service's store). The Rollout decides *what* is kept ([`super::record_for`] applies the
//! storage policy before anything reaches a sink); a storage only keeps what it is given.
//!
//! Threading: a [`RolloutSink`] lives on the Rollout's writer thread and is only called from
//! there; [`RolloutStorage`]'s read methods are called from blocking-pool tasks, any number at
//! once. All methods block.

use super::RolloutRecord;
use troupe_proto::{AgentError, ConversationId, SessionId};

/// The durable home of every session's rollout.
pub trait RolloutStorage: Send + Sync + 'static {
    /// Opens the writing side of one session's record. Called once per Rollout incarnation
    /// (a restarted Rollout opens a new sink); the sink is moved to the writer thread.
    fn open_sink(&self, session_id: SessionId) -> Result<Box<dyn RolloutSink>, AgentError>;

    /// The highest `seq` ever assigned in the session, as far as the storage knows: the
    /// greater of the highest recorded `seq` and the last high-water mark committed (numbers
    /// of events that left no record). 0 for a session never written.
    fn last_seq(&self, session_id: SessionId) -> Result<u64, AgentError>;

    /// A conversation's records, in `seq` order. Unknown conversation: empty.
    fn read_conversation(
        &self,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<Vec<RolloutRecord>, AgentError>;

    /// What a restore of a conversation reads (S6): its records from [`super::window_start`]
    /// on, in `seq` order: from the first record of the task its newest `history_checkpoint`
    /// names (or from that checkpoint, when it names none), or every record when it has no
    /// checkpoint that kept its event. A storage that can seek by conversation and `seq` reads
    /// only those; this default reads the whole record and keeps the window.
    fn read_conversation_window(
        &self,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let mut records = self.read_conversation(session_id, conversation_id)?;
        let start = super::window_start(&records);
        records.drain(..start);
        Ok(records)
    }

    /// Up to `limit` of the session's records (session-level and every conversation's) with
    /// `seq > after_seq`, in `seq` order.
    fn read_after(
        &self,
        session_id: SessionId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RolloutRecord>, AgentError>;

    /// The Ttl sweep: downgrades to headers ([`super::downgrade`]) every `Full` record whose
    /// expiry ([`super::RecordMeta::expires_ms`]) is at or before `now_ms`, in every session
    /// the storage holds, whether a sink is open on it or not. Found from what is stored (an
    /// index of expiries), not from anything a Rollout remembers. Each record is downgraded
    /// atomically (a crash leaves it old or new, never torn), sinks open meanwhile lose
    /// nothing, and when this returns the old content can no longer be read back from the
    /// storage's files. Sweeping again changes nothing. A part that could not be swept (one
    /// session's files) is logged and counted in [`SweepReport::failures`], and is tried again
    /// by the next sweep; `Err` when nothing could be swept at all.
    fn sweep_due(&self, now_ms: u64) -> Result<SweepReport, AgentError>;
}

/// What one [`RolloutStorage::sweep_due`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Records downgraded to headers.
    pub downgraded: u64,
    /// Parts left for the next sweep because they failed (logged as they happened).
    pub failures: u64,
}

/// The writing side of one session's record, owned by the writer thread.
pub trait RolloutSink: Send + 'static {
    /// Appends one record: `conversation_id` is `None` for session-level records. May buffer
    /// until [`RolloutSink::commit`].
    fn append(
        &mut self,
        conversation_id: Option<ConversationId>,
        record: &RolloutRecord,
    ) -> Result<(), SinkError>;

    /// Ends a batch. Afterwards everything appended is visible to readers and survives a crash
    /// of this process. `sync` marks a sync point (a task's end, a close, a flush): a storage
    /// that promises power-loss durability makes it survive a power loss too (an fsync: the
    /// JSONL files always; SQLite when opened power-loss durable; PostgreSQL by waiting for the
    /// server's WAL flush). `high_water` is the highest `seq` assigned so far, recorded or not,
    /// and is kept so that numbers are never reused after a restart.
    fn commit(&mut self, sync: bool, high_water: u64) -> Result<(), SinkError>;

    /// The conversation is over: release what the sink holds for it (durably).
    fn forget(&mut self, conversation_id: ConversationId) -> Result<(), SinkError>;

    /// Drops the sink as a crash of the process would: whatever it buffered is lost (no flush
    /// in a destructor), and its session's writer lease is released, as the dying process's
    /// would be. Used to exercise crash recovery; a sink that buffers nothing and holds no
    /// lease is simply dropped.
    fn abandon(self: Box<Self>) {
        drop(self);
    }
}

/// A failed storage operation, as the writer logs, counts and reports it to the next flush.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct SinkError {
    /// What failed, a bounded metric label: `open`, `write`, `sync`, `sweep`, `encode`, ...
    pub op: &'static str,
    pub message: String,
}

impl SinkError {
    pub fn new(op: &'static str, message: impl std::fmt::Display) -> Self {
        Self {
            op,
            message: message.to_string(),
        }
    }
}
