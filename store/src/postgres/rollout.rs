//! [`PgRolloutStorage`]: the Rollout's record on PostgreSQL, in the tables `rollout_events`
//! and `rollout_high_water` of the store's schema (the SQLite layout: one row per record keyed
//! `(session_id, seq)`, the columns reads filter on, the whole record as JSON).
//!
//! # Threads
//! The storage trait blocks (sinks live on the Rollout's writer thread, reads run on blocking
//! threads), the driver is async: the storage owns a small tokio runtime of its own (one
//! worker, `troupe-pg-rollout`) on which every statement runs, and a caller waits for its
//! result on a channel. It therefore works from any thread, inside a runtime or not.
//!
//! # Commits
//! A sink buffers what it is given; `commit` inserts the batch in one statement (arrays
//! unnested) and raises the session's high-water mark (unless the batch records that `seq`
//! itself), in one transaction. A commit without
//! `sync` sets `synchronous_commit = off` for its transaction: it is durable once the server
//! has it (a crash of this process loses nothing), not yet flushed against a crash of the
//! server; a commit with `sync` waits for the WAL flush. One open sink per session in this
//! process, as on SQLite ([`crate::rollout`]'s writer leases).
//!
//! # Ttl
//! [`RolloutStorage::sweep_due`] rewrites every due row as its headers in one transaction,
//! through the expiry index. As for the store, PostgreSQL keeps old row versions until it
//! vacuums: the content can no longer be read back through the storage, but is not scrubbed
//! from the server's files.

use super::{pg_err, pool, pool_err};
use crate::metrics::{self, Op, PgPool, RecordsRead};
use crate::rollout::{DueRow, LEASE_WAIT, Leases, checkpoint_row};
use deadpool_postgres::Pool;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use troupe_actors::rollout::storage::{RolloutSink, RolloutStorage, SinkError, SweepReport};
use troupe_actors::rollout::{RecordLevel, RolloutRecord};
use troupe_proto::{AgentError, ConversationId, SessionId, TaskId};

/// Connections of the rollout's pool.
const POOL_SIZE: usize = 4;
/// How long a statement waits for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Due rows a sweep reads into memory at once.
const SWEEP_CHUNK: i64 = 512;

/// Rollout records on PostgreSQL. Cheap to clone; clones share the pool and the runtime.
#[derive(Clone)]
pub struct PgRolloutStorage {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    runtime: Driver,
    leases: Leases,
    records_read: AtomicU64,
    /// The node's fences (shared with its store): a commit for a session this node lost is
    /// refused.
    fencing: super::Fencing,
}

/// The runtime the statements run on; shut down without waiting when the last clone goes
/// (which may happen inside another runtime, where a blocking shutdown would panic).
struct Driver(Option<tokio::runtime::Runtime>);

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl PgRolloutStorage {
    /// Connects to `url` and brings the schema up to date. Blocks until the server answered.
    pub fn connect(url: &str) -> Result<Self, AgentError> {
        Self::connect_fenced(url, super::Fencing::default())
    }

    /// [`PgRolloutStorage::connect`] for a node that owns sessions through leases: give it
    /// its store's [`PgStore::fencing`](super::PgStore::fencing), and every commit checks the
    /// session's fence in its transaction.
    pub fn connect_fenced(url: &str, fencing: super::Fencing) -> Result<Self, AgentError> {
        metrics::describe();
        let started = Instant::now();
        let result = Self::connect_inner(url, fencing);
        metrics::observe(Op::Open, started, result.as_ref().err());
        result
    }

    fn connect_inner(url: &str, fencing: super::Fencing) -> Result<Self, AgentError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("troupe-pg-rollout")
            .enable_all()
            .build()
            .map_err(|e| AgentError::internal(format!("postgres rollout runtime: {e}")))?;
        // The pool's timers need a runtime context to be built in.
        let pool = {
            let _entered = runtime.enter();
            pool(url, POOL_SIZE, CONNECT_TIMEOUT)?
        };
        let storage = Self {
            inner: Arc::new(Inner {
                pool,
                runtime: Driver(Some(runtime)),
                leases: Leases::default(),
                records_read: AtomicU64::new(0),
                fencing,
            }),
        };
        let pool = storage.inner.pool.clone();
        storage.run(async move {
            let mut client = pool
                .get()
                .await
                .map_err(|e| pool_err("postgres connection", e))?;
            super::schema::migrate(&mut client).await
        })??;
        tracing::info!("postgres rollout storage opened");
        Ok(storage)
    }

    /// The records of `task_id`'s conversation (`troupe replay`); `None` when no rollout
    /// record names the task. Blocks. One scan of the rollout (no index on task ids), for a
    /// command a person runs now and then.
    pub fn find_task(&self, task_id: TaskId) -> Result<Option<crate::FoundTask>, AgentError> {
        let pool = self.inner.pool.clone();
        let found = self.run(async move {
            let what = format!("rollout search for task {task_id}");
            let client = Self::client(&pool).await?;
            let row = client
                .query_opt(
                    "SELECT session_id, conversation_id FROM rollout_events
                     WHERE task_id = $1 AND conversation_id IS NOT NULL LIMIT 1",
                    &[&task_id.to_string()],
                )
                .await
                .map_err(pg_err(what.clone()))?;
            let Some(row) = row else {
                return Ok(None);
            };
            let corrupt = |e: &dyn std::fmt::Display| AgentError::internal(format!("{what}: {e}"));
            let session: String = row.try_get(0).map_err(|e| corrupt(&e))?;
            let conversation: String = row.try_get(1).map_err(|e| corrupt(&e))?;
            let session_id: SessionId = session.parse().map_err(|e| corrupt(&e))?;
            let conversation_id: ConversationId = conversation.parse().map_err(|e| corrupt(&e))?;
            Ok::<_, AgentError>(Some((session_id, conversation_id)))
        })??;
        let Some((session_id, conversation_id)) = found else {
            return Ok(None);
        };
        let records = self.read_conversation(session_id, conversation_id)?;
        Ok(Some(crate::FoundTask {
            session_id,
            conversation_id,
            records,
            source: "PostgreSQL (rollout_events)".to_owned(),
        }))
    }

    /// Records decoded by reads so far, by this storage and its clones.
    pub fn records_read(&self) -> u64 {
        self.inner.records_read.load(Ordering::Relaxed)
    }

    /// Runs `fut` on the storage's runtime and waits for it.
    fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, AgentError> {
        let Some(rt) = self.inner.runtime.0.as_ref() else {
            return Err(AgentError::internal("postgres rollout runtime stopped"));
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv()
            .map_err(|_| AgentError::internal("postgres rollout runtime stopped"))
    }

    /// A pooled connection (on the storage's runtime).
    async fn client(pool: &Pool) -> Result<deadpool_postgres::Object, AgentError> {
        let client = pool
            .get()
            .await
            .map_err(|e| pool_err("postgres connection", e));
        let s = pool.status();
        metrics::pg_pool(PgPool::Rollout, s.size, s.available, s.max_size);
        client
    }

    /// Runs a read of records on the runtime: timed, its failure and its records counted.
    fn records(
        &self,
        op: Op,
        read: RecordsRead,
        fut: impl Future<Output = Result<Vec<RolloutRecord>, AgentError>> + Send + 'static,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let started = Instant::now();
        let result = self.run(fut).and_then(|r| r);
        metrics::observe(op, started, result.as_ref().err());
        if let Ok(records) = &result {
            self.inner
                .records_read
                .fetch_add(records.len() as u64, Ordering::Relaxed);
            metrics::records_read("postgres", read, records.len());
        }
        result
    }
}

/// Decodes `(seq, record)` rows; a record that does not parse, or says another `seq`, is an
/// error naming its row.
fn decode_records(
    session_id: SessionId,
    rows: &[tokio_postgres::Row],
) -> Result<Vec<RolloutRecord>, AgentError> {
    let what = || format!("rollout read of session {session_id}");
    rows.iter()
        .map(|row| {
            let seq: i64 = row.try_get(0).map_err(pg_err(what()))?;
            let corrupt = |e: &dyn std::fmt::Display| {
                AgentError::internal(format!(
                    "corrupt rollout_events row (session {session_id}, seq {seq}): {e}"
                ))
            };
            let text: &str = row.try_get(1).map_err(|e| corrupt(&e))?;
            let record: RolloutRecord = serde_json::from_str(text).map_err(|e| corrupt(&e))?;
            if i64::try_from(record.seq).ok() != Some(seq) {
                return Err(corrupt(&format!("record says seq {}", record.seq)));
            }
            Ok(record)
        })
        .collect()
}

/// The first `seq` of a restore's window: the start of the task the newest kept checkpoint
/// names, that checkpoint when it names none, 0 without one (as on SQLite).
async fn window_seq(
    client: &impl deadpool_postgres::GenericClient,
    session_id: SessionId,
    session: &str,
    conversation: &str,
) -> Result<i64, AgentError> {
    let what = format!("rollout window of session {session_id}");
    // The newest checkpoint that kept its event (a swept one keeps it without its summary;
    // one swept before that kept nothing and does not count; 64 at most: past that, the
    // whole record).
    let st = client
        .prepare_cached(
            "SELECT seq, record FROM rollout_events
             WHERE session_id = $1 AND conversation_id = $2
               AND kind = 'history_checkpoint'
             ORDER BY seq DESC LIMIT 64",
        )
        .await
        .map_err(pg_err(what.clone()))?;
    let rows = client
        .query(&st, &[&session, &conversation])
        .await
        .map_err(pg_err(what.clone()))?;
    let mut found = None;
    for row in &rows {
        let at: i64 = row.try_get(0).map_err(pg_err(what.clone()))?;
        let text: &str = row.try_get(1).map_err(pg_err(what.clone()))?;
        if let Some(from_task) = checkpoint_row(session_id, at, text)? {
            found = Some((at, from_task));
            break;
        }
    }
    let Some((at, from_task)) = found else {
        return Ok(0);
    };
    let Some(task) = from_task else {
        return Ok(at);
    };
    let st = client
        .prepare_cached(
            "SELECT seq FROM rollout_events
             WHERE session_id = $1 AND conversation_id = $2 AND seq < $3
               AND kind = 'task_started' AND task_id = $4
             ORDER BY seq DESC LIMIT 1",
        )
        .await
        .map_err(pg_err(what.clone()))?;
    let start = client
        .query_opt(&st, &[&session, &conversation, &at, &task.to_string()])
        .await
        .map_err(pg_err(what.clone()))?
        .map(|r| r.try_get::<_, i64>(0))
        .transpose()
        .map_err(pg_err(what))?;
    Ok(start.unwrap_or(0))
}

impl RolloutStorage for PgRolloutStorage {
    fn open_sink(&self, session_id: SessionId) -> Result<Box<dyn RolloutSink>, AgentError> {
        self.inner.leases.take(session_id, LEASE_WAIT)?;
        Ok(Box::new(PgRolloutSink {
            session_id,
            session_key: session_id.to_string(),
            pending: Batch::default(),
            storage: self.clone(),
        }))
    }

    fn last_seq(&self, session_id: SessionId) -> Result<u64, AgentError> {
        let _span = tracing::debug_span!("rollout_db.last_seq", %session_id).entered();
        let started = Instant::now();
        let pool = self.inner.pool.clone();
        let result = self
            .run(async move {
                let what = format!("rollout last seq of {session_id}");
                let client = Self::client(&pool).await?;
                let st = client
                    .prepare_cached(
                        "SELECT (SELECT MAX(seq) FROM rollout_events WHERE session_id = $1),
                                (SELECT high_water FROM rollout_high_water WHERE session_id = $1)",
                    )
                    .await
                    .map_err(pg_err(what.clone()))?;
                let row = client
                    .query_one(&st, &[&session_id.to_string()])
                    .await
                    .map_err(pg_err(what.clone()))?;
                let seq: Option<i64> = row.try_get(0).map_err(pg_err(what.clone()))?;
                let high: Option<i64> = row.try_get(1).map_err(pg_err(what.clone()))?;
                u64::try_from(seq.unwrap_or(0).max(high.unwrap_or(0)))
                    .map_err(|e| AgentError::internal(format!("{what}: {e}")))
            })
            .and_then(|r| r);
        metrics::observe(Op::RolloutLastSeq, started, result.as_ref().err());
        result
    }

    fn read_conversation(
        &self,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let _span =
            tracing::debug_span!("rollout_db.read_conversation", %session_id, %conversation_id)
                .entered();
        let pool = self.inner.pool.clone();
        self.records(
            Op::RolloutReadConversation,
            RecordsRead::Conversation,
            async move {
                let what = format!("rollout read of session {session_id}");
                let client = Self::client(&pool).await?;
                let st = client
                    .prepare_cached(
                        "SELECT seq, record FROM rollout_events
                         WHERE session_id = $1 AND conversation_id = $2 ORDER BY seq",
                    )
                    .await
                    .map_err(pg_err(what.clone()))?;
                let rows = client
                    .query(
                        &st,
                        &[&session_id.to_string(), &conversation_id.to_string()],
                    )
                    .await
                    .map_err(pg_err(what))?;
                decode_records(session_id, &rows)
            },
        )
    }

    fn read_conversation_window(
        &self,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let _span = tracing::debug_span!(
            "rollout_db.read_conversation_window",
            %session_id,
            %conversation_id
        )
        .entered();
        let pool = self.inner.pool.clone();
        self.records(
            Op::RolloutReadConversation,
            RecordsRead::Window,
            async move {
                let what = format!("rollout read of session {session_id}");
                let (session, conversation) = (session_id.to_string(), conversation_id.to_string());
                let mut client = Self::client(&pool).await?;
                // The checkpoint, its task's start and the rows from there: one snapshot.
                let tx = client
                    .build_transaction()
                    .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()
                    .await
                    .map_err(pg_err(what.clone()))?;
                let from = window_seq(&tx, session_id, &session, &conversation).await?;
                let st = tx
                    .prepare_cached(
                        "SELECT seq, record FROM rollout_events
                         WHERE session_id = $1 AND conversation_id = $2 AND seq >= $3
                         ORDER BY seq",
                    )
                    .await
                    .map_err(pg_err(what.clone()))?;
                let rows = tx
                    .query(&st, &[&session, &conversation, &from])
                    .await
                    .map_err(pg_err(what.clone()))?;
                tx.commit().await.map_err(pg_err(what))?;
                decode_records(session_id, &rows)
            },
        )
    }

    fn read_after(
        &self,
        session_id: SessionId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let _span =
            tracing::debug_span!("rollout_db.read_after", %session_id, after_seq, limit).entered();
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let pool = self.inner.pool.clone();
        self.records(Op::RolloutReadAfter, RecordsRead::After, async move {
            let what = format!("rollout read of session {session_id}");
            let client = Self::client(&pool).await?;
            let st = client
                .prepare_cached(
                    "SELECT seq, record FROM rollout_events
                     WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                )
                .await
                .map_err(pg_err(what.clone()))?;
            let rows = client
                .query(&st, &[&session_id.to_string(), &after, &limit])
                .await
                .map_err(pg_err(what))?;
            decode_records(session_id, &rows)
        })
    }

    fn sweep_due(&self, now_ms: u64) -> Result<SweepReport, AgentError> {
        let _span = tracing::debug_span!("rollout_db.sweep_due", now_ms).entered();
        let started = Instant::now();
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
        let pool = self.inner.pool.clone();
        let result = self
            .run(async move { sweep_due(&pool, now).await })
            .and_then(|r| r);
        metrics::observe(Op::RolloutSweep, started, result.as_ref().err());
        if let Err(e) = &result {
            tracing::warn!(error = %e, "rollout ttl sweep failed; the next sweep tries again");
        }
        result.map(|downgraded| SweepReport {
            downgraded,
            failures: 0,
        })
    }
}

/// Downgrades every record due at `now`, in one transaction; how many.
async fn sweep_due(pool: &Pool, now: i64) -> Result<u64, AgentError> {
    let what = "rollout ttl sweep";
    let mut client = PgRolloutStorage::client(pool).await?;
    let tx = client.transaction().await.map_err(pg_err(what))?;
    let select = tx
        .prepare_cached(
            "SELECT session_id, seq, conversation_id, task_id, kind, ts_ms, record
             FROM rollout_events WHERE expires_ms <= $1 LIMIT $2 FOR UPDATE",
        )
        .await
        .map_err(pg_err(what))?;
    let update = tx
        .prepare_cached(
            "UPDATE rollout_events r SET level = u.level, record = u.record, expires_ms = NULL
             FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::TEXT[])
                 AS u(session_id, seq, level, record)
             WHERE r.session_id = u.session_id AND r.seq = u.seq",
        )
        .await
        .map_err(pg_err(what))?;
    let mut downgraded = 0u64;
    loop {
        let due = tx
            .query(&select, &[&now, &SWEEP_CHUNK])
            .await
            .map_err(pg_err(what))?;
        if due.is_empty() {
            break;
        }
        let (mut sessions, mut seqs, mut levels, mut records) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for row in &due {
            let due = DueRow {
                session_id: row.try_get(0).map_err(pg_err(what))?,
                seq: row.try_get(1).map_err(pg_err(what))?,
                conversation_id: row.try_get(2).map_err(pg_err(what))?,
                task_id: row.try_get(3).map_err(pg_err(what))?,
                kind: row.try_get(4).map_err(pg_err(what))?,
                ts_ms: row.try_get(5).map_err(pg_err(what))?,
                record: row.try_get(6).map_err(pg_err(what))?,
            };
            let header = due.headers();
            let text = serde_json::to_string(&header)
                .map_err(|e| AgentError::internal(format!("{what}: {e}")))?;
            sessions.push(due.session_id);
            seqs.push(due.seq);
            levels.push(header.level.as_str().to_owned());
            records.push(text);
        }
        let n = tx
            .execute(&update, &[&sessions, &seqs, &levels, &records])
            .await
            .map_err(pg_err(what))?;
        downgraded += n;
    }
    tx.commit().await.map_err(pg_err(what))?;
    if downgraded > 0 {
        tracing::debug!(downgraded, "rollout ttl sweep");
    }
    Ok(downgraded)
}

/// Records appended and not yet committed, as the columns of one insert.
#[derive(Default)]
struct Batch {
    seq: Vec<i64>,
    conversation_id: Vec<Option<String>>,
    task_id: Vec<Option<String>>,
    kind: Vec<String>,
    ts_ms: Vec<i64>,
    level: Vec<String>,
    record: Vec<String>,
    expires_ms: Vec<Option<i64>>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.seq.is_empty()
    }
}

/// One session's writing side: buffers records until `commit`.
struct PgRolloutSink {
    session_id: SessionId,
    session_key: String,
    pending: Batch,
    storage: PgRolloutStorage,
}

impl Drop for PgRolloutSink {
    fn drop(&mut self) {
        self.storage.inner.leases.release(self.session_id);
    }
}

impl PgRolloutSink {
    /// Writes every pending record (and the high-water mark) in one transaction.
    fn submit(&mut self, op: Op, high_water: Option<i64>, sync: bool) -> Result<(), SinkError> {
        let started = Instant::now();
        let batch = std::mem::take(&mut self.pending);
        let key = self.session_key.clone();
        let pool = self.storage.inner.pool.clone();
        let fencing = self.storage.inner.fencing.clone();
        let result = match self
            .storage
            .run(async move { commit(&pool, &fencing, &key, batch, high_water, sync).await })
        {
            Ok(r) => r,
            Err(e) => Err(SinkError::new("write", e)),
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

/// The insert of a batch and the high-water mark, in one transaction.
async fn commit(
    pool: &Pool,
    fencing: &super::Fencing,
    key: &str,
    batch: Batch,
    high_water: Option<i64>,
    sync: bool,
) -> Result<(), SinkError> {
    let op = if sync { "sync" } else { "write" };
    let mut client = PgRolloutStorage::client(pool)
        .await
        .map_err(|e| SinkError::new("write", e))?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| SinkError::new("write", pg_err("begin")(e)))?;
    fencing
        .check(&tx, key)
        .await
        .map_err(|e| SinkError::new("write", e))?;
    if !sync {
        tx.batch_execute("SET LOCAL synchronous_commit = off")
            .await
            .map_err(|e| SinkError::new("write", pg_err("synchronous_commit")(e)))?;
    }
    if !batch.is_empty() {
        let st = tx
            .prepare_cached(
                "INSERT INTO rollout_events
                     (session_id, seq, conversation_id, task_id, kind, ts_ms, level, record, expires_ms)
                 SELECT $1, * FROM UNNEST($2::BIGINT[], $3::TEXT[], $4::TEXT[], $5::TEXT[],
                     $6::BIGINT[], $7::TEXT[], $8::TEXT[], $9::BIGINT[])",
            )
            .await
            .map_err(|e| SinkError::new("write", pg_err("prepare rollout insert")(e)))?;
        let inserted = tx
            .execute(
                &st,
                &[
                    &key,
                    &batch.seq,
                    &batch.conversation_id,
                    &batch.task_id,
                    &batch.kind,
                    &batch.ts_ms,
                    &batch.level,
                    &batch.record,
                    &batch.expires_ms,
                ],
            )
            .await;
        if let Err(e) = inserted {
            let seq =
                duplicate_seq(&e).map_or_else(|| describe_seqs(&batch.seq), |s| format!("seq {s}"));
            return Err(SinkError::new(
                "write",
                format!(
                    "session {key} {seq}: {}",
                    pg_err("insert rollout records")(e)
                ),
            ));
        }
    }
    // A batch that records its high-water mark's `seq` needs no mark (as on SQLite: `last_seq`
    // is the greater of the two, and records are never deleted).
    let high_water = high_water.filter(|hw| !batch.seq.iter().any(|s| s >= hw));
    if let Some(high_water) = high_water {
        let st = tx
            .prepare_cached(
                "INSERT INTO rollout_high_water (session_id, high_water) VALUES ($1, $2)
                 ON CONFLICT (session_id) DO UPDATE
                 SET high_water = GREATEST(rollout_high_water.high_water, excluded.high_water)",
            )
            .await
            .map_err(|e| SinkError::new("write", pg_err("prepare high water")(e)))?;
        tx.execute(&st, &[&key, &high_water])
            .await
            .map_err(|e| SinkError::new("write", pg_err("high water")(e)))?;
    }
    tx.commit()
        .await
        .map_err(|e| SinkError::new(op, pg_err("rollout commit")(e)))
}

/// The `seq` a unique violation names in its detail (`Key (session_id, seq)=(…, 7) …`).
fn duplicate_seq(e: &tokio_postgres::Error) -> Option<i64> {
    let detail = e.as_db_error()?.detail()?;
    let values = detail.split(")=(").nth(1)?;
    let inner = values.split(')').next()?;
    inner.rsplit(", ").next()?.trim().parse().ok()
}

fn describe_seqs(seqs: &[i64]) -> String {
    match (seqs.first(), seqs.last()) {
        (Some(a), Some(b)) if a != b => format!("seqs {a}..={b}"),
        (Some(a), _) => format!("seq {a}"),
        _ => "no records".to_owned(),
    }
}

impl RolloutSink for PgRolloutSink {
    fn append(
        &mut self,
        conversation_id: Option<ConversationId>,
        record: &RolloutRecord,
    ) -> Result<(), SinkError> {
        let int = |field: &str, v: u64| {
            crate::conn::to_sql_int(field, v).map_err(|e| SinkError::new("encode", e))
        };
        let seq = int("seq", record.seq)?;
        let ts_ms = int("ts_ms", record.ts_ms)?;
        let text = serde_json::to_string(record).map_err(|e| SinkError::new("encode", e))?;
        troupe_actors::rollout::metrics::bytes_written(text.len());
        let b = &mut self.pending;
        b.seq.push(seq);
        b.conversation_id
            .push(conversation_id.map(|c| c.to_string()));
        b.task_id.push(record.task_id.map(|t| t.to_string()));
        b.kind.push(record.kind.as_str().to_owned());
        b.ts_ms.push(ts_ms);
        b.level.push(record.level.as_str().to_owned());
        b.record.push(text);
        b.expires_ms
            .push(match (record.level, record.meta.expires_ms) {
                (RecordLevel::Full, Some(ms)) => Some(i64::try_from(ms).unwrap_or(i64::MAX)),
                _ => None,
            });
        Ok(())
    }

    fn commit(&mut self, sync: bool, high_water: u64) -> Result<(), SinkError> {
        let _span = tracing::debug_span!("rollout_db.commit", session_id = %self.session_id, sync, high_water).entered();
        let high_water = crate::conn::to_sql_int("high_water", high_water)
            .map_err(|e| SinkError::new("encode", e))?;
        self.submit(Op::RolloutCommit, Some(high_water), sync)
    }

    fn forget(&mut self, conversation_id: ConversationId) -> Result<(), SinkError> {
        let _span = tracing::debug_span!("rollout_db.forget", session_id = %self.session_id, %conversation_id).entered();
        if self.pending.is_empty() {
            return Ok(());
        }
        self.submit(Op::RolloutForget, None, false)
    }

    fn abandon(self: Box<Self>) {
        // Nothing is flushed when a sink is dropped: dropping it loses what it buffered, and
        // releases the lease.
        let mut this = self;
        this.pending = Batch::default();
        drop(this);
    }
}
