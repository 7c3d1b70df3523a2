//! The JSON shapes of A2A's data, by version: [`v1`] (1.0, ProtoJSON: `oneof` wrappers,
//! `SCREAMING_CASE` enums) and [`v03`] (0.3: objects tagged by `kind`, kebab-case states).
//! Both directions: the endpoint encodes tasks and events and decodes messages; the client
//! encodes messages and decodes tasks and events. Decoding never panics, whatever the JSON.

pub mod v03;
pub mod v1;

use crate::model::{Message, Part, SendResult, StreamEvent, Task, TaskPage};
use crate::version::Version;
use serde_json::Value;

/// JSON that is not the A2A shape it should be: what is wrong, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WireError(pub String);

impl WireError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// A required string that must not be empty.
pub fn required(field: &str, v: Option<String>) -> Result<String, WireError> {
    match v {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(WireError(format!("{field} is required"))),
    }
}

/// Deserializes `v`, naming `what` in the error.
fn from_value<T: serde::de::DeserializeOwned>(what: &str, v: &Value) -> Result<T, WireError> {
    T::deserialize(v).map_err(|e| WireError(format!("{what}: {e}")))
}

/// A string as a short quotation for an error.
fn quoted(s: &str) -> String {
    format!("{:?}", s.chars().take(40).collect::<String>())
}

pub fn part(version: Version, p: &Part) -> Value {
    match version {
        Version::V1_0 => v1::part(p),
        Version::V0_3 => v03::part(p),
    }
}

pub fn message(version: Version, m: &Message) -> Value {
    match version {
        Version::V1_0 => v1::message(m),
        Version::V0_3 => v03::message(m),
    }
}

pub fn task(version: Version, t: &Task) -> Value {
    match version {
        Version::V1_0 => v1::task(t),
        Version::V0_3 => v03::task(t),
    }
}

/// The result of `SendMessage` (0.3 `message/send`).
pub fn send_result(version: Version, r: &SendResult) -> Value {
    match version {
        Version::V1_0 => v1::send_result(r),
        Version::V0_3 => v03::send_result(r),
    }
}

/// One event of a stream; `last` when the stream ends after it (0.3 says so in `final`).
pub fn stream_event(version: Version, e: &StreamEvent, last: bool) -> Value {
    match version {
        Version::V1_0 => v1::stream_event(e),
        Version::V0_3 => v03::stream_event(e, last),
    }
}

pub fn decode_message(version: Version, v: &Value) -> Result<Message, WireError> {
    match version {
        Version::V1_0 => v1::decode_message(v),
        Version::V0_3 => v03::decode_message(v),
    }
}

pub fn decode_task(version: Version, v: &Value) -> Result<Task, WireError> {
    match version {
        Version::V1_0 => v1::decode_task(v),
        Version::V0_3 => v03::decode_task(v),
    }
}

pub fn decode_send_result(version: Version, v: &Value) -> Result<SendResult, WireError> {
    match version {
        Version::V1_0 => v1::decode_send_result(v),
        Version::V0_3 => v03::decode_send_result(v),
    }
}

/// One stream event, and (0.3) whether the server marked it `final`.
pub fn decode_stream_event(version: Version, v: &Value) -> Result<(StreamEvent, bool), WireError> {
    match version {
        Version::V1_0 => v1::decode_stream_event(v).map(|e| (e, false)),
        Version::V0_3 => v03::decode_stream_event(v),
    }
}

/// A page of `ListTasks` (1.0 only).
pub fn decode_task_page(v: &Value) -> Result<TaskPage, WireError> {
    v1::decode_task_page(v)
}

#[cfg(test)]
mod tests;
