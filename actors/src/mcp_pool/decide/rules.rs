//! The pool's small rules as plain functions: qualified tool names and their visibility,
//! which tools a server offers, the restart backoff, the check of the server configuration
//! and the roots given to servers.

use super::*;

/// `server__tool`.
pub fn qualify(server: &str, tool: &str) -> String {
    format!("{server}__{tool}")
}

/// Splits a qualified name at its first `__` (server names never contain one, and never end
/// in `_`, so the split is unambiguous).
pub fn split_qualified(name: &str) -> Option<(&str, &str)> {
    name.split_once("__")
        .filter(|(server, tool)| !server.is_empty() && !tool.is_empty())
}

/// Whether an allowlist lets a qualified name through (`None` = everything).
pub fn visible(allowlist: Option<&BTreeSet<String>>, qualified: &str) -> bool {
    allowlist.is_none_or(|list| list.contains(qualified))
}

/// Delay before restart number `attempt + 1` after consecutive failures: `base · 2^attempt`,
/// capped at `max`.
pub fn backoff_delay(base: Duration, max: Duration, attempt: u32) -> Duration {
    let factor = 1u32.checked_shl(attempt).unwrap_or(u32::MAX);
    base.checked_mul(factor).unwrap_or(max).min(max)
}

/// Splits a server's listing into the tools offered and those left out (task-augmented tools,
/// names that do not make a legal qualified name), logging each one left out.
pub fn offered_tools(
    server: &str,
    tools: Vec<McpTool>,
) -> (BTreeMap<String, McpTool>, BTreeMap<String, LeftOut>) {
    let mut offered = BTreeMap::new();
    let mut left_out = BTreeMap::new();
    for tool in tools {
        let reason = if tool.requires_task {
            Some(LeftOut::RequiresTask)
        } else if !is_valid_tool_name(&qualify(server, &tool.name)) {
            Some(LeftOut::InvalidName)
        } else {
            None
        };
        match reason {
            Some(reason) => {
                tracing::info!(
                    server,
                    tool = %tool.name,
                    reason = reason.as_str(),
                    "MCP tool left out"
                );
                crate::mcp_pool::metrics::left_out(reason);
                left_out.insert(tool.name, reason);
            }
            None => {
                offered.insert(tool.name.clone(), tool);
            }
        }
    }
    (offered, left_out)
}

/// Checks server names: legal (`[a-zA-Z0-9_-]+`, at most 64 bytes), without `__`, not ending
/// in `_` (which would make `name___tool` ambiguous), and unique. The error names each one.
pub fn validate_servers(servers: &[McpServerConfig]) -> Result<(), AgentError> {
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for s in servers {
        let name = &s.name;
        if !is_valid_tool_name(name) {
            problems.push(format!(
                "`{name}` (must match [a-zA-Z0-9_-]+, at most 64 bytes)"
            ));
        } else if name.contains("__") {
            problems.push(format!("`{name}` (must not contain `__`)"));
        } else if name.ends_with('_') {
            problems.push(format!(
                "`{name}` (must not end in `_`: its qualified tool names would be ambiguous)"
            ));
        } else if !seen.insert(name.as_str()) {
            problems.push(format!("`{name}` (configured twice)"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(AgentError::invalid(format!(
            "invalid MCP server names: {}",
            problems.join(", ")
        )))
    }
}

/// The roots offered to servers: `file://` URIs, each once, sorted. Entries that already are
/// URIs are kept; absolute paths are converted; anything else is an error naming it.
pub fn root_uris(roots: &[String]) -> Result<Vec<String>, AgentError> {
    let mut uris = BTreeSet::new();
    let mut bad = Vec::new();
    for root in roots {
        if root.contains("://") {
            uris.insert(root.clone());
        } else if root.starts_with('/') {
            uris.insert(format!("file://{}", percent_encode_path(root)));
        } else {
            bad.push(format!("`{root}`"));
        }
    }
    if bad.is_empty() {
        Ok(uris.into_iter().collect())
    } else {
        Err(AgentError::invalid(format!(
            "MCP roots must be absolute paths or URIs: {}",
            bad.join(", ")
        )))
    }
}

pub(super) fn percent_encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
