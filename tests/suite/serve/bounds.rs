//! What one client can make the service hold is bounded: batch length, the size of one
//! answer, and the frames a WebSocket client leaves unread; close codes say why a WebSocket
//! ended; ids come back exactly as sent.

use super::{Api, Server};
use futures::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use troupe_service::rpc::{MAX_ANSWER_BYTES, MAX_BATCH_CALLS};

/// A session whose history holds `turns` exchanges of about `size` bytes each way.
async fn big_history(api: &Api, turns: usize, size: usize) -> String {
    let s = api.session(None).await;
    let sid = s["session_id"].as_str().unwrap().to_owned();
    for i in 0..turns {
        let text = format!("{i}{}", "x".repeat(size));
        let v = api.say(&sid, &text).await;
        assert_eq!(v["message"]["status"], "completed", "{v}");
    }
    sid
}

fn list_call(id: usize, sid: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "messages.list",
           "params": {"session_id": sid, "limit": 1000}})
}

#[tokio::test]
async fn a_batch_is_bounded_in_calls_and_its_answer_in_bytes() {
    let server = Server::start().await;
    let api = server.api();

    let over: Vec<Value> = (0..=MAX_BATCH_CALLS)
        .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "session.list"}))
        .collect();
    let (status, v) = api.post("/rpc", json!(over)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["error"]["code"], -32600, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("at most"));

    let sid = big_history(&api, 4, 700_000).await;
    let batch: Vec<Value> = (0..MAX_BATCH_CALLS).map(|i| list_call(i, &sid)).collect();
    let response = api
        .request(reqwest::Method::POST, "/rpc")
        .json(&batch)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.bytes().await.unwrap();
    assert!(
        body.len() <= MAX_ANSWER_BYTES,
        "{} bytes answered, the budget is {MAX_ANSWER_BYTES}",
        body.len()
    );
    let answers: Vec<Value> = serde_json::from_slice(&body).unwrap();
    assert_eq!(answers.len(), MAX_BATCH_CALLS, "every call is answered");
    let mut ids: Vec<u64> = answers.iter().map(|a| a["id"].as_u64().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..MAX_BATCH_CALLS as u64).collect::<Vec<_>>());
    let ok = answers.iter().filter(|a| a.get("result").is_some()).count();
    let too_large = answers
        .iter()
        .filter(|a| a["error"]["code"] == -32013)
        .count();
    assert!(ok >= 1, "what fits is answered");
    assert_eq!(ok + too_large, MAX_BATCH_CALLS, "the rest is -32013");
    // In the batch's order: results up to the budget, then only -32013.
    let first_over = answers
        .iter()
        .position(|a| a["error"]["code"] == -32013)
        .unwrap();
    assert!(
        answers[first_over..]
            .iter()
            .all(|a| a["error"]["code"] == -32013),
        "a member after the budget was passed came back with its result"
    );
    server.stop().await;
}

#[tokio::test]
async fn ids_come_back_exactly_as_sent() {
    let server = Server::start().await;
    let raw = r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"session.list"}"#;
    let response = server
        .api()
        .request(reqwest::Method::POST, "/rpc")
        .header("content-type", "application/json")
        .body(raw)
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    assert!(
        text.contains(r#""id":123456789012345678901234567890"#),
        "{text}"
    );
    server.stop().await;
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws(server: &Server) -> Ws {
    let url = format!("{}/rpc/ws", server.base.replace("http://", "ws://"));
    tokio_tungstenite::connect_async(url).await.unwrap().0
}

/// Reads until the server closes; the close frame's code, if one came.
async fn close_code(ws: &mut Ws) -> Option<CloseCode> {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("the server closes");
        match frame {
            Some(Ok(Message::Close(Some(CloseFrame { code, .. })))) => return Some(code),
            Some(Ok(Message::Close(None))) | None | Some(Err(_)) => return None,
            Some(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn a_websocket_frame_over_the_limit_or_not_utf8_closes_with_its_code() {
    let server = Server::start_with(|c| c.server.body_limit = 64 * 1024, Vec::new()).await;

    let mut socket = ws(&server).await;
    socket
        .send(Message::text("x".repeat(65 * 1024)))
        .await
        .unwrap();
    assert_eq!(close_code(&mut socket).await, Some(CloseCode::Size));

    let mut socket = ws(&server).await;
    let bad = tokio_tungstenite::tungstenite::protocol::frame::Frame::message(
        vec![b'{', 0xff, 0xfe, b'}'],
        tokio_tungstenite::tungstenite::protocol::frame::coding::OpCode::Data(
            tokio_tungstenite::tungstenite::protocol::frame::coding::Data::Text,
        ),
        true,
    );
    socket.send(Message::Frame(bad)).await.unwrap();
    assert_eq!(close_code(&mut socket).await, Some(CloseCode::Invalid));

    let mut socket = ws(&server).await;
    socket.close(None).await.unwrap();
    assert!(matches!(
        close_code(&mut socket).await,
        Some(CloseCode::Normal) | None
    ));
    server.stop().await;
}

#[tokio::test]
async fn a_websocket_client_that_does_not_read_is_disconnected() {
    let server = Server::start().await;
    let api = server.api();
    let sid = big_history(&api, 4, 700_000).await;
    // 60 answers of about 5.6 MB each: ten times what the connection may hold unread.
    let calls = 60;
    let mut socket = ws(&server).await;
    for i in 0..calls {
        socket
            .send(Message::text(list_call(i, &sid).to_string()))
            .await
            .unwrap();
    }
    // Not reading; the service drops the connection once its outbox is full. Writing pings
    // finds out when (the peer's reset fails a write), bounded in time.
    let dropped = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if socket.send(Message::Ping(Vec::new().into())).await.is_err() {
                return;
            }
        }
    })
    .await;
    assert!(dropped.is_ok(), "the service dropped the connection");
    let mut answers = 0;
    while let Ok(Some(Ok(frame))) =
        tokio::time::timeout(Duration::from_secs(5), socket.next()).await
    {
        if frame.is_text() {
            answers += 1;
        }
    }
    assert!(
        answers < calls,
        "{answers} of {calls} answers reached the client"
    );
    // The service goes on serving others.
    let (status, _) = api.get(&format!("/api/sessions/{sid}")).await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}
