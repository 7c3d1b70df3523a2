//! WebSocket transports: JSON-RPC at `/rpc/ws` (calls, batches and `events.subscribe`
//! notifications, one JSON text frame each), and a plain event stream at
//! `/api/sessions/{id}/events/ws?after=` (one [`StreamEvent`](super::stream::StreamEvent)
//! per text frame).
//!
//! Calls on one connection run concurrently (a waiting `conversation.message` does not block
//! an `approval.respond` behind it); their answers and the notifications go out through one
//! writer task. The connection ends when the client closes it or the service shuts down;
//! its subscriptions end with it.

use crate::auth::Scope;
use crate::error::ApiError;
use crate::extract::{EventsQuery, PathIds, session_id};
use crate::rpc::Notifier;
use crate::state::AppState;
use crate::stream::{StreamEvent, Subscriber};
use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Answers and notifications waiting for the writer; a client that reads nothing blocks its
/// own calls once this is full, nobody else's.
const OUTBOX: usize = 256;

/// `GET /rpc/ws`.
pub async fn rpc(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let limit = app.body_limit;
    upgrade
        .max_message_size(limit)
        .on_upgrade(move |socket| rpc_connection(app, scope, socket))
}

async fn rpc_connection(app: AppState, scope: Scope, socket: WebSocket) {
    let (mut sink, mut incoming) = socket.split();
    let (out, mut outbox) = mpsc::channel::<serde_json::Value>(OUTBOX);
    let closed = app.shutdown.child_token();
    let notifier = Arc::new(Notifier::new(out.clone(), closed.clone(), "rpc_ws"));
    let writer = tokio::spawn(async move {
        while let Some(v) = outbox.recv().await {
            if sink.send(Message::text(v.to_string())).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    loop {
        let frame = tokio::select! {
            () = closed.cancelled() => break,
            f = incoming.next() => f,
        };
        let bytes = match frame {
            Some(Ok(Message::Text(t))) => t.as_str().as_bytes().to_vec(),
            Some(Ok(Message::Binary(b))) => b.to_vec(),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Close(_)) | Err(_)) | None => break,
        };
        let (rpc, scope, notifier, out) = (
            app.rpc.clone(),
            scope.clone(),
            notifier.clone(),
            out.clone(),
        );
        tokio::spawn(async move {
            if let Some(answer) = rpc.handle_frame(&scope, &bytes, Some(&notifier)).await {
                let _ = out.send(answer).await;
            }
        });
    }
    closed.cancel();
    drop(out);
    drop(notifier);
    let _ = writer.await;
}

/// `GET /api/sessions/{id}/events/ws?after=`.
pub async fn events(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    PathIds(id): PathIds<String>,
    q: Result<Query<EventsQuery>, QueryRejection>,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let id = session_id(&id)?;
    let after = q
        .map_err(|e| ApiError::bad_request(e.body_text()))?
        .0
        .after
        .unwrap_or(0);
    let events = app.session_events(scope, id, after).await?;
    let closed = app.shutdown.child_token();
    Ok(upgrade.on_upgrade(move |socket| forward(socket, events, closed)))
}

async fn forward(
    socket: WebSocket,
    events: impl futures::Stream<Item = Result<StreamEvent, troupe_proto::AgentError>> + Send + 'static,
    closed: CancellationToken,
) {
    let _gauge = Subscriber::new("ws");
    let (mut sink, mut incoming) = socket.split();
    let mut events = std::pin::pin!(events);
    loop {
        let text = tokio::select! {
            () = closed.cancelled() => break,
            client = incoming.next() => match client {
                Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                Some(Ok(_)) => continue,
            },
            e = events.next() => match e {
                Some(Ok(e)) => serde_json::to_string(&e).unwrap_or_default(),
                Some(Err(e)) => {
                    let body = ApiError::from(e).body;
                    let text = serde_json::json!({"stream_error": body}).to_string();
                    let _ = sink.send(Message::text(text)).await;
                    break;
                }
                None => break,
            },
        };
        if sink.send(Message::text(text)).await.is_err() {
            break;
        }
    }
    let _ = sink.close().await;
}
