//! Decoding PostgreSQL rows into records; an undecodable column is an error naming the table,
//! the row (its `row_id`, or the message id) and the column, as the SQLite store's are.

use crate::sqlite::{parse_role, parse_state};
use tokio_postgres::Row;
use tokio_postgres::types::FromSql;
use troupe_proto::store::{
    A2aContextRecord, A2aPushRecord, A2aTaskRecord, ConversationRecord, MessageKind, MessageRecord,
    MessageStatus, SessionRecord, SessionStatus,
};
use troupe_proto::{AgentError, Json, TaskId};

pub(super) const SESSION_SELECT: &str = "SELECT row_id, session_id, project_id, title, created_ms, \
     root_conversation_id, settings, status, updated_ms FROM sessions";
pub(super) const CONVERSATION_SELECT: &str = "SELECT row_id, conversation_id, session_id, params, \
     is_root, state, created_ms, closed_ms FROM conversations";
pub(super) const MESSAGE_SELECT: &str = "SELECT message_id, session_id, conversation_id, task_id, \
     role, content, chars, created_ms, status, reply_message_id, kind, metadata FROM messages";
pub(super) const BINDING_SELECT: &str = "SELECT row_id, session_id, agent_id, provider, \
     provider_session_id, created_ms, updated_ms FROM agent_bindings";
pub(super) const CONTEXT_SELECT: &str = "SELECT row_id, context_id, session_id, conversation_id, \
     created_ms, active_ms, open FROM a2a_contexts";
pub(super) const TASK_SELECT: &str = "SELECT row_id, task_id, context_id, state, terminal, \
     created_ms, updated_ms, body, redacted, expires_ms FROM a2a_tasks";
pub(super) const PUSH_SELECT: &str =
    "SELECT row_id, task_id, config_id, created_ms, body FROM a2a_push_configs";

/// Names a row in decoding errors: its table and the key in its column 0.
pub(super) struct RowKey {
    table: &'static str,
    id: i64,
}

impl RowKey {
    pub(super) fn new(table: &'static str, row: &Row) -> Result<Self, AgentError> {
        let id = row
            .try_get(0)
            .map_err(|e| AgentError::internal(format!("{table} row with no id: {e}")))?;
        Ok(Self { table, id })
    }

    pub(super) fn err(&self, column: &str, e: impl std::fmt::Display) -> AgentError {
        AgentError::internal(format!(
            "corrupt {} row {}: column {column}: {e}",
            self.table, self.id
        ))
    }

    pub(super) fn get<'a, T: FromSql<'a>>(
        &self,
        row: &'a Row,
        index: usize,
        column: &str,
    ) -> Result<T, AgentError> {
        row.try_get(index).map_err(|e| self.err(column, e))
    }

    /// A non-negative integer column.
    pub(super) fn get_u64(&self, row: &Row, index: usize, column: &str) -> Result<u64, AgentError> {
        let v: i64 = self.get(row, index, column)?;
        u64::try_from(v).map_err(|e| self.err(column, e))
    }

    pub(super) fn get_opt_u64(
        &self,
        row: &Row,
        index: usize,
        column: &str,
    ) -> Result<Option<u64>, AgentError> {
        let v: Option<i64> = self.get(row, index, column)?;
        v.map(|v| u64::try_from(v).map_err(|e| self.err(column, e)))
            .transpose()
    }

    pub(super) fn parse<T: std::str::FromStr>(
        &self,
        row: &Row,
        index: usize,
        column: &str,
    ) -> Result<T, AgentError>
    where
        T::Err: std::fmt::Display,
    {
        let text: &str = self.get(row, index, column)?;
        text.parse().map_err(|e| self.err(column, e))
    }

    /// A `BYTEA` column holding UTF-8 text.
    fn text(&self, row: &Row, index: usize, column: &str) -> Result<Option<String>, AgentError> {
        let bytes: Option<&[u8]> = self.get(row, index, column)?;
        bytes
            .map(|b| String::from_utf8(b.to_vec()).map_err(|e| self.err(column, e)))
            .transpose()
    }

    fn json<T: serde::de::DeserializeOwned>(
        &self,
        row: &Row,
        index: usize,
        column: &str,
    ) -> Result<T, AgentError> {
        let text: &str = self.get(row, index, column)?;
        serde_json::from_str(text).map_err(|e| self.err(column, e))
    }
}

pub(super) fn session_from_row(row: &Row) -> Result<SessionRecord, AgentError> {
    let key = RowKey::new("sessions", row)?;
    let status: &str = key.get(row, 7, "status")?;
    Ok(SessionRecord {
        session_id: key.parse(row, 1, "session_id")?,
        project_id: key.get(row, 2, "project_id")?,
        title: key.text(row, 3, "title")?,
        created_ms: key.get_u64(row, 4, "created_ms")?,
        root_conversation_id: key.parse(row, 5, "root_conversation_id")?,
        settings: Json(key.json(row, 6, "settings")?),
        status: SessionStatus::parse(status)
            .ok_or_else(|| key.err("status", format!("unknown `{status}`")))?,
        updated_ms: key.get_u64(row, 8, "updated_ms")?,
    })
}

pub(super) fn conversation_from_row(row: &Row) -> Result<ConversationRecord, AgentError> {
    let key = RowKey::new("conversations", row)?;
    let state: &str = key.get(row, 5, "state")?;
    Ok(ConversationRecord {
        conversation_id: key.parse(row, 1, "conversation_id")?,
        session_id: key.parse(row, 2, "session_id")?,
        params: key.json(row, 3, "params")?,
        is_root: key.get(row, 4, "is_root")?,
        state: parse_state(state).ok_or_else(|| key.err("state", format!("unknown `{state}`")))?,
        created_ms: key.get_u64(row, 6, "created_ms")?,
        closed_ms: key.get_opt_u64(row, 7, "closed_ms")?,
    })
}

pub(super) fn message_from_row(row: &Row) -> Result<MessageRecord, AgentError> {
    let key = RowKey::new("messages", row)?;
    let role: &str = key.get(row, 4, "role")?;
    let task_id: Option<&str> = key.get(row, 3, "task_id")?;
    let status: Option<&str> = key.get(row, 8, "status")?;
    let kind: &str = key.get(row, 10, "kind")?;
    let metadata: Option<&str> = key.get(row, 11, "metadata")?;
    Ok(MessageRecord {
        message_id: key.get_u64(row, 0, "message_id")?,
        session_id: key.parse(row, 1, "session_id")?,
        conversation_id: key.parse(row, 2, "conversation_id")?,
        task_id: task_id
            .map(|t| t.parse::<TaskId>().map_err(|e| key.err("task_id", e)))
            .transpose()?,
        role: parse_role(role).ok_or_else(|| key.err("role", format!("unknown `{role}`")))?,
        content: key.text(row, 5, "content")?,
        chars: key.get_u64(row, 6, "chars")?,
        created_ms: key.get_u64(row, 7, "created_ms")?,
        status: status
            .map(|s| {
                MessageStatus::parse(s).ok_or_else(|| key.err("status", format!("unknown `{s}`")))
            })
            .transpose()?,
        reply_message_id: key.get_opt_u64(row, 9, "reply_message_id")?,
        kind: MessageKind::parse(kind)
            .ok_or_else(|| key.err("kind", format!("unknown `{kind}`")))?,
        metadata: metadata
            .map(|m| {
                serde_json::from_str(m)
                    .map(Json)
                    .map_err(|e| key.err("metadata", e))
            })
            .transpose()?,
    })
}

pub(super) fn binding_from_row(row: &Row) -> Result<troupe_proto::agent::AgentBinding, AgentError> {
    let key = RowKey::new("agent_bindings", row)?;
    let provider: &str = key.get(row, 3, "provider")?;
    Ok(troupe_proto::agent::AgentBinding {
        session_id: key.parse(row, 1, "session_id")?,
        agent_id: key.get(row, 2, "agent_id")?,
        provider: troupe_proto::agent::ProviderKind::parse(provider)
            .ok_or_else(|| key.err("provider", format!("unknown provider kind `{provider}`")))?,
        provider_session_id: key.get(row, 4, "provider_session_id")?,
        created_ms: key.get_u64(row, 5, "created_ms")?,
        updated_ms: key.get_u64(row, 6, "updated_ms")?,
    })
}

pub(super) fn context_from_row(row: &Row) -> Result<A2aContextRecord, AgentError> {
    let key = RowKey::new("a2a_contexts", row)?;
    Ok(A2aContextRecord {
        context_id: key.get(row, 1, "context_id")?,
        session_id: key.parse(row, 2, "session_id")?,
        conversation_id: key.parse(row, 3, "conversation_id")?,
        created_ms: key.get_u64(row, 4, "created_ms")?,
        active_ms: key.get_u64(row, 5, "active_ms")?,
        open: key.get(row, 6, "open")?,
    })
}

pub(super) fn task_from_row(row: &Row) -> Result<A2aTaskRecord, AgentError> {
    let key = RowKey::new("a2a_tasks", row)?;
    Ok(A2aTaskRecord {
        task_id: key.get(row, 1, "task_id")?,
        context_id: key.get(row, 2, "context_id")?,
        state: key.get(row, 3, "state")?,
        terminal: key.get(row, 4, "terminal")?,
        created_ms: key.get_u64(row, 5, "created_ms")?,
        updated_ms: key.get_u64(row, 6, "updated_ms")?,
        body: Json(key.json(row, 7, "body")?),
        redacted: key
            .get::<Option<&str>>(row, 8, "redacted")?
            .map(|r| serde_json::from_str(r).map(Json))
            .transpose()
            .map_err(|e| key.err("redacted", e))?,
        expires_ms: key
            .get::<Option<i64>>(row, 9, "expires_ms")?
            .map(|e| u64::try_from(e).unwrap_or_default()),
    })
}

pub(super) fn push_from_row(row: &Row) -> Result<A2aPushRecord, AgentError> {
    let key = RowKey::new("a2a_push_configs", row)?;
    Ok(A2aPushRecord {
        task_id: key.get(row, 1, "task_id")?,
        config_id: key.get(row, 2, "config_id")?,
        created_ms: key.get_u64(row, 3, "created_ms")?,
        body: Json(key.json(row, 4, "body")?),
    })
}

pub(super) const TOKEN_SELECT: &str = "SELECT row_id, token_id, digest, agent, tool, args, \
     issued_by, issued_ms, expires_ms, max_uses, uses, revoked_ms, arg_fields FROM auth_tokens";

pub(super) fn token_from_row(row: &Row) -> Result<troupe_proto::governance::AuthToken, AgentError> {
    let key = RowKey::new("auth_tokens", row)?;
    let count = |index: usize, column: &str| -> Result<u32, AgentError> {
        let v: i64 = key.get(row, index, column)?;
        u32::try_from(v).map_err(|e| key.err(column, e))
    };
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
        max_uses: count(9, "max_uses")?,
        uses: count(10, "uses")?,
        revoked_ms: key.get_opt_u64(row, 11, "revoked_ms")?,
    })
}
