//! The shapes on the wire, by version: which of [`wire_v1`] (A2A 1.0) and [`wire_v03`] (0.3)
//! decodes a request's params and encodes what is answered.

use super::error::A2aError;
use super::model::{SendResult, StreamEvent, Task, TaskPage};
use super::request::Request;
use super::version::{Operation, Version};
use super::{wire_v1, wire_v03};
use serde_json::Value;

/// Decodes `params` of `op` in the shape of `version`. Never panics, whatever the JSON.
pub fn decode(version: Version, op: Operation, params: &Value) -> Result<Request, A2aError> {
    match version {
        Version::V1_0 => wire_v1::decode(op, params),
        Version::V0_3 => wire_v03::decode(op, params),
    }
}

/// A task.
pub fn task(version: Version, task: &Task) -> Value {
    match version {
        Version::V1_0 => wire_v1::task(task),
        Version::V0_3 => wire_v03::task(task),
    }
}

/// The result of `SendMessage` (0.3 `message/send`).
pub fn send_result(version: Version, result: &SendResult) -> Value {
    match version {
        Version::V1_0 => wire_v1::send_result(result),
        Version::V0_3 => wire_v03::send_result(result),
    }
}

/// A page of `ListTasks`, which only 1.0 has.
pub fn task_page(page: &TaskPage) -> Value {
    wire_v1::task_page(page)
}

/// One event of a stream; `last` when the stream ends after it (0.3 says so in `final`).
pub fn stream_event(version: Version, event: &StreamEvent, last: bool) -> Value {
    match version {
        Version::V1_0 => wire_v1::stream_event(event),
        Version::V0_3 => wire_v03::stream_event(event, last),
    }
}
