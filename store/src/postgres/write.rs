//! The SQL of each write, inside the transaction the caller opened. The rules (what is
//! `NotFound`, what is `InvalidInput`, what moves a session's `updated_ms`) are the SQLite
//! store's (`crate::sqlite::writer`), checked in the same order.
//!
//! Locks: a write about a session locks the session's row (`UPDATE sessions ...`) before it
//! inserts, so that the session's message ids are in commit order and concurrent writes of
//! one session are serialised as on SQLite; starting or ending a message locks the message's
//! row first, so that two nodes cannot both start or end it. With a node name, every write
//! about a session first checks this node's fence against the session's lease
//! ([`Fencing::check`]).

use super::leases::Fencing;
use super::rows::{MESSAGE_SELECT, message_from_row};
use super::sql::{col, decoded, exec, row, rows};
use crate::conn::to_sql_int;
use crate::sqlite::{role_str, state_str};
use deadpool_postgres::Transaction;
use troupe_proto::store::{
    ConversationRecord, FinishMessage, FinishedMessage, MessageRecord, MessageStatus, NewMessage,
    SessionRecord, SessionStatus,
};
use troupe_proto::{
    AgentError, ConversationId, OpenConversation, Role, SessionId, StoragePolicy, TaskId,
};

type Tx<'a> = Transaction<'a>;

fn encode(what: &str, value: &impl serde::Serialize) -> Result<String, AgentError> {
    serde_json::to_string(value).map_err(|e| AgentError::internal(format!("encode {what}: {e}")))
}

/// The `ttl_secs` column of a policy: its ttl under `Ttl` (saturating), else NULL.
fn ttl_secs(policy: StoragePolicy) -> Option<i64> {
    match policy {
        StoragePolicy::Ttl { secs } => Some(i64::try_from(secs).unwrap_or(i64::MAX)),
        _ => None,
    }
}

/// The store's clock or `at_ms`, whichever is later, as a column value.
fn touch_time(at_ms: u64) -> Result<i64, AgentError> {
    to_sql_int("updated_ms", at_ms.max(troupe_actors::clock::unix_now_ms()))
}

/// Locks a session's row and moves its `updated_ms` to `at_ms` (or the store's clock), never
/// back, and sets its status when one is given; `false` if there is no such session.
pub(super) async fn touch(
    tx: &Tx<'_>,
    fencing: &Fencing,
    session_id: &str,
    at_ms: u64,
    status: Option<SessionStatus>,
) -> Result<bool, AgentError> {
    fencing.check(tx, session_id).await?;
    let at = touch_time(at_ms)?;
    let status = status.map(SessionStatus::as_str);
    let n = exec(
        tx,
        "touch session",
        "UPDATE sessions SET updated_ms = GREATEST(updated_ms, $2), status = COALESCE($3, status)
         WHERE session_id = $1",
        &[&session_id, &at, &status],
    )
    .await?;
    Ok(n > 0)
}

/// The project of an existing session (`Some(None)`: outside any project), `None` if unknown.
async fn session_project(
    tx: &Tx<'_>,
    session_id: &str,
) -> Result<Option<Option<String>>, AgentError> {
    row(
        tx,
        "read session",
        "SELECT project_id FROM sessions WHERE session_id = $1",
        &[&session_id],
    )
    .await?
    .map(|r| col(&r, 0, "read session"))
    .transpose()
}

/// The session of an existing conversation and the ttl of its policy.
async fn conversation_owner(
    tx: &Tx<'_>,
    id: &str,
) -> Result<Option<(String, Option<i64>)>, AgentError> {
    row(
        tx,
        "read conversation",
        "SELECT session_id, ttl_secs FROM conversations WHERE conversation_id = $1",
        &[&id],
    )
    .await?
    .map(|r| {
        Ok((
            col(&r, 0, "read conversation")?,
            col(&r, 1, "read conversation")?,
        ))
    })
    .transpose()
}

pub(super) async fn create_session(
    tx: &Tx<'_>,
    fencing: &Fencing,
    s: &SessionRecord,
) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", s.created_ms)?;
    let updated_ms = to_sql_int("updated_ms", s.updated_ms.max(s.created_ms))?;
    let settings = encode("settings", &s.settings.0)?;
    fencing.check(tx, &s.session_id.to_string()).await?;
    let inserted = exec(
        tx,
        "insert session",
        "INSERT INTO sessions (session_id, project_id, title, created_ms, root_conversation_id,
             settings, status, updated_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (session_id) DO NOTHING",
        &[
            &s.session_id.to_string(),
            &s.project_id,
            &s.title.as_deref().map(str::as_bytes),
            &created_ms,
            &s.root_conversation_id.to_string(),
            &settings,
            &s.status.as_str(),
            &updated_ms,
        ],
    )
    .await?;
    if inserted == 0 {
        return Err(AgentError::invalid(format!(
            "session {} already exists",
            s.session_id
        )));
    }
    Ok(())
}

pub(super) async fn put_conversation(
    tx: &Tx<'_>,
    fencing: &Fencing,
    conv: &ConversationRecord,
) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", conv.created_ms)?;
    let closed_ms = conv
        .closed_ms
        .map(|ms| to_sql_int("closed_ms", ms))
        .transpose()?;
    let session_id = conv.session_id.to_string();
    if !touch(
        tx,
        fencing,
        &session_id,
        conv.closed_ms.unwrap_or(conv.created_ms),
        None,
    )
    .await?
    {
        return Err(AgentError::not_found("session", conv.session_id));
    }
    let conversation_id = conv.conversation_id.to_string();
    if let Some((owner, _)) = conversation_owner(tx, &conversation_id).await?
        && owner != session_id
    {
        return Err(AgentError::invalid(format!(
            "conversation {} belongs to session {owner}, not {session_id}",
            conv.conversation_id
        )));
    }
    let params = encode("conversation params", &conv.params)?;
    exec(
        tx,
        "upsert conversation",
        "INSERT INTO conversations (conversation_id, session_id, params, is_root, state,
             created_ms, closed_ms, ttl_secs)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (conversation_id) DO UPDATE SET
             params = excluded.params, is_root = excluded.is_root, state = excluded.state,
             created_ms = excluded.created_ms, closed_ms = excluded.closed_ms,
             ttl_secs = excluded.ttl_secs",
        &[
            &conversation_id,
            &session_id,
            &params,
            &conv.is_root,
            &state_str(conv.state),
            &created_ms,
            &closed_ms,
            &ttl_secs(conv.params.storage_policy),
        ],
    )
    .await?;
    Ok(())
}

pub(super) async fn close_conversation(
    tx: &Tx<'_>,
    fencing: &Fencing,
    id: ConversationId,
    closed_ms: u64,
) -> Result<(), AgentError> {
    let at = to_sql_int("closed_ms", closed_ms)?;
    // Closing twice keeps the first close time.
    let closed = row(
        tx,
        "close conversation",
        "UPDATE conversations SET state = 'closed', closed_ms = COALESCE(closed_ms, $2)
         WHERE conversation_id = $1 RETURNING session_id",
        &[&id.to_string(), &at],
    )
    .await?;
    let Some(closed) = closed else {
        return Err(AgentError::not_found("conversation", id));
    };
    let session: String = col(&closed, 0, "close conversation")?;
    touch(tx, fencing, &session, closed_ms, None)
        .await
        .map(drop)
}

pub(super) async fn append_message(
    tx: &Tx<'_>,
    fencing: &Fencing,
    m: &NewMessage,
) -> Result<MessageRecord, AgentError> {
    let chars = to_sql_int("chars", m.chars)?;
    let created_ms = to_sql_int("created_ms", m.created_ms)?;
    let metadata = m
        .metadata
        .as_ref()
        .map(|j| encode("message metadata", &j.0))
        .transpose()?;
    let session_id = m.session_id.to_string();
    let ttl = match conversation_owner(tx, &m.conversation_id.to_string()).await? {
        Some((owner, ttl)) if owner == session_id => ttl,
        Some((owner, _)) => {
            return Err(AgentError::invalid(format!(
                "conversation {} belongs to session {owner}, not {session_id}",
                m.conversation_id
            )));
        }
        None => {
            if session_project(tx, &session_id).await?.is_none() {
                return Err(AgentError::not_found("session", m.session_id));
            }
            return Err(AgentError::not_found("conversation", m.conversation_id));
        }
    };
    // A user message makes its session active. The session's row is locked from here on.
    let status = m.status.map(|_| SessionStatus::Active);
    if !touch(tx, fencing, &session_id, m.created_ms, status).await? {
        return Err(AgentError::not_found("session", m.session_id));
    }
    let expires_ms = ttl
        .filter(|_| m.content.is_some())
        .map(|secs| created_ms.saturating_add(secs.saturating_mul(1000)));
    let inserted = row(
        tx,
        "insert message",
        "INSERT INTO messages (session_id, conversation_id, task_id, role, content, chars,
             created_ms, expires_ms, status, kind, metadata)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING message_id",
        &[
            &session_id,
            &m.conversation_id.to_string(),
            &m.task_id.map(|t| t.to_string()),
            &role_str(m.role),
            &m.content.as_deref().map(str::as_bytes),
            &chars,
            &created_ms,
            &expires_ms,
            &m.status.map(MessageStatus::as_str),
            &m.kind.as_str(),
            &metadata,
        ],
    )
    .await?
    .ok_or_else(|| AgentError::internal("insert message returned no id"))?;
    let id: i64 = col(&inserted, 0, "insert message")?;
    Ok(MessageRecord {
        message_id: u64::try_from(id)
            .map_err(|e| AgentError::internal(format!("message_id: {e}")))?,
        session_id: m.session_id,
        conversation_id: m.conversation_id,
        task_id: m.task_id,
        role: m.role,
        content: m.content.clone(),
        chars: m.chars,
        created_ms: m.created_ms,
        status: m.status,
        reply_message_id: None,
        kind: m.kind,
        metadata: m.metadata.clone(),
    })
}

/// A user message that exists, locked for the rest of the transaction; or `NotFound`.
async fn lock_user_message(tx: &Tx<'_>, message_id: u64) -> Result<MessageRecord, AgentError> {
    let id = i64::try_from(message_id).unwrap_or(i64::MAX);
    decoded(
        tx,
        "read message",
        &format!("{MESSAGE_SELECT} WHERE message_id = $1 FOR UPDATE"),
        &[&id],
        message_from_row,
    )
    .await?
    .pop()
    .filter(|m| m.role == Role::User)
    .ok_or_else(|| AgentError::not_found("message", message_id))
}

async fn set_status(
    tx: &Tx<'_>,
    message_id: u64,
    status: MessageStatus,
    task_id: Option<TaskId>,
    reply_message_id: Option<u64>,
) -> Result<(), AgentError> {
    let id = to_sql_int("message_id", message_id)?;
    let reply = reply_message_id
        .map(|r| to_sql_int("reply_message_id", r))
        .transpose()?;
    exec(
        tx,
        "update message status",
        "UPDATE messages SET status = $2, task_id = COALESCE($3, task_id),
             reply_message_id = COALESCE($4, reply_message_id)
         WHERE message_id = $1",
        &[
            &id,
            &status.as_str(),
            &task_id.map(|t| t.to_string()),
            &reply,
        ],
    )
    .await
    .map(drop)
}

fn status_name(status: Option<MessageStatus>) -> &'static str {
    status.map_or("without a status", MessageStatus::as_str)
}

pub(super) async fn start_message(
    tx: &Tx<'_>,
    fencing: &Fencing,
    message_id: u64,
) -> Result<MessageRecord, AgentError> {
    let mut m = lock_user_message(tx, message_id).await?;
    if m.status != Some(MessageStatus::Queued) {
        return Err(AgentError::invalid(format!(
            "message {message_id} is {}, not queued",
            status_name(m.status)
        )));
    }
    set_status(tx, message_id, MessageStatus::Running, None, None).await?;
    touch(tx, fencing, &m.session_id.to_string(), 0, None).await?;
    m.status = Some(MessageStatus::Running);
    Ok(m)
}

pub(super) async fn finish_message(
    tx: &Tx<'_>,
    fencing: &Fencing,
    f: &FinishMessage,
) -> Result<FinishedMessage, AgentError> {
    if !f.status.is_terminal() {
        return Err(AgentError::invalid(format!(
            "{} is not an outcome",
            f.status.as_str()
        )));
    }
    let mut m = lock_user_message(tx, f.message_id).await?;
    if m.status.is_some_and(MessageStatus::is_terminal) {
        return Err(AgentError::invalid(format!(
            "message {} already ended {}",
            f.message_id,
            status_name(m.status)
        )));
    }
    let mut items = Vec::with_capacity(f.items.len());
    for item in &f.items {
        items.push(append_message(tx, fencing, item).await?);
    }
    let reply = match &f.reply {
        Some(r) => Some(append_message(tx, fencing, r).await?),
        None => None,
    };
    let reply_id = reply.as_ref().map(|r| r.message_id);
    set_status(tx, f.message_id, f.status, f.task_id, reply_id).await?;
    if !touch(tx, fencing, &m.session_id.to_string(), 0, f.session_status).await? {
        return Err(AgentError::not_found("session", m.session_id));
    }
    m.status = Some(f.status);
    m.task_id = f.task_id.or(m.task_id);
    m.reply_message_id = reply_id.or(m.reply_message_id);
    Ok(FinishedMessage {
        message: m,
        items,
        reply,
    })
}

/// Drops the content of every message due at `now_ms`, the instructions of every Ttl
/// conversation opened at least its ttl before, and the text of every A2A task due (its
/// text-less body in place of its body); how many of all three. A conversation's
/// parameters are rewritten from their decoded form, as `without_instructions` has them.
pub(super) async fn sweep_due(tx: &Tx<'_>, now_ms: u64) -> Result<u64, AgentError> {
    let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
    let messages = exec(
        tx,
        "sweep due messages",
        "UPDATE messages SET content = NULL, expires_ms = NULL WHERE expires_ms <= $1",
        &[&now],
    )
    .await?;
    let due = rows(
        tx,
        "sweep due conversation instructions",
        "SELECT conversation_id, params FROM conversations
         WHERE ttl_secs IS NOT NULL
           AND CASE WHEN ttl_secs > (9223372036854775807 - created_ms) / 1000
               THEN 9223372036854775807 ELSE created_ms + ttl_secs * 1000 END <= $1
         FOR UPDATE",
        &[&now],
    )
    .await?;
    let mut conversations = 0u64;
    for r in &due {
        let id: &str = col(r, 0, "sweep due conversation instructions")?;
        let text: &str = col(r, 1, "sweep due conversation instructions")?;
        let params: OpenConversation = serde_json::from_str(text).map_err(|e| {
            AgentError::internal(format!(
                "corrupt conversations row {id}: column params: {e}"
            ))
        })?;
        if params.base_instructions.is_none() && params.user_instructions.is_none() {
            continue;
        }
        let swept = encode("conversation params", &params.without_instructions())?;
        exec(
            tx,
            "sweep due conversation instructions",
            "UPDATE conversations SET params = $2 WHERE conversation_id = $1",
            &[&id, &swept],
        )
        .await?;
        conversations += 1;
    }
    let a2a_tasks = exec(
        tx,
        "sweep due a2a tasks",
        "UPDATE a2a_tasks SET body = redacted, redacted = NULL, expires_ms = NULL
         WHERE expires_ms <= $1 AND redacted IS NOT NULL",
        &[&now],
    )
    .await?;
    Ok(messages + conversations + a2a_tasks)
}

pub(super) async fn set_current(
    tx: &Tx<'_>,
    project_id: &str,
    session_id: SessionId,
) -> Result<(), AgentError> {
    let id = session_id.to_string();
    match session_project(tx, &id).await? {
        None => return Err(AgentError::not_found("session", session_id)),
        Some(project) if project.as_deref() != Some(project_id) => {
            return Err(AgentError::invalid(format!(
                "session {session_id} does not belong to project {project_id}"
            )));
        }
        Some(_) => {}
    }
    exec(
        tx,
        "set current session",
        "INSERT INTO project_current (project_id, session_id) VALUES ($1, $2)
         ON CONFLICT (project_id) DO UPDATE SET session_id = excluded.session_id",
        &[&project_id, &id],
    )
    .await
    .map(drop)
}

pub(super) async fn set_session_status(
    tx: &Tx<'_>,
    fencing: &Fencing,
    session_id: SessionId,
    status: SessionStatus,
    at_ms: u64,
) -> Result<(), AgentError> {
    if !touch(tx, fencing, &session_id.to_string(), at_ms, Some(status)).await? {
        return Err(AgentError::not_found("session", session_id));
    }
    Ok(())
}

pub(super) async fn put_binding(
    tx: &Tx<'_>,
    fencing: &Fencing,
    b: &troupe_proto::agent::AgentBinding,
) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", b.created_ms)?;
    let updated_ms = to_sql_int("updated_ms", b.updated_ms)?;
    fencing.check(tx, &b.session_id.to_string()).await?;
    exec(
        tx,
        "put binding",
        "INSERT INTO agent_bindings
             (session_id, agent_id, provider, provider_session_id, created_ms, updated_ms)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (session_id, agent_id) DO UPDATE SET
             provider = excluded.provider,
             provider_session_id = excluded.provider_session_id,
             created_ms = excluded.created_ms,
             updated_ms = excluded.updated_ms",
        &[
            &b.session_id.to_string(),
            &b.agent_id,
            &b.provider.as_str(),
            &b.provider_session_id,
            &created_ms,
            &updated_ms,
        ],
    )
    .await
    .map(drop)
}

pub(super) async fn remove_binding(
    tx: &Tx<'_>,
    fencing: &Fencing,
    session_id: SessionId,
    agent_id: &str,
) -> Result<(), AgentError> {
    fencing.check(tx, &session_id.to_string()).await?;
    exec(
        tx,
        "remove binding",
        "DELETE FROM agent_bindings WHERE session_id = $1 AND agent_id = $2",
        &[&session_id.to_string(), &agent_id],
    )
    .await
    .map(drop)
}

/// Adds a token (its digest, never its secret); one with the same id or digest is refused.
pub(super) async fn insert_token(
    tx: &Tx<'_>,
    t: &troupe_proto::governance::AuthToken,
) -> Result<(), AgentError> {
    let issued_ms = to_sql_int("issued_ms", t.issued_ms)?;
    let expires_ms = to_sql_int("expires_ms", t.expires_ms)?;
    let revoked_ms = t
        .revoked_ms
        .map(|r| to_sql_int("revoked_ms", r))
        .transpose()?;
    let inserted = exec(
        tx,
        "insert token",
        "INSERT INTO auth_tokens (token_id, digest, agent, tool, args, issued_by, issued_ms,
             expires_ms, max_uses, uses, revoked_ms, arg_fields)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
         ON CONFLICT DO NOTHING",
        &[
            &t.id,
            &t.digest,
            &t.scope.agent,
            &t.scope.tool,
            &t.scope.args,
            &t.issued_by,
            &issued_ms,
            &expires_ms,
            &i64::from(t.max_uses),
            &i64::from(t.uses),
            &revoked_ms,
            &crate::arg_fields_column(&t.scope.fields),
        ],
    )
    .await?;
    if inserted == 0 {
        return Err(AgentError::invalid("a token with this id or secret exists"));
    }
    Ok(())
}

/// Counts one use if the token has had exactly `uses` and is in force at `now_ms`: whether
/// it was counted.
pub(super) async fn use_token(
    tx: &Tx<'_>,
    id: &str,
    uses: u32,
    now_ms: u64,
) -> Result<bool, AgentError> {
    let now_ms = to_sql_int("now_ms", now_ms)?;
    let changed = exec(
        tx,
        "use token",
        "UPDATE auth_tokens SET uses = uses + 1
         WHERE token_id = $1 AND uses = $2 AND uses < max_uses AND revoked_ms IS NULL
           AND expires_ms > $3",
        &[&id, &i64::from(uses), &now_ms],
    )
    .await?;
    Ok(changed == 1)
}

/// Revokes a token (keeping its first revocation): whether there is such a token.
pub(super) async fn revoke_token(tx: &Tx<'_>, id: &str, at_ms: u64) -> Result<bool, AgentError> {
    let at_ms = to_sql_int("revoked_ms", at_ms)?;
    let changed = exec(
        tx,
        "revoke token",
        "UPDATE auth_tokens SET revoked_ms = coalesce(revoked_ms, $2) WHERE token_id = $1",
        &[&id, &at_ms],
    )
    .await?;
    Ok(changed == 1)
}
