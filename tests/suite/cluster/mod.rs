//! Several troupe nodes over one PostgreSQL database: session leases with fencing tokens, and
//! sessions taken over when their node dies.
//! Run them alone with `cargo nextest run -p troupe-tests -E 'test(/suite::cluster/)'`.

mod a2a;
mod batches;
mod console;
mod edges;
mod failover;
mod fencing;
mod forwarding;
mod load;
mod lookups;
mod renewals;
mod resume;
mod rpc_ws;
mod supervision;
mod throughput;
#[cfg(feature = "cluster")]
mod transport;
mod websocket;

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use troupe_tests::troupe_bin;

pub const LEASE_TTL: &str = "2s";

/// A running `troupe serve` node, killed when dropped: a test that fails part-way leaves no
/// node behind.
pub struct Node(Child);

impl std::ops::Deref for Node {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Node {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `command` (a `troupe serve`): the node and its base URL.
pub fn spawn_node(command: &mut Command) -> (Node, String) {
    let (child, base) = troupe_tests::spawn_serve(command);
    (Node(child), base)
}

/// A node: `troupe serve` as cluster node `name`, its model answering after `delay_ms`.
pub fn node(dir: &Path, url: &str, name: &str, delay_ms: u64) -> (Node, String) {
    node_with_ttl(dir, url, name, delay_ms, LEASE_TTL)
}

/// [`node`] with its lease ttl.
pub fn node_with_ttl(
    dir: &Path,
    url: &str,
    name: &str,
    delay_ms: u64,
    ttl: &str,
) -> (Node, String) {
    let mut command = node_command(dir, url, name, delay_ms, ttl);
    spawn_node(command.stderr(Stdio::null()))
}

/// The command of [`node_with_ttl`], to add to.
pub fn node_command(dir: &Path, url: &str, name: &str, delay_ms: u64, ttl: &str) -> Command {
    let script: Vec<Value> = (0..5_000)
        .map(|i| json!({"delay_ms": delay_ms, "text": format!("{name} reply {i}")}))
        .collect();
    let script_path = dir.join(format!("script-{name}.json"));
    std::fs::write(
        &script_path,
        serde_json::to_vec(&json!({ "replies": script })).unwrap(),
    )
    .unwrap();
    let mut command = Command::new(troupe_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join(format!("data-{name}")))
        .arg("--script")
        .arg(&script_path)
        .args(["--node", name, "--lease-ttl", ttl])
        .current_dir(dir)
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_STORE_BACKEND")
        .env_remove("TROUPE_NODE")
        .env("TROUPE_POSTGRES_URL", url);
    command
}

pub fn kill9(child: &mut Child) {
    signal(child, nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

pub async fn post(base: &str, path: &str, body: Value) -> (StatusCode, Value) {
    let r = http()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The session's messages (user and assistant), oldest first.
pub async fn messages(base: &str, session: &str) -> Vec<Value> {
    let r = http()
        .get(format!("{base}/api/sessions/{session}/messages?limit=1000"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let page: Value = r.json().await.unwrap();
    page["messages"].as_array().unwrap().clone()
}

pub fn status_of(messages: &[Value], id: u64) -> Option<String> {
    messages
        .iter()
        .find(|m| m["message_id"].as_u64() == Some(id))
        .and_then(|m| m["status"].as_str())
        .map(str::to_owned)
}

pub async fn send(base: &str, session: &str, text: &str) -> (StatusCode, Value) {
    post(
        base,
        &format!("/api/sessions/{session}/messages"),
        json!({"text": text, "wait": false}),
    )
    .await
}

/// Polls `check` on the session's messages at `base` until it holds, for at most `within`.
pub async fn until(base: &str, session: &str, within: Duration, check: impl Fn(&[Value]) -> bool) {
    let started = Instant::now();
    loop {
        let m = messages(base, session).await;
        if check(&m) {
            return;
        }
        assert!(
            started.elapsed() < within,
            "not reached within {within:?}: {m:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends a message to this very node: the header a forwarded call carries keeps it from
/// being forwarded again.
pub async fn send_here(base: &str, session: &str, text: &str) -> (StatusCode, Value) {
    let r = http()
        .post(format!("{base}/api/sessions/{session}/messages"))
        .header("x-troupe-forwarded-by", "test")
        .json(&json!({"text": text, "wait": false}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Creates a session on this very node (not placed elsewhere: the header a forwarded call
/// carries).
pub async fn create_here(base: &str) -> (StatusCode, Value) {
    let r = http()
        .post(format!("{base}/api/sessions"))
        .header("x-troupe-forwarded-by", "test")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A new session on the node at `base` with one message running ("runs on a") and one
/// queued behind it ("queued on a"): its id and the two message ids.
pub async fn running_and_queued(base: &str) -> (String, u64, u64) {
    let (status, s) = create_here(base).await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let session = s["session_id"].as_str().unwrap().to_owned();
    let (status, first) = send(base, &session, "runs on a").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    let (status, second) = send(base, &session, "queued on a").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{second}");
    let first = first["message"]["message_id"].as_u64().unwrap();
    let second = second["message"]["message_id"].as_u64().unwrap();
    until(base, &session, Duration::from_secs(10), |m| {
        status_of(m, first).as_deref() == Some("running")
            && status_of(m, second).as_deref() == Some("queued")
    })
    .await;
    (session, first, second)
}

pub fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        signal,
    )
    .unwrap();
}
