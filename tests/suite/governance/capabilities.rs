//! The capability registry (A6) through the real `troupe serve` and a model over HTTP (the
//! test model server): one line per capability in the prompt, `capability_inspect` at its
//! three levels, `capability_run` running a command under the sandbox, a capability the
//! tool policy denies neither shown nor runnable (`policy_rejected`); the capabilities
//! directory watched (a valid edit applies to the next task, a broken one keeps the last
//! good version and is reported with its file and field); `SIGHUP` reading troupe.toml
//! again (its `[tools]` and `[agents] dir` apply to the next task, a broken file keeps the running
//! configuration, a change of a setting that is not reloadable is reported as needing a restart).

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

/// A capability folder: `echo`'s `hello` command, its documents, and `echo PROBE-OF-<id>`
/// as its probe (what it prints is the test's own, whatever `echo` the system has).
fn capability(dir: &Path, id: &str, description: &str) {
    capability_in(&dir.join("capabilities"), id, description);
}

/// [`capability`] in the capabilities directory `root`.
fn capability_in(root: &Path, id: &str, description: &str) {
    let folder = root.join(id);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("module.json"),
        json!({
            "id": id,
            "description": description,
            "commands": [
                {"name": "hello", "argv": ["echo", "hello", "{name}"], "description": "Greets someone."}
            ],
            "probe": ["echo", format!("PROBE-OF-{id}")],
            "timeout": "10s"
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        folder.join("README.md"),
        format!("# {id}\nUSAGE-OF-{id}: say hello to a name.\n"),
    )
    .unwrap();
    std::fs::write(
        folder.join("cli.md"),
        format!("# {id} reference\nFULL-DETAIL-OF-{id}\n"),
    )
    .unwrap();
}

fn config(dir: &Path, model: &ModelServer, tools: &str) -> String {
    format!(
        "data_dir = {:?}\nlog_dir = {:?}\n\n[model]\nprovider = \"openai-chat\"\nbase_url = \"{}\"\napi_key_env = \"\"\nmodel = \"gpt-4o-mini\"\n\n[chat]\napproval_policy = \"never\"\n\n[tools]\n{tools}\n",
        dir.join("data"),
        dir.join("history"),
        model.base_url()
    )
}

fn serve(dir: &Path) -> (Serving, Api, String) {
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let mut command = Command::new(troupe_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.join("troupe.toml"))
        .current_dir(dir)
        .env_remove("TROUPE_AGENTS_DIR")
        .env_remove("TROUPE_CAPABILITIES_DIR")
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_LISTEN")
        .env("RUST_LOG", "info")
        .stderr(Stdio::from(log));
    let (child, base) = troupe_tests::spawn_serve(&mut command);
    (Serving(child), Api::new(&base, None), base)
}

/// The system text and tool names of the model's `n`th request.
fn asked(model: &ModelServer, n: usize) -> (String, Vec<String>) {
    let body = &model.requests()[n].body;
    let system = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "system" || m["role"] == "developer")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
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

/// What the last tool result of the model's `n`th request said.
fn tool_result(model: &ModelServer, n: usize) -> String {
    let body = &model.requests()[n].body;
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no tool result in request {n}: {body}"))
        .to_owned()
}

fn call(name: &str, args: Value) -> Reply {
    Reply::tool_call(name, [args.to_string()])
}

/// Polls until `done` (10 s at most).
async fn until<T>(what: &str, mut done: impl AsyncFnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = done().await {
            return v;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metric(api: &Api, series: &str) -> f64 {
    let text = api
        .request(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A WebSocket subscribed to a session's live events.
struct Subscribed(
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
);

impl Subscribed {
    async fn to(api_base: &str, session: &str) -> Self {
        let ws_base = api_base.replace("http://", "ws://");
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("{ws_base}/rpc/ws"))
            .await
            .unwrap();
        ws.send(Message::text(
            json!({"jsonrpc": "2.0", "id": 1, "method": "events.subscribe", "params": {"session_id": session}})
                .to_string(),
        ))
        .await
        .unwrap();
        let mut me = Self(ws);
        loop {
            let frame = me.next_frame().await;
            if frame["id"] == 1 {
                assert!(frame["result"]["subscription"].is_u64(), "{frame}");
                return me;
            }
        }
    }

    async fn next_frame(&mut self) -> Value {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(10), self.0.next())
                .await
                .expect("a frame in time")
                .expect("the socket is open")
                .unwrap();
            if let Message::Text(text) = message {
                return serde_json::from_str(text.as_str()).unwrap();
            }
        }
    }

    /// The message of the next `config_rejected` warning.
    async fn rejection(&mut self) -> String {
        loop {
            let frame = self.next_frame().await;
            let event = &frame["params"]["event"];
            if event["kind"] == "warning" && event["data"]["code"] == "config_rejected" {
                return event["data"]["message"].as_str().unwrap().to_owned();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_sees_one_line_each_inspects_and_runs_and_a_denied_capability_is_refused() {
    let model = ModelServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    capability(dir.path(), "greet", "Greets people by name.");
    capability(dir.path(), "secret", "Must stay hidden.");
    std::fs::write(
        dir.path().join("troupe.toml"),
        config(dir.path(), &model, "blacklist = [\"capability__secret\"]"),
    )
    .unwrap();
    let (_serving, api, _) = serve(dir.path());
    let sid = id(&api.session(None).await, "session_id");
    for reply in [
        call("capability_inspect", json!({"id": "greet"})),
        call("capability_inspect", json!({"id": "greet", "level": 2})),
        call("capability_inspect", json!({"id": "greet", "level": 3})),
        call(
            "capability_run",
            json!({"id": "greet", "command": "hello", "args": {"name": "world"}}),
        ),
        call(
            "capability_run",
            json!({"id": "secret", "command": "hello", "args": {"name": "x"}}),
        ),
        call("capability_inspect", json!({"id": "secret", "level": 2})),
        call("capability_inspect", json!({})),
        Reply::text(["done"]),
    ] {
        model.push(reply);
    }
    let reply = api.say(&sid, "greet the world").await;
    assert_eq!(reply["reply"]["text"], "done", "{reply}");

    // The prompt: one line for the capability the policy allows, none for the other.
    let (system, tools) = asked(&model, 0);
    assert!(
        system.contains("- greet: Greets people by name."),
        "{system}"
    );
    assert!(!system.contains("secret"), "{system}");
    assert!(
        tools.contains(&"capability_inspect".to_owned())
            && tools.contains(&"capability_run".to_owned()),
        "{tools:?}"
    );
    // Level 1: the commands; 2: README.md; 3: cli.md and the probe's output.
    let one = tool_result(&model, 1);
    assert!(
        one.contains("- hello: Greets someone. (argv: echo hello {name})"),
        "{one}"
    );
    assert!(!one.contains("USAGE-OF-greet"), "{one}");
    let two = tool_result(&model, 2);
    assert!(two.contains("USAGE-OF-greet"), "{two}");
    assert!(!two.contains("FULL-DETAIL"), "{two}");
    let three = tool_result(&model, 3);
    assert!(three.contains("FULL-DETAIL-OF-greet"), "{three}");
    assert!(three.contains("$ echo PROBE-OF-greet"), "{three}");
    // The probe's output, on a line of its own: it ran.
    assert!(
        three.lines().any(|l| l.trim() == "PROBE-OF-greet"),
        "{three}"
    );
    // The command ran, through the sandbox, with its argument.
    let ran = tool_result(&model, 4);
    assert!(
        ran.contains("exit code 0") && ran.contains("hello world"),
        "{ran}"
    );
    // The denied capability is refused, to run and to inspect.
    for n in [5, 6] {
        let refused = tool_result(&model, n);
        assert!(
            refused.contains("capability__secret") && refused.contains("blacklist"),
            "{refused}"
        );
        assert!(!refused.contains("USAGE-OF-secret"), "{refused}");
    }
    // The list without an id shows only what the policy allows.
    let list = tool_result(&model, 7);
    assert!(list.contains("- greet: "), "{list}");
    assert!(!list.contains("secret"), "{list}");

    let events = api
        .sse(&sid, None, |seen| {
            seen.iter()
                .filter(|e| e["kind"] == "policy_rejected")
                .count()
                >= 2
        })
        .await;
    let refused: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "policy_rejected")
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    for e in refused {
        assert_eq!(e["data"]["tool"], "capability__secret", "{e}");
        assert_eq!(e["data"]["reason"], "tool_denied", "{e}");
    }
    // Its metrics, from /metrics.
    assert_eq!(
        metric(&api, "troupe_capability_runs_total{outcome=\"ok\"}").await,
        1.0
    );
    assert_eq!(
        metric(&api, "troupe_capability_inspections_total{level=\"full\"}").await,
        1.0
    );
    assert_eq!(metric(&api, "troupe_capability_registered").await, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_capability_applies_to_the_next_task_and_a_broken_one_keeps_the_last_good() {
    let model = ModelServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    capability(dir.path(), "greet", "Version one.");
    std::fs::write(
        dir.path().join("troupe.toml"),
        config(dir.path(), &model, ""),
    )
    .unwrap();
    let (_serving, api, base) = serve(dir.path());
    let sid = id(&api.session(None).await, "session_id");
    let mut events = Subscribed::to(&base, &sid).await;
    for text in ["one", "two", "three"] {
        model.push(Reply::text([text]));
    }
    assert_eq!(api.say(&sid, "hi").await["reply"]["text"], "one");
    assert!(asked(&model, 0).0.contains("- greet: Version one."));

    // A valid edit, and a new capability: the next task sees both.
    capability(dir.path(), "greet", "Version two.");
    capability(dir.path(), "wave", "Waves.");
    until("the edit is read", async || {
        (metric(&api, "troupe_capability_registered").await == 2.0).then_some(())
    })
    .await;
    assert_eq!(api.say(&sid, "hi again").await["reply"]["text"], "two");
    let (system, _) = asked(&model, 1);
    assert!(system.contains("- greet: Version two."), "{system}");
    assert!(system.contains("- wave: Waves."), "{system}");

    // A broken edit: reported with its file and field; version two stays.
    std::fs::write(
        dir.path().join("capabilities/greet/module.json"),
        json!({"id": "greet", "description": "Broken.", "commands": [{"name": "hello", "argv": [], "description": "x"}], "probe": ["echo"]}).to_string(),
    )
    .unwrap();
    let warning = events.rejection().await;
    assert!(
        warning.contains("greet/module.json")
            && warning.contains("commands[0].argv")
            && warning.contains("last good version stays"),
        "{warning}"
    );
    assert_eq!(
        api.say(&sid, "still there?").await["reply"]["text"],
        "three"
    );
    let (system, _) = asked(&model, 2);
    assert!(system.contains("- greet: Version two."), "{system}");
    assert!(!system.contains("Broken."), "{system}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rereads_the_configuration_and_a_broken_file_keeps_the_running_one() {
    let model = ModelServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    capability(dir.path(), "greet", "Greets people by name.");
    let toml = dir.path().join("troupe.toml");
    // Two agents directories: `[agents] dir` names the first, then the second.
    for (folder, id) in [("agents", "coder"), ("agents2", "reviewer")] {
        std::fs::create_dir(dir.path().join(folder)).unwrap();
        std::fs::write(
            dir.path().join(folder).join(format!("{id}.json")),
            json!({"id": id, "role": "executor", "provider": {"type": "model"}}).to_string(),
        )
        .unwrap();
    }
    let agents = |folder: &str| format!("\n[agents]\nrouter = \"rules\"\ndir = \"{folder}\"\n");
    std::fs::write(&toml, config(dir.path(), &model, "") + &agents("agents")).unwrap();
    let (serving, api, base) = serve(dir.path());
    let pid = serving.0.id().to_string();
    let hup = || {
        let status = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
        assert!(status.success());
    };
    let reloads = async |outcome: &str| {
        metric(
            &api,
            &format!("troupe_config_file_reloads_total{{outcome=\"{outcome}\"}}"),
        )
        .await
    };
    let sid = id(&api.session(None).await, "session_id");
    let mut events = Subscribed::to(&base, &sid).await;
    for text in ["one", "two", "three"] {
        model.push(Reply::text([text]));
    }
    assert_eq!(api.say(&sid, "hi").await["reply"]["text"], "one");
    assert!(asked(&model, 0).0.contains("- greet: "));

    // [tools] now denies the capability, and the history bound changed: the policy applies
    // to the next task; the bound waits for a restart, and says so.
    let denying = config(dir.path(), &model, "blacklist = [\"capability__*\"]")
        + "\n[history]\nmax_items = 7\n"
        + &agents("agents2");
    let ids = async || {
        let (_, listing) = api.get("/api/agents").await;
        listing["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids().await, ["coder"]);
    std::fs::write(&toml, denying).unwrap();
    hup();
    until("SIGHUP is handled", async || {
        (reloads("restart_needed").await == 1.0).then_some(())
    })
    .await;
    let warning = events.rejection().await;
    assert!(
        warning.contains("history.max_items") && warning.contains("needs a restart"),
        "{warning}"
    );
    // `[agents] dir` names the other directory: its definitions are in force.
    assert_eq!(ids().await, ["reviewer"]);
    assert_eq!(api.say(&sid, "hi again").await["reply"]["text"], "two");
    let (system, tools) = asked(&model, 1);
    assert!(!system.contains("greet"), "{system}");
    assert!(
        !tools.iter().any(|t| t.starts_with("capability")),
        "{tools:?}"
    );

    // A broken file: reported, and the running configuration (the denial) stays.
    std::fs::write(&toml, "[tools\nblacklist = ").unwrap();
    hup();
    until("the broken file is reported", async || {
        (reloads("rejected").await == 1.0).then_some(())
    })
    .await;
    let warning = events.rejection().await;
    assert!(
        warning.contains("troupe.toml") && warning.contains("stays in force"),
        "{warning}"
    );
    assert_eq!(api.say(&sid, "and now?").await["reply"]["text"], "three");
    let (system, _) = asked(&model, 2);
    assert!(!system.contains("greet"), "{system}");
    assert_eq!(ids().await, ["reviewer"]);
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap();
    assert!(log.contains("configuration not reloaded"), "{log}");
    assert!(log.contains("history.max_items"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_task_keeps_its_snapshot_and_sighup_changes_the_capabilities_dir_and_budget() {
    let model = ModelServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    capability(dir.path(), "greet", "Version one.");
    capability_in(&dir.path().join("caps2"), "wave", "Waves.");
    let toml = dir.path().join("troupe.toml");
    std::fs::write(&toml, config(dir.path(), &model, "")).unwrap();
    let (serving, api, _) = serve(dir.path());
    let pid = serving.0.id().to_string();
    let reloads = async || metric(&api, "troupe_config_file_reloads_total{outcome=\"ok\"}").await;
    let hup = async |config: String, nth: f64| {
        std::fs::write(&toml, config).unwrap();
        let status = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
        assert!(status.success());
        until("SIGHUP is handled", async || {
            (reloads().await == nth).then_some(())
        })
        .await;
    };
    let sid = id(&api.session(None).await, "session_id");
    // The first task's first step answers slowly: the capabilities change meanwhile.
    model.push(call("capability_inspect", json!({"id": "greet"})).delayed(Duration::from_secs(3)));
    for text in ["one", "two", "three", "four"] {
        model.push(Reply::text([text]));
    }
    let first = {
        let api = Api::new(&api.base, None);
        let sid = sid.clone();
        tokio::spawn(async move { api.say(&sid, "hi").await })
    };
    until("the first step is asked", async || {
        (!model.requests().is_empty()).then_some(())
    })
    .await;
    capability(dir.path(), "greet", "Version two.");
    capability(dir.path(), "extra", "Added while it ran.");
    until("the edit is read", async || {
        (metric(&api, "troupe_capability_registered").await == 2.0).then_some(())
    })
    .await;
    assert_eq!(
        model.requests().len(),
        1,
        "the edit was read while the first step still waited"
    );
    assert_eq!(first.await.unwrap()["reply"]["text"], "one");
    // Its second step still sees what the task started with.
    let (system, _) = asked(&model, 1);
    assert!(system.contains("- greet: Version one."), "{system}");
    assert!(!system.contains("extra"), "{system}");
    let inspected = tool_result(&model, 1);
    assert!(!inspected.contains("Version two"), "{inspected}");
    // The next task sees the change.
    assert_eq!(api.say(&sid, "again").await["reply"]["text"], "two");
    let (system, _) = asked(&model, 2);
    assert!(
        system.contains("- greet: Version two.") && system.contains("- extra: Added while it ran."),
        "{system}"
    );

    // SIGHUP: `[capabilities] dir` names another directory; the next task sees its
    // capabilities only.
    let base = config(dir.path(), &model, "");
    hup(format!("{base}\n[capabilities]\ndir = \"caps2\"\n"), 1.0).await;
    assert_eq!(api.say(&sid, "and now?").await["reply"]["text"], "three");
    let (system, _) = asked(&model, 3);
    assert!(system.contains("- wave: Waves."), "{system}");
    assert!(!system.contains("greet"), "{system}");
    // And a budget of one token: no line fits, the prompt says how many there are.
    hup(
        format!("{base}\n[capabilities]\ndir = \"caps2\"\nprompt_tokens = 1\n"),
        2.0,
    )
    .await;
    assert_eq!(api.say(&sid, "last").await["reply"]["text"], "four");
    let (system, _) = asked(&model, 4);
    assert!(!system.contains("- wave:"), "{system}");
    assert!(system.lines().any(|l| l.starts_with("+1 more")), "{system}");
    assert_eq!(
        metric(&api, "troupe_capability_prompt_truncations_total").await,
        1.0
    );
}
