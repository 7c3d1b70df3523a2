//! The A2A 0.3 JSON shapes: objects tagged by `kind` (`task`, `message`, `status-update`,
//! `artifact-update`; parts `text`, `file`, `data`), lower-case kebab states and roles, a
//! status update's `final` flag, and results that are the object itself (no `oneof` wrapper).
//! The data's shapes are `troupe_a2a::wire::v03`'s, shared with the client; the requests'
//! params are decoded here.

use super::error::A2aError;
use super::request::{GetParams, Request, SendParams, non_negative, required};
use super::version::Operation;
use serde::Deserialize;
use serde_json::{Map, Value};
use troupe_a2a::wire::v03 as shared;

pub use shared::{artifact, message, part, role, send_result, status, stream_event, task};

// ---- decoding ----

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
    message: Option<Value>,
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
    use serde_json::json;

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
