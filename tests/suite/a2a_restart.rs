//! A2A across restarts of the real `troupe serve` binary over one data directory: killed with
//! SIGKILL while one task runs and another waits behind it, it comes back with every task
//! (found by GetTask and ListTasks with their history and artifacts), ends the running one
//! FAILED (its webhook hears it), runs the waiting one, and the context goes on in the same
//! conversation. Idle contexts' conversations close (`TROUPE_A2A_IDLE_CLOSE`), a restart
//! reopens none of them, and the next message to one reopens that one with its history. A
//! start that cannot read the records it must take back fails instead of serving without them.

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use troupe_runtime::ScriptedReply;
use troupe_tests::troupe_bin;

/// `troupe serve` over `dir/data`, its model answering `replies` (from the start of the list
/// at every start), A2A contexts closing after `idle_close`.
fn serve(dir: &Path, replies: &[ScriptedReply], idle_close: &str) -> (Child, String) {
    let script = dir.join("script.json");
    std::fs::write(&script, json!({ "replies": replies }).to_string()).unwrap();
    let mut command = Command::new(troupe_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--script")
        .arg(&script)
        .current_dir(dir)
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_A2A")
        .env_remove("TROUPE_A2A_PROJECT")
        .env("TROUPE_A2A_IDLE_CLOSE", idle_close)
        .stderr(Stdio::null());
    troupe_tests::spawn_serve(&mut command)
}

fn kill9(child: &mut Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
}

fn sigterm(child: &mut Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "serve exited with {status}");
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    fn new(base: &str) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.to_owned(),
        }
    }

    async fn a2a(&self, method: &str, params: Value) -> Value {
        self.http
            .post(format!("{}/a2a", self.base))
            .header("A2A-Version", "1.0")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn rpc(&self, method: &str, params: Value) -> Value {
        let v: Value = self
            .http
            .post(format!("{}/rpc", self.base))
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(v.get("error").is_none(), "{method}: {v}");
        v["result"].clone()
    }

    /// A send in `context` (a new one when `None`); with `config`, its configuration.
    async fn send(&self, text: &str, context: Option<&str>, config: Value) -> Value {
        let mut message = json!({"messageId": format!("m-{text}"), "role": "ROLE_USER",
                                 "parts": [{"text": text}]});
        if let Some(c) = context {
            message["contextId"] = json!(c);
        }
        let r = self
            .a2a(
                "SendMessage",
                json!({"message": message, "configuration": config}),
            )
            .await;
        assert!(r["result"]["task"].is_object(), "{r}");
        r["result"]["task"].clone()
    }

    async fn get(&self, task_id: &str) -> Value {
        let r = self.a2a("GetTask", json!({"id": task_id})).await;
        assert!(r["result"].is_object(), "{r}");
        r["result"].clone()
    }

    async fn wait_state(&self, task_id: &str, want: &str) -> Value {
        for _ in 0..500 {
            let t = self.get(task_id).await;
            if t["status"]["state"] == want {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "{task_id} never reached {want}: {}",
            self.get(task_id).await
        )
    }

    /// The A2A session's id.
    async fn a2a_session(&self) -> String {
        let r = self
            .http
            .get(format!("{}/api/projects/a2a/current-session", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let v: Value = r.json().await.unwrap();
        v["session"]["session_id"]
            .as_str()
            .or_else(|| v["session_id"].as_str())
            .unwrap_or_else(|| panic!("no session in {v}"))
            .to_owned()
    }

    /// The state of each of the A2A session's stored conversations, by id.
    async fn conversation_states(&self) -> Vec<(String, String)> {
        let session = self.a2a_session().await;
        let list = self
            .rpc("conversation.list", json!({"session_id": session}))
            .await;
        list.as_array()
            .or_else(|| list["conversations"].as_array())
            .unwrap_or_else(|| panic!("{list}"))
            .iter()
            .map(|c| {
                (
                    c["conversation_id"].as_str().unwrap().to_owned(),
                    c["state"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    async fn metric(&self, name: &str) -> f64 {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    }
}

fn conversation_of(task: &Value) -> String {
    task["metadata"]["troupe"]["conversationId"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A webhook on loopback (in this process, so it outlives the server): every body.
async fn webhook() -> (String, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null));
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2a_tasks_and_contexts_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, base) = serve(
        dir.path(),
        &[
            ScriptedReply::text("first answer"),
            ScriptedReply::hang(true),
        ],
        "10m",
    );
    let c = Client::new(&base);
    let first = c.send("one", None, json!({})).await;
    assert_eq!(first["status"]["state"], "TASK_STATE_COMPLETED", "{first}");
    let context = first["contextId"].as_str().unwrap().to_owned();
    let conversation = conversation_of(&first);
    let (hook, mut heard) = webhook().await;
    let running = c
        .send(
            "two",
            Some(&context),
            json!({"returnImmediately": true,
                   "taskPushNotificationConfig": {"url": hook, "token": "tok"}}),
        )
        .await;
    let running_id = running["id"].as_str().unwrap().to_owned();
    c.wait_state(&running_id, "TASK_STATE_WORKING").await;
    let queued = c
        .send("three", Some(&context), json!({"returnImmediately": true}))
        .await;
    let queued_id = queued["id"].as_str().unwrap().to_owned();
    assert_eq!(queued["status"]["state"], "TASK_STATE_SUBMITTED");
    kill9(&mut child);

    let (mut child, base) = serve(
        dir.path(),
        &[
            ScriptedReply::text("queued ran"),
            ScriptedReply::text("after the restart"),
        ],
        "10m",
    );
    let c = Client::new(&base);
    let got = c.get(first["id"].as_str().unwrap()).await;
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED", "{got}");
    assert_eq!(got["history"][0]["parts"][0]["text"], "one");
    assert_eq!(got["artifacts"][0]["parts"][0]["text"], "first answer");
    let failed = c.wait_state(&running_id, "TASK_STATE_FAILED").await;
    let note = failed["status"]["message"]["parts"][0]["text"].to_string();
    assert!(note.contains("interrupted by a restart"), "{note}");
    let mut states = Vec::new();
    while !states.iter().any(|s| s == "TASK_STATE_FAILED") {
        let body = tokio::time::timeout(Duration::from_secs(20), heard.recv())
            .await
            .expect("the webhook hears the task's end after the restart")
            .unwrap();
        if let Some(s) = body["statusUpdate"]["status"]["state"].as_str() {
            states.push(s.to_owned());
        }
    }
    let ran = c.wait_state(&queued_id, "TASK_STATE_COMPLETED").await;
    assert_eq!(ran["artifacts"][0]["parts"][0]["text"], "queued ran");
    assert_eq!(conversation_of(&ran), conversation);
    let after = c.send("four", Some(&context), json!({})).await;
    assert_eq!(after["status"]["state"], "TASK_STATE_COMPLETED", "{after}");
    assert_eq!(conversation_of(&after), conversation);
    let listed = c.a2a("ListTasks", json!({"contextId": context})).await;
    assert_eq!(listed["result"]["totalSize"], 4, "{listed}");
    // The conversation has what it said before the crash.
    let session = c.a2a_session().await;
    let stats = c
        .rpc(
            "conversation.stats",
            json!({"session_id": session, "conversation_id": conversation}),
        )
        .await;
    assert!(stats["tasks"].as_u64().unwrap() >= 3, "{stats}");
    sigterm(&mut child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_contexts_are_closed_and_a_restart_reopens_none() {
    const CONTEXTS: usize = 30;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, base) = serve(dir.path(), &[], "200ms");
    let c = Client::new(&base);
    let mut contexts = Vec::new();
    for i in 0..CONTEXTS {
        let t = c.send(&format!("hello {i}"), None, json!({})).await;
        assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED", "{t}");
        contexts.push((
            t["contextId"].as_str().unwrap().to_owned(),
            conversation_of(&t),
        ));
    }
    let open = |states: &[(String, String)]| states.iter().filter(|(_, s)| s == "open").count();
    let mut states = c.conversation_states().await;
    for _ in 0..250 {
        if open(&states) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
        states = c.conversation_states().await;
    }
    assert_eq!(open(&states), 1, "only the root stays open: {states:?}");
    assert_eq!(states.len(), CONTEXTS + 1);
    assert_eq!(c.metric("troupe_a2a_contexts_open").await, 0.0);
    sigterm(&mut child);

    let (mut child, base) = serve(dir.path(), &[], "10m");
    let c = Client::new(&base);
    let (context, conversation) = &contexts[7];
    let back = c.send("back again", Some(context), json!({})).await;
    assert_eq!(back["status"]["state"], "TASK_STATE_COMPLETED", "{back}");
    assert_eq!(&conversation_of(&back), conversation);
    let states = c.conversation_states().await;
    assert_eq!(
        open(&states),
        2,
        "the root and the one reopened: {states:?}"
    );
    assert_eq!(c.metric("troupe_conversations_reopened_total").await, 1.0);
    let session = c.a2a_session().await;
    let stats = c
        .rpc(
            "conversation.stats",
            json!({"session_id": session, "conversation_id": conversation}),
        )
        .await;
    assert_eq!(stats["tasks"], 2, "its history came back: {stats}");
    sigterm(&mut child);
}

/// A start that cannot read the A2A records it must take back (here the tasks' table is out
/// of reach) fails, saying so, instead of serving with none of them: those tasks would stay
/// unfinished for good. Once the records can be read, it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_cannot_read_the_a2a_records_fails_instead_of_serving_without_them() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _base) = serve(dir.path(), &[], "1h");
    sigterm(&mut child);
    let db = rusqlite::Connection::open(troupe_store::db_path(&dir.path().join("data"))).unwrap();
    db.execute_batch("ALTER TABLE a2a_tasks RENAME TO a2a_tasks_away")
        .unwrap();

    let script = dir.path().join("script.json");
    let mut second = Command::new(troupe_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--script")
        .arg(&script)
        .current_dir(dir.path())
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_A2A")
        .env_remove("TROUPE_A2A_PROJECT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = second.kill();
            let _ = second.wait();
            panic!("troupe serve started without the A2A records it could not read");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("a2a"), "{stderr}");

    db.execute_batch("ALTER TABLE a2a_tasks_away RENAME TO a2a_tasks")
        .unwrap();
    let (mut third, _base) = serve(dir.path(), &[], "1h");
    sigterm(&mut third);
}
