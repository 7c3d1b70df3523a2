//! The one agent interface (A2, seed 003 §5.1) and what plugs a kind of agent in.
//!
//! Every agent, whoever runs it, is an [`AgentProvider`]: `initialize`, `handle`, `health`,
//! `shutdown` as in the seed, plus the two session operations the control plane needs
//! (`open_session`, `resume_session`, A1). The session's [`AgentHub`](super::hub) holds one
//! provider per agent definition and calls, in order:
//!
//! 1. `initialize` before the first session operation of the session's run (again at the
//!    next dispatch if it failed; at most one call in flight);
//! 2. `open_session` when the agent has no binding (or its binding cannot be resumed), or
//!    `resume_session` once per run for a binding made before; every later dispatch of the
//!    run reuses the provider session without asking;
//! 3. `handle` for each dispatch, with the provider session, a cancel token (the dispatcher
//!    was cancelled, or the dispatch's lease expired) and where to send events and approvals;
//! 4. `health` for listings; `shutdown` when the session ends.
//!
//! A kind of provider is plugged in by an [`AgentProviderFactory`] in
//! [`AgentPorts::factories`](super::AgentPorts::factories): the hub asks the factory of an
//! agent's kind to `build` its provider when the hub starts. The in-process kind (`model`) is
//! built by the hub itself ([`super::model`]). An agent whose kind has no factory still loads
//! and lists (health `unavailable`), and a dispatch to it is refused before it runs
//! (`policy_rejected`, reason `provider_unavailable`), never silently dropped.
//!
//! A bound provider session that cannot go on is the hub's to replace and announce: a
//! provider answers `resume_session` with [`ResumeError::NotResumable`] (the hub opens a new
//! one) or [`ResumeError::Replaced`] (it opened one itself), and a session that changes while
//! `handle` runs is reported with [`AgentRunContext::session_replaced`].
//!
//! Implementations must:
//! - stop `handle` promptly with `AgentError::Cancelled` once `ctx.cancel` fires (a child
//!   whose lease expired is cancelled and its dispatcher has already been answered);
//! - be safe to call concurrently for different provider sessions (dispatches to one
//!   binding are the caller's to order: a conversation runs one message at a time, an ACP
//!   session one prompt at a time);
//! - never block a thread (start processes and connect in `initialize` or lazily).

use crate::approval_store::ApprovalMsg;
use crate::approval_store::{Ask, Granted};
use crate::clock::Clock;
use crate::directory::ServiceRef;
use crate::events::{EventDraft, EventSink};
use async_trait::async_trait;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use troupe_proto::agent::{AgentDefinition, AgentHealth, ExecutionChain, ProviderKind};
use troupe_proto::{AgentError, ConversationId, DispatchId, EventKind, SessionId, TaskId, Usage};

/// Builds the providers of one kind of agent.
pub trait AgentProviderFactory: Send + Sync + 'static {
    /// The kind it builds (`acp`, `a2a`).
    fn kind(&self) -> ProviderKind;

    /// Health without a session, for `troupe agents list`: a cheap local check (the command
    /// is there, the token's variable is set). No process is started, nothing is contacted.
    fn probe(&self, definition: &AgentDefinition) -> AgentHealth {
        let _ = definition;
        AgentHealth::ok()
    }

    /// The provider of `definition` in one session. Called when the session's hub starts;
    /// must not block or start anything (that is `initialize`'s).
    fn build(
        &self,
        definition: &AgentDefinition,
        env: &ProviderEnv,
    ) -> Result<Arc<dyn AgentProvider>, AgentError>;
}

/// What a provider may use of its session, given at `build`.
#[derive(Clone)]
pub struct ProviderEnv {
    pub session_id: SessionId,
    /// The session's events (each provider attributes its own; see [`AgentRunContext::emit`]).
    pub events: EventSink,
    /// The session's ApprovalStore, read at each use (it may be replaced).
    pub approvals: ServiceRef<ApprovalMsg>,
    pub clock: Clock,
    /// The session's data directory (a provider may keep files under `agents/<id>/`).
    pub data_dir: PathBuf,
    /// How long an approval waits for a human in this session.
    pub approval_timeout: Duration,
}

/// Why a bound provider session was not taken up again.
#[derive(Debug, Clone, PartialEq)]
pub enum ResumeError {
    /// It is gone or unknown to the provider (expired, another kind, not loadable): the hub
    /// opens a new one, binds it in its place and says so (`binding_replaced` warning).
    NotResumable(String),
    /// Something failed that may work next time (the process did not start): the dispatch
    /// fails with it and the binding stays.
    Failed(AgentError),
    /// It could not be taken up, and the provider has already opened another in its place
    /// (an ACP agent answers a failed `session/load` so): the hub binds `provider_session_id`
    /// without calling `open_session`, and says why (`binding_replaced` warning).
    Replaced {
        provider_session_id: String,
        reason: String,
    },
}

/// One agent, whoever runs it (seed 003 §5.1 `UnifiedAgent`, with the session operations of
/// the session control plane).
#[async_trait]
pub trait AgentProvider: Send + Sync + 'static {
    /// Prepares the agent (start its process, handshake, read its card). Called before the
    /// first session operation of the run; called again after a failure.
    async fn initialize(&self) -> Result<(), AgentError>;

    /// A new provider session: an ACP `session/new`, a new A2A context, a new conversation.
    /// Answers its id, which the hub binds.
    async fn open_session(&self, ctx: &SessionContext<'_>) -> Result<String, AgentError>;

    /// Takes a bound provider session up again (ACP `session/load` or `session/resume`,
    /// the A2A `contextId`, the in-process conversation).
    async fn resume_session(
        &self,
        provider_session_id: &str,
        ctx: &SessionContext<'_>,
    ) -> Result<(), ResumeError>;

    /// Runs one input in the provider session `ctx.provider_session_id` and answers the
    /// agent's reply. Stops promptly with `Cancelled` once `ctx.cancel` fires.
    async fn handle(
        &self,
        input: AgentInput,
        ctx: &AgentRunContext<'_>,
    ) -> Result<AgentOutput, AgentError>;

    /// Whether it can take dispatches now.
    async fn health(&self) -> AgentHealth;

    /// Ends everything it started (processes are signalled: some agents ignore a closed
    /// stdin). Idempotent.
    async fn shutdown(&self);
}

/// Who a session operation is for.
#[derive(Debug, Clone, Copy)]
pub struct SessionContext<'a> {
    pub session_id: SessionId,
    pub agent_id: &'a str,
    /// The dispatch that needs it.
    pub dispatch_id: DispatchId,
    /// Fires when that dispatch is cancelled or its lease expires.
    pub cancel: &'a CancellationToken,
}

/// What a dispatch hands an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentInput {
    pub text: String,
}

/// What an agent answered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AgentOutput {
    pub text: String,
    /// Tokens it spent, when it says.
    pub usage: Option<Usage>,
}

/// The task that dispatched: events of the dispatch are attributed to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchParent {
    pub conversation_id: ConversationId,
    pub task_id: TaskId,
}

/// Everything one `handle` call may use.
pub struct AgentRunContext<'a> {
    pub session_id: SessionId,
    pub agent_id: &'a str,
    pub provider_session_id: &'a str,
    pub dispatch_id: DispatchId,
    /// Outermost first, ending with this agent: pass it on to whatever this agent
    /// dispatches in turn (an in-process agent's tasks do).
    pub chain: &'a ExecutionChain,
    pub parent: DispatchParent,
    /// Fires when the dispatcher is cancelled or the lease expires.
    pub cancel: &'a CancellationToken,
    pub events: &'a EventSink,
    pub approvals: &'a ServiceRef<ApprovalMsg>,
    pub approval_timeout: Duration,
    /// The dispatch's span (`troupe.dispatch`): spans a provider opens are its children.
    pub span: &'a tracing::Span,
    /// Where [`session_replaced`](Self::session_replaced) leaves its word for the hub.
    pub replaced: &'a SessionReplaced,
    /// Tool governance (A5). For an in-process agent, the dispatcher's: its task intersects
    /// its own policy with it and may use the tokens it carries. For an external agent, the
    /// policy its tool calls answer to: its own layers (role, file) and the dispatcher's
    /// ([`crate::governance::external_agent`]), checked where the agent lets troupe see a
    /// call (an ACP permission request).
    pub governance: &'a std::sync::Arc<crate::governance::TaskGovernance>,
    /// The dispatcher kept its scheduler slot for this dispatch: an in-process agent's task
    /// runs on it (see `hub`, Scheduling).
    pub slot_lent: bool,
    /// The process's token book: where a call to an `authorizationRequired` tool uses a token.
    pub token_book: Option<&'a crate::token_book::TokenBookRef>,
}

/// A provider session that changed under a dispatch: set at most once per `handle` call,
/// read by the hub when it returns.
#[derive(Debug, Default)]
pub struct SessionReplaced(std::sync::OnceLock<(String, String)>);

impl SessionReplaced {
    /// The new provider session and why the bound one was left, if it changed.
    pub fn get(&self) -> Option<(&str, &str)> {
        self.0.get().map(|(id, why)| (id.as_str(), why.as_str()))
    }
}

impl AgentRunContext<'_> {
    /// Says that the dispatch now runs in another provider session than the bound one (an
    /// external agent's process was restarted and could not take its session up again, so
    /// it opened another). When `handle` returns, the hub binds the agent to
    /// `provider_session_id` in the store and says why (`binding_replaced` warning,
    /// `session_created` and `session_bound`); the dispatch's result names the new one. Only
    /// the first call of a `handle` counts.
    pub fn session_replaced(&self, provider_session_id: &str, reason: &str) {
        let _ = self
            .replaced
            .0
            .set((provider_session_id.to_owned(), reason.to_owned()));
    }

    /// Emits an event of the dispatching task (its conversation and task ids), in the
    /// dispatch's trace.
    pub fn emit(&self, event: EventKind) {
        self.span.in_scope(|| {
            self.events.emit(EventDraft::task(
                self.parent.conversation_id,
                self.parent.task_id,
                event,
            ));
        });
    }

    /// Asks a human through the session's ApprovalStore (an `approval_requested` event of
    /// the dispatching task), e.g. for an ACP permission request; answers when decided,
    /// `ApprovalDenied` (or `Timeout`) when refused, `Cancelled` when the dispatch is.
    /// However the wait ends without an answer (the dispatch cancelled, the caller's future
    /// dropped: its agent shut down), the request is withdrawn rather than left for a human
    /// to answer in vain.
    pub async fn ask_approval(&self, mut ask: Ask) -> Result<Granted, AgentError> {
        ask.conversation_id = self.parent.conversation_id;
        ask.task_id = Some(self.parent.task_id);
        // Declared before the wait, so dropped after it (and after its reply port).
        let mut gone = crate::approval_store::CallersGoneOnDrop::new(
            self.approvals,
            self.parent.conversation_id,
        );
        let asked = crate::approval_store::ask_until_answered(
            self.approvals,
            ask,
            Some(self.approval_timeout),
            crate::approval_store::metrics::Asker::Task,
        );
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err(AgentError::cancelled("the dispatch was cancelled while a human was asked")),
            answer = asked => {
                gone.answered();
                answer.unwrap_or_else(|| Err(AgentError::cancelled("the session ended while a human was asked")))
            }
        }
    }
}
