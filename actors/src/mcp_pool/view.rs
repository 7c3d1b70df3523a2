//! The pool's handle (`McpPort`) and its views (`McpView`): what a Conversation holds. A view
//! asks the pool actor only for lookups (its tools, the route of a call) and tells it when a
//! call starts and ends (so a server's requests can be attributed to its task); slots, rate
//! tokens and the call itself are waited for here, in the caller's task. A call's progress
//! notifications become `tool_progress` events of its task.

use super::calls::{InFlightCall, next_key};
use super::limits::{self, ConversationLimiter};
use super::{
    CALL_TIMEOUT_GRACE, Check, McpLimits, McpPool, McpPoolArgs, McpPoolMsg, PoolSnapshot, Route,
    RouteTable, ViewId, ViewScope, decide, metrics,
};
use crate::events::{EventDraft, EventSink};
use crate::ports::{McpCall, McpNotice, McpPort, McpView, ToolCallContext, ToolFailure};
use async_trait::async_trait;
use ractor::{Actor, ActorCell, ActorRef, ActorStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use troupe_proto::{AgentError, ConversationId, EventKind, ToolCall, ToolOutput, ToolSpec};

/// A session's pool as its conversations see it. Cheap to clone.
#[derive(Clone)]
pub struct McpPoolHandle {
    actor: ActorRef<McpPoolMsg>,
}

impl std::fmt::Debug for McpPoolHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpPoolHandle")
            .field("actor", &self.actor.get_id())
            .finish()
    }
}

impl McpPoolHandle {
    /// Starts a pool (linked to `supervisor` when given). Illegal or repeated server names,
    /// bad limits or relative roots are an `InvalidInput` naming each.
    pub async fn spawn(
        args: McpPoolArgs,
        supervisor: Option<ActorCell>,
    ) -> Result<(Self, JoinHandle<()>), AgentError> {
        decide::validate_servers(&args.servers)?;
        args.limits.validate()?;
        decide::root_uris(&args.roots)?;
        let spawned = match supervisor {
            Some(sup) => Actor::spawn_linked(None, McpPool, args, sup).await,
            None => Actor::spawn(None, McpPool, args).await,
        };
        let (actor, join) =
            spawned.map_err(|e| AgentError::internal(format!("MCP pool did not start: {e}")))?;
        Ok((Self { actor }, join))
    }

    /// A handle on a running pool.
    pub fn new(actor: ActorRef<McpPoolMsg>) -> Self {
        Self { actor }
    }

    pub fn actor(&self) -> &ActorRef<McpPoolMsg> {
        &self.actor
    }

    /// The pool's servers and views.
    pub async fn snapshot(&self) -> Result<PoolSnapshot, AgentError> {
        ractor::call!(self.actor, |reply| McpPoolMsg::Snapshot { reply }).map_err(pool_gone)
    }

    /// Closes every connection and stops the pool.
    pub async fn shutdown(&self) {
        let _ = ractor::call!(self.actor, |reply| McpPoolMsg::Shutdown { reply });
    }
}

fn pool_gone<E: std::fmt::Display>(e: E) -> AgentError {
    AgentError::internal(format!("MCP pool stopped: {e}"))
}

#[async_trait]
impl McpPort for McpPoolHandle {
    async fn open_view(
        &self,
        conversation_id: ConversationId,
        allowlist: Option<&[String]>,
    ) -> Result<Arc<dyn McpView>, AgentError> {
        self.view_of(conversation_id, allowlist, Check::Strict)
            .await
    }

    async fn reopen_view(
        &self,
        conversation_id: ConversationId,
        allowlist: Option<&[String]>,
    ) -> Result<Arc<dyn McpView>, AgentError> {
        self.view_of(conversation_id, allowlist, Check::AcceptedBefore)
            .await
    }
}

impl McpPoolHandle {
    async fn view_of(
        &self,
        conversation_id: ConversationId,
        allowlist: Option<&[String]>,
        check: Check,
    ) -> Result<Arc<dyn McpView>, AgentError> {
        let allowlist = allowlist.map(<[String]>::to_vec);
        let grant = ractor::call!(self.actor, |reply| McpPoolMsg::OpenView {
            conversation_id,
            allowlist,
            check,
            reply,
        })
        .map_err(pool_gone)??;
        Ok(Arc::new(PoolView {
            id: grant.view_id,
            actor: self.actor.clone(),
            limiter: grant.limiter,
            session: grant.session,
            limits: grant.limits,
            scope: grant.scope,
            routes: grant.routes,
            released: AtomicBool::new(false),
        }))
    }
}

/// One conversation's view onto the pool.
struct PoolView {
    id: ViewId,
    actor: ActorRef<McpPoolMsg>,
    limiter: Arc<ConversationLimiter>,
    session: Arc<Semaphore>,
    limits: McpLimits,
    /// What this view may call, and the pool's published routes: a visible tool of a ready
    /// server is called without asking the actor.
    scope: ViewScope,
    routes: watch::Receiver<Arc<RouteTable>>,
    /// Set by the first `release` (or `Drop`), so references are given back once.
    released: AtomicBool,
}

impl Drop for PoolView {
    fn drop(&mut self) {
        // A conversation that failed never called `release`: give the references back anyway.
        if !self.released.swap(true, Ordering::AcqRel) {
            let _ = self
                .actor
                .cast(McpPoolMsg::ReleaseView { view_id: self.id });
        }
    }
}

#[async_trait]
impl McpView for PoolView {
    async fn list_tools(&self) -> Result<Vec<ToolSpec>, AgentError> {
        ractor::call!(self.actor, |reply| McpPoolMsg::ListTools {
            view_id: self.id,
            reply,
        })
        .map_err(pool_gone)?
    }

    async fn call_tool(
        &self,
        call: &ToolCall,
        ctx: ToolCallContext<'_>,
    ) -> Result<ToolOutput, ToolFailure> {
        let started = Instant::now();
        // No span of its own: the call's `execute_tool` span (`ctx.span`) gets the MCP
        // attributes, as the MCP conventions advise when a GenAI span covers the call.
        let result = self.call(call, ctx).instrument(ctx.span.clone()).await;
        let outcome = metrics::outcome(&result);
        metrics::call_finished(outcome, started.elapsed());
        ctx.span.in_scope(|| {
            tracing::debug!(
                outcome,
                view = %self.id,
                took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                "MCP call finished"
            );
        });
        result
    }

    async fn release(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            let _ = self
                .actor
                .cast(McpPoolMsg::ReleaseView { view_id: self.id });
        }
    }

    async fn refresh(&self) {
        let _ = self.actor.cast(McpPoolMsg::Refresh { view_id: self.id });
    }

    fn is_closed(&self) -> bool {
        self.actor.get_status() >= ActorStatus::Stopping
    }
}

impl PoolView {
    /// The route of a call: from the published table when the tool is visible and its
    /// connection open; otherwise the actor decides (and names the error).
    async fn resolve(&self, name: &str) -> Result<Route, ToolFailure> {
        if !self.released.load(Ordering::Acquire) {
            let table = self.routes.borrow().clone();
            if let Some(route) = table.fast_route(&self.scope, name) {
                return Ok(route.clone());
            }
        }
        ractor::call!(self.actor, |reply| McpPoolMsg::Resolve {
            view_id: self.id,
            name: name.to_owned(),
            reply,
        })
        .map_err(|e| ToolFailure::from(pool_gone(e)))?
    }

    async fn call(
        &self,
        call: &ToolCall,
        ctx: ToolCallContext<'_>,
    ) -> Result<ToolOutput, ToolFailure> {
        let route = self.resolve(&call.name).await?;
        ctx.span.record("troupe.mcp.server", route.server.as_str());
        let _slots = limits::admit(
            &self.limiter,
            &self.session,
            &self.limits,
            &route.server,
            &route.closed,
            ctx.cancel,
        )
        .await?;
        // A child token: the pool cancels it when it gives up on the call, without touching
        // the task's own token.
        let cancel = ctx.cancel.child_token();
        let sent = tokio::time::Instant::now();
        let _registered = Registration::start(
            &self.actor,
            &route.server,
            InFlightCall {
                key: next_key(),
                conversation_id: ctx.conversation_id,
                task_id: ctx.task_id,
                cancel: cancel.clone(),
                span: ctx.span.clone(),
                slot: ctx.slot.cloned(),
                deadline: sent + self.limits.call_timeout,
            },
        );
        let _in_flight = metrics::InFlight::start(&route.server);
        let progress = Progress {
            events: route.events.as_ref(),
            conversation_id: ctx.conversation_id,
            task_id: ctx.task_id,
            call_id: &call.call_id,
            server: &route.server,
        };
        let (progress_tx, mut progress_rx) = mpsc::unbounded_channel();
        // The server's work is a child of the tool call.
        let traceparent = crate::task::spans::traceparent(ctx.span);
        let running = route.conn.call_tool(McpCall {
            tool: &route.tool,
            arguments: &call.arguments,
            cancel: &cancel,
            progress: Some(progress_tx),
            traceparent,
            timeout: self.limits.call_timeout,
            span: ctx.span.clone(),
        });
        tokio::pin!(running);
        let guard = tokio::time::sleep_until(sent + self.limits.call_timeout + CALL_TIMEOUT_GRACE);
        tokio::pin!(guard);
        let result = loop {
            tokio::select! {
                biased;
                out = &mut running => break out,
                Some(notice) = progress_rx.recv() => progress.report(&notice),
                _ = route.closed.cancelled() => {
                    cancel.cancel();
                    break Err(AgentError::McpError {
                        server: route.server.clone(),
                        message: "the connection closed during the call".into(),
                    });
                }
                _ = &mut guard => {
                    cancel.cancel();
                    break Err(AgentError::timeout(
                        format!("MCP call `{}`", call.name),
                        self.limits.call_timeout,
                    ));
                }
            }
        };
        // Progress that came in with the answer is still reported, in order.
        while let Ok(notice) = progress_rx.try_recv() {
            progress.report(&notice);
        }
        // A task cancelled while the server was answering gets `Cancelled`, whichever of the
        // two the call saw first: the task is over and the model will not read the answer.
        let mut output = match result {
            Ok(_) if ctx.cancel.is_cancelled() => {
                return Err(
                    AgentError::cancelled("the task was cancelled during the MCP call").into(),
                );
            }
            result => result?,
        };
        output.call_id = call.call_id.clone();
        Ok(output)
    }
}

/// Tells the pool a call runs until dropped (however the call ends), so that the server's
/// requests meanwhile are attributed to its task. The end costs no message: dropping fires
/// the call's token, and the pool forgets calls whose token fired.
struct Registration {
    /// Fired when the call ends, so a request still waiting on its behalf stops waiting.
    cancel: CancellationToken,
}

impl Registration {
    fn start(actor: &ActorRef<McpPoolMsg>, server: &str, call: InFlightCall) -> Self {
        let registration = Self {
            cancel: call.cancel.clone(),
        };
        let _ = actor.cast(McpPoolMsg::CallStarted {
            server: server.to_owned(),
            call,
        });
        registration
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Turns a call's progress notifications into `tool_progress` events of its task.
struct Progress<'a> {
    events: Option<&'a EventSink>,
    conversation_id: ConversationId,
    task_id: troupe_proto::TaskId,
    call_id: &'a str,
    server: &'a str,
}

impl Progress<'_> {
    fn report(&self, notice: &McpNotice) {
        let McpNotice::Progress {
            progress,
            total,
            message,
        } = notice
        else {
            return;
        };
        metrics::progress();
        tracing::debug!(
            server = self.server,
            progress,
            ?total,
            ?message,
            "MCP call progress"
        );
        if let Some(events) = self.events {
            events.emit(EventDraft::task(
                self.conversation_id,
                self.task_id,
                EventKind::ToolProgress {
                    call_id: self.call_id.to_owned(),
                    progress: *progress,
                    total: *total,
                    message: message.clone(),
                },
            ));
        }
    }
}
