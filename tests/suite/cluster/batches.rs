//! JSON-RPC batches on two nodes: a batch naming only sessions of the other node is forwarded
//! whole (the owner's model answers); one naming sessions of both nodes is refused, every
//! call answered with an error naming each session's owner.

use super::forwarding::{forwarded_ok, metrics};
use super::{create_here, kill9, node, post};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_forwarded_to_its_sessions_node_or_refused_naming_the_owners() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let (mut a, base_a) = node(dir.path(), &url, "a", 10);
    let (mut b, base_b) = node(dir.path(), &url, "b", 10);
    let (_, s) = create_here(&base_a).await;
    let on_a = s["session_id"].as_str().unwrap().to_owned();
    let (_, s) = create_here(&base_b).await;
    let on_b = s["session_id"].as_str().unwrap().to_owned();

    // Only A's session, through B: forwarded whole, A's model answers.
    let forwarded = forwarded_ok(&metrics(&base_b).await);
    let (status, answers) = post(
        &base_b,
        "/rpc",
        json!([
            {"jsonrpc": "2.0", "id": 1, "method": "conversation.message",
             "params": {"session_id": on_a, "text": "batched through b"}},
            {"jsonrpc": "2.0", "id": 2, "method": "session.get", "params": {"session_id": on_a}},
        ]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answers}");
    let answers = answers.as_array().unwrap().clone();
    assert_eq!(answers.len(), 2, "{answers:?}");
    let first = answers.iter().find(|a| a["id"] == 1).unwrap();
    assert!(first["result"].to_string().contains("a reply"), "{first}");
    let second = answers.iter().find(|a| a["id"] == 2).unwrap();
    assert_eq!(second["result"]["session_id"], on_a.as_str(), "{second}");
    assert_eq!(forwarded_ok(&metrics(&base_b).await), forwarded + 1.0);

    // Sessions of both nodes in one batch: refused, naming the owners.
    let (status, answers) = post(
        &base_a,
        "/rpc",
        json!([
            {"jsonrpc": "2.0", "id": 3, "method": "session.get", "params": {"session_id": on_a}},
            {"jsonrpc": "2.0", "id": 4, "method": "session.get", "params": {"session_id": on_b}},
        ]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answers}");
    let answers = answers.as_array().unwrap().clone();
    assert_eq!(answers.len(), 2, "{answers:?}");
    for answer in &answers {
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("session {on_a} on node a")),
            "{message}"
        );
        assert!(
            message.contains(&format!("session {on_b} on node b")),
            "{message}"
        );
        assert_eq!(answer["error"]["data"]["owners"][on_b.as_str()], "b");
    }
    kill9(&mut a);
    kill9(&mut b);
}
