//! Realtime (P3, P4): SSE and WebSocket event streams, resume by seq, and JSON-RPC over
//! WebSocket with `events.subscribe` notifications.

use super::{Server, completes, id, seqs};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;
use troupe_runtime::ScriptedReply;

#[tokio::test]
async fn sse_carries_the_seven_types_and_resumes_after_the_last_id() {
    let server = Server::start_with(
        |_| {},
        vec![
            ScriptedReply::tool("shell", json!({"command": ["echo", "x"]})),
            ScriptedReply::text("streamed reply").chunked(4),
        ],
    )
    .await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    // Deny the approval the tool call asks for, from a second client.
    let approver = {
        let api = api.clone();
        let sid = sid.clone();
        tokio::spawn(async move {
            loop {
                let p = api.call("approval.list", json!({"session_id": sid})).await;
                if let Some(first) = p.as_array().and_then(|a| a.first()) {
                    api.call(
                        "approval.respond",
                        json!({"session_id": sid, "approval_id": first["approval_id"], "decision": {"deny": {"reason": "no"}}}),
                    )
                    .await;
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    api.say(&sid, "go").await;
    approver.await.unwrap();
    let all = api.sse(&sid, None, |e| completes(e) == 1).await;
    let types: std::collections::BTreeSet<&str> =
        all.iter().map(|e| e["type"].as_str().unwrap()).collect();
    for t in [
        "status_update",
        "text_delta",
        "tool_call",
        "error",
        "message_complete",
        "approval_requested",
        "approval_resolved",
    ] {
        assert!(types.contains(t), "{t} missing from {types:?}");
    }
    let s = seqs(&all);
    assert!(s.windows(2).all(|w| w[0] < w[1]), "in seq order: {s:?}");
    let deltas: String = all
        .iter()
        .filter(|e| e["type"] == "text_delta")
        .map(|e| e["data"]["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, "streamed reply");

    // Resume from the middle, by header and by query.
    let cut = s[s.len() / 2];
    let rest = api.sse(&sid, Some(cut), |e| completes(e) == 1).await;
    assert_eq!(
        seqs(&rest),
        s.iter().copied().filter(|x| *x > cut).collect::<Vec<_>>()
    );
    server.stop().await;
}

#[tokio::test]
async fn websocket_event_stream_resumes_too() {
    let server = Server::start().await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    api.say(&sid, "one").await;
    let ws_base = api.base.replace("http://", "ws://");
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("{ws_base}/api/sessions/{sid}/events/ws"))
            .await
            .unwrap();
    let mut first = Vec::new();
    while completes(&first) < 1 {
        let Some(Ok(Message::Text(t))) = ws.next().await else {
            panic!("stream ended early")
        };
        first.push(serde_json::from_str::<Value>(t.as_str()).unwrap());
    }
    // Live: a second message arrives on the open stream.
    api.say(&sid, "two").await;
    while completes(&first) < 2 {
        let Some(Ok(Message::Text(t))) = ws.next().await else {
            panic!("stream ended early")
        };
        first.push(serde_json::from_str::<Value>(t.as_str()).unwrap());
    }
    ws.close(None).await.unwrap();
    let last = *seqs(&first).last().unwrap();
    let cut = seqs(&first)[2];
    let (mut ws, _) = tokio_tungstenite::connect_async(format!(
        "{ws_base}/api/sessions/{sid}/events/ws?after={cut}"
    ))
    .await
    .unwrap();
    let mut again = Vec::new();
    while again.last().and_then(|e: &Value| e["seq"].as_u64()) != Some(last) {
        let Some(Ok(Message::Text(t))) = ws.next().await else {
            panic!("stream ended early")
        };
        again.push(serde_json::from_str::<Value>(t.as_str()).unwrap());
    }
    assert_eq!(
        seqs(&again),
        seqs(&first)
            .into_iter()
            .filter(|s| *s > cut)
            .collect::<Vec<_>>()
    );
    server.stop().await;
}

#[tokio::test]
async fn json_rpc_over_websocket_with_notifications() {
    let server = Server::start().await;
    let api = server.api();
    let ws_base = api.base.replace("http://", "ws://");
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{ws_base}/rpc/ws"))
        .await
        .unwrap();
    ws.send(Message::text(
        json!({"jsonrpc": "2.0", "id": 1, "method": "session.create", "params": {}}).to_string(),
    ))
    .await
    .unwrap();
    let mut frames: Vec<Value> = Vec::new();
    let created = next(&mut ws).await;
    let sid = created["result"]["session_id"].clone();
    for v in [
        json!({"jsonrpc": "2.0", "id": 2, "method": "events.subscribe", "params": {"session_id": sid}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "conversation.message", "params": {"session_id": sid, "text": "over ws"}}),
        json!("not a call"),
    ] {
        ws.send(Message::text(v.to_string())).await.unwrap();
    }
    let mut answered = std::collections::BTreeMap::new();
    while answered.len() < 3 || completes(&frames) < 1 {
        let v = next(&mut ws).await;
        if v["method"] == "events.event" {
            frames.push(v["params"]["event"].clone());
        } else {
            answered.insert(v["id"].to_string(), v);
        }
    }
    assert_eq!(answered["2"]["result"]["subscription"], 1);
    assert_eq!(
        answered["3"]["result"]["reply"]["text"],
        "You said: over ws"
    );
    assert_eq!(answered["null"]["error"]["code"], -32600);
    assert!(frames.iter().any(|e| e["type"] == "text_delta"));
    ws.send(Message::text(
        json!({"jsonrpc": "2.0", "id": 4, "method": "events.unsubscribe", "params": {"subscription": 1}})
            .to_string(),
    ))
    .await
    .unwrap();
    loop {
        let v = next(&mut ws).await;
        if v["id"] == 4 {
            assert_eq!(v["result"]["unsubscribed"], true);
            break;
        }
    }
    server.stop().await;
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn next(ws: &mut Ws) -> Value {
    let f = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("a frame")
        .unwrap()
        .unwrap();
    serde_json::from_str(f.to_text().unwrap()).unwrap()
}

/// `GET /api/sessions/{id}/events/head` is the seq of the newest event: a stream opened
/// after it carries only what comes next. An unknown session is 404.
#[tokio::test]
async fn the_event_head_is_where_a_stream_of_what_comes_next_starts() {
    let server = Server::start_with(
        |_| {},
        vec![ScriptedReply::text("one"), ScriptedReply::text("two")],
    )
    .await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    api.say(&sid, "first").await;
    let head = |api: super::Api, sid: String| async move {
        let (status, v) = api.get(&format!("/api/sessions/{sid}/events/head")).await;
        assert_eq!(status, reqwest::StatusCode::OK, "{v}");
        assert_eq!(v["session_id"], json!(sid));
        v["last_seq"].as_u64().unwrap()
    };
    let first = head(api.clone(), sid.clone()).await;
    let seen = api
        .sse(&sid, None, |e| seqs(e).last() >= Some(&first))
        .await;
    assert_eq!(seqs(&seen).last(), Some(&first), "an event's seq");
    api.say(&sid, "second").await;
    let next = api.sse(&sid, Some(first), |e| completes(e) == 1).await;
    assert!(seqs(&next).iter().all(|s| *s > first), "{next:?}");
    assert!(head(api.clone(), sid.clone()).await >= *seqs(&next).last().unwrap());
    let unknown = troupe_proto::SessionId::new();
    let (status, v) = api
        .get(&format!("/api/sessions/{unknown}/events/head"))
        .await;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND, "{v}");
    server.stop().await;
}
