//! The HTTP listener: HTTP/1.1 connections with limits on slow and idle clients, and a cap
//! on open connections.
//!
//! - **Idle**: a connection waiting for its next request (a new one, or between keep-alive
//!   requests) is closed once `idle_timeout` passes with no byte of a request head.
//! - **Header**: once the first byte of a request head arrives, the whole head must follow
//!   within `header_timeout`, else the connection is closed (a client trickling a header
//!   line by line holds nothing for long).
//! - **Body**: a request body must arrive whole within `body_timeout` of its head; a handler
//!   reading it gets an error, answered 408 `request_timeout`.
//! - **Cap**: at most `max_connections` are open at once; beyond that new connections are not
//!   accepted: they wait in the listen backlog until one closes (nothing is dropped, a
//!   waiting client sees its request answered late).
//!
//! A response streaming (SSE) or a request at work holds its connection as long as it
//! takes; an upgraded connection (WebSocket) leaves these limits. On shutdown the listener
//! stops accepting, idle connections close, and busy ones close after their response.
//! Connections are counted in `troupe_http_connections_open` and, once closed, in
//! `troupe_http_connections_closed_total{reason}`.

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::http::{Request, StatusCode};
use http_body::Frame;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The limits of [`serve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
        }
    }
}

/// Why a connection closed (the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The client closed it, or keep-alive ended after a response.
    Done,
    /// No request within `idle_timeout`.
    IdleTimeout,
    /// A request head not complete within `header_timeout`.
    HeaderTimeout,
    /// Shutdown closed it.
    Shutdown,
    /// A protocol or I/O error.
    Error,
}

impl Closed {
    pub const ALL: [Self; 5] = [
        Self::Done,
        Self::IdleTimeout,
        Self::HeaderTimeout,
        Self::Shutdown,
        Self::Error,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::IdleTimeout => "idle_timeout",
            Self::HeaderTimeout => "header_timeout",
            Self::Shutdown => "shutdown",
            Self::Error => "error",
        }
    }
}

/// A request body that did not arrive whole within the body timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTimedOut(pub Duration);

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive within {} ms",
            self.0.as_millis()
        )
    }
}

impl std::error::Error for BodyTimedOut {}

/// Where a connection is: what it waits for.
const IDLE: u8 = 0;
const HEAD: u8 = 1;
const BUSY: u8 = 2;
const UPGRADED: u8 = 3;

/// What a connection's reader and its requests share.
#[derive(Debug, Default)]
struct ConnState {
    phase: AtomicU8,
    header_timed_out: std::sync::atomic::AtomicBool,
}

/// Serves `app` on `listener` within `limits` until `shutdown` fires; returns once every
/// connection has closed (upgraded ones excepted: they end with their own streams).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    shutdown: CancellationToken,
) {
    let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(max));
    loop {
        let permit = tokio::select! {
            () = shutdown.cancelled() => break,
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, _peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: try again shortly.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let open = crate::metrics::ConnectionOpen::start();
            let reason = connection(stream, app, limits, shutdown).await;
            open.close(reason);
            drop(permit);
        });
    }
    drop(listener);
    // Every slot back: every connection closed.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

async fn connection(
    stream: tokio::net::TcpStream,
    app: Router,
    limits: ConnLimits,
    shutdown: CancellationToken,
) -> Closed {
    let state = Arc::new(ConnState::default());
    let io = Watched {
        io: stream,
        state: state.clone(),
        header_timeout: limits.header_timeout,
        deadline: None,
    };
    let requests = state.clone();
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        requests.phase.store(BUSY, Ordering::SeqCst);
        let state = requests.clone();
        let req = req.map(|body| Body::new(Deadline::new(body, limits.body_timeout)));
        let answer = app.clone().oneshot(req);
        async move {
            let response = answer.await?;
            if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                state.phase.store(UPGRADED, Ordering::SeqCst);
            }
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                Body::new(Tracked {
                    inner: body,
                    state: Some(state),
                })
            }))
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .keep_alive(true);
    let conn = http
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let mut closing = false;
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = shutdown.cancelled() => {
            closing = true;
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    match result {
        Ok(()) if closing => Closed::Shutdown,
        Ok(()) => Closed::Done,
        Err(_) if state.header_timed_out.load(Ordering::SeqCst) => Closed::HeaderTimeout,
        Err(e) if e.is_timeout() => Closed::IdleTimeout,
        Err(e) if e.is_incomplete_message() || e.is_closed() => Closed::Done,
        Err(e) => {
            tracing::debug!(error = %e, "connection failed");
            Closed::Error
        }
    }
}

/// The connection's socket, timing request heads: the first byte read while the connection
/// is idle starts the header clock; the request reaching the router stops it.
struct Watched<IO> {
    io: IO,
    state: Arc<ConnState>,
    header_timeout: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before
            && this
                .state
                .phase
                .compare_exchange(IDLE, HEAD, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            this.deadline = Some(Box::pin(tokio::time::sleep(this.header_timeout)));
        }
        if this.state.phase.load(Ordering::SeqCst) == HEAD {
            if let Some(deadline) = this.deadline.as_mut()
                && deadline.as_mut().poll(cx).is_ready()
            {
                this.state.header_timed_out.store(true, Ordering::SeqCst);
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "request head not complete within the header timeout",
                )));
            }
        } else {
            this.deadline = None;
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
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
}

/// A request body with a deadline for the whole of it.
struct Deadline<B> {
    inner: B,
    limit: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<B> Deadline<B> {
    fn new(inner: B, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
        }
    }
}

impl<B> HttpBody for Deadline<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut(this.limit)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that marks its connection idle once sent (or dropped).
struct Tracked {
    inner: Body,
    state: Option<Arc<ConnState>>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            let _ = state
                .phase
                .compare_exchange(BUSY, IDLE, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `error` (a body error, or a rejection caused by one) is a [`BodyTimedOut`].
pub fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut e = Some(error);
    while let Some(err) = e {
        if err.is::<BodyTimedOut>() {
            return true;
        }
        e = err.source();
    }
    false
}
