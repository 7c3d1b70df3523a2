//! The stdio transport (`troupe serve --stdio`, for editors): one JSON-RPC frame per line on
//! stdin, one answer or notification per line on stdout. The peer is the local user, so
//! every call has [`Scope::All`].
//!
//! Calls run concurrently; answers may come out of order (match them by `id`). At the end of
//! stdin the calls still running are finished and answered, then the transport returns. A
//! line longer than the body limit is answered with a parse error.

use super::auth::Scope;
use super::error::RpcError;
use super::rpc::{Notifier, Rpc, error_response};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Serves JSON-RPC over a line-oriented byte stream pair until `input` ends or `shutdown`
/// fires.
pub async fn serve<R, W>(
    rpc: Rpc,
    input: R,
    mut output: W,
    line_limit: usize,
    shutdown: CancellationToken,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, mut outbox) = mpsc::channel::<serde_json::Value>(256);
    let closed = shutdown.child_token();
    let notifier = Arc::new(Notifier::new(out.clone(), closed.clone(), "stdio"));
    let writer = tokio::spawn(async move {
        while let Some(v) = outbox.recv().await {
            let mut line = v.to_string();
            line.push('\n');
            if output.write_all(line.as_bytes()).await.is_err() || output.flush().await.is_err() {
                break;
            }
        }
    });
    let mut reader = BufReader::new(input);
    let mut calls = JoinSet::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = tokio::select! {
            () = closed.cancelled() => break,
            r = reader.read_until(b'\n', &mut line) => r,
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if line.len() > line_limit {
            let e = RpcError::parse(format!("line longer than {line_limit} bytes"));
            let _ = out.send(error_response(serde_json::Value::Null, e)).await;
            continue;
        }
        let (rpc, notifier, out, bytes) =
            (rpc.clone(), notifier.clone(), out.clone(), line.clone());
        calls.spawn(async move {
            if let Some(answer) = rpc.handle_frame(&Scope::All, &bytes, Some(&notifier)).await {
                let _ = out.send(answer).await;
            }
        });
        // Reap finished calls as we go so the set stays small.
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
    closed.cancel();
    drop(out);
    drop(notifier);
    let _ = writer.await;
}
