//! `MemoryRolloutStorage`: the Rollout's record kept in memory, for `--ephemeral` runs, which
//! write nothing to disk. It keeps every rule of [`RolloutStorage`] (commit visibility, the
//! high-water mark, the Ttl sweep, one sink per session at a time) except surviving the
//! process: every instance made by [`MemoryRolloutStorage::clone`] shares one record, as
//! reopening a file would.
//!
//! One lock around the whole state: every operation is a few vector or map operations and
//! never blocks while holding it, except `open_sink`, which waits on a condition variable
//! (releasing the lock) while another sink of the same session is open.
//!
//! A restore's window (S6) is found from the newest end of the session's records: the newest
//! `history_checkpoint` of the conversation, then the start of the task it names, so only the
//! window's records are copied out ([`MemoryRolloutStorage::records_read`] counts every record
//! a read copies out).

use super::metrics::{self, RecordsRead};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use troupe_actors::rollout::storage::{RolloutSink, RolloutStorage, SinkError, SweepReport};
use troupe_actors::rollout::{RolloutRecord, downgrade, is_due};
use troupe_proto::{AgentError, ConversationId, EventKind, EventName, SessionId};

/// One session's committed record.
#[derive(Debug, Default)]
struct SessionRecord {
    /// Every committed record, in `seq` order (appends come in `seq` order).
    records: Vec<RolloutRecord>,
    /// The highest `seq` committed as a high-water mark.
    high_water: u64,
}

#[derive(Debug, Default)]
struct Data {
    sessions: HashMap<SessionId, SessionRecord>,
    /// Sessions with an open sink.
    leased: HashSet<SessionId>,
}

#[derive(Debug, Default)]
struct Shared {
    data: Mutex<Data>,
    /// Signalled when a sink is released.
    released: Condvar,
    /// Records copied out by reads.
    records_read: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Data> {
        // A panic while holding the lock leaves whole records behind (every change is one
        // push or one replace), so the data stays usable.
        self.data
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Every session's rollout, in memory.
#[derive(Debug, Clone, Default)]
pub struct MemoryRolloutStorage {
    shared: Arc<Shared>,
}

impl MemoryRolloutStorage {
    pub fn new() -> Self {
        metrics::describe_records_read();
        Self::default()
    }

    /// Records copied out by reads so far, by this instance and its clones.
    pub fn records_read(&self) -> u64 {
        self.shared.records_read.load(Ordering::Relaxed)
    }

    fn count(&self, read: RecordsRead, records: &[RolloutRecord]) {
        self.shared
            .records_read
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        metrics::records_read("memory", read, records.len());
    }
}

impl RolloutStorage for MemoryRolloutStorage {
    fn open_sink(&self, session_id: SessionId) -> Result<Box<dyn RolloutSink>, AgentError> {
        let mut data = self.shared.lock();
        while data.leased.contains(&session_id) {
            data = self
                .shared
                .released
                .wait(data)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        data.leased.insert(session_id);
        Ok(Box::new(MemorySink {
            shared: self.shared.clone(),
            session_id,
            pending: Vec::new(),
        }))
    }

    fn last_seq(&self, session_id: SessionId) -> Result<u64, AgentError> {
        let data = self.shared.lock();
        Ok(data.sessions.get(&session_id).map_or(0, |s| {
            let last = s.records.last().map_or(0, |r| r.seq);
            last.max(s.high_water)
        }))
    }

    fn read_conversation(
        &self,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let records = self.conversation_records(session_id, conversation_id, false);
        self.count(RecordsRead::Conversation, &records);
        Ok(records)
    }

    fn read_conversation_window(
        &self,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let records = self.conversation_records(session_id, conversation_id, true);
        self.count(RecordsRead::Window, &records);
        Ok(records)
    }

    fn read_after(
        &self,
        session_id: SessionId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let data = self.shared.lock();
        let records: Vec<RolloutRecord> = data
            .sessions
            .get(&session_id)
            .map(|s| {
                let start = s.records.partition_point(|r| r.seq <= after_seq);
                s.records[start..].iter().take(limit).cloned().collect()
            })
            .unwrap_or_default();
        drop(data);
        self.count(RecordsRead::After, &records);
        Ok(records)
    }

    fn sweep_due(&self, now_ms: u64) -> Result<SweepReport, AgentError> {
        let mut data = self.shared.lock();
        let mut report = SweepReport::default();
        for session in data.sessions.values_mut() {
            for record in &mut session.records {
                if is_due(record, now_ms) {
                    *record = downgrade(record.clone());
                    report.downgraded += 1;
                }
            }
        }
        Ok(report)
    }
}

/// Where a restore's window of `conversation_id` starts among a session's records (see
/// [`troupe_actors::rollout::window_start`]), searched from the newest end: its newest
/// checkpoint that kept its event, then back to the start of the task that checkpoint names.
/// 0 without one.
impl MemoryRolloutStorage {
    /// A conversation's records of a session: all of them, or (`window`) from its newest
    /// history checkpoint on.
    fn conversation_records(
        &self,
        session_id: SessionId,
        conversation_id: ConversationId,
        window: bool,
    ) -> Vec<RolloutRecord> {
        let data = self.shared.lock();
        data.sessions
            .get(&session_id)
            .map(|s| {
                let start = if window {
                    window_index(&s.records, conversation_id)
                } else {
                    0
                };
                s.records[start..]
                    .iter()
                    .filter(|r| r.conversation_id == Some(conversation_id))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn window_index(records: &[RolloutRecord], conversation_id: ConversationId) -> usize {
    let mine = |r: &RolloutRecord| r.conversation_id == Some(conversation_id);
    let checkpoint =
        records
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, r)| match (&r.event, mine(r)) {
                (Some(EventKind::HistoryCheckpoint { from_task, .. }), true) => {
                    Some((i, *from_task))
                }
                _ => None,
            });
    match checkpoint {
        None => 0,
        Some((at, None)) => at,
        Some((at, Some(task))) => records[..at]
            .iter()
            .rposition(|r| mine(r) && r.task_id == Some(task) && r.kind == EventName::TaskStarted)
            .unwrap_or(0),
    }
}

/// The writing side of one session: appends wait in `pending` until a commit.
struct MemorySink {
    shared: Arc<Shared>,
    session_id: SessionId,
    pending: Vec<RolloutRecord>,
}

impl RolloutSink for MemorySink {
    fn append(
        &mut self,
        _conversation_id: Option<ConversationId>,
        record: &RolloutRecord,
    ) -> Result<(), SinkError> {
        self.pending.push(record.clone());
        Ok(())
    }

    fn commit(&mut self, _sync: bool, high_water: u64) -> Result<(), SinkError> {
        let mut data = self.shared.lock();
        let session = data.sessions.entry(self.session_id).or_default();
        session.records.append(&mut self.pending);
        session.high_water = session.high_water.max(high_water);
        Ok(())
    }

    fn forget(&mut self, _conversation_id: ConversationId) -> Result<(), SinkError> {
        // Nothing is held per conversation.
        Ok(())
    }
}

impl Drop for MemorySink {
    fn drop(&mut self) {
        // What was not committed is lost, as with a crash; the lease is released either way.
        let mut data = self.shared.lock();
        data.leased.remove(&self.session_id);
        drop(data);
        self.shared.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_actors::rollout::conformance::full;

    #[test]
    fn rollout_storage_conformance() {
        let storage = MemoryRolloutStorage::new();
        troupe_actors::rollout::conformance::run_all(&|| Arc::new(storage.clone()));
    }

    #[test]
    fn uncommitted_records_are_not_visible() {
        let storage = MemoryRolloutStorage::new();
        let session = SessionId::new();
        let conversation = ConversationId::new();
        let mut sink = storage.open_sink(session).unwrap();
        sink.append(Some(conversation), &full(1, 1, Some(conversation), "one"))
            .unwrap();
        assert!(
            storage
                .read_conversation(session, conversation)
                .unwrap()
                .is_empty()
        );
        sink.abandon();
        assert_eq!(storage.last_seq(session).unwrap(), 0, "lost with the sink");
    }
}
