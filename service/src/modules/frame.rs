//! The line protocol between troupe and a stdio module: one JSON object per line, `type`
//! first. What a module writes is parsed here ([`parse_line`]); what troupe writes is built
//! here (README "Modules and I/O gateways" documents both).

use serde::Deserialize;
use serde_json::{Value, json};
use troupe_proto::{AgentError, ConversationId, MessageReply, SessionId};

/// A line a module wrote.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// An input gateway's message for a session.
    Message(InputMessage),
    /// The answer to a frame troupe wrote (a reply, a dispatch, a ping).
    Ack {
        id: String,
        /// A dispatch's answer.
        result: Option<Value>,
        /// The module could not do it.
        error: Option<String>,
    },
}

/// `{"type":"message", ...}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    /// The module's id for it: troupe's acknowledgement and the reply name it.
    #[serde(default)]
    pub id: Option<String>,
    /// A session id; default: the module's project's current session (created on first use).
    #[serde(default)]
    pub session: Option<String>,
    /// A conversation id of that session, or any other string naming a conversation troupe
    /// opens on first use (a chat channel, a file); default: the session's root conversation.
    #[serde(default)]
    pub conversation: Option<String>,
    pub text: String,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Wire {
    Message(InputMessage),
    Ack {
        id: String,
        #[serde(default)]
        result: Option<Value>,
        #[serde(default)]
        error: Option<String>,
    },
}

/// A line that is not a frame: the id it named (when it named one) and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct BadLine {
    pub id: Option<String>,
    pub message: String,
}

/// Parses one line a module wrote.
pub fn parse_line(line: &str) -> Result<Incoming, BadLine> {
    let value: Value = serde_json::from_str(line).map_err(|e| BadLine {
        id: None,
        message: format!("not a JSON object: {e}"),
    })?;
    let id = value.get("id").and_then(Value::as_str).map(str::to_owned);
    let bad = |message: String| BadLine {
        id: id.clone(),
        message,
    };
    match value.get("type").and_then(Value::as_str) {
        None => return Err(bad("a frame needs `type` (message or ack)".into())),
        Some("message" | "ack") => {}
        Some(other) => {
            return Err(bad(format!(
                "unknown frame type `{other}` (message or ack)"
            )));
        }
    }
    match serde_json::from_value::<Wire>(value.clone()) {
        Ok(Wire::Message(m)) if m.text.trim().is_empty() => {
            Err(bad("a message needs a non-empty `text`".into()))
        }
        Ok(Wire::Message(m)) => Ok(Incoming::Message(m)),
        Ok(Wire::Ack { id, result, error }) => Ok(Incoming::Ack { id, result, error }),
        Err(e) => Err(bad(e.to_string())),
    }
}

/// troupe took a message: it is stored and will run.
pub fn accepted(
    id: Option<&str>,
    session: SessionId,
    conversation: ConversationId,
    message_id: u64,
) -> Value {
    json!({
        "type": "ack",
        "id": id,
        "session": session.to_string(),
        "conversation": conversation.to_string(),
        "message_id": message_id,
    })
}

/// troupe refused a line (or a message): why, with its code.
pub fn refused(id: Option<&str>, code: &str, message: &str) -> Value {
    json!({"type": "error", "id": id, "code": code, "message": message})
}

/// The refusal of a message troupe could not take.
pub fn refused_error(id: Option<&str>, error: &AgentError) -> Value {
    refused(id, error.kind().as_str(), &error.to_string())
}

/// Where a reply comes from: the message a gateway fed.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplyOrigin {
    /// The input gateway.
    pub source: String,
    /// Its id for the message.
    pub in_reply_to: Option<String>,
    pub session: SessionId,
    /// The conversation the message went to (a failed reply names it too, so that the
    /// module can go on in it).
    pub conversation: Option<troupe_proto::ConversationId>,
    /// The task that ran it, if one started.
    pub task: Option<troupe_proto::TaskId>,
}

impl ReplyOrigin {
    /// What a stored message keeps of where it came from (its metadata's `module`): the
    /// module's id and its id for the message, nothing secret.
    pub fn metadata(source: &str, in_reply_to: Option<&str>) -> Value {
        json!({ "id": source, "in_reply_to": in_reply_to })
    }

    /// The origin a stored message keeps in its metadata (see [`Self::metadata`]), if it
    /// came from a module.
    pub fn of(message: &troupe_proto::store::MessageRecord) -> Option<Self> {
        let module = message.metadata.as_ref()?.0.get("module")?;
        Some(Self {
            source: module.get("id")?.as_str()?.to_owned(),
            in_reply_to: module
                .get("in_reply_to")
                .and_then(Value::as_str)
                .map(str::to_owned),
            session: message.session_id,
            conversation: Some(message.conversation_id),
            task: message.task_id,
        })
    }
}

/// A task's reply, to a gateway (`id`: what its acknowledgement names).
pub fn reply(id: &str, origin: &ReplyOrigin, reply: &MessageReply) -> Value {
    let mut frame = json!({
        "type": "reply",
        "id": id,
        "source": origin.source,
        "in_reply_to": origin.in_reply_to,
        "session": origin.session.to_string(),
        "conversation": reply.conversation_id.to_string(),
        "task": reply.task_id.to_string(),
        "status": reply.status,
        "text": reply.text,
    });
    if let Some(error) = &reply.error {
        frame["error"] = json!({"code": error.kind().as_str(), "message": error.to_string()});
    }
    frame
}

/// A task that failed before it could reply (its message was taken, then it could not run,
/// or was dropped): the conversation and task as the message had them (`null` when none),
/// `status` `cancelled` for a cancelled one, else `error`.
pub fn failed_reply(id: &str, origin: &ReplyOrigin, error: &AgentError) -> Value {
    let status = if error.kind() == troupe_proto::ErrorKind::Cancelled {
        "cancelled"
    } else {
        "error"
    };
    json!({
        "type": "reply",
        "id": id,
        "source": origin.source,
        "in_reply_to": origin.in_reply_to,
        "session": origin.session.to_string(),
        "conversation": origin.conversation.map(|c| c.to_string()),
        "task": origin.task.map(|t| t.to_string()),
        "status": status,
        "text": "",
        "error": {"code": error.kind().as_str(), "message": error.to_string()},
    })
}

/// A dispatch to a module.
pub fn dispatch(
    id: &str,
    payload: &Value,
    conversation: ConversationId,
    task: troupe_proto::TaskId,
) -> Value {
    json!({
        "type": "dispatch",
        "id": id,
        "payload": payload,
        "conversation": conversation.to_string(),
        "task": task.to_string(),
    })
}

/// The health probe.
pub fn ping(id: &str) -> Value {
    json!({"type": "ping", "id": id})
}

/// A fresh frame id, `<prefix>-<uuid>`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_reply_names_its_conversation_and_a_cancel_reads_cancelled() {
        let (conversation, task) = (
            troupe_proto::ConversationId::new(),
            troupe_proto::TaskId::new(),
        );
        let origin = ReplyOrigin {
            source: "chat".into(),
            in_reply_to: Some("m1".into()),
            session: SessionId::new(),
            conversation: Some(conversation),
            task: Some(task),
        };
        let failed = failed_reply("r1", &origin, &AgentError::interrupted("a restart"));
        assert_eq!(failed["conversation"], conversation.to_string());
        assert_eq!(failed["task"], task.to_string());
        assert_eq!(failed["status"], "error");
        assert_eq!(failed["error"]["code"], "interrupted");
        let dropped = failed_reply(
            "r2",
            &ReplyOrigin {
                task: None,
                ..origin
            },
            &AgentError::cancelled("its conversation was closed"),
        );
        assert_eq!(dropped["status"], "cancelled");
        assert!(dropped["task"].is_null());
    }

    #[test]
    fn lines_parse_into_frames_or_say_what_is_wrong() {
        assert_eq!(
            parse_line(r#"{"type":"message","id":"m1","conversation":"chan-1","text":"hi"}"#)
                .unwrap(),
            Incoming::Message(InputMessage {
                id: Some("m1".into()),
                session: None,
                conversation: Some("chan-1".into()),
                text: "hi".into(),
            })
        );
        assert_eq!(
            parse_line(r#"{"type":"ack","id":"r-1","result":{"n":2}}"#).unwrap(),
            Incoming::Ack {
                id: "r-1".into(),
                result: Some(json!({"n": 2})),
                error: None
            }
        );
        let bad = parse_line(r#"{"type":"message","id":"m2","text":"  "}"#).unwrap_err();
        assert_eq!(bad.id.as_deref(), Some("m2"));
        assert!(bad.message.contains("text"), "{}", bad.message);
        let bad = parse_line(r#"{"type":"shout","id":"m3"}"#).unwrap_err();
        assert!(bad.message.contains("`shout`"), "{}", bad.message);
        let bad = parse_line(r#"{"type":"message","text":"x","colour":"red"}"#).unwrap_err();
        assert!(bad.message.contains("colour"), "{}", bad.message);
        assert!(parse_line("not json").unwrap_err().id.is_none());
        assert!(
            parse_line(r#"{"id":"x"}"#)
                .unwrap_err()
                .message
                .contains("`type`")
        );
    }
}
