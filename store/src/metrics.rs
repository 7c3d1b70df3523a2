//! Store metrics. Labels are closed sets (the operation, the error kind); session,
//! conversation and project ids go to spans only.

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use std::time::{Duration, Instant};
use troupe_proto::AgentError;

/// Time of one store operation as its caller sees it (queue wait included), by op.
pub const OPERATION_DURATION: &str = "troupe_store_operation_duration_seconds";
/// Store operations that failed, by op and error kind.
pub const ERRORS: &str = "troupe_store_errors_total";
/// Time a write waited in the writer's queue, by writer.
pub const QUEUE_WAIT: &str = "troupe_store_queue_wait_seconds";
/// Writes committed together in one transaction, by writer.
pub const BATCH_SIZE: &str = "troupe_store_write_batch_size";
/// Rollout records a storage read back, by storage and read.
pub const RECORDS_READ: &str = "troupe_rollout_records_read_total";
/// Connections of a PostgreSQL pool, by pool and state (`open`, `idle`, `max`).
pub const PG_POOL_CONNECTIONS: &str = "troupe_store_pg_pool_connections";
/// Errors of PostgreSQL statements and connections, by class.
pub const PG_ERRORS: &str = "troupe_store_pg_errors_total";

/// Registers the descriptions (a Prometheus exporter rejects undescribed metrics).
pub fn describe() {
    describe_histogram!(
        OPERATION_DURATION,
        Unit::Seconds,
        "Duration of store operations as their callers see them, by operation"
    );
    describe_counter!(
        ERRORS,
        Unit::Count,
        "Store operations that failed, by operation and error kind"
    );
    describe_histogram!(
        QUEUE_WAIT,
        Unit::Seconds,
        "Time a write waited for its writer thread, by writer (store, rollout)"
    );
    describe_histogram!(
        BATCH_SIZE,
        Unit::Count,
        "Writes committed in one transaction (group commit), by writer (store, rollout)"
    );
    // Every operation's series exists from the start: its latency, and its failures of kind
    // `internal` (a broken database), at 0, so that an alert's `rate()` sees the first one.
    for op in Op::ALL {
        let _ = histogram!(OPERATION_DURATION, "op" => op.as_str());
        counter!(ERRORS, "op" => op.as_str(), "kind" => "internal").increment(0);
    }
    for writer in [Writer::Store, Writer::Rollout] {
        let _ = histogram!(BATCH_SIZE, "writer" => writer.as_str());
        let _ = histogram!(QUEUE_WAIT, "writer" => writer.as_str());
    }
    describe_records_read();
    describe_pg();
    crate::leases::describe();
}

/// Registers the PostgreSQL store's series at 0: its pools (none open yet) and its errors.
pub fn describe_pg() {
    describe_gauge!(
        PG_POOL_CONNECTIONS,
        Unit::Count,
        "Connections of the PostgreSQL store's pools, by pool (store, rollout) and state (open: connected, idle: open and free, max: the pool's bound)"
    );
    describe_counter!(
        PG_ERRORS,
        Unit::Count,
        "Errors of the PostgreSQL store's statements and connections, by class (connection, constraint, conflict, query)"
    );
    for pool in [PgPool::Store, PgPool::Rollout] {
        for state in ["open", "idle", "max"] {
            gauge!(PG_POOL_CONNECTIONS, "pool" => pool.as_str(), "state" => state).set(0.0);
        }
    }
    for class in PgErrorClass::ALL {
        counter!(PG_ERRORS, "class" => class.as_str()).increment(0);
    }
}

/// A PostgreSQL connection pool (the `pool` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgPool {
    Store,
    Rollout,
}

impl PgPool {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::Rollout => "rollout",
        }
    }
}

/// Sets a pool's gauges.
pub fn pg_pool(pool: PgPool, open: usize, idle: usize, max: usize) {
    for (state, n) in [("open", open), ("idle", idle), ("max", max)] {
        gauge!(PG_POOL_CONNECTIONS, "pool" => pool.as_str(), "state" => state).set(n as f64);
    }
}

/// What kind of PostgreSQL error (the `class` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgErrorClass {
    /// No connection: refused, broken, timed out, or the pool could not give one.
    Connection,
    /// A constraint refused the statement (SQLSTATE class 23).
    Constraint,
    /// A serialization failure or deadlock (class 40): the transaction may be retried.
    Conflict,
    /// Anything else the server refused.
    Query,
}

impl PgErrorClass {
    pub const ALL: [Self; 4] = [
        Self::Connection,
        Self::Constraint,
        Self::Conflict,
        Self::Query,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Constraint => "constraint",
            Self::Conflict => "conflict",
            Self::Query => "query",
        }
    }
}

/// The class of an SQLSTATE code (`None`: no code, the connection failed).
pub fn pg_error_class_of(sqlstate: Option<&str>) -> PgErrorClass {
    match sqlstate.map(|c| c.get(..2).unwrap_or(c)) {
        None | Some("08" | "57" | "53") => PgErrorClass::Connection,
        Some("23") => PgErrorClass::Constraint,
        Some("40") => PgErrorClass::Conflict,
        Some(_) => PgErrorClass::Query,
    }
}

#[cfg(feature = "postgres")]
pub(crate) fn pg_error_class(e: &tokio_postgres::Error) -> PgErrorClass {
    pg_error_class_of(e.code().map(tokio_postgres::error::SqlState::code))
}

/// Counts one PostgreSQL error.
pub fn pg_error(class: PgErrorClass) {
    counter!(PG_ERRORS, "class" => class.as_str()).increment(1);
}

/// Registers [`RECORDS_READ`] with every label pair at 0 (the memory storage, which opens
/// nothing, calls only this).
pub fn describe_records_read() {
    describe_counter!(
        RECORDS_READ,
        Unit::Count,
        "Rollout records read back from storage, by storage (sqlite, postgres, memory, files: the JSONL files of troupe chat and troupe acp) and read (conversation: a whole conversation, window: a restore's window, after: a page of a resumed stream)"
    );
    for storage in ["sqlite", "postgres", "memory", "files"] {
        for read in RecordsRead::ALL {
            counter!(RECORDS_READ, "storage" => storage, "read" => read.as_str()).increment(0);
        }
    }
}

/// Which read of rollout records (the `read` label of [`RECORDS_READ`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordsRead {
    /// A whole conversation.
    Conversation,
    /// A restore's window (S6).
    Window,
    /// A page of the session's records after a `seq`.
    After,
}

impl RecordsRead {
    pub const ALL: [Self; 3] = [Self::Conversation, Self::Window, Self::After];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Conversation => "conversation",
            Self::Window => "window",
            Self::After => "after",
        }
    }
}

/// Counts `n` records read back by `storage` (`sqlite`, `postgres`, `memory`).
pub fn records_read(storage: &'static str, read: RecordsRead, n: usize) {
    counter!(RECORDS_READ, "storage" => storage, "read" => read.as_str()).increment(n as u64);
}

/// A store operation (the `op` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Open,
    CreateSession,
    GetSession,
    AllSessions,
    ProjectSessions,
    PutConversation,
    CloseConversation,
    Conversations,
    AppendMessage,
    Message,
    StartMessage,
    FinishMessage,
    PendingMessages,
    SessionsWithPendingMessages,
    Messages,
    /// The Ttl sweep of message content.
    SweepDue,
    SetCurrentSession,
    CurrentSession,
    Ping,
    RolloutCommit,
    RolloutSweep,
    RolloutForget,
    RolloutLastSeq,
    RolloutReadConversation,
    RolloutReadAfter,
    /// A background WAL checkpoint that copied pages.
    Checkpoint,
    SetSessionStatus,
    OpenConversations,
    Conversation,
    PutA2aContext,
    A2aContext,
    A2aOpenContexts,
    PutA2aTask,
    A2aTask,
    A2aLiveTasks,
    A2aTasks,
    PutA2aPush,
    DeleteA2aPush,
    A2aPushes,
    PruneA2a,
    PutBinding,
    Bindings,
    RemoveBinding,
    InsertToken,
    TokenByDigest,
    UseToken,
    RevokeToken,
    Tokens,
}

impl Op {
    pub const ALL: [Self; 48] = [
        Self::Open,
        Self::CreateSession,
        Self::GetSession,
        Self::AllSessions,
        Self::ProjectSessions,
        Self::PutConversation,
        Self::CloseConversation,
        Self::Conversations,
        Self::AppendMessage,
        Self::Message,
        Self::StartMessage,
        Self::FinishMessage,
        Self::PendingMessages,
        Self::SessionsWithPendingMessages,
        Self::Messages,
        Self::SweepDue,
        Self::SetCurrentSession,
        Self::CurrentSession,
        Self::Ping,
        Self::RolloutCommit,
        Self::RolloutSweep,
        Self::RolloutForget,
        Self::RolloutLastSeq,
        Self::RolloutReadConversation,
        Self::RolloutReadAfter,
        Self::Checkpoint,
        Self::SetSessionStatus,
        Self::OpenConversations,
        Self::Conversation,
        Self::PutA2aContext,
        Self::A2aContext,
        Self::A2aOpenContexts,
        Self::PutA2aTask,
        Self::A2aTask,
        Self::A2aLiveTasks,
        Self::A2aTasks,
        Self::PutA2aPush,
        Self::DeleteA2aPush,
        Self::A2aPushes,
        Self::PruneA2a,
        Self::PutBinding,
        Self::Bindings,
        Self::RemoveBinding,
        Self::InsertToken,
        Self::TokenByDigest,
        Self::UseToken,
        Self::RevokeToken,
        Self::Tokens,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::CreateSession => "create_session",
            Self::GetSession => "get_session",
            Self::AllSessions => "all_sessions",
            Self::ProjectSessions => "project_sessions",
            Self::PutConversation => "put_conversation",
            Self::CloseConversation => "close_conversation",
            Self::Conversations => "conversations",
            Self::AppendMessage => "append_message",
            Self::Message => "message",
            Self::StartMessage => "start_message",
            Self::FinishMessage => "finish_message",
            Self::PendingMessages => "pending_messages",
            Self::SessionsWithPendingMessages => "sessions_with_pending_messages",
            Self::Messages => "messages",
            Self::SweepDue => "sweep_due",
            Self::SetCurrentSession => "set_current_session",
            Self::CurrentSession => "current_session",
            Self::Ping => "ping",
            Self::RolloutCommit => "rollout_commit",
            Self::RolloutSweep => "rollout_sweep",
            Self::RolloutForget => "rollout_forget",
            Self::RolloutLastSeq => "rollout_last_seq",
            Self::RolloutReadConversation => "rollout_read_conversation",
            Self::RolloutReadAfter => "rollout_read_after",
            Self::Checkpoint => "checkpoint",
            Self::SetSessionStatus => "set_session_status",
            Self::OpenConversations => "open_conversations",
            Self::Conversation => "conversation",
            Self::PutA2aContext => "put_a2a_context",
            Self::A2aContext => "a2a_context",
            Self::A2aOpenContexts => "a2a_open_contexts",
            Self::PutA2aTask => "put_a2a_task",
            Self::A2aTask => "a2a_task",
            Self::A2aLiveTasks => "a2a_live_tasks",
            Self::A2aTasks => "a2a_tasks",
            Self::PutA2aPush => "put_a2a_push",
            Self::DeleteA2aPush => "delete_a2a_push",
            Self::A2aPushes => "a2a_pushes",
            Self::PruneA2a => "prune_a2a",
            Self::PutBinding => "put_binding",
            Self::Bindings => "bindings",
            Self::RemoveBinding => "remove_binding",
            Self::InsertToken => "insert_token",
            Self::TokenByDigest => "token_by_digest",
            Self::UseToken => "use_token",
            Self::RevokeToken => "revoke_token",
            Self::Tokens => "tokens",
        }
    }
}

/// Which writer thread (the `writer` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    Store,
    Rollout,
}

impl Writer {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::Rollout => "rollout",
        }
    }
}

/// Records one finished operation: its duration and, if it failed, the error.
pub fn observe(op: Op, started: Instant, error: Option<&AgentError>) {
    histogram!(OPERATION_DURATION, "op" => op.as_str()).record(started.elapsed().as_secs_f64());
    if let Some(e) = error {
        counter!(ERRORS, "op" => op.as_str(), "kind" => e.kind().as_str()).increment(1);
    }
}

/// Counts a failure that has no `AgentError` (a rollout sink's).
pub fn error_internal(op: Op) {
    counter!(ERRORS, "op" => op.as_str(), "kind" => "internal").increment(1);
}

/// Records a write batch: its size and how long its oldest write waited.
pub fn batch(writer: Writer, size: usize, oldest_wait: Duration) {
    histogram!(BATCH_SIZE, "writer" => writer.as_str()).record(size as f64);
    histogram!(QUEUE_WAIT, "writer" => writer.as_str()).record(oldest_wait.as_secs_f64());
}
