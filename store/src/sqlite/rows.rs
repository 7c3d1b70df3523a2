//! Reading rows: the SELECTs, paging, and decoding a row into its record (an undecodable
//! column is an error naming the table, the row and the column).

use super::writer::sql;
use crate::conn::internal;
use crate::page;
use rusqlite::{Connection, Row, params};
use troupe_proto::store::{
    ConversationRecord, ConversationState, MessageKind, MessagePage, MessageRecord, MessageStatus,
    SessionRecord, SessionStatus,
};
use troupe_proto::{AgentError, Json, Role, SessionId, TaskId};

pub(super) const SESSION_SELECT: &str = "SELECT rowid, session_id, project_id, title, created_ms, \
     root_conversation_id, settings, status, updated_ms FROM sessions";
pub(super) const CONVERSATION_SELECT: &str = "SELECT rowid, conversation_id, session_id, params, is_root, \
     state, created_ms, closed_ms FROM conversations";
pub(super) const MESSAGE_SELECT: &str = "SELECT message_id, session_id, conversation_id, task_id, role, \
     content, chars, created_ms, status, reply_message_id, kind, metadata FROM messages";

/// Every row of a query, decoded; the first undecodable row is an error naming it.
pub(super) fn query_all<T>(
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

/// A page of the session's messages (see [`crate::Store::messages`]) and its content bytes,
/// in one read transaction. The page is planned from the ids and content sizes of the
/// messages older than the cursor, read newest first one row at a time (SQLite gives a text
/// column's size from its record header, without its text); then only the planned rows are
/// read in full.
pub(super) fn message_page(
    c: &Connection,
    session_id: SessionId,
    limit: usize,
    max_bytes: usize,
    before: Option<u64>,
) -> Result<(MessagePage, usize), AgentError> {
    // Ids are positive i64s, so clamping a larger cursor changes nothing.
    let before = before.map_or(i64::MAX, |b| i64::try_from(b).unwrap_or(i64::MAX));
    let session = session_id.to_string();
    let tx = c.unchecked_transaction().map_err(sql("begin page read"))?;
    let plan = {
        let mut st = tx
            .prepare_cached(
                "SELECT message_id, octet_length(content) FROM messages
                 WHERE session_id = ?1 AND message_id < ?2 ORDER BY message_id DESC",
            )
            .map_err(sql("prepare read"))?;
        let mut rows = st
            .query(params![session.as_str(), before])
            .map_err(sql("read"))?;
        let sizes = std::iter::from_fn(|| match rows.next() {
            Ok(Some(row)) => Some(page_size_row(row)),
            Ok(None) => None,
            Err(e) => Some(Err(sql("read")(e))),
        });
        page::plan(sizes, limit, max_bytes)?
    };
    let messages = match plan.ids {
        None => Vec::new(),
        Some((oldest, newest)) => query_all(
            &tx,
            &format!(
                "{MESSAGE_SELECT} WHERE session_id = ?1 AND message_id BETWEEN ?2 AND ?3
                 ORDER BY message_id"
            ),
            params![
                session.as_str(),
                i64::try_from(oldest).unwrap_or(i64::MAX),
                i64::try_from(newest).unwrap_or(i64::MAX)
            ],
            message_from_row,
        )?,
    };
    tx.finish().map_err(sql("end page read"))?;
    Ok((
        MessagePage {
            messages,
            next_before: plan.next_before,
        },
        plan.bytes,
    ))
}

/// `(message_id, content bytes)` of a row of the page plan (no content counts as 0).
fn page_size_row(row: &Row<'_>) -> Result<(u64, usize), AgentError> {
    let key = RowKey::new("messages", row)?;
    let id = key.get_u64(row, 0, "message_id")?;
    let bytes: Option<i64> = key.get(row, 1, "content")?;
    let bytes = usize::try_from(bytes.unwrap_or(0)).map_err(|e| key.err("content", e))?;
    Ok((id, bytes))
}

/// Names a row in decoding errors: its table and rowid.
pub(super) struct RowKey {
    table: &'static str,
    rowid: i64,
}

impl RowKey {
    /// Reads column 0, which every query here selects as the rowid.
    pub(super) fn new(table: &'static str, row: &Row<'_>) -> Result<Self, AgentError> {
        let rowid = row
            .get(0)
            .map_err(|e| internal(format!("{table} row with no rowid"), e))?;
        Ok(Self { table, rowid })
    }

    pub(super) fn err(&self, column: &str, e: impl std::fmt::Display) -> AgentError {
        AgentError::internal(format!(
            "corrupt {} row {}: column {column}: {e}",
            self.table, self.rowid
        ))
    }

    pub(super) fn get<T: rusqlite::types::FromSql>(
        &self,
        row: &Row<'_>,
        index: usize,
        column: &str,
    ) -> Result<T, AgentError> {
        row.get(index).map_err(|e| self.err(column, e))
    }

    /// A non-negative integer column.
    pub(super) fn get_u64(
        &self,
        row: &Row<'_>,
        index: usize,
        column: &str,
    ) -> Result<u64, AgentError> {
        let v: i64 = self.get(row, index, column)?;
        u64::try_from(v).map_err(|e| self.err(column, e))
    }
}

pub(super) fn parse_id<T: std::str::FromStr>(
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

pub(super) fn session_from_row(row: &Row<'_>) -> Result<SessionRecord, AgentError> {
    let key = RowKey::new("sessions", row)?;
    let settings: String = key.get(row, 6, "settings")?;
    let status: String = key.get(row, 7, "status")?;
    let created_ms = key.get_u64(row, 4, "created_ms")?;
    let updated_ms: Option<i64> = key.get(row, 8, "updated_ms")?;
    Ok(SessionRecord {
        session_id: parse_id(&key, row, 1, "session_id")?,
        project_id: key.get(row, 2, "project_id")?,
        title: key.get(row, 3, "title")?,
        created_ms,
        root_conversation_id: parse_id(&key, row, 5, "root_conversation_id")?,
        settings: Json(serde_json::from_str(&settings).map_err(|e| key.err("settings", e))?),
        status: SessionStatus::parse(&status)
            .ok_or_else(|| key.err("status", format!("unknown `{status}`")))?,
        updated_ms: match updated_ms {
            Some(v) => u64::try_from(v).map_err(|e| key.err("updated_ms", e))?,
            None => created_ms,
        },
    })
}

pub(super) fn conversation_from_row(row: &Row<'_>) -> Result<ConversationRecord, AgentError> {
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

pub(super) fn message_from_row(row: &Row<'_>) -> Result<MessageRecord, AgentError> {
    let key = RowKey::new("messages", row)?;
    let role: String = key.get(row, 4, "role")?;
    let task_id: Option<String> = key.get(row, 3, "task_id")?;
    let status: Option<String> = key.get(row, 8, "status")?;
    let reply: Option<i64> = key.get(row, 9, "reply_message_id")?;
    let kind: String = key.get(row, 10, "kind")?;
    let metadata: Option<String> = key.get(row, 11, "metadata")?;
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
        kind: MessageKind::parse(&kind)
            .ok_or_else(|| key.err("kind", format!("unknown `{kind}`")))?,
        metadata: metadata
            .map(|m| {
                serde_json::from_str(&m)
                    .map(Json)
                    .map_err(|e| key.err("metadata", e))
            })
            .transpose()?,
    })
}

pub(crate) const fn role_str(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

pub(crate) fn parse_role(s: &str) -> Option<Role> {
    match s {
        "system" => Some(Role::System),
        "user" => Some(Role::User),
        "assistant" => Some(Role::Assistant),
        _ => None,
    }
}

pub(crate) const fn state_str(state: ConversationState) -> &'static str {
    match state {
        ConversationState::Open => "open",
        ConversationState::Closed => "closed",
    }
}

pub(crate) fn parse_state(s: &str) -> Option<ConversationState> {
    match s {
        "open" => Some(ConversationState::Open),
        "closed" => Some(ConversationState::Closed),
        _ => None,
    }
}

/// The columns a binding is read with (`rowid` first, as [`RowKey`] wants).
pub(super) const BINDING_SELECT: &str = "SELECT rowid, session_id, agent_id, provider, \
    provider_session_id, created_ms, updated_ms FROM agent_bindings";

pub(super) fn binding_from_row(
    row: &Row<'_>,
) -> Result<troupe_proto::agent::AgentBinding, AgentError> {
    let key = RowKey::new("agent_bindings", row)?;
    let provider: String = key.get(row, 3, "provider")?;
    Ok(troupe_proto::agent::AgentBinding {
        session_id: parse_id(&key, row, 1, "session_id")?,
        agent_id: key.get(row, 2, "agent_id")?,
        provider: troupe_proto::agent::ProviderKind::parse(&provider)
            .ok_or_else(|| key.err("provider", format!("unknown provider kind `{provider}`")))?,
        provider_session_id: key.get(row, 4, "provider_session_id")?,
        created_ms: key.get_u64(row, 5, "created_ms")?,
        updated_ms: key.get_u64(row, 6, "updated_ms")?,
    })
}

/// The columns a token is read with (`rowid` first, as [`RowKey`] wants).
pub(super) const TOKEN_SELECT: &str = "SELECT rowid, token_id, digest, agent, tool, args, \
    issued_by, issued_ms, expires_ms, max_uses, uses, revoked_ms, arg_fields FROM auth_tokens";

pub(super) fn token_from_row(
    row: &Row<'_>,
) -> Result<troupe_proto::governance::AuthToken, AgentError> {
    let key = RowKey::new("auth_tokens", row)?;
    let revoked: Option<i64> = key.get(row, 11, "revoked_ms")?;
    Ok(troupe_proto::governance::AuthToken {
        id: key.get(row, 1, "token_id")?,
        digest: key.get(row, 2, "digest")?,
        scope: troupe_proto::governance::TokenScope {
            agent: key.get(row, 3, "agent")?,
            tool: key.get(row, 4, "tool")?,
            args: key.get(row, 5, "args")?,
            fields: crate::arg_fields_of(key.get(row, 12, "arg_fields")?)
                .map_err(|e| key.err("arg_fields", e))?,
        },
        issued_by: key.get(row, 6, "issued_by")?,
        issued_ms: key.get_u64(row, 7, "issued_ms")?,
        expires_ms: key.get_u64(row, 8, "expires_ms")?,
        max_uses: key.get(row, 9, "max_uses")?,
        uses: key.get(row, 10, "uses")?,
        revoked_ms: revoked
            .map(|r| u64::try_from(r).map_err(|_| key.err("revoked_ms", "negative")))
            .transpose()?,
    })
}
