//! The connection a model request travels on.
//!
//! A model server on this machine (`http://` to a loopback address) is reached through
//! hyper's pooled client over our own connector: the socket has `TCP_NODELAY` (as reqwest's
//! had), and on Linux `TCP_QUICKACK` is set again after every read, so the kernel acknowledges
//! what the server sent at once instead of delaying the ACK up to 40 ms. Every other endpoint
//! (TLS, proxies, remote hosts) goes through reqwest, whose connections troupe cannot reach.
//!
//! Why: a server that writes its SSE events one small `send` at a time with Nagle's algorithm
//! on (Python's `http.server`, many small model servers) holds each small write until the
//! previous one is acknowledged. A warm keep-alive connection is in the kernel's interactive
//! ("ping-pong") mode, where a receiver delays its ACK hoping to piggyback it on its next
//! write; the client writes nothing while it reads a reply, so the server waited for the
//! delayed-ACK timer (40 ms) on every request. Re-arming `TCP_QUICKACK` after each read sends
//! the pending ACK with the read; its cost is one `setsockopt` per read. Measured by
//! `cargo bench -p troupe-tests --bench model_http` (BENCHMARKS.md): a warm turn against such
//! a server went from 46.6 ms to 2.2 ms at the median, the same as against a server with
//! `TCP_NODELAY`.

use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;

/// A TCP connection to a local model server that acknowledges received data at once.
pub(crate) struct QuickAckStream {
    io: TokioIo<TcpStream>,
}

impl QuickAckStream {
    fn new(io: TokioIo<TcpStream>) -> Self {
        let stream = Self { io };
        stream.quickack();
        stream
    }

    /// Asks the kernel to send any pending ACK now and to leave delayed-ACK mode (Linux; the
    /// kernel drops back to it on its own, so this runs after every read).
    fn quickack(&self) {
        #[cfg(target_os = "linux")]
        {
            let socket = socket2::SockRef::from(self.io.inner());
            if let Err(e) = socket.set_tcp_quickack(true) {
                tracing::debug!(error = %e, "cannot set TCP_QUICKACK");
            }
        }
    }

    /// Whether the socket has `TCP_NODELAY` (for tests).
    #[cfg(test)]
    pub(crate) fn nodelay(&self) -> io::Result<bool> {
        self.io.inner().nodelay()
    }
}

impl hyper::rt::Read for QuickAckStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) {
            this.quickack();
        }
        read
    }
}

impl hyper::rt::Write for QuickAckStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl Connection for QuickAckStream {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

/// Connects like hyper's [`HttpConnector`] (plain HTTP only, `TCP_NODELAY`, the connect
/// timeout) and wraps the stream in [`QuickAckStream`].
#[derive(Clone)]
pub(crate) struct QuickAckConnector {
    http: HttpConnector,
}

impl QuickAckConnector {
    pub(crate) fn new(connect_timeout: Duration) -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        Self { http }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<hyper::Uri> for QuickAckConnector {
    type Response = QuickAckStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<QuickAckStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: hyper::Uri) -> Self::Future {
        let connecting = self.http.call(uri);
        Box::pin(async move { Ok(QuickAckStream::new(connecting.await?)) })
    }
}

/// The pooled client for local model servers.
pub(crate) type LocalClient = Client<QuickAckConnector, reqwest::Body>;

pub(crate) fn local_client(connect_timeout: Duration) -> LocalClient {
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .build(QuickAckConnector::new(connect_timeout))
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::Service;

    /// Whether the socket is out of delayed-ACK ("ping-pong") mode: Linux reports
    /// `TCP_QUICKACK` as that.
    fn acks_at_once(stream: &QuickAckStream) -> bool {
        socket2::SockRef::from(stream.io.inner())
            .tcp_quickack()
            .unwrap()
    }

    #[tokio::test]
    async fn a_connection_has_nodelay_and_leaves_delayed_ack_mode_after_each_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: hyper::Uri = format!("http://{}/", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let mut connector = QuickAckConnector::new(Duration::from_secs(5));
        let (stream, accepted) = tokio::join!(connector.call(uri), listener.accept());
        let stream = stream.unwrap();
        let (mut server, _) = accepted.unwrap();
        assert!(stream.nodelay().unwrap(), "the request goes out unheld");

        let mut client = TokioIo::new(stream);
        let mut buf = [0u8; 64];
        for round in 0..3 {
            // What a warm keep-alive connection is in when a reply starts: delayed ACKs.
            socket2::SockRef::from(client.inner().io.inner())
                .set_tcp_quickack(false)
                .unwrap();
            assert!(!acks_at_once(client.inner()), "round {round}: the premise");
            server.write_all(b"data: {}\n\n").await.unwrap();
            let n = client.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"data: {}\n\n");
            assert!(
                acks_at_once(client.inner()),
                "round {round}: the read re-armed TCP_QUICKACK"
            );
            // And the connection still carries the client's writes.
            client.write_all(b"next").await.unwrap();
            let mut got = [0u8; 4];
            server.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"next");
        }
    }
}
