//! What a user sees of agents outside a session's code: the real `troupe serve` lists them
//! over JSON-RPC (`agents.list`) and REST (`/api/agents`, `/api/sessions/{id}/agents`), its
//! event stream and `/metrics` carry routing, dispatch and binding facts with the agent and
//! provider session ids; `troupe chat --once` writes them into the JSONL history.

use super::super::serve::{Api, id};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};
use troupe_tests::troupe_bin;

/// A configuration directory: `troupe.toml`, a model agent `coder`, an ACP agent whose
/// program is not installed, a definition that does not load, and a script for the model.
fn config_dir(replies: Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents");
    std::fs::create_dir(&agents).unwrap();
    std::fs::write(
        dir.path().join("troupe.toml"),
        format!(
            "data_dir = {:?}\nlog_dir = {:?}\n",
            dir.path().join("data"),
            dir.path().join("history")
        ),
    )
    .unwrap();
    std::fs::write(
        agents.join("coder.json"),
        r#"{"id": "coder", "role": "executor", "description": "Writes code.",
            "provider": {"type": "model", "instructions": "You write code."}}"#,
    )
    .unwrap();
    std::fs::write(
        agents.join("external.json"),
        r#"{"id": "external", "role": "reviewer",
            "provider": {"type": "acp", "command": "no-such-acp-agent"}}"#,
    )
    .unwrap();
    std::fs::write(
        agents.join("broken.json"),
        r#"{"id": "broken", "provider": {"type": "carrier-pigeon"}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("script.json"),
        json!({ "replies": replies }).to_string(),
    )
    .unwrap();
    dir
}

fn command(dir: &Path) -> Command {
    let mut command = Command::new(troupe_bin());
    command
        .current_dir(dir)
        .env_remove("TROUPE_AGENTS_DIR")
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_LISTEN");
    command
}

/// A `troupe serve` child, killed when dropped.
struct Serving(std::process::Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The service's `/metrics` text.
async fn metrics_of(api: &Api) -> String {
    api.request(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn agent<'a>(listing: &'a Value, id: &str) -> &'a Value {
    listing["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {listing}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_lists_agents_and_streams_their_events_and_metrics() {
    let dir = config_dir(json!([
        {"text": "patched"},
        {"text": "patched 2"},
        {"text": "patched 3"},
        {"text": "patched 4"}
    ]));
    let mut serve = command(dir.path());
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.path().join("troupe.toml"))
        .arg("--script")
        .arg(dir.path().join("script.json"))
        .stderr(Stdio::null());
    let (child, base) = troupe_tests::spawn_serve(&mut serve);
    let _serving = Serving(child);
    let api = Api::new(&base, None);

    // Every series of the agents is there at 0 before anything ran.
    let (_, _) = api.get("/healthz").await;
    let metrics = metrics_of(&api).await;
    for series in [
        r#"troupe_agent_dispatches_total{provider="acp",status="expired"} 0"#,
        r#"troupe_agent_policy_rejections_total{reason="cycle"} 0"#,
        r#"troupe_agent_route_decisions_total{decision="ask_human",source="model"} 0"#,
        r#"troupe_agent_bindings_total{provider="model",outcome="replaced"} 0"#,
        "troupe_agent_leases_expired_total 0",
        "troupe_agent_dispatches_in_flight 0",
        "troupe_acp_processes 0",
        r#"troupe_agent_dispatch_paths_total{path="direct"} 0"#,
        r#"troupe_agent_dispatch_paths_total{path="worker"} 0"#,
    ] {
        assert!(metrics.contains(series), "{series} missing from /metrics");
    }

    // Without a session: what can be told without starting anything.
    let (status, listing) = api.get("/api/agents").await;
    assert_eq!(status, StatusCode::OK, "{listing}");
    assert_eq!(agent(&listing, "coder")["health"]["status"], "ok");
    let external = agent(&listing, "external");
    assert_eq!(external["provider"], "acp");
    assert_eq!(external["health"]["status"], "unavailable");
    assert!(
        external["health"]["detail"]
            .as_str()
            .unwrap()
            .contains("no-such-acp-agent")
    );
    assert_eq!(listing["errors"][0]["field"], "provider.type");
    assert_eq!(api.call("agents.list", json!({})).await, listing);

    let session = api.session(None).await;
    let sid = id(&session, "session_id");
    let reply = api.say(&sid, "/hub coder fix the bug").await;
    assert_eq!(reply["reply"]["text"], "patched", "{reply}");

    // The session's listing: its binding, the same over JSON-RPC and REST.
    let listed = api.call("agents.list", json!({"session_id": sid})).await;
    let coder = agent(&listed, "coder");
    assert_eq!(coder["role"], "executor");
    assert_eq!(coder["provider"], "model");
    assert_eq!(coder["health"]["status"], "ok");
    let binding = &coder["bindings"][0];
    assert_eq!(binding["session_id"], sid.as_str());
    let psid = binding["provider_session_id"].as_str().unwrap().to_owned();
    let (status, rest) = api.get(&format!("/api/sessions/{sid}/agents")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(rest, listed);
    let (_, all) = api.get("/api/agents").await;
    assert_eq!(
        agent(&all, "coder")["bindings"][0]["provider_session_id"],
        psid
    );
    // An unknown session is an error, never an empty list.
    let missing = troupe_proto::SessionId::new();
    let (status, _) = api.get(&format!("/api/sessions/{missing}/agents")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        api.call_err("agents.list", json!({"session_id": missing.to_string()}))
            .await,
        -32001
    );
    assert_eq!(
        api.call_err("agents.list", json!({"session": "x"})).await,
        -32602
    );

    // The event stream: every agent event names the agent and the provider session.
    let events = api
        .sse(&sid, None, |seen| {
            seen.iter().any(|e| e["kind"] == "dispatch_result")
        })
        .await;
    let kinds: Vec<&str> = events
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .filter(|k| {
            k.starts_with("session_") || k.starts_with("dispatch_") || *k == "route_decided"
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "route_decided",
            "dispatch_sent",
            "session_created",
            "session_bound",
            "dispatch_result"
        ]
    );
    for e in &events {
        let kind = e["kind"].as_str().unwrap();
        if kind.starts_with("session_") || kind == "dispatch_result" {
            assert_eq!(e["data"]["agent_id"], "coder", "{e}");
            assert_eq!(e["data"]["provider_session_id"], psid.as_str(), "{e}");
        }
    }

    let metrics = metrics_of(&api).await;
    for series in [
        r#"troupe_agent_dispatches_total{provider="model",status="ok"} 1"#,
        r#"troupe_agent_route_decisions_total{decision="dispatch_agent",source="hub"} 1"#,
        r#"troupe_agent_bindings_total{provider="model",outcome="created"} 1"#,
        r#"troupe_agent_dispatch_paths_total{path="worker"} 1"#,
    ] {
        assert!(metrics.contains(series), "{series} missing from /metrics");
    }

    // The next dispatches to the bound agent go straight to its conversation once the hub
    // knows it (learned after the first one ended).
    for n in 2..=4 {
        let reply = api.say(&sid, "/hub coder again").await;
        assert_eq!(reply["reply"]["text"], format!("patched {n}"), "{reply}");
    }
    let metrics = metrics_of(&api).await;
    let count = |path: &str| -> u64 {
        let series = format!("troupe_agent_dispatch_paths_total{{path=\"{path}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{series} missing from /metrics"))
    };
    assert_eq!(count("direct") + count("worker"), 4, "{metrics}");
    assert!(
        count("direct") >= 2,
        "dispatches 3 and 4 went direct: {metrics}"
    );
}

#[test]
fn chat_once_writes_the_agent_lines_into_the_jsonl_history() {
    let dir = config_dir(json!([{"text": "patched"}]));
    let out = command(dir.path())
        .args(["chat", "--once", "--config"])
        .arg(dir.path().join("troupe.toml"))
        .arg("--script")
        .arg(dir.path().join("script.json"))
        .arg("/hub coder fix the bug")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "patched");
    assert!(
        stderr.contains("agents: coder, external"),
        "the run names its agents: {stderr}"
    );
    let file = std::fs::read_dir(dir.path().join("history"))
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
    let bound = agent_lines[3];
    let psid = bound["meta"]["provider_session_id"].as_str().unwrap();
    assert_eq!(bound["meta"]["provider"], "model");
    let result = agent_lines[4];
    assert_eq!(result["meta"]["provider_session_id"], psid);
    assert_eq!(result["meta"]["outcome"], "ok");
    assert_eq!(result["content"], "patched");
    assert_eq!(
        agent_lines[1]["meta"]["chain"],
        json!(["supervisor", "coder"])
    );
    assert_eq!(agent_lines[0]["meta"]["source"], "hub");
    assert_eq!(agent_lines[0]["meta"]["decision"], "dispatch_agent");
    assert_eq!(agent_lines[0]["meta"]["confidence"], 1.0);
    // Every line keeps the eight keys.
    for l in &agent_lines {
        assert_eq!(l.as_object().unwrap().len(), 8, "{l}");
    }
}

/// An agents directory where no definition loads still reports the files that did not:
/// `agents.list` and `GET /api/agents` list them under `errors` (they answered empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_lists_the_errors_when_no_agent_loads() {
    let dir = config_dir(json!([]));
    for ok in ["coder.json", "external.json"] {
        std::fs::remove_file(dir.path().join("agents").join(ok)).unwrap();
    }
    let (_serving, base) = serve_with_tokens(dir.path());
    let api = Api::new(&base, Some("ops"));
    let (status, listing) = api.get("/api/agents").await;
    assert_eq!(status, reqwest::StatusCode::OK, "{listing}");
    assert_eq!(listing["agents"], json!([]), "{listing}");
    let errors = listing["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{listing}");
    assert!(errors[0].to_string().contains("broken.json"), "{listing}");
    assert_eq!(api.call("agents.list", json!({})).await, listing);
    // The files' errors name paths of the host: not to a token bound to projects.
    for token in ["alpha", "prom"] {
        let (status, listing) = Api::new(&base, Some(token)).get("/api/agents").await;
        assert_eq!(status, reqwest::StatusCode::OK, "{listing}");
        assert_eq!(listing["errors"], json!([]), "{token}: {listing}");
    }
}

/// `troupe serve` over the configuration in `dir` with three tokens: `ops` (every project),
/// `alpha` (one project) and `prom` (none, a scraper's); its base URL.
fn serve_with_tokens(dir: &std::path::Path) -> (Serving, String) {
    let toml = dir.join("troupe.toml");
    let mut text = std::fs::read_to_string(&toml).unwrap();
    text.push_str(
        "[[server.tokens]]\ntoken = \"ops\"\nprojects = [\"*\"]\n\
         [[server.tokens]]\ntoken = \"alpha\"\nprojects = [\"alpha\"]\n\
         [[server.tokens]]\ntoken = \"prom\"\nprojects = []\n",
    );
    std::fs::write(&toml, text).unwrap();
    let mut serve = command(dir);
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&toml)
        .stderr(Stdio::null());
    let (child, base) = troupe_tests::spawn_serve(&mut serve);
    (Serving(child), base)
}

/// A token bound to no project (a scraper's) reads `/metrics` and nothing else: no agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_no_project_lists_no_agent() {
    let dir = config_dir(json!([]));
    let (_serving, base) = serve_with_tokens(dir.path());
    let (_, all) = Api::new(&base, Some("ops")).get("/api/agents").await;
    assert!(!all["agents"].as_array().unwrap().is_empty(), "{all}");
    let (status, none) = Api::new(&base, Some("prom")).get("/api/agents").await;
    assert_eq!(status, reqwest::StatusCode::OK, "{none}");
    assert_eq!(none, json!({"agents": [], "errors": []}));
}
