//! What plugs into troupe's ports: model providers (the built-in scripted model and the
//! OpenAI-compatible APIs), a command runner, telemetry set-up.
#![forbid(unsafe_code)]

pub mod assembly;
pub mod config;
pub mod exec;
pub mod history_log;
pub mod mcp;
pub mod openai;
pub mod scripted;
pub mod service;
pub mod telemetry;
pub mod tokens;

pub use exec::ProcessRunner;
pub use mcp::RmcpConnector;
pub use openai::OpenAiClient;
pub use scripted::{ScriptedModel, ScriptedReply};
