//! How the book's records are stored: a task as an [`A2aTaskRecord`] (its columns, and the
//! record itself as the body), a context as an [`A2aContextRecord`].
//!
//! Content follows the storage policy of the contexts' conversations: under `full` a task is
//! stored whole; under `headers_only` and `none` its messages' and artifacts' parts and its
//! input are stored empty (a task read back after a restart then has its states, times and
//! ids, and no text), so that no content the policy forbids on disk is written by the
//! endpoint either. Under `ttl` it is stored whole until a ttl after the task was created
//! (when its input arrived, the oldest content it holds), with its text-less form beside it,
//! which the store's ttl sweep puts in its place once due; a task written after that time is
//! stored without its text at once.

use super::{Context, Conv, Record};
use crate::a2a::error::A2aError;
use crate::a2a::model::{Message, Part, Task};
use troupe_proto::store::{A2aContextRecord, A2aTaskRecord};
use troupe_proto::{Json, StoragePolicy};

fn redact_parts(parts: &mut [Part]) {
    for p in parts.iter_mut() {
        *p = Part::text("");
    }
}

fn redact_message(m: &mut Message) {
    redact_parts(&mut m.parts);
}

fn redacted(mut r: Record) -> Record {
    r.input.clear();
    let t = &mut r.task;
    t.history.iter_mut().for_each(redact_message);
    if let Some(m) = t.status.message.as_mut() {
        redact_message(m);
    }
    for a in &mut t.artifacts {
        redact_parts(&mut a.parts);
    }
    if let Some(m) = r.reply_message.as_mut() {
        redact_message(m);
    }
    r
}

/// A task as stored under `policy`, written at `now_ms`.
pub fn task_record(
    r: &Record,
    policy: StoragePolicy,
    now_ms: u64,
) -> Result<A2aTaskRecord, A2aError> {
    let encode = |r: &Record| {
        serde_json::to_value(r)
            .map(Json)
            .map_err(|e| A2aError::Internal(format!("encode task {}: {e}", r.task.id)))
    };
    let expires_ms = match policy {
        StoragePolicy::Ttl { secs } => {
            Some(troupe_actors::rollout::ttl_expiry_ms(r.created_ms, secs))
        }
        _ => None,
    };
    let (body, redacted, expires_ms) = match (policy, expires_ms) {
        (StoragePolicy::Full, _) => (encode(r)?, None, None),
        (_, Some(due)) if due > now_ms => {
            (encode(r)?, Some(encode(&redacted(r.clone()))?), Some(due))
        }
        _ => (encode(&redacted(r.clone()))?, None, None),
    };
    Ok(A2aTaskRecord {
        task_id: r.task.id.clone(),
        context_id: r.task.context_id.clone(),
        state: r.task.status.state.v1_name().to_owned(),
        terminal: r.task.status.state.is_terminal(),
        created_ms: r.created_ms,
        updated_ms: r.updated_ms(),
        body,
        redacted,
        expires_ms,
    })
}

/// A stored task read back.
pub fn record_of(stored: &A2aTaskRecord) -> Result<Record, A2aError> {
    serde_json::from_value(stored.body.0.clone()).map_err(|e| {
        A2aError::Internal(format!(
            "stored task {} cannot be read: {e}",
            stored.task_id
        ))
    })
}

/// A stored task as the client sees it.
pub fn task_of(stored: &A2aTaskRecord) -> Result<Task, A2aError> {
    record_of(stored).map(|r| r.task)
}

/// A context as stored.
pub fn context_record(context_id: &str, c: &Context) -> A2aContextRecord {
    A2aContextRecord {
        context_id: context_id.to_owned(),
        session_id: c.session_id,
        conversation_id: c.conversation_id,
        created_ms: c.created_ms,
        active_ms: c.active_ms,
        open: matches!(c.conv, Conv::Open | Conv::Closing),
    }
}
