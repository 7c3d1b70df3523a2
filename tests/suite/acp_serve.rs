//! `troupe acp` (troupe as an ACP agent) driven by the official ACP client from PyPI
//! (`agent-client-protocol`, installed into `.venv` by `scripts/install-python-peers`): a
//! streamed reply, a shell command whose approval goes to the client as
//! `session/request_permission`, cancel, and `session/load` of the conversation by a second
//! process. The script is tests/acp/client_e2e.py; its docstring lists the replies it expects.

use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;
use troupe_runtime::ScriptedReply;
use troupe_tests::troupe_bin;

fn python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let py = root.join(".venv/bin/python");
    assert!(
        py.is_file(),
        "{} is missing: run scripts/install-python-peers",
        py.display()
    );
    py
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_acp_client_drives_troupe_acp() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let marker = dir.path().join("marker.txt");
    let script = dir.path().join("script.json");
    let replies = vec![
        ScriptedReply::text("Hello from troupe").chunked(5),
        ScriptedReply::tool(
            "shell",
            json!({"command": ["touch", marker.display().to_string()]}),
        ),
        ScriptedReply::text("done"),
        ScriptedReply::hang(true),
    ];
    std::fs::write(&script, json!({ "replies": replies }).to_string()).unwrap();
    let reload = dir.path().join("reload.json");
    let replies = vec![ScriptedReply::text("after reload")];
    std::fs::write(&reload, json!({ "replies": replies }).to_string()).unwrap();
    let script_py = Path::new(env!("CARGO_MANIFEST_DIR")).join("acp/client_e2e.py");
    let run = tokio::process::Command::new(python())
        .arg(script_py)
        .arg(troupe_bin())
        .arg(&data)
        .arg(&script)
        .arg(&reload)
        .env("TROUPE_LOG", "info")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .expect("the client finished in time")
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "client failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.starts_with("ok "), "{stdout}");
    assert!(marker.exists(), "the approved command did not run");
    // The conversation is kept under the data dir's session, for later loads.
    assert!(data.join("acp-session").is_file());
}
