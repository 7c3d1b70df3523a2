//! Sessions cost no thread: the real `troupe serve` binary holds 10,000 sessions with the
//! threads it has with a handful, give or take its blocking pool (bounded at 64 threads), and after a restart over those 10,000 stored sessions
//! it answers `/healthz` and runs a turn in an old session and in a new one.

use super::Api;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use troupe_tests::troupe_bin;

const SESSIONS: usize = 10_000;
/// `session.create` calls per JSON-RPC batch.
const BATCH: usize = troupe_service::rpc::MAX_BATCH_CALLS;
/// Threads the binary's blocking pool may add under load (its bound).
const BLOCKING_POOL: usize = 64;

fn serve(dir: &Path) -> (Child, String) {
    let mut command = Command::new(troupe_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .current_dir(dir)
        .env_remove("TROUPE_API_TOKENS")
        .stderr(Stdio::null());
    troupe_tests::spawn_serve(&mut command)
}

/// Threads of a process now.
fn threads(child: &Child) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .unwrap()
        .count()
}

fn stop(mut child: Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "a clean stop: {status}");
}

/// Creates `n` sessions with JSON-RPC batches; their ids.
async fn create_sessions(base: &str, n: usize) -> Vec<String> {
    let http = reqwest::Client::new();
    let mut ids = Vec::with_capacity(n);
    while ids.len() < n {
        let batch: Vec<Value> = (0..BATCH.min(n - ids.len()))
            .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "session.create", "params": {}}))
            .collect();
        let answers: Vec<Value> = http
            .post(format!("{base}/rpc"))
            .json(&batch)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for answer in answers {
            let id = answer["result"]["session_id"].as_str();
            ids.push(id.unwrap_or_else(|| panic!("{answer}")).to_owned());
        }
    }
    ids
}

async fn turn(api: &Api, session: &str, text: &str) -> Value {
    let (status, v) = api
        .post(
            &format!("/api/sessions/{session}/messages"),
            json!({ "text": text }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["message"]["status"], "completed", "{v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_sessions_cost_no_thread_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (child, base) = serve(dir.path());
    let api = Api::new(&base, None);

    let first = create_sessions(&base, 20).await;
    turn(&api, &first[0], "warm up").await;
    let few = threads(&child);

    let mut all = first;
    all.extend(create_sessions(&base, SESSIONS - all.len()).await);
    turn(&api, &all[SESSIONS - 1], "the last one").await;
    let many = threads(&child);
    assert!(
        many <= few + BLOCKING_POOL,
        "{few} threads with 20 sessions, {many} with {SESSIONS}: a session costs no thread"
    );
    stop(child);

    let (child, base) = serve(dir.path());
    let api = Api::new(&base, None);
    let (status, health) = api.get("/healthz").await;
    assert_eq!(status, StatusCode::OK, "{health}");
    let old = turn(&api, &all[SESSIONS / 2], "an old session").await;
    assert!(old["reply"]["text"].is_string(), "{old}");
    let new = create_sessions(&base, 1).await;
    turn(&api, &new[0], "a new session").await;
    let listed = api.call("session.list", json!({})).await;
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(SESSIONS + 1),
        "every session is still there"
    );
    let after = threads(&child);
    assert!(
        after <= few + BLOCKING_POOL,
        "{few} threads before, {after} after a restart over {SESSIONS} stored sessions"
    );
    stop(child);
}
