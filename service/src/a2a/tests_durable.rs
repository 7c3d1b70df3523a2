//! The endpoint's records outlive it: a new endpoint over the same store (as after a restart
//! of the process, or of the endpoint's actor) finds every task and context, ends what troupe
//! was running, runs what had not reached troupe, and delivers to the push configs it finds.
//! And contexts' conversations close when idle and reopen with their history, so that many
//! stored contexts cost nothing at start. Over real HTTP, in front of a real session with
//! the scripted model.

use super::*;
use serde_json::{Value, json};
use std::time::Duration;
use troupe_actors::conversation::ConversationMsg;
use troupe_actors::history::LocalSummarizer;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::{
    AgentError, ConversationId, ConversationStats, MessageReply, OpenConversation, SessionId,
    TaskId,
};
use troupe_runtime::scripted::{ScriptedModel, ScriptedReply};
use troupe_store::Store;
use troupe_store::memory::MemoryStore;

struct Endpoint {
    a2a: A2a,
    url: String,
    server: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    async fn start(session: &SessionHandle, store: &Arc<dyn Store>, tasks: TasksConfig) -> Self {
        Self::over(Arc::new(session.clone()), store, tasks).await
    }

    /// The endpoint in front of `backend`.
    async fn over(
        backend: Arc<dyn backend::A2aBackend>,
        store: &Arc<dyn Store>,
        tasks: TasksConfig,
    ) -> Self {
        let a2a = A2a::start(
            backend,
            store.clone(),
            A2aConfig {
                tasks,
                ..A2aConfig::default()
            },
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
        Self { a2a, url, server }
    }

    async fn stop(self) {
        self.server.abort();
        self.a2a.stop().await;
    }

    async fn call(&self, method: &str, params: Value) -> Value {
        reqwest::Client::new()
            .post(&self.url)
            .header("A2A-Version", "1.0")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// A send; `context`: the context to send in; `wait`: block until it settles.
    async fn send(&self, text: &str, context: Option<&str>, wait: bool) -> Value {
        let mut message = json!({"messageId": format!("m-{text}"), "role": "ROLE_USER",
                                 "parts": [{"text": text}]});
        if let Some(c) = context {
            message["contextId"] = json!(c);
        }
        let r = self
            .call(
                "SendMessage",
                json!({"message": message, "configuration": {"returnImmediately": !wait}}),
            )
            .await;
        let task = r["result"]["task"].clone();
        assert!(task.is_object(), "{r}");
        task
    }

    async fn get(&self, task_id: &str) -> Value {
        self.call("GetTask", json!({"id": task_id})).await["result"].clone()
    }

    async fn wait_state(&self, task_id: &str, want: &str) -> Value {
        for _ in 0..400 {
            let t = self.get(task_id).await;
            if t["status"]["state"] == want {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "task {task_id} never reached {want}: {}",
            self.get(task_id).await
        )
    }

    /// (tasks, contexts, open contexts) the endpoint holds in memory.
    async fn held(&self) -> (usize, usize, usize) {
        let actor = self.a2a.actor().unwrap();
        ractor::call!(actor, |reply| A2aTasksMsg::Held { reply }).unwrap()
    }
}

async fn session(replies: Vec<ScriptedReply>) -> (SessionHandle, tempfile::TempDir) {
    session_with(replies, false).await
}

/// A session; with `shell`, its shell tool asks for approval before each command.
async fn session_with(
    replies: Vec<ScriptedReply>,
    shell: bool,
) -> (SessionHandle, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = SessionConfig {
        data_dir: dir.path().to_path_buf(),
        ..SessionConfig::default()
    };
    config.conversation.shell_tool = shell;
    config.conversation.sandbox_policy = troupe_proto::SandboxPolicy::FullAccess;
    let exec: Option<Arc<dyn troupe_actors::ports::CommandRunner>> = if shell {
        Some(Arc::new(troupe_runtime::exec::ProcessRunner::new()))
    } else {
        None
    };
    let ports = SessionPorts {
        model: Arc::new(ScriptedModel::new(replies)),
        mcp: None,
        mcp_connector: None,
        exec,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: None,
        agents: None,
    };
    let (session, _join) = SessionHandle::start(SessionId::new(), config, ports)
        .await
        .unwrap();
    (session, dir)
}

fn conversation_of(task: &Value) -> ConversationId {
    task["metadata"]["troupe"]["conversationId"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

async fn stats(session: &SessionHandle, id: ConversationId) -> ConversationStats {
    let actor = session.conversation_actor(id).await.unwrap().unwrap();
    ractor::call!(actor, |reply| ConversationMsg::Stats { reply }).unwrap()
}

async fn open_conversations(session: &SessionHandle) -> usize {
    session.list().await.unwrap().len()
}

/// A webhook on loopback that keeps every body it is sent.
async fn webhook() -> (String, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null));
                axum::http::StatusCode::OK
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
async fn a_new_endpoint_finds_every_record_and_settles_what_was_live() {
    let (session, _dir) = session(vec![
        ScriptedReply::text("first answer"),
        ScriptedReply::hang(true),
        ScriptedReply::text("queued ran"),
        ScriptedReply::text("after the restart"),
    ])
    .await;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let old = Endpoint::start(&session, &store, TasksConfig::default()).await;
    let first = old.send("one", None, true).await;
    assert_eq!(first["status"]["state"], "TASK_STATE_COMPLETED", "{first}");
    let context = first["contextId"].as_str().unwrap().to_owned();
    let conversation = conversation_of(&first);
    // Running (its model call hangs), with a webhook; a third queued behind it.
    let running = old.send("two", Some(&context), false).await;
    let running_id = running["id"].as_str().unwrap().to_owned();
    old.wait_state(&running_id, "TASK_STATE_WORKING").await;
    let (hook, mut heard) = webhook().await;
    let made = old
        .call(
            "CreateTaskPushNotificationConfig",
            json!({"taskId": running_id, "url": hook, "token": "tok"}),
        )
        .await;
    assert!(made["result"]["id"].is_string(), "{made}");
    let queued = old.send("three", Some(&context), false).await;
    let queued_id = queued["id"].as_str().unwrap().to_owned();
    assert_eq!(
        old.get(&queued_id).await["status"]["state"],
        "TASK_STATE_SUBMITTED"
    );
    old.stop().await;

    let new = Endpoint::start(&session, &store, TasksConfig::default()).await;
    // The finished task, with its history and its answer.
    let got = new.get(first["id"].as_str().unwrap()).await;
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED", "{got}");
    assert_eq!(got["history"][0]["parts"][0]["text"], "one");
    assert_eq!(got["artifacts"][0]["parts"][0]["text"], "first answer");
    // The running one ends FAILED, not run again; its webhook hears it.
    let failed = new.wait_state(&running_id, "TASK_STATE_FAILED").await;
    let note = failed["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(note.contains("interrupted by a restart"), "{note}");
    let delivered = tokio::time::timeout(Duration::from_secs(10), heard.recv())
        .await
        .expect("the webhook hears the end")
        .unwrap();
    assert_eq!(
        delivered["statusUpdate"]["status"]["state"], "TASK_STATE_FAILED",
        "{delivered}"
    );
    // The queued one had not reached troupe: it runs now, in its context's conversation.
    let ran = new.wait_state(&queued_id, "TASK_STATE_COMPLETED").await;
    assert_eq!(ran["artifacts"][0]["parts"][0]["text"], "queued ran");
    assert_eq!(conversation_of(&ran), conversation);
    // The context goes on in the same conversation.
    let after = new.send("four", Some(&context), true).await;
    assert_eq!(after["status"]["state"], "TASK_STATE_COMPLETED", "{after}");
    assert_eq!(conversation_of(&after), conversation);
    let listed = new.call("ListTasks", json!({"contextId": context})).await;
    assert_eq!(listed["result"]["totalSize"], 4, "{listed}");
    // Push configs of a finished task are still read back.
    let configs = new
        .call(
            "ListTaskPushNotificationConfigs",
            json!({"taskId": running_id}),
        )
        .await;
    assert_eq!(configs["result"]["configs"][0]["token"], "tok", "{configs}");
    new.stop().await;
    session.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_context_closes_and_reopens_with_its_history() {
    let (session, _dir) = session(Vec::new()).await;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    // Long enough that the reopened conversation is still open when its statistics are
    // read, however loaded the machine.
    let tasks = TasksConfig {
        idle_close: Duration::from_secs(1),
        ..TasksConfig::default()
    };
    let a2a = Endpoint::start(&session, &store, tasks).await;
    let first = a2a.send("remember me", None, true).await;
    let context = first["contextId"].as_str().unwrap().to_owned();
    let conversation = conversation_of(&first);
    // Idle: its conversation closes; the stored context says so.
    for _ in 0..250 {
        if session
            .conversation_actor(conversation)
            .await
            .unwrap()
            .is_none()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        session
            .conversation_actor(conversation)
            .await
            .unwrap()
            .is_none(),
        "the idle context's conversation closed"
    );
    for _ in 0..100 {
        if store
            .a2a_context(&context)
            .await
            .unwrap()
            .is_some_and(|c| !c.open)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!store.a2a_context(&context).await.unwrap().unwrap().open);
    // The next message reopens it, with what it said before.
    let second = a2a.send("again", Some(&context), true).await;
    assert_eq!(
        second["status"]["state"], "TASK_STATE_COMPLETED",
        "{second}"
    );
    assert_eq!(conversation_of(&second), conversation);
    let s = stats(&session, conversation).await;
    assert_eq!(
        s.tasks, 2,
        "the reopened conversation has its history: {s:?}"
    );
    assert!(s.history_items >= 4, "{s:?}");
    a2a.stop().await;
    session.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_stored_contexts_cost_nothing_at_start() {
    const CONTEXTS: usize = 200;
    let (session, _dir) = session(Vec::new()).await;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let tasks = TasksConfig {
        idle_close: Duration::from_millis(100),
        ..TasksConfig::default()
    };
    let a2a = Endpoint::start(&session, &store, tasks.clone()).await;
    let mut contexts = Vec::new();
    for i in 0..CONTEXTS {
        let t = a2a.send(&format!("context {i}"), None, true).await;
        assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED", "{t}");
        contexts.push(t["contextId"].as_str().unwrap().to_owned());
    }
    // Every one closes once idle: the session keeps only its root conversation open, and the
    // endpoint holds nothing.
    for _ in 0..500 {
        if open_conversations(&session).await == 1 && a2a.held().await == (0, 0, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        open_conversations(&session).await,
        1,
        "{:?} open, the endpoint holds {:?}",
        session.list().await.unwrap(),
        a2a.held().await
    );
    assert_eq!(a2a.held().await, (0, 0, 0));
    a2a.stop().await;

    // A new endpoint reads none of them. It closes nothing while this test looks (a context
    // idle for 100 ms could close between the reply and the counts below on a loaded machine).
    let tasks = TasksConfig {
        idle_close: Duration::from_secs(600),
        ..tasks
    };
    let a2a = Endpoint::start(&session, &store, tasks).await;
    assert_eq!(a2a.held().await, (0, 0, 0));
    assert_eq!(store.a2a_open_contexts().await.unwrap().len(), 0);
    assert_eq!(
        store
            .a2a_tasks(troupe_proto::store::A2aTaskQuery {
                limit: 1,
                ..Default::default()
            })
            .await
            .unwrap()
            .total,
        CONTEXTS as u64,
        "every task is still stored"
    );
    // A message to one old context opens that one alone.
    let back = a2a.send("back", Some(&contexts[17]), true).await;
    assert_eq!(back["status"]["state"], "TASK_STATE_COMPLETED", "{back}");
    assert_eq!(open_conversations(&session).await, 2);
    let (_, held_contexts, open) = a2a.held().await;
    assert_eq!((held_contexts, open), (1, 1));
    assert_eq!(stats(&session, conversation_of(&back)).await.tasks, 2);
    a2a.stop().await;
    session.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_tasks_past_the_kept_number_are_forgotten() {
    let (session, _dir) = session(Vec::new()).await;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let tasks = TasksConfig {
        keep_finished: 3,
        idle_close: Duration::from_millis(40),
        ..TasksConfig::default()
    };
    let a2a = Endpoint::start(&session, &store, tasks).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        let t = a2a.send(&format!("n{i}"), None, true).await;
        ids.push(t["id"].as_str().unwrap().to_owned());
        // Distinct status times: retention keeps the newest.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut total = 0;
    for _ in 0..250 {
        total = a2a.call("ListTasks", json!({})).await["result"]["totalSize"]
            .as_u64()
            .unwrap();
        if total == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(total, 3);
    let oldest = a2a.call("GetTask", json!({"id": ids[0]})).await;
    assert_eq!(oldest["error"]["code"], -32001, "{oldest}");
    let newest = a2a.get(&ids[5]).await;
    assert_eq!(newest["status"]["state"], "TASK_STATE_COMPLETED");
    a2a.stop().await;
    session.shutdown().await.unwrap();
}

/// A finished task's stored record keeps its text as its contexts' storage policy says:
/// under `headers_only` never; under `ttl` until a ttl after the task began, when the store's
/// sweep replaces it with the text-less record (ids, states and times stay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_tasks_text_is_kept_as_long_as_the_storage_policy_says() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(troupe_store::SqliteStore::open_in(dir.path()).unwrap());
    for (policy, kept) in [
        (troupe_proto::StoragePolicy::HeadersOnly, false),
        (troupe_proto::StoragePolicy::Ttl { secs: 3600 }, true),
    ] {
        let (session, _dir) = session(Vec::new()).await;
        let tasks = TasksConfig {
            open: OpenConversation {
                storage_policy: policy,
                ..OpenConversation::default()
            },
            ..TasksConfig::default()
        };
        let a2a = Endpoint::start(&session, &store, tasks).await;
        let sent = a2a.send("remember me", None, true).await;
        let id = sent["id"].as_str().unwrap().to_owned();
        assert_eq!(sent["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
        a2a.stop().await;
        // Read back from the store by a new endpoint: what is on disk.
        let a2a = Endpoint::start(&session, &store, TasksConfig::default()).await;
        let text = |task: &Value| task.to_string().contains("You said: remember me");
        let stored = a2a.get(&id).await;
        assert_eq!(
            stored["status"]["state"], "TASK_STATE_COMPLETED",
            "{stored}"
        );
        assert_eq!(text(&stored), kept, "{policy:?}: {stored}");
        let on_disk = store.a2a_task(&id).await.unwrap().unwrap();
        assert_eq!(on_disk.expires_ms.is_some(), kept, "{on_disk:?}");
        let in_files = || {
            let bytes: Vec<u8> = ["troupe.db", "troupe.db-wal"]
                .iter()
                .flat_map(|f| std::fs::read(dir.path().join(f)).unwrap_or_default())
                .collect();
            let needle = b"You said: remember me";
            bytes.windows(needle.len()).any(|w| w == needle)
        };
        if let Some(due) = on_disk.expires_ms {
            store.sweep_due(due - 1).await.unwrap();
            assert!(text(&a2a.get(&id).await), "not due yet");
            assert!(in_files(), "kept on disk until due");
            store.sweep_due(due).await.unwrap();
            let swept = a2a.get(&id).await;
            assert!(!text(&swept), "{swept}");
            assert_eq!(swept["id"], stored["id"]);
            assert_eq!(swept["status"]["state"], "TASK_STATE_COMPLETED");
            // Gone from the database's files too (freed pages zeroed, the log truncated):
            // this store holds the endpoint's records only.
            assert!(!in_files(), "the swept text is in no file of the store");
        }
        a2a.stop().await;
        session.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_for_an_approval_ends_failed_and_its_context_goes_on() {
    let (session, _dir) = session_with(
        vec![
            ScriptedReply::tool("shell", json!({"command": ["echo", "never"]})),
            ScriptedReply::text("fresh start"),
        ],
        true,
    )
    .await;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let old = Endpoint::start(&session, &store, TasksConfig::default()).await;
    let asked = old.send("run it", None, false).await;
    let task_id = asked["id"].as_str().unwrap().to_owned();
    let waiting = old.wait_state(&task_id, "TASK_STATE_INPUT_REQUIRED").await;
    let context = waiting["contextId"].as_str().unwrap().to_owned();
    old.stop().await;

    let new = Endpoint::start(&session, &store, TasksConfig::default()).await;
    let failed = new.wait_state(&task_id, "TASK_STATE_FAILED").await;
    // The question stays in its history; the approval is gone with the troupe task.
    let history = failed["history"].to_string();
    assert!(history.contains("approvalRequest"), "{failed}");
    let answer = new
        .call(
            "SendMessage",
            json!({"message": {"messageId": "late", "role": "ROLE_USER", "taskId": task_id,
                               "parts": [{"text": "approve"}]}}),
        )
        .await;
    assert_eq!(answer["error"]["code"], -32004, "{answer}");
    // Its troupe task was cancelled: the context takes new work.
    let next = new.send("next", Some(&context), true).await;
    assert_eq!(next["status"]["state"], "TASK_STATE_COMPLETED", "{next}");
    assert_eq!(next["artifacts"][0]["parts"][0]["text"], "fresh start");
    new.stop().await;
    session.shutdown().await.unwrap();
}

/// A backend that notes, as troupe is asked to run a message, how the endpoint's store has
/// the A2A task that sent it (its phase), then runs it in the session.
struct Watching {
    session: SessionHandle,
    store: Arc<dyn Store>,
    phases: std::sync::Mutex<Vec<(String, super::book::Phase)>>,
}

#[async_trait::async_trait]
impl backend::A2aBackend for Watching {
    async fn session_id(&self) -> Result<SessionId, AgentError> {
        self.session.session_id().await
    }
    async fn open(&self, params: OpenConversation) -> Result<ConversationId, AgentError> {
        backend::A2aBackend::open(&self.session, params).await
    }
    async fn reopen(
        &self,
        conversation_id: ConversationId,
        params: OpenConversation,
    ) -> Result<(), AgentError> {
        backend::A2aBackend::reopen(&self.session, conversation_id, params).await
    }
    async fn close(&self, conversation_id: ConversationId) -> Result<(), AgentError> {
        backend::A2aBackend::close(&self.session, conversation_id).await
    }
    async fn cancel_conversation(&self, conversation_id: ConversationId) -> Result<(), AgentError> {
        backend::A2aBackend::cancel_conversation(&self.session, conversation_id).await
    }
    async fn message(
        &self,
        conversation_id: ConversationId,
        text: String,
    ) -> Result<MessageReply, AgentError> {
        for stored in self.store.a2a_live_tasks().await? {
            let record = super::book::stored::record_of(&stored).unwrap();
            if record.input == text {
                self.phases
                    .lock()
                    .unwrap()
                    .push((text.clone(), record.phase));
            }
        }
        backend::A2aBackend::message(&self.session, conversation_id, text).await
    }
    async fn cancel_task(&self, task_id: TaskId) -> Result<(), AgentError> {
        backend::A2aBackend::cancel_task(&self.session, task_id).await
    }
    async fn respond_approval(
        &self,
        approval_id: troupe_proto::ApprovalId,
        decision: troupe_proto::ApprovalDecision,
    ) -> Result<(), AgentError> {
        backend::A2aBackend::respond_approval(&self.session, approval_id, decision).await
    }
    async fn pending_approvals(&self) -> Result<Vec<troupe_proto::PendingApproval>, AgentError> {
        backend::A2aBackend::pending_approvals(&self.session).await
    }

    async fn events(
        &self,
        after_seq: Option<u64>,
    ) -> Result<troupe_actors::rollout::stream::EventStream, AgentError> {
        backend::A2aBackend::events(&self.session, after_seq).await
    }
}

/// troupe is asked to run a task only once the endpoint's store has it `dispatched`: a crash
/// between the two leaves it dispatched (ended FAILED by the next start), never `queued`,
/// which the next start would run a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_stored_dispatched_before_troupe_runs_it() {
    let (session, _dir) = session(Vec::new()).await;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let watching = Arc::new(Watching {
        session: session.clone(),
        store: store.clone(),
        phases: std::sync::Mutex::new(Vec::new()),
    });
    let endpoint = Endpoint::over(watching.clone(), &store, TasksConfig::default()).await;
    let first = endpoint.send("first", None, true).await;
    let context = first["contextId"].as_str().unwrap().to_owned();
    endpoint.send("second", Some(&context), true).await;
    assert_eq!(
        *watching.phases.lock().unwrap(),
        [
            ("first".to_owned(), super::book::Phase::Dispatched),
            ("second".to_owned(), super::book::Phase::Dispatched)
        ]
    );
    endpoint.stop().await;
    session.shutdown().await.unwrap();
}
