//! Lease renewals have connections of their own: two live nodes whose store pools (one
//! connection each) are saturated by load keep every lease with a short ttl. No session
//! moves between them (no takeover, no lost renewal).

use super::forwarding::metrics;
use super::{create_here, http, kill9, node_with_ttl};
use reqwest::StatusCode;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

fn value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_nodes_keep_their_sessions_under_load_with_a_short_ttl() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    // Every node reads ./troupe.toml: a store pool of one connection, easily saturated.
    std::fs::write(
        dir.path().join("troupe.toml"),
        "[store]\npostgres_pool_size = 1\n",
    )
    .unwrap();
    let ttl = "300ms";
    let (mut a, base_a) = node_with_ttl(dir.path(), &url, "a", 5, ttl);
    let (mut b, base_b) = node_with_ttl(dir.path(), &url, "b", 5, ttl);
    let mut sessions = Vec::new();
    for i in 0..80 {
        let base = if i % 2 == 0 { &base_a } else { &base_b };
        let (status, s) = create_here(base).await;
        assert_eq!(status, StatusCode::CREATED, "{s}");
        sessions.push((base.clone(), s["session_id"].as_str().unwrap().to_owned()));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for (base, session) in sessions {
        let (stop, calls) = (stop.clone(), calls.clone());
        clients.push(tokio::spawn(async move {
            let client = http();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let _ = client
                    .post(format!("{base}/api/sessions/{session}/messages"))
                    .json(&json!({"text": format!("m{n}"), "wait": false}))
                    .send()
                    .await;
                let _ = client
                    .get(format!("{base}/api/sessions/{session}/messages?limit=50"))
                    .send()
                    .await;
                calls.fetch_add(2, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let calls = calls.load(Ordering::Relaxed);
    assert!(calls >= 160, "every client made a round: {calls} calls");
    for base in [&base_a, &base_b] {
        let m = metrics(base).await;
        assert_eq!(
            value(&m, "troupe_lease_takeovers_total"),
            0.0,
            "no session moved between live nodes ({calls} calls)"
        );
        assert_eq!(
            value(&m, "troupe_lease_renewals_total{outcome=\"lost\"}"),
            0.0,
            "no lease lost"
        );
        assert!(value(&m, "troupe_lease_renewals_total{outcome=\"renewed\"}") > 0.0);
    }
    kill9(&mut a);
    kill9(&mut b);
}
