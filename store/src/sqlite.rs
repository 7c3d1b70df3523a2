//! [`SqliteStore`]: the [`Store`] over one SQLite database file in WAL mode.
//!
//! # Threads
//! - One writer thread owns the only writing connection. Writes reach it through a bounded
//!   channel (a full queue makes callers wait, asynchronously); it takes one, drains what is
//!   already queued (up to [`MAX_BATCH`]) and commits them in one transaction, each write in a
//!   savepoint of its own so that one failing write (an unknown session) leaves the others in.
//!   Replies go out over oneshot channels after `COMMIT` returned: an acknowledged write is in
//!   the WAL, which survives a crash of the process (`synchronous = NORMAL`; with
//!   [`SqliteOptions::power_loss_durable`] every commit also fsyncs the WAL).
//! - Reads run on tokio's blocking pool, each on a connection taken from a small pool
//!   ([`ReaderPool`]). WAL readers see the last commit and never wait for the writer.
//!
//! - A checkpointer thread copies the WAL into the database in the background
//!   ([`Checkpointer`]), off the writer's path.
//!
//! # Ttl
//! A message stored with content in a conversation whose policy is `Ttl { secs }` gets
//! `expires_ms` = `created_ms` + the ttl (from the conversation's stored `ttl_secs`).
//! [`Store::sweep_due`] drops the content of every message due, open or closed conversation,
//! in one statement on the writer thread (an index holds only the rows with an expiry). With
//! `secure_delete` on, the freed bytes are zeroed; after a sweep that changed rows the writer
//! truncates the WAL ([`conn::truncate_wal`]), so the dropped text is in no file of the store.
//!
//! No lock guards a connection: each one is owned by one thread at a time, moved over
//! channels. When the last handle is dropped the writer's channel closes, the thread commits
//! what is queued and ends.

use super::conn::{self, Checkpointer, ReaderPool, Role as ConnRole, internal, to_sql_int};
use super::metrics::{self, Op, Writer};
use super::{Store, schema};
use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, Span};
use troupe_proto::store::{
    ConversationRecord, ConversationState, FinishMessage, FinishedMessage, MessagePage,
    MessageRecord, MessageStatus, NewMessage, SessionRecord,
};
use troupe_proto::{AgentError, ConversationId, Json, Role, SessionId, StoragePolicy, TaskId};

/// The database file's name inside the data directory.
pub const DB_FILE: &str = "troupe.db";
/// Writes committed in one transaction at most.
pub const MAX_BATCH: usize = 512;
/// Writes waiting for the writer thread before callers wait to enqueue.
const QUEUE_CAPACITY: usize = 4096;

/// `<data_dir>/troupe.db`
pub fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join(DB_FILE)
}

/// Tuning of a SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// Reader connections (at least 1).
    pub readers: usize,
    /// fsync the WAL at every commit (`synchronous = FULL`): acknowledged writes then also
    /// survive a power loss, at the cost of one fsync per group commit.
    pub power_loss_durable: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            readers: 4,
            power_loss_durable: false,
        }
    }
}

/// The service's store in one SQLite file. Cheap to clone; clones share the threads.
#[derive(Clone)]
pub struct SqliteStore {
    writer: mpsc::Sender<WriteJob>,
    readers: Arc<ReaderPool>,
    /// Runs while any clone is alive.
    _checkpointer: Arc<Checkpointer>,
    path: Arc<Path>,
}

impl SqliteStore {
    /// Opens (creating it if needed) the database at `path` with default options and brings
    /// its schema up to date. Blocks on file I/O: call it before the runtime serves requests
    /// or from `spawn_blocking`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, AgentError> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// Opens `<data_dir>/troupe.db`, creating the directory if needed.
    pub fn open_in(data_dir: impl AsRef<Path>) -> Result<Self, AgentError> {
        let dir = data_dir.as_ref();
        std::fs::create_dir_all(dir)
            .map_err(|e| internal(format!("create {}", dir.display()), e))?;
        Self::open(db_path(dir))
    }

    /// [`SqliteStore::open`] with explicit options.
    pub fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, AgentError> {
        metrics::describe();
        let started = Instant::now();
        let path = path.as_ref();
        let result = Self::open_inner(path, &options);
        metrics::observe(Op::Open, started, result.as_ref().err());
        if let Err(e) = &result {
            tracing::error!(path = %path.display(), error = %e, "store open failed");
        }
        result
    }

    fn open_inner(path: &Path, options: &SqliteOptions) -> Result<Self, AgentError> {
        let mut writer_conn = conn::open(path, ConnRole::Writer)?;
        let found = schema::migrate(&mut writer_conn)?;
        if options.power_loss_durable {
            writer_conn
                .execute_batch("PRAGMA synchronous = FULL;")
                .map_err(|e| internal("sqlite synchronous", e))?;
        }
        let readers = ReaderPool::open(path, options.readers)?;
        let checkpointer = Checkpointer::spawn(path)?;
        let (writer, queue) = mpsc::channel(QUEUE_CAPACITY);
        std::thread::Builder::new()
            .name("troupe-store-writer".into())
            .spawn(move || writer_loop(writer_conn, queue))
            .map_err(|e| internal("spawn store writer", e))?;
        tracing::info!(path = %path.display(), schema_from = found, schema = schema::VERSION, "store opened");
        Ok(Self {
            writer,
            readers: Arc::new(readers),
            _checkpointer: Arc::new(checkpointer),
            path: path.into(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues a write and waits for its commit.
    async fn write(&self, op: WriteOp) -> Result<WriteOutput, AgentError> {
        let (reply, answer) = oneshot::channel();
        let job = WriteJob {
            op,
            reply,
            span: Span::current(),
            enqueued: Instant::now(),
        };
        self.writer
            .send(job)
            .await
            .map_err(|_| AgentError::internal("store writer has stopped"))?;
        answer
            .await
            .map_err(|_| AgentError::internal("store writer stopped before replying"))?
    }

    /// Runs a read on a pooled connection on the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, AgentError> + Send + 'static,
    ) -> Result<T, AgentError> {
        let readers = self.readers.clone();
        let span = Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(|| readers.with(f)))
            .await
            .map_err(|e| internal("store read task", e))?
    }
}

/// Times `fut`, counts its failure and runs it in `span`.
async fn observed<T>(
    op: Op,
    span: Span,
    fut: impl Future<Output = Result<T, AgentError>>,
) -> Result<T, AgentError> {
    let started = Instant::now();
    let result = fut.instrument(span.clone()).await;
    metrics::observe(op, started, result.as_ref().err());
    if let Err(e) = &result {
        span.in_scope(|| tracing::debug!(op = op.as_str(), error = %e, "store operation failed"));
    }
    result
}

fn unexpected(op: Op) -> AgentError {
    AgentError::internal(format!(
        "store writer answered {} with the wrong shape",
        op.as_str()
    ))
}

#[async_trait]
impl Store for SqliteStore {
    async fn create_session(&self, session: SessionRecord) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.create_session", session_id = %session.session_id);
        observed(Op::CreateSession, span, async {
            self.write(WriteOp::CreateSession(session)).await.map(drop)
        })
        .await
    }

    async fn get_session(
        &self,
        session_id: SessionId,
    ) -> Result<Option<SessionRecord>, AgentError> {
        let span = tracing::debug_span!("store.get_session", %session_id);
        observed(Op::GetSession, span, async {
            self.read(move |c| {
                query_all(
                    c,
                    &format!("{SESSION_SELECT} WHERE session_id = ?1"),
                    [session_id.to_string()],
                    session_from_row,
                )
                .map(|mut v| v.pop())
            })
            .await
        })
        .await
    }

    async fn all_sessions(&self) -> Result<Vec<SessionRecord>, AgentError> {
        let span = tracing::debug_span!("store.all_sessions");
        observed(Op::AllSessions, span, async {
            self.read(|c| {
                query_all(
                    c,
                    &format!("{SESSION_SELECT} ORDER BY created_ms, rowid"),
                    [],
                    session_from_row,
                )
            })
            .await
        })
        .await
    }

    async fn project_sessions(&self, project_id: &str) -> Result<Vec<SessionRecord>, AgentError> {
        let span = tracing::debug_span!("store.project_sessions", project_id);
        let project_id = project_id.to_owned();
        observed(Op::ProjectSessions, span, async {
            self.read(move |c| {
                query_all(
                    c,
                    &format!(
                        "{SESSION_SELECT} WHERE project_id = ?1 ORDER BY created_ms DESC, rowid DESC"
                    ),
                    [project_id],
                    session_from_row,
                )
            })
            .await
        })
        .await
    }

    async fn put_conversation(&self, conversation: ConversationRecord) -> Result<(), AgentError> {
        let span = tracing::debug_span!(
            "store.put_conversation",
            session_id = %conversation.session_id,
            conversation_id = %conversation.conversation_id,
        );
        observed(Op::PutConversation, span, async {
            self.write(WriteOp::PutConversation(conversation))
                .await
                .map(drop)
        })
        .await
    }

    async fn close_conversation(
        &self,
        conversation_id: ConversationId,
        closed_ms: u64,
    ) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.close_conversation", %conversation_id);
        observed(Op::CloseConversation, span, async {
            self.write(WriteOp::CloseConversation {
                conversation_id,
                closed_ms,
            })
            .await
            .map(drop)
        })
        .await
    }

    async fn conversations(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<ConversationRecord>, AgentError> {
        let span = tracing::debug_span!("store.conversations", %session_id);
        observed(Op::Conversations, span, async {
            self.read(move |c| {
                query_all(
                    c,
                    &format!(
                        "{CONVERSATION_SELECT} WHERE session_id = ?1 ORDER BY created_ms, rowid"
                    ),
                    [session_id.to_string()],
                    conversation_from_row,
                )
            })
            .await
        })
        .await
    }

    async fn append_message(&self, message: NewMessage) -> Result<MessageRecord, AgentError> {
        let span = tracing::debug_span!(
            "store.append_message",
            session_id = %message.session_id,
            conversation_id = %message.conversation_id,
            message_id = tracing::field::Empty,
        );
        observed(Op::AppendMessage, span.clone(), async {
            match self.write(WriteOp::AppendMessage(message)).await? {
                WriteOutput::Message(record) => {
                    span.record("message_id", record.message_id);
                    Ok(record)
                }
                _ => Err(unexpected(Op::AppendMessage)),
            }
        })
        .await
    }

    async fn message(&self, message_id: u64) -> Result<Option<MessageRecord>, AgentError> {
        let span = tracing::debug_span!("store.message", message_id);
        observed(Op::Message, span, async {
            self.read(move |c| message_by_id(c, message_id)).await
        })
        .await
    }

    async fn start_message(&self, message_id: u64) -> Result<MessageRecord, AgentError> {
        let span = tracing::debug_span!("store.start_message", message_id);
        observed(Op::StartMessage, span, async {
            match self.write(WriteOp::StartMessage { message_id }).await? {
                WriteOutput::Message(record) => Ok(record),
                _ => Err(unexpected(Op::StartMessage)),
            }
        })
        .await
    }

    async fn finish_message(&self, finish: FinishMessage) -> Result<FinishedMessage, AgentError> {
        let span = tracing::debug_span!(
            "store.finish_message",
            message_id = finish.message_id,
            status = finish.status.as_str()
        );
        observed(Op::FinishMessage, span, async {
            match self.write(WriteOp::FinishMessage(finish)).await? {
                WriteOutput::Finished(done) => Ok(*done),
                _ => Err(unexpected(Op::FinishMessage)),
            }
        })
        .await
    }

    async fn pending_messages(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<MessageRecord>, AgentError> {
        let span = tracing::debug_span!("store.pending_messages", %session_id);
        observed(Op::PendingMessages, span, async {
            self.read(move |c| {
                query_all(
                    c,
                    &format!(
                        "{MESSAGE_SELECT} WHERE session_id = ?1 AND status IN ('queued', 'running')
                         ORDER BY message_id"
                    ),
                    [session_id.to_string()],
                    message_from_row,
                )
            })
            .await
        })
        .await
    }

    async fn sessions_with_pending_messages(&self) -> Result<Vec<SessionId>, AgentError> {
        let span = tracing::debug_span!("store.sessions_with_pending_messages");
        observed(Op::SessionsWithPendingMessages, span, async {
            self.read(|c| {
                query_all(
                    c,
                    "SELECT min(message_id), session_id FROM messages
                     WHERE status IN ('queued', 'running')
                     GROUP BY session_id ORDER BY min(message_id)",
                    [],
                    |row| {
                        let key = RowKey::new("messages", row)?;
                        parse_id(&key, row, 1, "session_id")
                    },
                )
            })
            .await
        })
        .await
    }

    async fn messages(
        &self,
        session_id: SessionId,
        limit: usize,
        before: Option<u64>,
    ) -> Result<MessagePage, AgentError> {
        let span = tracing::debug_span!("store.messages", %session_id, limit, before);
        observed(Op::Messages, span, async {
            self.read(move |c| message_page(c, session_id, limit, before))
                .await
        })
        .await
    }

    async fn sweep_due(&self, now_ms: u64) -> Result<u64, AgentError> {
        let span = tracing::debug_span!("store.sweep_due", now_ms, swept = tracing::field::Empty);
        observed(Op::SweepDue, span.clone(), async {
            match self.write(WriteOp::SweepDue { now_ms }).await? {
                WriteOutput::Count(n) => {
                    span.record("swept", n);
                    Ok(n)
                }
                _ => Err(unexpected(Op::SweepDue)),
            }
        })
        .await
    }

    async fn set_current_session(
        &self,
        project_id: &str,
        session_id: SessionId,
    ) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.set_current_session", project_id, %session_id);
        let project_id = project_id.to_owned();
        observed(Op::SetCurrentSession, span, async {
            self.write(WriteOp::SetCurrentSession {
                project_id,
                session_id,
            })
            .await
            .map(drop)
        })
        .await
    }

    async fn current_session(&self, project_id: &str) -> Result<Option<SessionId>, AgentError> {
        let span = tracing::debug_span!("store.current_session", project_id);
        let project_id = project_id.to_owned();
        observed(Op::CurrentSession, span, async {
            self.read(move |c| {
                query_all(
                    c,
                    "SELECT rowid, session_id FROM project_current WHERE project_id = ?1",
                    [project_id],
                    |row| {
                        let key = RowKey::new("project_current", row)?;
                        parse_id(&key, row, 1, "session_id")
                    },
                )
                .map(|mut v| v.pop())
            })
            .await
        })
        .await
    }

    async fn ping(&self) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.ping");
        observed(Op::Ping, span, async {
            if self.writer.is_closed() {
                return Err(AgentError::internal("store writer has stopped"));
            }
            self.read(|c| {
                c.query_row("SELECT 1", [], |_| Ok(()))
                    .map_err(|e| internal("store ping", e))
            })
            .await
        })
        .await
    }
}

// ---- the writer thread ----

/// A write, as queued for the writer thread.
struct WriteJob {
    op: WriteOp,
    reply: oneshot::Sender<Result<WriteOutput, AgentError>>,
    /// The caller's span: the writer applies the write inside it.
    span: Span,
    /// For the queue-wait metric.
    enqueued: Instant,
}

enum WriteOp {
    CreateSession(SessionRecord),
    PutConversation(ConversationRecord),
    CloseConversation {
        conversation_id: ConversationId,
        closed_ms: u64,
    },
    AppendMessage(NewMessage),
    StartMessage {
        message_id: u64,
    },
    FinishMessage(FinishMessage),
    /// Drops the content of every message due at `now_ms`.
    SweepDue {
        now_ms: u64,
    },
    SetCurrentSession {
        project_id: String,
        session_id: SessionId,
    },
}

enum WriteOutput {
    Done,
    Message(MessageRecord),
    Finished(Box<FinishedMessage>),
    Count(u64),
}

fn writer_loop(mut conn: Connection, mut queue: mpsc::Receiver<WriteJob>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    // A sweep dropped content whose old pages may still be in the WAL: every later sweep
    // tries to truncate it until one succeeds.
    let mut wal_holds_dropped = false;
    while let Some(first) = queue.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let oldest_wait = batch
            .first()
            .map(|j| j.enqueued.elapsed())
            .unwrap_or_default();
        metrics::batch(Writer::Store, batch.len(), oldest_wait);
        let mut results = commit_batch(&mut conn, &batch);
        let sweeps: Vec<usize> = batch
            .iter()
            .enumerate()
            .filter(|(_, job)| matches!(job.op, WriteOp::SweepDue { .. }))
            .map(|(i, _)| i)
            .collect();
        if !sweeps.is_empty() {
            wal_holds_dropped |= sweeps
                .iter()
                .any(|i| matches!(results.get(*i), Some(Ok(WriteOutput::Count(n))) if *n > 0));
            if wal_holds_dropped {
                if let Err(e) = truncate_after_sweep(&conn) {
                    // The content is dropped but its old pages may be in the WAL still: the
                    // sweep has not kept its promise yet, and the next one tries again.
                    for i in &sweeps {
                        if let Some(result) = results.get_mut(*i) {
                            *result = Err(e.clone());
                        }
                    }
                } else {
                    wal_holds_dropped = false;
                }
            }
        }
        for (job, result) in batch.drain(..).zip(results) {
            let _ = job.reply.send(result);
        }
    }
    tracing::debug!("store writer stopped");
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

/// Applies every write of `batch` in one transaction, each in its own savepoint; one result
/// per write. If the transaction cannot begin or commit, every write fails.
fn commit_batch(conn: &mut Connection, batch: &[WriteJob]) -> Vec<Result<WriteOutput, AgentError>> {
    let fail_all = |e: AgentError| batch.iter().map(|_| Err(e.clone())).collect();
    let mut tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => return fail_all(internal("store begin", e)),
    };
    let mut results = Vec::with_capacity(batch.len());
    for job in batch {
        let _entered = job.span.enter();
        let result = match tx.savepoint() {
            Ok(sp) => match apply(&sp, &job.op) {
                Ok(out) => sp
                    .commit()
                    .map(|()| out)
                    .map_err(|e| internal("store savepoint", e)),
                // Dropping the savepoint rolls this write back, and only it.
                Err(e) => Err(e),
            },
            Err(e) => Err(internal("store savepoint", e)),
        };
        results.push(result);
    }
    match tx.commit() {
        Ok(()) => results,
        Err(e) => {
            tracing::error!(error = %e, writes = batch.len(), "store commit failed");
            fail_all(internal("store commit", e))
        }
    }
}

/// One write, inside the writer's transaction.
fn apply(c: &Connection, op: &WriteOp) -> Result<WriteOutput, AgentError> {
    match op {
        WriteOp::CreateSession(s) => create_session(c, s).map(|()| WriteOutput::Done),
        WriteOp::PutConversation(conv) => put_conversation(c, conv).map(|()| WriteOutput::Done),
        WriteOp::CloseConversation {
            conversation_id,
            closed_ms,
        } => close_conversation(c, *conversation_id, *closed_ms).map(|()| WriteOutput::Done),
        WriteOp::AppendMessage(m) => append_message(c, m).map(WriteOutput::Message),
        WriteOp::StartMessage { message_id } => {
            start_message(c, *message_id).map(WriteOutput::Message)
        }
        WriteOp::FinishMessage(f) => {
            finish_message(c, f).map(|done| WriteOutput::Finished(Box::new(done)))
        }
        WriteOp::SweepDue { now_ms } => sweep_due(c, *now_ms).map(WriteOutput::Count),
        WriteOp::SetCurrentSession {
            project_id,
            session_id,
        } => set_current(c, project_id, *session_id).map(|()| WriteOutput::Done),
    }
}

fn sql(what: &'static str) -> impl Fn(rusqlite::Error) -> AgentError {
    move |e| internal(what, e)
}

/// The project of an existing session (`Some(None)`: outside any project), `None` if unknown.
fn session_project(c: &Connection, id: SessionId) -> Result<Option<Option<String>>, AgentError> {
    c.prepare_cached("SELECT project_id FROM sessions WHERE session_id = ?1")
        .and_then(|mut s| s.query_row([id.to_string()], |r| r.get(0)).optional())
        .map_err(sql("read session"))
}

/// The session of an existing conversation, as stored text; `None` if unknown.
fn conversation_session(c: &Connection, id: ConversationId) -> Result<Option<String>, AgentError> {
    Ok(conversation_owner(c, id)?.map(|(session, _)| session))
}

/// The session of an existing conversation and the ttl of its policy (`None`: not `Ttl`).
fn conversation_owner(
    c: &Connection,
    id: ConversationId,
) -> Result<Option<(String, Option<i64>)>, AgentError> {
    c.prepare_cached("SELECT session_id, ttl_secs FROM conversations WHERE conversation_id = ?1")
        .and_then(|mut s| {
            s.query_row([id.to_string()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(sql("read conversation"))
}

/// The `ttl_secs` column of a policy: its ttl under `Ttl` (saturating), else NULL.
fn ttl_secs(policy: StoragePolicy) -> Option<i64> {
    match policy {
        StoragePolicy::Ttl { secs } => Some(i64::try_from(secs).unwrap_or(i64::MAX)),
        _ => None,
    }
}

fn create_session(c: &Connection, s: &SessionRecord) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", s.created_ms)?;
    if session_project(c, s.session_id)?.is_some() {
        return Err(AgentError::invalid(format!(
            "session {} already exists",
            s.session_id
        )));
    }
    let settings =
        serde_json::to_string(&s.settings.0).map_err(|e| internal("encode settings", e))?;
    c.prepare_cached(
        "INSERT INTO sessions (session_id, project_id, title, created_ms, root_conversation_id, settings)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut st| {
        st.execute(params![
            s.session_id.to_string(),
            s.project_id,
            s.title,
            created_ms,
            s.root_conversation_id.to_string(),
            settings,
        ])
    })
    .map_err(sql("insert session"))?;
    Ok(())
}

fn put_conversation(c: &Connection, conv: &ConversationRecord) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", conv.created_ms)?;
    let closed_ms = conv
        .closed_ms
        .map(|ms| to_sql_int("closed_ms", ms))
        .transpose()?;
    if session_project(c, conv.session_id)?.is_none() {
        return Err(AgentError::not_found("session", conv.session_id));
    }
    let session_id = conv.session_id.to_string();
    if let Some(owner) = conversation_session(c, conv.conversation_id)?
        && owner != session_id
    {
        return Err(AgentError::invalid(format!(
            "conversation {} belongs to session {owner}, not {session_id}",
            conv.conversation_id
        )));
    }
    let params_json = serde_json::to_string(&conv.params)
        .map_err(|e| internal("encode conversation params", e))?;
    // An upsert, not `INSERT OR REPLACE`: a replace would delete the row (and its rowid, which
    // orders the session's conversations) under the messages that reference it.
    c.prepare_cached(
        "INSERT INTO conversations (conversation_id, session_id, params, is_root, state, created_ms, closed_ms, ttl_secs)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (conversation_id) DO UPDATE SET
             params = excluded.params, is_root = excluded.is_root, state = excluded.state,
             created_ms = excluded.created_ms, closed_ms = excluded.closed_ms,
             ttl_secs = excluded.ttl_secs",
    )
    .and_then(|mut st| {
        st.execute(params![
            conv.conversation_id.to_string(),
            session_id,
            params_json,
            conv.is_root,
            state_str(conv.state),
            created_ms,
            closed_ms,
            ttl_secs(conv.params.storage_policy),
        ])
    })
    .map_err(sql("upsert conversation"))?;
    Ok(())
}

fn close_conversation(
    c: &Connection,
    id: ConversationId,
    closed_ms: u64,
) -> Result<(), AgentError> {
    let closed_ms = to_sql_int("closed_ms", closed_ms)?;
    // Closing twice keeps the first close time.
    let changed = c
        .prepare_cached(
            "UPDATE conversations SET state = 'closed', closed_ms = COALESCE(closed_ms, ?2)
             WHERE conversation_id = ?1",
        )
        .and_then(|mut st| st.execute(params![id.to_string(), closed_ms]))
        .map_err(sql("close conversation"))?;
    if changed == 0 {
        return Err(AgentError::not_found("conversation", id));
    }
    Ok(())
}

fn append_message(c: &Connection, m: &NewMessage) -> Result<MessageRecord, AgentError> {
    let chars = to_sql_int("chars", m.chars)?;
    let created_ms = to_sql_int("created_ms", m.created_ms)?;
    let session_id = m.session_id.to_string();
    let ttl = match conversation_owner(c, m.conversation_id)? {
        Some((owner, ttl)) if owner == session_id => ttl,
        Some((owner, _)) => {
            return Err(AgentError::invalid(format!(
                "conversation {} belongs to session {owner}, not {session_id}",
                m.conversation_id
            )));
        }
        None => {
            if session_project(c, m.session_id)?.is_none() {
                return Err(AgentError::not_found("session", m.session_id));
            }
            return Err(AgentError::not_found("conversation", m.conversation_id));
        }
    };
    // Only content can expire; `created_ms` is non-negative, so the sum saturates at most.
    let expires_ms = ttl
        .filter(|_| m.content.is_some())
        .map(|secs| created_ms.saturating_add(secs.saturating_mul(1000)));
    c.prepare_cached(
        "INSERT INTO messages (session_id, conversation_id, task_id, role, content, chars, created_ms, expires_ms, status)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )
    .and_then(|mut st| {
        st.execute(params![
            session_id,
            m.conversation_id.to_string(),
            m.task_id.map(|t| t.to_string()),
            role_str(m.role),
            m.content,
            chars,
            created_ms,
            expires_ms,
            m.status.map(MessageStatus::as_str),
        ])
    })
    .map_err(sql("insert message"))?;
    let message_id = u64::try_from(c.last_insert_rowid()).map_err(|e| internal("message_id", e))?;
    Ok(MessageRecord {
        message_id,
        session_id: m.session_id,
        conversation_id: m.conversation_id,
        task_id: m.task_id,
        role: m.role,
        content: m.content.clone(),
        chars: m.chars,
        created_ms: m.created_ms,
        status: m.status,
        reply_message_id: None,
    })
}

/// One message by id.
fn message_by_id(c: &Connection, message_id: u64) -> Result<Option<MessageRecord>, AgentError> {
    let id = i64::try_from(message_id).unwrap_or(i64::MAX);
    query_all(
        c,
        &format!("{MESSAGE_SELECT} WHERE message_id = ?1"),
        [id],
        message_from_row,
    )
    .map(|mut v| v.pop())
}

/// A user message that exists, or `NotFound`.
fn user_message(c: &Connection, message_id: u64) -> Result<MessageRecord, AgentError> {
    message_by_id(c, message_id)?
        .filter(|m| m.role == Role::User)
        .ok_or_else(|| AgentError::not_found("message", message_id))
}

fn set_status(
    c: &Connection,
    message_id: u64,
    status: MessageStatus,
    task_id: Option<TaskId>,
    reply_message_id: Option<u64>,
) -> Result<(), AgentError> {
    let id = to_sql_int("message_id", message_id)?;
    let reply = reply_message_id
        .map(|r| to_sql_int("reply_message_id", r))
        .transpose()?;
    c.prepare_cached(
        "UPDATE messages SET status = ?2, task_id = COALESCE(?3, task_id),
             reply_message_id = COALESCE(?4, reply_message_id)
         WHERE message_id = ?1",
    )
    .and_then(|mut st| {
        st.execute(params![
            id,
            status.as_str(),
            task_id.map(|t| t.to_string()),
            reply
        ])
    })
    .map_err(sql("update message status"))?;
    Ok(())
}

fn start_message(c: &Connection, message_id: u64) -> Result<MessageRecord, AgentError> {
    let mut m = user_message(c, message_id)?;
    if m.status != Some(MessageStatus::Queued) {
        return Err(AgentError::invalid(format!(
            "message {message_id} is {}, not queued",
            status_name(m.status)
        )));
    }
    set_status(c, message_id, MessageStatus::Running, None, None)?;
    m.status = Some(MessageStatus::Running);
    Ok(m)
}

fn finish_message(c: &Connection, f: &FinishMessage) -> Result<FinishedMessage, AgentError> {
    if !f.status.is_terminal() {
        return Err(AgentError::invalid(format!(
            "{} is not an outcome",
            f.status.as_str()
        )));
    }
    let mut m = user_message(c, f.message_id)?;
    if m.status.is_some_and(MessageStatus::is_terminal) {
        return Err(AgentError::invalid(format!(
            "message {} already ended {}",
            f.message_id,
            status_name(m.status)
        )));
    }
    let reply = f.reply.as_ref().map(|r| append_message(c, r)).transpose()?;
    let reply_id = reply.as_ref().map(|r| r.message_id);
    set_status(c, f.message_id, f.status, f.task_id, reply_id)?;
    m.status = Some(f.status);
    m.task_id = f.task_id.or(m.task_id);
    m.reply_message_id = reply_id.or(m.reply_message_id);
    Ok(FinishedMessage { message: m, reply })
}

fn status_name(status: Option<MessageStatus>) -> &'static str {
    status.map_or("without a status", MessageStatus::as_str)
}

/// Drops the content of every message due at `now_ms`; how many.
fn sweep_due(c: &Connection, now_ms: u64) -> Result<u64, AgentError> {
    // A time past every representable one makes everything due.
    let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
    let changed = c
        .prepare_cached(
            "UPDATE messages SET content = NULL, expires_ms = NULL WHERE expires_ms <= ?1",
        )
        .and_then(|mut st| st.execute([now]))
        .map_err(sql("sweep due messages"))?;
    Ok(u64::try_from(changed).unwrap_or(u64::MAX))
}

fn set_current(c: &Connection, project_id: &str, session_id: SessionId) -> Result<(), AgentError> {
    match session_project(c, session_id)? {
        None => return Err(AgentError::not_found("session", session_id)),
        Some(project) if project.as_deref() != Some(project_id) => {
            return Err(AgentError::invalid(format!(
                "session {session_id} does not belong to project {project_id}"
            )));
        }
        Some(_) => {}
    }
    c.prepare_cached(
        "INSERT INTO project_current (project_id, session_id) VALUES (?1, ?2)
         ON CONFLICT (project_id) DO UPDATE SET session_id = excluded.session_id",
    )
    .and_then(|mut st| st.execute(params![project_id, session_id.to_string()]))
    .map_err(sql("set current session"))?;
    Ok(())
}

// ---- reads ----

const SESSION_SELECT: &str = "SELECT rowid, session_id, project_id, title, created_ms, \
     root_conversation_id, settings FROM sessions";
const CONVERSATION_SELECT: &str = "SELECT rowid, conversation_id, session_id, params, is_root, \
     state, created_ms, closed_ms FROM conversations";
const MESSAGE_SELECT: &str = "SELECT message_id, session_id, conversation_id, task_id, role, \
     content, chars, created_ms, status, reply_message_id FROM messages";

/// Every row of a query, decoded; the first undecodable row is an error naming it.
fn query_all<T>(
    c: &Connection,
    query: &str,
    params: impl rusqlite::Params,
    decode: impl Fn(&Row<'_>) -> Result<T, AgentError>,
) -> Result<Vec<T>, AgentError> {
    let mut st = c.prepare_cached(query).map_err(sql("prepare read"))?;
    let mut rows = st.query(params).map_err(sql("read"))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(sql("read"))? {
        out.push(decode(row)?);
    }
    Ok(out)
}

fn message_page(
    c: &Connection,
    session_id: SessionId,
    limit: usize,
    before: Option<u64>,
) -> Result<MessagePage, AgentError> {
    // Ids are positive i64s, so clamping a larger cursor changes nothing.
    let before = before.map_or(i64::MAX, |b| i64::try_from(b).unwrap_or(i64::MAX));
    // One row more than asked tells whether an older page exists.
    let fetch = i64::try_from(limit)
        .unwrap_or(i64::MAX - 1)
        .min(i64::MAX - 1)
        + 1;
    let mut newest_first = query_all(
        c,
        &format!(
            "{MESSAGE_SELECT} WHERE session_id = ?1 AND message_id < ?2
             ORDER BY message_id DESC LIMIT ?3"
        ),
        params![session_id.to_string(), before, fetch],
        message_from_row,
    )?;
    let more = newest_first.len() > limit;
    let next_before = if !more {
        None
    } else if limit == 0 {
        // Nothing returned: the next page starts at the newest message we did not return.
        newest_first.first().map(|m| m.message_id + 1)
    } else {
        newest_first.truncate(limit);
        newest_first.last().map(|m| m.message_id)
    };
    newest_first.truncate(limit);
    newest_first.reverse();
    Ok(MessagePage {
        messages: newest_first,
        next_before,
    })
}

/// Names a row in decoding errors: its table and rowid.
struct RowKey {
    table: &'static str,
    rowid: i64,
}

impl RowKey {
    /// Reads column 0, which every query here selects as the rowid.
    fn new(table: &'static str, row: &Row<'_>) -> Result<Self, AgentError> {
        let rowid = row
            .get(0)
            .map_err(|e| internal(format!("{table} row with no rowid"), e))?;
        Ok(Self { table, rowid })
    }

    fn err(&self, column: &str, e: impl std::fmt::Display) -> AgentError {
        AgentError::internal(format!(
            "corrupt {} row {}: column {column}: {e}",
            self.table, self.rowid
        ))
    }

    fn get<T: rusqlite::types::FromSql>(
        &self,
        row: &Row<'_>,
        index: usize,
        column: &str,
    ) -> Result<T, AgentError> {
        row.get(index).map_err(|e| self.err(column, e))
    }

    /// A non-negative integer column.
    fn get_u64(&self, row: &Row<'_>, index: usize, column: &str) -> Result<u64, AgentError> {
        let v: i64 = self.get(row, index, column)?;
        u64::try_from(v).map_err(|e| self.err(column, e))
    }
}

fn parse_id<T: std::str::FromStr>(
    key: &RowKey,
    row: &Row<'_>,
    index: usize,
    column: &str,
) -> Result<T, AgentError>
where
    T::Err: std::fmt::Display,
{
    let text: String = key.get(row, index, column)?;
    text.parse().map_err(|e| key.err(column, e))
}

fn session_from_row(row: &Row<'_>) -> Result<SessionRecord, AgentError> {
    let key = RowKey::new("sessions", row)?;
    let settings: String = key.get(row, 6, "settings")?;
    Ok(SessionRecord {
        session_id: parse_id(&key, row, 1, "session_id")?,
        project_id: key.get(row, 2, "project_id")?,
        title: key.get(row, 3, "title")?,
        created_ms: key.get_u64(row, 4, "created_ms")?,
        root_conversation_id: parse_id(&key, row, 5, "root_conversation_id")?,
        settings: Json(serde_json::from_str(&settings).map_err(|e| key.err("settings", e))?),
    })
}

fn conversation_from_row(row: &Row<'_>) -> Result<ConversationRecord, AgentError> {
    let key = RowKey::new("conversations", row)?;
    let params: String = key.get(row, 3, "params")?;
    let state: String = key.get(row, 5, "state")?;
    let closed_ms: Option<i64> = key.get(row, 7, "closed_ms")?;
    Ok(ConversationRecord {
        conversation_id: parse_id(&key, row, 1, "conversation_id")?,
        session_id: parse_id(&key, row, 2, "session_id")?,
        params: serde_json::from_str(&params).map_err(|e| key.err("params", e))?,
        is_root: key.get(row, 4, "is_root")?,
        state: parse_state(&state).ok_or_else(|| key.err("state", format!("unknown `{state}`")))?,
        created_ms: key.get_u64(row, 6, "created_ms")?,
        closed_ms: closed_ms
            .map(|v| u64::try_from(v).map_err(|e| key.err("closed_ms", e)))
            .transpose()?,
    })
}

fn message_from_row(row: &Row<'_>) -> Result<MessageRecord, AgentError> {
    let key = RowKey::new("messages", row)?;
    let role: String = key.get(row, 4, "role")?;
    let task_id: Option<String> = key.get(row, 3, "task_id")?;
    let status: Option<String> = key.get(row, 8, "status")?;
    let reply: Option<i64> = key.get(row, 9, "reply_message_id")?;
    Ok(MessageRecord {
        message_id: key.get_u64(row, 0, "message_id")?,
        session_id: parse_id(&key, row, 1, "session_id")?,
        conversation_id: parse_id(&key, row, 2, "conversation_id")?,
        task_id: task_id
            .map(|t| t.parse::<TaskId>().map_err(|e| key.err("task_id", e)))
            .transpose()?,
        role: parse_role(&role).ok_or_else(|| key.err("role", format!("unknown `{role}`")))?,
        content: key.get(row, 5, "content")?,
        chars: key.get_u64(row, 6, "chars")?,
        created_ms: key.get_u64(row, 7, "created_ms")?,
        status: status
            .map(|s| {
                MessageStatus::parse(&s).ok_or_else(|| key.err("status", format!("unknown `{s}`")))
            })
            .transpose()?,
        reply_message_id: reply
            .map(|v| u64::try_from(v).map_err(|e| key.err("reply_message_id", e)))
            .transpose()?,
    })
}

const fn role_str(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

fn parse_role(s: &str) -> Option<Role> {
    match s {
        "system" => Some(Role::System),
        "user" => Some(Role::User),
        "assistant" => Some(Role::Assistant),
        _ => None,
    }
}

const fn state_str(state: ConversationState) -> &'static str {
    match state {
        ConversationState::Open => "open",
        ConversationState::Closed => "closed",
    }
}

fn parse_state(s: &str) -> Option<ConversationState> {
    match s {
        "open" => Some(ConversationState::Open),
        "closed" => Some(ConversationState::Closed),
        _ => None,
    }
}
