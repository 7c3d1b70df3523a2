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

/// server-everything in streamableHttp mode on a free loopback port (its endpoint is
/// [`EverythingHttp::url`]); killed when dropped.
pub struct EverythingHttp {
    _child: tokio::process::Child,
    pub port: u16,
}

impl EverythingHttp {
    /// Starts it and waits (at most 15 s) until it listens.
    pub async fn start() -> Self {
        let entry = server_entry("server-everything");
        let port = match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
            Ok(addr) => addr.port(),
            Err(e) => panic!("no free port: {e}"),
        };
        let child = match tokio::process::Command::new("node")
            .arg(entry)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => panic!("cannot start server-everything: {e}"),
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "server-everything did not listen on {port}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Self {
            _child: child,
            port,
        }
    }

    /// Its MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}
