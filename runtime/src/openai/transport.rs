//! The connection a model request travels on.
//!
//! A model server on this machine (`http://` to a loopback address) is reached through a pool
//! of HTTP/1.1 connections over our own connector ([`LocalClient`]): the socket has
//! `TCP_NODELAY` (as reqwest's had), and on Linux `TCP_QUICKACK` is set again after every
//! read, so the kernel acknowledges what the server sent at once instead of delaying the ACK
//! up to 40 ms; and each connection is driven by the task that reads its response, so the
//! pieces of a streamed answer reach that task without a hop through another one. Every other
//! endpoint (TLS, proxies, remote hosts) goes through reqwest, whose connections troupe cannot
//! reach.
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

use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
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

type Conn = hyper::client::conn::http1::Connection<QuickAckStream, reqwest::Body>;
type Sender = hyper::client::conn::http1::SendRequest<reqwest::Body>;

/// A kept-alive connection: the handle that sends on it and the connection's own future, which
/// does its reading and writing when polled.
struct Live {
    send: Sender,
    conn: Pin<Box<Conn>>,
    /// When it last went back to the pool (tokio's clock, which a paused test moves).
    idle_since: tokio::time::Instant,
}

/// Most idle connections kept per client.
const MAX_IDLE: usize = 32;
/// How long a connection may wait in the pool: older ones are closed at the next checkout or
/// release.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The pooled client for local model servers. A request's connection is driven by the task
/// that makes the request and reads its response ([`LocalBody`]), not by a task of its own:
/// each piece of the stream the server writes wakes the reader directly, where a connection
/// task would wake it through a channel, often on the other worker thread. Between requests
/// a connection waits in the pool unpolled, at most [`IDLE_TIMEOUT`]; a checkout polls it once
/// and drops it if the server closed it meanwhile.
#[derive(Clone)]
pub(crate) struct LocalClient {
    connector: QuickAckConnector,
    idle: Arc<Mutex<Vec<Live>>>,
}

pub(crate) fn local_client(connect_timeout: Duration) -> LocalClient {
    LocalClient {
        connector: QuickAckConnector::new(connect_timeout),
        idle: Arc::new(Mutex::new(Vec::new())),
    }
}

impl LocalClient {
    /// Sends `request` (an absolute `http://` URI) on an idle connection or a new one, and
    /// returns the response once its head has arrived. A request that an idle connection
    /// could not take (the server closed it as it was checked out) goes again, on another
    /// connection (hyper hands back only a request it never wrote).
    pub(crate) async fn request(
        &self,
        mut request: hyper::Request<reqwest::Body>,
    ) -> Result<hyper::Response<LocalBody>, BoxError> {
        let uri = request.uri().clone();
        let host = host_header(&uri)?;
        *request.uri_mut() = uri.path_and_query().map_or("/", |p| p.as_str()).parse()?;
        request
            .headers_mut()
            .entry(hyper::header::HOST)
            .or_insert(hyper::header::HeaderValue::from_str(&host)?);
        let mut request = Some(request);
        loop {
            let (live, reused) = match self.checkout() {
                Some(live) => (live, true),
                None => (self.connect(uri.clone()).await?, false),
            };
            let Live { mut send, conn, .. } = live;
            let Some(next) = request.take() else {
                return Err("the request was lost".into());
            };
            let sent = send.try_send_request(next);
            let mut conn = Some(conn);
            let head = drive(&mut conn, sent).await;
            match head {
                Ok(response) => {
                    let live = conn.map(|conn| Live {
                        send,
                        conn,
                        idle_since: tokio::time::Instant::now(),
                    });
                    let pool = Arc::downgrade(&self.idle);
                    return Ok(response.map(|inner| LocalBody {
                        inner: Some(inner),
                        live: Mutex::new(live),
                        pool,
                    }));
                }
                Err(mut e) => match e.take_message() {
                    // Not sent: only an idle connection that went away meanwhile.
                    Some(unsent) if reused => request = Some(unsent),
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }

    /// An idle connection that is still open, newest first.
    fn checkout(&self) -> Option<Live> {
        loop {
            let mut live = { pruned(&self.idle).pop()? };
            // One poll reads what the server sent since: a close ends the connection.
            let waker = std::task::Waker::noop();
            let ended = live
                .conn
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_ready();
            if !ended && !live.send.is_closed() {
                return Some(live);
            }
        }
    }

    async fn connect(&self, uri: hyper::Uri) -> Result<Live, BoxError> {
        let mut connector = self.connector.clone();
        let stream = tower::Service::call(&mut connector, uri).await?;
        let (send, conn) = hyper::client::conn::http1::handshake(stream).await?;
        Ok(Live {
            send,
            conn: Box::pin(conn),
            idle_since: tokio::time::Instant::now(),
        })
    }
}

/// The `Host` header of `uri`: its host, and its port when it names one (never its
/// credentials).
fn host_header(uri: &hyper::Uri) -> Result<String, BoxError> {
    let host = uri.host().ok_or("the model URL has no host")?;
    Ok(match uri.port_u16() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

/// Polls the connection while waiting for `sent`. A connection whose future ends is dropped at
/// once (`None`): hyper then hands back a request it had queued but not written, which a
/// connection that lived on (idle after a clean close) would hold forever.
async fn drive<F, T>(conn: &mut Option<Pin<Box<Conn>>>, sent: F) -> T
where
    F: Future<Output = T>,
{
    let mut sent = std::pin::pin!(sent);
    std::future::poll_fn(|cx| {
        if let Some(c) = conn
            && c.as_mut().poll(cx).is_ready()
        {
            *conn = None;
        }
        sent.as_mut().poll(cx)
    })
    .await
}

/// How long a body dropped before its end may take to reach it in the background, so that its
/// connection serves again (a reader that stops at the stream's terminal event leaves the
/// body's last bytes unread); past that the connection is closed.
const FINISH_WITHIN: Duration = Duration::from_millis(100);
/// Most bytes of a dropped body read to reach its end: a body with more left (an error body
/// read only in part, a stream given up on for its size) is not worth its connection, which
/// is closed instead.
const FINISH_AT_MOST: usize = 64 * 1024;
/// Most pieces of a dropped body read by the drop itself.
const DROP_READS: usize = 64;

/// A response body from a local model server that drives its connection as it is read, and
/// puts the connection back in the pool once the body has ended. Dropped before its end, it
/// reads what already arrived, and if its end is not among it, a task reads on for at most
/// [`FINISH_WITHIN`] (and [`FINISH_AT_MOST`] bytes in all) before the connection goes back or
/// is closed.
pub(crate) struct LocalBody {
    inner: Option<hyper::body::Incoming>,
    // A lock only so that the body is `Sync`, as a `reqwest::Body` must be; every access has
    // `&mut self` (`get_mut`).
    live: Mutex<Option<Live>>,
    pool: std::sync::Weak<Mutex<Vec<Live>>>,
}

type Polled = Poll<Option<Result<hyper::body::Frame<hyper::body::Bytes>, hyper::Error>>>;

/// Counts a piece of a dropped body read on towards [`FINISH_AT_MOST`]; false past it.
fn within_finish(read: &mut usize, frame: &hyper::body::Frame<hyper::body::Bytes>) -> bool {
    *read = read.saturating_add(frame.data_ref().map_or(0, hyper::body::Bytes::len));
    *read <= FINISH_AT_MOST
}

/// Polls the connection (while it lives), then the body.
fn poll_body(
    live: &mut Option<Live>,
    inner: &mut hyper::body::Incoming,
    cx: &mut Context<'_>,
) -> Polled {
    if let Some(l) = live
        && l.conn.as_mut().poll(cx).is_ready()
    {
        // The connection ended: what it read is in the body; nothing goes back.
        *live = None;
    }
    hyper::body::Body::poll_frame(Pin::new(inner), cx)
}

/// The pool, locked, without the connections that waited there past [`IDLE_TIMEOUT`] (dropped,
/// which closes them).
fn pruned(pool: &Mutex<Vec<Live>>) -> std::sync::MutexGuard<'_, Vec<Live>> {
    let mut idle = pool
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    idle.retain(|l| l.idle_since.elapsed() < IDLE_TIMEOUT);
    idle
}

/// Puts a connection whose response has ended back in the pool (and closes those that waited
/// there too long).
fn release(mut live: Live, pool: &std::sync::Weak<Mutex<Vec<Live>>>) {
    if let Some(pool) = pool.upgrade() {
        let mut idle = pruned(&pool);
        if idle.len() < MAX_IDLE {
            live.idle_since = tokio::time::Instant::now();
            idle.push(live);
        }
    }
}

/// Reads the rest of a dropped body (at most [`FINISH_WITHIN`] and [`FINISH_AT_MOST`] bytes
/// in all, `read` of them already); its connection goes back to the pool if the body ended.
async fn finish(
    mut live: Option<Live>,
    mut inner: hyper::body::Incoming,
    pool: std::sync::Weak<Mutex<Vec<Live>>>,
    mut read: usize,
) {
    let ended = tokio::time::timeout(
        FINISH_WITHIN,
        std::future::poll_fn(|cx| {
            loop {
                match poll_body(&mut live, &mut inner, cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        if !within_finish(&mut read, &frame) {
                            return Poll::Ready(false);
                        }
                    }
                    Poll::Ready(None) => return Poll::Ready(true),
                    Poll::Ready(Some(Err(_))) => return Poll::Ready(false),
                    Poll::Pending => return Poll::Pending,
                }
            }
        }),
    )
    .await;
    if let (Ok(true), Some(l)) = (ended, live) {
        release(l, &pool);
    }
}

impl Drop for LocalBody {
    fn drop(&mut self) {
        let mut live = self
            .live
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let (Some(_), Some(mut inner)) = (&live, self.inner.take()) else {
            return;
        };
        // What already arrived may hold the end; a server still streaming fast is left to the
        // finishing task (bounded in time) rather than read here, in the dropping caller.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut read = 0;
        for _ in 0..DROP_READS {
            match poll_body(&mut live, &mut inner, &mut cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if !within_finish(&mut read, &frame) {
                        return;
                    }
                }
                Poll::Ready(None) => {
                    if let Some(l) = live {
                        release(l, &self.pool);
                    }
                    return;
                }
                Poll::Ready(Some(Err(_))) => return,
                Poll::Pending => break,
            }
        }
        if live.is_some()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(finish(live, inner, self.pool.clone(), read));
        }
    }
}

impl hyper::body::Body for LocalBody {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        let live = this
            .live
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(inner) = &mut this.inner else {
            return Poll::Ready(None);
        };
        let frame = poll_body(live, inner, cx);
        if let Poll::Ready(None) = frame
            && let Some(l) = live.take()
        {
            release(l, &this.pool);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(hyper::body::Body::is_end_stream)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.as_ref().map_or_else(
            || hyper::body::SizeHint::with_exact(0),
            hyper::body::Body::size_hint,
        )
    }
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

    type Socket = tokio::io::BufReader<tokio::net::TcpStream>;

    /// Reads one request from `socket` and answers it with `body`; false when the client
    /// closed the connection instead.
    async fn answer(socket: &mut Socket, body: &str) -> bool {
        use tokio::io::AsyncBufReadExt;
        let mut length = 0;
        loop {
            let mut line = String::new();
            if socket.read_line(&mut line).await.unwrap_or(0) == 0 {
                return false;
            }
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut request = vec![0; length];
        socket.read_exact(&mut request).await.unwrap();
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.get_mut().write_all(reply.as_bytes()).await.unwrap();
        true
    }

    /// A loopback HTTP/1.1 server answering every request with `body`: how many connections
    /// it accepted, and its URL. With `close`, each connection is closed (without a word, as
    /// a server's idle timeout does) after its first answer once `close` is notified, and
    /// the third value is notified when it is.
    async fn server(
        body: &'static str,
        close: Option<Arc<tokio::sync::Notify>>,
    ) -> (
        Arc<std::sync::atomic::AtomicUsize>,
        String,
        Arc<tokio::sync::Notify>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/x", listener.local_addr().unwrap());
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let closed = Arc::new(tokio::sync::Notify::new());
        let closes = closed.clone();
        tokio::spawn(async move {
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (close, closes) = (close.clone(), closes.clone());
                tokio::spawn(async move {
                    let mut socket = tokio::io::BufReader::new(socket);
                    if !answer(&mut socket, body).await {
                        return;
                    }
                    if let Some(close) = close {
                        close.notified().await;
                        drop(socket);
                        closes.notify_one();
                        return;
                    }
                    while answer(&mut socket, body).await {}
                });
            }
        });
        (accepted, url, closed)
    }

    /// A model request to `url`, as `OpenAiClient` makes one.
    fn post_request(url: &str) -> hyper::Request<reqwest::Body> {
        hyper::Request::post(url)
            .body(reqwest::Body::from("{}"))
            .unwrap()
    }

    async fn post(client: &LocalClient, url: &str) -> String {
        let request = post_request(url);
        let response = client.request(request).await.unwrap();
        reqwest::Response::from(response.map(reqwest::Body::wrap))
            .text()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn requests_one_after_another_share_one_connection() {
        let (accepted, url, _) = server("hello", None).await;
        let client = local_client(Duration::from_secs(5));
        for _ in 0..3 {
            assert_eq!(post(&client, &url).await, "hello");
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Two at once take two connections, both kept for later.
        let (a, b) = tokio::join!(post(&client, &url), post(&client, &url));
        assert_eq!((a.as_str(), b.as_str()), ("hello", "hello"));
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(client.idle.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_idle_past_the_timeout_is_closed_and_not_used_again() {
        let (accepted, url, _) = server("hello", None).await;
        let client = local_client(Duration::from_secs(5));
        assert_eq!(post(&client, &url).await, "hello");
        tokio::time::advance(IDLE_TIMEOUT - Duration::from_secs(1)).await;
        assert_eq!(post(&client, &url).await, "hello");
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "reused within the timeout"
        );
        tokio::time::advance(IDLE_TIMEOUT + Duration::from_secs(1)).await;
        assert_eq!(post(&client, &url).await, "hello");
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "a new connection past it"
        );
        assert_eq!(client.idle.lock().unwrap().len(), 1, "the old one is gone");
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced() {
        let close = Arc::new(tokio::sync::Notify::new());
        let (accepted, url, closed) = server("hello", Some(close.clone())).await;
        let client = local_client(Duration::from_secs(5));
        assert_eq!(post(&client, &url).await, "hello");
        assert_eq!(client.idle.lock().unwrap().len(), 1, "kept");
        // The server closes the idle connection (on loopback its FIN is here at once).
        let notified = closed.notified();
        close.notify_one();
        notified.await;
        assert_eq!(post(&client, &url).await, "hello");
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// The race a checkout can lose: the server's close arrives after the checkout looked and
    /// before the request is written. hyper then ends the idle connection cleanly; dropping it
    /// hands the request back unsent (else it would wait forever).
    #[tokio::test(start_paused = true)]
    async fn a_request_queued_on_a_connection_that_closed_comes_back_unsent() {
        let close = Arc::new(tokio::sync::Notify::new());
        let (_, url, closed) = server("hello", Some(close.clone())).await;
        let client = local_client(Duration::from_secs(5));
        assert_eq!(post(&client, &url).await, "hello");
        let notified = closed.notified();
        close.notify_one();
        notified.await;
        // Taken without the checkout's look.
        let Live { mut send, conn, .. } = client.idle.lock().unwrap().pop().unwrap();
        let request = hyper::Request::post("/v1/x")
            .header(hyper::header::HOST, "127.0.0.1")
            .body(reqwest::Body::from("{}"))
            .unwrap();
        let sent = send.try_send_request(request);
        let mut conn = Some(conn);
        let result = tokio::time::timeout(Duration::from_secs(5), drive(&mut conn, sent))
            .await
            .expect("the request came back instead of waiting forever");
        let mut error = result.expect_err("the connection was closed");
        assert!(error.take_message().is_some(), "unsent: it can go again");
        assert!(conn.is_none(), "the ended connection was dropped");
    }

    #[test]
    fn the_host_header_names_host_and_port_never_credentials() {
        let uri: hyper::Uri = "http://user:secret@localhost:8000/v1".parse().unwrap();
        assert_eq!(host_header(&uri).unwrap(), "localhost:8000");
        let uri: hyper::Uri = "http://[::1]/v1".parse().unwrap();
        assert_eq!(host_header(&uri).unwrap(), "[::1]");
    }

    #[tokio::test]
    async fn a_body_dropped_unread_is_finished_and_its_connection_serves_again() {
        let (accepted, url, _) = server("a longer answer", None).await;
        let client = local_client(Duration::from_secs(5));
        let request = post_request(&url);
        // Dropped with its body unread (a reader that stopped at the terminal event).
        let response = client.request(request).await.unwrap();
        drop(response);
        for _ in 0..100 {
            if !client.idle.lock().unwrap().is_empty() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(client.idle.lock().unwrap().len(), 1, "finished, kept");
        assert_eq!(post(&client, &url).await, "a longer answer");
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_whose_end_comes_after_its_drop_is_read_on_and_its_connection_kept() {
        // A server that sends a head and part of a body, the rest only once told.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/x", listener.local_addr().unwrap());
        let rest = Arc::new(tokio::sync::Notify::new());
        let go = rest.clone();
        let server = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut socket = tokio::io::BufReader::new(socket);
            let mut line = String::new();
            while line != "\r\n" {
                line.clear();
                tokio::io::AsyncBufReadExt::read_line(&mut socket, &mut line)
                    .await
                    .unwrap();
            }
            let mut body = [0u8; 2];
            socket.read_exact(&mut body).await.unwrap();
            let head = b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\npart";
            socket.get_mut().write_all(head).await.unwrap();
            go.notified().await;
            socket.get_mut().write_all(b" two").await.unwrap();
            // The connection serves the next request.
            answer(&mut socket, "again").await
        });
        let client = local_client(Duration::from_secs(5));
        let response = client.request(post_request(&url)).await.unwrap();
        drop(response);
        assert!(
            client.idle.lock().unwrap().is_empty(),
            "its end is not here yet"
        );
        rest.notify_one();
        // Within the finishing budget (the clock is paused; the rest arrives at once).
        tokio::time::sleep(FINISH_WITHIN / 2).await;
        assert_eq!(
            client.idle.lock().unwrap().len(),
            1,
            "read to its end and kept"
        );
        assert_eq!(post(&client, &url).await, "again");
        assert!(server.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_whose_end_does_not_come_closes_its_connection() {
        // A server that sends a head and part of a body, then nothing.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/x", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npart")
                .await
                .unwrap();
            // Waits for the client to close.
            socket.read(&mut buf).await.unwrap_or(0)
        });
        let client = local_client(Duration::from_secs(5));
        let request = post_request(&url);
        let response = client.request(request).await.unwrap();
        drop(response);
        // Past the finishing budget the connection is closed, not kept.
        assert_eq!(server.await.unwrap(), 0, "the client closed the connection");
        assert!(client.idle.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_body_with_much_left_is_not_read_on_and_its_connection_closes() {
        // A server that sends a head and then a body of 1 GiB as fast as it can.
        const BODY: usize = 1 << 30;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/x", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await.unwrap();
            let head = format!("HTTP/1.1 500 Oops\r\ncontent-length: {BODY}\r\n\r\n");
            socket.write_all(head.as_bytes()).await.unwrap();
            let chunk = vec![b'x'; 64 * 1024];
            let mut written = 0;
            while written < BODY {
                match socket.write(&chunk).await {
                    Ok(n) if n > 0 => written += n,
                    _ => break,
                }
            }
            written
        });
        let client = local_client(Duration::from_secs(5));
        let response = client.request(post_request(&url)).await.unwrap();
        drop(response);
        let written = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the client closed the connection")
            .unwrap();
        // What the socket buffers took, and not much more.
        assert!(written < 32 << 20, "the server wrote {written} bytes");
        assert!(client.idle.lock().unwrap().is_empty());
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
