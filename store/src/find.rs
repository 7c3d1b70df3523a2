//! Finding a task's records in a data directory without changing anything there (`troupe
//! replay`): the service's rollout database ([`SqliteRolloutStorage::path_in`]: `rollout.db`,
//! or `troupe.db` when it holds the rollout), then the JSONL rollout of `troupe chat` and
//! `troupe acp` (`rollout/<session>/<conversation>.jsonl`). The database is opened read-only
//! and files are only read: nothing is created, locked or written.

use crate::conn::internal;
use crate::rollout::SqliteRolloutStorage;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use std::path::Path;
use troupe_actors::rollout::{RolloutRecord, SESSION_FILE, read_records};
use troupe_proto::{AgentError, ConversationId, SessionId, TaskId};

/// Where a task was found, with its conversation's records.
#[derive(Debug, Clone)]
pub struct FoundTask {
    pub session_id: SessionId,
    pub conversation_id: ConversationId,
    /// Every record of the task's conversation, in `seq` order.
    pub records: Vec<RolloutRecord>,
    /// The database or file they were read from.
    pub source: String,
}

/// The records of `task_id`'s conversation under `data_dir`; `None` when no rollout there
/// holds the task. Blocks.
pub fn find_task(data_dir: &Path, task_id: TaskId) -> Result<Option<FoundTask>, AgentError> {
    let db = SqliteRolloutStorage::path_in(data_dir)?;
    if db.exists()
        && let Some(found) = find_in_db(&db, task_id)?
    {
        return Ok(Some(found));
    }
    find_in_files(&data_dir.join("rollout"), task_id)
}

fn find_in_db(path: &Path, task_id: TaskId) -> Result<Option<FoundTask>, AgentError> {
    let what = || format!("reading {}", path.display());
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| internal(what(), e))?;
    let has_table: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'rollout_events')",
            [],
            |row| row.get(0),
        )
        .map_err(|e| internal(what(), e))?;
    if !has_table {
        return Ok(None);
    }
    // No index on task ids: one scan, for a command a person runs now and then.
    let found: Option<(String, Option<String>)> = conn
        .query_row(
            "SELECT session_id, conversation_id FROM rollout_events WHERE task_id = ?1 LIMIT 1",
            params![task_id.to_string()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .map_err(|e| internal(what(), e))?;
    let Some((session, Some(conversation))) = found else {
        return Ok(None);
    };
    let corrupt = |e: &dyn std::fmt::Display| {
        AgentError::internal(format!("{}: a task's ids do not parse: {e}", what()))
    };
    let session_id: SessionId = session.parse().map_err(|e| corrupt(&e))?;
    let conversation_id: ConversationId = conversation.parse().map_err(|e| corrupt(&e))?;
    let records = crate::rollout::read_records(
        &conn,
        session_id,
        "SELECT seq, record FROM rollout_events
         WHERE session_id = ?1 AND conversation_id = ?2 ORDER BY seq",
        params![session, conversation],
    )?;
    Ok(Some(FoundTask {
        session_id,
        conversation_id,
        records,
        source: path.display().to_string(),
    }))
}

fn find_in_files(root: &Path, task_id: TaskId) -> Result<Option<FoundTask>, AgentError> {
    let io = |path: &Path, e: std::io::Error| {
        AgentError::internal(format!("reading {}: {e}", path.display()))
    };
    let sessions = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(root, e)),
    };
    let needle = task_id.to_string();
    for session in sessions {
        let dir = session.map_err(|e| io(root, e))?.path();
        let Some(session_id) = file_id::<SessionId>(&dir, None) else {
            continue;
        };
        let files = match std::fs::read_dir(&dir) {
            Ok(files) => files,
            Err(e) => return Err(io(&dir, e)),
        };
        for file in files {
            let path = file.map_err(|e| io(&dir, e))?.path();
            if path.file_name().is_some_and(|n| n == SESSION_FILE) {
                continue;
            }
            let Some(conversation_id) = file_id::<ConversationId>(&path, Some("jsonl")) else {
                continue;
            };
            // Most files do not name the task at all: only those that do are parsed.
            let bytes = std::fs::read(&path).map_err(|e| io(&path, e))?;
            if !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                continue;
            }
            let records = read_records(&path)?;
            if records.iter().any(|r| r.task_id == Some(task_id)) {
                return Ok(Some(FoundTask {
                    session_id,
                    conversation_id,
                    records,
                    source: path.display().to_string(),
                }));
            }
        }
    }
    Ok(None)
}

/// The id a directory or file is named after (`extension`: the file's, checked).
fn file_id<T: std::str::FromStr>(path: &Path, extension: Option<&str>) -> Option<T> {
    if path.extension().and_then(|e| e.to_str()) != extension {
        return None;
    }
    path.file_stem()?.to_str()?.parse().ok()
}
