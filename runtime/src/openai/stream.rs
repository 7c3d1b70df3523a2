//! Reading an SSE body: events are fed one by one to an API-specific [`StreamParser`], with an
//! idle bound between events. What the parsers collect is the same for both APIs.

use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use std::fmt::Display;
use std::time::Duration;
use troupe_actors::ports::DeltaSink;
use troupe_proto::{AgentError, Usage};

/// A tool call as streamed: arguments still JSON text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawCall {
    pub call_id: String,
    pub name: String,
    pub arguments: String,
}

/// Everything one stream produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Collected {
    pub response_id: Option<String>,
    /// The model the server says answered.
    pub model: Option<String>,
    pub text: String,
    pub calls: Vec<RawCall>,
    pub usage: Option<Usage>,
}

/// One API's stream format.
pub trait StreamParser: Send {
    /// Takes one SSE event (`kind` is its `event:` name, `message` when absent); forwards text
    /// deltas as they come. Returns whether this was the terminal event.
    fn on_event(
        &mut self,
        kind: &str,
        data: &str,
        deltas: &mut dyn DeltaSink,
    ) -> Result<bool, AgentError>;

    fn finish(self) -> Collected;
}

/// Why reading a stream stopped short.
#[derive(Debug)]
pub enum ReadError {
    /// The transport failed before any event arrived: nothing was consumed, so the request
    /// may be sent again.
    BeforeFirstEvent(String),
    /// Anything else; not retried.
    Failed(AgentError),
}

/// Feeds `bytes` to `parser` until its terminal event. `first_event` runs when the first event
/// arrives (time to first byte).
pub async fn read_events<S, B, E, P>(
    bytes: S,
    parser: &mut P,
    deltas: &mut dyn DeltaSink,
    idle: Duration,
    first_event: impl FnOnce(),
) -> Result<(), ReadError>
where
    S: Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: Display,
    P: StreamParser,
{
    let mut events = bytes.eventsource();
    let mut first_event = Some(first_event);
    loop {
        let next = tokio::time::timeout(idle, events.next())
            .await
            .map_err(|_| {
                ReadError::Failed(AgentError::ModelError {
                    message: format!("stream idle for {}s", idle.as_secs_f64()),
                    retryable: true,
                })
            })?;
        let event = match next {
            None => {
                return Err(ReadError::Failed(AgentError::ModelError {
                    message: "stream ended early (no terminal event)".into(),
                    retryable: true,
                }));
            }
            Some(Err(EventStreamError::Transport(e))) if first_event.is_some() => {
                return Err(ReadError::BeforeFirstEvent(e.to_string()));
            }
            Some(Err(EventStreamError::Transport(e))) => {
                return Err(ReadError::Failed(AgentError::ModelError {
                    message: format!("stream broke: {e}"),
                    retryable: true,
                }));
            }
            Some(Err(e)) => return Err(ReadError::Failed(malformed(e, ""))),
            Some(Ok(event)) => event,
        };
        if let Some(f) = first_event.take() {
            f();
        }
        if parser
            .on_event(&event.event, &event.data, deltas)
            .map_err(ReadError::Failed)?
        {
            return Ok(());
        }
    }
}

/// A stream that cannot be understood.
pub fn malformed(error: impl Display, data: &str) -> AgentError {
    const SHOWN: usize = 200;
    let mut message = format!("malformed stream: {error}");
    if !data.is_empty() {
        let cut = data
            .char_indices()
            .nth(SHOWN)
            .map_or(data.len(), |(i, _)| i);
        message.push_str(&format!(" in `{}`", &data[..cut]));
    }
    AgentError::ModelError {
        message,
        retryable: false,
    }
}

/// An error the server reported inside the stream.
pub fn server_error(error: &serde_json::Value) -> AgentError {
    AgentError::ModelError {
        message: format!(
            "model server error: {}",
            error_message(error).unwrap_or_else(|| error.to_string())
        ),
        retryable: false,
    }
}

/// The human-readable message of an error body: OpenAI's `{"error": {"message"}}`, the
/// `{"error": "..."}` of some local servers, or a bare `{"message"}`.
pub fn error_message(body: &serde_json::Value) -> Option<String> {
    let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
    body.pointer("/error/message")
        .and_then(text)
        .or_else(|| body.get("error").and_then(text))
        .or_else(|| body.get("message").and_then(text))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[derive(Default)]
    pub(crate) struct Deltas(pub Vec<String>);

    impl DeltaSink for Deltas {
        fn text_delta(&mut self, delta: &str) {
            self.0.push(delta.to_owned());
        }
    }

    /// Feeds SSE text to a parser; `(terminal event seen, what it collected)`.
    pub(crate) fn feed<P: StreamParser>(
        mut parser: P,
        text: &str,
        deltas: &mut Deltas,
    ) -> Result<(bool, Collected), AgentError> {
        let bytes =
            futures::stream::iter([Ok::<_, std::convert::Infallible>(text.as_bytes().to_vec())]);
        let result = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(read_events(
                bytes,
                &mut parser,
                deltas,
                Duration::from_secs(5),
                || {},
            ));
        match result {
            Ok(()) => Ok((true, parser.finish())),
            Err(ReadError::Failed(AgentError::ModelError { message, .. }))
                if message.starts_with("stream ended early") =>
            {
                Ok((false, parser.finish()))
            }
            Err(ReadError::Failed(e)) => Err(e),
            Err(ReadError::BeforeFirstEvent(e)) => Err(AgentError::internal(e)),
        }
    }

    #[test]
    fn error_messages_of_known_shapes() {
        use serde_json::json;
        let m = |v| error_message(&v);
        assert_eq!(
            m(json!({"error": {"message": "bad key"}})).as_deref(),
            Some("bad key")
        );
        assert_eq!(m(json!({"error": "no model"})).as_deref(), Some("no model"));
        assert_eq!(m(json!({"message": "busy"})).as_deref(), Some("busy"));
        assert_eq!(m(json!({"detail": 1})), None);
    }

    #[test]
    fn malformed_cuts_long_data_on_char_boundaries() {
        let data = "é".repeat(500);
        let e = malformed("x", &data);
        let AgentError::ModelError { message, retryable } = e else {
            panic!()
        };
        assert!(!retryable);
        assert!(message.starts_with("malformed stream: x in `é"));
        assert_eq!(message.chars().filter(|c| *c == 'é').count(), 200);
    }
}
