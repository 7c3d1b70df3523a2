//! `troupe serve` restarted over a data directory that holds many sessions: time from the
//! process's start to its address on stdout, to `/readyz` answering 200, and to the reply of
//! a first message sent to an old session (which activates it). Prints a table.
//!
//!     cargo build --release -p troupe && cargo bench -p troupe-tests --bench serve_start
//!
//! Each stored session has its root conversation and one exchange (a completed user message
//! and its reply); none has unfinished messages, so none is started before it is used.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use futures::StreamExt;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_proto::store::{
    ConversationRecord, ConversationState, FinishMessage, MessageStatus, NewMessage, SessionRecord,
};
use troupe_proto::{ConversationId, Json, OpenConversation, Role, SessionId, TaskId};
use troupe_store::{SqliteStore, Store};

const SIZES: [usize; 3] = [1_000, 10_000, 100_000];
const RUNS: usize = 3;

fn binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("troupe");
    assert!(
        bin.exists(),
        "build it first: cargo build --release -p troupe"
    );
    bin
}

/// Stores `n` sessions with one exchange each; returns one of them.
async fn populate(dir: &Path, n: usize) -> SessionId {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in(dir).unwrap());
    let ids: Vec<SessionId> = futures::stream::iter(0..n)
        .map(|i| {
            let store = store.clone();
            async move {
                let s = SessionRecord {
                    session_id: SessionId::new(),
                    project_id: Some(format!("p{}", i % 10)),
                    title: Some(format!("session {i}")),
                    created_ms: i as u64,
                    root_conversation_id: ConversationId::new(),
                    settings: Json(json!({})),
                    status: troupe_proto::store::SessionStatus::Active,
                    updated_ms: 0,
                };
                store.create_session(s.clone()).await.unwrap();
                store
                    .put_conversation(ConversationRecord {
                        conversation_id: s.root_conversation_id,
                        session_id: s.session_id,
                        params: OpenConversation::default(),
                        is_root: true,
                        state: ConversationState::Open,
                        created_ms: i as u64,
                        closed_ms: None,
                    })
                    .await
                    .unwrap();
                let message = |role, status| NewMessage {
                    session_id: s.session_id,
                    conversation_id: s.root_conversation_id,
                    task_id: None,
                    role,
                    content: Some("hello".into()),
                    chars: 5,
                    created_ms: i as u64,
                    status,
                    kind: troupe_proto::store::MessageKind::Text,
                    metadata: None,
                };
                let user = store
                    .append_message(message(Role::User, Some(MessageStatus::Running)))
                    .await
                    .unwrap();
                let task = TaskId::new();
                store
                    .finish_message(FinishMessage {
                        message_id: user.message_id,
                        status: MessageStatus::Completed,
                        task_id: Some(task),
                        items: Vec::new(),
                        session_status: None,
                        reply: Some(NewMessage {
                            task_id: Some(task),
                            ..message(Role::Assistant, None)
                        }),
                    })
                    .await
                    .unwrap();
                s.session_id
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    ids[ids.len() / 2]
}

struct Timing {
    listening: Duration,
    ready: Duration,
    first_reply: Duration,
    rss_kib: u64,
}

async fn start_once(dir: &Path, old: SessionId) -> Timing {
    let t0 = Instant::now();
    let mut command = Command::new(binary());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env_remove("TROUPE_API_TOKENS")
        .stderr(Stdio::null());
    let (mut child, base) = troupe_tests::spawn_serve(&mut command);
    let listening = t0.elapsed();
    let http = reqwest::Client::new();
    loop {
        if let Ok(r) = http.get(format!("{base}/readyz")).send().await
            && r.status().is_success()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ready = t0.elapsed();
    let r = http
        .post(format!("{base}/api/sessions/{old}/messages"))
        .json(&json!({"text": "are you there"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let first_reply = t0.elapsed();
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap();
    Timing {
        listening,
        ready,
        first_reply,
        rss_kib,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

#[tokio::main]
async fn main() {
    println!(
        "| stored sessions | to address p50 | to /readyz p50 | to a first reply (activation) p50 | RSS after | populate |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for n in SIZES {
        let dir = tempfile::tempdir().unwrap();
        let t = Instant::now();
        let old = populate(dir.path(), n).await;
        let populate_time = t.elapsed();
        let mut runs = Vec::new();
        for _ in 0..RUNS {
            runs.push(start_once(dir.path(), old).await);
        }
        let median = |f: &dyn Fn(&Timing) -> Duration| {
            let mut v: Vec<Duration> = runs.iter().map(f).collect();
            v.sort();
            v[v.len() / 2]
        };
        let mut rss: Vec<u64> = runs.iter().map(|r| r.rss_kib).collect();
        rss.sort_unstable();
        println!(
            "| {n} | {} ms | {} ms | {} ms | {:.1} MiB | {:.1} s |",
            ms(median(&|r| r.listening)),
            ms(median(&|r| r.ready)),
            ms(median(&|r| r.first_reply)),
            rss[rss.len() / 2] as f64 / 1024.0,
            populate_time.as_secs_f64()
        );
    }
}
