//! `/hub <agent> <text>` through the real binary with the agents directory given only by
//! `TROUPE_AGENTS_DIR` (no configuration file) and a model over HTTP (the test model server,
//! so the supervisor routes with its model): `troupe chat --once` (with `--ephemeral` and
//! with a JSONL history) and `troupe serve` (REST and JSON-RPC) send the text to the agent,
//! never to the conversation's own turn, and say so with `route_decided` and `dispatch_*`.

use super::super::serve::{Api, id};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};
use troupe_test_support::{ModelServer, Recorded};
use troupe_tests::troupe_bin;

/// A working directory without a configuration file, and an agents directory beside it
/// holding the model agent `coder`.
fn dirs() -> (tempfile::TempDir, tempfile::TempDir) {
    let work = tempfile::tempdir().unwrap();
    let agents = tempfile::tempdir().unwrap();
    std::fs::write(
        agents.path().join("coder.json"),
        r#"{"id": "coder", "role": "executor",
            "provider": {"type": "model", "instructions": "You write code."}}"#,
    )
    .unwrap();
    (work, agents)
}

fn command(work: &Path, agents: &Path) -> Command {
    let mut command = Command::new(troupe_bin());
    command
        .current_dir(work)
        .env("TROUPE_AGENTS_DIR", agents)
        .env("HOME", work)
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_LISTEN")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL");
    command
}

/// The request's messages as (role, text) pairs (Chat Completions: `messages`).
fn messages(request: &Recorded) -> Vec<(String, String)> {
    request.body["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("a chat request: {}", request.body))
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_owned(),
                match &m["content"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                },
            )
        })
        .collect()
}

/// The model request came from the agent `coder`'s conversation with `text` as its input:
/// its instructions are there and the `/hub` command is not.
fn asked_by_coder(request: &Recorded, text: &str) {
    let messages = messages(request);
    assert!(
        messages
            .iter()
            .any(|(role, t)| role != "user" && t.contains("You write code.")),
        "the agent's instructions reach the model: {messages:?}"
    );
    assert_eq!(
        messages.last().map(|(r, t)| (r.as_str(), t.as_str())),
        Some(("user", text)),
        "{messages:?}"
    );
    assert!(
        !request.body.to_string().contains("/hub"),
        "the conversation's own turn never ran: {}",
        request.body
    );
}

/// Runs `command` off the runtime's threads (the model server answers on them).
async fn output(mut command: Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_once_sends_hub_text_to_the_agent_from_troupe_agents_dir() {
    let server = ModelServer::start().await;
    let (work, agents) = dirs();

    // --ephemeral: nothing written; the reply and the model's request tell where it went.
    let mut once = command(work.path(), agents.path());
    once.args(["chat", "--once", "--ephemeral", "--json", "--base-url"])
        .arg(server.base_url())
        .arg("/hub coder hi");
    let out = output(once).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("agents: coder"), "{stderr}");
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["status"], "ok", "{reply}");
    assert_eq!(reply["text"], "ok", "{reply}");
    assert_eq!(
        reply["stats"]["steps"], 0,
        "the user's task took no model step of its own: {reply}"
    );
    let requests = server.requests();
    assert_eq!(
        requests.len(),
        1,
        "one model call, the agent's: {requests:?}"
    );
    asked_by_coder(&requests[0], "hi");
    assert!(
        std::fs::read_dir(work.path()).unwrap().next().is_none(),
        "--ephemeral writes nothing"
    );

    // With a history: the routing and dispatch lines name the agent and its provider session.
    let history = work.path().join("history");
    let mut kept = command(work.path(), agents.path());
    kept.args(["chat", "--once", "--base-url"])
        .arg(server.base_url())
        .arg("--log-dir")
        .arg(&history)
        .arg("--data-dir")
        .arg(work.path().join("data"))
        .arg("/hub coder hello");
    let out = output(kept).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    asked_by_coder(&server.requests()[1], "hello");
    let file = std::fs::read_dir(&history)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .expect("a history file");
    let lines: Vec<Value> = std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let agent_lines: Vec<&Value> = lines
        .iter()
        .filter(|l| l["meta"].get("agent_id").is_some())
        .collect();
    let types: Vec<&str> = agent_lines
        .iter()
        .map(|l| l["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "route_decided",
            "dispatch_sent",
            "session_created",
            "session_bound",
            "dispatch_result"
        ]
    );
    assert_eq!(agent_lines[0]["meta"]["source"], "hub");
    assert_eq!(agent_lines[0]["meta"]["agent_id"], "coder");
    let psid = &agent_lines[3]["meta"]["provider_session_id"];
    assert!(psid.is_string(), "{}", agent_lines[3]);
    assert_eq!(&agent_lines[4]["meta"]["provider_session_id"], psid);
    assert_eq!(agent_lines[4]["content"], "ok");
}

/// A `troupe serve` child, killed when dropped.
struct Serving(std::process::Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_sends_hub_text_to_the_agent_from_troupe_agents_dir() {
    let server = ModelServer::start().await;
    let (work, agents) = dirs();
    let mut serve = command(work.path(), agents.path());
    serve
        .args([
            "serve",
            "--ephemeral",
            "--listen",
            "127.0.0.1:0",
            "--base-url",
        ])
        .arg(server.base_url())
        .stderr(Stdio::null());
    let (child, base) = troupe_tests::spawn_serve(&mut serve);
    let _serving = Serving(child);
    let api = Api::new(&base, None);

    let session = api.session(None).await;
    let sid = id(&session, "session_id");
    // REST.
    let reply = api.say(&sid, "/hub coder hi").await;
    assert_eq!(reply["reply"]["text"], "ok", "{reply}");
    assert_eq!(reply["reply"]["stats"]["steps"], 0, "{reply}");
    // JSON-RPC: the same agent, its binding (live in this session) reused.
    let sent = api
        .call(
            "conversation.message",
            json!({"session_id": sid, "text": "/hub coder again"}),
        )
        .await;
    assert_eq!(sent["reply"]["text"], "ok", "{sent}");
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    asked_by_coder(&requests[0], "hi");
    let last = messages(&requests[1]);
    assert_eq!(
        last.last().map(|(r, t)| (r.as_str(), t.as_str())),
        Some(("user", "again"))
    );
    assert!(
        last.iter().any(|(_, t)| t == "hi"),
        "the second dispatch resumed the agent's conversation: {last:?}"
    );

    let events = api
        .sse(&sid, None, |seen| {
            seen.iter()
                .filter(|e| e["kind"] == "dispatch_result")
                .count()
                == 2
        })
        .await;
    let facts: Vec<(&str, &Value)> = events
        .iter()
        .filter_map(|e| Some((e["kind"].as_str()?, &e["data"])))
        .filter(|(k, _)| {
            k.starts_with("session_") || k.starts_with("dispatch_") || *k == "route_decided"
        })
        .collect();
    let kinds: Vec<&str> = facts.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        kinds,
        [
            "route_decided",
            "dispatch_sent",
            "session_created",
            "session_bound",
            "dispatch_result",
            "route_decided",
            "dispatch_sent",
            "dispatch_result"
        ]
    );
    let psid = &facts[3].1["provider_session_id"];
    assert!(psid.is_string(), "{:?}", facts[3]);
    assert_eq!(
        &facts[6].1["provider_session_id"], psid,
        "the binding reused"
    );
    assert_eq!(&facts[7].1["provider_session_id"], psid);
    for (kind, data) in &facts {
        assert_eq!(data["agent_id"], "coder", "{kind}: {data}");
        if *kind == "route_decided" {
            assert_eq!(data["source"], "hub", "{data}");
            assert_eq!(data["decision"], "dispatch_agent", "{data}");
        }
    }
}
