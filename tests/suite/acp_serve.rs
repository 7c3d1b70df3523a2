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

/// An MCP server's form (elicitation) asked through `troupe acp` and answered "allow once" by
/// the editor: the form has a required field without a default, so "allow" cannot fill it;
/// the request is declined at once and the turn goes on (it waited for the approval timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_that_cannot_answer_a_form_declines_it_at_once() {
    use std::sync::Arc;
    use troupe_acp::{
        AcpAgent, AcpAgentSpec, AgentCommand, FixedPermissions, PermissionDecision, Turn,
    };
    let dir = tempfile::tempdir().unwrap();
    let entry = troupe_test_support::mcp::server_entry("server-everything");
    let config = dir.path().join("troupe.toml");
    std::fs::write(
        &config,
        format!(
            "[[mcp.servers]]\nname = \"everything\"\ntype = \"stdio\"\ncommand = \"node\"\n\
             args = [{:?}, \"stdio\"]\n",
            entry.display().to_string()
        ),
    )
    .unwrap();
    let script = dir.path().join("script.json");
    // One tool call and one answer per turn, for as many turns as the server takes to be up.
    let replies: Vec<ScriptedReply> = (0..50)
        .flat_map(|_| {
            [
                ScriptedReply::tool("everything__trigger-elicitation-request", json!({})),
                ScriptedReply::text("after the form"),
            ]
        })
        .collect();
    std::fs::write(&script, json!({ "replies": replies }).to_string()).unwrap();
    let agent = AcpAgent::spawn(AcpAgentSpec::new(
        "troupe",
        AgentCommand {
            command: troupe_bin().display().to_string(),
            args: vec![
                "acp".into(),
                "--ephemeral".into(),
                "--config".into(),
                config.display().to_string(),
                "--script".into(),
                script.display().to_string(),
            ],
            env: Default::default(),
            cwd: Some(dir.path().to_path_buf()),
        },
    ))
    .await
    .unwrap();
    // The MCP server connects in the background: the first turns may not see its tool yet.
    let mut asked = false;
    for _ in 0..50 {
        let (tx, mut rx) = tokio::sync::mpsc::channel(256);
        let turn = Turn {
            text: "fill the form".into(),
            events: Some(tx),
            permissions: Arc::new(FixedPermissions(PermissionDecision::AllowOnce)),
        };
        let done = tokio::time::timeout(Duration::from_secs(30), agent.prompt(turn))
            .await
            .expect("the turn does not wait for the approval timeout")
            .unwrap();
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        if events
            .iter()
            .any(|e| matches!(e, troupe_acp::AcpEvent::PermissionRequested { .. }))
        {
            assert!(done.text.contains("after the form"), "{done:?}");
            asked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(asked, "the form was never asked");
    agent.shutdown().await;
}
