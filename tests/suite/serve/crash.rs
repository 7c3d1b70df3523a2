//! Accepted work always ends: the real `troupe serve` binary is killed with SIGKILL again and
//! again while clients post messages without waiting (`"wait": false`). After the last
//! restart every message that was acknowledged (202) is stored exactly once and has reached
//! an outcome (completed, failed, cancelled or aborted); none is left queued or running, and
//! none ran twice. The same on each store: SQLite in the data directory, and PostgreSQL
//! (`[store] backend = "postgres"`, a database of its own on the test's server).

use super::Api;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use troupe_tests::troupe_bin;

const KILLS: usize = 10;
const CLIENTS_PER_SESSION: usize = 2;
const SESSIONS: usize = 3;

/// Where the served process keeps its state.
enum Keep {
    /// `<dir>/data`.
    Sqlite,
    /// This PostgreSQL database (its URL).
    Postgres(String),
}

/// `troupe serve` over the data directory (and the database), with a model whose every turn
/// takes a moment, so that messages queue and tasks are in flight when the process dies.
fn serve(dir: &Path, keep: &Keep) -> (Child, String) {
    let script: Vec<Value> = (0..20_000)
        .map(|i| json!({"delay_ms": 5 + (i % 4) * 5, "text": format!("reply {i}")}))
        .collect();
    let script_path = dir.join("script.json");
    if !script_path.exists() {
        std::fs::write(
            &script_path,
            serde_json::to_vec(&json!({ "replies": script })).unwrap(),
        )
        .unwrap();
    }
    let mut command = Command::new(troupe_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--script")
        .arg(&script_path)
        .current_dir(dir)
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_STORE_BACKEND")
        .env_remove("TROUPE_POSTGRES_URL")
        .stderr(Stdio::null());
    if let Keep::Postgres(url) = keep {
        command
            .env("TROUPE_STORE_BACKEND", "postgres")
            .env("TROUPE_POSTGRES_URL", url);
    }
    troupe_tests::spawn_serve(&mut command)
}

fn kill9(child: &mut Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
}

/// One acknowledged message.
#[derive(Debug, Clone)]
struct Acked {
    session: String,
    message_id: u64,
}

/// Posts `wait: false` messages to one conversation until `stop`; records every 202.
async fn client(
    base: String,
    session: String,
    conversation: String,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let sent = http
            .post(format!("{base}/api/sessions/{session}/messages"))
            .json(&json!({"text": format!("{conversation} #{n}"), "conversation_id": conversation, "wait": false}))
            .send()
            .await;
        let Ok(response) = sent else {
            return; // the process died under the request: not acknowledged
        };
        match response.status() {
            StatusCode::ACCEPTED => {
                let Ok(v) = response.json::<Value>().await else {
                    return;
                };
                acked.lock().await.push(Acked {
                    session: session.clone(),
                    message_id: v["message"]["message_id"].as_u64().unwrap(),
                });
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => panic!("unexpected answer {other}"),
        }
    }
}

/// Every message of a session, oldest first.
async fn all_messages(api: &Api, session: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut before: Option<u64> = None;
    loop {
        let path = match before {
            Some(b) => format!("/api/sessions/{session}/messages?limit=1000&before={b}"),
            None => format!("/api/sessions/{session}/messages?limit=1000"),
        };
        let (status, page) = api.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let mut messages = page["messages"].as_array().unwrap().clone();
        messages.extend(out);
        out = messages;
        match page["next_before"].as_u64() {
            Some(b) => before = Some(b),
            None => return out,
        }
    }
}

fn pending(messages: &[Value]) -> usize {
    messages
        .iter()
        .filter(|m| matches!(m["status"].as_str(), Some("queued" | "running")))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_ends_across_repeated_kill_9() {
    acknowledged_messages_end(Keep::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_ends_across_repeated_kill_9_on_postgres() {
    let url = troupe_test_postgres::server().fresh_database();
    acknowledged_messages_end(Keep::Postgres(url)).await;
}

async fn acknowledged_messages_end(keep: Keep) {
    let dir = tempfile::tempdir().unwrap();
    let acked = Arc::new(Mutex::new(Vec::<Acked>::new()));

    // The sessions and their conversations, created once.
    let (mut child, base) = serve(dir.path(), &keep);
    let api = Api::new(&base, None);
    let mut targets = Vec::new();
    for _ in 0..SESSIONS {
        let s = api.session(None).await;
        let sid = s["session_id"].as_str().unwrap().to_owned();
        targets.push((
            sid.clone(),
            s["root_conversation_id"].as_str().unwrap().to_owned(),
        ));
        for _ in 1..CLIENTS_PER_SESSION {
            let c = api
                .call("conversation.open", json!({"session_id": sid}))
                .await;
            targets.push((
                sid.clone(),
                c["conversation_id"].as_str().unwrap().to_owned(),
            ));
        }
    }

    let mut base = base;
    for round in 0..KILLS {
        if round > 0 {
            (child, base) = serve(dir.path(), &keep);
        }
        run_clients(&base, &targets, &acked, round).await;
        kill9(&mut child);
    }

    // The last start settles what the kills left; then nothing is pending any more.
    let (mut child, base) = serve(dir.path(), &keep);
    let api = Api::new(&base, None);
    let t0 = Instant::now();
    let mut by_session: HashMap<String, Vec<Value>> = HashMap::new();
    loop {
        by_session.clear();
        let mut left = 0;
        for (sid, _) in &targets {
            if by_session.contains_key(sid) {
                continue;
            }
            let messages = all_messages(&api, sid).await;
            left += pending(&messages);
            by_session.insert(sid.clone(), messages);
        }
        if left == 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{left} messages still pending"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let acked = acked.lock().await.clone();
    assert!(
        acked.len() > 100,
        "the clients got work in: {}",
        acked.len()
    );
    eprintln!("acknowledged: {}", acked.len());
    let mut users: HashMap<u64, &Value> = HashMap::new();
    let mut assistants: HashMap<u64, &Value> = HashMap::new();
    for messages in by_session.values() {
        for m in messages {
            let id = m["message_id"].as_u64().unwrap();
            if m["type"] != "text" {
                continue; // what a task did on the way, or how a message ended
            }
            let slot = if m["role"] == "user" {
                &mut users
            } else {
                &mut assistants
            };
            assert!(slot.insert(id, m).is_none(), "message {id} listed twice");
        }
    }
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    for a in &acked {
        let m = users
            .get(&a.message_id)
            .unwrap_or_else(|| panic!("acknowledged message {} is missing", a.message_id));
        assert_eq!(m["session_id"].as_str(), Some(a.session.as_str()));
        let status = m["status"].as_str().unwrap();
        assert!(
            matches!(status, "completed" | "failed" | "cancelled" | "aborted"),
            "message {} ended {status}",
            a.message_id
        );
        *outcomes.entry(status.to_owned()).or_default() += 1;
    }
    eprintln!("outcomes: {outcomes:?}");
    // Nothing ran twice: each reply answers one message, and each answered message has one.
    let mut replies = HashSet::new();
    for m in users.values() {
        if let Some(reply) = m["reply_message_id"].as_u64() {
            assert!(replies.insert(reply), "reply {reply} answers two messages");
            let r = assistants
                .get(&reply)
                .unwrap_or_else(|| panic!("reply {reply} is missing"));
            assert_eq!(r["conversation_id"], m["conversation_id"]);
            assert_eq!(r["task_id"], m["task_id"]);
        }
    }
    assert_eq!(
        replies.len(),
        assistants.len(),
        "every stored reply answers exactly one message"
    );
    assert!(
        outcomes.get("aborted").copied().unwrap_or(0) > 0,
        "the kills interrupted running tasks: {outcomes:?}"
    );
    assert!(
        outcomes.get("completed").copied().unwrap_or(0) > 0,
        "{outcomes:?}"
    );
    kill9(&mut child);
    // It was the database that kept them.
    if let Keep::Postgres(url) = &keep {
        let stored: usize = troupe_test_postgres::server()
            .psql_at(url, "SELECT count(*) FROM messages WHERE role = 'user'")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(stored, users.len(), "the messages are in PostgreSQL");
        assert!(!dir.path().join("data").join("troupe.db").exists());
    }
}

/// Runs the clients against `base` for a while (a different while each round).
async fn run_clients(
    base: &str,
    targets: &[(String, String)],
    acked: &Arc<Mutex<Vec<Acked>>>,
    round: usize,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<tokio::task::JoinHandle<()>> = targets
        .iter()
        .map(|(sid, conv)| {
            tokio::spawn(client(
                base.to_owned(),
                sid.clone(),
                conv.clone(),
                stop.clone(),
                acked.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300 + 70 * round as u64)).await;
    // The kill comes while the clients still post; each ends at its first failed request.
    drop(stop);
    drop(clients);
}

/// `troupe serve` with the PostgreSQL store: what it says at start-up. It names where the
/// state is (never the password); without a URL, or with a server that does not answer, it
/// stops at once with the reason.
#[test]
fn serve_on_postgres_says_where_and_refuses_what_cannot_work() {
    let dir = tempfile::tempdir().unwrap();
    let command = |backend: &str, url: Option<&str>| {
        let mut c = Command::new(troupe_bin());
        c.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .current_dir(dir.path())
            .env_remove("TROUPE_API_TOKENS")
            .env_remove("TROUPE_POSTGRES_URL")
            .env("TROUPE_STORE_BACKEND", backend)
            .stdin(Stdio::null());
        if let Some(url) = url {
            c.env("TROUPE_POSTGRES_URL", url);
        }
        c
    };
    let out = command("postgres", None).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("[store] backend = \"postgres\" needs [store] postgres_url"),
        "{err}"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = command(
        "postgres",
        Some(&format!("postgresql://troupe@127.0.0.1:{port}/nothing")),
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("postgres connection"), "{err}");
    let out = command("mysql", None).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("sqlite or postgres"),
        "{err}"
    );

    // The test server trusts every local connection: the password is ignored, and must not
    // be printed.
    let url = troupe_test_postgres::server().fresh_database();
    let with_password = url.replacen("troupe@", "troupe:CANARY-PASSWORD-4471@", 1);
    let mut child = command("postgres", Some(&with_password))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut said = String::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
        let line = line.unwrap();
        if line.contains("store and rollout") {
            said = line;
            break;
        }
    }
    kill9(&mut child);
    let database = url.rsplit('/').next().unwrap();
    let port = troupe_test_postgres::server().port();
    assert!(
        said.contains(&format!(
            "store and rollout: PostgreSQL at troupe@127.0.0.1:{port}/{database}"
        )),
        "{said}"
    );
    assert!(!said.contains("CANARY-PASSWORD"), "{said}");
    assert!(!dir.path().join("data").join("troupe.db").exists());
}
