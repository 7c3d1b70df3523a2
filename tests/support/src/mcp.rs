//! Finding the reference MCP servers and their processes in tests and benchmarks.

use std::path::{Path, PathBuf};

/// Entry point of an npm MCP server installed by `scripts/install-mcp-servers`, e.g.
/// `server_entry("server-everything")`. Panics, naming the install script, when missing.
pub fn server_entry(package: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap_or(Path::new("."));
    let entry = root
        .join(".tools/mcp/node_modules/@modelcontextprotocol")
        .join(package)
        .join("dist/index.js");
    assert!(
        entry.is_file(),
        "{} is missing: run scripts/install-mcp-servers",
        entry.display()
    );
    entry
}

/// Processes whose environment holds `KEY=value` (servers started with a marker variable).
pub fn processes_with_env(key: &str, value: &str) -> Vec<u32> {
    let needle = format!("{key}={value}");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}
