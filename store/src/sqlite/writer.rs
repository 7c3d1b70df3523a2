//! The writer thread: the only writing connection, the queue of writes it drains, the batch it
//! commits in one transaction (each write in a savepoint of its own, a lone write in none),
//! and the SQL of each write.

use super::MAX_BATCH;
use super::a2a;
use super::rows::{MESSAGE_SELECT, message_from_row, query_all, role_str, state_str};
use crate::conn::{self, internal, to_sql_int};
use crate::metrics::{self, Writer};
use rusqlite::{Connection, OptionalExtension, params};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use tracing::Span;
use troupe_proto::store::{
    A2aContextRecord, A2aPruned, A2aPushRecord, A2aTaskRecord, ConversationRecord, FinishMessage,
    FinishedMessage, MessageRecord, MessageStatus, NewMessage, SessionRecord, SessionStatus,
};
use troupe_proto::{AgentError, ConversationId, Role, SessionId, StoragePolicy, TaskId};

/// A write, as queued for the writer thread.
pub(super) struct WriteJob {
    pub(super) op: WriteOp,
    pub(super) reply: oneshot::Sender<Result<WriteOutput, AgentError>>,
    /// The caller's span: the writer applies the write inside it.
    pub(super) span: Span,
    /// For the queue-wait metric.
    pub(super) enqueued: Instant,
}

pub(super) enum WriteOp {
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
    /// Drops the content of every message (and the instructions of every conversation) due
    /// at `now_ms`.
    SweepDue {
        now_ms: u64,
    },
    SetCurrentSession {
        project_id: String,
        session_id: SessionId,
    },
    SetSessionStatus {
        session_id: SessionId,
        status: SessionStatus,
        at_ms: u64,
    },
    PutA2aContext(A2aContextRecord),
    PutA2aTask(A2aTaskRecord),
    PutA2aPush(A2aPushRecord),
    DeleteA2aPush {
        task_id: String,
        config_id: String,
    },
    PruneA2a {
        keep_finished: usize,
    },
    PutBinding(troupe_proto::agent::AgentBinding),
    RemoveBinding {
        session_id: SessionId,
        agent_id: String,
    },
    InsertToken(troupe_proto::governance::AuthToken),
    UseToken {
        id: String,
        uses: u32,
        now_ms: u64,
    },
    RevokeToken {
        id: String,
        at_ms: u64,
    },
}

pub(super) enum WriteOutput {
    Done,
    Message(MessageRecord),
    Finished(Box<FinishedMessage>),
    Count(u64),
    Flag(bool),
    Pruned(A2aPruned),
}

/// The writing connection, shared by the writer thread and the callers' fast path
/// ([`super::SqliteStore`]'s `write`): whoever holds the lock writes.
pub(super) type SharedConn = Arc<Mutex<Connection>>;

pub(super) use crate::conn::{lock, try_lock};

pub(super) fn writer_loop(conn: SharedConn, mut queue: mpsc::Receiver<WriteJob>) {
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
        let mut conn = lock(&conn);
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
        drop(conn);
        for (job, result) in batch.drain(..).zip(results) {
            let _ = job.reply.send(result);
        }
    }
    tracing::debug!("store writer stopped");
}

/// Truncates the WAL after a sweep; an error when it could not.
pub(super) fn truncate_after_sweep(conn: &Connection) -> Result<(), AgentError> {
    match conn::truncate_wal(conn) {
        Ok(true) => Ok(()),
        Ok(false) => Err(AgentError::internal(
            "ttl sweep: the WAL could not be truncated (readers or a checkpoint kept it busy); \
             the next sweep tries again",
        )),
        Err(e) => Err(e),
    }
}

/// Applies every write of `batch` in one transaction, each in its own savepoint (a lone write
/// in none: see [`crate::conn::write_batch`]); one result per write. If the transaction
/// cannot begin or commit, every write fails.
pub(super) fn commit_batch(
    conn: &mut Connection,
    batch: &[WriteJob],
) -> Vec<Result<WriteOutput, AgentError>> {
    let committed = conn::write_batch(
        conn,
        batch,
        |c, job| {
            let _entered = job.span.enter();
            apply(c, &job.op)
        },
        |what, e| internal(format!("store {what}"), e),
    );
    match committed {
        Ok(results) => results,
        Err(e) => {
            tracing::error!(error = %e, writes = batch.len(), "store commit failed");
            batch.iter().map(|_| Err(e.clone())).collect()
        }
    }
}

/// One write in a transaction of its own (the fast path, on the caller's thread); `None`
/// when another connection holds the write lock: the write goes to the writer thread, which
/// waits for it, instead of this thread.
pub(super) fn try_commit_one(
    conn: &mut Connection,
    op: &WriteOp,
) -> Option<Result<WriteOutput, AgentError>> {
    match conn::try_begin_immediate(conn) {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => return Some(Err(internal("store begin", e))),
    }
    let committed = conn::write_begun(conn, [op], apply, |what, e| {
        internal(format!("store {what}"), e)
    });
    Some(match committed {
        Ok(mut results) => results
            .pop()
            .unwrap_or_else(|| Err(AgentError::internal("store write without a result"))),
        Err(e) => {
            tracing::error!(error = %e, writes = 1, "store commit failed");
            Err(e)
        }
    })
}

/// One write, inside the writer's transaction.
pub(super) fn apply(c: &Connection, op: &WriteOp) -> Result<WriteOutput, AgentError> {
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
        WriteOp::SetSessionStatus {
            session_id,
            status,
            at_ms,
        } => set_session_status(c, *session_id, *status, *at_ms).map(|()| WriteOutput::Done),
        WriteOp::PutA2aContext(r) => a2a::put_context(c, r).map(|()| WriteOutput::Done),
        WriteOp::PutA2aTask(r) => a2a::put_task(c, r).map(|()| WriteOutput::Done),
        WriteOp::PutA2aPush(r) => a2a::put_push(c, r).map(|()| WriteOutput::Done),
        WriteOp::DeleteA2aPush { task_id, config_id } => {
            a2a::delete_push(c, task_id, config_id).map(WriteOutput::Flag)
        }
        WriteOp::PruneA2a { keep_finished } => {
            a2a::prune(c, *keep_finished).map(WriteOutput::Pruned)
        }
        WriteOp::PutBinding(b) => put_binding(c, b).map(|()| WriteOutput::Done),
        WriteOp::RemoveBinding {
            session_id,
            agent_id,
        } => remove_binding(c, *session_id, agent_id).map(|()| WriteOutput::Done),
        WriteOp::InsertToken(t) => insert_token(c, t).map(|()| WriteOutput::Done),
        WriteOp::UseToken { id, uses, now_ms } => {
            use_token(c, id, *uses, *now_ms).map(WriteOutput::Flag)
        }
        WriteOp::RevokeToken { id, at_ms } => revoke_token(c, id, *at_ms).map(WriteOutput::Flag),
    }
}

/// Adds a token (its digest, never its secret).
pub(super) fn insert_token(
    c: &Connection,
    t: &troupe_proto::governance::AuthToken,
) -> Result<(), AgentError> {
    let issued_ms = to_sql_int("issued_ms", t.issued_ms)?;
    let expires_ms = to_sql_int("expires_ms", t.expires_ms)?;
    let revoked_ms = t
        .revoked_ms
        .map(|r| to_sql_int("revoked_ms", r))
        .transpose()?;
    let exists = c
        .prepare_cached("SELECT 1 FROM auth_tokens WHERE token_id = ?1 OR digest = ?2")
        .and_then(|mut st| st.exists(params![t.id, t.digest]))
        .map_err(sql("insert token"))?;
    if exists {
        return Err(AgentError::invalid("a token with this id or secret exists"));
    }
    c.prepare_cached(
        "INSERT INTO auth_tokens (token_id, digest, agent, tool, args, issued_by, issued_ms,
             expires_ms, max_uses, uses, revoked_ms, arg_fields)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )
    .and_then(|mut st| {
        st.execute(params![
            t.id,
            t.digest,
            t.scope.agent,
            t.scope.tool,
            t.scope.args,
            t.issued_by,
            issued_ms,
            expires_ms,
            t.max_uses,
            t.uses,
            revoked_ms,
            crate::arg_fields_column(&t.scope.fields),
        ])
    })
    .map_err(sql("insert token"))?;
    Ok(())
}

/// Counts one use if the token has had exactly `uses` and is in force at `now_ms`: whether
/// it was counted.
pub(super) fn use_token(
    c: &Connection,
    id: &str,
    uses: u32,
    now_ms: u64,
) -> Result<bool, AgentError> {
    let now_ms = to_sql_int("now_ms", now_ms)?;
    let changed = c
        .prepare_cached(
            "UPDATE auth_tokens SET uses = uses + 1
             WHERE token_id = ?1 AND uses = ?2 AND uses < max_uses AND revoked_ms IS NULL
               AND expires_ms > ?3",
        )
        .and_then(|mut st| st.execute(params![id, uses, now_ms]))
        .map_err(sql("use token"))?;
    Ok(changed == 1)
}

/// Revokes a token (keeping its first revocation): whether there is such a token.
pub(super) fn revoke_token(c: &Connection, id: &str, at_ms: u64) -> Result<bool, AgentError> {
    let at_ms = to_sql_int("revoked_ms", at_ms)?;
    let changed = c
        .prepare_cached(
            "UPDATE auth_tokens SET revoked_ms = coalesce(revoked_ms, ?2) WHERE token_id = ?1",
        )
        .and_then(|mut st| st.execute(params![id, at_ms]))
        .map_err(sql("revoke token"))?;
    Ok(changed == 1)
}

/// Inserts or replaces the binding of (session, agent).
pub(super) fn put_binding(
    c: &Connection,
    b: &troupe_proto::agent::AgentBinding,
) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", b.created_ms)?;
    let updated_ms = to_sql_int("updated_ms", b.updated_ms)?;
    c.prepare_cached(
        "INSERT INTO agent_bindings
             (session_id, agent_id, provider, provider_session_id, created_ms, updated_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (session_id, agent_id) DO UPDATE SET
             provider = excluded.provider,
             provider_session_id = excluded.provider_session_id,
             created_ms = excluded.created_ms,
             updated_ms = excluded.updated_ms",
    )
    .and_then(|mut st| {
        st.execute(params![
            b.session_id.to_string(),
            b.agent_id,
            b.provider.as_str(),
            b.provider_session_id,
            created_ms,
            updated_ms
        ])
    })
    .map_err(sql("put binding"))?;
    Ok(())
}

pub(super) fn remove_binding(
    c: &Connection,
    session_id: SessionId,
    agent_id: &str,
) -> Result<(), AgentError> {
    c.prepare_cached("DELETE FROM agent_bindings WHERE session_id = ?1 AND agent_id = ?2")
        .and_then(|mut st| st.execute(params![session_id.to_string(), agent_id]))
        .map_err(sql("remove binding"))?;
    Ok(())
}

pub(super) fn sql(what: &'static str) -> impl Fn(rusqlite::Error) -> AgentError {
    move |e| internal(what, e)
}

/// The project of an existing session (`Some(None)`: outside any project), `None` if unknown.
pub(super) fn session_project(
    c: &Connection,
    id: SessionId,
) -> Result<Option<Option<String>>, AgentError> {
    c.prepare_cached("SELECT project_id FROM sessions WHERE session_id = ?1")
        .and_then(|mut s| s.query_row([id.to_string()], |r| r.get(0)).optional())
        .map_err(sql("read session"))
}

/// The session of an existing conversation, as stored text; `None` if unknown.
pub(super) fn conversation_session(
    c: &Connection,
    id: ConversationId,
) -> Result<Option<String>, AgentError> {
    Ok(conversation_owner(c, id)?.map(|(session, _)| session))
}

/// The session of an existing conversation and the ttl of its policy (`None`: not `Ttl`).
pub(super) fn conversation_owner(
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
pub(super) fn ttl_secs(policy: StoragePolicy) -> Option<i64> {
    match policy {
        StoragePolicy::Ttl { secs } => Some(i64::try_from(secs).unwrap_or(i64::MAX)),
        _ => None,
    }
}

pub(super) fn create_session(c: &Connection, s: &SessionRecord) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", s.created_ms)?;
    let updated_ms = to_sql_int("updated_ms", s.updated_ms.max(s.created_ms))?;
    if session_project(c, s.session_id)?.is_some() {
        return Err(AgentError::invalid(format!(
            "session {} already exists",
            s.session_id
        )));
    }
    let settings =
        serde_json::to_string(&s.settings.0).map_err(|e| internal("encode settings", e))?;
    c.prepare_cached(
        "INSERT INTO sessions (session_id, project_id, title, created_ms, root_conversation_id, settings, status, updated_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )
    .and_then(|mut st| {
        st.execute(params![
            s.session_id.to_string(),
            s.project_id,
            s.title,
            created_ms,
            s.root_conversation_id.to_string(),
            settings,
            s.status.as_str(),
            updated_ms,
        ])
    })
    .map_err(sql("insert session"))?;
    Ok(())
}

pub(super) fn put_conversation(
    c: &Connection,
    conv: &ConversationRecord,
) -> Result<(), AgentError> {
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
    touch(c, &session_id, conv.closed_ms.unwrap_or(conv.created_ms))
}

pub(super) fn close_conversation(
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
    match conversation_session(c, id)? {
        Some(session) => touch(c, &session, u64::try_from(closed_ms).unwrap_or(0)),
        None => Ok(()),
    }
}

pub(super) fn append_message(c: &Connection, m: &NewMessage) -> Result<MessageRecord, AgentError> {
    let chars = to_sql_int("chars", m.chars)?;
    let created_ms = to_sql_int("created_ms", m.created_ms)?;
    let metadata = m
        .metadata
        .as_ref()
        .map(|j| serde_json::to_string(&j.0))
        .transpose()
        .map_err(|e| internal("encode message metadata", e))?;
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
        "INSERT INTO messages (session_id, conversation_id, task_id, role, content, chars, created_ms, expires_ms, status, kind, metadata)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
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
            m.kind.as_str(),
            metadata,
        ])
    })
    .map_err(sql("insert message"))?;
    let message_id = u64::try_from(c.last_insert_rowid()).map_err(|e| internal("message_id", e))?;
    // A user message (it has a status) makes its session active.
    let status = m.status.map(|_| SessionStatus::Active);
    touch_and_set(c, m.session_id, &session_id, status, m.created_ms)?;
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
        kind: m.kind,
        metadata: m.metadata.clone(),
    })
}

/// One message by id.
pub(super) fn message_by_id(
    c: &Connection,
    message_id: u64,
) -> Result<Option<MessageRecord>, AgentError> {
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
pub(super) fn user_message(c: &Connection, message_id: u64) -> Result<MessageRecord, AgentError> {
    message_by_id(c, message_id)?
        .filter(|m| m.role == Role::User)
        .ok_or_else(|| AgentError::not_found("message", message_id))
}

pub(super) fn set_status(
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

pub(super) fn start_message(c: &Connection, message_id: u64) -> Result<MessageRecord, AgentError> {
    let mut m = user_message(c, message_id)?;
    if m.status != Some(MessageStatus::Queued) {
        return Err(AgentError::invalid(format!(
            "message {message_id} is {}, not queued",
            status_name(m.status)
        )));
    }
    set_status(c, message_id, MessageStatus::Running, None, None)?;
    touch(c, &m.session_id.to_string(), 0)?;
    m.status = Some(MessageStatus::Running);
    Ok(m)
}

pub(super) fn finish_message(
    c: &Connection,
    f: &FinishMessage,
) -> Result<FinishedMessage, AgentError> {
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
    let items = f
        .items
        .iter()
        .map(|i| append_message(c, i))
        .collect::<Result<Vec<_>, _>>()?;
    let reply = f.reply.as_ref().map(|r| append_message(c, r)).transpose()?;
    let reply_id = reply.as_ref().map(|r| r.message_id);
    set_status(c, f.message_id, f.status, f.task_id, reply_id)?;
    touch_and_set(
        c,
        m.session_id,
        &m.session_id.to_string(),
        f.session_status,
        0,
    )?;
    m.status = Some(f.status);
    m.task_id = f.task_id.or(m.task_id);
    m.reply_message_id = reply_id.or(m.reply_message_id);
    Ok(FinishedMessage {
        message: m,
        items,
        reply,
    })
}

pub(super) fn status_name(status: Option<MessageStatus>) -> &'static str {
    status.map_or("without a status", MessageStatus::as_str)
}

/// Drops the content of every message due at `now_ms`, the instructions of every Ttl
/// conversation opened at least its ttl before (its `created_ms` + the ttl, saturating like
/// a message's expiry), and the text of every A2A task due (its text-less body in place of
/// its body); how many of all three.
pub(super) fn sweep_due(c: &Connection, now_ms: u64) -> Result<u64, AgentError> {
    // A time past every representable one makes everything due.
    let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
    let messages = c
        .prepare_cached(
            "UPDATE messages SET content = NULL, expires_ms = NULL WHERE expires_ms <= ?1",
        )
        .and_then(|mut st| st.execute([now]))
        .map_err(sql("sweep due messages"))?;
    let conversations = c
        .prepare_cached(
            "UPDATE conversations
             SET params = json_set(params, '$.base_instructions', NULL, '$.user_instructions', NULL)
             WHERE ttl_secs IS NOT NULL
               AND CASE WHEN ttl_secs > (9223372036854775807 - created_ms) / 1000
                   THEN 9223372036854775807 ELSE created_ms + ttl_secs * 1000 END <= ?1
               AND (json_extract(params, '$.base_instructions') IS NOT NULL
                    OR json_extract(params, '$.user_instructions') IS NOT NULL)",
        )
        .and_then(|mut st| st.execute([now]))
        .map_err(sql("sweep due conversation instructions"))?;
    let a2a_tasks = c
        .prepare_cached(
            "UPDATE a2a_tasks SET body = redacted, redacted = NULL, expires_ms = NULL
             WHERE expires_ms <= ?1 AND redacted IS NOT NULL",
        )
        .and_then(|mut st| st.execute([now]))
        .map_err(sql("sweep due a2a tasks"))?;
    Ok(u64::try_from(messages + conversations + a2a_tasks).unwrap_or(u64::MAX))
}

pub(super) fn set_current(
    c: &Connection,
    project_id: &str,
    session_id: SessionId,
) -> Result<(), AgentError> {
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

/// Moves a session's `updated_ms` to the later of `at_ms` and the store's clock, never back.
pub(super) fn touch(c: &Connection, session_id: &str, at_ms: u64) -> Result<(), AgentError> {
    let at = to_sql_int("updated_ms", at_ms.max(troupe_actors::clock::unix_now_ms()))?;
    c.prepare_cached(
        "UPDATE sessions SET updated_ms = max(COALESCE(updated_ms, created_ms), ?2)
         WHERE session_id = ?1",
    )
    .and_then(|mut st| st.execute(params![session_id, at]))
    .map_err(sql("touch session"))?;
    Ok(())
}

pub(super) fn set_session_status(
    c: &Connection,
    session_id: SessionId,
    status: SessionStatus,
    at_ms: u64,
) -> Result<(), AgentError> {
    touch_and_set(c, session_id, &session_id.to_string(), Some(status), at_ms)
}

/// [`touch`], setting the session's status too when one is given (one statement):
/// `NotFound` for an unknown session then.
fn touch_and_set(
    c: &Connection,
    id: SessionId,
    session_id: &str,
    status: Option<SessionStatus>,
    at_ms: u64,
) -> Result<(), AgentError> {
    let Some(status) = status else {
        return touch(c, session_id, at_ms);
    };
    let at = to_sql_int("updated_ms", at_ms.max(troupe_actors::clock::unix_now_ms()))?;
    let changed = c
        .prepare_cached(
            "UPDATE sessions SET status = ?2, updated_ms = max(COALESCE(updated_ms, created_ms), ?3)
             WHERE session_id = ?1",
        )
        .and_then(|mut st| st.execute(params![session_id, status.as_str(), at]))
        .map_err(sql("set session status"))?;
    if changed == 0 {
        return Err(AgentError::not_found("session", id));
    }
    Ok(())
}
