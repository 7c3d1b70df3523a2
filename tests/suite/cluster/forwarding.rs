//! Any node answers: two real `troupe serve` nodes on one real PostgreSQL database. A session
//! created on A is used through B only (REST messages, a JSON-RPC call, the SSE event stream):
//! B forwards each call to A, whose model answers; a session created on B is served through A
//! by B. Every forwarded call is counted on the forwarding node's `/metrics`. New sessions
//! asked of one node are placed by load: six asked of A, three end on each node.

use super::{create_here, http, kill9, messages, node, post};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

/// Reads the session's SSE stream at `base` until an event's data contains `needle`.
async fn events_until(base: &str, session: &str, needle: &str) -> Vec<Value> {
    use eventsource_stream::Eventsource;
    use futures::StreamExt;
    let response = http()
        .get(format!("{base}/api/sessions/{session}/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = response.bytes_stream().eventsource();
    let mut out = Vec::new();
    let read = async {
        while let Some(Ok(e)) = stream.next().await {
            let done = e.data.contains(needle);
            out.push(serde_json::from_str::<Value>(&e.data).unwrap());
            if done {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .unwrap_or_else(|_| panic!("{needle:?} not seen in {out:#?}"));
    out
}

pub(super) fn forwarded_ok(metrics: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with("troupe_cluster_forwarded_calls_total{outcome=\"ok\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no forwarded calls series in {metrics}"))
}

pub(super) async fn metrics(base: &str) -> String {
    http()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_owned_by_one_node_is_used_through_another() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let (mut a, base_a) = node(dir.path(), &url, "a", 10);
    let (mut b, base_b) = node(dir.path(), &url, "b", 10);
    assert_eq!(
        forwarded_ok(&metrics(&base_b).await),
        0.0,
        "at 0 from the start"
    );

    // Placed by load: each new session goes to the node owning the fewest.
    for i in 0..6 {
        let (status, s) = if i % 2 == 0 {
            post(&base_a, "/api/sessions", json!({})).await
        } else {
            let (status, v) = post(
                &base_a,
                "/rpc",
                json!({"jsonrpc": "2.0", "id": i, "method": "session.create", "params": {}}),
            )
            .await;
            (status, v["result"].clone())
        };
        assert!(status.is_success(), "{s}");
        assert!(s["session_id"].is_string(), "{s}");
    }
    let owners = troupe_test_postgres::server()
        .psql_at(
            &url,
            "SELECT owner, count(*) FROM session_leases GROUP BY owner ORDER BY owner",
        )
        .unwrap();
    assert_eq!(owners.trim(), "a|3\nb|3", "placed by load");
    let placed = forwarded_ok(&metrics(&base_a).await);
    assert_eq!(placed, 3.0, "the three that went to b were forwarded");

    let (status, s) = create_here(&base_a).await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let session = s["session_id"].as_str().unwrap().to_owned();

    // REST through B: A's model answers.
    let (status, said) = post(
        &base_b,
        &format!("/api/sessions/{session}/messages"),
        json!({"text": "hello through b"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{said}");
    assert!(said.to_string().contains("a reply"), "{said}");

    // JSON-RPC through B.
    let (status, answer) = post(
        &base_b,
        "/rpc",
        json!({"jsonrpc": "2.0", "id": 7, "method": "conversation.message",
               "params": {"session_id": session, "text": "rpc through b"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["id"], 7, "{answer}");
    assert!(answer["result"].to_string().contains("a reply"), "{answer}");

    // The event stream through B, from the start: both replies, once each, in order.
    let events = events_until(&base_b, &session, "a reply 1").await;
    let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "no duplicate, in order: {seqs:?}"
    );
    let text = serde_json::to_string(&events).unwrap();
    assert!(
        text.contains("a reply 0") && text.contains("a reply 1"),
        "{text}"
    );

    let listed = messages(&base_b, &session).await;
    assert_eq!(
        listed.len(),
        4,
        "two messages and their replies: {listed:#?}"
    );

    // A session created on B belongs to B: through A, B's model answers.
    let (status, s) = create_here(&base_b).await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let on_b = s["session_id"].as_str().unwrap().to_owned();
    let (status, said) = post(
        &base_a,
        &format!("/api/sessions/{on_b}/messages"),
        json!({"text": "hello through a"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{said}");
    assert!(said.to_string().contains("b reply"), "{said}");

    assert!(forwarded_ok(&metrics(&base_b).await) >= 4.0);
    assert!(forwarded_ok(&metrics(&base_a).await) >= placed + 1.0);
    kill9(&mut a);
    kill9(&mut b);
}
