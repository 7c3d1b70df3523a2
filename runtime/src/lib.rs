//! What plugs into troupe's ports: model providers (the built-in scripted model for now),
//! a command runner, telemetry set-up.
#![forbid(unsafe_code)]

pub mod config;
pub mod exec;
pub mod history_log;
pub mod scripted;
pub mod telemetry;
pub mod tokens;

pub use exec::ProcessRunner;
pub use scripted::{ScriptedModel, ScriptedReply};
