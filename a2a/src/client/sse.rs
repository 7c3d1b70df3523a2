//! An SSE answer of a streaming call: each event's data is a JSON-RPC answer whose `result`
//! is one stream event (1.0 `StreamResponse`, 0.3 a `kind`-tagged object).

use super::{ClientError, rpc_error};
use crate::model::StreamEvent;
use crate::version::{Operation, Version};
use crate::wire;
use futures::{Stream, StreamExt};
use serde_json::Value;
use std::pin::Pin;
use troupe_proto::sse::{SseDecoder, SseEvent};

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
        let inner = events(answer, MAX_EVENT_BYTES).filter_map(move |frame| {
            let item = match frame {
                Err(message) => Some(Err(ClientError::Transport {
                    url: url.clone(),
                    message,
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

/// The most one event of a remote agent's stream may hold: a task with its artifacts comes
/// whole in one event, so it is generous; past it the stream ends with an error instead of
/// growing without end.
pub const MAX_EVENT_BYTES: usize = 32 << 20;

/// The SSE events of `answer`'s body, each at most `limit` bytes; after an `Err` (the body
/// broke, an event too large or not UTF-8) the stream ends.
fn events(
    answer: reqwest::Response,
    limit: usize,
) -> impl Stream<Item = Result<SseEvent, String>> + Send {
    let body = Box::pin(answer.bytes_stream());
    futures::stream::unfold(
        (body, SseDecoder::new(limit), false),
        |(mut body, mut decoder, ended)| async move {
            if ended {
                return None;
            }
            loop {
                match decoder.next_event() {
                    Ok(Some(event)) => return Some((Ok(event), (body, decoder, false))),
                    Err(e) => {
                        return Some((
                            Err(format!("the stream broke: {e}")),
                            (body, decoder, true),
                        ));
                    }
                    Ok(None) => match body.next().await {
                        Some(Ok(chunk)) => decoder.push(&chunk),
                        Some(Err(e)) => {
                            let message = format!("the stream broke: {}", e.without_url());
                            return Some((Err(message), (body, decoder, true)));
                        }
                        None => return None,
                    },
                }
            }
        },
    )
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

    /// A server that sends one event line without end: the stream ends with an error once the
    /// event passes the bound, and the connection is let go (the server's writes then fail).
    #[tokio::test]
    async fn an_endless_event_ends_the_stream_and_is_not_read_on() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: ")
                .await
                .unwrap();
            let chunk = vec![b'x'; 64 * 1024];
            let mut written = 0usize;
            while socket.write_all(&chunk).await.is_ok() {
                written += chunk.len();
                assert!(written < 1 << 30, "the client read on");
            }
            written
        });
        let answer = reqwest::get(&url).await.unwrap();
        let mut stream = Box::pin(events(answer, 1024 * 1024));
        let first = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
            .await
            .expect("the stream ended in time");
        let message = first.unwrap().unwrap_err();
        assert!(message.contains("larger than 1048576 bytes"), "{message}");
        assert!(stream.next().await.is_none(), "nothing after the error");
        drop(stream);
        let written = tokio::time::timeout(std::time::Duration::from_secs(10), server)
            .await
            .expect("the connection was let go")
            .unwrap();
        assert!(written < 64 << 20, "the server wrote {written} bytes");
    }

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
