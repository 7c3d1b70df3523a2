//! The A2A endpoint's records (P5) in SQLite: the SQL of each read and write, and decoding a
//! row. Every query selects the rowid first, so a row that does not decode is named.

use super::rows::{RowKey, parse_id, query_all};
use super::writer::sql;
use crate::conn::{internal, to_sql_int};
use rusqlite::{Connection, OptionalExtension, Row, params};
use troupe_proto::store::{
    A2aContextRecord, A2aPruned, A2aPushRecord, A2aTaskPage, A2aTaskQuery, A2aTaskRecord,
};
use troupe_proto::{AgentError, Json};

pub(super) const CONTEXT_SELECT: &str = "SELECT rowid, context_id, session_id, conversation_id, \
     created_ms, active_ms, open FROM a2a_contexts";
pub(super) const TASK_SELECT: &str = "SELECT rowid, task_id, context_id, state, terminal, \
     created_ms, updated_ms, body, redacted, expires_ms FROM a2a_tasks";
pub(super) const PUSH_SELECT: &str =
    "SELECT rowid, task_id, config_id, created_ms, body FROM a2a_push_configs";

pub(super) fn context_from_row(row: &Row<'_>) -> Result<A2aContextRecord, AgentError> {
    let key = RowKey::new("a2a_contexts", row)?;
    Ok(A2aContextRecord {
        context_id: key.get(row, 1, "context_id")?,
        session_id: parse_id(&key, row, 2, "session_id")?,
        conversation_id: parse_id(&key, row, 3, "conversation_id")?,
        created_ms: key.get_u64(row, 4, "created_ms")?,
        active_ms: key.get_u64(row, 5, "active_ms")?,
        open: key.get(row, 6, "open")?,
    })
}

pub(super) fn task_from_row(row: &Row<'_>) -> Result<A2aTaskRecord, AgentError> {
    let key = RowKey::new("a2a_tasks", row)?;
    let body: String = key.get(row, 7, "body")?;
    let redacted: Option<String> = key.get(row, 8, "redacted")?;
    let expires_ms: Option<i64> = key.get(row, 9, "expires_ms")?;
    Ok(A2aTaskRecord {
        task_id: key.get(row, 1, "task_id")?,
        context_id: key.get(row, 2, "context_id")?,
        state: key.get(row, 3, "state")?,
        terminal: key.get(row, 4, "terminal")?,
        created_ms: key.get_u64(row, 5, "created_ms")?,
        updated_ms: key.get_u64(row, 6, "updated_ms")?,
        body: Json(serde_json::from_str(&body).map_err(|e| key.err("body", e))?),
        redacted: redacted
            .map(|r| serde_json::from_str(&r).map(Json))
            .transpose()
            .map_err(|e| key.err("redacted", e))?,
        expires_ms: expires_ms.map(|e| u64::try_from(e).unwrap_or_default()),
    })
}

pub(super) fn push_from_row(row: &Row<'_>) -> Result<A2aPushRecord, AgentError> {
    let key = RowKey::new("a2a_push_configs", row)?;
    let body: String = key.get(row, 4, "body")?;
    Ok(A2aPushRecord {
        task_id: key.get(row, 1, "task_id")?,
        config_id: key.get(row, 2, "config_id")?,
        created_ms: key.get_u64(row, 3, "created_ms")?,
        body: Json(serde_json::from_str(&body).map_err(|e| key.err("body", e))?),
    })
}

fn encode(what: &str, body: &Json) -> Result<String, AgentError> {
    serde_json::to_string(&body.0).map_err(|e| internal(format!("encode {what}"), e))
}

pub(super) fn put_context(c: &Connection, r: &A2aContextRecord) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", r.created_ms)?;
    let active_ms = to_sql_int("active_ms", r.active_ms)?;
    c.prepare_cached(
        "INSERT INTO a2a_contexts (context_id, session_id, conversation_id, created_ms, active_ms, open)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (context_id) DO UPDATE SET
             session_id = excluded.session_id, conversation_id = excluded.conversation_id,
             created_ms = excluded.created_ms, active_ms = excluded.active_ms,
             open = excluded.open",
    )
    .and_then(|mut st| {
        st.execute(params![
            r.context_id,
            r.session_id.to_string(),
            r.conversation_id.to_string(),
            created_ms,
            active_ms,
            r.open,
        ])
    })
    .map_err(sql("upsert a2a context"))?;
    Ok(())
}

fn context_exists(c: &Connection, context_id: &str) -> Result<bool, AgentError> {
    c.prepare_cached("SELECT 1 FROM a2a_contexts WHERE context_id = ?1")
        .and_then(|mut st| st.query_row([context_id], |_| Ok(())).optional())
        .map(|found| found.is_some())
        .map_err(sql("read a2a context"))
}

fn task_exists(c: &Connection, task_id: &str) -> Result<bool, AgentError> {
    c.prepare_cached("SELECT 1 FROM a2a_tasks WHERE task_id = ?1")
        .and_then(|mut st| st.query_row([task_id], |_| Ok(())).optional())
        .map(|found| found.is_some())
        .map_err(sql("read a2a task"))
}

pub(super) fn put_task(c: &Connection, r: &A2aTaskRecord) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", r.created_ms)?;
    let updated_ms = to_sql_int("updated_ms", r.updated_ms)?;
    if !context_exists(c, &r.context_id)? {
        return Err(AgentError::not_found("a2a context", &r.context_id));
    }
    let body = encode("a2a task", &r.body)?;
    let redacted = r
        .redacted
        .as_ref()
        .map(|b| encode("a2a task", b))
        .transpose()?;
    // A ttl past the end of time saturates (never due).
    let expires_ms = r.expires_ms.map(|e| i64::try_from(e).unwrap_or(i64::MAX));
    c.prepare_cached(
        "INSERT INTO a2a_tasks (task_id, context_id, state, terminal, created_ms, updated_ms, body,
             redacted, expires_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (task_id) DO UPDATE SET
             context_id = excluded.context_id, state = excluded.state,
             terminal = excluded.terminal, created_ms = excluded.created_ms,
             updated_ms = excluded.updated_ms, body = excluded.body,
             redacted = excluded.redacted, expires_ms = excluded.expires_ms",
    )
    .and_then(|mut st| {
        st.execute(params![
            r.task_id,
            r.context_id,
            r.state,
            r.terminal,
            created_ms,
            updated_ms,
            body,
            redacted,
            expires_ms,
        ])
    })
    .map_err(sql("upsert a2a task"))?;
    Ok(())
}

pub(super) fn put_push(c: &Connection, r: &A2aPushRecord) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", r.created_ms)?;
    if !task_exists(c, &r.task_id)? {
        return Err(AgentError::not_found("a2a task", &r.task_id));
    }
    let body = encode("a2a push config", &r.body)?;
    c.prepare_cached(
        "INSERT INTO a2a_push_configs (task_id, config_id, created_ms, body)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (task_id, config_id) DO UPDATE SET body = excluded.body",
    )
    .and_then(|mut st| st.execute(params![r.task_id, r.config_id, created_ms, body]))
    .map_err(sql("upsert a2a push config"))?;
    Ok(())
}

pub(super) fn delete_push(
    c: &Connection,
    task_id: &str,
    config_id: &str,
) -> Result<bool, AgentError> {
    c.prepare_cached("DELETE FROM a2a_push_configs WHERE task_id = ?1 AND config_id = ?2")
        .and_then(|mut st| st.execute([task_id, config_id]))
        .map(|n| n > 0)
        .map_err(sql("delete a2a push config"))
}

/// See [`crate::Store::prune_a2a`]. The oldest finished task kept is found through the index
/// of finished tasks; what is older goes, one indexed delete per task.
pub(super) fn prune(c: &Connection, keep_finished: usize) -> Result<A2aPruned, AgentError> {
    let offset = i64::try_from(keep_finished.saturating_sub(1)).unwrap_or(i64::MAX);
    // With nothing to keep, everything finished goes: the cutoff is past every task.
    let cutoff: Option<(i64, String)> = if keep_finished == 0 {
        Some((i64::MAX, String::new()))
    } else {
        c.prepare_cached(
            "SELECT updated_ms, task_id FROM a2a_tasks WHERE terminal = 1
             ORDER BY updated_ms DESC, task_id DESC LIMIT 1 OFFSET ?1",
        )
        .and_then(|mut st| {
            st.query_row([offset], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(sql("find a2a retention cutoff"))?
    };
    let Some((cut_ms, cut_id)) = cutoff else {
        return Ok(A2aPruned::default());
    };
    let doomed: Vec<String> = {
        let mut st = c
            .prepare_cached(
                "SELECT task_id FROM a2a_tasks WHERE terminal = 1
                 AND (updated_ms < ?1 OR (updated_ms = ?1 AND task_id < ?2))",
            )
            .map_err(sql("prepare a2a prune"))?;
        let rows = st
            .query_map(params![cut_ms, cut_id], |r| r.get(0))
            .map_err(sql("read a2a prune"))?;
        rows.collect::<Result<_, _>>()
            .map_err(sql("read a2a prune"))?
    };
    for task_id in &doomed {
        c.prepare_cached("DELETE FROM a2a_push_configs WHERE task_id = ?1")
            .and_then(|mut st| st.execute([task_id]))
            .map_err(sql("prune a2a push configs"))?;
        c.prepare_cached("DELETE FROM a2a_tasks WHERE task_id = ?1")
            .and_then(|mut st| st.execute([task_id]))
            .map_err(sql("prune a2a tasks"))?;
    }
    let contexts = c
        .prepare_cached(
            "DELETE FROM a2a_contexts WHERE open = 0 AND active_ms <= ?1
             AND NOT EXISTS (SELECT 1 FROM a2a_tasks t WHERE t.context_id = a2a_contexts.context_id)",
        )
        .and_then(|mut st| st.execute([cut_ms]))
        .map_err(sql("prune a2a contexts"))?;
    Ok(A2aPruned {
        tasks: doomed.len() as u64,
        contexts: contexts as u64,
    })
}

pub(super) fn context(
    c: &Connection,
    context_id: &str,
) -> Result<Option<A2aContextRecord>, AgentError> {
    query_all(
        c,
        &format!("{CONTEXT_SELECT} WHERE context_id = ?1"),
        [context_id],
        context_from_row,
    )
    .map(|mut v| v.pop())
}

pub(super) fn open_contexts(c: &Connection) -> Result<Vec<A2aContextRecord>, AgentError> {
    query_all(
        c,
        &format!("{CONTEXT_SELECT} WHERE open = 1 ORDER BY created_ms, context_id"),
        [],
        context_from_row,
    )
}

pub(super) fn task(c: &Connection, task_id: &str) -> Result<Option<A2aTaskRecord>, AgentError> {
    query_all(
        c,
        &format!("{TASK_SELECT} WHERE task_id = ?1"),
        [task_id],
        task_from_row,
    )
    .map(|mut v| v.pop())
}

pub(super) fn live_tasks(c: &Connection) -> Result<Vec<A2aTaskRecord>, AgentError> {
    query_all(
        c,
        &format!("{TASK_SELECT} WHERE terminal = 0 ORDER BY created_ms, task_id"),
        [],
        task_from_row,
    )
}

pub(super) fn pushes(c: &Connection, task_id: &str) -> Result<Vec<A2aPushRecord>, AgentError> {
    query_all(
        c,
        &format!("{PUSH_SELECT} WHERE task_id = ?1 ORDER BY created_ms, rowid"),
        [task_id],
        push_from_row,
    )
}

/// One page of tasks and the number matching the filters, in one read transaction.
pub(super) fn tasks(c: &Connection, q: &A2aTaskQuery) -> Result<A2aTaskPage, AgentError> {
    let after_ms = q
        .updated_after_ms
        .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX));
    let filters = "(?1 IS NULL OR context_id = ?1) AND (?2 IS NULL OR state = ?2)
         AND (?3 IS NULL OR updated_ms >= ?3)";
    let tx = c
        .unchecked_transaction()
        .map_err(sql("begin a2a task read"))?;
    let total: i64 = tx
        .prepare_cached(&format!("SELECT count(*) FROM a2a_tasks WHERE {filters}"))
        .and_then(|mut st| st.query_row(params![q.context_id, q.state, after_ms], |r| r.get(0)))
        .map_err(sql("count a2a tasks"))?;
    let (cursor_ms, cursor_id) = match &q.after {
        Some((ms, id)) => (
            Some(i64::try_from(*ms).unwrap_or(i64::MAX)),
            Some(id.clone()),
        ),
        None => (None, None),
    };
    let limit = i64::try_from(q.limit).unwrap_or(i64::MAX);
    let tasks = query_all(
        &tx,
        &format!(
            "{TASK_SELECT} WHERE {filters}
             AND (?4 IS NULL OR updated_ms < ?4 OR (updated_ms = ?4 AND task_id < ?5))
             ORDER BY updated_ms DESC, task_id DESC LIMIT ?6"
        ),
        params![q.context_id, q.state, after_ms, cursor_ms, cursor_id, limit],
        task_from_row,
    )?;
    tx.finish().map_err(sql("end a2a task read"))?;
    Ok(A2aTaskPage {
        tasks,
        total: u64::try_from(total).unwrap_or(0),
    })
}
