//! [`SqliteRolloutStorage`]: the Rollout's record in the service's SQLite file.
//!
//! Table `rollout_events` keeps one row per record, keyed `(session_id, seq)`, with the
//! columns the reads filter on and the whole [`RolloutRecord`] as JSON; `rollout_high_water`
//! keeps each session's last committed high-water mark, written only by a commit whose batch
//! does not itself record that `seq` (a session's `last_seq` is the greater of the two, and
//! no record is ever deleted).
//!
//! # Threads
//! Sinks (one per Rollout incarnation, on the Rollout's writer thread) buffer appended records
//! and commit them at `commit`. One connection writes. A sink that finds nothing queued for
//! this storage's writer thread and the connection free commits its batch itself, on its own
//! thread, in a transaction of its own: handing it over would cost two thread wake-ups (the
//! writer's, then the sink's on the answer), each longer than the commit, on the cores the
//! turn and the model server need. Otherwise it hands the batch to the writer thread and blocks
//! until it is committed; the writer group-commits what the sinks of every session queued
//! meanwhile, each batch in a savepoint of its own (a lone batch in none).
//! `synchronous = NORMAL` makes every commit survive a crash of the process (it is in the WAL
//! when `COMMIT` returns). A batch that asks for `sync` (a task's end, a flush) is committed
//! the same way by default, as the store's writes in `troupe.db` are: no fsync, so a power
//! loss (or a crash of the machine) may lose the last commits of both files. Opened
//! power-loss durable ([`SqliteRolloutStorage::open_with`], `[store] power_loss_durable`), a
//! `sync` batch is committed under `synchronous = FULL`, which fsyncs the WAL before `COMMIT`
//! returns. Reads take a connection from a small pool on the caller's (blocking) thread; a
//! checkpointer thread copies the WAL into the database in the background.
//!
//! # Restore window (S6)
//! [`RolloutStorage::read_conversation_window`] decodes only a restore's window: the
//! conversation's newest `history_checkpoint` row that kept its event, found by walking the
//! `(session_id, conversation_id, seq)` index backwards from the newest row; then, backwards
//! from there, the `task_started` row of the task the checkpoint names; then the rows from
//! that `seq` on. The walks stop at the first match, so they cover the window's rows and no
//! more; only the rows returned are decoded. [`SqliteRolloutStorage::records_read`] counts the
//! records every read decodes.
//!
//! # Ttl
//! A `Full` record written under a `Ttl` policy keeps its expiry in the `expires_ms` column
//! (indexed over the rows that have one). [`RolloutStorage::sweep_due`] runs on the writer
//! thread between sink batches: it rewrites every due row as its headers
//! ([`troupe_actors::rollout::downgrade`]; a row whose JSON does not parse is rebuilt from its
//! columns) in one transaction, then truncates the WAL; `secure_delete` zeroes the space the
//! old rows leave, so the old content is in no file of the database.

use super::conn::{self, Checkpointer, ReaderPool, Role as ConnRole, internal, to_sql_int};
use super::metrics::{self, Op, RecordsRead, Writer};
use super::schema;
use crate::answer::{Answerer, answer};
use crossbeam_channel::{Receiver, Sender};
use rusqlite::{Connection, TransactionBehavior, params};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use troupe_actors::rollout::storage::SweepReport;
use troupe_actors::rollout::storage::{RolloutSink, RolloutStorage, SinkError};
use troupe_actors::rollout::{RecordLevel, RecordMeta};
use troupe_actors::rollout::{RolloutRecord, downgrade};
use troupe_proto::{AgentError, ConversationId, EventName, SessionId, TaskId};

/// Sink batches committed in one transaction at most.
const MAX_BATCH: usize = 256;
/// Batches waiting for the writer thread before sinks block.
const QUEUE_CAPACITY: usize = 1024;
/// Reader connections.
const READERS: usize = 2;
/// Due rows a sweep reads into memory at once.
const SWEEP_CHUNK: i64 = 512;

/// Rollout records in SQLite. Cheap to clone; clones share the writer thread.
#[derive(Clone)]
pub struct SqliteRolloutStorage {
    writer: Sender<Job>,
    /// The writing connection and what its commits promise, shared by the writer thread and
    /// the sinks' fast path.
    write: Arc<WriteSide>,
    readers: Arc<ReaderPool>,
    /// Runs while any clone is alive.
    _checkpointer: Arc<Checkpointer>,
    /// Sessions whose sink is open (see [`Leases`]).
    leases: Arc<Leases>,
    /// Records decoded by reads, by every clone.
    records_read: Arc<AtomicU64>,
}

/// How long a new sink waits for its predecessor's lease.
pub const LEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Writer leases: at most one open sink per session in this process. A sink of a session opens
/// only once the previous one is dropped, which a killed Rollout's writer does after it
/// committed what it held, so a restarted Rollout never reads `last_seq` (nor hands out `seq`s)
/// while its predecessor still writes.
#[derive(Default)]
pub(crate) struct Leases {
    held: std::sync::Mutex<std::collections::HashSet<SessionId>>,
    freed: std::sync::Condvar,
}

impl Leases {
    pub(crate) fn take(
        &self,
        session_id: SessionId,
        wait: std::time::Duration,
    ) -> Result<(), AgentError> {
        let held = self
            .held
            .lock()
            .map_err(|_| AgentError::internal("rollout leases poisoned"))?;
        let (mut held, timeout) = self
            .freed
            .wait_timeout_while(held, wait, |h| h.contains(&session_id))
            .map_err(|_| AgentError::internal("rollout leases poisoned"))?;
        if timeout.timed_out() && held.contains(&session_id) {
            return Err(AgentError::internal(format!(
                "the rollout of session {session_id} is still written by another sink after {wait:?}"
            )));
        }
        held.insert(session_id);
        Ok(())
    }

    pub(crate) fn release(&self, session_id: SessionId) {
        if let Ok(mut held) = self.held.lock() {
            held.remove(&session_id);
        }
        self.freed.notify_all();
    }
}

/// The rollout's own database file inside the data directory (see
/// [`SqliteRolloutStorage::path_in`]).
pub const ROLLOUT_DB_FILE: &str = "rollout.db";

/// Whether the database at `path` exists and holds rollout records.
fn holds_records(path: &Path) -> Result<bool, AgentError> {
    if !path.exists() {
        return Ok(false);
    }
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| internal(format!("sqlite open {}", path.display()), e))?;
    let has_table: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'rollout_events')",
            [],
            |row| row.get(0),
        )
        .map_err(|e| internal("read schema", e))?;
    if !has_table {
        return Ok(false);
    }
    conn.query_row("SELECT EXISTS (SELECT 1 FROM rollout_events)", [], |row| {
        row.get(0)
    })
    .map_err(|e| internal("read rollout records", e))
}

impl SqliteRolloutStorage {
    /// Opens (creating it if needed) the database at `path` — normally the service store's
    /// file — with connections of its own, and brings the schema up to date. Blocks. Its
    /// commits survive a crash of the process, not a power loss (see the module doc).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, AgentError> {
        Self::open_with(path, false)
    }

    /// [`SqliteRolloutStorage::open`]; with `power_loss_durable`, every commit that asks for
    /// `sync` (a task's end, a flush) fsyncs the WAL before it returns.
    pub fn open_with(path: impl AsRef<Path>, power_loss_durable: bool) -> Result<Self, AgentError> {
        metrics::describe();
        let started = Instant::now();
        let path = path.as_ref();
        let result = Self::open_inner(path, power_loss_durable);
        metrics::observe(Op::Open, started, result.as_ref().err());
        result
    }

    /// Where the service keeps the rollout under `data_dir`: `rollout.db`, a database of its
    /// own so that its writer and the store's never wait for each other's write lock, unless
    /// `troupe.db` already holds rollout records (written before the rollout had its own
    /// file), which are then kept where they are.
    pub fn path_in(data_dir: impl AsRef<Path>) -> Result<PathBuf, AgentError> {
        let dir = data_dir.as_ref();
        let own = dir.join(ROLLOUT_DB_FILE);
        let shared = super::db_path(dir);
        if !own.exists() && holds_records(&shared)? {
            return Ok(shared);
        }
        Ok(own)
    }

    /// Opens `<data_dir>/troupe.db`, creating the directory if needed.
    pub fn open_in(data_dir: impl AsRef<Path>) -> Result<Self, AgentError> {
        let dir = data_dir.as_ref();
        std::fs::create_dir_all(dir)
            .map_err(|e| internal(format!("create {}", dir.display()), e))?;
        Self::open(super::db_path(dir))
    }

    fn open_inner(path: &Path, power_loss_durable: bool) -> Result<Self, AgentError> {
        let mut conn = conn::open(path, ConnRole::Writer)?;
        schema::migrate(&mut conn)?;
        let readers = ReaderPool::open(path, READERS)?;
        let checkpointer = Checkpointer::spawn(path)?;
        let (writer, queue) = crossbeam_channel::bounded(QUEUE_CAPACITY);
        let write = Arc::new(WriteSide {
            conn: Mutex::new(conn),
            power_loss: power_loss_durable,
            synced_commits: AtomicU64::new(0),
            commits: [AtomicU64::new(0), AtomicU64::new(0)],
        });
        let shared = write.clone();
        std::thread::Builder::new()
            .name("troupe-rollout-db".into())
            .spawn(move || writer_loop(&shared, queue))
            .map_err(|e| internal("spawn rollout writer", e))?;
        tracing::info!(path = %path.display(), power_loss_durable, "rollout storage opened");
        Ok(Self {
            writer,
            write,
            readers: Arc::new(readers),
            _checkpointer: Arc::new(checkpointer),
            leases: Arc::new(Leases::default()),
            records_read: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Commits made with an fsync so far (under `synchronous = FULL`), by this storage and its
    /// clones: none unless it was opened power-loss durable.
    pub fn synced_commits(&self) -> u64 {
        self.write.synced_commits.load(Ordering::Relaxed)
    }

    /// Sink batches committed so far on the sinks' own threads (`[0]`) and handed to the
    /// writer thread (`[1]`), by this storage and its clones.
    pub fn commits_by_path(&self) -> [u64; 2] {
        self.write
            .commits
            .each_ref()
            .map(|c| c.load(Ordering::Relaxed))
    }

    /// Holds the writing connection, as a commit in progress would.
    #[cfg(test)]
    pub(crate) fn hold_connection(&self) -> std::sync::MutexGuard<'_, Connection> {
        conn::lock(&self.write.conn)
    }

    /// Records decoded by reads so far, by this storage and its clones.
    pub fn records_read(&self) -> u64 {
        self.records_read.load(Ordering::Relaxed)
    }

    fn count(&self, read: RecordsRead, result: &Result<Vec<RolloutRecord>, AgentError>) {
        if let Ok(records) = result {
            self.records_read
                .fetch_add(records.len() as u64, Ordering::Relaxed);
            metrics::records_read("sqlite", read, records.len());
        }
    }

    /// Runs a read, timed and counted.
    fn read<T>(
        &self,
        op: Op,
        f: impl FnOnce(&Connection) -> Result<T, AgentError>,
    ) -> Result<T, AgentError> {
        let started = Instant::now();
        let result = self.readers.with(f);
        metrics::observe(op, started, result.as_ref().err());
        result
    }
}

impl RolloutStorage for SqliteRolloutStorage {
    fn open_sink(&self, session_id: SessionId) -> Result<Box<dyn RolloutSink>, AgentError> {
        self.leases.take(session_id, LEASE_WAIT)?;
        Ok(Box::new(SqliteRolloutSink {
            session_id,
            session_key: session_id.to_string(),
            pending: Vec::new(),
            writer: self.writer.clone(),
            write: self.write.clone(),
            leases: self.leases.clone(),
        }))
    }

    fn last_seq(&self, session_id: SessionId) -> Result<u64, AgentError> {
        let _span = tracing::debug_span!("rollout_db.last_seq", %session_id).entered();
        self.read(Op::RolloutLastSeq, |c| {
            let key = session_id.to_string();
            let (seq, high_water): (Option<i64>, Option<i64>) = c
                .prepare_cached(
                    "SELECT (SELECT MAX(seq) FROM rollout_events WHERE session_id = ?1),
                            (SELECT high_water FROM rollout_high_water WHERE session_id = ?1)",
                )
                .and_then(|mut st| st.query_row([key], |r| Ok((r.get(0)?, r.get(1)?))))
                .map_err(|e| internal(format!("rollout last seq of {session_id}"), e))?;
            let seq = seq.unwrap_or(0).max(high_water.unwrap_or(0));
            u64::try_from(seq)
                .map_err(|e| internal(format!("corrupt rollout seq of session {session_id}"), e))
        })
    }

    fn read_conversation(
        &self,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let _span =
            tracing::debug_span!("rollout_db.read_conversation", %session_id, %conversation_id)
                .entered();
        let result = self.read(Op::RolloutReadConversation, |c| {
            read_records(
                c,
                session_id,
                "SELECT seq, record FROM rollout_events
                 WHERE session_id = ?1 AND conversation_id = ?2 ORDER BY seq",
                params![session_id.to_string(), conversation_id.to_string()],
            )
        });
        self.count(RecordsRead::Conversation, &result);
        result
    }

    fn read_conversation_window(
        &self,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let _span =
            tracing::debug_span!("rollout_db.read_conversation_window", %session_id, %conversation_id)
                .entered();
        let result = self.read(Op::RolloutReadConversation, |c| {
            let (session, conversation) = (session_id.to_string(), conversation_id.to_string());
            let from = window_seq(c, session_id, &session, &conversation)?;
            read_records(
                c,
                session_id,
                "SELECT seq, record FROM rollout_events
                 WHERE session_id = ?1 AND conversation_id = ?2 AND seq >= ?3 ORDER BY seq",
                params![session, conversation, from],
            )
        });
        self.count(RecordsRead::Window, &result);
        result
    }

    fn read_after(
        &self,
        session_id: SessionId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let _span =
            tracing::debug_span!("rollout_db.read_after", %session_id, after_seq, limit).entered();
        // Past i64::MAX there is nothing; clamping keeps the comparison exact below that.
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let result = self.read(Op::RolloutReadAfter, |c| {
            read_records(
                c,
                session_id,
                "SELECT seq, record FROM rollout_events
                 WHERE session_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
                params![session_id.to_string(), after, limit],
            )
        });
        self.count(RecordsRead::After, &result);
        result
    }

    fn sweep_due(&self, now_ms: u64) -> Result<SweepReport, AgentError> {
        let _span = tracing::debug_span!("rollout_db.sweep_due", now_ms).entered();
        let started = Instant::now();
        let (reply, answer) = crossbeam_channel::bounded(1);
        let job = Job::Sweep {
            // A time past every representable one makes everything due.
            now_ms: i64::try_from(now_ms).unwrap_or(i64::MAX),
            reply,
        };
        let result = match self.writer.send(job) {
            Ok(()) => answer.recv().unwrap_or_else(|_| {
                Err(AgentError::internal(
                    "rollout writer stopped before the sweep",
                ))
            }),
            Err(_) => Err(AgentError::internal("rollout writer stopped")),
        };
        metrics::observe(Op::RolloutSweep, started, result.as_ref().err());
        result.map(|downgraded| SweepReport {
            downgraded,
            failures: 0,
        })
    }
}

/// The first `seq` of a restore's window (see the module doc): the start of the task the
/// newest kept checkpoint names, that checkpoint when it names none, 0 without one.
fn window_seq(
    c: &Connection,
    session_id: SessionId,
    session: &str,
    conversation: &str,
) -> Result<i64, AgentError> {
    use rusqlite::OptionalExtension;
    let what = || format!("rollout window of session {session_id}");
    // The newest checkpoint that kept its event (a swept one keeps it without its summary;
    // one swept before that kept nothing and does not count), walking back from the newest
    // (64 at most: past that, the whole record).
    let mut st = c
        .prepare_cached(
            "SELECT seq, record FROM rollout_events
             WHERE session_id = ?1 AND conversation_id = ?2
               AND kind = 'history_checkpoint'
             ORDER BY seq DESC LIMIT 64",
        )
        .map_err(|e| internal(what(), e))?;
    let mut rows = st
        .query(params![session, conversation])
        .map_err(|e| internal(what(), e))?;
    let mut found = None;
    while let Some(row) = rows.next().map_err(|e| internal(what(), e))? {
        let at: i64 = row.get(0).map_err(|e| internal(what(), e))?;
        let text: String = row.get(1).map_err(|e| internal(what(), e))?;
        if let Some(from_task) = checkpoint_row(session_id, at, &text)? {
            found = Some((at, from_task));
            break;
        }
    }
    drop(rows);
    let Some((at, from_task)) = found else {
        return Ok(0);
    };
    let Some(task) = from_task else {
        return Ok(at);
    };
    let start: Option<i64> = c
        .prepare_cached(
            "SELECT seq FROM rollout_events
             WHERE session_id = ?1 AND conversation_id = ?2 AND seq < ?3
               AND kind = 'task_started' AND task_id = ?4
             ORDER BY seq DESC LIMIT 1",
        )
        .and_then(|mut st| {
            st.query_row(params![session, conversation, at, task.to_string()], |r| {
                r.get(0)
            })
            .optional()
        })
        .map_err(|e| internal(what(), e))?;
    Ok(start.unwrap_or(0))
}

/// What the `history_checkpoint` row `at` says of a restore's window: the task it names (or
/// none), or `None` when it kept no event (swept before swept checkpoints kept theirs).
pub(crate) fn checkpoint_row(
    session_id: SessionId,
    at: i64,
    text: &str,
) -> Result<Option<Option<TaskId>>, AgentError> {
    let record: RolloutRecord = serde_json::from_str(text).map_err(|e| {
        AgentError::internal(format!(
            "corrupt rollout_events row (session {session_id}, seq {at}): {e}"
        ))
    })?;
    Ok(match record.event {
        Some(troupe_proto::EventKind::HistoryCheckpoint { from_task, .. }) => Some(from_task),
        _ => None,
    })
}

pub(crate) fn read_records(
    c: &Connection,
    session_id: SessionId,
    query: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<RolloutRecord>, AgentError> {
    let what = || format!("rollout read of session {session_id}");
    let mut st = c.prepare_cached(query).map_err(|e| internal(what(), e))?;
    let mut rows = st.query(params).map_err(|e| internal(what(), e))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(|e| internal(what(), e))? {
        let seq: i64 = row.get(0).map_err(|e| internal(what(), e))?;
        let corrupt = |e: &dyn std::fmt::Display| {
            AgentError::internal(format!(
                "corrupt rollout_events row (session {session_id}, seq {seq}): {e}"
            ))
        };
        let text: String = row.get(1).map_err(|e| corrupt(&e))?;
        let record: RolloutRecord = serde_json::from_str(&text).map_err(|e| corrupt(&e))?;
        if i64::try_from(record.seq).ok() != Some(seq) {
            return Err(corrupt(&format!("record says seq {}", record.seq)));
        }
        out.push(record);
    }
    Ok(out)
}

/// One session's writing side: buffers records until `commit`.
struct SqliteRolloutSink {
    session_id: SessionId,
    session_key: String,
    pending: Vec<Row>,
    writer: Sender<Job>,
    write: Arc<WriteSide>,
    /// Released when the sink is dropped.
    leases: Arc<Leases>,
}

impl Drop for SqliteRolloutSink {
    fn drop(&mut self) {
        self.leases.release(self.session_id);
    }
}

/// A record ready for its insert.
struct Row {
    seq: i64,
    conversation_id: Option<String>,
    task_id: Option<String>,
    kind: String,
    ts_ms: i64,
    level: &'static str,
    record: String,
    /// Ttl content: when it is due.
    expires_ms: Option<i64>,
}

impl SqliteRolloutSink {
    /// Commits `work` (with every pending record): here when the writer thread has nothing
    /// queued and the connection is free (see the module doc), else by handing it to the
    /// writer thread and waiting for its commit.
    fn submit(&mut self, op: Op, work: Work, sync: bool) -> Result<(), SinkError> {
        let started = Instant::now();
        let (reply, answer) = answer(Err(SinkError::new("write", "rollout writer stopped")));
        let job = SinkJob {
            session_key: self.session_key.clone(),
            rows: std::mem::take(&mut self.pending),
            work,
            sync,
            reply,
            enqueued: started,
        };
        let here = if self.writer.is_empty() {
            conn::try_lock(&self.write.conn)
        } else {
            None
        };
        let result = if let Some(mut conn) = here {
            metrics::batch(Writer::Rollout, 1, Duration::ZERO);
            let batch = [job];
            let result = self.write.commit(&mut conn, &batch).pop();
            drop(conn);
            self.write.commits[0].fetch_add(1, Ordering::Relaxed);
            result
                .unwrap_or_else(|| Err(SinkError::new("write", "rollout commit without a result")))
        } else {
            // Waits without spinning: the writer's answer often takes a whole fsync.
            match self.writer.send(Job::Sink(job)) {
                Ok(()) => {
                    self.write.commits[1].fetch_add(1, Ordering::Relaxed);
                    answer.wait()
                }
                Err(_) => Err(SinkError::new("write", "rollout writer stopped")),
            }
        };
        let err = result
            .as_ref()
            .err()
            .map(|e| AgentError::internal(e.to_string()));
        metrics::observe(op, started, err.as_ref());
        if let Err(e) = &result {
            tracing::warn!(session_id = %self.session_id, error = %e, "rollout storage write failed");
        }
        result
    }
}

impl RolloutSink for SqliteRolloutSink {
    fn append(
        &mut self,
        conversation_id: Option<ConversationId>,
        record: &RolloutRecord,
    ) -> Result<(), SinkError> {
        let int =
            |field: &str, v: u64| to_sql_int(field, v).map_err(|e| SinkError::new("encode", e));
        let row = Row {
            seq: int("seq", record.seq)?,
            conversation_id: conversation_id.map(|c| c.to_string()),
            task_id: record.task_id.map(|t| t.to_string()),
            kind: record.kind.as_str().to_owned(),
            ts_ms: int("ts_ms", record.ts_ms)?,
            level: record.level.as_str(),
            record: serde_json::to_string(record).map_err(|e| SinkError::new("encode", e))?,
            expires_ms: match (record.level, record.meta.expires_ms) {
                // Past i64::MAX is never due, and neither is i64::MAX in practice.
                (RecordLevel::Full, Some(ms)) => Some(i64::try_from(ms).unwrap_or(i64::MAX)),
                _ => None,
            },
        };
        troupe_actors::rollout::metrics::bytes_written(row.record.len());
        self.pending.push(row);
        Ok(())
    }

    fn commit(&mut self, sync: bool, high_water: u64) -> Result<(), SinkError> {
        let _span = tracing::debug_span!("rollout_db.commit", session_id = %self.session_id, sync, high_water).entered();
        let high_water =
            to_sql_int("high_water", high_water).map_err(|e| SinkError::new("encode", e))?;
        self.submit(Op::RolloutCommit, Work::HighWater(high_water), sync)
    }

    fn forget(&mut self, conversation_id: ConversationId) -> Result<(), SinkError> {
        // Nothing is held per conversation; what is pending is written so that nothing of the
        // conversation is left only in memory.
        let _span = tracing::debug_span!("rollout_db.forget", session_id = %self.session_id, %conversation_id).entered();
        if self.pending.is_empty() {
            return Ok(());
        }
        self.submit(Op::RolloutForget, Work::Nothing, false)
    }

    fn abandon(self: Box<Self>) {
        self.leases.release(self.session_id);
        std::mem::forget(self);
    }
}

// ---- the writer thread ----

/// What the writer thread is asked to do.
enum Job {
    Sink(SinkJob),
    /// The Ttl sweep; answered with the number of records downgraded, once the WAL holds none
    /// of their old content.
    Sweep {
        now_ms: i64,
        reply: Sender<Result<u64, AgentError>>,
    },
}

/// One sink's batch, as queued for the writer.
struct SinkJob {
    session_key: String,
    /// Inserted first, then `work` runs.
    rows: Vec<Row>,
    work: Work,
    /// A sync point: committed under `synchronous = FULL` when the storage is power-loss
    /// durable.
    sync: bool,
    reply: Answerer<Result<(), SinkError>>,
    enqueued: Instant,
}

enum Work {
    Nothing,
    HighWater(i64),
}

/// The writing connection, whether `sync` batches fsync, and how many commits did what.
struct WriteSide {
    conn: Mutex<Connection>,
    power_loss: bool,
    /// Commits made under `synchronous = FULL` (an fsync each).
    synced_commits: AtomicU64,
    /// Sink batches committed on a sink's thread (`[0]`) and handed to the writer thread
    /// (`[1]`).
    commits: [AtomicU64; 2],
}

impl WriteSide {
    /// Commits `batch` in one transaction on `conn` (held), fsynced when the storage is
    /// power-loss durable and a batch asks for a sync; one result per batch.
    fn commit(&self, conn: &mut Connection, batch: &[SinkJob]) -> Vec<Result<(), SinkError>> {
        let sync = self.power_loss && batch.iter().any(|j| j.sync);
        let results = commit_batch(conn, batch, sync);
        if sync {
            self.synced_commits.fetch_add(1, Ordering::Relaxed);
        }
        results
    }
}

fn writer_loop(write: &WriteSide, queue: Receiver<Job>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut sweeps = Vec::new();
    // A sweep changed rows whose old pages may still be in the WAL: later sweeps retry the
    // truncation until one succeeds.
    let mut wal_holds_dropped = false;
    while let Ok(first) = queue.recv() {
        let mut next = Some(first);
        while let Some(job) = next.take() {
            match job {
                Job::Sink(job) => batch.push(job),
                Job::Sweep { now_ms, reply } => sweeps.push((now_ms, reply)),
            }
            if batch.len() < MAX_BATCH {
                next = queue.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            let oldest_wait = batch
                .first()
                .map(|j| j.enqueued.elapsed())
                .unwrap_or_default();
            metrics::batch(Writer::Rollout, batch.len(), oldest_wait);
            let mut conn = conn::lock(&write.conn);
            let results = write.commit(&mut conn, &batch);
            drop(conn);
            for (job, result) in batch.drain(..).zip(results) {
                job.reply.send(result);
            }
        }
        for (now_ms, reply) in sweeps.drain(..) {
            let mut conn = conn::lock(&write.conn);
            let result = sweep_due(&mut conn, now_ms).and_then(|downgraded| {
                wal_holds_dropped |= downgraded > 0;
                if wal_holds_dropped {
                    truncate_after_sweep(&conn)?;
                    wal_holds_dropped = false;
                }
                Ok(downgraded)
            });
            drop(conn);
            if let Err(e) = &result {
                tracing::warn!(error = %e, "rollout ttl sweep failed; the next sweep tries again");
            }
            let _ = reply.send(result);
        }
    }
    tracing::debug!("rollout storage writer stopped");
}

/// Truncates the WAL after a sweep; an error when it could not.
fn truncate_after_sweep(conn: &Connection) -> Result<(), AgentError> {
    match conn::truncate_wal(conn) {
        Ok(true) => Ok(()),
        Ok(false) => Err(AgentError::internal(
            "ttl sweep: the WAL could not be truncated (readers or a checkpoint kept it busy); \
             the next sweep tries again",
        )),
        Err(e) => Err(e),
    }
}

/// Downgrades every record due at `now_ms`, in one transaction; how many.
fn sweep_due(conn: &mut Connection, now_ms: i64) -> Result<u64, AgentError> {
    let what = "rollout ttl sweep";
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| internal(what, e))?;
    let mut downgraded = 0u64;
    loop {
        let due: Vec<DueRow> = {
            let mut st = tx
                .prepare_cached(
                    "SELECT session_id, seq, conversation_id, task_id, kind, ts_ms, record
                     FROM rollout_events WHERE expires_ms <= ?1 LIMIT ?2",
                )
                .map_err(|e| internal(what, e))?;
            let rows = st
                .query_map(params![now_ms, SWEEP_CHUNK], |r| {
                    Ok(DueRow {
                        session_id: r.get(0)?,
                        seq: r.get(1)?,
                        conversation_id: r.get(2)?,
                        task_id: r.get(3)?,
                        kind: r.get(4)?,
                        ts_ms: r.get(5)?,
                        record: r.get(6)?,
                    })
                })
                .map_err(|e| internal(what, e))?;
            rows.collect::<Result<_, _>>()
                .map_err(|e| internal(what, e))?
        };
        if due.is_empty() {
            break;
        }
        let mut update = tx
            .prepare_cached(
                "UPDATE rollout_events SET level = ?3, record = ?4, expires_ms = NULL
                 WHERE session_id = ?1 AND seq = ?2",
            )
            .map_err(|e| internal(what, e))?;
        for row in &due {
            let header = row.headers();
            let text = serde_json::to_string(&header).map_err(|e| internal(what, e))?;
            update
                .execute(params![
                    row.session_id,
                    row.seq,
                    header.level.as_str(),
                    text
                ])
                .map_err(|e| internal(what, e))?;
            downgraded += 1;
        }
    }
    tx.commit().map_err(|e| internal(what, e))?;
    if downgraded > 0 {
        tracing::debug!(downgraded, "rollout ttl sweep");
    }
    Ok(downgraded)
}

/// A due row as a sweep reads it (SQLite's and PostgreSQL's alike).
pub(crate) struct DueRow {
    pub(crate) session_id: String,
    pub(crate) seq: i64,
    pub(crate) conversation_id: Option<String>,
    pub(crate) task_id: Option<String>,
    pub(crate) kind: String,
    pub(crate) ts_ms: i64,
    pub(crate) record: String,
}

impl DueRow {
    /// The row's record as headers. A record that does not parse may still hold content: it
    /// is rebuilt from the columns, which hold none.
    pub(crate) fn headers(&self) -> RolloutRecord {
        match serde_json::from_str::<RolloutRecord>(&self.record) {
            Ok(record) => downgrade(record),
            Err(e) => {
                tracing::warn!(
                    session_id = self.session_id, seq = self.seq, error = %e,
                    "ttl sweep: an unreadable record is replaced by its columns"
                );
                RolloutRecord {
                    seq: u64::try_from(self.seq).unwrap_or(0),
                    ts_ms: u64::try_from(self.ts_ms).unwrap_or(0),
                    conversation_id: self.conversation_id.as_deref().and_then(|c| c.parse().ok()),
                    task_id: self.task_id.as_deref().and_then(|t| t.parse().ok()),
                    kind: EventName::parse(&self.kind).unwrap_or(EventName::Unknown),
                    level: RecordLevel::Headers,
                    event: None,
                    meta: RecordMeta::default(),
                }
            }
        }
    }
}

/// Commits `batch` in one transaction; with `sync`, under `synchronous = FULL` (an fsync).
fn commit_batch(
    conn: &mut Connection,
    batch: &[SinkJob],
    sync: bool,
) -> Vec<Result<(), SinkError>> {
    let fail_all = |e: SinkError| -> Vec<Result<(), SinkError>> {
        batch.iter().map(|_| Err(e.clone())).collect()
    };
    // The setting is read when the transaction commits; set it outside any transaction.
    if sync && let Err(e) = conn::exec_cached(conn, "PRAGMA synchronous = FULL") {
        return fail_all(SinkError::new("sync", e));
    }
    let results = conn::write_batch(conn, batch, apply, |what, e| {
        SinkError::new(
            if sync && what == "commit" {
                "sync"
            } else {
                "write"
            },
            e,
        )
    });
    if sync && let Err(e) = conn::exec_cached(conn, "PRAGMA synchronous = NORMAL") {
        tracing::warn!(error = %e, "rollout storage could not restore synchronous = NORMAL");
    }
    match results {
        Ok(results) => results,
        Err(e) => {
            metrics::error_internal(Op::RolloutCommit);
            tracing::error!(error = %e, batches = batch.len(), "rollout storage commit failed");
            fail_all(e)
        }
    }
}

/// Whether `rows` record a `seq` at or past `high_water`.
fn records_high_water(rows: &[Row], high_water: i64) -> bool {
    rows.iter().any(|r| r.seq >= high_water)
}

/// One sink batch inside the writer's transaction.
fn apply(c: &Connection, job: &SinkJob) -> Result<(), SinkError> {
    if !job.rows.is_empty() {
        let mut st = c
            .prepare_cached(
                "INSERT INTO rollout_events
                     (session_id, seq, conversation_id, task_id, kind, ts_ms, level, record, expires_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .map_err(|e| SinkError::new("write", e))?;
        for row in &job.rows {
            st.execute(params![
                job.session_key,
                row.seq,
                row.conversation_id,
                row.task_id,
                row.kind,
                row.ts_ms,
                row.level,
                row.record,
                row.expires_ms,
            ])
            .map_err(|e| {
                SinkError::new(
                    "write",
                    format!("session {} seq {}: {e}", job.session_key, row.seq),
                )
            })?;
        }
    }
    match &job.work {
        Work::Nothing => Ok(()),
        // A batch that records its high-water mark's `seq` needs no mark: `last_seq` is the
        // greater of the two, and records are never deleted (only downgraded). Saves a page
        // of every commit of a turn, whose events are all recorded.
        Work::HighWater(high_water) if records_high_water(&job.rows, *high_water) => Ok(()),
        Work::HighWater(high_water) => c
            .prepare_cached(
                "INSERT INTO rollout_high_water (session_id, high_water) VALUES (?1, ?2)
                 ON CONFLICT (session_id) DO UPDATE
                 SET high_water = MAX(high_water, excluded.high_water)",
            )
            .and_then(|mut st| st.execute(params![job.session_key, high_water]))
            .map(drop)
            .map_err(|e| SinkError::new("write", e)),
    }
}
