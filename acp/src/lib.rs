//! The Agent Client Protocol (ACP: JSON-RPC 2.0 on a child's stdio) in troupe.
#![forbid(unsafe_code)]

pub mod agent;
pub mod client;
pub mod error;
pub mod event;
pub mod metrics;
pub mod provider;

pub use client::{
    AcpAgent, AcpAgentSpec, AgentCommand, AgentHealth, AgentInfo, AgentPhase,
    ApprovalStorePermissions, FixedPermissions, PermissionHandler, Replaced, RestartPolicy,
    SessionOpened, SessionOrigin, StopReason, Stopped, Turn, TurnOutcome,
};
pub use error::{AcpError, AcpErrorKind};
pub use event::{AcpEvent, PermissionChoice, PermissionDecision, PermissionRequest, PlanEntry};
pub use provider::AcpFactory;

/// Registers the description of every ACP metric, each series at 0.
pub fn describe_metrics() {
    metrics::describe();
}
