//! A session's WebSocket event stream opened on another node is relayed from the owner: the
//! client sees the owner's events (its model's reply) through the node it connected to.

use super::forwarding::{forwarded_ok, metrics};
use super::{create_here, kill9, node, post};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_websocket_stream_is_relayed_from_its_owner() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let (mut a, base_a) = node(dir.path(), &url, "a", 10);
    let (mut b, base_b) = node(dir.path(), &url, "b", 10);
    let (_, s) = create_here(&base_a).await;
    let session = s["session_id"].as_str().unwrap().to_owned();
    let (status, said) = post(
        &base_a,
        &format!("/api/sessions/{session}/messages"),
        json!({"text": "hello"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{said}");

    let forwarded = forwarded_ok(&metrics(&base_b).await);
    let ws = format!(
        "{}/api/sessions/{session}/events/ws?after=0",
        base_b.replace("http://", "ws://")
    );
    let (mut stream, _) = tokio_tungstenite::connect_async(ws).await.unwrap();
    let mut seen = Vec::new();
    let read = async {
        while let Some(Ok(frame)) = stream.next().await {
            if let tokio_tungstenite::tungstenite::Message::Text(t) = frame {
                let done = t.as_str().contains("a reply 0");
                seen.push(t.as_str().to_owned());
                if done {
                    return;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .unwrap_or_else(|_| panic!("the owner's reply not seen through b: {seen:#?}"));
    assert_eq!(forwarded_ok(&metrics(&base_b).await), forwarded + 1.0);
    kill9(&mut a);
    kill9(&mut b);
}
