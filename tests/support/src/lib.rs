//! Test support for troupe: [`ModelServer`], a local model server that speaks exactly the
//! OpenAI streaming wire formats (Chat Completions and Responses, as captured in the
//! fixtures), follows a per-request script of [`Reply`] values, records every request and
//! counts streams whose client went away early.
//!
//! ```no_run
//! # async fn demo() {
//! use troupe_test_support::{ModelServer, Reply};
//! let server = ModelServer::start().await;
//! server.push(Reply::text(["Hel", "lo"]));
//! // point a client at server.base_url() ...
//! assert_eq!(server.requests().len(), 0);
//! # }
//! ```
#![forbid(unsafe_code)]

pub mod acp;
pub mod mcp;
pub mod oauth;
mod reply;
pub mod wire;

pub use reply::{CallScript, Reply, Usage};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use reply::ReplyBody;
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use wire::{Rendered, WireContext};

/// One request the server received.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// The request's query, when it has one.
    pub query: Option<String>,
    /// Lower-case names; a repeated header keeps its last value.
    pub headers: BTreeMap<String, String>,
    /// The parsed JSON body (`Value::Null` when it was not JSON).
    pub body: Value,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// The route a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Responses,
}

#[derive(Default)]
struct Shared {
    // A plain mutex: held only to push or pop, never across an await.
    queue: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    /// Streams whose body was dropped before its last event was handed to the connection.
    disconnects: AtomicUsize,
    /// Tool calls rendered so far, so call ids stay unique across requests.
    calls: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked while holding the lock must not hide the other tests' results.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A scripted model server on 127.0.0.1. Stops when dropped.
pub struct ModelServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for ModelServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ModelServer {
    /// Binds 127.0.0.1:0 and serves on a tokio task.
    ///
    /// # Panics
    /// When the loopback port cannot be bound (a test cannot run without it).
    pub async fn start() -> Self {
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("cannot bind the model server: {e}"),
        };
        let addr = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => panic!("model server has no address: {e}"),
        };
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/responses", post(responses))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, shared, task }
    }

    /// `http://127.0.0.1:PORT/v1`
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues a reply for the next request (FIFO). With the queue empty, requests get the
    /// text reply "ok".
    pub fn push(&self, reply: Reply) {
        lock(&self.shared.queue).push_back(reply);
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared.requests).clone()
    }

    /// Streams whose client went away before the stream ended.
    pub fn disconnects(&self) -> usize {
        self.shared.disconnects.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` disconnects were counted, or `within` passed; returns the
    /// count. The server learns of a disconnect asynchronously, so tests poll.
    pub async fn wait_disconnects(&self, n: usize, within: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let seen = self.disconnects();
            if seen >= n || tokio::time::Instant::now() >= deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn chat(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(Api::Chat, &shared, method, uri, headers, body).await
}

async fn responses(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(Api::Responses, &shared, method, uri, headers, body).await
}

async fn answer(
    api: Api,
    shared: &Arc<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let request_number = {
        let mut requests = lock(&shared.requests);
        requests.push(Recorded {
            method: method.to_string(),
            path: uri.path().to_owned(),
            query: uri.query().map(str::to_owned),
            headers: headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: body.clone(),
        });
        requests.len() as u64
    };
    if body.get("stream").and_then(Value::as_bool) != Some(true) {
        return error_response(
            400,
            &json!({"error": {"message": "this test server only streams: set \"stream\": true",
                              "type": "invalid_request_error", "param": "stream", "code": null}}),
            None,
        );
    }
    let reply = lock(&shared.queue)
        .pop_front()
        .unwrap_or_else(|| Reply::text(["ok"]));
    // Counts a disconnect if the client leaves during the delay, too.
    let guard = StreamGuard {
        shared: shared.clone(),
        finished: false,
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    match reply.body {
        ReplyBody::Error {
            status,
            body,
            retry_after,
        } => {
            let mut guard = guard;
            guard.finish();
            error_response(status, &body, retry_after.as_deref())
        }
        ReplyBody::Stream(script) => {
            let first_call = shared
                .calls
                .fetch_add(script.calls.len() as u64, Ordering::SeqCst)
                + 1;
            let created = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let ctx = WireContext::from_request(request_number, first_call, created, &body);
            let rendered = match api {
                Api::Chat => wire::chat(&script, &ctx),
                Api::Responses => wire::responses(&script, &ctx),
            };
            sse_response(rendered, guard)
        }
    }
}

fn error_response(status: u16, body: &Value, retry_after: Option<&str>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    if let Some(value) = retry_after.and_then(|v| HeaderValue::from_str(v).ok()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// Counts a disconnect when dropped before the stream handed out its last event.
struct StreamGuard {
    shared: Arc<Shared>,
    finished: bool,
}

impl StreamGuard {
    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.disconnects.fetch_add(1, Ordering::SeqCst);
        }
    }
}

struct StreamState {
    frames: VecDeque<String>,
    stall: bool,
    guard: StreamGuard,
}

fn sse_response(rendered: Rendered, guard: StreamGuard) -> Response {
    let state = StreamState {
        frames: rendered.frames.into(),
        stall: rendered.stall,
        guard,
    };
    let stream = futures::stream::unfold(state, |mut state| async move {
        match state.frames.pop_front() {
            Some(frame) => {
                if state.frames.is_empty() && !state.stall {
                    state.guard.finish();
                }
                Some((Ok::<_, std::convert::Infallible>(frame), state))
            }
            None if state.stall => {
                // Keeps the connection open and silent until the client leaves, which drops
                // this future and with it the guard.
                std::future::pending::<()>().await;
                None
            }
            None => {
                state.guard.finish();
                None
            }
        }
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn send(addr: SocketAddr, path: &str, body: &str) -> tokio::net::TcpStream {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             X-Probe: 1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        stream
    }

    async fn post(addr: SocketAddr, path: &str, body: &str) -> String {
        let mut stream = send(addr, path, body).await;
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        out.to_ascii_lowercase()
    }

    #[tokio::test]
    async fn routes_record_and_answer() {
        let server = ModelServer::start().await;
        assert!(server.base_url().starts_with("http://127.0.0.1:"));
        server.push(Reply::error(429, "Slow down").retry_after("2"));
        let addr = server.addr();

        let r = post(addr, "/v1/chat/completions", r#"{"stream":true}"#).await;
        assert!(r.starts_with("http/1.1 429"), "{r}");
        assert!(r.contains("retry-after: 2"), "{r}");
        assert!(r.contains("\"message\":\"slow down\""), "{r}");

        let r = post(addr, "/v1/responses", r#"{"model":"m"}"#).await;
        assert!(r.starts_with("http/1.1 400"), "{r}");

        // The queue is empty: the default "ok" text reply.
        let r = post(addr, "/v1/responses", r#"{"model":"m","stream":true}"#).await;
        assert!(r.starts_with("http/1.1 200"), "{r}");
        assert!(r.contains("content-type: text/event-stream"), "{r}");
        assert!(r.contains("\"delta\":\"ok\""), "{r}");
        assert!(r.contains("event: response.completed"), "{r}");

        let requests = server.requests();
        assert_eq!(requests.len(), 3);
        assert_eq!(requests[0].path, "/v1/chat/completions");
        assert_eq!(requests[0].method, "POST");
        assert_eq!(requests[0].header("X-Probe"), Some("1"));
        assert_eq!(requests[2].body["model"], "m");
        assert_eq!(server.disconnects(), 0);
    }

    #[tokio::test]
    async fn leaving_a_stalled_stream_counts_a_disconnect() {
        let server = ModelServer::start().await;
        server.push(Reply::text(["x", "y"]).stall_after(2));
        let mut stream = send(server.addr(), "/v1/chat/completions", r#"{"stream":true}"#).await;
        let mut seen = String::new();
        let mut buf = [0u8; 4096];
        while !seen.contains("\"content\":\"x\"") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        assert_eq!(server.disconnects(), 0);
        drop(stream);
        assert_eq!(server.wait_disconnects(1, Duration::from_secs(5)).await, 1);
    }

    #[tokio::test]
    async fn delay_holds_the_first_byte() {
        let server = ModelServer::start().await;
        server.push(Reply::text(["late"]).delayed(Duration::from_millis(150)));
        let started = std::time::Instant::now();
        let r = post(server.addr(), "/v1/chat/completions", r#"{"stream":true}"#).await;
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert!(r.contains("data: [done]"), "{r}");
    }
}
