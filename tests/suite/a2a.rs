//! A2A (P5) with the official Python SDK client (`a2a-sdk`, installed into `.venv` by
//! `scripts/install-python-peers`): send, stream, get, list, cancel a running task,
//! resubscribe, and a headerless 0.3 call, over both the 1.0 and the 0.3 transport.
//! The script is tests/a2a/client_e2e.py; its docstring lists the model replies it expects.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use troupe_runtime::ScriptedReply;
use troupe_runtime::service::a2a::{A2a, A2aBackend, A2aConfig};
use troupe_tests::TestSession;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
}

/// The project venv's python, with the A2A SDK.
fn python() -> PathBuf {
    let py = root().join(".venv/bin/python");
    assert!(
        py.is_file(),
        "{} is missing: run scripts/install-python-peers",
        py.display()
    );
    py
}

/// The model replies the client script expects, in order.
fn script() -> Vec<ScriptedReply> {
    vec![
        ScriptedReply::default(),
        ScriptedReply::text("Streamed answer").delayed(Duration::from_millis(300)),
        ScriptedReply::hang(true),
        ScriptedReply::text("Slow answer").delayed(Duration::from_millis(1500)),
        ScriptedReply::default(),
    ]
}

/// A session with the scripted model behind an A2A endpoint on 127.0.0.1.
struct Server {
    session: TestSession,
    a2a: A2a,
    addr: SocketAddr,
    http: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start() -> Self {
        let session = TestSession::start(script()).await;
        let backend: Arc<dyn A2aBackend> = Arc::new(session.session.clone());
        let a2a = A2a::start(backend, A2aConfig::default()).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = a2a.router();
        let http = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            session,
            a2a,
            addr,
            http,
        }
    }

    async fn stop(self) {
        self.http.abort();
        self.a2a.stop().await;
        self.session.stop().await;
    }
}

/// Runs the client script; its output goes into the failure message.
async fn run_client(base: &str, version: &str) {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(python())
            .arg(root().join("tests/a2a/client_e2e.py"))
            .arg(base)
            .arg(version)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the client script finishes")
    .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "client script failed ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_over_a2a_1_0() {
    let server = Server::start().await;
    run_client(&format!("http://{}", server.addr), "1.0").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_over_a2a_0_3() {
    let server = Server::start().await;
    run_client(&format!("http://{}", server.addr), "0.3").await;
    server.stop().await;
}
