//! troupe's actors and the ports they call.
//!
//! ```text
//! Session (one per session; supervises everything below)
//! ├─ Rollout        numbers events, records them per StoragePolicy, publishes them
//! ├─ Scheduler      single-flight (or N) slots, FIFO and fair, monitors holders
//! ├─ TaskRegistry   task_id -> conversation, sub_id, state, cancel token
//! ├─ ApprovalStore  approved keys with scope/expiry, pending human requests
//! └─ Conversation × N   history, context, one task at a time
//!      └─ task runner (a tokio task, aborted with its conversation)
//! ```
#![forbid(unsafe_code)]

pub mod approval_store;
pub mod clock;
pub mod events;
pub mod history;
pub mod rollout;
pub mod scheduler;
pub mod task_registry;
pub mod tools;
