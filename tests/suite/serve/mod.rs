//! `troupe serve` over real sockets on 127.0.0.1: the service in this process (scripted
//! model, in-memory store) for the API, the real binary as a child for signals and stdio.

mod auth;
mod bounds;
mod context;
mod crash;
mod edge;
mod exchange;
mod fuzz;
mod many;
mod process;
mod props;
mod queue;
mod rest;
mod restart;
mod rpc;
mod streams;
mod supervision;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use troupe_actors::ports::ApproxTokens;
use troupe_runtime::config::{ApiToken, TroupeConfig};
use troupe_runtime::{ScriptedModel, ScriptedReply, assembly};
use troupe_service::Service;
use troupe_store::memory::MemoryStore;

/// A service on 127.0.0.1:0 in this process.
pub struct Server {
    pub base: String,
    pub service: Service,
    pub model: Arc<ScriptedModel>,
    task: tokio::task::JoinHandle<()>,
    dir: tempfile::TempDir,
}

impl Server {
    pub async fn start() -> Self {
        Self::start_with(|_| {}, Vec::new()).await
    }

    pub async fn start_with(
        configure: impl FnOnce(&mut TroupeConfig),
        replies: Vec<ScriptedReply>,
    ) -> Self {
        Self::start_on(|_| Arc::new(MemoryStore::new()), configure, replies).await
    }

    /// A service on the store `store` opens in the data directory.
    pub async fn start_on(
        store: impl FnOnce(&std::path::Path) -> Arc<dyn troupe_store::Store>,
        configure: impl FnOnce(&mut TroupeConfig),
        replies: Vec<ScriptedReply>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = TroupeConfig {
            data_dir: dir.path().to_owned(),
            ..TroupeConfig::default()
        };
        config.chat.sandbox_policy = troupe_proto::SandboxPolicy::FullAccess;
        config.server.grace_period = Duration::from_secs(2);
        configure(&mut config);
        let model = Arc::new(ScriptedModel::new(replies));
        let ports = assembly::session_ports(&config, model.clone(), Arc::new(ApproxTokens));
        let service = Service::start(&config, store(dir.path()), ports, None)
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let s = service.clone();
        let task = tokio::spawn(async move {
            s.serve_http(listener).await.unwrap();
        });
        Self {
            base,
            service,
            model,
            task,
            dir,
        }
    }

    /// The service's data directory.
    pub fn data_dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// A client without a token.
    pub fn api(&self) -> Api {
        Api::new(&self.base, None)
    }

    /// A client with `token`.
    pub fn api_as(&self, token: &str) -> Api {
        Api::new(&self.base, Some(token))
    }

    /// Graceful shutdown, as on SIGTERM.
    pub async fn stop(self) {
        drop(self.stop_keeping_data().await);
    }

    /// Graceful shutdown, as on SIGTERM; the data directory stays, for a next start.
    pub async fn stop_keeping_data(self) -> tempfile::TempDir {
        self.service.shutdown_token().cancel();
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("the service stops")
            .unwrap();
        self.dir
    }
}

/// Tokens for the auth tests: `alpha-token` → alpha, `beta-token` → beta, `ops-token` → all.
pub fn with_tokens(c: &mut TroupeConfig) {
    let token = |t: &str, p: &str| ApiToken {
        token: Some(t.into()),
        token_env: None,
        projects: vec![p.into()],
    };
    c.server.tokens = vec![
        token("alpha-token", "alpha"),
        token("beta-token", "beta"),
        token("ops-token", "*"),
    ];
}

/// An HTTP client of the service.
#[derive(Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
    token: Option<String>,
}

impl Api {
    pub fn new(base: &str, token: Option<&str>) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.to_owned(),
            token: token.map(str::to_owned),
        }
    }

    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn answer(r: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let response = r.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {status} {text}"))
        };
        (status, value)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        Self::answer(self.request(reqwest::Method::GET, path)).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        Self::answer(self.request(reqwest::Method::POST, path).json(&body)).await
    }

    /// Posts `body` as it is, declared JSON (whatever it holds).
    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        Self::answer(
            self.request(reqwest::Method::POST, path)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body),
        )
        .await
    }

    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        Self::answer(self.request(reqwest::Method::PUT, path).json(&body)).await
    }

    /// One JSON-RPC call; the whole response object.
    pub async fn rpc(&self, method: &str, params: Value) -> Value {
        let (status, v) = self
            .post(
                "/rpc",
                json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v
    }

    /// A JSON-RPC call that must succeed: its result.
    pub async fn call(&self, method: &str, params: Value) -> Value {
        let v = self.rpc(method, params).await;
        assert!(v.get("error").is_none(), "{method}: {v}");
        v["result"].clone()
    }

    /// A JSON-RPC call that must fail: its error code.
    pub async fn call_err(&self, method: &str, params: Value) -> i64 {
        let v = self.rpc(method, params).await;
        v["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("{method} should fail: {v}"))
    }

    /// Creates a session (REST) and returns its record.
    pub async fn session(&self, project: Option<&str>) -> Value {
        let body = match project {
            Some(p) => json!({"project_id": p}),
            None => json!({}),
        };
        let (status, v) = self.post("/api/sessions", body).await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        v
    }

    /// Sends a message and waits for the reply (REST).
    pub async fn say(&self, session: &str, text: &str) -> Value {
        let (status, v) = self
            .post(
                &format!("/api/sessions/{session}/messages"),
                json!({"text": text}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v
    }

    /// Reads SSE events from `after` until `until` says stop (or 10 s pass).
    pub async fn sse(
        &self,
        session: &str,
        last_event_id: Option<u64>,
        mut until: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        use eventsource_stream::Eventsource;
        let mut r = self.request(
            reqwest::Method::GET,
            &format!("/api/sessions/{session}/events"),
        );
        if let Some(id) = last_event_id {
            r = r.header("Last-Event-ID", id.to_string());
        }
        let response = r.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let mut stream = response.bytes_stream().eventsource();
        let mut out = Vec::new();
        let read = async {
            while let Some(e) = stream.next().await {
                let e = e.unwrap();
                let mut v: Value = serde_json::from_str(&e.data).unwrap();
                assert_eq!(e.id, v["seq"].to_string(), "SSE id is the seq");
                assert_eq!(
                    e.event,
                    v["type"].as_str().unwrap(),
                    "SSE event is the type"
                );
                v["sse_event"] = json!(e.event);
                out.push(v);
                if until(&out) {
                    break;
                }
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .is_err()
        {
            panic!("events arrive; seen: {out:#?}");
        }
        out
    }
}

/// How many events are `message_complete`.
pub fn completes(events: &[Value]) -> usize {
    events
        .iter()
        .filter(|e| e["type"] == "message_complete")
        .count()
}

pub fn seqs(events: &[Value]) -> Vec<u64> {
    events.iter().map(|e| e["seq"].as_u64().unwrap()).collect()
}

/// A session record without what its activity changes (`status`, `updated_ms`), to compare
/// a record read after messages with the one created.
pub fn identity(session: &Value) -> Value {
    let mut v = session.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
        o.remove("updated_ms");
    }
    v
}

pub fn id(v: &Value, field: &str) -> String {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
        .to_owned()
}
