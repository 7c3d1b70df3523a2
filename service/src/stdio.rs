//! The stdio transport (`troupe serve --stdio`, for editors): one JSON-RPC frame per line on
//! stdin, one answer or notification per line on stdout. The peer is the local user, so
//! every call has [`Scope::All`].
//!
//! Calls run concurrently, at most [`MAX_IN_FLIGHT`](crate::rpc::outbox::MAX_IN_FLIGHT) at once (past that no line is read
//! until one ends); answers may come out of order (match them by `id`). At the end of stdin
//! the calls still running are finished and answered, then the transport returns. A line
//! longer than the body limit is answered with a parse error (and never held whole). Answers
//! wait in an outbox bounded in bytes; when the peer does not read, calls wait for it. On
//! shutdown no line is read any more, and the calls still running are answered as the
//! service's shutdown ends their tasks (see `Service::serve_stdio`).

use super::auth::Scope;
use super::error::RpcError;
use super::rpc::outbox::{InFlight, Outbox, Overflow};
use super::rpc::{Id, Notifier, Rpc, error_response};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Serves JSON-RPC over a line-oriented byte stream pair: reads until `input` ends or
/// `stop_reading` fires, then answers the calls still running and returns. `closed` ends it
/// without those answers (a peer that reads none of them is not waited for).
pub async fn serve<R, W>(
    rpc: Rpc,
    input: R,
    mut output: W,
    line_limit: usize,
    stop_reading: CancellationToken,
    closed: CancellationToken,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, mut queue) = Outbox::new(Overflow::Wait, closed.clone(), "stdio");
    let notifier = Arc::new(Notifier::new(out.clone(), closed.clone(), "stdio"));
    let writer = tokio::spawn(async move {
        while let Some(queued) = queue.recv().await {
            let mut line = queued.text;
            line.push('\n');
            if output.write_all(line.as_bytes()).await.is_err() || output.flush().await.is_err() {
                break;
            }
        }
    });
    let mut reader = BufReader::new(input);
    let mut calls = JoinSet::new();
    let in_flight = InFlight::default();
    let mut line = Vec::new();
    loop {
        line.clear();
        let slot = tokio::select! {
            () = stop_reading.cancelled() => break,
            () = closed.cancelled() => break,
            slot = in_flight.slot() => slot,
        };
        let Some(slot) = slot else { break };
        let read = tokio::select! {
            () = stop_reading.cancelled() => break,
            () = closed.cancelled() => break,
            r = read_line(&mut reader, &mut line, line_limit) => r,
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        // The limit is the frame's (as an HTTP body's), its line ending not counted.
        if frame_of(&line).len() > line_limit {
            let e = RpcError::parse(format!("line longer than {line_limit} bytes"));
            out.push(error_response(&Id::NULL, &e)).await;
            continue;
        }
        let (rpc, notifier, out, bytes) =
            (rpc.clone(), notifier.clone(), out.clone(), line.clone());
        calls.spawn(async move {
            let _slot = slot;
            if let Some(answer) = rpc.handle_frame(&Scope::All, &bytes, Some(&notifier)).await {
                out.push(answer).await;
            }
        });
        // Reap finished calls as we go so the set stays small.
        while calls.try_join_next().is_some() {}
    }
    tokio::select! {
        () = async { while calls.join_next().await.is_some() {} } => {}
        () = closed.cancelled() => calls.abort_all(),
    }
    closed.cancel();
    drop(out);
    drop(notifier);
    let _ = writer.await;
}

/// A line without its ending (`\n` or `\r\n`).
fn frame_of(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Reads one line into `line`, keeping at most `limit + 3` bytes of it (a frame of `limit`
/// bytes, its `\r\n`, and one more to tell a longer one; the rest of a longer line is read
/// and dropped). The bytes read, 0 at the end of the input.
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
    limit: usize,
) -> std::io::Result<usize> {
    let keep = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(3);
    let mut read = (&mut *reader).take(keep).read_until(b'\n', line).await?;
    if frame_of(line).len() > limit && line.last() != Some(&b'\n') {
        let mut rest = Vec::with_capacity(8192);
        loop {
            rest.clear();
            let n = (&mut *reader)
                .take(8192)
                .read_until(b'\n', &mut rest)
                .await?;
            read += n;
            if n == 0 || rest.last() == Some(&b'\n') {
                break;
            }
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit is a frame's, as over HTTP: a frame of exactly `limit` bytes passes with
    /// either line ending; one byte more does not, and the next line is read whole.
    #[tokio::test]
    async fn a_frame_of_the_limit_passes_and_one_byte_more_does_not() {
        let input = b"0123456789\n0123456789\r\n0123456789a\nnext\n".to_vec();
        let mut reader = BufReader::new(&input[..]);
        let mut line = Vec::new();
        let mut frames = Vec::new();
        while read_line(&mut reader, &mut line, 10).await.unwrap() > 0 {
            let frame = frame_of(&line);
            frames.push((frame.len() <= 10).then(|| String::from_utf8_lossy(frame).into_owned()));
            line.clear();
        }
        assert_eq!(
            frames,
            [
                Some("0123456789".to_owned()),
                Some("0123456789".to_owned()),
                None,
                Some("next".to_owned()),
            ]
        );
    }
}
