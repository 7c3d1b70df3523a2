//! Throughput of one node and of three on one PostgreSQL database: the same sessions and
//! clients (each waits for its reply, then sends again), spread over the nodes. Prints the
//! completed turns per second of each; asserts that every call was answered.
//!
//! `TROUPE_CLUSTER_SESSIONS` sets how many sessions (30 by default).

use super::{create_here, http, kill9, node};
use reqwest::StatusCode;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const RUN: Duration = Duration::from_secs(4);

/// Turns completed per second by `nodes` nodes (and the calls that failed).
async fn turns_per_second(nodes: usize, sessions: usize) -> (f64, usize) {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let mut children = Vec::new();
    let mut bases = Vec::new();
    for name in ["a", "b", "c"].into_iter().take(nodes) {
        let (child, base) = node(dir.path(), &url, name, 20);
        children.push(child);
        bases.push(base);
    }
    let mut owned = Vec::new();
    for i in 0..sessions {
        let base = bases[i % nodes].clone();
        let (status, s) = create_here(&base).await;
        assert_eq!(status, StatusCode::CREATED, "{s}");
        owned.push((base, s["session_id"].as_str().unwrap().to_owned()));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let started = Instant::now();
    let clients: Vec<_> = owned
        .into_iter()
        .map(|(base, session)| {
            let (stop, done, failed) = (stop.clone(), done.clone(), failed.clone());
            tokio::spawn(async move {
                let client = http();
                while !stop.load(Ordering::Relaxed) {
                    let ok = client
                        .post(format!("{base}/api/sessions/{session}/messages"))
                        .json(&json!({"text": "hi"}))
                        .send()
                        .await
                        .is_ok_and(|r| r.status() == StatusCode::OK);
                    if ok { &done } else { &failed }.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    for mut c in children {
        kill9(&mut c);
    }
    #[allow(clippy::cast_precision_loss)]
    let rate = done.load(Ordering::Relaxed) as f64 / elapsed;
    (rate, failed.load(Ordering::Relaxed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_and_three_nodes_serve_the_same_load() {
    let sessions: usize = std::env::var("TROUPE_CLUSTER_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let (one, failed_one) = turns_per_second(1, sessions).await;
    let (three, failed_three) = turns_per_second(3, sessions).await;
    println!("| sessions | turns/s, 1 node | turns/s, 3 nodes |");
    println!("|---:|---:|---:|");
    println!("| {sessions} | {one:.1} | {three:.1} |");
    assert_eq!((failed_one, failed_three), (0, 0), "every call answered");
    assert!(one > 0.0 && three > 0.0);
}
