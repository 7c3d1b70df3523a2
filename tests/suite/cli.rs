//! `troupe chat --once` as a person runs it: a real process, its stdout, its exit code, and
//! the rollout it leaves on disk.

use std::process::Command;
use troupe_tests::{contains, troupe_bin};

fn read_tree(dir: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(read_tree(&p));
        } else {
            out.extend(std::fs::read(&p).unwrap());
        }
    }
    out
}

#[test]
fn once_prints_the_reply_and_leaves_a_rollout() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(troupe_bin())
        .args(["chat", "--once", "what is in a name?", "--data-dir"])
        .arg(dir.path())
        .env_remove("TROUPE_SCRIPT")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "You said: what is in a name?"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("scripted model"),
        "it says which model it uses: {stderr}"
    );
    let disk = read_tree(&dir.path().join("rollout"));
    assert!(contains(&disk, "what is in a name?"));
    assert!(contains(&disk, "task_finished"));
}

#[test]
fn once_follows_a_script_and_reports_errors_in_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(&script, r#"{"replies": [{"error": "the model is down"}]}"#).unwrap();
    let out = Command::new(troupe_bin())
        .args(["chat", "--once", "hello", "--json", "--data-dir"])
        .arg(dir.path())
        .arg("--script")
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["status"], "error");
    assert_eq!(
        reply["error"]["model_error"]["message"],
        "the model is down"
    );
}

#[test]
fn bad_flags_get_a_clear_message() {
    let out = Command::new(troupe_bin())
        .args(["chat", "--once", "x", "--storage-policy", "forever"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown storage policy"));
    let out = Command::new(troupe_bin())
        .args(["chat", "--once"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--once needs a question"));
}
