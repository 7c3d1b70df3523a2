//! Reading an SSE body: events are fed one by one to an API-specific [`StreamParser`], with an
//! idle bound between events, a size bound on one event and one on what the parsers collect
//! ([`StreamLimits`]). What the parsers collect is the same for both APIs.

use futures::{FutureExt, Stream, StreamExt};
use std::collections::BTreeMap;
use std::fmt::Display;
use std::time::Duration;
use troupe_actors::ports::DeltaSink;
use troupe_proto::sse::{SseDecoder, SseEvent};
use troupe_proto::{AgentError, Usage};

/// The bounds of reading one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Longest wait for the next event.
    pub idle: Duration,
    /// Most bytes a response's text and tool calls may hold ([`StreamParser::held`]).
    pub response_bytes: usize,
}

/// Room one event has beyond [`StreamLimits::response_bytes`]: the Responses API's terminal
/// event repeats the whole output, with the instructions and tools of the request.
pub const EVENT_ENVELOPE: usize = 4 * 1024 * 1024;

impl StreamLimits {
    /// Most bytes one event may hold before its blank line: the whole response fits in one.
    pub fn event_bytes(&self) -> usize {
        self.response_bytes.saturating_add(EVENT_ENVELOPE)
    }
}

/// A tool call as streamed: arguments still JSON text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawCall {
    pub call_id: String,
    pub name: String,
    pub arguments: String,
}

/// What a call counts for in [`Held`] besides its strings: its own entry.
const CALL_ENTRY: usize = std::mem::size_of::<RawCall>() + 16;

impl RawCall {
    fn size(&self) -> usize {
        CALL_ENTRY + self.call_id.len() + self.name.len() + self.arguments.len()
    }
}

/// The bytes a parser holds for its response (text, calls, ids), counted as they grow so
/// that the bound of [`StreamLimits::response_bytes`] is checked after every event for
/// nothing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Held(usize);

impl Held {
    pub fn get(self) -> usize {
        self.0
    }

    /// Counts `n` more bytes.
    pub fn add(&mut self, n: usize) {
        self.0 = self.0.saturating_add(n);
    }

    /// Applies `change` to the call at `index` (a new one if there is none), counting how
    /// much it grew or shrank.
    pub fn call(
        &mut self,
        calls: &mut BTreeMap<u64, RawCall>,
        index: u64,
        change: impl FnOnce(&mut RawCall),
    ) {
        let mut new = false;
        let call = calls.entry(index).or_insert_with(|| {
            new = true;
            RawCall::default()
        });
        let before = if new { 0 } else { call.size() };
        change(call);
        self.0 = self.0.saturating_sub(before).saturating_add(call.size());
    }
}

/// Everything one stream produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Collected {
    pub response_id: Option<String>,
    /// The model that answered, as the server names it (`gen_ai.response.model`).
    pub model: Option<String>,
    pub text: String,
    pub calls: Vec<RawCall>,
    pub usage: Option<Usage>,
}

impl Collected {
    /// What a stream gathered: its calls in the order of the index the server gave each, a
    /// call the server named no id for called `call_<index>`.
    pub fn gathered(
        response_id: Option<String>,
        model: Option<String>,
        text: String,
        calls: std::collections::BTreeMap<u64, RawCall>,
        usage: Option<Usage>,
    ) -> Self {
        let calls = calls
            .into_iter()
            .map(|(index, mut call)| {
                if call.call_id.is_empty() {
                    call.call_id = format!("call_{index}");
                }
                call
            })
            .collect();
        Self {
            response_id,
            model,
            text,
            calls,
            usage,
        }
    }
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

    /// The bytes collected so far (kept by a [`Held`]): text, calls, ids.
    fn held(&self) -> usize;
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

/// Text deltas held while more events are ready: the deltas of events that arrived together
/// (one read from the socket) reach the sink as one, so a reply streamed in many small events
/// costs one `assistant_chunk` per read, not one per event. Nothing is held while the stream
/// waits for the network: text reaches the sink as soon as it arrived.
struct Coalesced<'a> {
    sink: &'a mut dyn DeltaSink,
    held: String,
}

/// Held text is passed on once it is this long, even if more events are ready.
const HOLD_AT_MOST: usize = 16 * 1024;

impl Coalesced<'_> {
    fn flush(&mut self) {
        if !self.held.is_empty() {
            self.sink.text_delta(&self.held);
            self.held.clear();
        }
    }
}

impl DeltaSink for Coalesced<'_> {
    fn text_delta(&mut self, delta: &str) {
        self.held.push_str(delta);
        if self.held.len() >= HOLD_AT_MOST {
            self.flush();
        }
    }
}

/// Feeds `bytes` to `parser` until its terminal event. `first_event` runs when the first event
/// arrives (time to first byte). Deltas of events that are ready together are passed to
/// `deltas` as one; all received text is passed on before this returns, error or not.
pub async fn read_events<S, B, E, P>(
    bytes: S,
    parser: &mut P,
    deltas: &mut dyn DeltaSink,
    limits: StreamLimits,
    first_event: impl FnOnce(),
) -> Result<(), ReadError>
where
    S: Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: Display,
    P: StreamParser,
{
    let mut coalesced = Coalesced {
        sink: deltas,
        held: String::new(),
    };
    let read = read_coalesced(bytes, parser, &mut coalesced, limits, first_event).await;
    coalesced.flush();
    read
}

async fn read_coalesced<S, B, E, P>(
    mut bytes: S,
    parser: &mut P,
    deltas: &mut Coalesced<'_>,
    limits: StreamLimits,
    first_event: impl FnOnce(),
) -> Result<(), ReadError>
where
    S: Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: Display,
    P: StreamParser,
{
    let mut decoder = SseDecoder::new(limits.event_bytes());
    let mut first_event = Some(first_event);
    loop {
        let event = next_event(
            &mut bytes,
            &mut decoder,
            deltas,
            limits.idle,
            first_event.is_some(),
        )
        .await?;
        if let Some(f) = first_event.take() {
            f();
        }
        let terminal = parser
            .on_event(&event.event, &event.data, deltas)
            .map_err(ReadError::Failed)?;
        if let Some(error) = over_limit(parser.held(), limits.response_bytes) {
            return Err(ReadError::Failed(error));
        }
        if terminal {
            return Ok(());
        }
    }
}

/// The next event: decoded from what arrived, else after reading more. Held deltas go out
/// before the read waits for the network; the wait for one event is bounded by `idle` (bytes
/// that complete no event, such as comments, do not extend it).
async fn next_event<S, B, E>(
    bytes: &mut S,
    decoder: &mut SseDecoder,
    deltas: &mut Coalesced<'_>,
    idle: Duration,
    before_first: bool,
) -> Result<SseEvent, ReadError>
where
    S: Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: Display,
{
    let mut deadline = None;
    loop {
        match decoder.next_event() {
            Ok(Some(event)) => return Ok(event),
            Ok(None) => {}
            Err(e) => return Err(ReadError::Failed(malformed(e, ""))),
        }
        let next = match bytes.next().now_or_never() {
            Some(ready) => ready,
            None => {
                // About to wait for the network: what arrived so far goes out now.
                deltas.flush();
                let at = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + idle);
                tokio::time::timeout_at(at, bytes.next())
                    .await
                    .map_err(|_| {
                        ReadError::Failed(AgentError::ModelError {
                            message: format!("stream idle for {}s", idle.as_secs_f64()),
                            retryable: true,
                        })
                    })?
            }
        };
        match next {
            None => {
                return Err(ReadError::Failed(AgentError::ModelError {
                    message: "stream ended early (no terminal event)".into(),
                    retryable: true,
                }));
            }
            Some(Err(e)) if before_first => return Err(ReadError::BeforeFirstEvent(e.to_string())),
            Some(Err(e)) => {
                return Err(ReadError::Failed(AgentError::ModelError {
                    message: format!("stream broke: {e}"),
                    retryable: true,
                }));
            }
            Some(Ok(chunk)) => decoder.push(chunk.as_ref()),
        }
    }
}

/// The error of a response holding more than `limit` bytes, if it does.
pub fn over_limit(held: usize, limit: usize) -> Option<AgentError> {
    (held > limit).then(|| AgentError::ModelError {
        message: format!(
            "model response too large: its text and tool calls passed {limit} bytes \
             (model.max_response_bytes)"
        ),
        retryable: false,
    })
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
        // One event per read, each after a wait: the parser's own deltas reach `deltas`
        // one by one, as they would from a server that sends them apart.
        let chunks: Vec<Vec<u8>> = text
            .split_inclusive("\n\n")
            .map(|event| event.as_bytes().to_vec())
            .collect();
        let bytes = Stutter {
            chunks: chunks.into_iter(),
            wait: true,
        };
        let result = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(read_events(bytes, &mut parser, deltas, LIMITS, || {}));
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

    /// A stream that is not ready once before each chunk, like a socket between reads.
    struct Stutter {
        chunks: std::vec::IntoIter<Vec<u8>>,
        wait: bool,
    }

    impl Stream for Stutter {
        type Item = Result<Vec<u8>, std::convert::Infallible>;

        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            let wait = self.wait;
            self.wait = !wait;
            if wait {
                cx.waker().wake_by_ref();
                return std::task::Poll::Pending;
            }
            std::task::Poll::Ready(self.chunks.next().map(Ok))
        }
    }

    pub(crate) const LIMITS: StreamLimits = StreamLimits {
        idle: Duration::from_secs(5),
        response_bytes: 1 << 20,
    };

    /// Each `d` event is a delta of its data, which it holds; `end` is terminal.
    #[derive(Default)]
    struct Plain(Held);

    impl StreamParser for Plain {
        fn on_event(
            &mut self,
            kind: &str,
            data: &str,
            deltas: &mut dyn DeltaSink,
        ) -> Result<bool, AgentError> {
            if kind == "d" {
                deltas.text_delta(data);
                self.0.add(data.len());
            }
            Ok(kind == "end")
        }

        fn finish(self) -> Collected {
            Collected::default()
        }

        fn held(&self) -> usize {
            self.0.get()
        }
    }

    /// A sink that hands each delta over a channel, so a test sees it while the read goes on.
    struct Sent(tokio::sync::mpsc::UnboundedSender<String>);

    impl DeltaSink for Sent {
        fn text_delta(&mut self, delta: &str) {
            let _ = self.0.send(delta.to_owned());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn deltas_that_arrive_together_go_out_as_one_before_the_stream_waits() {
        let (chunks, rx) = futures::channel::mpsc::unbounded::<Result<Vec<u8>, String>>();
        let (sent, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let read = tokio::spawn(async move {
            let mut sink = Sent(sent);
            read_events(rx, &mut Plain::default(), &mut sink, LIMITS, || {}).await
        });
        // Three events in one read: one delta, passed on while the stream waits for more.
        chunks
            .unbounded_send(Ok(
                b"event: d\ndata: He\n\nevent: d\ndata: ll\n\nevent: d\ndata: o\n\n".to_vec(),
            ))
            .unwrap();
        assert_eq!(seen.recv().await.as_deref(), Some("Hello"));
        assert!(!read.is_finished(), "the stream is still open");
        // A later read: its own delta.
        chunks
            .unbounded_send(Ok(
                b"event: d\ndata: , world\n\nevent: end\ndata: x\n\n".to_vec()
            ))
            .unwrap();
        assert!(read.await.unwrap().is_ok());
        assert_eq!(seen.recv().await.as_deref(), Some(", world"));
        assert!(seen.try_recv().is_err(), "nothing else");
    }

    #[tokio::test]
    async fn held_text_is_passed_on_when_the_stream_fails() {
        let bytes = futures::stream::iter([
            Ok(b"event: d\ndata: partial\n\n".to_vec()),
            Err("connection reset"),
        ]);
        let mut deltas = Deltas::default();
        let read = read_events(bytes, &mut Plain::default(), &mut deltas, LIMITS, || {}).await;
        assert!(matches!(read, Err(ReadError::Failed(_))), "{read:?}");
        assert_eq!(deltas.0, ["partial"]);
    }

    /// The message of a failed read.
    fn failure(read: Result<(), ReadError>) -> String {
        match read {
            Err(ReadError::Failed(AgentError::ModelError { message, retryable })) => {
                assert!(!retryable, "{message}");
                message
            }
            other => panic!("expected a model error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_event_without_end_fails_once_it_passes_the_event_bound() {
        let limits = StreamLimits {
            idle: Duration::from_secs(5),
            response_bytes: 1000,
        };
        // `data: xxxx...` for ever, never a line end.
        let pulled = std::sync::atomic::AtomicUsize::new(0);
        let endless = futures::stream::once(async { Ok::<_, String>(b"data: ".to_vec()) }).chain(
            futures::stream::repeat_with(|| {
                pulled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(vec![b'x'; 64 * 1024])
            }),
        );
        let read = read_events(
            Box::pin(endless),
            &mut Plain::default(),
            &mut Deltas::default(),
            limits,
            || {},
        )
        .await;
        let message = failure(read);
        assert_eq!(
            message,
            format!(
                "malformed stream: an event is larger than {} bytes (no blank line ended it)",
                1000 + EVENT_ENVELOPE
            )
        );
        let chunks = pulled.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            chunks,
            limits.event_bytes() / (64 * 1024) + 1,
            "read no further"
        );
    }

    #[tokio::test]
    async fn a_response_fails_once_what_it_holds_passes_its_bound() {
        let limits = StreamLimits {
            idle: Duration::from_secs(5),
            response_bytes: 10,
        };
        let bytes = futures::stream::iter(
            ["abcd", "efgh", "ijk", "lmn"]
                .map(|d| Ok::<_, String>(format!("event: d\ndata: {d}\n\n").into_bytes())),
        );
        let mut parser = Plain::default();
        let mut deltas = Deltas::default();
        let read = read_events(bytes, &mut parser, &mut deltas, limits, || {}).await;
        assert_eq!(
            failure(read),
            "model response too large: its text and tool calls passed 10 bytes \
             (model.max_response_bytes)"
        );
        assert_eq!(parser.0.get(), 11, "stopped at the event that passed it");
        assert_eq!(deltas.0.concat(), "abcdefghijk");
    }

    #[test]
    fn held_counts_calls_as_they_grow_and_shrink() {
        let mut held = Held::default();
        let mut calls = BTreeMap::new();
        held.add(3);
        held.call(&mut calls, 0, |c| c.arguments.push_str("{\"a\":"));
        assert_eq!(held.get(), 3 + CALL_ENTRY + 5);
        held.call(&mut calls, 0, |c| c.arguments.push_str("1}"));
        held.call(&mut calls, 2, |c| c.name.push('f'));
        assert_eq!(held.get(), 3 + 2 * CALL_ENTRY + 8);
        // A whole value replaces the fragments.
        held.call(&mut calls, 0, |c| c.arguments = "{}".into());
        assert_eq!(held.get(), 3 + 2 * CALL_ENTRY + 3);
        let sizes: usize = calls.values().map(RawCall::size).sum();
        assert_eq!(held.get(), 3 + sizes);
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
