//! The service's store (P1): sessions, conversations, messages and each project's current
//! session. The actors never see it: the service writes to it and restores sessions from it.
//! Behind a trait so that a server database can replace the embedded SQLite one.
//!
//! Rules every implementation keeps:
//! - A write that returned `Ok` survives a crash of the process.
//! - `append_message` only stores the `content` it is given; the caller has already applied
//!   the conversation's storage policy (content `None` under `HeadersOnly`/`None`). Under
//!   `Ttl { secs }` (the policy of the stored conversation) the content is stored with its
//!   expiry, `created_ms` + the ttl, and [`Store::sweep_due`] drops it once due, whether the
//!   conversation is open, closed, or its session is not running.
//! - Content a sweep dropped cannot be read back from the store's files.
//! - `put_conversation` keeps the parameters as [`OpenConversation::kept_by_policy`] has
//!   them: no instruction text of a `headers_only` or `none` conversation is stored, so
//!   such a conversation is restored without its instructions. A `Ttl` conversation's
//!   instructions are due like a message written when it opened: [`Store::sweep_due`] drops
//!   them (a conversation stored again after that keeps them until the next sweep).
//! - Every write about a session (a message stored, started or ended, a conversation stored
//!   or closed, a status set) moves the session's `updated_ms` to the time of the write
//!   (the store's clock, or the time the write names, whichever is later), never back.
//! - A message is stored with its type and metadata as given; rows from before types existed
//!   read as `text` with no metadata.
//! - Unknown ids read as `Ok(None)` / empty; writes naming an unknown session or conversation
//!   fail with `AgentError::NotFound`; a duplicate create fails with `AgentError::InvalidInput`.
//!
//! The embedded implementation is [`SqliteStore`] (`<data_dir>/troupe.db`, WAL mode); the
//! Rollout's record can live in the same file through [`SqliteRolloutStorage`]. Both own their
//! connections on threads of their own (see `sqlite.rs`, `rollout.rs`); the schema is
//! versioned in `schema.rs`; metrics are in [`metrics`].
//!
//! [`OpenConversation::kept_by_policy`]: troupe_proto::OpenConversation::kept_by_policy
//!
//! The [`ttl`] sweeper drops Ttl content from the store and from any rollout storage once it
//! is due; both commands run one.
#![forbid(unsafe_code)]

#[cfg(test)]
mod a2a_tests;
mod answer;
#[cfg(test)]
mod backends;
mod conn;
#[cfg(test)]
mod crash_tests;
mod find;
pub mod leases;
pub mod memory;
mod memory_a2a;
mod memory_rollout;
pub mod metrics;
mod page;
#[cfg(test)]
mod pg_tests;
#[cfg(feature = "postgres")]
mod postgres;
mod rollout;
#[cfg(test)]
mod rollout_tests;
mod schema;
mod sqlite;
#[cfg(test)]
mod tests;
pub mod ttl;

pub use conn::BUSY_BUDGET;
pub use find::{FoundTask, find_task};
pub use leases::{Acquired, Lease, SessionLeases, SingleNode};
pub use memory_rollout::MemoryRolloutStorage;
#[cfg(feature = "postgres")]
pub use postgres::{PgOptions, PgRolloutStorage, PgStore, describe_pg_url};
pub use rollout::{ROLLOUT_DB_FILE, SqliteRolloutStorage};
pub use sqlite::{DB_FILE, SqliteOptions, SqliteStore, db_path};
pub use ttl::TtlSweeper;

use async_trait::async_trait;
pub use troupe_actors::ports::{BindingStore, TokenStore};
pub use troupe_proto::store::MAX_PAGE_BYTES;
use troupe_proto::store::{
    A2aContextRecord, A2aPruned, A2aPushRecord, A2aTaskPage, A2aTaskQuery, A2aTaskRecord,
    ConversationRecord, FinishMessage, FinishedMessage, MessagePage, MessageRecord, NewMessage,
    SessionRecord, SessionStatus,
};
use troupe_proto::{AgentError, ConversationId, SessionId};

/// Everything the service persists besides the rollout: sessions, conversations, messages,
/// each project's current session, (as a [`BindingStore`]) the agent bindings of every
/// session (A1), and (as a [`TokenStore`]) the authorization tokens (A5).
#[async_trait]
pub trait Store: BindingStore + TokenStore + Send + Sync + 'static {
    async fn create_session(&self, session: SessionRecord) -> Result<(), AgentError>;
    async fn get_session(&self, session_id: SessionId)
    -> Result<Option<SessionRecord>, AgentError>;
    /// Every stored session, oldest first (restored at start-up).
    async fn all_sessions(&self) -> Result<Vec<SessionRecord>, AgentError>;
    /// A project's sessions, newest first.
    async fn project_sessions(&self, project_id: &str) -> Result<Vec<SessionRecord>, AgentError>;

    /// Inserts or replaces a conversation (open, or a changed context).
    async fn put_conversation(&self, conversation: ConversationRecord) -> Result<(), AgentError>;
    async fn close_conversation(
        &self,
        conversation_id: ConversationId,
        closed_ms: u64,
    ) -> Result<(), AgentError>;
    /// A session's conversations, oldest first.
    async fn conversations(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<ConversationRecord>, AgentError>;
    /// A session's open conversations, oldest first: what a restart reopens. Reads none of
    /// the closed ones, however many there are.
    async fn open_conversations(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<ConversationRecord>, AgentError>;
    /// One conversation, open or closed; `None` if unknown.
    async fn conversation(
        &self,
        conversation_id: ConversationId,
    ) -> Result<Option<ConversationRecord>, AgentError>;

    /// Appends a message and returns it with its `message_id`.
    async fn append_message(&self, message: NewMessage) -> Result<MessageRecord, AgentError>;
    /// One message by id, `None` if unknown.
    async fn message(&self, message_id: u64) -> Result<Option<MessageRecord>, AgentError>;
    /// Moves a queued user message to `running` (its task is about to start). `NotFound` for
    /// an unknown message, `InvalidInput` unless it is queued.
    async fn start_message(&self, message_id: u64) -> Result<MessageRecord, AgentError>;
    /// Ends a user message: appends its reply (when there is one) and sets its terminal
    /// status, task and reply id, all in one transaction. `NotFound` for an unknown message,
    /// `InvalidInput` if it already ended or `status` is not terminal.
    async fn finish_message(&self, finish: FinishMessage) -> Result<FinishedMessage, AgentError>;
    /// A session's user messages that are still `queued` or `running`, oldest first: what a
    /// restart runs again or records as aborted.
    async fn pending_messages(
        &self,
        session_id: SessionId,
    ) -> Result<Vec<MessageRecord>, AgentError>;
    /// The sessions that hold `queued` or `running` messages (the only ones a restart must
    /// wake at once).
    async fn sessions_with_pending_messages(&self) -> Result<Vec<SessionId>, AgentError>;
    /// The newest of the session's messages with `message_id < before` (all when `None`),
    /// returned oldest first: at most `limit` of them, and no more than `max_bytes` of content
    /// (the APIs pass [`MAX_PAGE_BYTES`]) unless the page is a single message, which it
    /// always holds when one remains and `limit` is at least 1. `next_before` is set whenever
    /// older messages remain. The store reads the content of no message it does not return,
    /// so a page never costs much more memory than its budget.
    async fn messages(
        &self,
        session_id: SessionId,
        limit: usize,
        max_bytes: usize,
        before: Option<u64>,
    ) -> Result<MessagePage, AgentError>;
    /// The Ttl sweep: drops the content of every stored message whose expiry is at or before
    /// `now_ms` (its `chars` and everything else stay), and the instruction texts of every
    /// `Ttl` conversation whose `created_ms` + ttl is (its other parameters stay), in every
    /// session; returns how many messages and conversations lost content. Planned from what is stored, so it needs no session in memory;
    /// sweeping again changes nothing.
    async fn sweep_due(&self, now_ms: u64) -> Result<u64, AgentError>;

    /// Points a project at a session (which must exist and belong to it).
    async fn set_current_session(
        &self,
        project_id: &str,
        session_id: SessionId,
    ) -> Result<(), AgentError>;
    async fn current_session(&self, project_id: &str) -> Result<Option<SessionId>, AgentError>;

    /// Sets a session's status (P1) and moves its `updated_ms` to `at_ms` (never back).
    /// `NotFound` for an unknown session.
    async fn set_session_status(
        &self,
        session_id: SessionId,
        status: SessionStatus,
        at_ms: u64,
    ) -> Result<(), AgentError>;

    /// Store is open and answering (for `/readyz`).
    async fn ping(&self) -> Result<(), AgentError>;

    // ---- The A2A endpoint's records (P5) ----
    // Its contexts, tasks and push notification configs, so that a restart loses none of
    // them. They name no stored session or conversation (the endpoint keeps that link), so
    // none of these writes touches a session's `updated_ms`.

    /// Inserts or replaces a context.
    async fn put_a2a_context(&self, context: A2aContextRecord) -> Result<(), AgentError>;
    async fn a2a_context(&self, context_id: &str) -> Result<Option<A2aContextRecord>, AgentError>;
    /// The contexts whose conversation is open, oldest first. Reads none of the closed ones.
    async fn a2a_open_contexts(&self) -> Result<Vec<A2aContextRecord>, AgentError>;
    /// Inserts or replaces a task. `NotFound` unless its context is stored.
    async fn put_a2a_task(&self, task: A2aTaskRecord) -> Result<(), AgentError>;
    async fn a2a_task(&self, task_id: &str) -> Result<Option<A2aTaskRecord>, AgentError>;
    /// The tasks that are not terminal, oldest first. Reads none of the finished ones.
    async fn a2a_live_tasks(&self) -> Result<Vec<A2aTaskRecord>, AgentError>;
    /// One page of tasks (see [`A2aTaskQuery`]): at most `limit`, newest first, and how many
    /// match the filters.
    async fn a2a_tasks(&self, query: A2aTaskQuery) -> Result<A2aTaskPage, AgentError>;
    /// Inserts or replaces a task's push notification config. `NotFound` unless the task is
    /// stored.
    async fn put_a2a_push(&self, push: A2aPushRecord) -> Result<(), AgentError>;
    /// Removes a push config; whether there was one.
    async fn delete_a2a_push(&self, task_id: &str, config_id: &str) -> Result<bool, AgentError>;
    /// A task's push configs, oldest first.
    async fn a2a_pushes(&self, task_id: &str) -> Result<Vec<A2aPushRecord>, AgentError>;
    /// Retention: keeps the newest `keep_finished` terminal tasks (by `updated_ms`, then
    /// `task_id`) and forgets the older ones with their push configs, and every closed
    /// context that is left without a task and was last active no later than the oldest
    /// finished task kept. Live tasks and open contexts are never forgotten.
    async fn prune_a2a(&self, keep_finished: usize) -> Result<A2aPruned, AgentError>;
}

/// Registers the description of every metric this crate records (the store's and the Ttl
/// sweeper's), so that an exporter gives each its help text from the start.
pub fn describe_metrics() {
    metrics::describe();
    ttl::metrics::describe();
}

/// A token's field patterns as the `arg_fields` column keeps them: a JSON object of name to
/// pattern, `NULL` when it has none.
fn arg_fields_column(fields: &std::collections::BTreeMap<String, String>) -> Option<String> {
    (!fields.is_empty()).then(|| serde_json::json!(fields).to_string())
}

/// The field patterns of an `arg_fields` column.
fn arg_fields_of(
    column: Option<String>,
) -> Result<std::collections::BTreeMap<String, String>, serde_json::Error> {
    column.map_or_else(
        || Ok(Default::default()),
        |text| serde_json::from_str(&text),
    )
}
