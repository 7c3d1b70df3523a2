//! The PostgreSQL schema and its migrations, versioned in the table `troupe_schema`.
//!
//! Numbered by hand like the SQLite schema (`crate::schema`), for the same reasons: migration
//! `n` (1-based) moves the schema from version `n - 1` to `n`, each in a transaction of its
//! own that also sets the version (PostgreSQL's DDL is transactional, so a crash leaves a whole
//! version), and released migrations are never edited. Several nodes may start at once on one
//! database: every migration runs under a transaction-scoped advisory lock, and re-reads the
//! version under it, so exactly one node applies each.
//!
//! Text columns that are keys, cursors or sort orders are `COLLATE "C"`: rows sort by their
//! bytes, as SQLite sorts them, whatever locale the database was created with. A message's
//! content and a session's title are `BYTEA` holding UTF-8: PostgreSQL's `TEXT` cannot hold
//! a NUL character, which SQLite's can (and a user's text may).

use super::pg_err;
use deadpool_postgres::Client;
use troupe_proto::AgentError;

/// The schema version this build reads and writes.
pub const VERSION: i32 = MIGRATIONS.len() as i32;

/// The advisory lock every migration takes (`troupe` in ASCII).
const MIGRATION_LOCK: i64 = 0x7472_6f75_7065;

const MIGRATIONS: [&str; 6] = [
    V1,
    V2_AUTH_TOKENS,
    V3_SESSION_LEASES,
    V4_CLUSTER_NODES,
    V5_A2A_TASK_EXPIRY,
    V6_TOKEN_ARG_FIELDS,
];

/// A5: a token's patterns of named arguments (as the SQLite schema's version 10).
const V6_TOKEN_ARG_FIELDS: &str = r#"
ALTER TABLE auth_tokens ADD COLUMN arg_fields TEXT;
"#;

/// P5 under `ttl` (S10): an A2A task kept whole until its expiry, with the text-less body
/// the sweep puts in its place then (as the SQLite schema's version 9).
const V5_A2A_TASK_EXPIRY: &str = r#"
ALTER TABLE a2a_tasks ADD COLUMN redacted TEXT;
ALTER TABLE a2a_tasks ADD COLUMN expires_ms BIGINT;
CREATE INDEX a2a_tasks_by_expiry ON a2a_tasks (expires_ms) WHERE expires_ms IS NOT NULL;
"#;

/// The nodes of a cluster and where each answers its API (`crate::leases`): another node
/// forwards a call for a session to the API of the node that holds the session's lease.
const V4_CLUSTER_NODES: &str = r#"
CREATE TABLE cluster_nodes (
    node TEXT COLLATE "C" PRIMARY KEY,
    api_url TEXT NOT NULL,
    heartbeat_ms BIGINT NOT NULL
);
"#;

/// Which node owns which session (see `crate::leases`): the owner, its fencing token, and
/// until when. A row is never deleted (a release expires it), so a fence only grows. No
/// foreign key: a lease is taken before its session's row is written.
const V3_SESSION_LEASES: &str = r#"
CREATE TABLE session_leases (
    session_id TEXT COLLATE "C" PRIMARY KEY,
    owner TEXT COLLATE "C" NOT NULL,
    fence BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL
);
"#;

/// A5: authorization tokens, as SQLite's version 8 keeps them: the digest of the secret,
/// never the secret; a use counted by compare-and-set on `uses`.
const V2_AUTH_TOKENS: &str = r#"
CREATE TABLE auth_tokens (
    token_id TEXT COLLATE "C" PRIMARY KEY,
    row_id BIGINT GENERATED ALWAYS AS IDENTITY,
    digest TEXT COLLATE "C" NOT NULL UNIQUE,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    args TEXT,
    issued_by TEXT NOT NULL,
    issued_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL,
    max_uses BIGINT NOT NULL,
    uses BIGINT NOT NULL,
    revoked_ms BIGINT
);
"#;

/// Everything the SQLite schema holds at its version 7, in one step: sessions, conversations,
/// messages (with their queue status, type and Ttl expiry), each project's current session,
/// the rollout's records and high-water marks, agent bindings, and the A2A endpoint's records.
/// `row_id` columns keep the insertion order that SQLite's rowid gives (ties of `created_ms`)
/// and name a row in decoding errors.
///
/// Every write about a session locks its `sessions` row first (see `PgStore`): the place
/// where a later migration's lease and fencing token (a `session_leases` row checked in the
/// same transaction) will refuse the writes of a node that lost the session.
const V1: &str = r#"
CREATE TABLE sessions (
    session_id TEXT COLLATE "C" PRIMARY KEY,
    row_id BIGINT GENERATED ALWAYS AS IDENTITY,
    project_id TEXT COLLATE "C",
    title BYTEA,
    created_ms BIGINT NOT NULL,
    root_conversation_id TEXT COLLATE "C" NOT NULL,
    settings TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'active',
    updated_ms BIGINT NOT NULL
);
CREATE INDEX sessions_by_creation ON sessions (created_ms, row_id);
CREATE INDEX sessions_by_project ON sessions (project_id, created_ms, row_id);

CREATE TABLE conversations (
    conversation_id TEXT COLLATE "C" PRIMARY KEY,
    row_id BIGINT GENERATED ALWAYS AS IDENTITY,
    session_id TEXT COLLATE "C" NOT NULL REFERENCES sessions (session_id),
    params TEXT NOT NULL,
    is_root BOOLEAN NOT NULL,
    state TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    closed_ms BIGINT,
    ttl_secs BIGINT
);
CREATE INDEX conversations_by_session ON conversations (session_id, created_ms, row_id);
CREATE INDEX conversations_open ON conversations (session_id, created_ms, row_id)
    WHERE state = 'open';
CREATE INDEX conversations_with_ttl ON conversations (created_ms) WHERE ttl_secs IS NOT NULL;

-- An identity is never handed out twice, so a cursor never skips a newer row; within a
-- session ids are also in commit order (the session's row is locked before the insert).
CREATE TABLE messages (
    message_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id TEXT COLLATE "C" NOT NULL REFERENCES sessions (session_id),
    conversation_id TEXT COLLATE "C" NOT NULL REFERENCES conversations (conversation_id),
    task_id TEXT COLLATE "C",
    role TEXT NOT NULL,
    content BYTEA,
    chars BIGINT NOT NULL,
    created_ms BIGINT NOT NULL,
    expires_ms BIGINT,
    status TEXT,
    reply_message_id BIGINT,
    kind TEXT NOT NULL DEFAULT 'text',
    metadata TEXT
);
CREATE INDEX messages_by_session ON messages (session_id, message_id);
CREATE INDEX messages_by_conversation ON messages (conversation_id, created_ms);
CREATE INDEX messages_by_expiry ON messages (expires_ms) WHERE expires_ms IS NOT NULL;
CREATE INDEX messages_pending ON messages (session_id, message_id)
    WHERE status IN ('queued', 'running');

CREATE TABLE project_current (
    project_id TEXT COLLATE "C" PRIMARY KEY,
    session_id TEXT COLLATE "C" NOT NULL REFERENCES sessions (session_id)
);

-- No foreign key to sessions: a rollout is written before (and without) the session's row.
CREATE TABLE rollout_events (
    session_id TEXT COLLATE "C" NOT NULL,
    seq BIGINT NOT NULL,
    conversation_id TEXT COLLATE "C",
    task_id TEXT COLLATE "C",
    kind TEXT NOT NULL,
    ts_ms BIGINT NOT NULL,
    level TEXT NOT NULL,
    record TEXT NOT NULL,
    expires_ms BIGINT,
    PRIMARY KEY (session_id, seq)
);
CREATE INDEX rollout_events_by_conversation ON rollout_events (session_id, conversation_id, seq);
CREATE INDEX rollout_events_by_expiry ON rollout_events (expires_ms) WHERE expires_ms IS NOT NULL;

CREATE TABLE rollout_high_water (
    session_id TEXT COLLATE "C" PRIMARY KEY,
    high_water BIGINT NOT NULL
);

-- No foreign key to sessions either: a session's agent hub may bind before its row exists.
CREATE TABLE agent_bindings (
    session_id TEXT COLLATE "C" NOT NULL,
    agent_id TEXT COLLATE "C" NOT NULL,
    row_id BIGINT GENERATED ALWAYS AS IDENTITY,
    provider TEXT NOT NULL,
    provider_session_id TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (session_id, agent_id)
);

CREATE TABLE a2a_contexts (
    context_id TEXT COLLATE "C" PRIMARY KEY,
    row_id BIGINT GENERATED ALWAYS AS IDENTITY,
    session_id TEXT COLLATE "C" NOT NULL,
    conversation_id TEXT COLLATE "C" NOT NULL,
    created_ms BIGINT NOT NULL,
    active_ms BIGINT NOT NULL,
    open BOOLEAN NOT NULL
);
CREATE INDEX a2a_contexts_open ON a2a_contexts (created_ms, context_id) WHERE open;
CREATE INDEX a2a_contexts_closed ON a2a_contexts (active_ms) WHERE NOT open;

CREATE TABLE a2a_tasks (
    task_id TEXT COLLATE "C" PRIMARY KEY,
    row_id BIGINT GENERATED ALWAYS AS IDENTITY,
    context_id TEXT COLLATE "C" NOT NULL,
    state TEXT COLLATE "C" NOT NULL,
    terminal BOOLEAN NOT NULL,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX a2a_tasks_by_update ON a2a_tasks (updated_ms, task_id);
CREATE INDEX a2a_tasks_by_context ON a2a_tasks (context_id, updated_ms, task_id);
CREATE INDEX a2a_tasks_finished ON a2a_tasks (updated_ms, task_id) WHERE terminal;
CREATE INDEX a2a_tasks_live ON a2a_tasks (created_ms, task_id) WHERE NOT terminal;

CREATE TABLE a2a_push_configs (
    task_id TEXT COLLATE "C" NOT NULL,
    config_id TEXT COLLATE "C" NOT NULL,
    row_id BIGINT GENERATED ALWAYS AS IDENTITY,
    created_ms BIGINT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (task_id, config_id)
);
"#;

/// The schema version of the database (0: never migrated).
pub async fn version(client: &Client) -> Result<i32, AgentError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('troupe_schema') IS NOT NULL", &[])
        .await
        .and_then(|r| r.try_get(0))
        .map_err(pg_err("read schema version"))?;
    if !exists {
        return Ok(0);
    }
    client
        .query_opt("SELECT version FROM troupe_schema", &[])
        .await
        .map_err(pg_err("read schema version"))?
        .map(|r| r.try_get(0))
        .transpose()
        .map(|v| v.unwrap_or(0))
        .map_err(pg_err("read schema version"))
}

/// Brings the schema to [`VERSION`]; returns the version found before.
pub async fn migrate(client: &mut Client) -> Result<i32, AgentError> {
    migrate_to(client, VERSION).await
}

/// Brings the schema to `target` (tests stop at older versions).
pub async fn migrate_to(client: &mut Client, target: i32) -> Result<i32, AgentError> {
    let found = version(client).await?;
    if found > VERSION {
        return Err(AgentError::internal(format!(
            "database schema version {found} is newer than this build's {VERSION}"
        )));
    }
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let to = i32::try_from(index + 1).unwrap_or(i32::MAX);
        if to > target {
            break;
        }
        let what = format!("migration {to}");
        let tx = client.transaction().await.map_err(pg_err(what.clone()))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(pg_err(what.clone()))?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS troupe_schema (version INTEGER NOT NULL);
             INSERT INTO troupe_schema (version)
                 SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM troupe_schema);",
        )
        .await
        .map_err(pg_err(what.clone()))?;
        // Under the lock: another node may have migrated meanwhile.
        let now: i32 = tx
            .query_one("SELECT version FROM troupe_schema", &[])
            .await
            .and_then(|r| r.try_get(0))
            .map_err(pg_err(what.clone()))?;
        if now >= to {
            continue;
        }
        tx.batch_execute(sql).await.map_err(pg_err(what.clone()))?;
        tx.execute("UPDATE troupe_schema SET version = $1", &[&to])
            .await
            .map_err(pg_err(what.clone()))?;
        tx.commit().await.map_err(pg_err(what))?;
        tracing::info!(version = to, "postgres store schema migrated");
    }
    Ok(found)
}
