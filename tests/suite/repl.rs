//! The REPL as a person uses it: a pseudo-terminal, typed lines, the screen read back.
//! (The expect library reads bytes as Latin-1, so expectations stay ASCII.)

use rexpect::session::{PtySession, spawn_command};
use std::process::Command;
use troupe_tests::troupe_bin;

const TIMEOUT_MS: u64 = 20_000;

fn start(dir: &std::path::Path, script: &str) -> PtySession {
    let script_path = dir.join("script.json");
    std::fs::write(&script_path, script).unwrap();
    let mut cmd = Command::new(troupe_bin());
    cmd.arg("chat")
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--log-dir")
        .arg(dir.join("history"))
        .arg("--script")
        .arg(&script_path)
        .args(["--sandbox-policy", "full-access"])
        .env("TERM", "xterm")
        .env_remove("TROUPE_CONFIG")
        .current_dir(dir);
    spawn_command(cmd, Some(TIMEOUT_MS)).unwrap()
}

#[test]
fn a_conversation_at_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = start(
        dir.path(),
        r#"{"replies": [
            {"text": "hello human", "chunk_chars": 3},
            {"text": "running it", "tool_calls": [{"name": "shell", "arguments": {"command": ["echo", "pty-ok"]}}]},
            {"text": "it printed pty-ok"},
            {"text": "SUMMARY of the chat"}
        ]}"#,
    );
    p.exp_string("scripted model").unwrap();
    p.exp_string("[1]> ").unwrap();

    // A streamed reply and the turn's statistics.
    p.send_line("hi there").unwrap();
    p.exp_string("hello human").unwrap();
    p.exp_string("(ok ").unwrap();
    p.exp_string("1 step").unwrap();
    p.exp_string("[1]> ").unwrap();

    // A tool call needs approval: asked inline, approved once, observed.
    p.send_line("run echo").unwrap();
    p.exp_string("shell {\"command\":[\"echo\",\"pty-ok\"]}")
        .unwrap();
    p.exp_string("approval needed: `echo pty-ok`").unwrap();
    p.exp_string("[n] deny > ").unwrap();
    p.send_line("y").unwrap();
    p.exp_string("exit code 0").unwrap();
    p.exp_string("it printed pty-ok").unwrap();
    p.exp_string("1 tool call").unwrap();
    p.exp_string("[1]> ").unwrap();

    // Conversations: new, list, switch.
    p.send_line("/new").unwrap();
    p.exp_string("conversation 2").unwrap();
    p.exp_string("[2]> ").unwrap();
    p.send_line("/list").unwrap();
    p.exp_string("* 2").unwrap();
    p.exp_string("[2]> ").unwrap();
    p.send_line("/switch 1").unwrap();
    p.exp_string("conversation 1").unwrap();
    p.exp_string("[1]> ").unwrap();

    // Compaction.
    p.send_line("/compact").unwrap();
    p.exp_string("history compacted").unwrap();
    p.exp_string("[1]> ").unwrap();

    // Line editing: the up arrow recalls the last line (/compact); edit it into /help.
    p.send("\x1b[A").unwrap();
    p.flush().unwrap();
    p.exp_string("/compact").unwrap();
    p.send("\x7f\x7f\x7f\x7f\x7f\x7f\x7fhelp\r").unwrap();
    p.flush().unwrap();
    p.exp_string("/switch N|ID").unwrap();
    p.exp_string("[1]> ").unwrap();

    // Nothing pending; unknown commands are named.
    p.send_line("/approve").unwrap();
    p.exp_string("nothing is waiting for approval").unwrap();
    p.send_line("/frobnicate").unwrap();
    p.exp_string("unknown command /frobnicate").unwrap();

    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();

    // The session's JSONL history, and its XML export.
    let history = dir.path().join("history");
    let file = std::fs::read_dir(&history)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let text = std::fs::read_to_string(&file).unwrap();
    for kind in [
        "session_start",
        "turn_start",
        "assistant_chunk",
        "action",
        "observation",
        "final",
        "turn_end",
        "session_end",
    ] {
        assert!(
            text.contains(&format!("\"type\":\"{kind}\"")),
            "no {kind} line in {text}"
        );
    }
    let out = Command::new(troupe_bin())
        .args(["history", "export-xml"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let xml = String::from_utf8(out.stdout).unwrap();
    assert!(xml.contains("<action tool=\"shell\">"), "{xml}");
    assert!(xml.contains("pty-ok"));
}

#[test]
fn a_denied_command_and_ctrl_d() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = start(
        dir.path(),
        r#"{"replies": [
            {"tool_calls": [{"name": "shell", "arguments": {"command": ["rm", "-rf", "/tmp/nothing-here"]}}]},
            {}
        ]}"#,
    );
    p.exp_string("[1]> ").unwrap();
    p.send_line("clean up").unwrap();
    p.exp_string("approval needed: `rm -rf /tmp/nothing-here`")
        .unwrap();
    p.exp_string("[n] deny > ").unwrap();
    p.send_line("n").unwrap();
    p.exp_string("approval denied").unwrap();
    p.exp_string("[1]> ").unwrap();
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
}

#[test]
fn ctrl_c_cancels_the_running_turn_not_the_program() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = start(
        dir.path(),
        r#"{"replies": [{"hang": true}, {"text": "still here"}]}"#,
    );
    p.exp_string("[1]> ").unwrap();
    p.send_line("take forever").unwrap();
    p.exp_string("thinking").unwrap();
    p.send_control('c').unwrap();
    p.exp_string("cancelling the turn").unwrap();
    p.exp_string("(cancelled").unwrap();
    p.exp_string("[1]> ").unwrap();
    p.send_line("and now?").unwrap();
    p.exp_string("still here").unwrap();
    p.exp_string("[1]> ").unwrap();
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
}

#[test]
fn hub_and_agents_at_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents");
    std::fs::create_dir(&agents).unwrap();
    std::fs::write(
        agents.join("coder.json"),
        r#"{"id": "coder", "role": "executor", "provider": {"type": "model", "instructions": "You write code."}}"#,
    )
    .unwrap();
    let script_path = dir.path().join("script.json");
    std::fs::write(&script_path, r#"{"replies": [{"text": "patched it"}]}"#).unwrap();
    let mut cmd = Command::new(troupe_bin());
    cmd.arg("chat")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--log-dir")
        .arg(dir.path().join("history"))
        .arg("--script")
        .arg(&script_path)
        .env("TERM", "xterm")
        .env("TROUPE_AGENTS_DIR", &agents)
        .env_remove("TROUPE_CONFIG")
        .current_dir(dir.path());
    let mut p = spawn_command(cmd, Some(TIMEOUT_MS)).unwrap();
    p.exp_string("agents: coder").unwrap();
    p.exp_string("[1]> ").unwrap();
    p.send_line("/agents").unwrap();
    p.exp_string("coder (executor, model) ok").unwrap();
    p.exp_string("[1]> ").unwrap();
    p.send_line("/hub coder fix the bug").unwrap();
    p.exp_string("patched it").unwrap();
    p.exp_string("(ok ").unwrap();
    p.exp_string("[1]> ").unwrap();
    p.send_line("/agents").unwrap();
    p.exp_string("coder (executor, model) ok bound to ")
        .unwrap();
    p.exp_string("[1]> ").unwrap();
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
}
