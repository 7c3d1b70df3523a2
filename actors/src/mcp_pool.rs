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
//! - `Refresh` (a conversation's set-context with `refresh_mcp`): every server the view
//!   references is read again: a ready one is listed again (as on `ToolsChanged`), one
//!   waiting to restart starts now (its pending restart timer is then stale). Idle and
//!   connecting servers are left as they are: their tools come with their connect.
//! - `CallStarted`: a view runs a call, until the call's token fires (see *Server requests*);
//!   `CallEnded`: it fired, the call is forgotten.
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
mod config;
mod connect;
mod decide;
mod effects;
mod limits;
mod requests;
mod view;

pub use self::config::McpLimits;
pub use self::decide::{Check, PoolSnapshot, Route, RouteTable, ServerSnapshot, ViewId, ViewScope};
pub use self::limits::Rate;
pub use self::view::McpPoolHandle;

use self::calls::{Attribution, CallRegistry, InFlightCall};
use self::connect::*;
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
        /// How strictly the allowlist is checked.
        check: Check,
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
    /// A view asked for its tools to be read again (C6): its ready servers are listed again,
    /// its servers waiting to restart start now.
    Refresh { view_id: ViewId },
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
    /// A call's token fired (it ended): the pool forgets it.
    CallEnded { server: String, key: u64 },
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
        metrics::servers_configured(args.servers.iter().map(|s| s.name.as_str()));
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
                check,
                reply,
            } => state.open_view(&myself, conversation_id, (allowlist, check), reply),
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
                let fx = state.core.connected(
                    &server,
                    generation,
                    conn,
                    tools,
                    tokio::time::Instant::now(),
                );
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
                let fx =
                    state
                        .core
                        .closed(&server, generation, reason, tokio::time::Instant::now());
                state.apply(&myself, fx);
            }
            McpPoolMsg::ToolsChanged { server, generation } => {
                let fx = state.core.tools_changed(&server, generation);
                state.apply(&myself, fx);
            }
            McpPoolMsg::Refresh { view_id } => {
                let fx = state.core.refresh(view_id);
                state.apply(&myself, fx);
            }
            McpPoolMsg::ToolsListed {
                server,
                generation,
                seq,
                result,
            } => state.tools_listed(&server, generation, seq, result),
            McpPoolMsg::IdleTimeout { server, epoch } => {
                let fx = state
                    .core
                    .idle_timeout(&server, epoch, tokio::time::Instant::now());
                state.apply(&myself, fx);
            }
            McpPoolMsg::RestartDue { server, generation } => {
                let fx = state.core.restart_due(&server, generation);
                state.apply(&myself, fx);
            }
            McpPoolMsg::CallStarted { server, call } => {
                // Forgotten when it ends, not at the next call to its server.
                let (ended, key, me) = (call.cancel.clone(), call.key, myself.clone());
                let watched = server.clone();
                tokio::spawn(async move {
                    ended.cancelled().await;
                    let _ = me.cast(McpPoolMsg::CallEnded {
                        server: watched,
                        key,
                    });
                });
                state.calls.started(&server, call);
            }
            McpPoolMsg::CallEnded { server, key } => state.calls.ended(&server, key),
            McpPoolMsg::Attribute {
                server,
                kind,
                reply,
            } => {
                let _ = reply.send(state.attribute(server, kind));
            }
            McpPoolMsg::Snapshot { reply } => {
                let _ = reply.send(PoolSnapshot {
                    calls_held: state.calls.held(),
                    ..state.core.snapshot()
                });
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
        (allowlist, check): (Option<Vec<String>>, Check),
        reply: RpcReplyPort<Result<ViewGrant, AgentError>>,
    ) {
        let (view_id, fx) = match self
            .core
            .open_view_checked(conversation_id, allowlist, check)
        {
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
}

#[cfg(test)]
mod tests;

// A message of actors on this process only (see `local_message!`).
crate::local_message!(McpPoolMsg);
