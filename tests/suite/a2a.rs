//! A2A (P5) with the official SDK clients: Python's `a2a-sdk` (installed into `.venv` by
//! `scripts/install-python-peers`) and JavaScript's `@a2a-js/sdk` (into `.tools/a2a-js` by
//! `scripts/install-js-peers`, run on the machine's Node): send, stream with incremental text,
//! get with full history, list, cancel a running task, resubscribe, a push notification to a
//! local receiver, and `troupe serve` killed with SIGKILL and started again in the middle
//! (the context goes on, old tasks are found), over both the 1.0 and the 0.3 transport.
//! The scripts are tests/a2a/client_e2e.py and client_e2e.mjs; their headers list the model
//! replies they expect.

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use troupe_runtime::ScriptedReply;
use troupe_tests::troupe_bin;

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

/// The JS SDK the project installed.
fn js_sdk() -> PathBuf {
    let sdk = root().join(".tools/a2a-js/node_modules/@a2a-js/sdk");
    assert!(
        sdk.join("package.json").is_file(),
        "{} is missing: run scripts/install-js-peers",
        sdk.display()
    );
    sdk
}

/// The model replies the Python client script expects, in order, before the restart.
fn script() -> Vec<ScriptedReply> {
    vec![
        ScriptedReply::default(),
        ScriptedReply::text("Streamed answer")
            .chunked(4)
            .delayed(Duration::from_millis(300)),
        ScriptedReply::hang(true),
        ScriptedReply::text("Slow answer").delayed(Duration::from_millis(1500)),
        ScriptedReply::default(),
        question(),
        ScriptedReply::hang(true),
    ]
}

/// A reply asking the client a question: the task waits for its answer (across the restart).
fn question() -> ScriptedReply {
    ScriptedReply::a2a(json!({"state": "input-required", "text": "Which city?"}))
}

/// The model replies the JS client script expects, in order, before the restart.
fn js_script() -> Vec<ScriptedReply> {
    vec![
        ScriptedReply::default(),
        ScriptedReply::text("Streamed answer")
            .chunked(4)
            .delayed(Duration::from_millis(300)),
        ScriptedReply::hang(true),
        ScriptedReply::text("Slow answer").delayed(Duration::from_millis(1500)),
        question(),
        ScriptedReply::hang(true),
    ]
}

const A2A_TOKEN: &str = "a2a-token";
const OTHER_TOKEN: &str = "other-token";

/// `troupe serve` (the real binary) with the scripted model, its store in a data directory
/// of its own, and two tokens: one bound to the A2A project, one to another project.
struct Server {
    child: Child,
    base: String,
    dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Self {
        Self::start_with(&script())
    }

    fn start_with(replies: &[ScriptedReply]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (child, base) = Self::spawn(dir.path(), replies);
        Self { child, base, dir }
    }

    fn spawn(dir: &Path, replies: &[ScriptedReply]) -> (Child, String) {
        let script_path = dir.join("script.json");
        std::fs::write(&script_path, json!({ "replies": replies }).to_string()).unwrap();
        let mut command = Command::new(troupe_bin());
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--script")
            .arg(&script_path)
            .current_dir(dir)
            .env(
                "TROUPE_API_TOKENS",
                format!("{A2A_TOKEN}=a2a;{OTHER_TOKEN}=elsewhere"),
            )
            .env_remove("TROUPE_A2A")
            .env_remove("TROUPE_A2A_PROJECT")
            .env_remove("TROUPE_A2A_IDLE_CLOSE")
            .stderr(Stdio::null());
        troupe_tests::spawn_serve(&mut command)
    }

    /// SIGKILL, then the same binary over the same data directory, its model answering
    /// by rule: the new base URL.
    fn kill_and_restart(&mut self) -> String {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap()),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        self.child.wait().unwrap();
        let (child, base) = Self::spawn(self.dir.path(), &[]);
        self.child = child;
        self.base = base.clone();
        base
    }

    /// SIGTERM, then the exit status (the service shuts down gracefully: exit 0).
    fn stop(mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "serve did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "serve exited with {status}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn get(base: &str, path: &str, token: &str) -> (StatusCode, Value) {
    let r = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Every A2A message went through the store: the project's current session holds the
/// user message and the reply of the first task.
async fn assert_stored(base: &str) {
    let (status, current) = get(base, "/api/projects/a2a/current-session", A2A_TOKEN).await;
    assert_eq!(status, StatusCode::OK, "{current}");
    let session = current["session"]["session_id"]
        .as_str()
        .or_else(|| current["session_id"].as_str())
        .unwrap_or_else(|| panic!("no session id in {current}"))
        .to_owned();
    let (status, page) = get(
        base,
        &format!("/api/sessions/{session}/messages?limit=100"),
        A2A_TOKEN,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let texts: Vec<String> = page["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("no messages in {page}"))
        .iter()
        .map(|m| format!("{}: {}", m["role"].as_str().unwrap_or("?"), m["content"]))
        .collect();
    let has = |want: &str| texts.iter().any(|t| t.contains(want));
    assert!(has("hello") && has("You said: hello"), "{texts:?}");
    assert!(has("Streamed answer") && has("no header"), "{texts:?}");
}

/// Runs a client script against `server`: when it prints `RESTART`, the server is killed
/// with SIGKILL and started again, and the script reads the new base URL on its stdin. Its
/// output goes into the failure message.
async fn run_client(mut command: tokio::process::Command, server: &mut Server) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the client starts");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = child.stderr.take().unwrap();
    let mut stdout = String::new();
    let mut restarted = false;
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            println!("{line}");
            stdout.push_str(&line);
            stdout.push('\n');
            if line.trim() == "RESTART" {
                let base = server.kill_and_restart();
                restarted = true;
                stdin
                    .write_all(format!("{base}\n").as_bytes())
                    .await
                    .unwrap();
                stdin.flush().await.unwrap();
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(180), read)
        .await
        .expect("the client script finishes");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the client exits")
        .unwrap();
    let mut err = String::new();
    let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut err).await;
    assert!(
        status.success() && restarted && stdout.contains("all checks passed"),
        "client script failed ({status}, restarted: {restarted})\n--- stdout\n{stdout}\n--- stderr\n{err}"
    );
}

fn python_client(base: &str, version: &str) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(python());
    c.arg(root().join("tests/a2a/client_e2e.py"))
        .arg(base)
        .arg(version)
        .arg(A2A_TOKEN);
    c
}

fn js_client(base: &str, version: &str) -> tokio::process::Command {
    let mut c = tokio::process::Command::new("node");
    c.arg(root().join("tests/a2a/client_e2e.mjs"))
        .arg(base)
        .arg(version)
        .arg(A2A_TOKEN)
        .env("A2A_JS_SDK", js_sdk());
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_over_a2a_1_0() {
    let mut server = Server::start();
    let command = python_client(&server.base, "1.0");
    run_client(command, &mut server).await;
    assert_stored(&server.base).await;
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_over_a2a_0_3() {
    let mut server = Server::start();
    let command = python_client(&server.base, "0.3");
    run_client(command, &mut server).await;
    assert_stored(&server.base).await;
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sdk_client_over_a2a_1_0() {
    let mut server = Server::start_with(&js_script());
    let command = js_client(&server.base, "1.0");
    run_client(command, &mut server).await;
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sdk_client_over_a2a_0_3() {
    let mut server = Server::start_with(&js_script());
    let command = js_client(&server.base, "0.3");
    run_client(command, &mut server).await;
    server.stop();
}

/// The card is public and names the bearer scheme; `POST /a2a` needs a token (401) bound to
/// the A2A project (403 for another project's token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2a_endpoint_needs_a_token_of_its_project() {
    let server = Server::start();
    let http = reqwest::Client::new();
    let card = http
        .get(format!("{}/.well-known/agent-card.json", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(card.status(), StatusCode::OK);
    let card: Value = card.json().await.unwrap();
    assert!(card["securitySchemes"]["bearer"].is_object(), "{card}");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "x"}});
    let post = |token: Option<&'static str>| {
        let mut r = http.post(format!("{}/a2a", server.base)).json(&body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        async move { r.send().await.unwrap() }
    };
    assert_eq!(post(None).await.status(), StatusCode::UNAUTHORIZED);
    let other = post(Some(OTHER_TOKEN)).await;
    assert_eq!(other.status(), StatusCode::FORBIDDEN);
    let other: Value = other.json().await.unwrap();
    assert_eq!(other["code"], "forbidden", "{other}");
    let mine: Value = post(Some(A2A_TOKEN)).await.json().await.unwrap();
    assert_eq!(mine["error"]["code"], -32001, "TaskNotFound: {mine}");
    server.stop();
}

/// The card validates against the official A2A 1.0 `AgentCard` (the protobuf types the
/// official SDK generates from the specification's `a2a.proto`, parsed strictly: an unknown
/// field, such as a 0.3-only one, is an error, as under the 1.0 JSON schema's
/// `additionalProperties: false`); the 0.3 card validates against the SDK's 0.3 types.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_card_validates_against_the_official_1_0_agent_card() {
    let server = Server::start();
    let http = reqwest::Client::new();
    let fetch = |path: &'static str| {
        let r = http.get(format!("{}{path}", server.base));
        async move { r.send().await.unwrap().text().await.unwrap() }
    };
    let v1 = fetch("/.well-known/agent-card.json").await;
    let v03 = fetch("/.well-known/agent.json").await;
    // The extended card, for a caller with the token: the tools the agent can use.
    let extended: Value = http
        .post(format!("{}/a2a", server.base))
        .bearer_auth(A2A_TOKEN)
        .header("A2A-Version", "1.0")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "GetExtendedAgentCard", "params": {}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let extended = extended["result"].to_string();
    assert!(extended.contains("tool-shell"), "{extended}");
    let old: Value = http
        .post(format!("{}/a2a", server.base))
        .bearer_auth(A2A_TOKEN)
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "agent/getAuthenticatedExtendedCard"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(old["result"]["url"].is_string(), "{old}");
    assert!(old["result"].to_string().contains("tool-shell"), "{old}");
    const CHECK: &str = r#"
import json, sys
from google.protobuf.json_format import ParseDict
from a2a.types.a2a_pb2 import AgentCard
from a2a.compat.v0_3.types import AgentCard as AgentCardV03
v1, v03, ext = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
card = ParseDict(v1, AgentCard(), ignore_unknown_fields=False)
assert card.capabilities.extended_agent_card, card
extended = ParseDict(ext, AgentCard(), ignore_unknown_fields=False)
assert any(s.id == "tool-shell" for s in extended.skills), extended
assert card.supported_interfaces[0].protocol_version == "1.0", card
assert "bearer" in card.security_schemes, card
old = AgentCardV03.model_validate(v03)
assert old.url == v1["supportedInterfaces"][0]["url"], old
try:
    ParseDict(v03, AgentCard(), ignore_unknown_fields=False)
    raise SystemExit("the 0.3 card must not pass as 1.0")
except Exception as e:
    assert "has no field named" in str(e), e
print("card ok")
"#;
    let out = tokio::process::Command::new(python())
        .arg("-c")
        .arg(CHECK)
        .arg(&v1)
        .arg(&v03)
        .arg(&extended)
        .output()
        .await
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("card ok"),
        "{stdout}\n{stderr}\n--- 1.0 card\n{v1}\n--- 0.3 card\n{v03}"
    );
    server.stop();
}

/// Each A2A context's conversation is opened as `[server.a2a]` (else `[chat]`) says: with
/// `apply_patch`, so a patch the model applies is the task's file, and under the configured
/// storage policy, so a `headers_only` deployment keeps no task text in `troupe.db` (the
/// contexts' conversations were opened with the defaults: no `apply_patch`, policy `full`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2a_conversations_follow_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("troupe.toml"),
        "[chat]\napproval_policy = \"never\"\nsandbox_policy = \"workspace-write\"\n\
         [server.a2a]\nstorage_policy = \"headers_only\"\n",
    )
    .unwrap();
    let replies = [
        ScriptedReply::tool(
            "apply_patch",
            json!({"input": "*** Begin Patch\n*** Add File: made.txt\n+secret words\n*** End Patch"}),
        ),
        ScriptedReply::text("patched the secret"),
    ];
    let (child, base) = Server::spawn(dir.path(), &replies);
    let server = Server { child, base, dir };
    let sent: Value = reqwest::Client::new()
        .post(format!("{}/a2a", server.base))
        .bearer_auth(A2A_TOKEN)
        .header("A2A-Version", "1.0")
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
                "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "make it"}]}
            }}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task = &sent["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    assert!(
        task["artifacts"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["name"] == "patch")),
        "{sent}"
    );
    assert_eq!(
        std::fs::read_to_string(server.dir.path().join("made.txt")).unwrap(),
        "secret words\n"
    );
    let db = rusqlite::Connection::open(server.dir.path().join("data/troupe.db")).unwrap();
    let bodies: Vec<String> = db
        .prepare("SELECT body FROM a2a_tasks")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(bodies.len(), 1);
    assert!(
        !bodies[0].contains("secret") && !bodies[0].contains("make it"),
        "{}",
        bodies[0]
    );
    server.stop();
}
