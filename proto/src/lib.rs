//! Wire types of troupe: ids, errors, policies, history items, tool descriptions, events and
//! the requests and replies of the API.
//!
//! Everything here is plain serialisable data (serde; JSON for the API, bincode for the
//! rollout and cluster messages). No actor types, no reply ports: those live in
//! `troupe-actors`, which wraps these types in its mailbox messages.
#![forbid(unsafe_code)]

pub mod agent;
pub mod api;
pub mod approval;
pub mod capability;
pub mod cluster;
pub mod error;
pub mod event;
pub mod governance;
pub mod ids;
pub mod item;
pub mod json;
pub mod names;
pub mod policy;
pub mod sse;
pub mod store;
pub mod task;
pub mod tool;

pub use api::*;
pub use approval::{ApprovalDecision, ApprovalSubject, PendingApproval, RespondApproval};
pub use error::{AgentError, ErrorKind};
pub use event::{EventEnvelope, EventKind, GuardrailStatus};
pub use ids::{ApprovalId, ConversationId, DispatchId, SessionId, TaskId};
pub use item::{HistoryItem, Role, Usage};
pub use json::Json;
pub use names::{EventName, WarningCode};
pub use policy::{
    ApprovalPolicy, CommandKey, OverBudget, SandboxPolicy, StoragePolicy, ToolErrorPolicy,
};
pub use task::{TaskInfo, TaskState, TaskStats, TaskStatus};
pub use tool::{PlanStep, PlanStepStatus, ToolCall, ToolOutput, ToolSpec};

#[cfg(test)]
mod roundtrip_tests;
