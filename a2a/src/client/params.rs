//! The params of each call the client makes, in the shape of the version spoken.

use crate::model::{Message, TaskState};
use crate::version::Version;
use crate::wire;
use serde_json::{Map, Value, json};

/// How a message is sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendOptions {
    /// Answer once the task exists instead of when it ends or needs input (1.0
    /// `returnImmediately`, 0.3 `blocking: false`). Ignored by a stream.
    pub return_immediately: bool,
    /// How many messages of the task's history to answer with (`None`: the agent's default).
    pub history_length: Option<u32>,
    /// The media types the caller reads (empty: say nothing).
    pub accepted_output_modes: Vec<String>,
}

/// `SendMessage` / `SendStreamingMessage` (0.3 `message/send`, `message/stream`).
pub fn send(version: Version, message: &Message, options: &SendOptions) -> Value {
    let mut config = Map::new();
    if !options.accepted_output_modes.is_empty() {
        config.insert(
            "acceptedOutputModes".into(),
            json!(options.accepted_output_modes),
        );
    }
    if let Some(n) = options.history_length {
        config.insert("historyLength".into(), json!(n));
    }
    match version {
        Version::V1_0 => {
            if options.return_immediately {
                config.insert("returnImmediately".into(), json!(true));
            }
        }
        Version::V0_3 => {
            config.insert("blocking".into(), json!(!options.return_immediately));
        }
    }
    let mut params = Map::new();
    params.insert("message".into(), wire::message(version, message));
    if !config.is_empty() {
        params.insert("configuration".into(), Value::Object(config));
    }
    Value::Object(params)
}

/// `GetTask` (0.3 `tasks/get`).
pub fn get(id: &str, history_length: Option<u32>) -> Value {
    match history_length {
        Some(n) => json!({"id": id, "historyLength": n}),
        None => json!({"id": id}),
    }
}

/// `CancelTask`, `SubscribeToTask` (0.3 `tasks/cancel`, `tasks/resubscribe`).
pub fn id(id: &str) -> Value {
    json!({ "id": id })
}

/// Which tasks `ListTasks` (1.0 only) answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub context_id: Option<String>,
    pub status: Option<TaskState>,
    pub page_size: Option<u32>,
    pub page_token: Option<String>,
}

pub fn list(filter: &ListFilter) -> Value {
    let mut o = Map::new();
    if let Some(c) = &filter.context_id {
        o.insert("contextId".into(), json!(c));
    }
    if let Some(s) = filter.status {
        o.insert("status".into(), json!(s.v1_name()));
    }
    if let Some(n) = filter.page_size {
        o.insert("pageSize".into(), json!(n));
    }
    if let Some(t) = &filter.page_token {
        o.insert("pageToken".into(), json!(t));
    }
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Part, Role};

    fn hello() -> Message {
        Message {
            message_id: "m-1".into(),
            context_id: Some("ctx".into()),
            task_id: None,
            role: Role::User,
            parts: vec![Part::text("hello")],
            metadata: None,
            reference_task_ids: Vec::new(),
            extensions: Vec::new(),
        }
    }

    #[test]
    fn a_send_is_shaped_for_its_version() {
        let options = SendOptions {
            return_immediately: true,
            history_length: Some(0),
            accepted_output_modes: vec!["text/plain".into()],
        };
        assert_eq!(
            send(Version::V1_0, &hello(), &options),
            json!({
                "message": {"messageId": "m-1", "contextId": "ctx", "role": "ROLE_USER",
                            "parts": [{"text": "hello"}]},
                "configuration": {"acceptedOutputModes": ["text/plain"], "historyLength": 0,
                                  "returnImmediately": true},
            })
        );
        assert_eq!(
            send(Version::V0_3, &hello(), &SendOptions::default()),
            json!({
                "message": {"kind": "message", "messageId": "m-1", "contextId": "ctx",
                            "role": "user", "parts": [{"kind": "text", "text": "hello"}]},
                "configuration": {"blocking": true},
            })
        );
        assert_eq!(
            send(Version::V1_0, &hello(), &SendOptions::default()).get("configuration"),
            None
        );
    }

    #[test]
    fn a_list_names_only_its_filters() {
        assert_eq!(list(&ListFilter::default()), json!({}));
        assert_eq!(
            list(&ListFilter {
                context_id: Some("c".into()),
                status: Some(TaskState::InputRequired),
                page_size: Some(5),
                page_token: None,
            }),
            json!({"contextId": "c", "status": "TASK_STATE_INPUT_REQUIRED", "pageSize": 5})
        );
    }
}
