//! WebSocket transports: JSON-RPC at `/rpc/ws` (calls, batches and `events.subscribe`
//! notifications, one JSON text frame each), and a plain event stream at
//! `/api/sessions/{id}/events/ws?after=` (one [`StreamEvent`](super::stream::StreamEvent)
//! per text frame).
//!
//! Calls on one connection run concurrently (a waiting `conversation.message` does not block
//! an `approval.respond` behind it), at most [`MAX_IN_FLIGHT`](crate::rpc::outbox::MAX_IN_FLIGHT) at once: past that the
//! connection reads no frame until a call ends. Answers and notifications go out through one
//! writer task, from an outbox bounded in bytes ([`OUTBOX_BYTES`](crate::rpc::outbox::OUTBOX_BYTES)); a client that leaves it
//! full, or that takes longer than [`SEND_TIMEOUT`] to take one frame, is disconnected. The
//! connection ends when the client closes it or the service shuts down; its subscriptions end
//! with it. At shutdown a `/rpc/ws` connection reads no more frames and ends its
//! subscriptions at once, but answers the calls it already read (their tasks end with the
//! service's grace period) before it closes; the service waits for it
//! (`AppState::connections`).
//!
//! Close codes: 1000 when the client closed, 1001 when the service shuts down, 1007 after a
//! text frame that is not UTF-8, 1008 for a client that does not read (sent for a second at
//! most: such a client may never read it), 1009 after a frame
//! over the body limit, 1002 after any other protocol error.

use crate::auth::Scope;
use crate::error::ApiError;
use crate::extract::{EventsQuery, PathIds, session_id};
use crate::rpc::Notifier;
use crate::rpc::outbox::{InFlight, Outbox, Overflow, Queued};
use crate::state::AppState;
use crate::stream::{StreamEvent, Subscriber};
use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{Query, State};
use axum::response::Response;
use futures::stream::SplitSink;
use futures::{SinkExt, StreamExt};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite;
use tokio_util::sync::CancellationToken;

/// Longest one frame may take to reach a client before it is disconnected.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// `GET /rpc/ws`.
pub async fn rpc(
    State(app): State<AppState>,
    Extension(scope): Extension<Scope>,
    relay: Option<Extension<crate::forward::RpcWsRelay>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let limit = app.body_limit;
    let relay = relay.map(|Extension(r)| r);
    let connections = app.connections.clone();
    upgrade.max_message_size(limit).on_upgrade(move |socket| {
        connections.track_future(rpc_connection(app, scope, relay, socket))
    })
}

async fn rpc_connection(
    app: AppState,
    scope: Scope,
    relay: Option<crate::forward::RpcWsRelay>,
    socket: WebSocket,
) {
    let (sink, mut incoming) = socket.split();
    // The connection's end (the client left, or did not read); a shutdown only stops the
    // reading and the event subscriptions: the calls already read are answered first.
    let closed = CancellationToken::new();
    let subscriptions = app.shutdown.child_token();
    let (outbox, queue) = Outbox::new(Overflow::Disconnect, closed.clone(), "rpc_ws");
    let notifier = Arc::new(Notifier::new(
        outbox.clone(),
        subscriptions.clone(),
        "rpc_ws",
    ));
    let writer = tokio::spawn(write_frames(sink, queue, closed.clone(), "rpc_ws"));
    let in_flight = InFlight::default();
    let mut calls = tokio::task::JoinSet::new();
    let mut code = close_code::NORMAL;
    loop {
        let slot = tokio::select! {
            () = closed.cancelled() => break,
            () = app.shutdown.cancelled() => break,
            slot = in_flight.slot() => slot,
        };
        let Some(slot) = slot else { break };
        let frame = tokio::select! {
            () = closed.cancelled() => break,
            () = app.shutdown.cancelled() => break,
            f = incoming.next() => f,
        };
        let bytes = match frame {
            Some(Ok(Message::Text(t))) => axum::body::Bytes::from(t),
            Some(Ok(Message::Binary(b))) => b,
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Close(_))) | None => break,
            Some(Err(e)) => {
                code = close_code_for(e);
                break;
            }
        };
        let (rpc, scope, notifier, outbox, relay) = (
            app.rpc.clone(),
            scope.clone(),
            notifier.clone(),
            outbox.clone(),
            relay.clone(),
        );
        calls.spawn(async move {
            let _slot = slot;
            // A node of a cluster: calls for another node's session go to that node.
            let forwarded = match &relay {
                Some(relay) => relay.answer(&bytes).await,
                None => None,
            };
            let answer = match forwarded {
                Some(answer) => answer,
                None => rpc.handle_frame(&scope, &bytes, Some(&notifier)).await,
            };
            if let Some(answer) = answer {
                outbox.push(answer).await;
            }
        });
        // Reap finished calls as we go so the set stays small.
        while calls.try_join_next().is_some() {}
    }
    // Shutting down (the client still reading): answer what was read, then close.
    let draining = !closed.is_cancelled() && app.shutdown.is_cancelled();
    if closed.is_cancelled() {
        code = close_code::POLICY;
    } else if draining {
        code = close_code::AWAY;
        // The service's shutdown ends every task (after its grace period): each call read
        // is answered, unless the client stops reading meanwhile.
        tokio::select! {
            () = async { while calls.join_next().await.is_some() {} } => {}
            () = closed.cancelled() => {}
        }
    }
    if !draining {
        // The client left: its calls run on, with no one to answer.
        calls.detach_all();
        closed.cancel();
    }
    subscriptions.cancel();
    drop(notifier);
    drop(outbox);
    // Draining, the writer sends what is queued and ends as the queue closes.
    if let Ok(sink) = writer.await {
        say_goodbye(sink, code).await;
    }
    closed.cancel();
}

/// Writes queued frames until the connection closes; a frame the client takes more than
/// [`SEND_TIMEOUT`] to accept closes it. Hands the sink back for the close frame.
async fn write_frames(
    mut sink: SplitSink<WebSocket, Message>,
    mut queue: mpsc::UnboundedReceiver<Queued>,
    closed: CancellationToken,
    transport: &'static str,
) -> SplitSink<WebSocket, Message> {
    loop {
        let queued = tokio::select! {
            () = closed.cancelled() => break,
            q = queue.recv() => q,
        };
        let Some(queued) = queued else { break };
        let sent = tokio::select! {
            () = closed.cancelled() => break,
            sent = tokio::time::timeout(SEND_TIMEOUT, sink.send(Message::text(queued.text))) => sent,
        };
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                closed.cancel();
                break;
            }
            Err(_) => {
                tracing::info!(
                    transport,
                    "a frame took too long to reach the client: disconnected"
                );
                crate::metrics::stream_client_dropped(transport, "send_timeout");
                closed.cancel();
                break;
            }
        }
    }
    sink
}

/// Sends the close frame (bounded in time: the client may not be reading) and closes.
async fn say_goodbye(mut sink: SplitSink<WebSocket, Message>, code: u16) {
    let frame = Message::Close(Some(CloseFrame {
        code,
        reason: close_reason(code).into(),
    }));
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = sink.send(frame).await;
        let _ = sink.close().await;
    })
    .await;
}

/// The close code for a read error: what the client sent that ended the connection.
fn close_code_for(error: axum::Error) -> u16 {
    let inner = error.into_inner();
    match inner.downcast_ref::<tungstenite::Error>() {
        Some(tungstenite::Error::Capacity(_)) => close_code::SIZE,
        Some(tungstenite::Error::Utf8(_)) => close_code::INVALID,
        Some(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
            close_code::NORMAL
        }
        Some(tungstenite::Error::Io(_)) => close_code::ABNORMAL,
        _ => close_code::PROTOCOL,
    }
}

fn close_reason(code: u16) -> &'static str {
    match code {
        close_code::AWAY => "the service is shutting down",
        close_code::INVALID => "a text frame was not valid UTF-8",
        close_code::POLICY => "the client did not read what it was sent",
        close_code::SIZE => "a frame was over the body limit",
        close_code::PROTOCOL => "protocol error",
        _ => "",
    }
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
        match tokio::time::timeout(SEND_TIMEOUT, sink.send(Message::text(text))).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => break,
            Err(_) => {
                tracing::info!("an event took too long to reach the client: disconnected");
                crate::metrics::stream_client_dropped("events_ws", "send_timeout");
                say_goodbye(sink, close_code::POLICY).await;
                return;
            }
        }
    }
    let _ = sink.close().await;
}
