//! MCP client over rmcp: [`RmcpConnector`] opens [`RmcpConnection`]s to MCP servers, as
//! child processes over stdio or remote servers over streamable HTTP, for the McpPool.
//!
//! A connection is made of tasks that share nothing but tokens:
//! - rmcp's service loop: reads and writes JSON-RPC, runs the server's requests (roots,
//!   elicitation, sampling) and notifications through [`client::TroupeClient`];
//! - a watcher that waits for that loop to end;
//! - for stdio, a supervisor that owns the child, kills its process group on request and
//!   reaps it, and a reader that logs each stderr line as a tracing event.
//!
//! Ending: whichever comes first (the child exits, the transport closes, `close()`, the
//! connection is dropped) records its reason once, sends `McpNotice::Closed` and fires the
//! `ended` token. Every in-flight call waits on that token next to its answer, so it fails
//! with `McpError` at once instead of waiting for a reply that cannot come; later calls
//! check it before sending.
//!
//! Progress: rmcp puts a fresh progress token into every request's `_meta` (it replaces any
//! token the caller set), so a call's progress is routed by the token rmcp chose.
//! `execution.taskSupport` of a tool is not in rmcp's `Tool`; [`tap`] reads it from the raw
//! `tools/list` answers.

mod client;
pub(crate) mod http;
pub mod metrics;
pub mod oauth;
mod stdio;
mod tap;

use async_trait::async_trait;
use client::{ProgressRoutes, TroupeClient};
use metrics::{CallOutcome, Transport};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientRequest, ContentBlock, JsonObject, PaginatedRequestParams, RequestId, RequestParamsMeta,
    ResourceContents, ServerResult, Tool,
};
use rmcp::service::{PeerRequestOptions, QuitReason, RoleClient, RunningService, ServiceError};
use rmcp::{Peer, ServiceExt};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use troupe_actors::ports::{
    McpCall, McpClientHandler, McpConnection, McpConnector, McpNotice, McpServerConfig, McpTool,
    McpTransport,
};
use troupe_proto::{AgentError, Json, ToolOutput};

/// How long the initialize handshake may take by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound of a whole `tools/list` (all pages), or the connect timeout when that is longer
/// (the pool's connect timeout covers the first listing too).
const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// More pages than this is a server bug (a cursor loop), not a tool list.
const MAX_TOOL_PAGES: usize = 1000;
/// Bound of each step of `close()`: reaping the child, stopping the service loop.
const CLOSE_STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound of sending `notifications/cancelled`; nobody waits for it.
const CANCEL_NOTICE_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens MCP connections with rmcp.
#[derive(Clone)]
pub struct RmcpConnector {
    connect_timeout: Duration,
    /// Where OAuth logins are kept (`<data_dir>/mcp-auth`); none: in memory, so only the
    /// client-credentials grant works and nothing outlives the connector.
    token_dir: Option<std::path::PathBuf>,
    /// Tokens kept in memory (no `token_dir`), one store per server.
    memory_tokens: Arc<Mutex<std::collections::HashMap<String, oauth::TokenStore>>>,
    /// Reads the variables that hold OAuth client ids and secrets.
    env: oauth::EnvLookup,
}

impl std::fmt::Debug for RmcpConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RmcpConnector")
            .field("connect_timeout", &self.connect_timeout)
            .field("token_dir", &self.token_dir)
            .finish_non_exhaustive()
    }
}

impl Default for RmcpConnector {
    fn default() -> Self {
        Self {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            token_dir: None,
            memory_tokens: Arc::default(),
            env: oauth::process_env(),
        }
    }
}

impl RmcpConnector {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bounds the start of a server plus its initialize handshake.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Keeps OAuth logins in `dir` (see [`oauth::token_dir`]), where `troupe mcp login`
    /// stores them.
    pub fn with_token_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.token_dir = Some(dir.into());
        self
    }

    /// Reads OAuth client ids and secrets through `env` instead of the process environment.
    pub fn with_env(mut self, env: oauth::EnvLookup) -> Self {
        self.env = env;
        self
    }

    /// Where the login of `server` is kept.
    fn token_store(&self, server: &str) -> oauth::TokenStore {
        match &self.token_dir {
            Some(dir) => oauth::TokenStore::file(dir, server),
            None => self
                .memory_tokens
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(server.to_owned())
                .or_insert_with(oauth::TokenStore::memory)
                .clone(),
        }
    }
}

#[async_trait]
impl McpConnector for RmcpConnector {
    async fn connect(
        &self,
        config: &McpServerConfig,
        handler: Arc<dyn McpClientHandler>,
        notices: tokio::sync::mpsc::UnboundedSender<McpNotice>,
    ) -> Result<Arc<dyn McpConnection>, AgentError> {
        let transport = match config.transport {
            McpTransport::Stdio { .. } => Transport::Stdio,
            McpTransport::StreamableHttp { .. } => Transport::StreamableHttp,
        };
        let span = tracing::info_span!(
            "mcp_connect",
            mcp_server = %config.name,
            transport = transport.as_str()
        );
        let result = self
            .open(config, transport, handler, notices)
            .instrument(span)
            .await;
        match &result {
            Ok(connection) => {
                metrics::connection_opened(transport);
                tracing::info!(mcp_server = %config.name, pid = connection.process_id(), "mcp connected");
            }
            Err(error) => {
                metrics::connect_failed(transport);
                tracing::warn!(mcp_server = %config.name, %error, "mcp connect failed");
            }
        }
        result.map(|connection| connection as Arc<dyn McpConnection>)
    }
}

impl RmcpConnector {
    async fn open(
        &self,
        config: &McpServerConfig,
        transport: Transport,
        handler: Arc<dyn McpClientHandler>,
        notices: tokio::sync::mpsc::UnboundedSender<McpNotice>,
    ) -> Result<Arc<RmcpConnection>, AgentError> {
        let server: Arc<str> = config.name.as_str().into();
        let ending = Arc::new(Ending::new(server.clone(), transport, notices.clone()));
        let routes = ProgressRoutes::default();
        let tap = tap::TaskSupportTap::default();
        let session = http::SessionSeen::default();
        let client = TroupeClient {
            server: server.clone(),
            handler,
            notices,
            routes: routes.clone(),
        };
        let service_ct = CancellationToken::new();
        let fail = |message: String| AgentError::McpError {
            server: server.to_string(),
            message,
        };
        let mut auth: Option<Arc<oauth::Authorizer>> = None;
        let mut unkept = None;
        let (served, child) = match &config.transport {
            McpTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let child = stdio::spawn(stdio::SpawnRequest {
                    server: &server,
                    command,
                    args,
                    env,
                    cwd: cwd.as_deref(),
                    tap: tap.clone(),
                    ending: ending.clone(),
                })?;
                unkept = Some(stdio::KillUnlessKept::new(&child.control));
                let served = tokio::time::timeout(
                    self.connect_timeout,
                    client.serve_with_ct((child.stdout, child.stdin), service_ct.clone()),
                )
                .await
                .map(|r| r.map_err(|e| e.to_string()));
                (served, Some(child.control))
            }
            McpTransport::StreamableHttp {
                url,
                headers,
                oauth,
            } => {
                if let Some(oauth) = oauth {
                    if headers
                        .keys()
                        .any(|h| h.eq_ignore_ascii_case("authorization"))
                    {
                        return Err(fail(
                            "an `Authorization` header and an `oauth` table exclude each other"
                                .into(),
                        ));
                    }
                    let authorizer = tokio::time::timeout(
                        self.connect_timeout,
                        oauth::Authorizer::open(
                            &server,
                            url,
                            headers,
                            oauth,
                            self.token_store(&server),
                            &self.env,
                        ),
                    )
                    .await
                    .map_err(|_| AgentError::Timeout {
                        what: format!("OAuth discovery for MCP server `{server}`"),
                        after_ms: millis(self.connect_timeout),
                    })?
                    .map_err(|e| fail(e.to_string()))?;
                    auth = Some(Arc::new(authorizer));
                }
                let transport =
                    http::transport(url, headers, tap.clone(), session.clone(), auth.clone())
                        .map_err(fail)?;
                let served = tokio::time::timeout(
                    self.connect_timeout,
                    client.serve_with_ct(transport, service_ct.clone()),
                )
                .await
                .map(|r| r.map_err(|e| e.to_string()));
                (served, None)
            }
        };
        let running = match served {
            Ok(Ok(running)) => running,
            failed => {
                service_ct.cancel();
                if let Some(child) = &child {
                    let _ = tokio::time::timeout(CLOSE_STEP_TIMEOUT, child.kill_and_reap()).await;
                }
                // An OAuth failure says what to do about it better than the transport error.
                if let Some(failure) = auth.as_ref().and_then(|a| a.take_failure()) {
                    return Err(fail(failure.to_string()));
                }
                return Err(match failed {
                    Ok(Err(message)) => fail(format!(
                        "handshake failed: {message}{}",
                        ending.reason_suffix()
                    )),
                    _ => AgentError::Timeout {
                        what: format!("MCP handshake with `{server}`"),
                        after_ms: u64::try_from(self.connect_timeout.as_millis())
                            .unwrap_or(u64::MAX),
                    },
                });
            }
        };
        let peer = running.peer().clone();
        let service_done = CancellationToken::new();
        tokio::spawn(watch_service(running, ending.clone(), service_done.clone()));
        if let Some(auth) = &auth {
            tokio::spawn(watch_login(auth.clone(), ending.clone()));
        }
        let connection = Arc::new(RmcpConnection {
            list_timeout: LIST_TIMEOUT.max(self.connect_timeout),
            server: server.clone(),
            transport,
            peer,
            ending,
            routes,
            tap,
            session,
            service_ct,
            service_done,
            child,
            auth,
        });
        if let Some(unkept) = &mut unkept {
            unkept.keep();
        }
        // The process may have died between the handshake and here; then nobody was told.
        if let Err(reason) = connection.ending.mark_connected() {
            connection.close().await;
            return Err(fail(format!("the connection ended right away: {reason}")));
        }
        Ok(connection)
    }
}

/// A call the server runs and has not answered: dropped so, it tells the server the call is
/// cancelled (the connection's own close already does when the connection ends).
struct Unanswered<'a> {
    connection: &'a RmcpConnection,
    id: Option<RequestId>,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take()
            && !self.connection.ending.ended.is_cancelled()
        {
            self.connection
                .send_cancelled(id, "the caller stopped waiting");
        }
    }
}

/// Waits for rmcp's service loop to end and ends the connection with its reason.
async fn watch_service(
    running: RunningService<RoleClient, TroupeClient>,
    ending: Arc<Ending>,
    done: CancellationToken,
) {
    let reason = match running.waiting().await {
        Ok(QuitReason::Closed) => "the server closed the connection".to_owned(),
        Ok(QuitReason::Cancelled) => "the connection was closed by the client".to_owned(),
        Ok(other) => format!("the connection loop ended: {other:?}"),
        Err(e) => format!("the connection task failed: {e}"),
    };
    ending.end(reason);
    done.cancel();
}

/// Ends the connection when its OAuth login is lost for good (a refused refresh token, a
/// token refused even fresh): every later call would fail the same way, and the pool reports
/// the reason and tries again with backoff, which succeeds once someone logs in.
async fn watch_login(auth: Arc<oauth::Authorizer>, ending: Arc<Ending>) {
    tokio::select! {
        () = auth.lost.cancelled() => {
            let reason = auth
                .lost_reason()
                .unwrap_or_else(|| "the OAuth login was lost".to_owned());
            ending.end(reason);
        }
        () = ending.ended.cancelled() => {}
    }
}

/// How a connection ended: decided once, seen by everyone.
pub(crate) struct Ending {
    server: Arc<str>,
    transport: Transport,
    notices: tokio::sync::mpsc::UnboundedSender<McpNotice>,
    state: Mutex<EndState>,
    /// Fired (after the reason is recorded) when the connection ends.
    ended: CancellationToken,
}

#[derive(Default)]
struct EndState {
    /// The handshake completed and the caller has the connection: it gets a `Closed`.
    connected: bool,
    reason: Option<String>,
}

impl Ending {
    fn new(
        server: Arc<str>,
        transport: Transport,
        notices: tokio::sync::mpsc::UnboundedSender<McpNotice>,
    ) -> Self {
        Self {
            server,
            transport,
            notices,
            state: Mutex::new(EndState::default()),
            ended: CancellationToken::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, EndState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ends the connection, the first time only.
    pub(crate) fn end(&self, reason: String) {
        let connected = {
            let mut state = self.lock();
            if state.reason.is_some() {
                return;
            }
            state.reason = Some(reason.clone());
            state.connected
        };
        tracing::info!(mcp_server = %self.server, %reason, "mcp connection ended");
        if connected {
            metrics::connection_closed(self.transport);
            let _ = self.notices.send(McpNotice::Closed { reason });
        }
        self.ended.cancel();
    }

    /// From now on an ending is announced; fails with the reason if it already ended.
    fn mark_connected(&self) -> Result<(), String> {
        let mut state = self.lock();
        match &state.reason {
            Some(reason) => Err(reason.clone()),
            None => {
                state.connected = true;
                Ok(())
            }
        }
    }

    fn reason(&self) -> Option<String> {
        self.lock().reason.clone()
    }

    fn reason_suffix(&self) -> String {
        self.reason().map(|r| format!(" ({r})")).unwrap_or_default()
    }

    /// The error of every call on an ended connection.
    fn error(&self) -> AgentError {
        AgentError::McpError {
            server: self.server.to_string(),
            message: format!(
                "connection closed: {}",
                self.reason().unwrap_or_else(|| "unknown reason".into())
            ),
        }
    }
}

/// A live connection to one MCP server.
pub struct RmcpConnection {
    server: Arc<str>,
    /// Bound of a whole `tools/list`.
    list_timeout: Duration,
    transport: Transport,
    /// Sends requests into rmcp's service loop.
    peer: Peer<RoleClient>,
    ending: Arc<Ending>,
    routes: ProgressRoutes,
    tap: tap::TaskSupportTap,
    /// The streamable HTTP session (none over stdio).
    session: http::SessionSeen,
    /// Stops rmcp's service loop.
    service_ct: CancellationToken,
    /// Fired once the service loop has returned.
    service_done: CancellationToken,
    /// The child process (stdio).
    child: Option<stdio::ChildControl>,
    /// The OAuth tokens (a streamable-HTTP server with `oauth`).
    auth: Option<Arc<oauth::Authorizer>>,
}

type CallResult = Result<ToolOutput, (CallOutcome, AgentError)>;

impl RmcpConnection {
    fn mcp_error(&self, message: String) -> AgentError {
        AgentError::McpError {
            server: self.server.to_string(),
            message,
        }
    }

    /// An rmcp failure as troupe's error, with the outcome it counts as.
    fn service_error(&self, error: ServiceError) -> (CallOutcome, AgentError) {
        // A request OAuth could not authorize: say why, and what fixes it.
        if matches!(error, ServiceError::TransportSend(_))
            && let Some(failure) = self.auth.as_ref().and_then(|a| a.take_failure())
        {
            return (
                CallOutcome::ProtocolError,
                self.mcp_error(failure.to_string()),
            );
        }
        match error {
            ServiceError::McpError(data) => (
                CallOutcome::ProtocolError,
                self.mcp_error(format!("{} (JSON-RPC error {})", data.message, data.code.0)),
            ),
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                if self.ending.reason().is_some() {
                    (CallOutcome::Closed, self.ending.error())
                } else {
                    (
                        CallOutcome::Closed,
                        self.mcp_error(format!("connection closed: {error}")),
                    )
                }
            }
            other => (
                CallOutcome::ProtocolError,
                self.mcp_error(other.to_string()),
            ),
        }
    }

    /// Runs `work` unless the connection ends or `limit` passes first.
    async fn bounded<T>(
        &self,
        what: &str,
        limit: Duration,
        work: impl Future<Output = Result<T, AgentError>>,
    ) -> Result<T, AgentError> {
        if self.ending.ended.is_cancelled() {
            return Err(self.ending.error());
        }
        tokio::select! {
            biased;
            _ = self.ending.ended.cancelled() => Err(self.ending.error()),
            result = tokio::time::timeout(limit, work) => result.unwrap_or_else(|_| {
                Err(AgentError::Timeout {
                    what: format!("{what} on MCP server `{}`", self.server),
                    after_ms: millis(limit),
                })
            }),
        }
    }

    fn to_mcp_tool(&self, tool: Tool) -> McpTool {
        let name = tool.name.into_owned();
        McpTool {
            requires_task: self.tap.requires_task(&name),
            description: tool.description.map(|d| d.into_owned()).unwrap_or_default(),
            input_schema: Json(serde_json::Value::Object((*tool.input_schema).clone())),
            name,
        }
    }

    /// Tells the server a call was abandoned, without waiting for the write.
    fn send_cancelled(&self, id: RequestId, reason: &str) {
        let peer = self.peer.clone();
        let transport = self.transport;
        let server = self.server.clone();
        tracing::info!(mcp_server = %server, request_id = %id, reason, "sending notifications/cancelled");
        let params = CancelledNotificationParam::new(Some(id), Some(reason.to_owned()));
        tokio::spawn(async move {
            let sent = matches!(
                tokio::time::timeout(CANCEL_NOTICE_TIMEOUT, peer.notify_cancelled(params)).await,
                Ok(Ok(()))
            );
            if !sent {
                tracing::debug!(mcp_server = %server, "notifications/cancelled could not be sent");
            }
            metrics::cancel_notice(transport, sent);
        });
    }

    /// The MCP client attributes of a call's span: transport, protocol version, session.
    fn describe(&self, span: &tracing::Span) {
        span.record(
            "network.transport",
            match self.transport {
                Transport::Stdio => "pipe",
                Transport::StreamableHttp => "tcp",
            },
        );
        if let Some(info) = self.peer.peer_info() {
            span.record(
                "mcp.protocol.version",
                tracing::field::display(&info.protocol_version),
            );
        }
        if let Some(session) = self.session.get() {
            span.record("mcp.session.id", &*session);
        }
    }

    async fn call(&self, call: McpCall<'_>) -> CallResult {
        if self.ending.ended.is_cancelled() {
            return Err((CallOutcome::Closed, self.ending.error()));
        }
        let arguments = match &call.arguments.0 {
            serde_json::Value::Object(map) => map.clone(),
            serde_json::Value::Null => JsonObject::new(),
            _ => {
                return Err((
                    CallOutcome::ProtocolError,
                    AgentError::invalid(format!(
                        "arguments of MCP tool `{}` must be a JSON object",
                        call.tool
                    )),
                ));
            }
        };
        let mut params = CallToolRequestParams::new(call.tool.to_owned()).with_arguments(arguments);
        if let Some(traceparent) = &call.traceparent {
            params.set_traceparent(traceparent);
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let cancelled = || {
            (
                CallOutcome::Cancelled,
                AgentError::Cancelled {
                    reason: format!("MCP call `{}` cancelled", call.tool),
                },
            )
        };
        let handle = tokio::select! {
            biased;
            _ = self.ending.ended.cancelled() => return Err((CallOutcome::Closed, self.ending.error())),
            _ = call.cancel.cancelled() => return Err(cancelled()),
            handle = self.peer.send_request_with_option(request, PeerRequestOptions::no_options()) => {
                handle.map_err(|e| self.service_error(e))?
            }
        };
        let id = handle.id.clone();
        // From here the server runs the call: however this call ends without its answer (the
        // caller's future dropped, as when its conversation fails), the server is told.
        let mut unanswered = Unanswered {
            connection: self,
            id: Some(id.clone()),
        };
        call.span
            .record("jsonrpc.request.id", tracing::field::display(&id));
        // Registered in the same poll that queued the request, so before the server can
        // have seen it (let alone reported progress on it).
        let _route = call
            .progress
            .map(|sender| self.routes.register(handle.progress_token.clone(), sender));
        let response = tokio::select! {
            biased;
            _ = self.ending.ended.cancelled() => return Err((CallOutcome::Closed, self.ending.error())),
            _ = call.cancel.cancelled() => {
                // The server may never answer a cancelled call: do not wait for it.
                unanswered.id = None;
                self.send_cancelled(id, "cancelled by the client");
                return Err(cancelled());
            }
            _ = tokio::time::sleep(call.timeout) => {
                unanswered.id = None;
                self.send_cancelled(id, "timed out");
                return Err((
                    CallOutcome::Timeout,
                    AgentError::Timeout {
                        what: format!("MCP call `{}` on `{}`", call.tool, self.server),
                        after_ms: millis(call.timeout),
                    },
                ));
            }
            response = handle.await_response() => {
                unanswered.id = None;
                response.map_err(|e| self.service_error(e))?
            }
        };
        let result = match response {
            ServerResult::CallToolResult(result) => result,
            // An answer rmcp could not type: read it as a tool result if it is one.
            ServerResult::CustomResult(custom) => {
                serde_json::from_value::<CallToolResult>(custom.0).map_err(|e| {
                    (
                        CallOutcome::ProtocolError,
                        self.mcp_error(format!("unreadable tools/call result: {e}")),
                    )
                })?
            }
            other => {
                return Err((
                    CallOutcome::ProtocolError,
                    self.mcp_error(format!("unexpected answer to tools/call: {other:?}")),
                ));
            }
        };
        Ok(tool_output(result))
    }
}

#[async_trait]
impl McpConnection for RmcpConnection {
    async fn list_tools(&self) -> Result<Vec<McpTool>, AgentError> {
        let listing = async {
            let mut tools = Vec::new();
            let mut cursor = None;
            for _ in 0..MAX_TOOL_PAGES {
                let params = PaginatedRequestParams::default().with_cursor(cursor);
                let page = self
                    .peer
                    .list_tools(Some(params))
                    .await
                    .map_err(|e| self.service_error(e).1)?;
                // The page's raw bytes went past the tap before rmcp returned it.
                tools.extend(page.tools.into_iter().map(|t| self.to_mcp_tool(t)));
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => return Ok(tools),
                }
            }
            Err(self.mcp_error(format!(
                "tools/list did not end after {MAX_TOOL_PAGES} pages"
            )))
        };
        let span = tracing::debug_span!("mcp_list_tools", mcp_server = %self.server);
        self.bounded("tools/list", self.list_timeout, listing)
            .instrument(span)
            .await
    }

    async fn call_tool(&self, call: McpCall<'_>) -> Result<ToolOutput, AgentError> {
        let started = Instant::now();
        // The call's span is its `execute_tool` span: what only the connection knows goes
        // there (the MCP client attributes), rather than on a span of its own.
        let span = call.span.clone();
        self.describe(&span);
        let tool = call.tool;
        let result = self.call(call).await;
        let outcome = match &result {
            Ok(output) if output.is_error => CallOutcome::ToolError,
            Ok(_) => CallOutcome::Ok,
            Err((outcome, _)) => *outcome,
        };
        metrics::call(self.transport, outcome, started.elapsed());
        span.in_scope(|| {
            tracing::debug!(mcp_server = %self.server, tool, outcome = outcome.as_str(), "mcp call ended");
        });
        result.map_err(|(_, error)| error)
    }

    fn process_id(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.pid)
    }

    async fn close(&self) {
        self.ending
            .end("the connection was closed by the client".into());
        self.service_ct.cancel();
        if let Some(child) = &self.child
            && tokio::time::timeout(CLOSE_STEP_TIMEOUT, child.kill_and_reap())
                .await
                .is_err()
        {
            tracing::warn!(mcp_server = %self.server, "the server process was not reaped in time");
        }
        let _ = tokio::time::timeout(CLOSE_STEP_TIMEOUT, self.service_done.cancelled()).await;
    }
}

impl Drop for RmcpConnection {
    fn drop(&mut self) {
        // Without close(): stop the loop and let the supervisor kill and reap the child.
        self.ending.end("the connection was dropped".into());
        self.service_ct.cancel();
        if let Some(child) = &self.child {
            child.kill();
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A tool result as text: text parts joined with newlines, a short placeholder for every
/// other part, the structured content as JSON when there is no text.
pub(crate) fn tool_output(result: CallToolResult) -> ToolOutput {
    let mut parts = Vec::with_capacity(result.content.len() + 1);
    let mut has_text = false;
    for block in &result.content {
        match block {
            ContentBlock::Text(text) => {
                has_text = true;
                parts.push(text.text.clone());
            }
            ContentBlock::Image(image) => parts.push(format!(
                "[image {}, {} bytes base64]",
                image.mime_type,
                image.data.len()
            )),
            ContentBlock::Audio(audio) => parts.push(format!(
                "[audio {}, {} bytes base64]",
                audio.mime_type,
                audio.data.len()
            )),
            ContentBlock::Resource(embedded) => parts.push(embedded_resource(&embedded.resource)),
            ContentBlock::ResourceLink(link) => parts.push(format!("[resource link {}]", link.uri)),
            _ => parts.push("[unsupported content]".to_owned()),
        }
    }
    if !has_text && let Some(structured) = &result.structured_content {
        parts.push(structured.to_string());
    }
    ToolOutput {
        call_id: String::new(),
        output: parts.join("\n"),
        is_error: result.is_error.unwrap_or(false),
    }
}

/// An embedded resource: its URI, and its text when it has some (that is content the model
/// can read; a blob is not).
fn embedded_resource(resource: &ResourceContents) -> String {
    match resource {
        ResourceContents::TextResourceContents { uri, text, .. } => {
            format!("[resource {uri}]\n{text}")
        }
        ResourceContents::BlobResourceContents {
            uri,
            mime_type,
            blob,
            ..
        } => format!(
            "[resource {uri}, {}, {} bytes base64]",
            mime_type.as_deref().unwrap_or("application/octet-stream"),
            blob.len()
        ),
        _ => "[resource]".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(value: serde_json::Value) -> CallToolResult {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn text_parts_are_joined_with_newlines() {
        let out = tool_output(result(json!({
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
        })));
        assert_eq!(out.output, "one\ntwo");
        assert!(!out.is_error);
        assert_eq!(out.call_id, "");
    }

    #[test]
    fn other_parts_become_placeholders() {
        let out = tool_output(result(json!({
            "content": [
                {"type": "text", "text": "see:"},
                {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
                {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"},
                {"type": "resource", "resource": {"uri": "test://a", "text": "body", "mimeType": "text/plain"}},
                {"type": "resource", "resource": {"uri": "test://b", "blob": "AAAAAA=="}},
                {"type": "resource_link", "uri": "test://c", "name": "c"}
            ],
            "isError": true
        })));
        assert_eq!(
            out.output,
            "see:\n[image image/png, 8 bytes base64]\n[audio audio/wav, 4 bytes base64]\n\
             [resource test://a]\nbody\n\
             [resource test://b, application/octet-stream, 8 bytes base64]\n\
             [resource link test://c]"
        );
        assert!(out.is_error);
    }

    #[test]
    fn structured_content_stands_in_for_missing_text() {
        let out = tool_output(result(json!({
            "content": [],
            "structuredContent": {"temperature": 21}
        })));
        assert_eq!(out.output, r#"{"temperature":21}"#);
        // With text, the text is the answer.
        let out = tool_output(result(json!({
            "content": [{"type": "text", "text": "21 degrees"}],
            "structuredContent": {"temperature": 21}
        })));
        assert_eq!(out.output, "21 degrees");
    }

    #[test]
    fn an_ending_is_announced_once_and_only_when_connected() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let ending = Ending::new("srv".into(), Transport::Stdio, tx.clone());
        ending.end("early".into());
        assert!(ending.ended.is_cancelled());
        assert!(rx.try_recv().is_err());
        assert_eq!(ending.mark_connected(), Err("early".into()));

        let ending = Ending::new("srv".into(), Transport::Stdio, tx);
        ending.mark_connected().unwrap();
        ending.end("first".into());
        ending.end("second".into());
        assert_eq!(
            rx.try_recv().unwrap(),
            McpNotice::Closed {
                reason: "first".into()
            }
        );
        assert!(rx.try_recv().is_err());
        match ending.error() {
            AgentError::McpError { server, message } => {
                assert_eq!(server, "srv");
                assert_eq!(message, "connection closed: first");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
