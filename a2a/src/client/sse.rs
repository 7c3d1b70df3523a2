//! An SSE answer of a streaming call: each event's data is a JSON-RPC answer whose `result`
//! is one stream event (1.0 `StreamResponse`, 0.3 a `kind`-tagged object).

use super::{ClientError, rpc_error};
use crate::model::StreamEvent;
use crate::version::{Operation, Version};
use crate::wire;
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use serde_json::Value;
use std::pin::Pin;

/// One event of a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamItem {
    pub event: StreamEvent,
    /// 0.3 only: the server marked it `final` (1.0 says nothing: the stream closes after a
    /// terminal or interrupted state).
    pub last: bool,
}

/// The events of a streaming call, as they arrive. Ends when the server closes the stream;
/// an `Err` (a JSON-RPC error, a broken connection, an event that is not A2A) is the last
/// item worth reading.
pub struct EventStream {
    inner: Pin<Box<dyn Stream<Item = Result<StreamItem, ClientError>> + Send>>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventStream")
    }
}

impl EventStream {
    pub(super) fn new(
        op: Operation,
        version: Version,
        url: String,
        answer: reqwest::Response,
    ) -> Self {
        let inner = answer
            .bytes_stream()
            .eventsource()
            .filter_map(move |frame| {
                let item = match frame {
                    Err(e) => Some(Err(ClientError::Transport {
                        url: url.clone(),
                        message: format!("the stream broke: {e}"),
                    })),
                    Ok(event) if event.data.trim().is_empty() => None,
                    Ok(event) => Some(decode_frame(op, version, &event.data)),
                };
                std::future::ready(item)
            });
        Self {
            inner: Box::pin(inner),
        }
    }

    /// The next event; `None` once the server closed the stream.
    pub async fn next(&mut self) -> Option<Result<StreamItem, ClientError>> {
        self.inner.next().await
    }
}

/// One SSE event's data: a JSON-RPC answer holding a stream event, or an error.
pub(crate) fn decode_frame(
    op: Operation,
    version: Version,
    data: &str,
) -> Result<StreamItem, ClientError> {
    let invalid = |message: String| ClientError::Invalid {
        operation: op.label(),
        message,
    };
    let v: Value = serde_json::from_str(data)
        .map_err(|e| invalid(format!("a stream event is not JSON: {e}")))?;
    if let Some(error) = v.get("error") {
        return Err(rpc_error(op, error));
    }
    let result = v
        .get("result")
        .ok_or_else(|| invalid("a stream event holds a result or an error".into()))?;
    let (event, last) =
        wire::decode_stream_event(version, result).map_err(|e| ClientError::invalid(op, &e))?;
    Ok(StreamItem { event, last })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TaskState;

    #[test]
    fn frames_decode_in_both_versions() {
        let op = Operation::SendStreamingMessage;
        let v1 = decode_frame(
            op,
            Version::V1_0,
            r#"{"jsonrpc":"2.0","id":1,"result":{"statusUpdate":{"taskId":"t","contextId":"c",
               "status":{"state":"TASK_STATE_INPUT_REQUIRED"}}}}"#,
        )
        .unwrap();
        assert_eq!(v1.event.state(), Some(TaskState::InputRequired));
        assert!(!v1.last);
        let v03 = decode_frame(
            op,
            Version::V0_3,
            r#"{"jsonrpc":"2.0","id":1,"result":{"kind":"status-update","taskId":"t",
               "contextId":"c","status":{"state":"completed"},"final":true}}"#,
        )
        .unwrap();
        assert_eq!(v03.event.state(), Some(TaskState::Completed));
        assert!(v03.last);
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        let op = Operation::SubscribeToTask;
        let e = decode_frame(
            op,
            Version::V1_0,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"Task not found"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.rpc_code(), Some(-32001));
        for data in [
            "nope",
            "{}",
            r#"{"result":{"what":1}}"#,
            r#"{"result":{"task":{}}}"#,
        ] {
            assert_eq!(
                decode_frame(op, Version::V1_0, data).unwrap_err().outcome(),
                "invalid_answer",
                "{data}"
            );
        }
    }
}
