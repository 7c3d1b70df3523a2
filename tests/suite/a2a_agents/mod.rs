//! Remote agents over A2A: troupe's A2A client (`troupe_a2a::A2aClient`) and the `a2a` agent
//! provider, against two real peers: an agent built on the official Python SDK's server
//! (tests/a2a/remote_agent.py, in the `.venv` of `scripts/install-python-peers`) and a second
//! `troupe serve` process.

mod cli;
mod client;
mod provider;
mod spans;
mod troupe_peer;

use serde_json::json;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use troupe_actors::agents::{AgentPorts, AgentSettings, RouterMode};
use troupe_actors::history::LocalSummarizer;
use troupe_actors::rollout::RolloutRecord;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::agent::{AgentCatalog, AgentDefinition};
use troupe_proto::{EventKind, MessageReply, SessionId, TaskId};
use troupe_runtime::ScriptedReply;
use troupe_store::memory::MemoryStore;
use troupe_tests::{RecordingModel, troupe_bin};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
}

/// The project venv's python, with the A2A SDK and uvicorn.
fn python() -> PathBuf {
    let py = root().join(".venv/bin/python");
    assert!(
        py.is_file(),
        "{} is missing: run scripts/install-python-peers",
        py.display()
    );
    py
}

/// A child process killed with its test.
struct Peer {
    child: Child,
    /// Where it answers: `http://127.0.0.1:PORT`.
    base: String,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Peer {
    /// The Python SDK agent (`--no-streaming`, `--token T` as `args` say).
    fn python(args: &[&str]) -> Self {
        let mut child = Command::new(python())
            .arg(root().join("tests/a2a/remote_agent.py"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("the agent prints its port");
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_owned();
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _dir: None,
        }
    }

    /// `troupe serve` with the scripted model answering `replies` (then "You said: ..."),
    /// no API tokens (open on loopback) and commands run unconfined: its approvals are what
    /// guard them.
    fn troupe(replies: Vec<ScriptedReply>) -> Self {
        Self::troupe_at(replies, "127.0.0.1:0")
    }

    /// [`Peer::troupe`], listening on `listen`.
    fn troupe_at(replies: Vec<ScriptedReply>, listen: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script.json");
        std::fs::write(&script, json!({ "replies": replies }).to_string()).unwrap();
        let config = dir.path().join("troupe.toml");
        std::fs::write(&config, "[chat]\nsandbox_policy = \"full-access\"\n").unwrap();
        let mut command = Command::new(troupe_bin());
        command
            .args(["serve", "--listen", listen, "--ephemeral", "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--script")
            .arg(&script)
            .current_dir(dir.path())
            .env_remove("TROUPE_API_TOKENS")
            .env_remove("TROUPE_A2A")
            .env_remove("TROUPE_A2A_PROJECT")
            .env_remove("TROUPE_AGENTS_DIR")
            .stderr(Stdio::null());
        let (child, base) = troupe_tests::spawn_serve(&mut command);
        Self {
            child,
            base,
            _dir: Some(dir),
        }
    }

    /// Its JSON-RPC endpoint.
    fn rpc(&self) -> String {
        format!("{}/a2a", self.base)
    }
}

/// An `a2a` agent definition.
fn a2a_agent(id: &str, url: &str, token_env: Option<&str>) -> AgentDefinition {
    serde_json::from_value(json!({
        "id": id,
        "role": "remote",
        "provider": {"type": "a2a", "url": url, "token_env": token_env},
    }))
    .unwrap()
}

/// A session whose agents are remote over A2A (the provider as `troupe serve` and `troupe
/// chat` plug it in), its bindings in a memory store that outlives a restart.
struct Hub {
    session: SessionHandle,
    store: Arc<MemoryStore>,
    dir: Arc<tempfile::TempDir>,
    session_id: SessionId,
    defs: Vec<AgentDefinition>,
    settings: AgentSettings,
}

impl Hub {
    async fn start(defs: Vec<AgentDefinition>) -> Self {
        Self::start_with(defs, AgentSettings::default()).await
    }

    /// [`Hub::start`] with these agent settings (the router is always the rules).
    async fn start_with(defs: Vec<AgentDefinition>, settings: AgentSettings) -> Self {
        Self::launch(
            SessionId::new(),
            defs,
            Arc::new(tempfile::tempdir().unwrap()),
            Arc::new(MemoryStore::new()),
            settings,
        )
        .await
    }

    async fn launch(
        session_id: SessionId,
        defs: Vec<AgentDefinition>,
        dir: Arc<tempfile::TempDir>,
        store: Arc<MemoryStore>,
        settings: AgentSettings,
    ) -> Self {
        let config = SessionConfig {
            data_dir: dir.path().to_path_buf(),
            ..SessionConfig::default()
        };
        let catalog = AgentCatalog {
            agents: defs.iter().map(|d| (d.id.clone(), d.clone())).collect(),
            ..AgentCatalog::default()
        };
        let ports = SessionPorts {
            model: Arc::new(RecordingModel::new(Vec::new())),
            mcp: None,
            mcp_connector: None,
            exec: None,
            summarizer: Arc::new(LocalSummarizer::default()),
            tokens: Arc::new(troupe_actors::ports::ApproxTokens),
            rollout_storage: None,
            agents: Some(AgentPorts {
                catalog: Arc::new(catalog),
                settings: AgentSettings {
                    router: RouterMode::Rules,
                    ..settings.clone()
                },
                factories: troupe_runtime::agents::factories(),
                models: Default::default(),
                bindings: store.clone(),
                live: None,
            }),
            effects: troupe_actors::ports::Effects::Live,
        };
        let (session, _join) = SessionHandle::start(session_id, config, ports)
            .await
            .unwrap();
        Self {
            session,
            store,
            dir,
            session_id,
            defs,
            settings,
        }
    }

    /// The same session started again (another run).
    async fn restart(self) -> Self {
        self.session.shutdown().await.unwrap();
        Self::launch(
            self.session_id,
            self.defs,
            self.dir,
            self.store,
            self.settings,
        )
        .await
    }

    /// A message to the root conversation, answered.
    async fn send(&self, text: &str) -> MessageReply {
        let root = self.session.root().await.unwrap();
        tokio::time::timeout(Duration::from_secs(60), self.session.message(root, text))
            .await
            .expect("answered in time")
            .unwrap()
    }

    /// Every event recorded so far.
    async fn records(&self) -> Vec<RolloutRecord> {
        self.session.flush().await.unwrap();
        self.session.events_after(0, 100_000).await.unwrap()
    }

    async fn events(&self) -> Vec<EventKind> {
        self.records()
            .await
            .into_iter()
            .filter_map(|r| r.event)
            .collect()
    }

    /// Waits for an event `pick` accepts; answers what it picked and the event's task.
    async fn wait_for<T>(&self, pick: impl Fn(&EventKind) -> Option<T>) -> (Option<TaskId>, T) {
        let t0 = std::time::Instant::now();
        loop {
            for r in self.records().await {
                if let Some(found) = r.event.as_ref().and_then(&pick) {
                    return (r.task_id, found);
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the event never came"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The `agent_update` events of `agent_id`: (kind, text, data).
fn updates(
    events: &[EventKind],
    agent_id: &str,
) -> Vec<(
    troupe_proto::agent::AgentUpdateKind,
    String,
    Option<serde_json::Value>,
)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::AgentUpdate {
                agent_id: a,
                update,
                text,
                data,
                ..
            } if a == agent_id => Some((*update, text.clone(), data.clone().map(|d| d.0))),
            _ => None,
        })
        .collect()
}

/// The remote task ids the updates of `agent_id` name, in order, without repeats.
fn remote_tasks(events: &[EventKind], agent_id: &str) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for (_, _, data) in updates(events, agent_id) {
        if let Some(id) = data.as_ref().and_then(|d| d["taskId"].as_str())
            && !ids.iter().any(|i| i == id)
        {
            ids.push(id.to_owned());
        }
    }
    ids
}

/// A proxy in front of an A2A agent that cuts every SSE stream after `keep` events (the
/// agent goes on with the task), and notes each JSON-RPC method it forwards.
struct CuttingProxy {
    base: String,
    methods: Arc<std::sync::Mutex<Vec<String>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

#[derive(Clone)]
struct ProxyState {
    upstream: String,
    me: String,
    keep: usize,
    methods: Arc<std::sync::Mutex<Vec<String>>>,
    http: reqwest::Client,
}

impl CuttingProxy {
    async fn start(upstream: &str, keep: usize) -> Self {
        use axum::routing::{get, post};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let methods = Arc::new(std::sync::Mutex::new(Vec::new()));
        let state = ProxyState {
            upstream: upstream.to_owned(),
            me: base.clone(),
            keep,
            methods: methods.clone(),
            http: reqwest::Client::new(),
        };
        let app = axum::Router::new()
            .route("/.well-known/agent-card.json", get(proxy_card))
            .route("/a2a", post(proxy_rpc))
            .with_state(state);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            base,
            methods,
            server,
        }
    }

    fn methods(&self) -> Vec<String> {
        self.methods.lock().unwrap().clone()
    }
}

/// The agent's card, its interfaces pointing at the proxy.
async fn proxy_card(
    axum::extract::State(s): axum::extract::State<ProxyState>,
) -> axum::Json<serde_json::Value> {
    let mut card: serde_json::Value = s
        .http
        .get(format!("{}/.well-known/agent-card.json", s.upstream))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for i in card["supportedInterfaces"].as_array_mut().unwrap() {
        i["url"] = json!(format!("{}/a2a", s.me));
    }
    axum::Json(card)
}

async fn proxy_rpc(
    axum::extract::State(s): axum::extract::State<ProxyState>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use eventsource_stream::Eventsource;
    use futures::StreamExt;
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
    s.methods
        .lock()
        .unwrap()
        .push(request["method"].as_str().unwrap_or_default().to_owned());
    let mut forward = s
        .http
        .post(format!("{}/a2a", s.upstream))
        .header("content-type", "application/json")
        .body(body.to_vec());
    for name in ["a2a-version", "accept", "authorization"] {
        if let Some(v) = headers.get(name) {
            forward = forward.header(name, v.clone());
        }
    }
    let answer = forward.send().await.unwrap();
    let status = answer.status().as_u16();
    let is_sse = answer
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let builder = axum::response::Response::builder().status(status);
    if is_sse {
        let events = answer.bytes_stream().eventsource().take(s.keep).map(|e| {
            Ok::<_, std::io::Error>(axum::body::Bytes::from(format!(
                "data: {}\n\n",
                e.map(|e| e.data).unwrap_or_default()
            )))
        });
        builder
            .header("content-type", "text/event-stream")
            .body(axum::body::Body::from_stream(events))
            .unwrap()
    } else {
        let bytes = answer.bytes().await.unwrap();
        builder
            .header("content-type", "application/json")
            .body(axum::body::Body::from(bytes))
            .unwrap()
    }
}
