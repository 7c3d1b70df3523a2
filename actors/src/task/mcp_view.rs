//! The task's view onto the session's MCP pool: kept while the pool it was opened on is the
//! current one, reopened on the next pool otherwise ([`view_step`], pure).

use super::*;

/// What an MCP call does with the task's view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewStep {
    /// The view is on the session's current pool: call through it.
    Use,
    /// The session has another pool than the view's: open a view there first.
    Reopen,
    /// The view's pool stopped and the session has not published the next one yet: wait.
    AwaitPool,
    /// No view (no pool could start again): the call fails.
    Unavailable,
}

/// `opened_on`: the pool generation of the task's view; `now`: the session's; `closed`:
/// whether the view's pool has stopped (`None`: no view).
pub fn view_step(opened_on: u64, now: u64, closed: Option<bool>) -> ViewStep {
    match (opened_on == now, closed) {
        (false, _) => ViewStep::Reopen,
        (true, Some(false)) => ViewStep::Use,
        (true, Some(true)) => ViewStep::AwaitPool,
        (true, None) => ViewStep::Unavailable,
    }
}

/// The task's MCP view: it keeps the allowlist the task started with and follows the
/// session's pool (see [`view_step`]).
pub(super) struct TaskMcp {
    /// Whether the task was offered MCP tools at all (it had a view at its start).
    pub(super) offered: bool,
    pub(super) view: Option<Arc<dyn McpView>>,
    pub(super) generation: u64,
}

impl TaskMcp {
    pub(super) fn new(ctx: &TaskContext) -> Self {
        Self {
            offered: ctx.mcp.is_some(),
            view: ctx.mcp.clone(),
            generation: ctx.mcp_generation,
        }
    }

    /// The view to call through now.
    pub(super) async fn view(&mut self, ctx: &TaskContext) -> Result<Arc<dyn McpView>, AgentError> {
        loop {
            let now = ctx.services.mcp();
            let closed = self.view.as_ref().map(|v| v.is_closed());
            match view_step(self.generation, now.generation, closed) {
                ViewStep::Use => {
                    if let Some(view) = &self.view {
                        return Ok(view.clone());
                    }
                }
                ViewStep::Reopen => {
                    self.generation = now.generation;
                    self.view = None;
                    if let Some(port) = now.port {
                        let view = port
                            .reopen_view(ctx.conversation_id, ctx.mcp_allowlist.as_deref())
                            .await?;
                        crate::mcp_pool::metrics::view_reopened(
                            crate::mcp_pool::metrics::ReopenedBy::Task,
                        );
                        tracing::info!("MCP view of the task reopened on a new pool");
                        self.view = Some(view);
                    }
                }
                ViewStep::AwaitPool => {
                    let next = tokio::select! {
                        biased;
                        () = ctx.cancel.cancelled() => return Err(AgentError::cancelled("cancelled while the MCP pool restarted")),
                        next = ctx.services.mcp_after(self.generation) => next,
                    };
                    if next.is_none() {
                        return Err(AgentError::internal("the session's MCP pool is gone"));
                    }
                }
                ViewStep::Unavailable => {
                    return Err(AgentError::internal(
                        "the session's MCP pool could not start again",
                    ));
                }
            }
        }
    }
}
