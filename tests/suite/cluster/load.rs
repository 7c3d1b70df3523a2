//! Three real nodes on one real PostgreSQL database under load: sessions created on every
//! node, clients posting messages (`"wait": false`) to every session through every node
//! (so most calls are forwarded). Node C is killed with SIGKILL under load. Its sessions are
//! served again by A and B once its leases expire, every acknowledged message (202) reaches
//! an outcome exactly once, and C restarted under its name rejoins (it forwards a call for a
//! session another node owns). Prints the failover time and the forwarding overhead of a read.
//!
//! `TROUPE_CLUSTER_SESSIONS` sets how many sessions (30 by default).

use super::{create_here, http, kill9, node, post};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Every message of a session, oldest first (through `base`).
async fn all_messages(base: &str, session: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut before: Option<u64> = None;
    loop {
        let path = match before {
            Some(b) => format!("{base}/api/sessions/{session}/messages?limit=1000&before={b}"),
            None => format!("{base}/api/sessions/{session}/messages?limit=1000"),
        };
        let page: Value = http().get(path).send().await.unwrap().json().await.unwrap();
        let mut messages = page["messages"].as_array().unwrap().clone();
        messages.extend(out);
        out = messages;
        match page["next_before"].as_u64() {
            Some(b) => before = Some(b),
            None => return out,
        }
    }
}

/// An acknowledged message, and when it was acknowledged.
#[derive(Debug, Clone)]
struct Acked {
    session: usize,
    message_id: u64,
    at: Instant,
}

/// Posts to `session` through `bases` in turn until `stop`; records each 202.
async fn client(
    bases: Vec<String>,
    index: usize,
    session: String,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let base = &bases[(index + n) % bases.len()];
        let sent = client
            .post(format!("{base}/api/sessions/{session}/messages"))
            .json(&json!({"text": format!("#{n}"), "wait": false}))
            .send()
            .await;
        let Ok(response) = sent else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue; // that node is dead: not acknowledged
        };
        match response.status() {
            StatusCode::ACCEPTED => {
                let Ok(v) = response.json::<Value>().await else {
                    continue;
                };
                acked.lock().await.push(Acked {
                    session: index,
                    message_id: v["message"]["message_id"].as_u64().unwrap(),
                    at: Instant::now(),
                });
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            StatusCode::BAD_GATEWAY => {
                // Forwarded to the node killed while it ran: not acknowledged, and said so.
                let body = response.text().await.unwrap_or_default();
                assert!(body.contains("forward_outcome_unknown"), "{body}");
            }
            StatusCode::INTERNAL_SERVER_ERROR => {
                // A refused write of a node that just lost the session: not acknowledged.
                let body = response.text().await.unwrap_or_default();
                assert!(body.contains("lease lost"), "{body}");
            }
            other => panic!("unexpected answer {other}: {:?}", response.text().await),
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// p50 and p99 of `n` reads of the session's last message through `base`.
async fn read_latency(base: &str, session: &str, n: usize) -> (Duration, Duration) {
    let client = http();
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let r = client
            .get(format!("{base}/api/sessions/{session}/messages?limit=1"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.bytes().await.unwrap();
        times.push(started.elapsed());
    }
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.99))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_lose_one_under_load_and_every_acknowledged_message_ends() {
    let sessions: usize = std::env::var("TROUPE_CLUSTER_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let names = ["a", "b", "c"];
    let mut nodes: Vec<_> = names
        .iter()
        .map(|n| node(dir.path(), &url, n, 20))
        .collect();
    let bases: Vec<String> = nodes.iter().map(|(_, b)| b.clone()).collect();

    // Sessions created on every node in turn: each owned by the node that created it.
    let mut ids = Vec::new();
    for i in 0..sessions {
        let (status, s) = create_here(&bases[i % 3]).await;
        assert_eq!(status, StatusCode::CREATED, "{s}");
        ids.push(s["session_id"].as_str().unwrap().to_owned());
    }
    let on_c: HashSet<usize> = (0..sessions).filter(|i| i % 3 == 2).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<Acked>::new()));
    let clients: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            tokio::spawn(client(
                bases.clone(),
                i,
                id.clone(),
                stop.clone(),
                acked.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    kill9(&mut nodes[2].0);
    let killed = Instant::now();
    // Load goes on until every session of C was served again (at most 60 s), and at least
    // past C's lease ttl (2 s) and a scan.
    tokio::time::sleep(Duration::from_secs(5)).await;
    while killed.elapsed() < Duration::from_secs(60) {
        let served: HashSet<usize> = acked
            .lock()
            .await
            .iter()
            .filter(|a| a.at > killed && on_c.contains(&a.session))
            .map(|a| a.session)
            .collect();
        if served.len() == on_c.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let acked = acked.lock().await.clone();

    // C's sessions are served again: each got an acknowledged message after the kill.
    let mut served_again: HashMap<usize, Duration> = HashMap::new();
    for a in acked.iter().filter(|a| a.at > killed) {
        if on_c.contains(&a.session) {
            served_again
                .entry(a.session)
                .or_insert_with(|| a.at - killed);
        }
    }
    assert_eq!(
        served_again.len(),
        on_c.len(),
        "every session of the dead node served again"
    );
    let slowest = served_again.values().max().copied().unwrap_or_default();
    let fastest = served_again.values().min().copied().unwrap_or_default();

    // Every acknowledged message ends, once.
    let started = Instant::now();
    let mut unfinished;
    loop {
        unfinished = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let messages = all_messages(&bases[0], id).await;
            let mut seen = HashSet::new();
            let by_id: HashMap<u64, &Value> = messages
                .iter()
                .filter(|m| m["role"] == "user")
                .map(|m| {
                    let mid = m["message_id"].as_u64().unwrap();
                    assert!(seen.insert(mid), "stored once: {mid}");
                    (mid, m)
                })
                .collect();
            for a in acked.iter().filter(|a| a.session == i) {
                let m = by_id
                    .get(&a.message_id)
                    .unwrap_or_else(|| panic!("acknowledged message {} lost", a.message_id));
                let status = m["status"].as_str().unwrap();
                if !["completed", "failed", "cancelled", "aborted"].contains(&status) {
                    unfinished.push((i, a.message_id, status.to_owned()));
                }
            }
        }
        if unfinished.is_empty() || started.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(unfinished.is_empty(), "unfinished: {unfinished:?}");

    // C comes back and rejoins: it forwards a call for a session another node owns.
    nodes[2] = node(dir.path(), &url, "c", 20);
    let base_c = nodes[2].1.clone();
    let (status, said) = post(
        &base_c,
        &format!("/api/sessions/{}/messages", ids[0]),
        json!({"text": "through c after its restart"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{said}");
    assert_eq!(
        super::forwarding::forwarded_ok(&super::forwarding::metrics(&base_c).await),
        1.0,
        "forwarded by c to the session's owner"
    );

    let (direct_p50, direct_p99) = read_latency(&bases[0], &ids[0], 200).await;
    let (forwarded_p50, forwarded_p99) = read_latency(&bases[1], &ids[0], 200).await;
    eprintln!(
        "| sessions | acknowledged | dead node's sessions | served again after the kill (first / last) | read p50 direct / forwarded | read p99 direct / forwarded |"
    );
    eprintln!(
        "| {sessions} | {} | {} | {fastest:.2?} / {slowest:.2?} | {direct_p50:.2?} / {forwarded_p50:.2?} | {direct_p99:.2?} / {forwarded_p99:.2?} |",
        acked.len(),
        on_c.len()
    );
    for (child, _) in &mut nodes {
        kill9(child);
    }
}
