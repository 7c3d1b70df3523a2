//! The A2A 0.3 JSON shapes: objects tagged by `kind` (`task`, `message`, `status-update`,
//! `artifact-update`; parts `text`, `file`, `data`), lower-case kebab states and roles, a
//! status update's `final` flag, and results that are the object itself (no `oneof` wrapper).

use super::{WireError, from_value, quoted, required};
use crate::model::{
    Artifact, ArtifactUpdate, Message, Part, PartContent, Role, SendResult, Status, StatusUpdate,
    StreamEvent, Task, TaskState, iso8601_ms, parse_iso8601_ms,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

// ---- encoding ----

pub fn part(p: &Part) -> Value {
    let mut o = Map::new();
    match &p.content {
        PartContent::Text(t) => {
            o.insert("kind".into(), json!("text"));
            o.insert("text".into(), json!(t));
        }
        PartContent::Data(d) => {
            o.insert("kind".into(), json!("data"));
            // 0.3 data is an object; anything else travels wrapped.
            let data = if d.is_object() {
                d.clone()
            } else {
                json!({ "value": d })
            };
            o.insert("data".into(), data);
        }
        PartContent::Raw(_) | PartContent::Url(_) => {
            let mut f = Map::new();
            match &p.content {
                PartContent::Raw(b) => f.insert("bytes".into(), json!(b)),
                PartContent::Url(u) => f.insert("uri".into(), json!(u)),
                _ => None,
            };
            if let Some(m) = &p.media_type {
                f.insert("mimeType".into(), json!(m));
            }
            if let Some(n) = &p.filename {
                f.insert("name".into(), json!(n));
            }
            o.insert("kind".into(), json!("file"));
            o.insert("file".into(), Value::Object(f));
        }
    }
    if let Some(m) = &p.metadata {
        o.insert("metadata".into(), m.clone());
    }
    Value::Object(o)
}

pub const fn role(r: Role) -> &'static str {
    match r {
        Role::User => "user",
        Role::Agent => "agent",
    }
}

pub fn message(m: &Message) -> Value {
    let mut o = Map::new();
    o.insert("kind".into(), json!("message"));
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
    o.insert("state".into(), json!(s.state.v03_name()));
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

pub fn task(t: &Task) -> Value {
    let mut o = Map::new();
    o.insert("kind".into(), json!("task"));
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

/// The `result` of one stream frame. `last` marks the frame after which the stream closes
/// (0.3's `final`, set on the status update that ends the interaction).
pub fn stream_event(e: &StreamEvent, last: bool) -> Value {
    match e {
        StreamEvent::Task(t) => task(t),
        StreamEvent::Message(m) => message(m),
        StreamEvent::Status(s) => status_update(s, last),
        StreamEvent::Artifact(a) => artifact_update(a),
    }
}

fn status_update(s: &StatusUpdate, last: bool) -> Value {
    json!({
        "kind": "status-update",
        "taskId": s.task_id,
        "contextId": s.context_id,
        "status": status(&s.status),
        "final": last,
    })
}

fn artifact_update(a: &ArtifactUpdate) -> Value {
    let mut o = Map::new();
    o.insert("kind".into(), json!("artifact-update"));
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

pub fn send_result(r: &SendResult) -> Value {
    match r {
        SendResult::Task(t) => task(t),
        SendResult::Message(m) => message(m),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireFile {
    bytes: Option<String>,
    uri: Option<String>,
    mime_type: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePart {
    kind: Option<String>,
    text: Option<String>,
    file: Option<WireFile>,
    data: Option<Value>,
    metadata: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMessage {
    message_id: Option<String>,
    context_id: Option<String>,
    task_id: Option<String>,
    role: Option<String>,
    parts: Option<Vec<WirePart>>,
    metadata: Option<Value>,
    #[serde(default)]
    extensions: Vec<String>,
    #[serde(default)]
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
    artifact_id: Option<String>,
    name: Option<String>,
    description: Option<String>,
    #[serde(default)]
    parts: Vec<WirePart>,
    metadata: Option<Value>,
}

/// Any object of a 0.3 result: which fields count depends on its `kind` (read by `kind_of`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireObject {
    id: Option<String>,
    context_id: Option<String>,
    task_id: Option<String>,
    status: Option<WireStatus>,
    #[serde(default)]
    artifacts: Vec<WireArtifact>,
    #[serde(default)]
    history: Vec<WireMessage>,
    metadata: Option<Value>,
    artifact: Option<WireArtifact>,
    #[serde(default)]
    append: bool,
    #[serde(default)]
    last_chunk: bool,
    #[serde(default, rename = "final")]
    is_final: bool,
}

fn to_part(p: WirePart) -> Result<Part, WireError> {
    let kind = p.kind.as_deref().unwrap_or_else(|| {
        // Tolerate an omitted `kind` when the content says which it is.
        if p.text.is_some() {
            "text"
        } else if p.file.is_some() {
            "file"
        } else {
            "data"
        }
    });
    let (content, media_type, filename) = match kind {
        "text" => (
            PartContent::Text(
                p.text
                    .ok_or_else(|| WireError("a text part needs text".into()))?,
            ),
            None,
            None,
        ),
        "data" => (
            PartContent::Data(
                p.data
                    .ok_or_else(|| WireError("a data part needs data".into()))?,
            ),
            None,
            None,
        ),
        "file" => {
            let f = p
                .file
                .ok_or_else(|| WireError("a file part needs file".into()))?;
            let content = match (f.bytes, f.uri) {
                (Some(b), None) => PartContent::Raw(b),
                (None, Some(u)) => PartContent::Url(u),
                _ => {
                    return Err(WireError("a file holds exactly one of bytes, uri".into()));
                }
            };
            (content, f.mime_type, f.name)
        }
        other => {
            return Err(WireError(format!(
                "unknown part kind {:?}",
                other.chars().take(32).collect::<String>()
            )));
        }
    };
    Ok(Part {
        content,
        media_type,
        filename,
        metadata: p.metadata,
    })
}

fn to_message(m: WireMessage) -> Result<Message, WireError> {
    let role = match m.role.as_deref() {
        Some("user") => Role::User,
        Some("agent") => Role::Agent,
        Some(other) => {
            return Err(WireError(format!(
                "message.role: unknown role {:?}",
                other.chars().take(32).collect::<String>()
            )));
        }
        None => return Err(WireError("message.role is required".into())),
    };
    let parts = m.parts.unwrap_or_default();
    if parts.is_empty() {
        return Err(WireError(
            "message.parts: at least one part is required".into(),
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
    let state = TaskState::from_v03(&name).ok_or_else(|| {
        WireError(format!(
            "status.state: unknown task state {}",
            quoted(&name)
        ))
    })?;
    Ok(Status {
        state,
        message: s.message.map(to_message).transpose()?,
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

fn object_to_task(o: WireObject) -> Result<Task, WireError> {
    Ok(Task {
        id: required("task.id", o.id)?,
        context_id: required("task.contextId", o.context_id)?,
        status: to_status(o.status)?,
        artifacts: o
            .artifacts
            .into_iter()
            .map(to_artifact)
            .collect::<Result<_, _>>()?,
        history: o
            .history
            .into_iter()
            .map(to_message)
            .collect::<Result<_, _>>()?,
        metadata: o.metadata,
    })
}

/// One part (`kind` may be left out when the content says which it is).
pub fn decode_part(v: &Value) -> Result<Part, WireError> {
    to_part(from_value("part", v)?)
}

pub fn decode_message(v: &Value) -> Result<Message, WireError> {
    to_message(from_value("message", v)?)
}

pub fn decode_task(v: &Value) -> Result<Task, WireError> {
    object_to_task(from_value("task", v)?)
}

/// A `message/send` result: the task or message itself, told apart by `kind`.
pub fn decode_send_result(v: &Value) -> Result<SendResult, WireError> {
    match kind_of(v)? {
        "task" => decode_task(v).map(SendResult::Task),
        "message" => decode_message(v).map(SendResult::Message),
        other => Err(WireError(format!(
            "a send result is a task or a message, not {}",
            quoted(other)
        ))),
    }
}

/// The `result` of one stream frame, and its `final` flag (set on the status update after
/// which the server closes the stream).
pub fn decode_stream_event(v: &Value) -> Result<(StreamEvent, bool), WireError> {
    match kind_of(v)? {
        "task" => Ok((StreamEvent::Task(decode_task(v)?), false)),
        "message" => Ok((StreamEvent::Message(decode_message(v)?), false)),
        "status-update" => {
            let o: WireObject = from_value("status-update", v)?;
            let last = o.is_final;
            Ok((
                StreamEvent::Status(StatusUpdate {
                    task_id: required("statusUpdate.taskId", o.task_id)?,
                    context_id: required("statusUpdate.contextId", o.context_id)?,
                    status: to_status(o.status)?,
                }),
                last,
            ))
        }
        "artifact-update" => {
            let o: WireObject = from_value("artifact-update", v)?;
            Ok((
                StreamEvent::Artifact(ArtifactUpdate {
                    task_id: required("artifactUpdate.taskId", o.task_id)?,
                    context_id: required("artifactUpdate.contextId", o.context_id)?,
                    artifact: to_artifact(
                        o.artifact.ok_or_else(|| {
                            WireError::new("artifact-update.artifact is required")
                        })?,
                    )?,
                    append: o.append,
                    last_chunk: o.last_chunk,
                }),
                false,
            ))
        }
        other => Err(WireError(format!(
            "unknown stream event kind {}",
            quoted(other)
        ))),
    }
}

fn kind_of(v: &Value) -> Result<&str, WireError> {
    v.get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| WireError::new("a 0.3 result needs its `kind`"))
}
