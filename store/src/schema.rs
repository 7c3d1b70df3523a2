//! The database's schema and its migrations, versioned by `PRAGMA user_version`.
//!
//! Migration `n` (1-based) moves the schema from version `n - 1` to `n`. Each runs in its own
//! `BEGIN IMMEDIATE` transaction that also sets `user_version`, so a crash leaves the database
//! at a whole version, and two processes opening the same file at once do not both run one
//! (the second re-reads the version under the write lock). Released migrations are never
//! edited: a change is a new migration.

use super::conn::internal;
use rusqlite::{Connection, TransactionBehavior};
use troupe_proto::AgentError;

/// The schema version this build reads and writes.
pub const VERSION: u32 = MIGRATIONS.len() as u32;

const MIGRATIONS: [&str; 10] = [
    V1_STORE,
    V2_ROLLOUT,
    V3_TTL_EXPIRY,
    V4_MESSAGE_STATUS,
    V5_SESSION_STATUS_MESSAGE_TYPE,
    V6_AGENT_BINDINGS,
    V7_A2A,
    V8_AUTH_TOKENS,
    V9_A2A_TASK_EXPIRY,
    V10_TOKEN_ARG_FIELDS,
];

/// Sessions, conversations, messages and each project's current session (P1).
const V1_STORE: &str = "
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY NOT NULL,
    project_id TEXT,
    title TEXT,
    created_ms INTEGER NOT NULL,
    root_conversation_id TEXT NOT NULL,
    settings TEXT NOT NULL
);
CREATE INDEX sessions_by_project ON sessions (project_id, created_ms);

CREATE TABLE conversations (
    conversation_id TEXT PRIMARY KEY NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions (session_id),
    params TEXT NOT NULL,
    is_root INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    closed_ms INTEGER
);
CREATE INDEX conversations_by_session ON conversations (session_id, created_ms);

-- AUTOINCREMENT: a message_id is never handed out twice, so a cursor never skips a newer row.
CREATE TABLE messages (
    message_id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions (session_id),
    conversation_id TEXT NOT NULL REFERENCES conversations (conversation_id),
    task_id TEXT,
    role TEXT NOT NULL,
    content TEXT,
    chars INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE INDEX messages_by_session ON messages (session_id, message_id);
CREATE INDEX messages_by_conversation ON messages (conversation_id, created_ms);

CREATE TABLE project_current (
    project_id TEXT PRIMARY KEY NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions (session_id)
);
";

/// The rollout's records and per-session high-water marks. No foreign key to `sessions`:
/// a rollout is written before (and without) the service's own session row.
const V2_ROLLOUT: &str = "
CREATE TABLE rollout_events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    conversation_id TEXT,
    task_id TEXT,
    kind TEXT NOT NULL,
    ts_ms INTEGER NOT NULL,
    level TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE INDEX rollout_events_by_conversation ON rollout_events (session_id, conversation_id, seq);

CREATE TABLE rollout_high_water (
    session_id TEXT PRIMARY KEY NOT NULL,
    high_water INTEGER NOT NULL
);
";

/// Ttl (S10): the expiry is stored with the content it dooms, so that sweeps find what is
/// due from what is stored. `conversations.ttl_secs` is the ttl of a conversation's `Ttl`
/// policy (NULL under any other), copied out of `params` so that appending a message needs no
/// JSON. `messages.expires_ms` and `rollout_events.expires_ms` are set on content written under
/// a Ttl policy and cleared when the sweep drops it; partial indexes hold only those rows.
/// Content written before this version is dated the same way: a conversation's policy cannot
/// change, so its ttl (from `params`, or from its `conversation_opened` rollout record) dates
/// all of it. Large ttls saturate at `i64::MAX` (never due).
const V3_TTL_EXPIRY: &str = "
ALTER TABLE conversations ADD COLUMN ttl_secs INTEGER;
ALTER TABLE messages ADD COLUMN expires_ms INTEGER;
CREATE INDEX messages_by_expiry ON messages (expires_ms) WHERE expires_ms IS NOT NULL;
ALTER TABLE rollout_events ADD COLUMN expires_ms INTEGER;
CREATE INDEX rollout_events_by_expiry ON rollout_events (expires_ms) WHERE expires_ms IS NOT NULL;

UPDATE conversations SET ttl_secs = CASE WHEN json_valid(params) THEN
    CASE WHEN json_type(params, '$.storage_policy.ttl.secs') = 'integer'
    THEN json_extract(params, '$.storage_policy.ttl.secs') END END;

UPDATE messages SET expires_ms = (
    SELECT CASE WHEN c.ttl_secs > (9223372036854775807 - messages.created_ms) / 1000
        THEN 9223372036854775807 ELSE messages.created_ms + c.ttl_secs * 1000 END
    FROM conversations c WHERE c.conversation_id = messages.conversation_id)
WHERE content IS NOT NULL AND conversation_id IN
    (SELECT conversation_id FROM conversations WHERE ttl_secs IS NOT NULL);

UPDATE rollout_events SET expires_ms =
    CASE WHEN opened.secs > (9223372036854775807 - rollout_events.ts_ms) / 1000
        THEN 9223372036854775807 ELSE rollout_events.ts_ms + opened.secs * 1000 END
FROM (
    SELECT session_id, conversation_id,
        CASE WHEN json_valid(record) THEN
            CASE WHEN json_type(record, '$.event.payload.storage_policy.ttl.secs') = 'integer'
            THEN json_extract(record, '$.event.payload.storage_policy.ttl.secs') END END AS secs
    FROM rollout_events WHERE kind = 'conversation_opened' AND level = 'full'
) AS opened
WHERE opened.secs IS NOT NULL
    AND rollout_events.level = 'full'
    AND rollout_events.session_id = opened.session_id
    AND rollout_events.conversation_id = opened.conversation_id;
";

/// The durable queue: each user message's status and its reply. Messages stored before this
/// version keep a NULL status (their outcome was not recorded).
const V4_MESSAGE_STATUS: &str = "
ALTER TABLE messages ADD COLUMN status TEXT;
ALTER TABLE messages ADD COLUMN reply_message_id INTEGER;
-- What a restart must look at: messages that are queued or running, and nothing else.
CREATE INDEX messages_pending ON messages (session_id, message_id)
    WHERE status IN ('queued', 'running');
";

/// P1: a session's status and last update; a message's type and metadata. Sessions stored
/// before this version are `active`, updated at their newest message (or their creation);
/// messages stored before it are `text` with no metadata (only text was stored then).
const V5_SESSION_STATUS_MESSAGE_TYPE: &str = "
ALTER TABLE sessions ADD COLUMN status TEXT NOT NULL DEFAULT 'active';
ALTER TABLE sessions ADD COLUMN updated_ms INTEGER;
UPDATE sessions SET updated_ms = max(created_ms, COALESCE(
    (SELECT max(m.created_ms) FROM messages m WHERE m.session_id = sessions.session_id),
    created_ms));
ALTER TABLE messages ADD COLUMN kind TEXT NOT NULL DEFAULT 'text';
ALTER TABLE messages ADD COLUMN metadata TEXT;
";

/// A1: each session's bindings of agents to provider sessions. No foreign key to
/// `sessions`: a session's agent hub may bind before (or without) the service's session row,
/// like the rollout.
const V6_AGENT_BINDINGS: &str = "
CREATE TABLE agent_bindings (
    session_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    provider_session_id TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (session_id, agent_id)
);
";

/// P5: the A2A endpoint's contexts, tasks and push notification configs, so that they
/// survive a restart; and an index of the open conversations, so that a restart reads those
/// and none of the (many) closed ones. Partial indexes hold only what a start-up reads: the
/// open contexts and the live tasks.
const V7_A2A: &str = "
CREATE INDEX conversations_open ON conversations (session_id, created_ms) WHERE state = 'open';

CREATE TABLE a2a_contexts (
    context_id TEXT PRIMARY KEY NOT NULL,
    session_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    active_ms INTEGER NOT NULL,
    open INTEGER NOT NULL
);
CREATE INDEX a2a_contexts_open ON a2a_contexts (created_ms) WHERE open = 1;
CREATE INDEX a2a_contexts_closed ON a2a_contexts (active_ms) WHERE open = 0;

CREATE TABLE a2a_tasks (
    task_id TEXT PRIMARY KEY NOT NULL,
    context_id TEXT NOT NULL,
    state TEXT NOT NULL,
    terminal INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX a2a_tasks_by_update ON a2a_tasks (updated_ms, task_id);
CREATE INDEX a2a_tasks_by_context ON a2a_tasks (context_id, updated_ms, task_id);
CREATE INDEX a2a_tasks_finished ON a2a_tasks (updated_ms, task_id) WHERE terminal = 1;
CREATE INDEX a2a_tasks_live ON a2a_tasks (created_ms) WHERE terminal = 0;

CREATE TABLE a2a_push_configs (
    task_id TEXT NOT NULL,
    config_id TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (task_id, config_id)
);
";

/// A5: authorization tokens. The secret is never stored: `digest` is its SHA-256; a use is
/// counted by compare-and-set on `uses`.
const V8_AUTH_TOKENS: &str = "
CREATE TABLE auth_tokens (
    token_id TEXT PRIMARY KEY NOT NULL,
    digest TEXT NOT NULL UNIQUE,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    args TEXT,
    issued_by TEXT NOT NULL,
    issued_ms INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,
    max_uses INTEGER NOT NULL,
    uses INTEGER NOT NULL,
    revoked_ms INTEGER
);
";

/// P5 under `ttl` (S10): an A2A task kept whole until its expiry, with the text-less body
/// the sweep puts in its place then. Tasks stored before this version were stored without
/// their text under any policy but `full`: nothing of them is due.
const V9_A2A_TASK_EXPIRY: &str = "
ALTER TABLE a2a_tasks ADD COLUMN redacted TEXT;
ALTER TABLE a2a_tasks ADD COLUMN expires_ms INTEGER;
CREATE INDEX a2a_tasks_by_expiry ON a2a_tasks (expires_ms) WHERE expires_ms IS NOT NULL;
";

/// A5: a token's patterns of named arguments (a JSON object of name to pattern; `NULL`:
/// none). `args` keeps the shell tool's command-line pattern.
const V10_TOKEN_ARG_FIELDS: &str = "
ALTER TABLE auth_tokens ADD COLUMN arg_fields TEXT;
";

/// The schema version of the open database.
pub fn version(conn: &Connection) -> Result<u32, AgentError> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|e| internal("read schema version", e))
}

/// Brings the schema to [`VERSION`]; returns the version found before.
pub fn migrate(conn: &mut Connection) -> Result<u32, AgentError> {
    migrate_to(conn, VERSION)
}

/// Brings the schema to `target` (tests stop at older versions to build old databases).
pub fn migrate_to(conn: &mut Connection, target: u32) -> Result<u32, AgentError> {
    let found = version(conn)?;
    if found > VERSION {
        return Err(AgentError::internal(format!(
            "database schema version {found} is newer than this build's {VERSION}"
        )));
    }
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let to = u32::try_from(index + 1).unwrap_or(u32::MAX);
        if to > target {
            break;
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| internal(format!("migration {to}"), e))?;
        // Under the write lock: another process may have migrated meanwhile.
        if version(&tx)? >= to {
            continue;
        }
        tx.execute_batch(sql)
            .map_err(|e| internal(format!("migration {to}"), e))?;
        tx.pragma_update(None, "user_version", to)
            .map_err(|e| internal(format!("migration {to}"), e))?;
        tx.commit()
            .map_err(|e| internal(format!("migration {to}"), e))?;
        tracing::info!(version = to, "store schema migrated");
    }
    Ok(found)
}
