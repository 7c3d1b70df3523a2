//! What one hostile client can make `troupe serve` hold: each attack runs against a fresh
//! release binary whose one session holds a large history (12 messages of ~900 KB), and the
//! table reports the process's peak RSS during the attack over its RSS before it, and its
//! RSS once the attacker has gone.
//!
//!     cargo build --release -p troupe && cargo bench -p troupe-tests --bench client_memory
//!
//! Attacks: one JSON-RPC batch of 100 `messages.list` calls (`limit` 1000); a WebSocket
//! client that sends 4,000 such calls and never reads; one REST page `limit=1000`; 5,000
//! sessions created in 50 batches. The peak is reset (`/proc/<pid>/clear_refs`) before each.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use futures::SinkExt;
use serde_json::{Value, json};
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

const TURNS: usize = 6;
const TEXT: usize = 900_000;

fn binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("troupe");
    assert!(
        bin.exists(),
        "build it first: cargo build --release -p troupe"
    );
    bin
}

fn serve(dir: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env_remove("TROUPE_API_TOKENS")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    (child, base)
}

/// A field of `/proc/<pid>/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn setup(http: &reqwest::Client, base: &str) -> String {
    let s: Value = http
        .post(format!("{base}/api/sessions"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sid = s["session_id"].as_str().unwrap().to_owned();
    for i in 0..TURNS {
        let text = format!("{i}{}", "x".repeat(TEXT));
        let status = http
            .post(format!("{base}/api/sessions/{sid}/messages"))
            .json(&json!({ "text": text }))
            .send()
            .await
            .unwrap()
            .status();
        assert!(status.is_success());
    }
    sid
}

fn list_call(id: usize, sid: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "messages.list",
           "params": {"session_id": sid, "limit": 1000}})
}

async fn batch(http: &reqwest::Client, base: &str, sid: &str) {
    let calls: Vec<Value> = (0..100).map(|i| list_call(i, sid)).collect();
    let body = http
        .post(format!("{base}/rpc"))
        .json(&calls)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(!body.is_empty());
}

async fn ws_no_read(base: &str, sid: &str) {
    let url = format!("{}/rpc/ws", base.replace("http://", "ws://"));
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    for i in 0..4_000 {
        let sent = tokio::time::timeout(
            Duration::from_secs(2),
            ws.send(Message::text(list_call(i, sid).to_string())),
        )
        .await;
        if !matches!(sent, Ok(Ok(()))) {
            break; // dropped, or the service stopped reading
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(ws);
}

async fn big_page(http: &reqwest::Client, base: &str, sid: &str) {
    let body = http
        .get(format!("{base}/api/sessions/{sid}/messages?limit=1000"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(!body.is_empty());
}

async fn many_sessions(http: &reqwest::Client, base: &str) {
    for _ in 0..50 {
        let calls: Vec<Value> = (0..100)
            .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "session.create", "params": {}}))
            .collect();
        let answers: Vec<Value> = http
            .post(format!("{base}/rpc"))
            .json(&calls)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answers.len(), 100);
    }
}

#[tokio::main]
async fn main() {
    let http = reqwest::Client::new();
    println!(
        "| attack | RSS before | peak during | peak over before | RSS after | threads after |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for attack in [
        "batch of 100 messages.list",
        "WebSocket: 4,000 calls, never reads",
        "GET messages?limit=1000",
        "5,000 sessions in 50 batches",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut child, base) = serve(dir.path());
        let pid = child.id();
        let sid = setup(&http, &base).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
        let before = status_kib(pid, "VmRSS:");
        match attack {
            "batch of 100 messages.list" => batch(&http, &base, &sid).await,
            "WebSocket: 4,000 calls, never reads" => ws_no_read(&base, &sid).await,
            "GET messages?limit=1000" => big_page(&http, &base, &sid).await,
            _ => many_sessions(&http, &base).await,
        }
        let peak = status_kib(pid, "VmHWM:");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = status_kib(pid, "VmRSS:");
        let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count();
        println!(
            "| {attack} | {:.1} MiB | {:.1} MiB | +{:.1} MiB | {:.1} MiB | {threads} |",
            mib(before),
            mib(peak),
            mib(peak.saturating_sub(before)),
            mib(after),
        );
        let _ = child.kill();
        let _ = child.wait();
    }
}
