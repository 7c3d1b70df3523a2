//! [`PgStore`]: the [`Store`] on a PostgreSQL server, for nodes that share their state (the
//! embedded [`crate::SqliteStore`] stays the single-node default); and
//! [`PgRolloutStorage`], the Rollout's record on the same server.
//!
//! # Connections
//! A pool of connections ([`deadpool_postgres`], `tokio-postgres` underneath, no TLS: keep the
//! server on loopback or a private network), each with its own cache of prepared statements.
//! A connection is checked before it is reused and replaced when it broke (a restarted
//! server), so the store outlives a restart of its database.
//!
//! # Transactions
//! Every write runs in one transaction (`READ COMMITTED`), and `finish_message` stores the
//! exchange, the reply and the outcome in the same one, as SQLite does. Writes about a session
//! lock the session's row first (see `write.rs`), so one session's writes are serialised and
//! its message ids are in commit order; a later lease with a fencing token checks its token at
//! that same place. A page of messages and a page of A2A tasks each read one snapshot
//! (`REPEATABLE READ`, read-only).
//!
//! # Paging
//! A page is planned from `(message_id, octet_length(content))` of at most `limit + 1` rows
//! newest first (PostgreSQL takes a value's length from its header, without reading or
//! decompressing a large value), then only the planned rows are read in full.
//!
//! # Durability and Ttl
//! A write returns once its transaction committed, under the server's `synchronous_commit`
//! (by default the WAL is flushed first, which also survives a power loss of the server).
//! [`Store::sweep_due`] drops due content with `UPDATE`s: it can no longer be read through the
//! store, but until PostgreSQL vacuums the table and recycles its WAL the old bytes may remain
//! in the server's files; unlike SQLite's, this store does not scrub them.

mod a2a;
mod leases;
mod rollout;
mod rows;
pub(crate) mod schema;
mod sql;
mod write;

pub use leases::Fencing;
pub use rollout::PgRolloutStorage;

use super::Store;
use super::metrics::{self, Op};
use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use rows::{
    BINDING_SELECT, CONVERSATION_SELECT, MESSAGE_SELECT, SESSION_SELECT, TOKEN_SELECT,
    binding_from_row, conversation_from_row, message_from_row, session_from_row, token_from_row,
};
use sql::{col, decoded};
use std::time::{Duration, Instant};
use tracing::{Instrument, Span};
use troupe_proto::store::{
    A2aContextRecord, A2aPruned, A2aPushRecord, A2aTaskPage, A2aTaskQuery, A2aTaskRecord,
    ConversationRecord, FinishMessage, FinishedMessage, MessagePage, MessageRecord, NewMessage,
    SessionRecord, SessionStatus,
};
use troupe_proto::{AgentError, ConversationId, SessionId};

/// Tuning of a PostgreSQL store.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// Connections of the store's pool at most (at least 1).
    pub pool_size: usize,
    /// How long an operation waits for a free connection, or for a new one to connect.
    pub connect_timeout: Duration,
    /// This node's name, when several nodes share the database: it owns sessions through
    /// leases ([`crate::SessionLeases`]) and each of its writes about a session is refused
    /// unless it holds the session's current fence. `None`: one node alone, nothing checked.
    pub node: Option<String>,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            pool_size: 8,
            connect_timeout: Duration::from_secs(10),
            node: None,
        }
    }
}

/// An error naming what failed, counted in the PostgreSQL error metric by class: what the
/// server refused as data (SQLSTATE class 22: a character it cannot hold, a value out of
/// range) is `InvalidInput`, anything else `Internal`.
pub(crate) fn pg_err(what: impl Into<String>) -> impl Fn(tokio_postgres::Error) -> AgentError {
    let what = what.into();
    move |e| {
        metrics::pg_error(metrics::pg_error_class(&e));
        // The server's message and detail when it sent one; the driver's otherwise.
        match e.as_db_error() {
            Some(db) if db.code().code().starts_with("22") => {
                AgentError::invalid(format!("{what}: {}", db.message()))
            }
            Some(db) => {
                AgentError::internal(format!("{what}: {} ({})", db.message(), db.code().code()))
            }
            None => AgentError::internal(format!("{what}: {e}")),
        }
    }
}

fn pool_err(what: &str, e: impl std::fmt::Display) -> AgentError {
    metrics::pg_error(metrics::PgErrorClass::Connection);
    AgentError::internal(format!("{what}: {e}"))
}

/// Where `url` points, for logs: user, hosts, ports and database, never the password; or
/// that it does not parse.
pub fn describe_pg_url(url: &str) -> String {
    let Ok(config) = url.parse::<tokio_postgres::Config>() else {
        return "an unparsable URL".to_owned();
    };
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .zip(config.get_ports().iter().chain(std::iter::repeat(&5432)))
        .map(|(host, port)| match host {
            tokio_postgres::config::Host::Tcp(h) => format!("{h}:{port}"),
            tokio_postgres::config::Host::Unix(p) => format!("{}:{port}", p.display()),
        })
        .collect();
    format!(
        "{}@{}/{}",
        config.get_user().unwrap_or("(default user)"),
        hosts.join(","),
        config.get_dbname().unwrap_or("(default database)")
    )
}

/// A pool of connections to `url` (`postgresql://user:password@host:port/database?...`).
pub(crate) fn pool(url: &str, size: usize, timeout: Duration) -> Result<Pool, AgentError> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
        AgentError::invalid(format!(
            "postgres_url is not a PostgreSQL connection string: {e}"
        ))
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(timeout);
    }
    if config.get_application_name().is_none() {
        config.application_name("troupe");
    }
    let manager = Manager::from_config(
        config,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(timeout))
        .create_timeout(Some(timeout))
        .recycle_timeout(Some(timeout))
        .build()
        .map_err(|e| AgentError::internal(format!("postgres pool: {e}")))
}

/// Connections a node keeps for its lease renewals and heartbeats, besides the store's pool.
pub const LEASE_CONNECTIONS: usize = 2;

/// The service's store on PostgreSQL. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    /// A node of a cluster: connections of its own for lease renewals and heartbeats, so a
    /// busy store pool never delays them past the lease ttl (sessions would move between
    /// live nodes).
    lease_pool: Option<Pool>,
    /// The fences this node holds (with a node name).
    fencing: Fencing,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("pool", &self.pool.status())
            .finish()
    }
}

impl PgStore {
    /// Connects to `url` with default options and brings the schema up to date.
    pub async fn connect(url: &str) -> Result<Self, AgentError> {
        Self::connect_with(url, PgOptions::default()).await
    }

    /// [`PgStore::connect`] with explicit options. Fails at once if the server cannot be
    /// reached or the schema not migrated.
    pub async fn connect_with(url: &str, options: PgOptions) -> Result<Self, AgentError> {
        metrics::describe();
        let started = Instant::now();
        let result = Self::connect_inner(url, &options).await;
        metrics::observe(Op::Open, started, result.as_ref().err());
        if let Err(e) = &result {
            tracing::error!(error = %e, "postgres store open failed");
        }
        result
    }

    async fn connect_inner(url: &str, options: &PgOptions) -> Result<Self, AgentError> {
        let pool = pool(url, options.pool_size, options.connect_timeout)?;
        let lease_pool = match &options.node {
            Some(_) => Some(self::pool(url, LEASE_CONNECTIONS, options.connect_timeout)?),
            None => None,
        };
        let store = Self {
            pool,
            lease_pool,
            fencing: Fencing::new(options.node.clone()),
        };
        let mut client = store.client().await?;
        let found = schema::migrate(&mut client).await?;
        drop(client);
        tracing::info!(
            schema_from = found,
            schema = schema::VERSION,
            "postgres store opened"
        );
        Ok(store)
    }

    /// This node's fences, to share with its rollout storage
    /// ([`PgRolloutStorage::connect_fenced`]).
    pub fn fencing(&self) -> Fencing {
        self.fencing.clone()
    }

    /// The schema version of the database it is connected to.
    pub async fn schema_version(&self) -> Result<i32, AgentError> {
        schema::version(&self.client().await?).await
    }

    /// How many connections the pool holds and how many of them are idle.
    pub fn pool_status(&self) -> (usize, usize) {
        let s = self.pool.status();
        (s.size, s.available)
    }

    /// A connection for lease renewals and heartbeats: from the node's lease pool (the
    /// store's pool without a node name).
    pub(crate) async fn lease_client(&self) -> Result<deadpool_postgres::Object, AgentError> {
        match &self.lease_pool {
            Some(pool) => pool
                .get()
                .await
                .map_err(|e| pool_err("postgres lease connection", e)),
            None => self.client().await,
        }
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, AgentError> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| pool_err("postgres connection", e));
        let s = self.pool.status();
        metrics::pg_pool(metrics::PgPool::Store, s.size, s.available, s.max_size);
        client
    }
}

/// Runs `$body` (an expression using the transaction `$tx` and returning a `Result`) in a
/// transaction of a pooled connection: committed if it is `Ok`, rolled back otherwise.
macro_rules! in_transaction {
    ($store:expr, |$tx:ident| $body:expr) => {{
        let mut client = $store.client().await?;
        let $tx = client.transaction().await.map_err(pg_err("begin"))?;
        let out = $body;
        match out {
            Ok(value) => {
                $tx.commit().await.map_err(pg_err("commit"))?;
                Ok(value)
            }
            // Dropping the transaction rolls it back.
            Err(e) => Err(e),
        }
    }};
}

/// [`in_transaction`] in one read-only snapshot.
macro_rules! in_snapshot {
    ($store:expr, |$tx:ident| $body:expr) => {{
        let mut client = $store.client().await?;
        let $tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(pg_err("begin read"))?;
        let out = $body;
        $tx.commit().await.map_err(pg_err("end read"))?;
        out
    }};
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

/// A page of the session's messages and its content bytes (see the module doc).
async fn message_page(
    tx: &deadpool_postgres::Transaction<'_>,
    session_id: SessionId,
    limit: usize,
    max_bytes: usize,
    before: Option<u64>,
) -> Result<(MessagePage, usize), AgentError> {
    let before = before.map_or(i64::MAX, |b| i64::try_from(b).unwrap_or(i64::MAX));
    let session = session_id.to_string();
    // The plan reads one row past the page at most.
    let read = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
    let sizes = sql::rows(
        tx,
        "read page sizes",
        "SELECT message_id, octet_length(content) FROM messages
         WHERE session_id = $1 AND message_id < $2 ORDER BY message_id DESC LIMIT $3",
        &[&session, &before, &read],
    )
    .await?;
    let plan = crate::page::plan(
        sizes.iter().map(|r| {
            let id: i64 = col(r, 0, "read page sizes")?;
            let bytes: Option<i32> = col(r, 1, "read page sizes")?;
            Ok::<_, AgentError>((
                u64::try_from(id).unwrap_or(0),
                usize::try_from(bytes.unwrap_or(0)).unwrap_or(0),
            ))
        }),
        limit,
        max_bytes,
    )?;
    let messages = match plan.ids {
        None => Vec::new(),
        Some((oldest, newest)) => {
            let (oldest, newest) = (
                i64::try_from(oldest).unwrap_or(i64::MAX),
                i64::try_from(newest).unwrap_or(i64::MAX),
            );
            decoded(
                tx,
                "read page",
                &format!(
                    "{MESSAGE_SELECT} WHERE session_id = $1 AND message_id BETWEEN $2 AND $3
                     ORDER BY message_id"
                ),
                &[&session, &oldest, &newest],
                message_from_row,
            )
            .await?
        }
    };
    Ok((
        MessagePage {
            messages,
            next_before: plan.next_before,
        },
        plan.bytes,
    ))
}

#[async_trait]
impl Store for PgStore {
    async fn create_session(&self, session: SessionRecord) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.create_session", session_id = %session.session_id);
        observed(Op::CreateSession, span, async {
            in_transaction!(self, |tx| write::create_session(
                &tx,
                &self.fencing,
                &session
            )
            .await)
        })
        .await
    }

    async fn get_session(
        &self,
        session_id: SessionId,
    ) -> Result<Option<SessionRecord>, AgentError> {
        let span = tracing::debug_span!("store.get_session", %session_id);
        observed(Op::GetSession, span, async {
            decoded(
                &self.client().await?,
                "read session",
                &format!("{SESSION_SELECT} WHERE session_id = $1"),
                &[&session_id.to_string()],
                session_from_row,
            )
            .await
            .map(|mut v| v.pop())
        })
        .await
    }

    async fn all_sessions(&self) -> Result<Vec<SessionRecord>, AgentError> {
        let span = tracing::debug_span!("store.all_sessions");
        observed(Op::AllSessions, span, async {
            decoded(
                &self.client().await?,
                "read sessions",
                &format!("{SESSION_SELECT} ORDER BY created_ms, row_id"),
                &[],
                session_from_row,
            )
            .await
        })
        .await
    }

    async fn project_sessions(&self, project_id: &str) -> Result<Vec<SessionRecord>, AgentError> {
        let span = tracing::debug_span!("store.project_sessions", project_id);
        observed(Op::ProjectSessions, span, async {
            decoded(
                &self.client().await?,
                "read sessions",
                &format!(
                    "{SESSION_SELECT} WHERE project_id = $1 ORDER BY created_ms DESC, row_id DESC"
                ),
                &[&project_id],
                session_from_row,
            )
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
            in_transaction!(self, |tx| write::put_conversation(
                &tx,
                &self.fencing,
                &conversation
            )
            .await)
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
            in_transaction!(self, |tx| write::close_conversation(
                &tx,
                &self.fencing,
                conversation_id,
                closed_ms
            )
            .await)
        })
        .await
    }

    async fn conversations(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<ConversationRecord>, AgentError> {
        let span = tracing::debug_span!("store.conversations", %session_id);
        observed(Op::Conversations, span, async {
            decoded(
                &self.client().await?,
                "read conversations",
                &format!("{CONVERSATION_SELECT} WHERE session_id = $1 ORDER BY created_ms, row_id"),
                &[&session_id.to_string()],
                conversation_from_row,
            )
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
            decoded(
                &self.client().await?,
                "read conversations",
                &format!(
                    "{CONVERSATION_SELECT} WHERE session_id = $1 AND state = 'open'
                     ORDER BY created_ms, row_id"
                ),
                &[&session_id.to_string()],
                conversation_from_row,
            )
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
            decoded(
                &self.client().await?,
                "read conversation",
                &format!("{CONVERSATION_SELECT} WHERE conversation_id = $1"),
                &[&conversation_id.to_string()],
                conversation_from_row,
            )
            .await
            .map(|mut v| v.pop())
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
            let record = in_transaction!(self, |tx| write::append_message(
                &tx,
                &self.fencing,
                &message
            )
            .await)?;
            span.record("message_id", record.message_id);
            Ok(record)
        })
        .await
    }

    async fn message(&self, message_id: u64) -> Result<Option<MessageRecord>, AgentError> {
        let span = tracing::debug_span!("store.message", message_id);
        observed(Op::Message, span, async {
            let id = i64::try_from(message_id).unwrap_or(i64::MAX);
            decoded(
                &self.client().await?,
                "read message",
                &format!("{MESSAGE_SELECT} WHERE message_id = $1"),
                &[&id],
                message_from_row,
            )
            .await
            .map(|mut v| v.pop())
        })
        .await
    }

    async fn start_message(&self, message_id: u64) -> Result<MessageRecord, AgentError> {
        let span = tracing::debug_span!("store.start_message", message_id);
        observed(Op::StartMessage, span, async {
            in_transaction!(self, |tx| write::start_message(
                &tx,
                &self.fencing,
                message_id
            )
            .await)
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
            in_transaction!(self, |tx| write::finish_message(
                &tx,
                &self.fencing,
                &finish
            )
            .await)
        })
        .await
    }

    async fn pending_messages(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<MessageRecord>, AgentError> {
        let span = tracing::debug_span!("store.pending_messages", %session_id);
        observed(Op::PendingMessages, span, async {
            decoded(
                &self.client().await?,
                "read pending messages",
                &format!(
                    "{MESSAGE_SELECT} WHERE session_id = $1 AND status IN ('queued', 'running')
                     ORDER BY message_id"
                ),
                &[&session_id.to_string()],
                message_from_row,
            )
            .await
        })
        .await
    }

    async fn sessions_with_pending_messages(&self) -> Result<Vec<SessionId>, AgentError> {
        let span = tracing::debug_span!("store.sessions_with_pending_messages");
        observed(Op::SessionsWithPendingMessages, span, async {
            decoded(
                &self.client().await?,
                "read pending sessions",
                "SELECT min(message_id), session_id FROM messages
                 WHERE status IN ('queued', 'running')
                 GROUP BY session_id ORDER BY min(message_id)",
                &[],
                |row| {
                    let key = rows::RowKey::new("messages", row)?;
                    key.parse(row, 1, "session_id")
                },
            )
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
            let (page, bytes) = in_snapshot!(self, |tx| message_page(
                &tx, session_id, limit, max_bytes, before
            )
            .await)?;
            span.record("returned", page.messages.len());
            span.record("bytes", bytes);
            Ok(page)
        })
        .await
    }

    async fn sweep_due(&self, now_ms: u64) -> Result<u64, AgentError> {
        let span = tracing::debug_span!("store.sweep_due", now_ms, swept = tracing::field::Empty);
        observed(Op::SweepDue, span.clone(), async {
            let n = in_transaction!(self, |tx| write::sweep_due(&tx, now_ms).await)?;
            span.record("swept", n);
            Ok(n)
        })
        .await
    }

    async fn set_current_session(
        &self,
        project_id: &str,
        session_id: SessionId,
    ) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.set_current_session", project_id, %session_id);
        observed(Op::SetCurrentSession, span, async {
            in_transaction!(self, |tx| write::set_current(&tx, project_id, session_id)
                .await)
        })
        .await
    }

    async fn current_session(&self, project_id: &str) -> Result<Option<SessionId>, AgentError> {
        let span = tracing::debug_span!("store.current_session", project_id);
        observed(Op::CurrentSession, span, async {
            decoded(
                &self.client().await?,
                "read current session",
                "SELECT 0::BIGINT, session_id FROM project_current WHERE project_id = $1",
                &[&project_id],
                |row| rows::RowKey::new("project_current", row)?.parse(row, 1, "session_id"),
            )
            .await
            .map(|mut v| v.pop())
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
            in_transaction!(self, |tx| write::set_session_status(
                &tx,
                &self.fencing,
                session_id,
                status,
                at_ms
            )
            .await)
        })
        .await
    }

    async fn ping(&self) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.ping");
        observed(Op::Ping, span, async {
            self.client()
                .await?
                .simple_query("SELECT 1")
                .await
                .map(drop)
                .map_err(pg_err("store ping"))
        })
        .await
    }

    async fn put_a2a_context(&self, context: A2aContextRecord) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.put_a2a_context", context_id = %context.context_id);
        observed(Op::PutA2aContext, span, async {
            in_transaction!(self, |tx| a2a::put_context(&tx, &context).await)
        })
        .await
    }

    async fn a2a_context(&self, context_id: &str) -> Result<Option<A2aContextRecord>, AgentError> {
        let span = tracing::debug_span!("store.a2a_context", context_id);
        observed(Op::A2aContext, span, async {
            a2a::context(&self.client().await?, context_id).await
        })
        .await
    }

    async fn a2a_open_contexts(&self) -> Result<Vec<A2aContextRecord>, AgentError> {
        let span = tracing::debug_span!("store.a2a_open_contexts");
        observed(Op::A2aOpenContexts, span, async {
            a2a::open_contexts(&self.client().await?).await
        })
        .await
    }

    async fn put_a2a_task(&self, task: A2aTaskRecord) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.put_a2a_task", task_id = %task.task_id, state = %task.state);
        observed(Op::PutA2aTask, span, async {
            in_transaction!(self, |tx| a2a::put_task(&tx, &task).await)
        })
        .await
    }

    async fn a2a_task(&self, task_id: &str) -> Result<Option<A2aTaskRecord>, AgentError> {
        let span = tracing::debug_span!("store.a2a_task", task_id);
        observed(Op::A2aTask, span, async {
            a2a::task(&self.client().await?, task_id).await
        })
        .await
    }

    async fn a2a_live_tasks(&self) -> Result<Vec<A2aTaskRecord>, AgentError> {
        let span = tracing::debug_span!("store.a2a_live_tasks");
        observed(Op::A2aLiveTasks, span, async {
            a2a::live_tasks(&self.client().await?).await
        })
        .await
    }

    async fn a2a_tasks(&self, query: A2aTaskQuery) -> Result<A2aTaskPage, AgentError> {
        let span = tracing::debug_span!("store.a2a_tasks", limit = query.limit);
        observed(Op::A2aTasks, span, async {
            in_snapshot!(self, |tx| a2a::tasks(&tx, &query).await)
        })
        .await
    }

    async fn put_a2a_push(&self, push: A2aPushRecord) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.put_a2a_push", task_id = %push.task_id, config_id = %push.config_id);
        observed(Op::PutA2aPush, span, async {
            in_transaction!(self, |tx| a2a::put_push(&tx, &push).await)
        })
        .await
    }

    async fn delete_a2a_push(&self, task_id: &str, config_id: &str) -> Result<bool, AgentError> {
        let span = tracing::debug_span!("store.delete_a2a_push", task_id, config_id);
        observed(Op::DeleteA2aPush, span, async {
            in_transaction!(self, |tx| a2a::delete_push(&tx, task_id, config_id).await)
        })
        .await
    }

    async fn a2a_pushes(&self, task_id: &str) -> Result<Vec<A2aPushRecord>, AgentError> {
        let span = tracing::debug_span!("store.a2a_pushes", task_id);
        observed(Op::A2aPushes, span, async {
            a2a::pushes(&self.client().await?, task_id).await
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
            let p = in_transaction!(self, |tx| a2a::prune(&tx, keep_finished).await)?;
            span.record("tasks", p.tasks);
            span.record("contexts", p.contexts);
            Ok(p)
        })
        .await
    }
}

#[async_trait]
impl super::BindingStore for PgStore {
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
            in_transaction!(self, |tx| write::put_binding(&tx, &self.fencing, &binding)
                .await)
        })
        .await
    }

    async fn bindings(
        &self,
        session_id: Option<SessionId>,
    ) -> Result<Vec<troupe_proto::agent::AgentBinding>, AgentError> {
        let span = tracing::debug_span!("store.bindings", session_id = ?session_id);
        observed(Op::Bindings, span, async {
            let client = self.client().await?;
            match session_id {
                Some(id) => {
                    decoded(
                        &client,
                        "read bindings",
                        &format!("{BINDING_SELECT} WHERE session_id = $1 ORDER BY agent_id"),
                        &[&id.to_string()],
                        binding_from_row,
                    )
                    .await
                }
                None => {
                    decoded(
                        &client,
                        "read bindings",
                        &format!("{BINDING_SELECT} ORDER BY session_id, agent_id"),
                        &[],
                        binding_from_row,
                    )
                    .await
                }
            }
        })
        .await
    }

    async fn remove_binding(
        &self,
        session_id: SessionId,
        agent_id: &str,
    ) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.remove_binding", %session_id, agent_id);
        observed(Op::RemoveBinding, span, async {
            in_transaction!(self, |tx| write::remove_binding(
                &tx,
                &self.fencing,
                session_id,
                agent_id
            )
            .await)
        })
        .await
    }
}

#[async_trait]
impl super::TokenStore for PgStore {
    async fn insert_token(
        &self,
        token: troupe_proto::governance::AuthToken,
    ) -> Result<(), AgentError> {
        let span = tracing::debug_span!("store.insert_token", token_id = %token.id);
        observed(Op::InsertToken, span, async {
            in_transaction!(self, |tx| write::insert_token(&tx, &token).await)
        })
        .await
    }

    async fn token_by_digest(
        &self,
        digest: &str,
    ) -> Result<Option<troupe_proto::governance::AuthToken>, AgentError> {
        let span = tracing::debug_span!("store.token_by_digest");
        observed(Op::TokenByDigest, span, async {
            let client = self.client().await?;
            let mut found = decoded(
                &client,
                "read token",
                &format!("{TOKEN_SELECT} WHERE digest = $1"),
                &[&digest],
                token_from_row,
            )
            .await?;
            Ok(found.pop())
        })
        .await
    }

    async fn use_token(&self, id: &str, uses: u32, now_ms: u64) -> Result<bool, AgentError> {
        let span = tracing::debug_span!("store.use_token", token_id = id, uses);
        observed(Op::UseToken, span, async {
            in_transaction!(self, |tx| write::use_token(&tx, id, uses, now_ms).await)
        })
        .await
    }

    async fn revoke_token(
        &self,
        id: &str,
        at_ms: u64,
    ) -> Result<Option<troupe_proto::governance::AuthToken>, AgentError> {
        let span = tracing::debug_span!("store.revoke_token", token_id = id);
        observed(Op::RevokeToken, span, async {
            let found = in_transaction!(self, |tx| write::revoke_token(&tx, id, at_ms).await)?;
            if !found {
                return Ok(None);
            }
            let client = self.client().await?;
            let mut found = decoded(
                &client,
                "read token",
                &format!("{TOKEN_SELECT} WHERE token_id = $1"),
                &[&id],
                token_from_row,
            )
            .await?;
            Ok(found.pop())
        })
        .await
    }

    async fn tokens(&self) -> Result<Vec<troupe_proto::governance::AuthToken>, AgentError> {
        let span = tracing::debug_span!("store.tokens");
        observed(Op::Tokens, span, async {
            let client = self.client().await?;
            decoded(
                &client,
                "read tokens",
                &format!("{TOKEN_SELECT} ORDER BY issued_ms DESC, token_id"),
                &[],
                token_from_row,
            )
            .await
        })
        .await
    }
}
