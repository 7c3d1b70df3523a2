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
        .current_dir(dir.path())
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
        .current_dir(dir.path())
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
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(troupe_bin())
        .args(["chat", "--once", "x", "--storage-policy", "forever"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown storage policy"));
    let out = Command::new(troupe_bin())
        .args(["chat", "--once"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--once needs a question"));
}

/// `troupe chat --once` against the test model server, over each wire format.
mod against_a_model_server {
    use super::*;
    use troupe_test_support::{ModelServer, Reply};

    async fn once(
        server: &ModelServer,
        provider: &str,
        extra: &[&str],
    ) -> (std::process::Output, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = tokio::process::Command::new(troupe_bin());
        cmd.args([
            "chat",
            "--once",
            "add 2 and 3",
            "--provider",
            provider,
            "--model",
            "gpt-4o-mini",
        ])
        .args([
            "--base-url",
            &server.base_url(),
            "--api-key-env",
            "TROUPE_TEST_KEY",
        ])
        .args(["--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--log-dir")
        .arg(dir.path().join("history"))
        .args(extra)
        .env("TROUPE_TEST_KEY", "sk-test-123")
        .env_remove("TROUPE_CONFIG")
        .current_dir(dir.path());
        let out = tokio::time::timeout(std::time::Duration::from_secs(30), cmd.output())
            .await
            .unwrap()
            .unwrap();
        (out, dir)
    }

    #[tokio::test]
    async fn a_tool_turn_over_both_wire_formats() {
        for provider in ["openai-chat", "openai-responses"] {
            let server = ModelServer::start().await;
            server.push(
                Reply::tool_call("update_plan", ["{\"plan\":", " []}"]).with_usage(50, 5, 10, 0),
            );
            server.push(Reply::text(["The sum ", "is 5."]).with_usage(80, 4, 40, 0));
            let (out, dir) = once(&server, provider, &["--json"]).await;
            assert!(
                out.status.success(),
                "{provider}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(reply["text"], "The sum is 5.", "{provider}");
            assert_eq!(reply["stats"]["steps"], 2);
            assert_eq!(reply["stats"]["tool_calls"], 1);
            assert_eq!(reply["stats"]["usage"]["input_tokens"], 130);
            assert_eq!(reply["stats"]["usage"]["cached_tokens"], 50);
            assert!(reply["stats"]["estimated_prompt_tokens"].as_u64().unwrap() > 0);
            let requests = server.requests();
            assert_eq!(requests.len(), 2);
            let first = &requests[0];
            assert_eq!(first.header("authorization"), Some("Bearer sk-test-123"));
            assert!(
                first.body["prompt_cache_key"]
                    .as_str()
                    .is_some_and(|k| !k.is_empty())
            );
            // The second request carries the call and its output.
            let second = requests[1].body.to_string();
            assert!(
                second.contains("update_plan") && second.contains("plan updated"),
                "{second}"
            );
            // The JSONL history names the tokens of the turn.
            let history = std::fs::read_dir(dir.path().join("history"))
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path();
            let text = std::fs::read_to_string(history).unwrap();
            let turn_end = text
                .lines()
                .find(|l| l.contains("\"type\":\"turn_end\""))
                .unwrap();
            let turn_end: serde_json::Value = serde_json::from_str(turn_end).unwrap();
            assert_eq!(turn_end["meta"]["tokens"]["input"], 130, "{turn_end}");
        }
    }

    #[tokio::test]
    async fn endpoint_failures_end_the_turn_with_a_clear_error() {
        // 401: not retried, exit code 2, the server's message shown.
        let server = ModelServer::start().await;
        server.push(Reply::error(401, "Incorrect API key provided"));
        let (out, _dir) = once(&server, "openai-chat", &[]).await;
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("401") && stderr.contains("Incorrect API key"),
            "{stderr}"
        );
        assert_eq!(server.requests().len(), 1);

        // A malformed stream.
        let server = ModelServer::start().await;
        server.push(Reply::text(["x"]).malformed());
        let (out, _dir) = once(&server, "openai-responses", &[]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("malformed"));

        // An unknown tool in the model's call: an error observation, and the turn goes on.
        let server = ModelServer::start().await;
        server.push(Reply::tool_call("no_such_tool", ["{}"]));
        server.push(Reply::text(["recovered"]));
        let (out, _dir) = once(&server, "openai-chat", &[]).await;
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "recovered");
        let second = server.requests()[1].body.to_string();
        assert!(second.contains("unknown tool"), "{second}");

        // An over-budget prompt: nothing is sent.
        let server = ModelServer::start().await;
        let (out, _dir) = once(&server, "openai-chat", &["--max-prompt-tokens", "10"]).await;
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("max-prompt-tokens 10"));
        assert!(server.requests().is_empty());
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_a_clear_error() {
        // A port nothing listens on (bound, then released).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let out = tokio::process::Command::new(troupe_bin())
            .args(["chat", "--once", "hi", "--provider", "openai-chat"])
            .args(["--base-url", &format!("http://127.0.0.1:{port}/v1")])
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--log-dir")
            .arg(dir.path())
            .env("TROUPE_CONFIG", dir.path().join("none.toml"))
            .output()
            .await
            .unwrap();
        // The config file named by TROUPE_CONFIG does not exist: that is reported first.
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("none.toml"));
        let cfg = dir.path().join("fast.toml");
        std::fs::write(
            &cfg,
            "[model]\nmax_retries = 1\nretry_base = \"10ms\"\nconnect_timeout = \"1s\"\n",
        )
        .unwrap();
        let out = tokio::process::Command::new(troupe_bin())
            .args([
                "chat",
                "--once",
                "hi",
                "--provider",
                "openai-chat",
                "--config",
            ])
            .arg(&cfg)
            .args(["--base-url", &format!("http://127.0.0.1:{port}/v1")])
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--log-dir")
            .arg(dir.path())
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("model error"), "{stderr}");
    }
}
