//! [`SqliteStore`]: the [`Store`] over one SQLite database file in WAL mode.
//!
//! # Threads
//! - One connection writes. A write that finds nothing queued and the connection free commits
//!   at once on the caller's thread, in a transaction of its own (the fast path: no thread
//!   hand-off, see `SqliteStore::write_here`). Otherwise it goes to the writer thread through a
//!   bounded channel (a full queue makes callers wait, asynchronously); the writer takes one,
//!   drains what is already queued (up to [`MAX_BATCH`]), locks the connection and commits
//!   them in one transaction, each write in a savepoint of its own (a lone write needs none)
//!   so that one failing write (an unknown session) leaves the others in. Either way the
//!   caller hears only after `COMMIT` returned: an acknowledged write is in the WAL, which
//!   survives a crash of the process (`synchronous = NORMAL`; with
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
//! in one statement on the writer thread (an index holds only the rows with an expiry), and
//! puts each due A2A task's text-less body (`redacted`) in place of its body. With
//! `secure_delete` on, the freed bytes are zeroed; after a sweep that changed rows the writer
//! truncates the WAL ([`conn::truncate_wal`]), so the dropped text is in no file of the store.
//!
//! The writing connection is behind a mutex, held for one transaction at a time (by the writer
//! thread or a fast-path caller, never across an `await`); readers' connections are owned by
//! one thread at a time, moved over channels. When the last handle is dropped the writer's
//! channel closes, the thread commits what is queued and ends.

mod a2a;
mod rows;

#[cfg(feature = "postgres")]
pub(crate) use rows::{parse_role, parse_state, role_str, state_str};
mod writer;

use rows::{
    BINDING_SELECT, CONVERSATION_SELECT, MESSAGE_SELECT, RowKey, SESSION_SELECT, TOKEN_SELECT,
    binding_from_row, conversation_from_row, message_from_row, message_page, parse_id, query_all,
    session_from_row, token_from_row,
};
use writer::{SharedConn, WriteJob, WriteOp, WriteOutput, message_by_id, writer_loop};

use super::conn::{self, Checkpointer, ReaderPool, Role as ConnRole, internal};
use super::metrics::{self, Op};
use super::{Store, schema};
use async_trait::async_trait;
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, Span};
use troupe_proto::store::{
    A2aContextRecord, A2aPruned, A2aPushRecord, A2aTaskPage, A2aTaskQuery, A2aTaskRecord,
    ConversationRecord, FinishMessage, FinishedMessage, MessagePage, MessageRecord, NewMessage,
    SessionRecord, SessionStatus,
};
use troupe_proto::{AgentError, ConversationId, SessionId};

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
    /// The writing connection: the writer thread's, and the fast path's when it is free and
    /// nothing is queued ([`SqliteStore::write`]).
    conn: SharedConn,
    /// Writes committed on the fast path and writes handed to the writer thread, for tests.
    #[cfg(test)]
    paths: Arc<[std::sync::atomic::AtomicU64; 2]>,
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
        Self::open_in_with(data_dir, SqliteOptions::default())
    }

    /// [`SqliteStore::open_in`] with explicit options.
    pub fn open_in_with(
        data_dir: impl AsRef<Path>,
        options: SqliteOptions,
    ) -> Result<Self, AgentError> {
        let dir = data_dir.as_ref();
        std::fs::create_dir_all(dir)
            .map_err(|e| internal(format!("create {}", dir.display()), e))?;
        Self::open_with(db_path(dir), options)
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
        let conn = Arc::new(std::sync::Mutex::new(writer_conn));
        let thread_conn = conn.clone();
        std::thread::Builder::new()
            .name("troupe-store-writer".into())
            .spawn(move || writer_loop(thread_conn, queue))
            .map_err(|e| internal("spawn store writer", e))?;
        tracing::info!(path = %path.display(), schema_from = found, schema = schema::VERSION, "store opened");
        Ok(Self {
            writer,
            conn,
            #[cfg(test)]
            paths: Arc::default(),
            readers: Arc::new(readers),
            _checkpointer: Arc::new(checkpointer),
            path: path.into(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Commits a write: on the caller's thread when it can ([`Self::write_here`]), else
    /// through the writer thread's queue; returns once it is committed.
    async fn write(&self, op: WriteOp) -> Result<WriteOutput, AgentError> {
        if let Some(done) = self.write_here(&op) {
            return done;
        }
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
        #[cfg(test)]
        self.paths[1].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        answer
            .await
            .map_err(|_| AgentError::internal("store writer stopped before replying"))?
    }

    /// The fast path of [`Self::write`]: with nothing queued for the writer thread and the
    /// connection free, the write commits here, on the caller's thread, in a transaction of its
    /// own (tens of microseconds of WAL appends; no fsync under `synchronous = NORMAL`). A
    /// write handed to the writer thread costs two thread wake-ups (the writer's, then the
    /// caller's on the reply), each longer than the write itself whether the machine is idle
    /// (a parked core wakes slowly) or busy (a woken thread waits for a core), and a turn
    /// makes two writes on its path. Concurrent writes find the connection busy or writes
    /// queued and go to the writer thread, which commits them together, as before; so does a
    /// write that finds the database's write lock held by another connection (it never waits
    /// for it on the caller's thread, a runtime worker). TTL sweeps
    /// always go there (the writer keeps track of the WAL they leave). `None`: queue it.
    fn write_here(&self, op: &WriteOp) -> Option<Result<WriteOutput, AgentError>> {
        if matches!(op, WriteOp::SweepDue { .. })
            || self.writer.capacity() < self.writer.max_capacity()
        {
            return None;
        }
        let mut conn = writer::try_lock(&self.conn)?;
        let done = writer::try_commit_one(&mut conn, op)?;
        metrics::batch(metrics::Writer::Store, 1, std::time::Duration::ZERO);
        #[cfg(test)]
        self.paths[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(done)
    }

    /// Holds the writing connection, as a write in progress would.
    #[cfg(test)]
    pub(crate) fn hold_connection(&self) -> std::sync::MutexGuard<'_, Connection> {
        writer::lock(&self.conn)
    }

    /// Writes committed on the fast path so far.
    #[cfg(test)]
    pub(crate) fn fast_writes(&self) -> u64 {
        self.paths[0].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes handed to the writer thread so far.
    #[cfg(test)]
    pub(crate) fn queued_writes(&self) -> u64 {
        self.paths[1].load(std::sync::atomic::Ordering::Relaxed)
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
        let conversation = ConversationRecord {
            params: conversation.params.kept_by_policy(),
            ..conversation
        };
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

    async fn open_conversations(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<ConversationRecord>, AgentError> {
        let span = tracing::debug_span!("store.open_conversations", %session_id);
        observed(Op::OpenConversations, span, async {
            self.read(move |c| {
                query_all(
                    c,
                    &format!(
                        "{CONVERSATION_SELECT} WHERE session_id = ?1 AND state = 'open'
                         ORDER BY created_ms, rowid"
                    ),
                    [session_id.to_string()],
                    conversation_from_row,
                )
            })
            .await
        })
        .await
    }

    async fn conversation(
        &self,
        conversation_id: ConversationId,
    ) -> Result<Option<ConversationRecord>, AgentError> {
        let span = tracing::debug_span!("store.conversation", %conversation_id);
        observed(Op::Conversation, span, async {
            self.read(move |c| {
                query_all(
                    c,
                    &format!("{CONVERSATION_SELECT} WHERE conversation_id = ?1"),
                    [conversation_id.to_string()],
                    conversation_from_row,
                )
                .map(|mut v| v.pop())
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
        max_bytes: usize,
        before: Option<u64>,
    ) -> Result<MessagePage, AgentError> {
        let span = tracing::debug_span!(
            "store.messages",
            %session_id,
            limit,
            max_bytes,
            before,
            returned = tracing::field::Empty,
            bytes = tracing::field::Empty,
        );
        observed(Op::Messages, span.clone(), async {
            let (page, bytes) = self
                .read(move |c| message_page(c, session_id, limit, max_bytes, before))
                .await?;
            span.record("returned", page.messages.len());
            span.record("bytes", bytes);
            Ok(page)
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

    async fn set_session_status(
        &self,
        session_id: SessionId,
        status: SessionStatus,
        at_ms: u64,
    ) -> Result<(), AgentError> {
        let span =
            tracing::debug_span!("store.set_session_status", %session_id, status = status.as_str());
        observed(Op::SetSessionStatus, span, async {
            self.write(WriteOp::SetSessionStatus {
                session_id,
                status,
                at_ms,
            })
            .await
            .map(drop)
        })
        .await
    }

    async fn put_a2a_context(&self, context: A2aContextRecord) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.put_a2a_context", context_id = %context.context_id);
        observed(Op::PutA2aContext, span, async {
            self.write(WriteOp::PutA2aContext(context)).await.map(drop)
        })
        .await
    }

    async fn a2a_context(&self, context_id: &str) -> Result<Option<A2aContextRecord>, AgentError> {
        let span = tracing::debug_span!("store.a2a_context", context_id);
        let context_id = context_id.to_owned();
        observed(Op::A2aContext, span, async {
            self.read(move |c| a2a::context(c, &context_id)).await
        })
        .await
    }

    async fn a2a_open_contexts(&self) -> Result<Vec<A2aContextRecord>, AgentError> {
        let span = tracing::debug_span!("store.a2a_open_contexts");
        observed(Op::A2aOpenContexts, span, async {
            self.read(a2a::open_contexts).await
        })
        .await
    }

    async fn put_a2a_task(&self, task: A2aTaskRecord) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.put_a2a_task", task_id = %task.task_id, state = %task.state);
        observed(Op::PutA2aTask, span, async {
            self.write(WriteOp::PutA2aTask(task)).await.map(drop)
        })
        .await
    }

    async fn a2a_task(&self, task_id: &str) -> Result<Option<A2aTaskRecord>, AgentError> {
        let span = tracing::debug_span!("store.a2a_task", task_id);
        let task_id = task_id.to_owned();
        observed(Op::A2aTask, span, async {
            self.read(move |c| a2a::task(c, &task_id)).await
        })
        .await
    }

    async fn a2a_live_tasks(&self) -> Result<Vec<A2aTaskRecord>, AgentError> {
        let span = tracing::debug_span!("store.a2a_live_tasks");
        observed(Op::A2aLiveTasks, span, async {
            self.read(a2a::live_tasks).await
        })
        .await
    }

    async fn a2a_tasks(&self, query: A2aTaskQuery) -> Result<A2aTaskPage, AgentError> {
        let span = tracing::debug_span!("store.a2a_tasks", limit = query.limit);
        observed(Op::A2aTasks, span, async {
            self.read(move |c| a2a::tasks(c, &query)).await
        })
        .await
    }

    async fn put_a2a_push(&self, push: A2aPushRecord) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.put_a2a_push", task_id = %push.task_id, config_id = %push.config_id);
        observed(Op::PutA2aPush, span, async {
            self.write(WriteOp::PutA2aPush(push)).await.map(drop)
        })
        .await
    }

    async fn delete_a2a_push(&self, task_id: &str, config_id: &str) -> Result<bool, AgentError> {
        let span = tracing::debug_span!("store.delete_a2a_push", task_id, config_id);
        let op = WriteOp::DeleteA2aPush {
            task_id: task_id.to_owned(),
            config_id: config_id.to_owned(),
        };
        observed(Op::DeleteA2aPush, span, async {
            match self.write(op).await? {
                WriteOutput::Flag(gone) => Ok(gone),
                _ => Err(unexpected(Op::DeleteA2aPush)),
            }
        })
        .await
    }

    async fn a2a_pushes(&self, task_id: &str) -> Result<Vec<A2aPushRecord>, AgentError> {
        let span = tracing::debug_span!("store.a2a_pushes", task_id);
        let task_id = task_id.to_owned();
        observed(Op::A2aPushes, span, async {
            self.read(move |c| a2a::pushes(c, &task_id)).await
        })
        .await
    }

    async fn prune_a2a(&self, keep_finished: usize) -> Result<A2aPruned, AgentError> {
        let span = tracing::debug_span!(
            "store.prune_a2a",
            keep_finished,
            tasks = tracing::field::Empty,
            contexts = tracing::field::Empty
        );
        observed(Op::PruneA2a, span.clone(), async {
            match self.write(WriteOp::PruneA2a { keep_finished }).await? {
                WriteOutput::Pruned(p) => {
                    span.record("tasks", p.tasks);
                    span.record("contexts", p.contexts);
                    Ok(p)
                }
                _ => Err(unexpected(Op::PruneA2a)),
            }
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

#[async_trait]
impl super::BindingStore for SqliteStore {
    async fn put_binding(
        &self,
        binding: troupe_proto::agent::AgentBinding,
    ) -> Result<(), AgentError> {
        let span = tracing::debug_span!(
            "store.put_binding",
            session_id = %binding.session_id,
            agent_id = %binding.agent_id,
        );
        observed(Op::PutBinding, span, async {
            self.write(WriteOp::PutBinding(binding)).await.map(drop)
        })
        .await
    }

    async fn bindings(
        &self,
        session_id: Option<SessionId>,
    ) -> Result<Vec<troupe_proto::agent::AgentBinding>, AgentError> {
        let span = tracing::debug_span!("store.bindings", session_id = ?session_id);
        observed(Op::Bindings, span, async {
            self.read(move |c| match session_id {
                Some(id) => query_all(
                    c,
                    &format!("{BINDING_SELECT} WHERE session_id = ?1 ORDER BY agent_id"),
                    [id.to_string()],
                    binding_from_row,
                ),
                None => query_all(
                    c,
                    &format!("{BINDING_SELECT} ORDER BY session_id, agent_id"),
                    [],
                    binding_from_row,
                ),
            })
            .await
        })
        .await
    }

    async fn remove_binding(
        &self,
        session_id: SessionId,
        agent_id: &str,
    ) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.remove_binding", %session_id, agent_id);
        let agent_id = agent_id.to_owned();
        observed(Op::RemoveBinding, span, async {
            self.write(WriteOp::RemoveBinding {
                session_id,
                agent_id,
            })
            .await
            .map(drop)
        })
        .await
    }
}

#[async_trait]
impl super::TokenStore for SqliteStore {
    async fn insert_token(
        &self,
        token: troupe_proto::governance::AuthToken,
    ) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.insert_token", token_id = %token.id);
        observed(Op::InsertToken, span, async {
            self.write(WriteOp::InsertToken(token)).await.map(drop)
        })
        .await
    }

    async fn token_by_digest(
        &self,
        digest: &str,
    ) -> Result<Option<troupe_proto::governance::AuthToken>, AgentError> {
        let span = tracing::debug_span!("store.token_by_digest");
        let digest = digest.to_owned();
        observed(Op::TokenByDigest, span, async {
            self.read(move |c| {
                let mut found = query_all(
                    c,
                    &format!("{TOKEN_SELECT} WHERE digest = ?1"),
                    [digest],
                    token_from_row,
                )?;
                Ok(found.pop())
            })
            .await
        })
        .await
    }

    async fn use_token(&self, id: &str, uses: u32, now_ms: u64) -> Result<bool, AgentError> {
        let span = tracing::debug_span!("store.use_token", token_id = id, uses);
        let id = id.to_owned();
        observed(Op::UseToken, span, async {
            match self.write(WriteOp::UseToken { id, uses, now_ms }).await? {
                WriteOutput::Flag(counted) => Ok(counted),
                _ => Err(unexpected(Op::UseToken)),
            }
        })
        .await
    }

    async fn revoke_token(
        &self,
        id: &str,
        at_ms: u64,
    ) -> Result<Option<troupe_proto::governance::AuthToken>, AgentError> {
        let span = tracing::debug_span!("store.revoke_token", token_id = id);
        let id = id.to_owned();
        observed(Op::RevokeToken, span, async {
            let found = match self
                .write(WriteOp::RevokeToken {
                    id: id.clone(),
                    at_ms,
                })
                .await?
            {
                WriteOutput::Flag(found) => found,
                _ => return Err(unexpected(Op::RevokeToken)),
            };
            if !found {
                return Ok(None);
            }
            self.read(move |c| {
                let mut found = query_all(
                    c,
                    &format!("{TOKEN_SELECT} WHERE token_id = ?1"),
                    [id],
                    token_from_row,
                )?;
                Ok(found.pop())
            })
            .await
        })
        .await
    }

    async fn tokens(&self) -> Result<Vec<troupe_proto::governance::AuthToken>, AgentError> {
        let span = tracing::debug_span!("store.tokens");
        observed(Op::Tokens, span, async {
            self.read(|c| {
                query_all(
                    c,
                    &format!("{TOKEN_SELECT} ORDER BY issued_ms DESC, token_id"),
                    [],
                    token_from_row,
                )
            })
            .await
        })
        .await
    }
}
