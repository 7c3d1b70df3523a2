//! The A2A 1.0 JSON shapes (ProtoJSON of the specification's proto): camelCase fields,
//! `SCREAMING_CASE` enums, a part holds one of `text` / `raw` / `url` / `data`, and a
//! stream event or send result is an object with exactly one of its `oneof` fields.

use super::{WireError, from_value, quoted, required};
use crate::model::{
    Artifact, ArtifactUpdate, Message, Part, PartContent, Role, SendResult, Status, StatusUpdate,
    StreamEvent, Task, TaskPage, TaskState, iso8601_ms, parse_iso8601_ms,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

// ---- encoding ----

pub fn part(p: &Part) -> Value {
    let mut o = Map::new();
    match &p.content {
        PartContent::Text(t) => o.insert("text".into(), json!(t)),
        PartContent::Raw(b) => o.insert("raw".into(), json!(b)),
        PartContent::Url(u) => o.insert("url".into(), json!(u)),
        PartContent::Data(d) => o.insert("data".into(), d.clone()),
    };
    if let Some(m) = &p.metadata {
        o.insert("metadata".into(), m.clone());
    }
    if let Some(f) = &p.filename {
        o.insert("filename".into(), json!(f));
    }
    if let Some(m) = &p.media_type {
        o.insert("mediaType".into(), json!(m));
    }
    Value::Object(o)
}

pub const fn role(r: Role) -> &'static str {
    match r {
        Role::User => "ROLE_USER",
        Role::Agent => "ROLE_AGENT",
    }
}

pub fn message(m: &Message) -> Value {
    let mut o = Map::new();
    o.insert("messageId".into(), json!(m.message_id));
    if let Some(c) = &m.context_id {
        o.insert("contextId".into(), json!(c));
    }
    if let Some(t) = &m.task_id {
        o.insert("taskId".into(), json!(t));
    }
    o.insert("role".into(), json!(role(m.role)));
    o.insert("parts".into(), m.parts.iter().map(part).collect());
    if let Some(md) = &m.metadata {
        o.insert("metadata".into(), md.clone());
    }
    if !m.extensions.is_empty() {
        o.insert("extensions".into(), json!(m.extensions));
    }
    if !m.reference_task_ids.is_empty() {
        o.insert("referenceTaskIds".into(), json!(m.reference_task_ids));
    }
    Value::Object(o)
}

pub fn status(s: &Status) -> Value {
    let mut o = Map::new();
    o.insert("state".into(), json!(s.state.v1_name()));
    if let Some(m) = &s.message {
        o.insert("message".into(), message(m));
    }
    if let Some(ts) = s.timestamp_ms {
        o.insert("timestamp".into(), json!(iso8601_ms(ts)));
    }
    Value::Object(o)
}

pub fn artifact(a: &Artifact) -> Value {
    let mut o = Map::new();
    o.insert("artifactId".into(), json!(a.artifact_id));
    if let Some(n) = &a.name {
        o.insert("name".into(), json!(n));
    }
    if let Some(d) = &a.description {
        o.insert("description".into(), json!(d));
    }
    o.insert("parts".into(), a.parts.iter().map(part).collect());
    if let Some(md) = &a.metadata {
        o.insert("metadata".into(), md.clone());
    }
    Value::Object(o)
}

/// A task. `artifacts` is left out when empty (and always by `ListTasks` unless asked).
pub fn task(t: &Task) -> Value {
    let mut o = Map::new();
    o.insert("id".into(), json!(t.id));
    o.insert("contextId".into(), json!(t.context_id));
    o.insert("status".into(), status(&t.status));
    if !t.artifacts.is_empty() {
        o.insert(
            "artifacts".into(),
            t.artifacts.iter().map(artifact).collect(),
        );
    }
    if !t.history.is_empty() {
        o.insert("history".into(), t.history.iter().map(message).collect());
    }
    if let Some(md) = &t.metadata {
        o.insert("metadata".into(), md.clone());
    }
    Value::Object(o)
}

/// A `StreamResponse`.
pub fn stream_event(e: &StreamEvent) -> Value {
    match e {
        StreamEvent::Task(t) => json!({ "task": task(t) }),
        StreamEvent::Message(m) => json!({ "message": message(m) }),
        StreamEvent::Status(s) => json!({ "statusUpdate": status_update(s) }),
        StreamEvent::Artifact(a) => json!({ "artifactUpdate": artifact_update(a) }),
    }
}

fn status_update(s: &StatusUpdate) -> Value {
    json!({ "taskId": s.task_id, "contextId": s.context_id, "status": status(&s.status) })
}

fn artifact_update(a: &ArtifactUpdate) -> Value {
    let mut o = Map::new();
    o.insert("taskId".into(), json!(a.task_id));
    o.insert("contextId".into(), json!(a.context_id));
    o.insert("artifact".into(), artifact(&a.artifact));
    if a.append {
        o.insert("append".into(), json!(true));
    }
    if a.last_chunk {
        o.insert("lastChunk".into(), json!(true));
    }
    Value::Object(o)
}

/// A `SendMessageResponse`.
pub fn send_result(r: &SendResult) -> Value {
    match r {
        SendResult::Task(t) => json!({ "task": task(t) }),
        SendResult::Message(m) => json!({ "message": message(m) }),
    }
}

/// A `ListTasksResponse`: `nextPageToken` is always there (empty on the last page).
pub fn task_page(p: &TaskPage) -> Value {
    json!({
        "tasks": p.tasks.iter().map(task).collect::<Vec<_>>(),
        "nextPageToken": p.next_page_token,
        "pageSize": p.page_size,
        "totalSize": p.total_size,
    })
}

// ---- decoding ----

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePart {
    text: Option<String>,
    raw: Option<String>,
    url: Option<String>,
    data: Option<Value>,
    metadata: Option<Value>,
    filename: Option<String>,
    #[serde(alias = "media_type")]
    media_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMessage {
    #[serde(alias = "message_id")]
    message_id: Option<String>,
    #[serde(alias = "context_id")]
    context_id: Option<String>,
    #[serde(alias = "task_id")]
    task_id: Option<String>,
    role: Option<String>,
    parts: Option<Vec<WirePart>>,
    metadata: Option<Value>,
    #[serde(default)]
    extensions: Vec<String>,
    #[serde(default, alias = "reference_task_ids")]
    reference_task_ids: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireStatus {
    state: Option<String>,
    message: Option<WireMessage>,
    timestamp: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireArtifact {
    #[serde(alias = "artifact_id")]
    artifact_id: Option<String>,
    name: Option<String>,
    description: Option<String>,
    #[serde(default)]
    parts: Vec<WirePart>,
    metadata: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireTask {
    id: Option<String>,
    #[serde(alias = "context_id")]
    context_id: Option<String>,
    status: Option<WireStatus>,
    #[serde(default)]
    artifacts: Vec<WireArtifact>,
    #[serde(default)]
    history: Vec<WireMessage>,
    metadata: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireStatusUpdate {
    #[serde(alias = "task_id")]
    task_id: Option<String>,
    #[serde(alias = "context_id")]
    context_id: Option<String>,
    status: Option<WireStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireArtifactUpdate {
    #[serde(alias = "task_id")]
    task_id: Option<String>,
    #[serde(alias = "context_id")]
    context_id: Option<String>,
    artifact: Option<WireArtifact>,
    #[serde(default)]
    append: bool,
    #[serde(default, alias = "last_chunk")]
    last_chunk: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireStreamResponse {
    task: Option<WireTask>,
    message: Option<WireMessage>,
    #[serde(alias = "status_update")]
    status_update: Option<WireStatusUpdate>,
    #[serde(alias = "artifact_update")]
    artifact_update: Option<WireArtifactUpdate>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireTaskPage {
    #[serde(default)]
    tasks: Vec<WireTask>,
    #[serde(default, alias = "next_page_token")]
    next_page_token: String,
    #[serde(default, alias = "page_size")]
    page_size: u32,
    #[serde(default, alias = "total_size")]
    total_size: u32,
}

fn to_part(p: WirePart) -> Result<Part, WireError> {
    let mut contents = [
        p.text.map(PartContent::Text),
        p.raw.map(PartContent::Raw),
        p.url.map(PartContent::Url),
        p.data.map(PartContent::Data),
    ]
    .into_iter()
    .flatten();
    let content = contents
        .next()
        .ok_or_else(|| WireError::new("a part needs text, raw, url or data"))?;
    if contents.next().is_some() {
        return Err(WireError::new(
            "a part holds exactly one of text, raw, url, data",
        ));
    }
    Ok(Part {
        content,
        media_type: p.media_type.filter(|m| !m.is_empty()),
        filename: p.filename.filter(|f| !f.is_empty()),
        metadata: p.metadata,
    })
}

fn to_message(m: WireMessage) -> Result<Message, WireError> {
    let role = match m.role.as_deref() {
        Some("ROLE_USER") => Role::User,
        Some("ROLE_AGENT") => Role::Agent,
        Some(other) => {
            return Err(WireError(format!(
                "message.role: unknown role {}",
                quoted(other)
            )));
        }
        None => return Err(WireError::new("message.role is required")),
    };
    let parts = m.parts.unwrap_or_default();
    if parts.is_empty() {
        return Err(WireError::new(
            "message.parts: at least one part is required",
        ));
    }
    Ok(Message {
        message_id: required("message.messageId", m.message_id)?,
        context_id: m.context_id.filter(|c| !c.is_empty()),
        task_id: m.task_id.filter(|t| !t.is_empty()),
        role,
        parts: parts.into_iter().map(to_part).collect::<Result<_, _>>()?,
        metadata: m.metadata,
        reference_task_ids: m.reference_task_ids,
        extensions: m.extensions,
    })
}

fn to_status(s: Option<WireStatus>) -> Result<Status, WireError> {
    let s = s.ok_or_else(|| WireError::new("status is required"))?;
    let name = s.state.unwrap_or_default();
    let state = TaskState::from_v1(&name).ok_or_else(|| {
        WireError(format!(
            "status.state: unknown task state {}",
            quoted(&name)
        ))
    })?;
    Ok(Status {
        state,
        message: s.message.map(to_message).transpose()?,
        // A timestamp is informative: one that does not parse is dropped, not fatal.
        timestamp_ms: s.timestamp.as_deref().and_then(parse_iso8601_ms),
    })
}

fn to_artifact(a: WireArtifact) -> Result<Artifact, WireError> {
    Ok(Artifact {
        artifact_id: required("artifact.artifactId", a.artifact_id)?,
        name: a.name,
        description: a.description,
        parts: a.parts.into_iter().map(to_part).collect::<Result<_, _>>()?,
        metadata: a.metadata,
    })
}

fn to_task(t: WireTask) -> Result<Task, WireError> {
    Ok(Task {
        id: required("task.id", t.id)?,
        context_id: required("task.contextId", t.context_id)?,
        status: to_status(t.status)?,
        artifacts: t
            .artifacts
            .into_iter()
            .map(to_artifact)
            .collect::<Result<_, _>>()?,
        history: t
            .history
            .into_iter()
            .map(to_message)
            .collect::<Result<_, _>>()?,
        metadata: t.metadata,
    })
}

/// One part.
pub fn decode_part(v: &Value) -> Result<Part, WireError> {
    to_part(from_value("part", v)?)
}

/// One message (`messageId`, `role` and at least one part are required).
pub fn decode_message(v: &Value) -> Result<Message, WireError> {
    to_message(from_value("message", v)?)
}

pub fn decode_task(v: &Value) -> Result<Task, WireError> {
    to_task(from_value("task", v)?)
}

/// A `SendMessageResponse`: `{task}` or `{message}`.
pub fn decode_send_result(v: &Value) -> Result<SendResult, WireError> {
    let r: WireStreamResponse = from_value("send result", v)?;
    match (r.task, r.message) {
        (Some(t), None) => Ok(SendResult::Task(to_task(t)?)),
        (None, Some(m)) => Ok(SendResult::Message(to_message(m)?)),
        _ => Err(WireError::new(
            "a send result holds exactly one of task, message",
        )),
    }
}

/// A `StreamResponse`: exactly one of `task`, `message`, `statusUpdate`, `artifactUpdate`.
pub fn decode_stream_event(v: &Value) -> Result<StreamEvent, WireError> {
    let r: WireStreamResponse = from_value("stream event", v)?;
    let mut events = [
        r.task.map(|t| to_task(t).map(StreamEvent::Task)),
        r.message.map(|m| to_message(m).map(StreamEvent::Message)),
        r.status_update.map(|s| {
            Ok(StreamEvent::Status(StatusUpdate {
                task_id: required("statusUpdate.taskId", s.task_id)?,
                context_id: required("statusUpdate.contextId", s.context_id)?,
                status: to_status(s.status)?,
            }))
        }),
        r.artifact_update.map(|a| {
            Ok(StreamEvent::Artifact(ArtifactUpdate {
                task_id: required("artifactUpdate.taskId", a.task_id)?,
                context_id: required("artifactUpdate.contextId", a.context_id)?,
                artifact: to_artifact(
                    a.artifact
                        .ok_or_else(|| WireError::new("artifactUpdate.artifact is required"))?,
                )?,
                append: a.append,
                last_chunk: a.last_chunk,
            }))
        }),
    ]
    .into_iter()
    .flatten();
    let event = events.next().ok_or_else(|| {
        WireError::new(
            "a stream event holds one of task, message, statusUpdate, artifactUpdate; this holds none",
        )
    })?;
    if events.next().is_some() {
        return Err(WireError::new(
            "a stream event holds exactly one of task, message, statusUpdate, artifactUpdate",
        ));
    }
    event
}

/// A `ListTasksResponse`.
pub fn decode_task_page(v: &Value) -> Result<TaskPage, WireError> {
    let p: WireTaskPage = from_value("task page", v)?;
    Ok(TaskPage {
        tasks: p.tasks.into_iter().map(to_task).collect::<Result<_, _>>()?,
        next_page_token: p.next_page_token,
        page_size: p.page_size,
        total_size: p.total_size,
    })
}
