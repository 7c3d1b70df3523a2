//! The A2A endpoint's records (P5) on PostgreSQL: the same reads and writes as the SQLite
//! store's (`crate::sqlite::a2a`).

use super::rows::{
    CONTEXT_SELECT, PUSH_SELECT, TASK_SELECT, context_from_row, push_from_row, task_from_row,
};
use super::sql::{col, decoded, exec, row};
use crate::conn::to_sql_int;
use deadpool_postgres::{GenericClient, Transaction};
use troupe_proto::AgentError;
use troupe_proto::store::{
    A2aContextRecord, A2aPruned, A2aPushRecord, A2aTaskPage, A2aTaskQuery, A2aTaskRecord,
};

fn encode(what: &str, body: &troupe_proto::Json) -> Result<String, AgentError> {
    serde_json::to_string(&body.0).map_err(|e| AgentError::internal(format!("encode {what}: {e}")))
}

pub(super) async fn put_context(
    tx: &Transaction<'_>,
    r: &A2aContextRecord,
) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", r.created_ms)?;
    let active_ms = to_sql_int("active_ms", r.active_ms)?;
    exec(
        tx,
        "upsert a2a context",
        "INSERT INTO a2a_contexts (context_id, session_id, conversation_id, created_ms, active_ms, open)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (context_id) DO UPDATE SET
             session_id = excluded.session_id, conversation_id = excluded.conversation_id,
             created_ms = excluded.created_ms, active_ms = excluded.active_ms,
             open = excluded.open",
        &[
            &r.context_id,
            &r.session_id.to_string(),
            &r.conversation_id.to_string(),
            &created_ms,
            &active_ms,
            &r.open,
        ],
    )
    .await
    .map(drop)
}

pub(super) async fn put_task(tx: &Transaction<'_>, r: &A2aTaskRecord) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", r.created_ms)?;
    let updated_ms = to_sql_int("updated_ms", r.updated_ms)?;
    // The context's row is locked so that a prune cannot forget it meanwhile.
    let context = row(
        tx,
        "read a2a context",
        "SELECT 1 FROM a2a_contexts WHERE context_id = $1 FOR SHARE",
        &[&r.context_id],
    )
    .await?;
    if context.is_none() {
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
    exec(
        tx,
        "upsert a2a task",
        "INSERT INTO a2a_tasks (task_id, context_id, state, terminal, created_ms, updated_ms, body,
             redacted, expires_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (task_id) DO UPDATE SET
             context_id = excluded.context_id, state = excluded.state,
             terminal = excluded.terminal, created_ms = excluded.created_ms,
             updated_ms = excluded.updated_ms, body = excluded.body,
             redacted = excluded.redacted, expires_ms = excluded.expires_ms",
        &[
            &r.task_id,
            &r.context_id,
            &r.state,
            &r.terminal,
            &created_ms,
            &updated_ms,
            &body,
            &redacted,
            &expires_ms,
        ],
    )
    .await
    .map(drop)
}

pub(super) async fn put_push(tx: &Transaction<'_>, r: &A2aPushRecord) -> Result<(), AgentError> {
    let created_ms = to_sql_int("created_ms", r.created_ms)?;
    let task = row(
        tx,
        "read a2a task",
        "SELECT 1 FROM a2a_tasks WHERE task_id = $1 FOR SHARE",
        &[&r.task_id],
    )
    .await?;
    if task.is_none() {
        return Err(AgentError::not_found("a2a task", &r.task_id));
    }
    let body = encode("a2a push config", &r.body)?;
    exec(
        tx,
        "upsert a2a push config",
        "INSERT INTO a2a_push_configs (task_id, config_id, created_ms, body)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (task_id, config_id) DO UPDATE SET body = excluded.body",
        &[&r.task_id, &r.config_id, &created_ms, &body],
    )
    .await
    .map(drop)
}

pub(super) async fn delete_push(
    tx: &Transaction<'_>,
    task_id: &str,
    config_id: &str,
) -> Result<bool, AgentError> {
    exec(
        tx,
        "delete a2a push config",
        "DELETE FROM a2a_push_configs WHERE task_id = $1 AND config_id = $2",
        &[&task_id, &config_id],
    )
    .await
    .map(|n| n > 0)
}

/// See [`crate::Store::prune_a2a`]: the oldest finished task kept is found through the index
/// of finished tasks; the older ones go with their push configs, in one transaction.
pub(super) async fn prune(
    tx: &Transaction<'_>,
    keep_finished: usize,
) -> Result<A2aPruned, AgentError> {
    let offset = i64::try_from(keep_finished.saturating_sub(1)).unwrap_or(i64::MAX);
    let cutoff: Option<(i64, String)> = if keep_finished == 0 {
        Some((i64::MAX, String::new()))
    } else {
        row(
            tx,
            "find a2a retention cutoff",
            "SELECT updated_ms, task_id FROM a2a_tasks WHERE terminal
             ORDER BY updated_ms DESC, task_id DESC LIMIT 1 OFFSET $1",
            &[&offset],
        )
        .await?
        .map(|r| Ok::<_, AgentError>((col(&r, 0, "a2a cutoff")?, col(&r, 1, "a2a cutoff")?)))
        .transpose()?
    };
    let Some((cut_ms, cut_id)) = cutoff else {
        return Ok(A2aPruned::default());
    };
    // The tasks and their push configs in one statement; it counts the tasks.
    let tasks: i64 = row(
        tx,
        "prune a2a tasks",
        "WITH doomed AS (
             DELETE FROM a2a_tasks WHERE terminal
                 AND (updated_ms < $1 OR (updated_ms = $1 AND task_id < $2))
             RETURNING task_id),
         configs AS (
             DELETE FROM a2a_push_configs p USING doomed d WHERE p.task_id = d.task_id)
         SELECT count(*) FROM doomed",
        &[&cut_ms, &cut_id],
    )
    .await?
    .map(|r| col(&r, 0, "prune a2a tasks"))
    .transpose()?
    .unwrap_or(0);
    let contexts = exec(
        tx,
        "prune a2a contexts",
        "DELETE FROM a2a_contexts c WHERE NOT c.open AND c.active_ms <= $1
         AND NOT EXISTS (SELECT 1 FROM a2a_tasks t WHERE t.context_id = c.context_id)",
        &[&cut_ms],
    )
    .await?;
    Ok(A2aPruned {
        tasks: u64::try_from(tasks).unwrap_or(0),
        contexts,
    })
}

pub(super) async fn context(
    c: &impl GenericClient,
    context_id: &str,
) -> Result<Option<A2aContextRecord>, AgentError> {
    decoded(
        c,
        "read a2a context",
        &format!("{CONTEXT_SELECT} WHERE context_id = $1"),
        &[&context_id],
        context_from_row,
    )
    .await
    .map(|mut v| v.pop())
}

pub(super) async fn open_contexts(
    c: &impl GenericClient,
) -> Result<Vec<A2aContextRecord>, AgentError> {
    decoded(
        c,
        "read a2a contexts",
        &format!("{CONTEXT_SELECT} WHERE open ORDER BY created_ms, context_id"),
        &[],
        context_from_row,
    )
    .await
}

pub(super) async fn task(
    c: &impl GenericClient,
    task_id: &str,
) -> Result<Option<A2aTaskRecord>, AgentError> {
    decoded(
        c,
        "read a2a task",
        &format!("{TASK_SELECT} WHERE task_id = $1"),
        &[&task_id],
        task_from_row,
    )
    .await
    .map(|mut v| v.pop())
}

pub(super) async fn live_tasks(c: &impl GenericClient) -> Result<Vec<A2aTaskRecord>, AgentError> {
    decoded(
        c,
        "read a2a tasks",
        &format!("{TASK_SELECT} WHERE NOT terminal ORDER BY created_ms, task_id"),
        &[],
        task_from_row,
    )
    .await
}

pub(super) async fn pushes(
    c: &impl GenericClient,
    task_id: &str,
) -> Result<Vec<A2aPushRecord>, AgentError> {
    decoded(
        c,
        "read a2a push configs",
        &format!("{PUSH_SELECT} WHERE task_id = $1 ORDER BY created_ms, row_id"),
        &[&task_id],
        push_from_row,
    )
    .await
}

/// One page of tasks and the number matching the filters, from one snapshot.
pub(super) async fn tasks(
    tx: &Transaction<'_>,
    q: &A2aTaskQuery,
) -> Result<A2aTaskPage, AgentError> {
    let after_ms = q
        .updated_after_ms
        .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX));
    let filters = "($1::TEXT IS NULL OR context_id = $1) AND ($2::TEXT IS NULL OR state = $2)
         AND ($3::BIGINT IS NULL OR updated_ms >= $3)";
    let total = row(
        tx,
        "count a2a tasks",
        &format!("SELECT count(*) FROM a2a_tasks WHERE {filters}"),
        &[&q.context_id, &q.state, &after_ms],
    )
    .await?
    .map(|r| col::<i64>(&r, 0, "count a2a tasks"))
    .transpose()?
    .unwrap_or(0);
    let (cursor_ms, cursor_id) = match &q.after {
        Some((ms, id)) => (
            Some(i64::try_from(*ms).unwrap_or(i64::MAX)),
            Some(id.clone()),
        ),
        None => (None, None),
    };
    let limit = i64::try_from(q.limit).unwrap_or(i64::MAX);
    let tasks = decoded(
        tx,
        "read a2a tasks",
        &format!(
            "{TASK_SELECT} WHERE {filters}
             AND ($4::BIGINT IS NULL OR updated_ms < $4 OR (updated_ms = $4 AND task_id < $5::TEXT))
             ORDER BY updated_ms DESC, task_id DESC LIMIT $6"
        ),
        &[
            &q.context_id,
            &q.state,
            &after_ms,
            &cursor_ms,
            &cursor_id,
            &limit,
        ],
        task_from_row,
    )
    .await?;
    Ok(A2aTaskPage {
        tasks,
        total: u64::try_from(total).unwrap_or(0),
    })
}
