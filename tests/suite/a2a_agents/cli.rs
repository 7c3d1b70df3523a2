//! An `a2a` agent defined in a file, as a person sets it up: `troupe agents list` tells
//! whether its token's variable is set, and `troupe chat --once "/hub ..."` reaches the
//! remote agent with that token.

use super::Peer;
use std::process::Command;
use troupe_tests::troupe_bin;

const TOKEN_VAR: &str = "TROUPE_TEST_REMOTE_AGENT_TOKEN";

/// `troupe.toml` and `agents/remote.json` naming `url` and the token variable.
fn config_dir(url: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("agents")).unwrap();
    std::fs::write(
        dir.path().join("troupe.toml"),
        format!("data_dir = {:?}\n", dir.path().join("data")),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("agents/remote.json"),
        serde_json::json!({
            "id": "remote", "role": "echoes",
            "provider": {"type": "a2a", "url": url, "token_env": TOKEN_VAR},
        })
        .to_string(),
    )
    .unwrap();
    dir
}

fn troupe(dir: &tempfile::TempDir, args: &[&str], token: Option<&str>) -> std::process::Output {
    let mut command = Command::new(troupe_bin());
    command
        .args(args)
        .arg("--config")
        .arg(dir.path().join("troupe.toml"))
        .current_dir(dir.path())
        .env_remove("TROUPE_AGENTS_DIR")
        .env_remove("TROUPE_SCRIPT")
        .env_remove("OPENAI_API_KEY")
        .env_remove(TOKEN_VAR);
    if let Some(t) = token {
        command.env(TOKEN_VAR, t);
    }
    command.output().unwrap()
}

#[test]
fn agents_list_says_when_the_token_variable_is_missing() {
    let dir = config_dir("http://127.0.0.1:9/a2a");
    let without = troupe(&dir, &["agents", "list"], None);
    let stdout = String::from_utf8_lossy(&without.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("remote"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.contains("a2a") && line.contains("unavailable") && line.contains(TOKEN_VAR),
        "{line}"
    );
    let with = troupe(&dir, &["agents", "list", "--json"], Some("sesame"));
    let listing: serde_json::Value = serde_json::from_slice(&with.stdout).unwrap();
    assert_eq!(listing["agents"][0]["provider"], "a2a");
    assert_eq!(listing["agents"][0]["health"]["status"], "ok", "{listing}");
}

#[test]
fn chat_once_hubs_to_the_remote_agent_with_its_token() {
    let peer = Peer::python(&["--token", "sesame"]);
    let dir = config_dir(&peer.base);
    let out = troupe(
        &dir,
        &["chat", "--once", "/hub remote echo over the wire"],
        Some("sesame"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "You said: over the wire", "{stderr}");
    // A wrong token: the agent refuses, and the exit code says the turn failed.
    let refused = troupe(
        &dir,
        &["chat", "--once", "/hub remote echo again"],
        Some("wrong"),
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("401"), "{stderr}");
}

/// `--once` has nobody to ask a remote agent's question: it refuses, the turn fails.
#[test]
fn chat_once_refuses_a_remote_question() {
    let peer = Peer::python(&[]);
    let dir = config_dir(&peer.base);
    let out = troupe(
        &dir,
        &["chat", "--once", "/hub remote ask Which branch?"],
        Some("x"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("approval denied"), "{stderr}");
}

/// In the REPL, the question is printed and the answer read from the terminal (`@remote`
/// names the agent: without a model to route with, the rules send it there).
#[test]
fn the_repl_asks_a_remote_question_at_the_terminal() {
    use rexpect::session::spawn_command;
    let peer = Peer::python(&[]);
    let dir = config_dir(&peer.base);
    let mut cmd = Command::new(troupe_bin());
    cmd.arg("chat")
        .arg("--config")
        .arg(dir.path().join("troupe.toml"))
        .env("TERM", "xterm")
        .env(TOKEN_VAR, "unused")
        .env_remove("TROUPE_AGENTS_DIR")
        .env_remove("TROUPE_SCRIPT")
        .env_remove("OPENAI_API_KEY")
        .current_dir(dir.path());
    let mut p = spawn_command(cmd, Some(30_000)).unwrap();
    p.exp_string("[1]> ").unwrap();
    p.send_line("@remote ask Which branch?").unwrap();
    p.exp_string("agent `remote` asks: Which branch?").unwrap();
    p.exp_string("your answer (empty: refuse) > ").unwrap();
    p.send_line("main").unwrap();
    p.exp_string("answer: main").unwrap();
    p.exp_string("[1]> ").unwrap();
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
}
