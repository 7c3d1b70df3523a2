//! Agents (A1–A4): sub-agents of a session, whoever runs them, behind one interface.
//!
//! ```text
//! Session
//! └─ AgentHub (one per session with agents; replaced on failure, bindings re-read)
//!    ├─ a provider per agent: in-process (model), or plugged in per kind (acp, a2a)
//!    └─ a worker task per dispatch in flight (binding, then the provider's `handle`),
//!       except a dispatch to an in-process agent whose conversation the hub knows, which
//!       goes straight to it ([`direct`])
//! ```
//!
//! - [`provider`]: the one agent interface ([`AgentProvider`]) and what plugs a kind of
//!   agent in ([`AgentProviderFactory`]).
//! - [`hub`]: the session's agents, bindings and dispatches (its doc tells the protocol and
//!   how children are scheduled so that nothing locks itself).
//! - [`model`]: the in-process provider, a conversation of the session.
//! - [`direct`]: a dispatch sent straight to an in-process agent's conversation, and its end
//!   straight back to the hub.
//! - [`decide`], [`leases`], [`route`]: the decisions (admission, bindings, the wait graph,
//!   routing) as plain functions.
//! - [`listing`]: what `troupe agents list` and `agents.list` show.
//!
//! A task meets the agents through the session's directory: at its start it asks the hub for
//! its [`hub::AgentView`]; a user's message is routed by the supervisor before the turn (see
//! `task::agents`), and a model agent with agents in sight has a `dispatch_agent` tool.

pub mod decide;
pub mod direct;
pub mod hub;
pub mod leases;
pub mod listing;
pub mod metrics;
pub mod model;
pub mod provider;
pub mod route;

pub use provider::{
    AgentInput, AgentOutput, AgentProvider, AgentProviderFactory, AgentRunContext, DispatchParent,
    ProviderEnv, ResumeError, SessionContext, SessionReplaced,
};

use crate::ports::{BindingStore, ModelClient};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use troupe_proto::DispatchId;
use troupe_proto::agent::{AgentCatalog, DEFAULT_MAX_DEPTH, ExecutionChain};

/// How the supervisor decides (`[agents] router`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterMode {
    /// Its model calls the `route` tool.
    Model,
    /// `@agent` mentions, else a direct reply.
    Rules,
}

/// The agents' settings of a session.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// `[agents] supervisor`: the agent that routes (default: the one whose role is
    /// `supervisor`, else the built-in one).
    pub supervisor: Option<String>,
    pub router: RouterMode,
    /// Most nested dispatches in one chain.
    pub max_depth: usize,
    /// How long a dispatch may run before its lease expires.
    pub lease_ttl: Duration,
}

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            supervisor: None,
            router: RouterMode::Rules,
            max_depth: DEFAULT_MAX_DEPTH,
            lease_ttl: Duration::from_secs(600),
        }
    }
}

/// What a session needs to run agents: their definitions, the providers of external kinds,
/// the model clients of in-process agents with an endpoint of their own, and where bindings
/// are kept.
#[derive(Clone)]
pub struct AgentPorts {
    pub catalog: Arc<AgentCatalog>,
    pub settings: AgentSettings,
    /// One per external kind (`acp`, `a2a`); an agent of a kind without one is refused.
    pub factories: Vec<Arc<dyn AgentProviderFactory>>,
    /// By agent id: clients of in-process agents that name another endpoint than the
    /// session's. Others use the session's model.
    pub models: BTreeMap<String, Arc<dyn ModelClient>>,
    pub bindings: Arc<dyn BindingStore>,
    /// The definitions of a watched agents directory as they change (A7); `None`: `catalog`
    /// stays as it was read.
    pub live: Option<tokio::sync::watch::Receiver<Arc<AgentCatalog>>>,
}

/// What a dispatched message carries into an agent's conversation: its dispatch, so that
/// what the agent dispatches in turn extends the chain, and a cancelled or expired dispatch
/// cancels the agent's task.
#[derive(Debug, Clone)]
pub struct DispatchOrigin {
    pub dispatch_id: DispatchId,
    pub agent_id: String,
    /// Ends with `agent_id`.
    pub chain: ExecutionChain,
    pub cancel: CancellationToken,
    /// The dispatch's span: the agent's task links to it.
    pub span: tracing::Span,
    /// The dispatcher's tool governance: the agent's task's policy is intersected with it.
    pub governance: Arc<crate::governance::TaskGovernance>,
    /// The agent's task runs on its dispatcher's scheduler slot (lent for the dispatch): it
    /// asks the scheduler for none and gives none back.
    pub slot_lent: bool,
}
