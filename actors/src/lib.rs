//! troupe's actors and the ports they call.
//!
//! ```text
//! Session (one per session; supervises everything below, writes the directory)
//! ├─ Rollout        numbers events, records them per StoragePolicy, publishes them
//! ├─ Scheduler      single-flight (or N) slots, FIFO and fair, monitors holders
//! ├─ TaskRegistry   task_id -> conversation, sub_id, state, cancel token
//! ├─ ApprovalStore  approved keys with scope/expiry, pending human requests
//! ├─ McpPool        the session's MCP connections (when it runs one)
//! └─ Conversation × N   history, context, one task at a time, holder of its task's slot
//!      └─ task runner (a tokio task, aborted with its conversation)
//! ```
//!
//! Actors share nothing mutable: each owns its state and changes it only in `handle`. The
//! references to the service actors live in one place, the session's [`directory`], read at
//! each use: a service the Session replaced is found there, never through a stale copy.
#![forbid(unsafe_code)]

pub mod agents;
pub mod apply_patch;
pub mod approval_store;
pub mod capabilities;
pub mod clock;
pub mod context;
pub mod conversation;
pub mod directory;
pub mod event_draft;
pub mod events;
#[cfg(test)]
mod gauge_test;
pub mod governance;
pub mod handle;
pub mod history;
pub mod mcp_pool;
pub mod modules;
pub mod ports;
pub mod replay;
pub mod rollout;
pub mod scheduler;
pub mod session;
pub mod task;
pub mod task_registry;
pub mod token_book;
pub mod tools;

pub use handle::SessionHandle;

/// Declares types as messages of actors on this process only.
///
/// With ractor's `cluster` feature (troupe's own `cluster` feature, which the node transport
/// needs), ractor no longer implements its `Message` trait for every type: each message type
/// says whether it can cross to another node. Without it, ractor's blanket implementation
/// covers every type and this expands to nothing.
#[cfg(feature = "cluster")]
#[macro_export]
macro_rules! local_message {
    ($($t:ty),+ $(,)?) => {
        $(impl ::ractor::Message for $t {})+
    };
}

/// Declares types as messages of actors on this process only (nothing to do in a build
/// without the `cluster` feature: ractor's blanket implementation covers every type).
#[cfg(not(feature = "cluster"))]
#[macro_export]
macro_rules! local_message {
    ($($t:ty),+ $(,)?) => {};
}
pub use session::{SessionConfig, SessionPorts};

/// Registers the description of every metric the actors record (Prometheus requires one).
pub fn describe_metrics() {
    agents::metrics::describe();
    approval_store::metrics::describe();
    capabilities::metrics::describe();
    conversation::metrics::describe();
    governance::metrics::describe();
    mcp_pool::metrics::describe();
    replay::metrics::describe();
    rollout::metrics::describe();
    scheduler::metrics::describe();
    task_registry::metrics::describe();
    task::metrics::describe();
    session::metrics::describe();
}
