//! Live configuration (A7): editing an agent file while the real `troupe serve` runs changes
//! the next task's tools and instructions without a restart; a broken edit keeps the last
//! good version in force and is reported (file and field) in the listing and the event
//! stream; `agents.list` and `troupe agents list` show the version in force.

use crate::suite::serve::{Api, id};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;
use troupe_test_support::{ModelServer, Reply};
use troupe_tests::troupe_bin;

struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn coder(instructions: &str, whitelist: &str) -> String {
    format!(
        r#"{{"id": "coder", "role": "executor",
            "provider": {{"type": "model", "instructions": "{instructions}"}},
            "tools": {{"whitelist": ["{whitelist}"]}}}}"#
    )
}

/// What the model was asked the `n`th time: its system text and its tool names.
fn asked(model: &ModelServer, n: usize) -> (String, Vec<String>) {
    let body = &model.requests()[n].body;
    let system = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "system" || m["role"] == "developer")
        .map(|m| m["content"].to_string())
        .collect::<Vec<_>>()
        .join("\n");
    let tools = body["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default();
    (system, tools)
}

fn coder_version(listing: &Value) -> String {
    listing["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == "coder")
        .and_then(|a| a["version"].as_str())
        .unwrap_or_else(|| panic!("no coder version in {listing}"))
        .to_owned()
}

/// Polls `GET /api/agents` until `done` says so (10 s at most).
async fn listing_until(api: &Api, done: impl Fn(&Value) -> bool) -> Value {
    let t0 = Instant::now();
    loop {
        let (_, listing) = api.get("/api/agents").await;
        if done(&listing) {
            return listing;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "not reloaded: {listing}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The next JSON text frame of a WebSocket (10 s at most).
async fn next_frame<S>(ws: &mut S) -> Value
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a frame in time")
            .expect("the socket is open")
            .unwrap();
        if let Message::Text(text) = message {
            return serde_json::from_str(text.as_str()).unwrap();
        }
    }
}

fn cli_version(dir: &Path) -> String {
    let out = Command::new(troupe_bin())
        .args(["agents", "list", "--json", "--config"])
        .arg(dir.join("troupe.toml"))
        .env_remove("TROUPE_AGENTS_DIR")
        .env_remove("TROUPE_CONFIG")
        .output()
        .unwrap();
    coder_version(&serde_json::from_slice(&out.stdout).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_agent_file_changes_the_next_task_and_a_broken_one_keeps_the_last_good() {
    let model = ModelServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("agents")).unwrap();
    let file = dir.path().join("agents/coder.json");
    std::fs::write(&file, coder("You are version one.", "update_plan")).unwrap();
    std::fs::write(
        dir.path().join("troupe.toml"),
        format!(
            "data_dir = {:?}\nlog_dir = {:?}\n\n[model]\nprovider = \"openai-chat\"\nbase_url = \"{}\"\napi_key_env = \"\"\nmodel = \"gpt-4o-mini\"\n\n[agents]\nrouter = \"rules\"\n",
            dir.path().join("data"),
            dir.path().join("history"),
            model.base_url()
        ),
    )
    .unwrap();
    let mut command = Command::new(troupe_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.path().join("troupe.toml"))
        .current_dir(dir.path())
        .env_remove("TROUPE_AGENTS_DIR")
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_LISTEN")
        .stderr(Stdio::null());
    let (child, base) = troupe_tests::spawn_serve(&mut command);
    let _serving = Serving(child);
    let api = Api::new(&base, None);
    let sid = id(&api.session(None).await, "session_id");

    for text in ["one", "two", "three"] {
        model.push(Reply::text([text]));
    }
    let (_, listing) = api.get("/api/agents").await;
    let v1 = coder_version(&listing);
    assert_eq!(cli_version(dir.path()), v1, "the CLI and the service agree");
    assert_eq!(
        api.say(&sid, "/hub coder hello").await["reply"]["text"],
        "one"
    );
    let (system, tools) = asked(&model, 0);
    assert!(system.contains("You are version one."), "{system}");
    assert!(!tools.iter().any(|t| t == "shell"), "{tools:?}");

    // An edit: the next task has the new instructions and tools, without a restart.
    std::fs::write(&file, coder("You are version two.", "shell")).unwrap();
    let listing = listing_until(&api, |l| coder_version(l) != v1).await;
    let v2 = coder_version(&listing);
    assert_eq!(cli_version(dir.path()), v2);
    assert_eq!(
        api.say(&sid, "/hub coder hello again").await["reply"]["text"],
        "two"
    );
    let (system, tools) = asked(&model, 1);
    assert!(system.contains("You are version two."), "{system}");
    assert!(!system.contains("version one"), "{system}");
    assert_eq!(tools, ["shell"]);

    // A broken edit: reported with its file and field; version two stays in force. A client
    // subscribed to the session's events sees the warning as it happens.
    let ws_base = base.replace("http://", "ws://");
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{ws_base}/rpc/ws"))
        .await
        .unwrap();
    ws.send(Message::text(
        json!({"jsonrpc": "2.0", "id": 1, "method": "events.subscribe", "params": {"session_id": sid}})
            .to_string(),
    ))
    .await
    .unwrap();
    loop {
        let frame = next_frame(&mut ws).await;
        if frame["id"] == 1 {
            assert!(frame["result"]["subscription"].is_u64(), "{frame}");
            break;
        }
    }
    std::fs::write(
        &file,
        r#"{"id": "coder", "provider": {"type": "carrier-pigeon"}}"#,
    )
    .unwrap();
    let warning = loop {
        let frame = next_frame(&mut ws).await;
        let event = &frame["params"]["event"];
        if event["kind"] == "warning" && event["data"]["code"] == "config_rejected" {
            break event.clone();
        }
    };
    let message = warning["data"]["message"].as_str().unwrap();
    assert!(
        message.contains("coder.json") && message.contains("provider.type"),
        "{message}"
    );
    let listing = listing_until(&api, |l| {
        l["errors"].as_array().is_some_and(|e| !e.is_empty())
    })
    .await;
    assert_eq!(listing["errors"][0]["field"], "provider.type", "{listing}");
    assert!(
        listing["errors"][0]["file"]
            .as_str()
            .unwrap()
            .ends_with("coder.json"),
        "{listing}"
    );
    assert_eq!(coder_version(&listing), v2, "the last good version stays");
    assert_eq!(
        api.say(&sid, "/hub coder still there?").await["reply"]["text"],
        "three"
    );
    let (system, _) = asked(&model, 2);
    assert!(system.contains("You are version two."), "{system}");
}
