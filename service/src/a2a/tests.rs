//! The endpoint over real HTTP, in front of a real session with the scripted model: the
//! paths the Python SDK test does not take (approvals as INPUT_REQUIRED, the 0.3 stream's
//! `final`, a queued task's cancel, error codes on the wire).

use super::*;
use serde_json::{Value, json};
use troupe_actors::history::LocalSummarizer;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::SessionId;
use troupe_runtime::exec::ProcessRunner;
use troupe_runtime::scripted::{ScriptedModel, ScriptedReply};

pub(super) struct Fixture {
    pub(super) session: SessionHandle,
    pub(super) model: Arc<ScriptedModel>,
    pub(super) a2a: A2a,
    pub(super) url: String,
    pub(super) http: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Fixture {
    pub(super) async fn start(replies: Vec<ScriptedReply>) -> Self {
        Self::start_with(replies, |_| {}).await
    }

    pub(super) async fn start_with(
        replies: Vec<ScriptedReply>,
        tune: impl FnOnce(&mut SessionConfig),
    ) -> Self {
        Self::start_tuned(replies, tune, |_| {}).await
    }

    /// With the session's and the endpoint's settings tuned.
    pub(super) async fn start_tuned(
        replies: Vec<ScriptedReply>,
        tune: impl FnOnce(&mut SessionConfig),
        tune_a2a: impl FnOnce(&mut A2aConfig),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let model = Arc::new(ScriptedModel::new(replies));
        let mut config = SessionConfig {
            data_dir: dir.path().to_path_buf(),
            ..SessionConfig::default()
        };
        tune(&mut config);
        config.conversation.shell_tool = true;
        // Commands run unconfined (no sandbox is enforced yet): the approval is what guards.
        config.conversation.sandbox_policy = troupe_proto::SandboxPolicy::FullAccess;
        let ports = SessionPorts {
            model: model.clone(),
            mcp: None,
            mcp_connector: None,
            exec: Some(Arc::new(ProcessRunner::new())),
            effects: troupe_actors::ports::Effects::Live,
            summarizer: Arc::new(LocalSummarizer::default()),
            tokens: Arc::new(troupe_actors::ports::ApproxTokens),
            rollout_storage: None,
            agents: None,
        };
        let (session, _join) = SessionHandle::start(SessionId::new(), config, ports)
            .await
            .unwrap();
        let mut a2a_config = A2aConfig::default();
        // Push notifications retry fast here.
        a2a_config.tasks.push_retry = push::RetryPolicy {
            attempts: 4,
            base: std::time::Duration::from_millis(20),
            max: std::time::Duration::from_millis(100),
            timeout: std::time::Duration::from_secs(10),
        };
        tune_a2a(&mut a2a_config);
        let a2a = A2a::start(
            Arc::new(session.clone()),
            Arc::new(troupe_store::memory::MemoryStore::new()),
            a2a_config,
            None,
        )
        .await
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/a2a", listener.local_addr().unwrap());
        let app = a2a.router();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            session,
            model,
            a2a,
            url,
            http: reqwest::Client::new(),
            server,
            _dir: dir,
        }
    }

    /// One JSON-RPC call; `version` is the A2A-Version header (none when `None`).
    pub(super) async fn call(&self, version: Option<&str>, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        self.raw(version, body.to_string()).await
    }

    /// A 1.0 send that returns at once (`extra` goes into the message: a contextId, ...);
    /// answers the new task's id.
    pub(super) async fn send_now(&self, text: &str, extra: Value) -> String {
        let sent = self
            .call(
                Some("1.0"),
                "SendMessage",
                json!({"message": v1_message(text, extra),
                       "configuration": {"returnImmediately": true}}),
            )
            .await;
        sent["result"]["task"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no task in {sent}"))
            .to_owned()
    }

    pub(super) async fn raw(&self, version: Option<&str>, body: String) -> Value {
        let mut req = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body);
        if let Some(v) = version {
            req = req.header("A2A-Version", v);
        }
        req.send().await.unwrap().json().await.unwrap()
    }

    /// A streaming call, read to its end: the `result` of every frame.
    pub(super) async fn stream(
        &self,
        version: Option<&str>,
        method: &str,
        params: Value,
    ) -> Vec<Value> {
        let body = json!({"jsonrpc": "2.0", "id": 9, "method": method, "params": params});
        let mut req = self.http.post(&self.url).json(&body);
        if let Some(v) = version {
            req = req.header("A2A-Version", v);
        }
        let text = req.send().await.unwrap().text().await.unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str::<Value>(d).unwrap()["result"].clone())
            .collect()
    }

    pub(super) async fn wait_state(&self, task_id: &str, want: &str) -> Value {
        for _ in 0..200 {
            let r = self
                .call(Some("1.0"), "GetTask", json!({"id": task_id}))
                .await;
            if r["result"]["status"]["state"] == want {
                return r["result"].clone();
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("task {task_id} never reached {want}")
    }

    pub(super) async fn stop(self) {
        self.server.abort();
        self.a2a.stop().await;
        self.session.shutdown().await.unwrap();
    }
}

pub(super) fn v1_message(text: &str, extra: Value) -> Value {
    let mut m = json!({
        "messageId": format!("m-{text}"),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    });
    if let (Some(m), Some(e)) = (m.as_object_mut(), extra.as_object()) {
        m.extend(e.clone());
    }
    m
}

fn shell(argv: &[&str]) -> ScriptedReply {
    ScriptedReply::tool("shell", json!({ "command": argv }))
}

#[tokio::test]
async fn an_approval_is_input_required_and_answered_in_the_task() {
    let f = Fixture::start(vec![shell(&["echo", "a2a-ok"]), ScriptedReply::default()]).await;
    let task_id = f.send_now("run it", json!({})).await;
    let waiting = f.wait_state(&task_id, "TASK_STATE_INPUT_REQUIRED").await;
    let ask = &waiting["status"]["message"];
    assert_eq!(ask["role"], "ROLE_AGENT");
    assert_eq!(
        ask["parts"][1]["data"]["approvalRequest"]["command"],
        json!(["echo", "a2a-ok"])
    );
    // The answer goes to the same task and blocks until it settles again.
    let done = f
        .call(
            Some("1.0"),
            "SendMessage",
            json!({"message": v1_message("approve", json!({"taskId": task_id}))}),
        )
        .await;
    let task = &done["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    // The command's output is a file of the task; the answer comes after it.
    let file = &task["artifacts"][0];
    assert_eq!(file["name"], "shell output", "{task}");
    let output = &file["parts"][0];
    assert_eq!(
        (&output["mediaType"], &output["filename"]),
        (&json!("text/plain"), &json!("shell-1.txt"))
    );
    let bytes = reply::raw_bytes(output["raw"].as_str().unwrap()).unwrap();
    // The output as the model saw it: the exit code, then what the command printed.
    assert_eq!(
        String::from_utf8(bytes).unwrap().trim(),
        "exit code 0\na2a-ok"
    );
    assert_eq!(output["metadata"]["command"], json!(["echo", "a2a-ok"]));
    let answer = task["artifacts"][1]["parts"][0]["text"].as_str().unwrap();
    assert!(
        answer.contains("a2a-ok") && !answer.contains("sandbox"),
        "{answer}"
    );
    // The approval request moved into history behind the user's message, and the answer
    // follows it.
    let history = task["history"].as_array().unwrap();
    assert_eq!(history[0]["parts"][0]["text"], "run it");
    let asked = history
        .iter()
        .position(|m| m["parts"][1]["data"]["approvalRequest"].is_object())
        .expect("the approval request is in the history");
    assert_eq!(history[asked + 1]["role"], "ROLE_USER", "{history:?}");
    assert_eq!(history[asked + 1]["parts"][0]["text"], "approve");
    assert_eq!(history[asked + 1]["taskId"], task_id.as_str());
    f.stop().await;
}

/// The endpoint follows the session's events through the gap-free stream: with a live feed
/// of one event, a task streaming thousands of deltas beside a task that asks for approval
/// cannot make the endpoint miss the request (the stored event is read back from storage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_event_feed_loses_no_approval_request() {
    let long = "x".repeat(4000);
    let f = Fixture::start_with(
        vec![
            shell(&["echo", "lag"]),
            ScriptedReply::text(long.clone())
                .chunked(1)
                .delayed(std::time::Duration::from_millis(20)),
            ScriptedReply::default(),
        ],
        |c| {
            c.subscriber_capacity = 1;
            c.scheduler.limit = 2;
        },
    )
    .await;
    let a = f.send_now("first", json!({})).await;
    let b = f.send_now("second", json!({})).await;
    // One of them took the shell call and waits for a human, the other streamed its answer.
    let mut states = Vec::new();
    for _ in 0..500 {
        states.clear();
        for id in [&a, &b] {
            let r = f.call(Some("1.0"), "GetTask", json!({"id": id})).await;
            states.push(r["result"]["status"]["state"].as_str().unwrap().to_owned());
        }
        states.sort();
        if states == ["TASK_STATE_COMPLETED", "TASK_STATE_INPUT_REQUIRED"] {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        states,
        ["TASK_STATE_COMPLETED", "TASK_STATE_INPUT_REQUIRED"]
    );
    f.stop().await;
}

/// A stream whose client reads slower than the answer comes (its buffer of one event full
/// at once) misses text pieces, never the whole answer or the end: it was dropped, and ended
/// with neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_stream_skips_text_pieces_and_still_gets_the_answer_and_the_end() {
    let long: String = (0..2000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let f = Fixture::start_tuned(
        vec![ScriptedReply::text(long.clone()).chunked(1)],
        |_| {},
        |a| a.tasks.subscriber_buffer = 1,
    )
    .await;
    let frames = f
        .stream(
            Some("1.0"),
            "SendStreamingMessage",
            json!({"message": v1_message("tell me", json!({}))}),
        )
        .await;
    let last = frames.last().expect("frames");
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "the stream ends with the end: {last}"
    );
    let whole = frames
        .iter()
        .filter_map(|f| f.get("artifactUpdate"))
        .find(|u| u["lastChunk"] == true)
        .expect("the whole answer");
    assert_eq!(whole["artifact"]["parts"][0]["text"], long.as_str());
    f.stop().await;
}

/// Two clients, one slot for the whole session: a task waiting for input gives its slot back,
/// so another context's blocking send completes meanwhile.
#[tokio::test]
async fn a_task_waiting_for_input_does_not_block_another_context() {
    let f = Fixture::start(vec![
        shell(&["echo", "waits"]),
        ScriptedReply::text("the other answer"),
        ScriptedReply::default(),
    ])
    .await;
    let waiting = f.send_now("run it", json!({})).await;
    f.wait_state(&waiting, "TASK_STATE_INPUT_REQUIRED").await;
    // A bound on a hang, not a speed check.
    let other = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        f.call(
            Some("1.0"),
            "SendMessage",
            json!({"message": v1_message("hello", json!({"contextId": "other-client"}))}),
        ),
    )
    .await
    .expect("the other context's blocking send completes");
    let task = &other["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{other}");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "the other answer");
    let first = f.call(Some("1.0"), "GetTask", json!({"id": waiting})).await;
    assert_eq!(
        first["result"]["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    f.stop().await;
}

/// A task that waits for the session's slot (another context's task runs) is SUBMITTED, not
/// WORKING: it is WORKING from its first step.
#[tokio::test]
async fn a_task_waiting_for_a_slot_is_submitted() {
    let f = Fixture::start(vec![
        ScriptedReply::hang(true),
        ScriptedReply::text("ran after the other"),
    ])
    .await;
    let busy = f.send_now("hang", json!({"contextId": "ctx-busy"})).await;
    f.wait_state(&busy, "TASK_STATE_WORKING").await;
    let queued = f.send_now("next", json!({"contextId": "ctx-next"})).await;
    // Its troupe task started and waits for the slot the first one holds.
    for _ in 0..200 {
        let tasks = f.session.tasks(None).await.unwrap();
        if tasks.len() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let r = f.call(Some("1.0"), "GetTask", json!({"id": queued})).await;
    assert_eq!(
        r["result"]["status"]["state"], "TASK_STATE_SUBMITTED",
        "{r}"
    );
    f.call(Some("1.0"), "CancelTask", json!({"id": busy})).await;
    let done = f.wait_state(&queued, "TASK_STATE_COMPLETED").await;
    assert_eq!(
        done["artifacts"][0]["parts"][0]["text"],
        "ran after the other"
    );
    f.stop().await;
}

#[tokio::test]
async fn a_0_3_stream_is_final_at_input_required() {
    let f = Fixture::start(vec![shell(&["echo", "x"]), ScriptedReply::default()]).await;
    let frames = f
        .stream(
            None,
            "message/stream",
            json!({"message": {"kind": "message", "messageId": "m", "role": "user",
                               "parts": [{"kind": "text", "text": "go"}]}}),
        )
        .await;
    assert_eq!(frames[0]["kind"], "task");
    let last = frames.last().unwrap();
    assert_eq!(last["kind"], "status-update");
    assert_eq!(last["status"]["state"], "input-required");
    assert_eq!(last["final"], true);
    assert!(
        frames[1..frames.len() - 1]
            .iter()
            .all(|f| f["final"] != true),
        "{frames:?}"
    );
    let task_id = frames[0]["id"].as_str().unwrap();
    let denied = f
        .call(
            None,
            "message/send",
            json!({"message": {"kind": "message", "messageId": "m2", "role": "user",
                               "taskId": task_id,
                               "parts": [{"kind": "text", "text": "no thanks"}]}}),
        )
        .await;
    assert_eq!(denied["result"]["status"]["state"], "completed", "{denied}");
    f.stop().await;
}

#[tokio::test]
async fn a_queued_task_is_canceled_before_it_runs() {
    let f = Fixture::start(vec![ScriptedReply::hang(true)]).await;
    let first = f
        .call(
            Some("1.0"),
            "SendMessage",
            json!({"message": v1_message("first", json!({})),
                   "configuration": {"returnImmediately": true}}),
        )
        .await;
    let first = &first["result"]["task"];
    let second = f
        .call(
            Some("1.0"),
            "SendMessage",
            json!({"message": v1_message("second", json!({"contextId": first["contextId"]})),
                   "configuration": {"returnImmediately": true}}),
        )
        .await;
    let second = &second["result"]["task"];
    assert_eq!(second["status"]["state"], "TASK_STATE_SUBMITTED");
    assert_eq!(second["contextId"], first["contextId"]);
    let canceled = f
        .call(Some("1.0"), "CancelTask", json!({"id": second["id"]}))
        .await;
    assert_eq!(canceled["result"]["status"]["state"], "TASK_STATE_CANCELED");
    f.wait_state(first["id"].as_str().unwrap(), "TASK_STATE_WORKING")
        .await;
    let canceled = f
        .call(Some("1.0"), "CancelTask", json!({"id": first["id"]}))
        .await;
    assert_eq!(canceled["result"]["status"]["state"], "TASK_STATE_CANCELED");
    assert_eq!(f.model.calls(), 1, "the canceled queued task never ran");
    f.stop().await;
}

#[tokio::test]
async fn errors_carry_their_codes_on_the_wire() {
    let f = Fixture::start(vec![]).await;
    let code = |r: Value| r["error"]["code"].as_i64().unwrap();
    let msg = json!({"message": v1_message("x", json!({}))});
    assert_eq!(code(f.raw(Some("1.0"), "{nope".into()).await), -32700);
    assert_eq!(code(f.raw(Some("1.0"), "[1]".into()).await), -32600);
    assert_eq!(code(f.call(Some("1.0"), "Nope", json!({})).await), -32601);
    assert_eq!(
        code(f.call(Some("1.0"), "GetTask", json!({})).await),
        -32602
    );
    assert_eq!(
        code(
            f.call(Some("1.0"), "GetTask", json!({"id": "missing"}))
                .await
        ),
        -32001
    );
    assert_eq!(
        code(
            f.call(Some("1.0"), "GetTaskPushNotificationConfig", json!({}))
                .await
        ),
        -32602
    );
    assert_eq!(
        code(
            f.call(
                Some("1.0"),
                "GetTaskPushNotificationConfig",
                json!({"taskId": "missing", "id": "x"})
            )
            .await
        ),
        -32001
    );
    assert_eq!(
        code(f.call(Some("1.0"), "GetExtendedAgentCard", json!({})).await),
        -32004
    );
    let file = json!({"message": {"messageId": "f", "role": "ROLE_USER",
                                  "parts": [{"url": "https://x/cat.png", "mediaType": "image/png"}]}});
    assert_eq!(code(f.call(Some("1.0"), "SendMessage", file).await), -32005);
    assert_eq!(
        code(f.call(Some("0.5"), "SendMessage", msg.clone()).await),
        -32009
    );
    assert_eq!(code(f.call(None, "SendMessage", msg).await), -32009);
    // A streaming method that fails before it starts answers plain JSON.
    assert_eq!(
        code(
            f.call(Some("1.0"), "SubscribeToTask", json!({"id": "missing"}))
                .await
        ),
        -32001
    );
    f.stop().await;
}

#[tokio::test]
async fn the_card_names_the_endpoint_it_was_fetched_from() {
    let f = Fixture::start(vec![]).await;
    let base = f.url.trim_end_matches("/a2a");
    let card: Value = f
        .http
        .get(format!("{base}{CARD_PATH}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(card["supportedInterfaces"][0]["url"], f.url);
    assert!(
        card.get("url").is_none(),
        "the 1.0 card has no 0.3 fields: {card}"
    );
    // A 0.3 client gets the 0.3 card: by the header, or at the 0.3-era path.
    let v03 = |req: reqwest::RequestBuilder| async move {
        let r = req.send().await.unwrap();
        assert_eq!(r.headers()["vary"], "a2a-version");
        r.json::<Value>().await.unwrap()
    };
    for card in [
        v03(f
            .http
            .get(format!("{base}{CARD_PATH}"))
            .header("A2A-Version", "0.3"))
        .await,
        v03(f.http.get(format!("{base}{LEGACY_CARD_PATH}"))).await,
    ] {
        assert_eq!(card["url"], f.url, "{card}");
        assert_eq!(card["protocolVersion"], "0.3.0");
        assert!(card.get("supportedInterfaces").is_none());
    }
    // Cacheable: a client that has it gets 304 for its tag.
    let first = f
        .http
        .get(format!("{base}{CARD_PATH}"))
        .send()
        .await
        .unwrap();
    let tag = first.headers()["etag"].to_str().unwrap().to_owned();
    assert!(
        first.headers()["cache-control"]
            .to_str()
            .unwrap()
            .contains("max-age")
    );
    let again = f
        .http
        .get(format!("{base}{CARD_PATH}"))
        .header("If-None-Match", &tag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304);
    // Last-Modified: the same date back is 304, an earlier one gets the card.
    let modified = first.headers()["last-modified"]
        .to_str()
        .unwrap()
        .to_owned();
    let since = |date: String| {
        f.http
            .get(format!("{base}{CARD_PATH}"))
            .header("If-Modified-Since", date)
            .send()
    };
    assert_eq!(since(modified.clone()).await.unwrap().status(), 304);
    let earlier =
        httpdate::parse_http_date(&modified).unwrap() - std::time::Duration::from_secs(60);
    assert_eq!(
        since(httpdate::fmt_http_date(earlier))
            .await
            .unwrap()
            .status(),
        200
    );
    f.stop().await;
}

#[tokio::test]
async fn the_endpoint_takes_a_trailing_slash_and_only_json_bodies() {
    let f = Fixture::start(vec![ScriptedReply::text("slash ok")]).await;
    let send = json!({"jsonrpc": "2.0", "id": "s1", "method": "SendMessage",
                      "params": {"message": v1_message("hi", json!({}))}});
    // A client whose base URL is the card's URL posts to `/a2a/`.
    let r: Value = f
        .http
        .post(format!("{}/", f.url))
        .header("A2A-Version", "1.0")
        .json(&send)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["id"], "s1");
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
    // The body is not read unless it says it is JSON: the id is echoed, nothing runs.
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let mut req = f
            .http
            .post(&f.url)
            .header("A2A-Version", "1.0")
            .body(send.to_string());
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let r: Value = req.send().await.unwrap().json().await.unwrap();
        assert_eq!(r["error"]["code"], -32005, "{content_type:?}: {r}");
        assert_eq!(r["id"], "s1");
    }
    let ran = f.model.calls();
    assert_eq!(ran, 1, "only the JSON request reached the model");
    // Parameters and case do not matter.
    let r: Value = f
        .http
        .post(&f.url)
        .header("A2A-Version", "1.0")
        .header("content-type", "Application/JSON; charset=utf-8")
        .body(
            json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask",
                     "params": {"id": "missing"}})
            .to_string(),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["error"]["code"], -32001, "{r}");
    f.stop().await;
}

#[test]
fn requests_are_counted_by_method_version_and_outcome() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    ::metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let f = Fixture::start(vec![]).await;
            let msg = json!({"message": v1_message("hi", json!({}))});
            f.call(Some("1.0"), "SendMessage", msg.clone()).await;
            f.call(Some("1.0"), "GetTask", json!({"id": "missing"}))
                .await;
            f.call(None, "tasks/get", json!({"id": "missing"})).await;
            f.call(Some("9.9"), "SendMessage", msg).await;
            f.stop().await;
        });
    });
    let mut counted: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == metrics::REQUESTS_TOTAL)
        .map(|(key, _, _, value)| {
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let DebugValue::Counter(n) = value else {
                panic!("not a counter")
            };
            (labels.join(","), n)
        })
        // Series registered at 0 from the start are not requests.
        .filter(|(_, n)| *n > 0)
        .collect();
    counted.sort();
    assert_eq!(
        counted,
        [
            (
                "method=get_task,version=0.3,outcome=task_not_found".to_owned(),
                1
            ),
            (
                "method=get_task,version=1.0,outcome=task_not_found".to_owned(),
                1
            ),
            ("method=send_message,version=1.0,outcome=ok".to_owned(), 1),
            (
                "method=unknown,version=unsupported,outcome=version_not_supported".to_owned(),
                1
            ),
        ]
    );
}

/// Polls until a tasks actor other than `old` runs (at most 10 s).
async fn replaced(a2a: &A2a, old: ractor::ActorId) -> ActorRef<A2aTasksMsg> {
    for _ in 0..500 {
        if let Some(now) = a2a.actor().filter(|t| t.get_id() != old) {
            return now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the A2A actor was not replaced")
}

#[tokio::test]
async fn a_failed_a2a_actor_is_replaced_and_its_records_are_kept() {
    let f = Fixture::start(vec![
        ScriptedReply::text("before"),
        ScriptedReply::text("after"),
    ])
    .await;
    let first = f
        .call(
            Some("1.0"),
            "SendMessage",
            json!({"message": v1_message("one", json!({}))}),
        )
        .await;
    assert_eq!(
        first["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{first}"
    );
    let old = f.a2a.actor().unwrap().get_id();
    f.a2a
        .supervisor()
        .cast(supervisor::A2aSupervisorMsg::FailTasks)
        .unwrap();
    replaced(&f.a2a, old).await;
    let second = f
        .call(
            Some("1.0"),
            "SendMessage",
            json!({"message": v1_message("two", json!({}))}),
        )
        .await;
    let task = &second["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{second}");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "after");
    // The records outlive the failed actor: the new one finds the old task in the store.
    let old_task = first["result"]["task"]["id"].as_str().unwrap();
    let found = f
        .call(Some("1.0"), "GetTask", json!({"id": old_task}))
        .await;
    assert_eq!(
        found["result"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{found}"
    );
    assert_eq!(
        found["result"]["artifacts"][0]["parts"][0]["text"],
        "before"
    );
    f.stop().await;
}

#[tokio::test]
async fn an_a2a_actor_that_keeps_failing_is_given_up_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let config = SessionConfig {
        data_dir: dir.path().to_path_buf(),
        ..SessionConfig::default()
    };
    let ports = SessionPorts {
        model: Arc::new(ScriptedModel::new(Vec::new())),
        mcp: None,
        mcp_connector: None,
        exec: None,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: None,
        agents: None,
    };
    let (session, _join) = SessionHandle::start(SessionId::new(), config, ports)
        .await
        .unwrap();
    let (told_tx, mut told) = tokio::sync::mpsc::unbounded_channel();
    let give_up: supervisor::GiveUp = Arc::new(move |reason| {
        let _ = told_tx.send(reason);
    });
    let a2a = A2a::start(
        Arc::new(session.clone()),
        Arc::new(troupe_store::memory::MemoryStore::new()),
        A2aConfig::default(),
        Some(give_up),
    )
    .await
    .unwrap();
    for _ in 0..supervisor::RESTARTS_PER_WINDOW {
        let old = a2a.actor().unwrap().get_id();
        a2a.supervisor()
            .cast(supervisor::A2aSupervisorMsg::FailTasks)
            .unwrap();
        replaced(&a2a, old).await;
    }
    assert!(told.try_recv().is_err(), "not given up within the budget");
    a2a.supervisor()
        .cast(supervisor::A2aSupervisorMsg::FailTasks)
        .unwrap();
    let reason = tokio::time::timeout(std::time::Duration::from_secs(10), told.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(reason.contains("keeps failing"), "{reason}");
    assert!(a2a.actor().is_none(), "left down");
    a2a.stop().await;
    session.shutdown().await.unwrap();
}

/// A webhook on loopback: records each request's headers and body, and answers 503 to the
/// first one (troupe retries it).
struct Hook {
    url: String,
    got: Arc<tokio::sync::Mutex<Vec<(axum::http::HeaderMap, Value)>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Hook {
    async fn start() -> Self {
        let got: Arc<tokio::sync::Mutex<Vec<(axum::http::HeaderMap, Value)>>> = Arc::default();
        let seen = got.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let seen = seen.clone();
                    async move {
                        let mut seen = seen.lock().await;
                        let first = seen.is_empty();
                        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        seen.push((headers, body));
                        if first {
                            axum::http::StatusCode::SERVICE_UNAVAILABLE
                        } else {
                            axum::http::StatusCode::OK
                        }
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, got, server }
    }

    /// The bodies received once one of them is the task's terminal status (bounded wait).
    async fn until_terminal(&self) -> Vec<(axum::http::HeaderMap, Value)> {
        for _ in 0..500 {
            {
                let got = self.got.lock().await;
                let done = got.iter().any(|(_, b)| {
                    b["statusUpdate"]["status"]["state"]
                        .as_str()
                        .is_some_and(|s| s == "TASK_STATE_COMPLETED" || s == "TASK_STATE_CANCELED")
                });
                if done {
                    return got.clone();
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!(
            "the webhook never got the task's end: {:?}",
            self.got.lock().await
        )
    }
}

/// A push notification config given with SendMessage: the webhook gets every event of the
/// task, in order, as StreamResponse bodies with the config's token and credentials; the
/// first attempt, refused with 503, is retried.
#[tokio::test]
async fn push_notifications_reach_the_webhook_in_order_with_their_credentials() {
    let hook = Hook::start().await;
    let f = Fixture::start(vec![ScriptedReply::text("pushed answer").chunked(3)]).await;
    let sent = f
        .call(
            Some("1.0"),
            "SendMessage",
            json!({"message": v1_message("notify me", json!({})),
                   "configuration": {"taskPushNotificationConfig": {
                       "url": hook.url, "token": "tok-1",
                       "authentication": {"scheme": "Bearer", "credentials": "secret"}}}}),
        )
        .await;
    let task = &sent["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    let task_id = task["id"].as_str().unwrap();
    let got = hook.until_terminal().await;
    for (headers, body) in &got {
        assert_eq!(headers["x-a2a-notification-token"], "tok-1");
        assert_eq!(headers["authorization"], "Bearer secret");
        assert_eq!(headers["content-type"], "application/a2a+json");
        let event = body
            .as_object()
            .and_then(|o| o.values().next())
            .expect("a StreamResponse");
        assert_eq!(event["taskId"], task_id, "{body}");
    }
    // The first delivery was refused (503) and sent again.
    assert_eq!(got[0].1, got[1].1, "the refused body comes again");
    let bodies: Vec<&Value> = got[1..].iter().map(|(_, b)| b).collect();
    let states: Vec<&str> = bodies
        .iter()
        .filter_map(|b| b["statusUpdate"]["status"]["state"].as_str())
        .collect();
    assert_eq!(states, ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]);
    let mut text = String::new();
    for b in &bodies {
        let u = &b["artifactUpdate"];
        if u.is_object() {
            let piece = u["artifact"]["parts"][0]["text"].as_str().unwrap();
            if u["append"] == true {
                text.push_str(piece);
            } else {
                text = piece.to_owned();
            }
        }
    }
    assert_eq!(text, "pushed answer");
    hook.server.abort();
    f.stop().await;
}

/// Create, get, list and delete configs of a live task, in both versions' shapes.
#[tokio::test]
async fn push_configs_are_created_listed_and_deleted() {
    let hook = Hook::start().await;
    let f = Fixture::start(vec![ScriptedReply::hang(true)]).await;
    let task_id = f.send_now("wait", json!({})).await;
    let call = |method: &'static str, params: Value| f.call(Some("1.0"), method, params);
    let made = call(
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task_id, "id": "mine", "url": hook.url, "token": "t"}),
    )
    .await;
    assert_eq!(
        made["result"],
        json!({"id": "mine", "taskId": task_id, "url": hook.url, "token": "t"})
    );
    let named = call(
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task_id, "url": hook.url}),
    )
    .await;
    let named_id = named["result"]["id"].as_str().unwrap().to_owned();
    assert!(!named_id.is_empty(), "the server names it: {named}");
    let got = call(
        "GetTaskPushNotificationConfig",
        json!({"taskId": task_id, "id": "mine"}),
    )
    .await;
    assert_eq!(got["result"], made["result"]);
    let list = call(
        "ListTaskPushNotificationConfigs",
        json!({"taskId": task_id}),
    )
    .await;
    assert_eq!(
        list["result"]["configs"].as_array().unwrap().len(),
        2,
        "{list}"
    );
    assert_eq!(list["result"]["nextPageToken"], "");
    let deleted = call(
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": task_id, "id": "mine"}),
    )
    .await;
    assert_eq!(deleted["result"], json!({}));
    let again = call(
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": task_id, "id": "mine"}),
    )
    .await;
    assert_eq!(again["result"], json!({}), "idempotent");
    let gone = call(
        "GetTaskPushNotificationConfig",
        json!({"taskId": task_id, "id": "mine"}),
    )
    .await;
    assert_eq!(gone["error"]["code"], -32001);
    let code = |r: Value| r["error"]["code"].as_i64().unwrap();
    assert_eq!(
        code(
            call(
                "CreateTaskPushNotificationConfig",
                json!({"taskId": "nope", "url": hook.url})
            )
            .await
        ),
        -32001
    );
    assert_eq!(
        code(
            call(
                "CreateTaskPushNotificationConfig",
                json!({"taskId": task_id, "url": "/relative"})
            )
            .await
        ),
        -32602
    );
    // 0.3: the config nested under pushNotificationConfig, the task as `id`.
    let v03 = |method: &'static str, params: Value| f.call(None, method, params);
    let set = v03(
        "tasks/pushNotificationConfig/set",
        json!({"taskId": task_id, "pushNotificationConfig": {"id": "old", "url": hook.url,
               "authentication": {"schemes": ["Bearer"], "credentials": "c"}}}),
    )
    .await;
    assert_eq!(
        set["result"],
        json!({"taskId": task_id, "pushNotificationConfig": {"id": "old", "url": hook.url,
               "authentication": {"schemes": ["Bearer"], "credentials": "c"}}})
    );
    let get = v03(
        "tasks/pushNotificationConfig/get",
        json!({"id": task_id, "pushNotificationConfigId": "old"}),
    )
    .await;
    assert_eq!(get["result"], set["result"]);
    let list = v03("tasks/pushNotificationConfig/list", json!({"id": task_id})).await;
    assert_eq!(list["result"].as_array().unwrap().len(), 2, "{list}");
    let del = v03(
        "tasks/pushNotificationConfig/delete",
        json!({"id": task_id, "pushNotificationConfigId": "old"}),
    )
    .await;
    assert_eq!(del["result"], Value::Null, "{del}");
    call("CancelTask", json!({"id": task_id})).await;
    // The remaining config hears the end.
    hook.until_terminal().await;
    hook.server.abort();
    f.stop().await;
}

/// An approval event read back without its content (a `headers_only` conversation, the
/// forwarder refilled from storage after it fell behind) still reaches the book: the approval
/// store says which approval waits, once, and which one was answered.
#[tokio::test]
async fn approval_events_read_back_as_headers_are_taken_from_the_approval_store() {
    use troupe_actors::rollout::{RecordLevel, RecordMeta, RolloutRecord};
    use troupe_proto::{ApprovalDecision, EventKind, EventName};
    let f = Fixture::start(vec![shell(&["echo", "headers"]), ScriptedReply::default()]).await;
    let task_id = f.send_now("run it", json!({})).await;
    f.wait_state(&task_id, "TASK_STATE_INPUT_REQUIRED").await;
    let pending = f.session.pending_approvals().await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    let waiting = &pending[0];
    let header = |kind| RolloutRecord {
        seq: 1,
        ts_ms: 0,
        conversation_id: Some(waiting.conversation_id),
        task_id: waiting.task_id,
        kind,
        level: RecordLevel::Headers,
        event: None,
        meta: RecordMeta::default(),
    };
    let mut asked = super::tasks::Asked::default();
    let requested = super::tasks::headers_only(
        &header(EventName::ApprovalRequested),
        &f.session,
        &mut asked,
    )
    .await;
    assert!(
        matches!(requested.as_slice(), [EventKind::ApprovalRequested { approval_id, .. }] if *approval_id == waiting.approval_id),
        "{requested:?}"
    );
    // Once: the same header again adds nothing.
    let again = super::tasks::headers_only(
        &header(EventName::ApprovalRequested),
        &f.session,
        &mut asked,
    )
    .await;
    assert!(again.is_empty(), "{again:?}");
    f.session
        .respond_approval(waiting.approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    let resolved =
        super::tasks::headers_only(&header(EventName::ApprovalResolved), &f.session, &mut asked)
            .await;
    assert!(
        matches!(resolved.as_slice(), [EventKind::ApprovalResolved { approval_id, .. }] if *approval_id == waiting.approval_id),
        "{resolved:?}"
    );
}
