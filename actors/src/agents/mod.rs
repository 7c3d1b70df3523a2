//! Agents (A1–A4): sub-agents of a session, whoever runs them, behind one interface.
//!
//! - [`provider`]: the one agent interface ([`AgentProvider`]) and what plugs a kind of
//!   agent in ([`AgentProviderFactory`]).
//! - [`listing`]: what `troupe agents list` and `agents.list` show of a catalog.
pub mod listing;
pub mod provider;

pub use provider::{
    AgentInput, AgentOutput, AgentProvider, AgentProviderFactory, AgentRunContext, DispatchParent,
    ProviderEnv, ResumeError, SessionContext,
};
