//! A client of remote A2A agents: JSON-RPC over HTTP, in A2A 1.0 or 0.3 (whichever the
//! agent's card offers, 1.0 first), with SSE streams.
//!
//! ```text
//! A2aClient::discover(url)  ── GET card ──▶ the JSON-RPC endpoint, its version, streaming?
//!   send            SendMessage            (0.3 message/send)      → Task | Message
//!   stream          SendStreamingMessage   (0.3 message/stream)    → EventStream
//!   get_task        GetTask                (0.3 tasks/get)         → Task
//!   cancel_task     CancelTask             (0.3 tasks/cancel)      → Task
//!   resubscribe     SubscribeToTask        (0.3 tasks/resubscribe) → EventStream
//!   list_tasks      ListTasks              (1.0 only)              → TaskPage
//! ```
//!
//! Every call carries the bearer token when one is given, and `A2A-Version: 1.0` when
//! speaking 1.0 (a request without it is 0.3, spec 3.6). A unary call is bounded by
//! [`ClientOptions::call_timeout`]; a stream by nothing but its connection (the caller
//! decides how long to read). Each call is counted in
//! `troupe_a2a_client_calls_total{operation, version, outcome}` and timed in
//! `troupe_a2a_client_call_duration_seconds{operation}`.

pub mod card;
pub mod error;
pub mod params;
mod sse;

pub use card::{CardSummary, Endpoint};
pub use error::ClientError;
pub use params::{ListFilter, SendOptions};
pub use sse::{EventStream, StreamItem};

use crate::metrics;
use crate::model::Message;
use crate::model::{SendResult, Task, TaskPage};
use crate::version::{Operation, Version};
use crate::wire;
use serde_json::{Value, json};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How the client talks.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Only this version (`None`: 1.0 when the card offers it, else 0.3).
    pub version: Option<Version>,
    /// Longest wait for a unary call's answer (connect included).
    pub call_timeout: Duration,
    /// Longest wait for a connection.
    pub connect_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            version: None,
            call_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// A client of one remote agent.
#[derive(Debug)]
pub struct A2aClient {
    http: reqwest::Client,
    endpoint: Endpoint,
    token: Option<String>,
    call_timeout: Duration,
    /// JSON-RPC request ids.
    next_id: AtomicU64,
    /// The card it was found by, if any.
    card: Option<CardSummary>,
    /// Why the last call got no JSON-RPC answer (the agent could not be reached, or its
    /// HTTP server refused), until a later call gets one.
    last_failure: Mutex<Option<ClientError>>,
}

impl A2aClient {
    /// Reads the card of the agent at `url` (see [`card`] for where it is looked for) and
    /// talks to the JSON-RPC interface it names.
    pub async fn discover(
        url: &str,
        token: Option<String>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let http = http_client(&options)?;
        let candidates = card::card_urls(url).map_err(ClientError::Card)?;
        let mut tried = Vec::new();
        for card_url in &candidates {
            let mut request = http.get(card_url).timeout(options.call_timeout);
            if let Some(t) = &token {
                request = request.bearer_auth(t);
            }
            let answer = match request.send().await {
                Ok(r) => r,
                Err(e) => {
                    return Err(ClientError::Transport {
                        url: card_url.clone(),
                        message: error_chain(&e),
                    });
                }
            };
            let status = answer.status();
            if !status.is_success() {
                tried.push(format!("{card_url} (HTTP {})", status.as_u16()));
                continue;
            }
            let body: Value = match answer.json().await {
                Ok(v) => v,
                Err(e) => {
                    tried.push(format!("{card_url} (not JSON: {e})"));
                    continue;
                }
            };
            let summary =
                card::summarize(&body, card_url, options.version).map_err(ClientError::Card)?;
            tracing::debug!(card = %card_url, endpoint = %summary.endpoint.url,
                version = summary.endpoint.version.as_str(), "a2a agent card read");
            return Ok(Self {
                endpoint: summary.endpoint.clone(),
                card: Some(summary),
                http,
                token,
                call_timeout: options.call_timeout,
                next_id: AtomicU64::new(1),
                last_failure: Mutex::new(None),
            });
        }
        Err(ClientError::Card(format!(
            "no A2A agent card for {url}: tried {}",
            tried.join(", ")
        )))
    }

    /// A client of the JSON-RPC endpoint `endpoint`, without reading a card.
    pub fn at(
        endpoint: Endpoint,
        token: Option<String>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        Ok(Self {
            http: http_client(&options)?,
            endpoint,
            token,
            call_timeout: options.call_timeout,
            next_id: AtomicU64::new(1),
            card: None,
            last_failure: Mutex::new(None),
        })
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub fn version(&self) -> Version {
        self.endpoint.version
    }

    /// Why the agent cannot be talked to, as the last call found: it could not be reached
    /// or its HTTP server refused the call (401, 404, 5xx). `None` once a call got a
    /// JSON-RPC answer (a JSON-RPC error included), and before any call.
    pub fn last_failure(&self) -> Option<ClientError> {
        self.last_failure.lock().ok().and_then(|f| f.clone())
    }

    /// Notes whether a call reached the agent's JSON-RPC endpoint.
    fn note<T>(&self, result: &Result<T, ClientError>) {
        let failure = match result {
            Err(e @ (ClientError::Transport { .. } | ClientError::Http { .. })) => Some(e.clone()),
            Err(ClientError::Unsupported { .. }) => return,
            _ => None,
        };
        if let Ok(mut last) = self.last_failure.lock() {
            *last = failure;
        }
    }

    /// The card it was found by (`None` for [`A2aClient::at`]).
    pub fn card(&self) -> Option<&CardSummary> {
        self.card.as_ref()
    }

    /// Sends a message; answers the task (when it ended or needs input, unless
    /// `return_immediately`) or the agent's direct reply.
    pub async fn send(
        &self,
        message: &Message,
        options: &SendOptions,
    ) -> Result<SendResult, ClientError> {
        let op = Operation::SendMessage;
        let params = params::send(self.version(), message, options);
        let result = self.call(op, params).await?;
        let decoded = wire::decode_send_result(self.version(), &result)
            .map_err(|e| ClientError::invalid(op, &e));
        self.count(op, decoded)
    }

    /// Sends a message and streams what follows: the task (or a direct reply), its status
    /// and artifact updates, until it ends or needs input.
    pub async fn stream(&self, message: &Message) -> Result<EventStream, ClientError> {
        let op = Operation::SendStreamingMessage;
        let params = params::send(self.version(), message, &SendOptions::default());
        self.open_stream(op, params).await
    }

    /// Streams the updates of a task that is still running, from its current state on.
    pub async fn resubscribe(&self, task_id: &str) -> Result<EventStream, ClientError> {
        self.open_stream(Operation::SubscribeToTask, params::id(task_id))
            .await
    }

    pub async fn get_task(
        &self,
        task_id: &str,
        history_length: Option<u32>,
    ) -> Result<Task, ClientError> {
        let op = Operation::GetTask;
        let result = self.call(op, params::get(task_id, history_length)).await?;
        let decoded =
            wire::decode_task(self.version(), &result).map_err(|e| ClientError::invalid(op, &e));
        self.count(op, decoded)
    }

    /// Asks the agent to cancel a task; answers the task as it stands after.
    pub async fn cancel_task(&self, task_id: &str) -> Result<Task, ClientError> {
        let op = Operation::CancelTask;
        let result = self.call(op, params::id(task_id)).await?;
        let decoded =
            wire::decode_task(self.version(), &result).map_err(|e| ClientError::invalid(op, &e));
        self.count(op, decoded)
    }

    /// One page of the agent's tasks (A2A 1.0 only).
    pub async fn list_tasks(&self, filter: &ListFilter) -> Result<TaskPage, ClientError> {
        let op = Operation::ListTasks;
        if self.version() != Version::V1_0 {
            return self.count(
                op,
                Err(ClientError::Unsupported {
                    operation: op.label(),
                    version: self.version().as_str(),
                }),
            );
        }
        let result = self.call(op, params::list(filter)).await?;
        let decoded = wire::decode_task_page(&result).map_err(|e| ClientError::invalid(op, &e));
        self.count(op, decoded)
    }

    /// Counts the outcome of a decoded answer (transport and JSON-RPC failures were counted
    /// by `call`).
    fn count<T>(&self, op: Operation, r: Result<T, ClientError>) -> Result<T, ClientError> {
        match &r {
            Ok(_) => metrics::call(op, self.version(), "ok"),
            Err(e) => metrics::call(op, self.version(), e.outcome()),
        }
        r
    }

    fn request(
        &self,
        op: Operation,
        params: Value,
    ) -> Result<reqwest::RequestBuilder, ClientError> {
        let method = op.method(self.version()).ok_or(ClientError::Unsupported {
            operation: op.label(),
            version: self.version().as_str(),
        })?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut request = self.http.post(&self.endpoint.url).json(&body);
        if self.version() == Version::V1_0 {
            request = request.header("A2A-Version", "1.0");
        }
        if let Some(t) = &self.token {
            request = request.bearer_auth(t);
        }
        Ok(request)
    }

    /// A unary call: its `result`, or why there is none.
    async fn call(&self, op: Operation, params: Value) -> Result<Value, ClientError> {
        let started = Instant::now();
        let span = self.span(op);
        let result = async {
            let request = self.request(op, params)?.timeout(self.call_timeout);
            let answer = request
                .header(reqwest::header::ACCEPT, "application/json")
                .send()
                .await
                .map_err(|e| self.transport(&e))?;
            let status = answer.status();
            let body = answer.bytes().await.map_err(|e| self.transport(&e))?;
            rpc_result(op, &self.endpoint.url, status.as_u16(), &body)
        };
        let result = tracing::Instrument::instrument(result, span).await;
        self.note(&result);
        metrics::duration(op, started.elapsed());
        if let Err(e) = &result {
            metrics::call(op, self.version(), e.outcome());
        }
        result
    }

    /// The span of one call (of a stream: until it opened).
    fn span(&self, op: Operation) -> tracing::Span {
        tracing::info_span!(
            "troupe.a2a.client.call",
            otel.kind = "client",
            "rpc.system" = "jsonrpc",
            "rpc.method" = op.method(self.version()).unwrap_or_default(),
            "url.full" = %self.endpoint.url,
            operation = op.label(),
            version = self.version().as_str(),
        )
    }

    async fn open_stream(&self, op: Operation, params: Value) -> Result<EventStream, ClientError> {
        let started = Instant::now();
        let span = self.span(op);
        let result = async {
            let request = self.request(op, params)?;
            let answer = request
                .header(reqwest::header::ACCEPT, "text/event-stream")
                .send()
                .await
                .map_err(|e| self.transport(&e))?;
            let status = answer.status();
            let is_sse = answer
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            if status.is_success() && is_sse {
                return Ok(EventStream::new(
                    op,
                    self.version(),
                    self.endpoint.url.clone(),
                    answer,
                ));
            }
            // An error answered as plain JSON (or HTTP) instead of a stream.
            let body = answer.bytes().await.map_err(|e| self.transport(&e))?;
            match rpc_result(op, &self.endpoint.url, status.as_u16(), &body) {
                Err(e) => Err(e),
                Ok(_) => Err(ClientError::Invalid {
                    operation: op.label(),
                    message: "a stream was asked for and a single answer came".into(),
                }),
            }
        };
        let result = tracing::Instrument::instrument(result, span).await;
        self.note(&result);
        metrics::duration(op, started.elapsed());
        metrics::call(
            op,
            self.version(),
            match &result {
                Ok(_) => "ok",
                Err(e) => e.outcome(),
            },
        );
        result
    }

    fn transport(&self, e: &reqwest::Error) -> ClientError {
        ClientError::Transport {
            url: self.endpoint.url.clone(),
            message: error_chain(e),
        }
    }
}

fn http_client(options: &ClientOptions) -> Result<reqwest::Client, ClientError> {
    reqwest::Client::builder()
        .connect_timeout(options.connect_timeout)
        .build()
        .map_err(|e| ClientError::Transport {
            url: String::new(),
            message: format!("cannot build an HTTP client: {e}"),
        })
}

/// An error with its causes ("error sending request: connection refused").
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// The `result` of a JSON-RPC answer, or the error it holds (JSON-RPC or HTTP).
pub(crate) fn rpc_result(
    op: Operation,
    url: &str,
    status: u16,
    body: &[u8],
) -> Result<Value, ClientError> {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    // A JSON-RPC error is an object; `{"error": "unauthorized"}` from a proxy is not one.
    if let Some(error) = parsed
        .as_ref()
        .and_then(|v| v.get("error"))
        .filter(|e| e.is_object())
    {
        return Err(rpc_error(op, error));
    }
    if !(200..300).contains(&status) {
        return Err(ClientError::Http {
            url: url.to_owned(),
            status,
            body: String::from_utf8_lossy(body).chars().take(300).collect(),
        });
    }
    match parsed {
        Some(mut v) => match v.get_mut("result") {
            Some(result) => Ok(result.take()),
            None => Err(ClientError::Invalid {
                operation: op.label(),
                message: "a JSON-RPC answer holds a result or an error".into(),
            }),
        },
        None => Err(ClientError::Invalid {
            operation: op.label(),
            message: format!(
                "not JSON: {}",
                String::from_utf8_lossy(body)
                    .chars()
                    .take(100)
                    .collect::<String>()
            ),
        }),
    }
}

pub(crate) fn rpc_error(op: Operation, error: &Value) -> ClientError {
    ClientError::Rpc {
        operation: op.label(),
        code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
        message: error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("(no message)")
            .chars()
            .take(500)
            .collect(),
        data: error.get("data").cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_its_result_or_its_error() {
        let op = Operation::GetTask;
        assert_eq!(
            rpc_result(
                op,
                "u",
                200,
                br#"{"jsonrpc":"2.0","id":1,"result":{"a":1}}"#
            )
            .unwrap(),
            json!({"a": 1})
        );
        let e = rpc_result(
            op,
            "u",
            200,
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"Task not found"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.rpc_code(), Some(error::TASK_NOT_FOUND));
        // A JSON-RPC error sent with an HTTP error status is still the JSON-RPC error.
        let e = rpc_result(
            op,
            "u",
            400,
            br#"{"error":{"code":-32602,"message":"bad"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.rpc_code(), Some(-32602));
        for body in [
            &br#"{"code":"unauthorized"}"#[..],
            br#"{"error":"unauthorized"}"#,
        ] {
            let e = rpc_result(op, "u", 401, body).unwrap_err();
            assert!(matches!(e, ClientError::Http { status: 401, .. }), "{e:?}");
        }
        for body in [&b"<html>"[..], br#"{"jsonrpc":"2.0","id":1}"#] {
            assert_eq!(
                rpc_result(op, "u", 200, body).unwrap_err().outcome(),
                "invalid_answer"
            );
        }
    }
}
