//! The A2A 1.0 JSON shapes (ProtoJSON of `a2a.proto`): camelCase fields, SCREAMING_CASE enum
//! names, `oneof` members as the key that is present (`{"text": ..}`, `{"statusUpdate": ..}`),
//! empty fields left out.

use super::error::A2aError;
use super::model::{
    Artifact, ArtifactUpdate, Message, Part, PartContent, Role, SendResult, Status, StatusUpdate,
    StreamEvent, Task, TaskPage, TaskState, iso8601_ms, parse_iso8601_ms,
};
use super::request::{
    GetParams, ListParams, Request, SendParams, non_negative, page_size, required,
};
use super::version::Operation;
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

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WireConfig {
    #[serde(alias = "accepted_output_modes")]
    accepted_output_modes: Vec<String>,
    #[serde(alias = "task_push_notification_config")]
    task_push_notification_config: Option<Value>,
    #[serde(alias = "history_length")]
    history_length: Option<i64>,
    #[serde(alias = "return_immediately")]
    return_immediately: bool,
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
    #[serde(alias = "history_length")]
    history_length: Option<i64>,
}

#[derive(Deserialize)]
struct WireId {
    id: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WireList {
    #[serde(alias = "context_id")]
    context_id: Option<String>,
    status: Option<String>,
    #[serde(alias = "page_size")]
    page_size: Option<i64>,
    #[serde(alias = "page_token")]
    page_token: Option<String>,
    #[serde(alias = "history_length")]
    history_length: Option<i64>,
    #[serde(alias = "status_timestamp_after")]
    status_timestamp_after: Option<String>,
    #[serde(alias = "include_artifacts")]
    include_artifacts: Option<bool>,
}

fn parse<T: for<'de> Deserialize<'de>>(params: &Value) -> Result<T, A2aError> {
    // Absent params read as an empty object, as ProtoJSON reads a missing message.
    let v = if params.is_null() {
        Value::Object(Map::new())
    } else {
        params.clone()
    };
    serde_json::from_value(v).map_err(|e| A2aError::InvalidParams(e.to_string()))
}

/// One part in the 1.0 shape (a part of the A2A reply form), decoded.
pub fn part_from_json(v: &Value) -> Result<Part, A2aError> {
    let w: WirePart =
        serde_json::from_value(v.clone()).map_err(|e| A2aError::InvalidParams(e.to_string()))?;
    to_part(w)
}

fn to_part(p: WirePart) -> Result<Part, A2aError> {
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
        .ok_or_else(|| A2aError::InvalidParams("a part needs text, raw, url or data".into()))?;
    if contents.next().is_some() {
        return Err(A2aError::InvalidParams(
            "a part holds exactly one of text, raw, url, data".into(),
        ));
    }
    Ok(Part {
        content,
        media_type: p.media_type.filter(|m| !m.is_empty()),
        filename: p.filename.filter(|f| !f.is_empty()),
        metadata: p.metadata,
    })
}

fn to_message(m: WireMessage) -> Result<Message, A2aError> {
    let role = match m.role.as_deref() {
        Some("ROLE_USER") => Role::User,
        Some("ROLE_AGENT") => Role::Agent,
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
        return_immediately: c.return_immediately,
        push_config: c
            .task_push_notification_config
            .filter(|v| !v.is_null())
            .map(|v| super::push::config_v1(&v, Some("")))
            .transpose()?,
        metadata: w.metadata,
    })
}

fn id(params: &Value) -> Result<String, A2aError> {
    required("id", parse::<WireId>(params)?.id)
}

/// Decodes the params of a 1.0 method.
pub fn decode(op: Operation, params: &Value) -> Result<Request, A2aError> {
    Ok(match op {
        Operation::SendMessage => Request::Send(send_params(params)?),
        Operation::SendStreamingMessage => Request::Stream(send_params(params)?),
        Operation::GetTask => {
            let w: WireGet = parse(params)?;
            Request::Get(GetParams {
                id: required("id", w.id)?,
                history_length: non_negative("historyLength", w.history_length)?,
            })
        }
        Operation::ListTasks => {
            let w: WireList = parse(params)?;
            let status = match w.status.as_deref() {
                // `UNRECOGNIZED` is how the official JS SDK (ts-proto) writes a filter the
                // caller left unset.
                None | Some("" | "TASK_STATE_UNSPECIFIED" | "UNRECOGNIZED") => None,
                Some(s) => Some(TaskState::from_v1(s).ok_or_else(|| {
                    A2aError::InvalidParams(format!(
                        "status: unknown task state {:?}",
                        s.chars().take(40).collect::<String>()
                    ))
                })?),
            };
            let after = match w.status_timestamp_after.as_deref() {
                None | Some("") => None,
                Some(s) => Some(parse_iso8601_ms(s).ok_or_else(|| {
                    A2aError::InvalidParams("statusTimestampAfter: not an ISO 8601 UTC time".into())
                })?),
            };
            Request::List(ListParams {
                context_id: w.context_id.filter(|c| !c.is_empty()),
                status,
                page_size: page_size(w.page_size)?,
                page_token: w.page_token.filter(|t| !t.is_empty()),
                history_length: non_negative("historyLength", w.history_length)?,
                status_timestamp_after_ms: after,
                include_artifacts: w.include_artifacts.unwrap_or(false),
            })
        }
        Operation::CancelTask => Request::Cancel { id: id(params)? },
        Operation::SubscribeToTask => Request::Subscribe { id: id(params)? },
        Operation::CreatePushConfig
        | Operation::GetPushConfig
        | Operation::ListPushConfigs
        | Operation::DeletePushConfig => Request::Push(super::push::decode(
            super::version::Version::V1_0,
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
    fn reads_what_the_python_client_sends() {
        let params = json!({
            "message": {
                "messageId": "m-1",
                "role": "ROLE_USER",
                "parts": [{"text": "hi"}],
                "contextId": "ctx",
            },
            "configuration": {"returnImmediately": true, "historyLength": 2},
        });
        let Request::Send(p) = decode(Operation::SendMessage, &params).unwrap() else {
            panic!("not a send")
        };
        assert_eq!(p.message.parts, vec![Part::text("hi")]);
        assert_eq!(p.message.context_id.as_deref(), Some("ctx"));
        assert!(p.return_immediately);
        assert_eq!(p.history_length, Some(2));
    }

    #[test]
    fn rejects_malformed_messages() {
        for params in [
            json!({}),
            json!({"message": {"role": "ROLE_USER", "parts": [{"text": "x"}]}}),
            json!({"message": {"messageId": "m", "parts": [{"text": "x"}]}}),
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}}),
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{}]}}),
            json!({"message": {"messageId": "m", "role": "ROLE_USER",
                               "parts": [{"text": "x", "url": "u"}]}}),
            json!({"message": {"messageId": "m", "role": "user", "parts": [{"text": "x"}]}}),
            json!([1, 2]),
        ] {
            assert_eq!(
                decode(Operation::SendMessage, &params).unwrap_err().code(),
                -32602,
                "{params}"
            );
        }
    }

    #[test]
    fn list_filters_are_validated() {
        let ok = decode(
            Operation::ListTasks,
            &json!({"contextId": "c", "status": "TASK_STATE_WORKING", "pageSize": 10,
                    "statusTimestampAfter": "2024-03-15T10:15:00Z", "includeArtifacts": true}),
        )
        .unwrap();
        let Request::List(l) = ok else { panic!() };
        assert_eq!(l.status, Some(TaskState::Working));
        assert_eq!(l.status_timestamp_after_ms, Some(1_710_497_700_000));
        for bad in [
            json!({"status": "TASK_STATE_RUNNING"}),
            json!({"pageSize": 150}),
            json!({"historyLength": -5}),
        ] {
            assert_eq!(
                decode(Operation::ListTasks, &bad).unwrap_err().code(),
                -32602
            );
        }
        assert_eq!(
            decode(Operation::ListTasks, &Value::Null).unwrap(),
            Request::List(ListParams::default())
        );
        // The JS SDK's unset filter.
        assert_eq!(
            decode(Operation::ListTasks, &json!({"status": "UNRECOGNIZED"})).unwrap(),
            Request::List(ListParams::default())
        );
    }
}
