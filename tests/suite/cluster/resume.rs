//! An event stream resumes across a failover with no gap and no duplicate: a client reads a
//! session's SSE stream through node B while A owns the session; A is killed with SIGKILL
//! (the stream breaks); once B has taken the session over, the client resumes through B with
//! `Last-Event-ID`. What it read before and after, put together, is exactly the session's
//! whole stream as B serves it from the start.

use super::{create_here, http, kill9, node, post};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Reads the SSE stream through `base` (after `last`) until `needle` shows up in an event's
/// data, or until the stream ends when `needle` is `None`.
async fn read(base: &str, session: &str, last: Option<u64>, needle: Option<&str>) -> Vec<Value> {
    use eventsource_stream::Eventsource;
    use futures::StreamExt;
    let mut request = reqwest::Client::new().get(format!("{base}/api/sessions/{session}/events"));
    if let Some(last) = last {
        request = request.header("Last-Event-ID", last.to_string());
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = response.bytes_stream().eventsource();
    let mut out = Vec::new();
    let reading = async {
        while let Some(Ok(e)) = stream.next().await {
            let done = needle.is_some_and(|n| e.data.contains(n));
            out.push(serde_json::from_str::<Value>(&e.data).unwrap());
            if done {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), reading).await;
    out
}

fn seqs(events: &[Value]) -> Vec<u64> {
    events.iter().map(|e| e["seq"].as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumed_through_another_node_after_a_failover_has_no_gap_and_no_duplicate() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let (mut a, base_a) = node(dir.path(), &url, "a", 10);
    let (mut b, base_b) = node(dir.path(), &url, "b", 10);
    let (status, s) = create_here(&base_a).await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let session = s["session_id"].as_str().unwrap().to_owned();

    let reader = tokio::spawn({
        let (base, session) = (base_b.clone(), session.clone());
        async move { read(&base, &session, None, None).await }
    });
    for i in 0..3 {
        let (status, said) = post(
            &base_a,
            &format!("/api/sessions/{session}/messages"),
            json!({"text": format!("before {i}")}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{said}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    kill9(&mut a);
    let before = reader.await.unwrap();
    assert!(
        serde_json::to_string(&before)
            .unwrap()
            .contains("a reply 2"),
        "{before:#?}"
    );

    // B takes the session over on the first call once A's lease expired.
    let started = Instant::now();
    loop {
        let r = http()
            .post(format!("{base_b}/api/sessions/{session}/messages"))
            .json(&json!({"text": "after"}))
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            break;
        }
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(started.elapsed() < Duration::from_secs(15));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let last = *seqs(&before).last().unwrap();
    let after = read(&base_b, &session, Some(last), Some("b reply 0")).await;
    let whole = read(&base_b, &session, None, Some("b reply 0")).await;
    let mut joined = seqs(&before);
    joined.extend(seqs(&after));
    assert_eq!(joined, seqs(&whole), "no gap, no duplicate");
    let mut events = before.clone();
    events.extend(after);
    assert_eq!(events, whole);
    kill9(&mut b);
}
