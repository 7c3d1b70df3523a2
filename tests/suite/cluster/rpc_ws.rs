//! JSON-RPC over a WebSocket opened on a node that does not own the session: each frame's
//! calls go to their session's owner and its answers come back on the socket; a subscription
//! stays on the socket's node.

use super::forwarding::{forwarded_ok, metrics};
use super::{create_here, kill9, node};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A JSON-RPC WebSocket opened on the node at `base`.
async fn rpc_socket(base: &str) -> Socket {
    let ws = format!(
        "{}/rpc/ws",
        base.trim_end_matches('/').replace("http://", "ws://")
    );
    let (socket, _) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::connect_async(ws),
    )
    .await
    .unwrap()
    .unwrap();
    socket
}

/// The next text frame on `socket`, parsed, within `within`.
async fn next_answer(socket: &mut Socket, within: Duration) -> Value {
    let read = async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Text(t))) => return serde_json::from_str(t.as_str()).unwrap(),
                Some(Ok(_)) => continue,
                other => panic!("socket ended: {other:?}"),
            }
        }
    };
    tokio::time::timeout(within, read)
        .await
        .expect("an answer on the socket")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_a_json_rpc_websocket_go_to_their_sessions_owner() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let (mut a, base_a) = node(dir.path(), &url, "a", 10);
    let (mut b, base_b) = node(dir.path(), &url, "b", 10);
    let (_, s) = create_here(&base_a).await;
    let on_a = s["session_id"].as_str().unwrap().to_owned();
    let (_, s) = create_here(&base_b).await;
    let on_b = s["session_id"].as_str().unwrap().to_owned();
    let forwarded = forwarded_ok(&metrics(&base_b).await);

    let mut socket = rpc_socket(&base_b).await;
    let mut ask = async |frame: Value| -> Value {
        socket.send(Message::text(frame.to_string())).await.unwrap();
        next_answer(&mut socket, Duration::from_secs(20)).await
    };

    // A's session through B's socket: A's model answers.
    let answer = ask(
        json!({"jsonrpc": "2.0", "id": 1, "method": "conversation.message",
                            "params": {"session_id": on_a, "text": "over b's socket"}}),
    )
    .await;
    assert_eq!(answer["id"], 1, "{answer}");
    assert!(answer["result"].to_string().contains("a reply"), "{answer}");
    assert_eq!(forwarded_ok(&metrics(&base_b).await), forwarded + 1.0);

    // B's own session on the same socket: answered by B.
    let answer = ask(
        json!({"jsonrpc": "2.0", "id": 2, "method": "conversation.message",
                            "params": {"session_id": on_b, "text": "b's own"}}),
    )
    .await;
    assert!(answer["result"].to_string().contains("b reply"), "{answer}");

    // A batch for A's session only: sent whole to A.
    let answer = ask(json!([
        {"jsonrpc": "2.0", "id": 3, "method": "conversation.message",
         "params": {"session_id": on_a, "text": "batched"}},
        {"jsonrpc": "2.0", "id": 4, "method": "messages.list",
         "params": {"session_id": on_a}}
    ]))
    .await;
    let answers = answer.as_array().unwrap_or_else(|| panic!("{answer}"));
    assert_eq!(answers.len(), 2, "{answer}");
    assert!(answer.to_string().contains("a reply"), "{answer}");
    assert_eq!(forwarded_ok(&metrics(&base_b).await), forwarded + 2.0);

    // A batch naming both nodes' sessions: each call refused naming the owners.
    let answer = ask(json!([
        {"jsonrpc": "2.0", "id": 5, "method": "messages.list", "params": {"session_id": on_a}},
        {"jsonrpc": "2.0", "id": 6, "method": "messages.list", "params": {"session_id": on_b}}
    ]))
    .await;
    let text = answer.to_string();
    assert!(
        text.contains("-32600") && text.contains("on node a"),
        "{text}"
    );

    kill9(&mut a);
    kill9(&mut b);
}

/// A frame the owner took but never answered (it was killed mid-call) gets an error for its
/// call saying the outcome is unknown, on the same socket, which stays open for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_owner_dies_mid_call_is_answered_outcome_unknown() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    // A's model takes its time: the call is still running on A when A dies.
    let (mut a, base_a) = node(dir.path(), &url, "a", 30_000);
    let (mut b, base_b) = node(dir.path(), &url, "b", 10);
    let (_, s) = create_here(&base_a).await;
    let on_a = s["session_id"].as_str().unwrap().to_owned();
    let (_, s) = create_here(&base_b).await;
    let on_b = s["session_id"].as_str().unwrap().to_owned();

    let mut socket = rpc_socket(&base_b).await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "conversation.message",
                      "params": {"session_id": on_a, "text": "slow on a"}});
    socket.send(Message::text(call.to_string())).await.unwrap();
    // The call is running on A: its message is stored there.
    super::until(&base_a, &on_a, Duration::from_secs(10), |m| {
        m.iter().any(|m| m["status"] == "running")
    })
    .await;
    kill9(&mut a);
    let answer = next_answer(&mut socket, Duration::from_secs(30)).await;
    assert_eq!(answer["id"], 7, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("forward_outcome_unknown") && message.contains("node a"),
        "{answer}"
    );

    // The socket goes on: B's own session answers on it.
    let call = json!({"jsonrpc": "2.0", "id": 8, "method": "conversation.message",
                      "params": {"session_id": on_b, "text": "still here"}});
    socket.send(Message::text(call.to_string())).await.unwrap();
    let answer = next_answer(&mut socket, Duration::from_secs(20)).await;
    assert!(answer["result"].to_string().contains("b reply"), "{answer}");
    kill9(&mut b);
}
