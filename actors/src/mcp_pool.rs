//! McpPool: a session's MCP connections, shared by its conversations through views (S12, C5,
//! O5). One per session.
//!
//! Each configured server gets at most one connection per session, whatever the number of
//! conversations; a conversation sees the pool through a view (its allowlist) and its calls
//! go through per-conversation concurrency and rate limits under a session-wide cap.
//!
//! ```text
//!  view (caller's task)             McpPool actor                       spawned tasks / timers
//!  open_view ──OpenView──────────▶  check allowlist, take refs ─first ref─▶ connect + list
//!  list_tools ─ListTools─────────▶  visible tools, sorted       ◀─ServerConnected / ServerFailed
//!  call_tool ──Resolve───────────▶  route: conn + closed token  ◀─ToolsChanged / ServerClosed
//!    wait for slots + rate token, then call the connection      ◀─ToolsListed (re-listing)
//!  release / drop ─ReleaseView───▶  drop refs; last one arms    ◀─IdleTimeout / RestartDue
//!                                   the idle reclaim
//! ```
//!
//! # Mailbox protocol
//! - `OpenView` checks the allowlist (unknown servers, or tools a ready server lacks, are an
//!   `InvalidInput` naming every bad entry; entries of servers still starting are accepted),
//!   takes a reference on every server the view can see and answers at once: it never waits
//!   for a connection. Connections start lazily, on the first reference, in a spawned task; a
//!   slow server therefore delays neither a view nor any other server. When a server's tools
//!   are listed, a session event `mcp_server_ready` names it and counts its tools.
//! - `ReleaseView` drops the view's references (idempotent). A server nobody references is
//!   closed after `idle_timeout` (`IdleTimeout`, a one-shot timer); a reference taken before
//!   then disarms it. A view dropped without `release` (its conversation failed) releases
//!   itself in `Drop`.
//! - `ListTools` and `Resolve` answer from the current state: a view's tools, qualified
//!   `server__tool` and sorted (S8), or the connection a call may use.
//! - `ServerConnected` / `ServerFailed` end a connect attempt; `ServerClosed` reports a death;
//!   `ToolsChanged` starts a re-listing whose result comes back as `ToolsListed`. A dead
//!   server's waiting and running calls fail at once (its `closed` token fires) and it is
//!   restarted after `restart_backoff_base · 2^n` (capped at `restart_backoff_max`, reset by a
//!   successful connect) while views still reference it (`RestartDue`); a `mcp_server_failed`
//!   warning says why and when it retries. Tools marked `requires_task` are left out, with a
//!   log line: MCP task augmentation is not supported.
//! - `CallStarted`: a view runs a call, until the call's token fires (see *Server requests*).
//! - `Attribute`: which task a server's request belongs to, with what answering it needs.
//! - `Snapshot` (observation), `Shutdown` (closes every connection, then stops),
//!   `InjectPanic` (fault injection: fails the actor, to exercise the session's restart).
//!
//! Server names must match `[a-zA-Z0-9_-]+`, contain no `__`, not end in `_` (so that
//! `name__tool` splits one way only) and be unique; otherwise spawning fails naming each.
//!
//! The decisions (references, phases, backoff, visibility, allowlist checks) are in
//! `decide::PoolCore`, a plain struct tested with `#[test]`; every message carries the
//! generation it was started for, so late results never act on a newer connection.
//!
//! # Where calls wait
//! Nothing a call does happens in this mailbox beyond two quick lookups. The slots are tokio
//! `Semaphore`s and the rate a lock-free GCRA (see `limits`), owned by the conversation's
//! shared limiter and the session-wide semaphore that the actor hands to each view once, at
//! open; the actor never acquires or changes them. Waiting happens in the caller's task, bounded
//! by `wait_bound` (then `Overloaded` naming the limit), and ends early when the call is
//! cancelled or its connection dies. Permits are given back by `Drop`, so an aborted task never
//! leaks a slot. The call itself (with its timeout, cancellation and progress) also runs in the
//! caller's task.
//!
//! Progress notifications of a call become `tool_progress` events of the calling task (and are
//! counted in `troupe_mcp_progress_notifications_total`).
//!
//! # Server requests
//! Each connection gets a client handler: `roots/list` answers the configured workspace roots
//! (as `file://` URIs). Elicitation and sampling are attributed to the task whose call is
//! running on that server (views report each call's start and end; see `calls` for the rule,
//! and why a request is refused when calls of several tasks run there at once) and answered
//! through the session's ApprovalStore on that task's behalf (see `requests`): a human sees an
//! `approval_requested` event of that conversation and task, with the elicitation's message and
//! schema or the sampling request. Elicitation: approved → accept with content, denied →
//! decline, no answer in time or the call ended → cancel. Sampling: approved → the session's
//! model answers; otherwise a JSON-RPC error to the server. A request that cannot be
//! attributed is declined (elicitation) or refused (sampling), with a session warning
//! `mcp_request_unattributed`.
//!
//! # Children and failure
//! No child actors: connect, refresh and close work runs in spawned tasks that report back by
//! message (a connect that finishes after the pool stopped closes its own connection). When
//! the pool stops or fails, its state's `Drop` cancels every connection's `closed` token (so
//! calls in flight fail fast) and closes every connection; its views then answer `Internal`
//! ("MCP pool stopped") and say they are closed (`McpView::is_closed`). The Session starts a
//! new pool and publishes it in the session's directory; conversations open new views on it,
//! and a running task opens its own at its next call (see `task`); servers then start again
//! lazily, so a call made before its server is connected again fails as during any server
//! restart. Events and approvals are read from the directory at each use, so a restart of
//! the Rollout or the ApprovalStore needs nothing from the pool.

pub mod metrics;

mod calls;
mod decide;
mod limits;
mod requests;
mod view;

pub use self::decide::{PoolSnapshot, Route, RouteTable, ServerSnapshot, ViewId, ViewScope};
pub use self::limits::Rate;
pub use self::view::McpPoolHandle;

use self::calls::{Attribution, CallRegistry, InFlightCall};
use self::decide::{Effect, PoolCore};
use self::limits::ConversationLimiter;
use self::metrics::{Occupancy, RequestKind, RequestOutcome};
use self::requests::Requester;
use crate::approval_store::ApprovalMsg;
use crate::clock::Clock;
use crate::directory::ServiceRef;
use crate::events::{EventDraft, EventSink};
use crate::ports::{
    ElicitOutcome, McpClientHandler, McpConnection, McpConnector, McpNotice, McpServerConfig,
    McpTool, ModelClient, ToolFailure,
};
use async_trait::async_trait;
use ractor::{Actor, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;
use troupe_proto::{AgentError, ConversationId, EventKind, ToolSpec, WarningCode};

/// How long a call may outlive its own `call_timeout` before the pool stops waiting for the
/// connection to report the timeout itself.
const CALL_TIMEOUT_GRACE: Duration = Duration::from_secs(1);
/// How long `Shutdown` waits for connections to close.
const SHUTDOWN_CLOSE_BOUND: Duration = Duration::from_secs(5);

/// Limits and timings of a pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct McpLimits {
    /// How long a connection nobody references stays open (a view reopened meanwhile keeps
    /// it).
    pub idle_timeout: Duration,
    /// First restart delay after a death or failed connect; doubles per consecutive failure.
    pub restart_backoff_base: Duration,
    pub restart_backoff_max: Duration,
    /// Calls of one conversation in flight at once (>= 1).
    pub per_conversation_concurrency: usize,
    /// Calls of one conversation per second, with a burst; `None` = unlimited.
    pub per_conversation_rate: Option<Rate>,
    /// Calls of the whole session in flight at once (>= 1).
    pub session_concurrency: usize,
    /// How long a call may wait for its slots and rate token before `Overloaded`.
    pub wait_bound: Duration,
    /// How long one call may run.
    pub call_timeout: Duration,
    /// How long a connect (handshake and first listing) may take before it counts as failed.
    pub connect_timeout: Duration,
}

impl Default for McpLimits {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_secs(60),
            restart_backoff_base: Duration::from_millis(500),
            restart_backoff_max: Duration::from_secs(30),
            per_conversation_concurrency: 4,
            per_conversation_rate: Some(Rate {
                per_second: 10.0,
                burst: 20,
            }),
            session_concurrency: 16,
            wait_bound: Duration::from_secs(30),
            call_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(30),
        }
    }
}

impl McpLimits {
    /// Checks the limits; the error names every bad one.
    pub fn validate(&self) -> Result<(), AgentError> {
        let mut problems = Vec::new();
        if self.per_conversation_concurrency == 0 {
            problems.push("per_conversation_concurrency must be at least 1");
        }
        if self.session_concurrency == 0 {
            problems.push("session_concurrency must be at least 1");
        }
        if let Some(rate) = self.per_conversation_rate {
            if !(rate.per_second.is_finite() && rate.per_second > 0.0) {
                problems.push("per_conversation_rate.per_second must be a positive number");
            }
            if rate.burst == 0 {
                problems.push("per_conversation_rate.burst must be at least 1");
            }
        }
        if self.restart_backoff_base.is_zero() {
            problems.push("restart_backoff_base must be positive");
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(AgentError::invalid(format!(
                "invalid MCP limits: {}",
                problems.join("; ")
            )))
        }
    }
}

/// Start-up arguments.
pub struct McpPoolArgs {
    /// The session's servers; names must be legal and unique.
    pub servers: Vec<McpServerConfig>,
    pub connector: Arc<dyn McpConnector>,
    /// Where `mcp_server_ready`, `tool_progress` and `mcp_server_failed` events go.
    pub events: Option<EventSink>,
    pub limits: McpLimits,
    pub clock: Clock,
    /// Workspace roots offered to servers (`roots/list`): absolute paths or URIs.
    pub roots: Vec<String>,
    /// Where servers' elicitation and sampling requests are approved (the session's current
    /// ApprovalStore); `None` declines them.
    pub approvals: Option<ServiceRef<ApprovalMsg>>,
    /// The model that answers approved sampling requests; `None` refuses them.
    pub model: Option<Arc<dyn ModelClient>>,
}

/// What one conversation's views share.
struct SharedLimiter {
    limiter: Arc<ConversationLimiter>,
    views: usize,
}

/// The actor's state.
pub struct McpPoolState {
    core: PoolCore,
    connector: Arc<dyn McpConnector>,
    events: Option<EventSink>,
    limits: McpLimits,
    clock: Clock,
    /// `file://` URIs answered to `roots/list`.
    roots: Arc<[String]>,
    /// The session-wide call slots; handed to every view, never acquired here.
    session_slots: Arc<Semaphore>,
    /// Each conversation's limiter, kept while it has an open view so that all its views
    /// share one.
    conversations: HashMap<ConversationId, SharedLimiter>,
    /// The armed timer (idle reclaim or restart; never both) of each server.
    timers: HashMap<String, JoinHandle<Result<(), MessagingErr<McpPoolMsg>>>>,
    occupancy: Occupancy,
    /// Calls in flight per server, to attribute servers' requests.
    calls: CallRegistry,
    approvals: Option<ServiceRef<ApprovalMsg>>,
    model: Option<Arc<dyn ModelClient>>,
    /// The routes views resolve calls against, republished after every change.
    routes: watch::Sender<Arc<RouteTable>>,
}

impl Drop for McpPoolState {
    fn drop(&mut self) {
        // Stopped or failed: no connection may outlive the pool, and waiting calls must end.
        for (_, timer) in self.timers.drain() {
            timer.abort();
        }
        let closes: Vec<Arc<dyn McpConnection>> = self
            .core
            .shutdown()
            .into_iter()
            .filter_map(|fx| match fx {
                Effect::Close { conn, reason, .. } => {
                    metrics::closed(reason);
                    Some(conn)
                }
                _ => None,
            })
            .collect();
        if !closes.is_empty()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                futures::future::join_all(closes.iter().map(|c| c.close())).await;
            });
        }
        self.occupancy.publish([], 0);
    }
}

/// What `OpenView` hands a new view.
pub struct ViewGrant {
    pub view_id: ViewId,
    limiter: Arc<ConversationLimiter>,
    session: Arc<Semaphore>,
    limits: McpLimits,
    scope: ViewScope,
    routes: watch::Receiver<Arc<RouteTable>>,
}

/// The McpPool's mailbox.
pub enum McpPoolMsg {
    /// Opens a conversation's view (allowlist of qualified names, `None` = every tool).
    OpenView {
        conversation_id: ConversationId,
        allowlist: Option<Vec<String>>,
        reply: RpcReplyPort<Result<ViewGrant, AgentError>>,
    },
    /// Drops a view's references. Idempotent.
    ReleaseView { view_id: ViewId },
    /// The tools a view sees.
    ListTools {
        view_id: ViewId,
        reply: RpcReplyPort<Result<Vec<ToolSpec>, AgentError>>,
    },
    /// Where a call of qualified `name` goes, if the view may make it.
    Resolve {
        view_id: ViewId,
        name: String,
        reply: RpcReplyPort<Result<Route, ToolFailure>>,
    },
    /// A connect attempt succeeded and listed the server's tools.
    ServerConnected {
        server: String,
        generation: u64,
        conn: Arc<dyn McpConnection>,
        tools: Vec<McpTool>,
    },
    /// A connect attempt failed.
    ServerFailed {
        server: String,
        generation: u64,
        error: AgentError,
    },
    /// A connection ended.
    ServerClosed {
        server: String,
        generation: u64,
        reason: String,
    },
    /// A server said its tools changed.
    ToolsChanged { server: String, generation: u64 },
    /// A re-listing finished.
    ToolsListed {
        server: String,
        generation: u64,
        seq: u64,
        result: Result<Vec<McpTool>, AgentError>,
    },
    /// Timer: the idle reclaim of `server` is due.
    IdleTimeout { server: String, epoch: u64 },
    /// Timer: the restart of `server` is due.
    RestartDue { server: String, generation: u64 },
    /// A view started a call on `server`.
    CallStarted { server: String, call: InFlightCall },
    /// Which task a request of `server` belongs to, and what answering it needs.
    Attribute {
        server: String,
        kind: RequestKind,
        reply: RpcReplyPort<Result<Requester, AgentError>>,
    },
    /// Observation.
    Snapshot { reply: RpcReplyPort<PoolSnapshot> },
    /// Closes every connection (waiting a bounded time), answers, stops.
    Shutdown { reply: RpcReplyPort<()> },
    /// Fault injection: panics inside `handle`, to exercise the session's restart of the pool.
    InjectPanic,
}

/// The McpPool actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct McpPool;

#[ractor::async_trait]
impl Actor for McpPool {
    type Msg = McpPoolMsg;
    type State = McpPoolState;
    type Arguments = McpPoolArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: McpPoolArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        args.limits.validate()?;
        let roots = decide::root_uris(&args.roots)?;
        let core = PoolCore::new(
            args.servers,
            args.limits.restart_backoff_base,
            args.limits.restart_backoff_max,
        )?;
        Ok(McpPoolState {
            core,
            connector: args.connector,
            events: args.events,
            limits: args.limits,
            clock: args.clock,
            roots: roots.into(),
            session_slots: Arc::new(Semaphore::new(args.limits.session_concurrency)),
            conversations: HashMap::new(),
            timers: HashMap::new(),
            occupancy: Occupancy::default(),
            calls: CallRegistry::default(),
            approvals: args.approvals,
            model: args.model,
            routes: watch::Sender::new(Arc::new(RouteTable::default())),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let reroute = changes_routes(&msg);
        match msg {
            McpPoolMsg::OpenView {
                conversation_id,
                allowlist,
                reply,
            } => state.open_view(&myself, conversation_id, allowlist, reply),
            McpPoolMsg::ReleaseView { view_id } => state.release_view(&myself, view_id),
            McpPoolMsg::ListTools { view_id, reply } => {
                let _ = reply.send(state.core.list_tools(view_id));
            }
            McpPoolMsg::Resolve {
                view_id,
                name,
                reply,
            } => {
                let route = state.core.resolve(view_id, &name).map(|mut route| {
                    route.events = state.events.clone();
                    route
                });
                let _ = reply.send(route);
            }
            McpPoolMsg::ServerConnected {
                server,
                generation,
                conn,
                tools,
            } => {
                let fx = state.core.connected(&server, generation, conn, tools);
                state.apply(&myself, fx);
            }
            McpPoolMsg::ServerFailed {
                server,
                generation,
                error,
            } => {
                let fx = state
                    .core
                    .connect_failed(&server, generation, error.to_string());
                state.apply(&myself, fx);
            }
            McpPoolMsg::ServerClosed {
                server,
                generation,
                reason,
            } => {
                let fx = state.core.closed(&server, generation, reason);
                state.apply(&myself, fx);
            }
            McpPoolMsg::ToolsChanged { server, generation } => {
                let fx = state.core.tools_changed(&server, generation);
                state.apply(&myself, fx);
            }
            McpPoolMsg::ToolsListed {
                server,
                generation,
                seq,
                result,
            } => state.tools_listed(&server, generation, seq, result),
            McpPoolMsg::IdleTimeout { server, epoch } => {
                let fx = state.core.idle_timeout(&server, epoch);
                state.apply(&myself, fx);
            }
            McpPoolMsg::RestartDue { server, generation } => {
                let fx = state.core.restart_due(&server, generation);
                state.apply(&myself, fx);
            }
            McpPoolMsg::CallStarted { server, call } => state.calls.started(&server, call),
            McpPoolMsg::Attribute {
                server,
                kind,
                reply,
            } => {
                let _ = reply.send(state.attribute(server, kind));
            }
            McpPoolMsg::Snapshot { reply } => {
                let _ = reply.send(state.core.snapshot());
            }
            McpPoolMsg::Shutdown { reply } => state.shutdown(&myself, reply),
            McpPoolMsg::InjectPanic => panic!("injected fault in the MCP pool"),
        }
        if reroute {
            state.publish_routes();
        }
        Ok(())
    }
}

/// Whether handling `msg` may change which connection a tool's calls go to (or the sink of
/// their progress events): then the route table is published again.
fn changes_routes(msg: &McpPoolMsg) -> bool {
    matches!(
        msg,
        McpPoolMsg::ServerConnected { .. }
            | McpPoolMsg::ServerFailed { .. }
            | McpPoolMsg::ServerClosed { .. }
            | McpPoolMsg::ToolsChanged { .. }
            | McpPoolMsg::ToolsListed { .. }
            | McpPoolMsg::IdleTimeout { .. }
            | McpPoolMsg::RestartDue { .. }
            | McpPoolMsg::ReleaseView { .. }
            | McpPoolMsg::Shutdown { .. }
    )
}

impl McpPoolState {
    fn publish_routes(&self) {
        let table = self.core.route_table().with_events(self.events.as_ref());
        tracing::trace!(routes = table.len(), "MCP routes published");
        self.routes.send_replace(Arc::new(table));
    }

    fn open_view(
        &mut self,
        myself: &ActorRef<McpPoolMsg>,
        conversation_id: ConversationId,
        allowlist: Option<Vec<String>>,
        reply: RpcReplyPort<Result<ViewGrant, AgentError>>,
    ) {
        let (view_id, fx) = match self.core.open_view(conversation_id, allowlist) {
            Ok(opened) => opened,
            Err(error) => {
                tracing::info!(%conversation_id, %error, "MCP view refused");
                let _ = reply.send(Err(error));
                return;
            }
        };
        let limits = self.limits;
        let shared = self
            .conversations
            .entry(conversation_id)
            .or_insert_with(|| SharedLimiter {
                limiter: Arc::new(ConversationLimiter::new(&limits)),
                views: 0,
            });
        shared.views += 1;
        let grant = ViewGrant {
            view_id,
            limiter: shared.limiter.clone(),
            session: self.session_slots.clone(),
            limits,
            scope: self.core.view_scope(view_id).unwrap_or_default(),
            routes: self.routes.subscribe(),
        };
        tracing::debug!(%conversation_id, %view_id, "MCP view opened");
        self.apply(myself, fx);
        if reply.send(Ok(grant)).is_err() {
            // The caller gave up: nobody will ever release this view.
            self.release_view(myself, view_id);
        }
    }

    fn release_view(&mut self, myself: &ActorRef<McpPoolMsg>, view_id: ViewId) {
        let Some((conversation_id, fx)) = self.core.release_view(view_id) else {
            return;
        };
        if let Some(shared) = self.conversations.get_mut(&conversation_id) {
            shared.views = shared.views.saturating_sub(1);
            if shared.views == 0 {
                self.conversations.remove(&conversation_id);
            }
        }
        tracing::debug!(%conversation_id, %view_id, "MCP view released");
        self.apply(myself, fx);
    }

    /// Who a server's request belongs to (see `calls`); an error says why nobody does.
    fn attribute(&mut self, server: String, kind: RequestKind) -> Result<Requester, AgentError> {
        let attribution = self.calls.attribute(&server);
        let refuse = |server: String, message: String| {
            metrics::server_request(kind, RequestOutcome::Unattributed);
            tracing::warn!(server, kind = kind.as_str(), %message, "MCP request refused");
            self.warn(
                WarningCode::McpRequestUnattributed,
                format!("MCP server `{server}`: {message}"),
            );
            Err(AgentError::McpError { server, message })
        };
        match attribution {
            Attribution::Call(call) => {
                tracing::debug!(
                    server,
                    kind = kind.as_str(),
                    in_flight = self.calls.len(),
                    conversation_id = %call.conversation_id,
                    task_id = %call.task_id,
                    "MCP request attributed"
                );
                Ok(Requester {
                    server,
                    call,
                    approvals: self.approvals.clone(),
                    model: self.model.clone(),
                })
            }
            Attribution::NoCall => refuse(
                server,
                format!(
                    "its {} request came while none of its tool calls was running; nobody can answer it",
                    kind.as_str()
                ),
            ),
            Attribution::Ambiguous { tasks } => refuse(
                server,
                format!(
                    "its {} request came while {tasks} tasks had tool calls running on it; it cannot be tied to one of them",
                    kind.as_str()
                ),
            ),
        }
    }

    fn tools_listed(
        &mut self,
        server: &str,
        generation: u64,
        seq: u64,
        result: Result<Vec<McpTool>, AgentError>,
    ) {
        match result {
            Ok(tools) => {
                if let Some(count) = self.core.tools_listed(server, generation, seq, tools) {
                    tracing::info!(server, tools = count, "MCP tools changed");
                }
            }
            Err(error) => {
                tracing::warn!(server, %error, "MCP tools could not be listed again; keeping the previous list");
            }
        }
    }

    fn shutdown(&mut self, myself: &ActorRef<McpPoolMsg>, reply: RpcReplyPort<()>) {
        let mut closes = Vec::new();
        for fx in self.core.shutdown() {
            if let Effect::Close { conn, reason, .. } = fx {
                metrics::closed(reason);
                closes.push(conn);
            }
        }
        for (_, timer) in self.timers.drain() {
            timer.abort();
        }
        tracing::info!(connections = closes.len(), "MCP pool shutting down");
        tokio::spawn(async move {
            let all = futures::future::join_all(closes.iter().map(|c| c.close()));
            let _ = tokio::time::timeout(SHUTDOWN_CLOSE_BOUND, all).await;
            let _ = reply.send(());
        });
        myself.stop(Some("shutdown".into()));
    }

    /// Carries out the effects of a transition.
    fn apply(&mut self, myself: &ActorRef<McpPoolMsg>, fx: Vec<Effect>) {
        for effect in fx {
            match effect {
                Effect::Connect {
                    server,
                    generation,
                    config,
                } => self.spawn_connect(myself, server, generation, config),
                Effect::ScheduleIdle { server, epoch } => {
                    let name = server.clone();
                    let timer = myself.send_after(self.limits.idle_timeout, move || {
                        McpPoolMsg::IdleTimeout {
                            server: name,
                            epoch,
                        }
                    });
                    self.arm(server, timer);
                }
                Effect::ScheduleRestart {
                    server,
                    generation,
                    delay,
                } => {
                    metrics::server_restart(&server);
                    let name = server.clone();
                    let timer = myself.send_after(delay, move || McpPoolMsg::RestartDue {
                        server: name,
                        generation,
                    });
                    self.arm(server, timer);
                }
                Effect::CancelTimer { server } => {
                    if let Some(timer) = self.timers.remove(&server) {
                        timer.abort();
                    }
                }
                Effect::Close {
                    server,
                    conn,
                    reason,
                } => {
                    tracing::info!(server, reason = reason.as_str(), "MCP connection closed");
                    metrics::closed(reason);
                    tokio::spawn(async move { conn.close().await });
                }
                Effect::Refresh {
                    server,
                    generation,
                    seq,
                    conn,
                } => {
                    let me = myself.clone();
                    let bound = self.limits.connect_timeout;
                    tokio::spawn(async move {
                        let result = match tokio::time::timeout(bound, conn.list_tools()).await {
                            Ok(result) => result,
                            Err(_) => Err(AgentError::timeout("listing MCP tools", bound)),
                        };
                        let _ = me.cast(McpPoolMsg::ToolsListed {
                            server,
                            generation,
                            seq,
                            result,
                        });
                    });
                }
                Effect::Ready { server, tools } => {
                    tracing::info!(
                        server,
                        tools,
                        at_ms = self.clock.now_ms(),
                        "MCP server ready"
                    );
                    if let Some(events) = &self.events {
                        events.emit(EventDraft::session(EventKind::McpServerReady {
                            server,
                            tools: u32::try_from(tools).unwrap_or(u32::MAX),
                        }));
                    }
                }
                Effect::Failed {
                    server,
                    reason,
                    retry_in,
                } => {
                    let message = match retry_in {
                        Some(delay) => format!(
                            "MCP server `{server}` failed: {reason}; restarting in {delay:?}"
                        ),
                        None => format!(
                            "MCP server `{server}` failed: {reason}; no view uses it, not restarting"
                        ),
                    };
                    tracing::warn!(server, %reason, ?retry_in, "MCP server failed");
                    self.warn(WarningCode::McpServerFailed, message);
                }
            }
        }
        self.occupancy
            .publish(self.core.connected_servers(), self.core.views_len());
    }

    fn arm(&mut self, server: String, timer: JoinHandle<Result<(), MessagingErr<McpPoolMsg>>>) {
        if let Some(old) = self.timers.insert(server, timer) {
            old.abort();
        }
    }

    fn warn(&self, code: WarningCode, message: String) {
        if let Some(events) = &self.events {
            events.emit(EventDraft::session(EventKind::Warning { code, message }));
        }
    }

    /// Connects and lists in a task; then forwards the connection's notices as messages.
    fn spawn_connect(
        &self,
        myself: &ActorRef<McpPoolMsg>,
        server: String,
        generation: u64,
        config: McpServerConfig,
    ) {
        let connector = self.connector.clone();
        let handler: Arc<dyn McpClientHandler> = Arc::new(PoolClient {
            server: server.clone(),
            roots: self.roots.clone(),
            pool: myself.clone(),
        });
        let bound = self.limits.connect_timeout;
        let me = myself.clone();
        // A trace of its own: the connection outlives whatever caused it to start.
        let span = tracing::info_span!(parent: None, "mcp_connect", server = %server, generation);
        tracing::info!(parent: &span, "MCP server connecting");
        tokio::spawn(
            async move {
                // Notices sent during the handshake wait in the channel until forwarded.
                let (tx, rx) = mpsc::unbounded_channel();
                match connect_and_list(connector.as_ref(), &config, handler, tx, bound).await {
                    Ok((conn, tools)) => {
                        metrics::connect(true);
                        let sent = me.cast(McpPoolMsg::ServerConnected {
                            server: server.clone(),
                            generation,
                            conn: conn.clone(),
                            tools,
                        });
                        if sent.is_err() {
                            conn.close().await; // the pool is gone
                            return;
                        }
                        drop(conn);
                        forward_notices(rx, &me, &server, generation).await;
                    }
                    Err(error) => {
                        metrics::connect(false);
                        let _ = me.cast(McpPoolMsg::ServerFailed {
                            server,
                            generation,
                            error,
                        });
                    }
                }
            }
            .instrument(span),
        );
    }
}

/// Handshake then first listing, within `bound` in all; a connection whose listing fails is
/// closed here.
async fn connect_and_list(
    connector: &dyn McpConnector,
    config: &McpServerConfig,
    handler: Arc<dyn McpClientHandler>,
    notices: mpsc::UnboundedSender<McpNotice>,
    bound: Duration,
) -> Result<(Arc<dyn McpConnection>, Vec<McpTool>), AgentError> {
    let deadline = Instant::now() + bound;
    let timed_out =
        || AgentError::timeout(format!("connecting to MCP server `{}`", config.name), bound);
    let conn = tokio::time::timeout_at(deadline, connector.connect(config, handler, notices))
        .await
        .map_err(|_| timed_out())??;
    match tokio::time::timeout_at(deadline, conn.list_tools()).await {
        Ok(Ok(tools)) => Ok((conn, tools)),
        Ok(Err(error)) => {
            conn.close().await;
            Err(error)
        }
        Err(_) => {
            conn.close().await;
            Err(timed_out())
        }
    }
}

/// Turns a connection's notices into messages until it closes.
async fn forward_notices(
    mut rx: mpsc::UnboundedReceiver<McpNotice>,
    me: &ActorRef<McpPoolMsg>,
    server: &str,
    generation: u64,
) {
    loop {
        let msg = match rx.recv().await {
            Some(McpNotice::ToolsChanged) => McpPoolMsg::ToolsChanged {
                server: server.to_owned(),
                generation,
            },
            Some(McpNotice::Progress { progress, .. }) => {
                // Progress outside any call that asked for it: nothing to attach it to.
                tracing::debug!(server, progress, "MCP progress without a call");
                continue;
            }
            Some(McpNotice::Closed { reason }) => McpPoolMsg::ServerClosed {
                server: server.to_owned(),
                generation,
                reason,
            },
            None => McpPoolMsg::ServerClosed {
                server: server.to_owned(),
                generation,
                reason: "the connection went away".into(),
            },
        };
        let last = matches!(msg, McpPoolMsg::ServerClosed { .. });
        if me.cast(msg).is_err() || last {
            return;
        }
    }
}

/// Answers one server's requests to the client.
struct PoolClient {
    server: String,
    roots: Arc<[String]>,
    /// Attributes elicitation and sampling requests to a task.
    pool: ActorRef<McpPoolMsg>,
}

impl PoolClient {
    async fn requester(&self, kind: RequestKind) -> Result<Requester, AgentError> {
        ractor::call!(self.pool, |reply| McpPoolMsg::Attribute {
            server: self.server.clone(),
            kind,
            reply,
        })
        .map_err(|e| AgentError::McpError {
            server: self.server.clone(),
            message: format!("the MCP pool is gone: {e}"),
        })?
    }
}

#[async_trait]
impl McpClientHandler for PoolClient {
    async fn list_roots(&self) -> Vec<String> {
        self.roots.to_vec()
    }

    async fn elicit(
        &self,
        message: String,
        schema: troupe_proto::Json,
    ) -> Result<troupe_proto::Json, AgentError> {
        match self.elicit_outcome(message, schema).await {
            ElicitOutcome::Accept(content) => Ok(content),
            ElicitOutcome::Decline => Err(AgentError::ApprovalDenied {
                command: requests::mcp_command(&self.server, RequestKind::Elicitation),
                reason: "the elicitation was declined".into(),
            }),
            ElicitOutcome::Cancel => Err(AgentError::cancelled("the elicitation was cancelled")),
        }
    }

    async fn elicit_outcome(&self, message: String, schema: troupe_proto::Json) -> ElicitOutcome {
        match self.requester(RequestKind::Elicitation).await {
            Ok(requester) => requests::elicit(&requester, message, schema).await,
            Err(_) => ElicitOutcome::Decline,
        }
    }

    async fn sample(&self, request: troupe_proto::Json) -> Result<troupe_proto::Json, AgentError> {
        let requester = self.requester(RequestKind::Sampling).await?;
        requests::sample(&requester, request).await
    }
}

#[cfg(test)]
mod tests;
