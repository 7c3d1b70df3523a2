//! The A2A 1.0 JSON shapes (ProtoJSON of `a2a.proto`): camelCase fields, SCREAMING_CASE enum
//! names, `oneof` members as the key that is present (`{"text": ..}`, `{"statusUpdate": ..}`),
//! empty fields left out. The data's shapes (parts, messages, tasks, events) are
//! `troupe_a2a::wire::v1`'s, shared with the client; the requests' params are decoded here.

use super::error::A2aError;
use super::model::{Part, TaskState, parse_iso8601_ms};
use super::request::{
    GetParams, ListParams, Request, SendParams, non_negative, page_size, required,
};
use super::version::Operation;
use serde::Deserialize;
use serde_json::{Map, Value};
use troupe_a2a::wire::v1 as shared;

pub use shared::{
    artifact, message, part, role, send_result, status, stream_event, task, task_page,
};

// ---- decoding ----

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
    message: Option<Value>,
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
    shared::decode_part(v).map_err(|e| A2aError::InvalidParams(e.0))
}

fn send_params(params: &Value) -> Result<SendParams, A2aError> {
    let w: WireSend = parse(params)?;
    let message = shared::decode_message(
        &w.message
            .ok_or_else(|| A2aError::InvalidParams("message is required".into()))?,
    )
    .map_err(|e| A2aError::InvalidParams(e.0))?;
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
    use crate::a2a::model::Part;
    use serde_json::json;

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
