//! The A2A 0.3 JSON shapes: objects tagged by `kind` (`task`, `message`, `status-update`,
//! `artifact-update`; parts `text`, `file`, `data`), lower-case kebab states and roles, a
//! status update's `final` flag, and results that are the object itself (no `oneof` wrapper).

use super::error::A2aError;
use super::model::{
    Artifact, ArtifactUpdate, Message, Part, PartContent, Role, SendResult, Status, StatusUpdate,
    StreamEvent, Task, iso8601_ms,
};
use super::request::{GetParams, Request, SendParams, non_negative, required};
use super::version::Operation;
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

// ---- decoding ----

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

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WireConfig {
    accepted_output_modes: Vec<String>,
    blocking: Option<bool>,
    history_length: Option<i64>,
    push_notification_config: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSend {
    message: Option<WireMessage>,
    configuration: Option<WireConfig>,
    metadata: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireGet {
    id: Option<String>,
    history_length: Option<i64>,
}

#[derive(Deserialize)]
struct WireId {
    id: Option<String>,
}

fn parse<T: for<'de> Deserialize<'de>>(params: &Value) -> Result<T, A2aError> {
    let v = if params.is_null() {
        Value::Object(Map::new())
    } else {
        params.clone()
    };
    serde_json::from_value(v).map_err(|e| A2aError::InvalidParams(e.to_string()))
}

fn to_part(p: WirePart) -> Result<Part, A2aError> {
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
                    .ok_or_else(|| A2aError::InvalidParams("a text part needs text".into()))?,
            ),
            None,
            None,
        ),
        "data" => (
            PartContent::Data(
                p.data
                    .ok_or_else(|| A2aError::InvalidParams("a data part needs data".into()))?,
            ),
            None,
            None,
        ),
        "file" => {
            let f = p
                .file
                .ok_or_else(|| A2aError::InvalidParams("a file part needs file".into()))?;
            let content = match (f.bytes, f.uri) {
                (Some(b), None) => PartContent::Raw(b),
                (None, Some(u)) => PartContent::Url(u),
                _ => {
                    return Err(A2aError::InvalidParams(
                        "a file holds exactly one of bytes, uri".into(),
                    ));
                }
            };
            (content, f.mime_type, f.name)
        }
        other => {
            return Err(A2aError::InvalidParams(format!(
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

fn to_message(m: WireMessage) -> Result<Message, A2aError> {
    let role = match m.role.as_deref() {
        Some("user") => Role::User,
        Some("agent") => Role::Agent,
        Some(other) => {
            return Err(A2aError::InvalidParams(format!(
                "message.role: unknown role {:?}",
                other.chars().take(32).collect::<String>()
            )));
        }
        None => return Err(A2aError::InvalidParams("message.role is required".into())),
    };
    let parts = m.parts.unwrap_or_default();
    if parts.is_empty() {
        return Err(A2aError::InvalidParams(
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

fn send_params(params: &Value) -> Result<SendParams, A2aError> {
    let w: WireSend = parse(params)?;
    let message = to_message(
        w.message
            .ok_or_else(|| A2aError::InvalidParams("message is required".into()))?,
    )?;
    let c = w.configuration.unwrap_or_default();
    Ok(SendParams {
        message,
        accepted_output_modes: c.accepted_output_modes,
        history_length: non_negative("configuration.historyLength", c.history_length)?,
        // 0.3 blocks unless told not to.
        return_immediately: c.blocking == Some(false),
        push_config: c
            .push_notification_config
            .filter(|v| !v.is_null())
            .map(|v| super::push::config_v03(&v, Some("")))
            .transpose()?,
        metadata: w.metadata,
    })
}

fn id(params: &Value) -> Result<String, A2aError> {
    required("id", parse::<WireId>(params)?.id)
}

/// Decodes the params of a 0.3 method.
pub fn decode(op: Operation, params: &Value) -> Result<Request, A2aError> {
    Ok(match op {
        Operation::SendMessage => Request::Send(send_params(params)?),
        Operation::SendStreamingMessage => Request::Stream(send_params(params)?),
        Operation::GetTask => {
            let w: WireGet = parse(params)?;
            Request::Get(GetParams {
                id: required("id", w.id)?,
                // 0.3 reads 0 as "no limit".
                history_length: non_negative("historyLength", w.history_length)?.filter(|n| *n > 0),
            })
        }
        // 0.3 has no ListTasks; `resolve` never sends it here.
        Operation::ListTasks => {
            return Err(A2aError::MethodNotFound("tasks/list".into()));
        }
        Operation::CancelTask => Request::Cancel { id: id(params)? },
        Operation::SubscribeToTask => Request::Subscribe { id: id(params)? },
        Operation::CreatePushConfig
        | Operation::GetPushConfig
        | Operation::ListPushConfigs
        | Operation::DeletePushConfig => Request::Push(super::push::decode(
            super::version::Version::V0_3,
            op,
            params,
        )?),
        Operation::GetExtendedAgentCard => Request::ExtendedCard,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_0_3_send() {
        let params = json!({
            "message": {
                "kind": "message",
                "messageId": "m-1",
                "role": "user",
                "parts": [{"kind": "text", "text": "hi"}, {"kind": "data", "data": {"a": 1}}],
            },
            "configuration": {"blocking": false, "acceptedOutputModes": ["text/plain"]},
        });
        let Request::Send(p) = decode(Operation::SendMessage, &params).unwrap() else {
            panic!("not a send")
        };
        assert_eq!(p.message.parts.len(), 2);
        assert!(p.return_immediately);
        let Request::Send(p) = decode(
            Operation::SendMessage,
            &json!({"message": {"messageId": "m", "role": "user",
                                "parts": [{"kind": "text", "text": "x"}]}}),
        )
        .unwrap() else {
            panic!("not a send")
        };
        assert!(!p.return_immediately, "0.3 blocks by default");
    }

    #[test]
    fn files_decode_and_bad_parts_do_not() {
        let Request::Send(p) = decode(
            Operation::SendMessage,
            &json!({"message": {"messageId": "m", "role": "user",
                "parts": [{"kind": "file", "file": {"uri": "https://x/a.png", "mimeType": "image/png"}}]}}),
        )
        .unwrap() else {
            panic!("not a send")
        };
        assert_eq!(p.message.parts[0].media_type.as_deref(), Some("image/png"));
        for bad in [
            json!({"message": {"messageId": "m", "role": "user", "parts": [{"kind": "video"}]}}),
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"kind": "text", "text": "x"}]}}),
            json!({"message": {"messageId": "m", "role": "user", "parts": [{"kind": "file", "file": {}}]}}),
        ] {
            assert_eq!(
                decode(Operation::SendMessage, &bad).unwrap_err().code(),
                -32602
            );
        }
    }
}
