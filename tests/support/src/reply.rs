//! `Reply`: what the model server answers to one request, built with small builder functions.

use serde_json::{Value, json};
use std::time::Duration;

/// One scripted answer; consumed by exactly one request on either route.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub(crate) body: ReplyBody,
    /// Wait before the first byte (headers included).
    pub(crate) delay: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ReplyBody {
    Stream(StreamScript),
    Error {
        status: u16,
        body: Value,
        retry_after: Option<String>,
    },
}

/// A streamed answer: optional text, then tool calls, then usage, then the terminal event.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct StreamScript {
    pub(crate) text: Vec<String>,
    pub(crate) calls: Vec<CallScript>,
    pub(crate) usage: Usage,
    /// The stream reports no usage at all (as some OpenAI-compatible servers do).
    pub(crate) no_usage: bool,
    pub(crate) fault: Option<Fault>,
}

/// One tool call whose arguments arrive in the given fragments.
#[derive(Debug, Clone, PartialEq)]
pub struct CallScript {
    pub name: String,
    /// Concatenated, these are the arguments (JSON text, or not, to test the client's check).
    pub fragments: Vec<String>,
    /// The call id; `call_<n>` (n counted from 1 within the reply) when `None`.
    pub call_id: Option<String>,
}

impl CallScript {
    pub fn new<I, S>(name: impl Into<String>, fragments: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            name: name.into(),
            fragments: fragments.into_iter().map(Into::into).collect(),
            call_id: None,
        }
    }

    pub fn with_id(mut self, call_id: impl Into<String>) -> Self {
        self.call_id = Some(call_id.into());
        self
    }

    /// The arguments as the server finally reports them.
    pub(crate) fn arguments(&self) -> String {
        self.fragments.concat()
    }
}

/// Token usage the stream reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cached: u64,
    pub reasoning: u64,
}

impl Default for Usage {
    /// The numbers of the captured fixtures.
    fn default() -> Self {
        Self {
            input: 5,
            output: 2,
            cached: 0,
            reasoning: 0,
        }
    }
}

/// How a stream misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// A `data:` line that is not JSON, after the first event.
    Malformed,
    /// Send this many events, then keep the connection open and send nothing.
    StallAfter(usize),
    /// Close the stream without the terminal event.
    EndEarly,
}

impl Reply {
    /// Streamed text, one delta per chunk.
    pub fn text<I, S>(chunks: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::stream(StreamScript {
            text: chunks.into_iter().map(Into::into).collect(),
            ..StreamScript::default()
        })
    }

    /// One tool call with its arguments split into `fragments`.
    pub fn tool_call<I, S>(name: impl Into<String>, fragments: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::tool_calls([CallScript::new(name, fragments)])
    }

    /// Several tool calls in one response (chat: `index` 0, 1, ..; responses: one output
    /// item each).
    pub fn tool_calls(calls: impl IntoIterator<Item = CallScript>) -> Self {
        Self::stream(StreamScript {
            calls: calls.into_iter().collect(),
            ..StreamScript::default()
        })
    }

    /// An HTTP error with an OpenAI-style body `{"error": {"message", "type", ...}}`.
    pub fn error(status: u16, message: impl Into<String>) -> Self {
        let kind = match status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        Self::error_body(
            status,
            json!({"error": {"message": message.into(), "type": kind, "param": null, "code": null}}),
        )
    }

    /// An HTTP error with this exact JSON body.
    pub fn error_body(status: u16, body: Value) -> Self {
        Self {
            body: ReplyBody::Error {
                status,
                body,
                retry_after: None,
            },
            delay: Duration::ZERO,
        }
    }

    fn stream(script: StreamScript) -> Self {
        Self {
            body: ReplyBody::Stream(script),
            delay: Duration::ZERO,
        }
    }

    fn map_stream(mut self, f: impl FnOnce(&mut StreamScript)) -> Self {
        if let ReplyBody::Stream(script) = &mut self.body {
            f(script);
        }
        self
    }

    /// Leading text before the tool calls (or more text for a text reply).
    pub fn with_text<I, S>(self, chunks: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.map_stream(|s| s.text.extend(chunks.into_iter().map(Into::into)))
    }

    /// One more tool call.
    pub fn with_call(self, call: CallScript) -> Self {
        self.map_stream(|s| s.calls.push(call))
    }

    /// Usage numbers reported at the end of the stream.
    pub fn with_usage(self, input: u64, output: u64, cached: u64, reasoning: u64) -> Self {
        self.map_stream(|s| {
            s.usage = Usage {
                input,
                output,
                cached,
                reasoning,
            }
        })
    }

    /// No usage in the stream: no usage chunk (Chat, even when asked for one), no `usage` in
    /// `response.completed` (Responses).
    pub fn without_usage(self) -> Self {
        self.map_stream(|s| s.no_usage = true)
    }

    /// A `Retry-After` header on an error reply (seconds or an HTTP date).
    pub fn retry_after(mut self, value: impl Into<String>) -> Self {
        if let ReplyBody::Error { retry_after, .. } = &mut self.body {
            *retry_after = Some(value.into());
        }
        self
    }

    /// A garbage `data:` line (invalid JSON) right after the first event.
    pub fn malformed(self) -> Self {
        self.map_stream(|s| s.fault = Some(Fault::Malformed))
    }

    /// Sends `events` events, then nothing while keeping the connection open.
    pub fn stall_after(self, events: usize) -> Self {
        self.map_stream(|s| s.fault = Some(Fault::StallAfter(events)))
    }

    /// Ends the stream without its terminal event (`[DONE]` / `response.completed`).
    pub fn end_early(self) -> Self {
        self.map_stream(|s| s.fault = Some(Fault::EndEarly))
    }

    /// Waits this long before the first byte.
    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}
