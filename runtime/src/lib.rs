//! What plugs into troupe's ports: model providers (the built-in scripted model and the
//! OpenAI-compatible APIs), MCP connections, a command runner (with its sandbox), the
//! tokenizer, and around them the JSONL history log, configuration, telemetry set-up and the
//! assembly of a session's ports from a configuration. The store is `troupe-store`, the
//! `troupe serve` service `troupe-service`.
#![forbid(unsafe_code)]

pub mod agents;
pub mod assembly;
pub mod capabilities;
pub mod config;
pub mod exec;
pub mod history_log;
pub mod live;
pub mod mcp;
pub mod modules;
pub mod openai;
pub mod reload;
pub mod scripted;
pub mod telemetry;
pub mod tokens;

pub use exec::ProcessRunner;
pub use mcp::RmcpConnector;
pub use openai::OpenAiClient;
pub use scripted::{ScriptedModel, ScriptedReply};

/// Registers the description of every metric this crate records (the model clients', MCP's
/// and the command runner's), so that an exporter gives each its help text from the start.
pub fn describe_metrics() {
    openai::metrics::describe();
    mcp::metrics::describe();
    exec::metrics::describe();
    live::metrics::describe();
    reload::metrics::describe();
    // External ACP agents run in sessions' hubs: their series exist from the start too.
    troupe_acp::describe_metrics();
}

/// The entries of a configuration directory (capabilities, modules) that are not hidden,
/// sorted: `Ok(None)` when it does not exist and the configuration did not name it, an error
/// naming the directory (`what` says which) when it cannot be read.
pub(crate) fn config_dir_entries(
    dir: &std::path::Path,
    named: bool,
    what: &str,
) -> Result<Option<Vec<std::path::PathBuf>>, troupe_proto::agent::AgentLoadError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !named => return Ok(None),
        Err(e) => {
            return Err(troupe_proto::agent::AgentLoadError {
                file: dir.to_owned(),
                field: None,
                message: format!("cannot read the {what} directory: {e}"),
            });
        }
    };
    let mut paths: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            !p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'))
        })
        .collect();
    paths.sort();
    Ok(Some(paths))
}
