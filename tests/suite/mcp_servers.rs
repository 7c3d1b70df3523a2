//! The session's McpPool against the real npm servers (server-everything, -memory,
//! -filesystem) through real sessions: a server killed mid-call, allowlist views, limits,
//! progress and cancellation, elicitation and sampling through the approval path, the
//! scrubbed environment, the pool's own restart (also under a running task) and a stable tool
//! list. Every test is bounded in time and checks that no server process outlives its session.

use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use troupe_actors::mcp_pool::{McpLimits, McpPoolHandle, Rate};
use troupe_actors::ports::{
    DeltaSink, McpPort, McpServerConfig, McpTransport, McpView, ModelClient, ModelInfo,
    ModelRequest, ModelResponse, ToolCallContext,
};
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::{
    AgentError, ApprovalDecision, ApprovalSubject, ConversationId, EventEnvelope, EventKind,
    HistoryItem, Json, OpenConversation, PendingApproval, Role, SessionId, SetContext, TaskId,
    TaskStatus, ToolCall, ToolOutput, ToolSpec,
};
use troupe_runtime::RmcpConnector;
use troupe_test_support::mcp::{processes_with_env, server_entry};
use troupe_tests::conversation_stats;

/// Bound of a whole test.
const TEST_LIMIT: Duration = Duration::from_secs(90);
const MARKER: &str = "TROUPE_MCP_MARKER";

async fn bounded(test: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(TEST_LIMIT, test)
        .await
        .expect("the test did not finish in time");
}

// ----- a model that does what the user message says -----

/// `call <tool> <json arguments>` calls that tool once, then reports what it answered
/// (`observed: <output>`); any other message gets `model says: <message>`. `hold, then
/// <directive>` first waits for `release` (the task is in flight meanwhile). Records the tools
/// each conversation was offered.
#[derive(Default)]
struct DirectiveModel {
    offered: Mutex<Vec<(ConversationId, Vec<ToolSpec>)>>,
    calls: AtomicU64,
    /// Steps waiting for `release`.
    held: AtomicU64,
    release: tokio::sync::Notify,
}

impl DirectiveModel {
    /// The tool names offered in `conversation`'s latest model call.
    fn offered_to(&self, conversation: ConversationId) -> Vec<String> {
        self.offered
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(c, _)| *c == conversation)
            .map(|(_, tools)| tools.iter().map(|t| t.name.clone()).collect())
            .unwrap_or_default()
    }

    fn specs_offered_to(&self, conversation: ConversationId) -> Vec<ToolSpec> {
        self.offered
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(c, _)| *c == conversation)
            .map(|(_, tools)| tools.clone())
            .unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl ModelClient for DirectiveModel {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "test".into(),
            model: "directive".into(),
            family: "directive".into(),
        }
    }

    async fn step(
        &self,
        request: ModelRequest<'_>,
        _deltas: &mut dyn DeltaSink,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, AgentError> {
        self.offered
            .lock()
            .unwrap()
            .push((request.conversation_id, request.tools.to_vec()));
        let held = request.prompt.iter().last().is_some_and(|item| {
            matches!(item, HistoryItem::Message { role: Role::User, text } if text.starts_with("hold, then "))
        });
        if held {
            self.held.fetch_add(1, Ordering::SeqCst);
            tokio::select! {
                () = self.release.notified() => {}
                () = cancel.cancelled() => return Err(AgentError::cancelled("cancelled")),
            }
        }
        let mut last_user = String::new();
        let mut observed = None;
        for item in request.prompt.iter() {
            match item {
                HistoryItem::Message {
                    role: Role::User,
                    text,
                } => {
                    last_user = text.clone();
                    observed = None;
                }
                HistoryItem::ToolOutput(out) => observed = Some(out.output.clone()),
                _ => {}
            }
        }
        let last_user = last_user.trim_start_matches("hold, then ");
        let text = match (observed, last_user.strip_prefix("call ")) {
            (Some(out), _) => format!("observed: {out}"),
            (None, Some(directive)) => {
                let (name, args) = directive.split_once(' ').unwrap_or((directive, "{}"));
                let n = self.calls.fetch_add(1, Ordering::SeqCst);
                return Ok(ModelResponse {
                    tool_calls: vec![ToolCall {
                        call_id: format!("call-{n}"),
                        name: name.to_owned(),
                        arguments: Json(serde_json::from_str(args).expect("json arguments")),
                    }],
                    ..ModelResponse::default()
                });
            }
            (None, None) => format!("model says: {last_user}"),
        };
        Ok(ModelResponse {
            text,
            ..ModelResponse::default()
        })
    }
}

// ----- sessions over real servers -----

/// A stdio server from `.tools/mcp`, marked with `marker` in its environment.
fn server(
    name: &str,
    package: &str,
    args: &[&str],
    env: &[(&str, &str)],
    marker: &str,
) -> McpServerConfig {
    let mut argv = vec![server_entry(package).display().to_string()];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    let mut vars: std::collections::BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    vars.insert(MARKER.into(), marker.into());
    McpServerConfig {
        name: name.into(),
        transport: McpTransport::Stdio {
            command: "node".into(),
            args: argv,
            env: vars,
            cwd: None,
        },
    }
}

struct Servers {
    marker: String,
    dir: tempfile::TempDir,
}

impl Servers {
    fn new() -> Self {
        Self {
            marker: TaskId::new().to_string(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn everything(&self) -> McpServerConfig {
        server(
            "everything",
            "server-everything",
            &["stdio"],
            &[],
            &self.marker,
        )
    }

    fn memory(&self) -> McpServerConfig {
        let file = self.dir.path().join("memory.jsonl").display().to_string();
        server(
            "memory",
            "server-memory",
            &[],
            &[("MEMORY_FILE_PATH", &file)],
            &self.marker,
        )
    }

    fn filesystem(&self) -> McpServerConfig {
        let root = self.dir.path().join("files");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("hello.txt"), "hello from the filesystem").unwrap();
        server(
            "filesystem",
            "server-filesystem",
            &[&root.display().to_string()],
            &[],
            &self.marker,
        )
    }

    fn processes(&self) -> Vec<u32> {
        processes_with_env(MARKER, &self.marker)
    }
}

struct McpSession {
    session: SessionHandle,
    model: Arc<DirectiveModel>,
    events: broadcast::Receiver<Arc<EventEnvelope>>,
    _data: tempfile::TempDir,
    join: tokio::task::JoinHandle<()>,
}

async fn start(
    servers: Vec<McpServerConfig>,
    tweak: impl FnOnce(&mut SessionConfig),
) -> McpSession {
    let data = tempfile::tempdir().unwrap();
    let model = Arc::new(DirectiveModel::default());
    let mut config = SessionConfig {
        data_dir: data.path().to_path_buf(),
        ..SessionConfig::default()
    };
    config.mcp_servers = servers;
    config.mcp_limits.restart_backoff_base = Duration::from_millis(200);
    tweak(&mut config);
    let ports = SessionPorts {
        model: model.clone(),
        mcp: None,
        mcp_connector: Some(Arc::new(RmcpConnector::new())),
        exec: None,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(troupe_actors::history::LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: None,
        agents: None,
    };
    let (session, join) = SessionHandle::start(SessionId::new(), config, ports)
        .await
        .unwrap();
    let events = session.subscribe().await.unwrap();
    McpSession {
        session,
        model,
        events,
        _data: data,
        join,
    }
}

impl McpSession {
    async fn pool(&self) -> McpPoolHandle {
        self.session
            .mcp_pool()
            .await
            .unwrap()
            .expect("the session runs a pool")
    }

    /// Waits until the pool offers every one of `tools` (servers list some tools only after
    /// the handshake, then say their list changed).
    async fn wait_tools(&self, tools: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let snapshot = self.pool().await.snapshot().await.unwrap();
            let offered: Vec<&String> = snapshot.servers.iter().flat_map(|s| &s.tools).collect();
            if tools.iter().all(|t| offered.iter().any(|o| o == t)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "tools {tools:?} never showed up in {offered:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process id of `server`'s live connection.
    async fn pid(&self, server: &str) -> Option<u32> {
        let snapshot = self.pool().await.snapshot().await.unwrap();
        snapshot
            .servers
            .into_iter()
            .find(|s| s.name == server)
            .and_then(|s| s.process_id)
    }

    /// The next event matching `pred`, skipping others.
    async fn event(
        &mut self,
        within: Duration,
        pred: impl Fn(&EventEnvelope) -> bool,
    ) -> Arc<EventEnvelope> {
        tokio::time::timeout(within, async {
            loop {
                match self.events.recv().await {
                    Ok(e) if pred(&e) => return e,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(e) => panic!("event stream ended: {e}"),
                }
            }
        })
        .await
        .expect("the expected event did not come")
    }

    async fn stop(self, servers: &Servers) {
        self.session.shutdown().await.unwrap();
        let _ = self.join.await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !servers.processes().is_empty() {
            assert!(
                Instant::now() < deadline,
                "server processes left after shutdown: {:?}",
                servers.processes()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn call(tool: &str, arguments: Value) -> String {
    format!("call {tool} {arguments}")
}

fn open_with(allowlist: &[&str]) -> OpenConversation {
    OpenConversation {
        mcp_tool_allowlist: Some(allowlist.iter().map(|s| (*s).to_owned()).collect()),
        ..OpenConversation::default()
    }
}

fn is_tool_finished(task: TaskId) -> impl Fn(&EventEnvelope) -> bool {
    move |e| e.task_id == Some(task) && matches!(e.event, EventKind::ToolCallFinished { .. })
}

// ----- tests -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_call_fails_it_fast_restarts_and_spares_the_rest() {
    let servers = Servers::new();
    let mut t = start(vec![servers.everything(), servers.memory()], |_| {}).await;
    bounded(async {
        let a = t.session.open(OpenConversation::default()).await.unwrap();
        let b = t.session.open(OpenConversation::default()).await.unwrap();
        t.wait_tools(&[
            "everything__trigger-long-running-operation",
            "memory__read_graph",
        ])
        .await;
        let old_pid = t.pid("everything").await.unwrap();

        let session = t.session.clone();
        let long = call(
            "everything__trigger-long-running-operation",
            json!({"duration": 30, "steps": 30}),
        );
        let running = tokio::spawn(async move { session.message(a, long).await });
        // Progress proves the server is inside the call.
        let progress = t
            .event(Duration::from_secs(10), |e| {
                e.conversation_id == Some(a) && matches!(e.event, EventKind::ToolProgress { .. })
            })
            .await;
        let task = progress.task_id.unwrap();
        let killed_at = Instant::now();
        let status = std::process::Command::new("kill")
            .args(["-9", &old_pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let finished = t
            .event(Duration::from_secs(10), is_tool_finished(task))
            .await;
        let failed_after = killed_at.elapsed();
        let EventKind::ToolCallFinished {
            output, is_error, ..
        } = &finished.event
        else {
            unreachable!()
        };
        assert!(*is_error, "{output}");
        assert!(output.contains("everything"), "{output}");
        // Bounded, and far below the 30 s the call would have taken.
        assert!(
            failed_after < Duration::from_secs(5),
            "took {failed_after:?}"
        );
        let reply = running.await.unwrap().unwrap();
        assert_eq!(reply.status, TaskStatus::Ok);
        assert!(reply.text.starts_with("observed:"), "{}", reply.text);

        // The other conversation (another server) is untouched meanwhile.
        let other = t
            .session
            .message(b, call("memory__read_graph", json!({})))
            .await
            .unwrap();
        assert!(other.text.contains("entities"), "{}", other.text);

        // The pool restarts the server; later calls succeed on a new process.
        t.event(Duration::from_secs(20), |e| {
            matches!(&e.event, EventKind::McpServerReady { server, .. } if server == "everything")
        })
        .await;
        let new_pid = t.pid("everything").await.unwrap();
        assert_ne!(new_pid, old_pid);
        let again = t
            .session
            .message(
                a,
                call("everything__echo", json!({"message": "after the restart"})),
            )
            .await
            .unwrap();
        assert_eq!(again.text, "observed: Echo: after the restart");
        assert_eq!(servers.processes().len(), 2, "one process per server");
    })
    .await;
    t.stop(&servers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowlists_show_each_conversation_its_tools_and_set_context_changes_them() {
    let servers = Servers::new();
    let t = start(
        vec![servers.everything(), servers.memory(), servers.filesystem()],
        |_| {},
    )
    .await;
    bounded(async {
        t.wait_tools(&[
            "everything__echo",
            "memory__read_graph",
            "filesystem__list_directory",
        ])
        .await;
        let a = t
            .session
            .open(open_with(&["everything__echo", "memory__read_graph"]))
            .await
            .unwrap();
        // A deprecated `server/tool` entry is normalised.
        let b = t
            .session
            .open(open_with(&[
                "filesystem/read_text_file",
                "filesystem__list_directory",
            ]))
            .await
            .unwrap();
        let c = t.session.open(OpenConversation::default()).await.unwrap();
        for conversation in [a, b, c] {
            t.session.message(conversation, "hello").await.unwrap();
        }
        assert_eq!(
            t.model.offered_to(a),
            ["everything__echo", "memory__read_graph"]
        );
        assert_eq!(
            t.model.offered_to(b),
            ["filesystem__list_directory", "filesystem__read_text_file"]
        );
        let all = t.model.offered_to(c);
        for server in ["everything__", "memory__", "filesystem__"] {
            assert!(
                all.iter().any(|n| n.starts_with(server)),
                "{server} in {all:?}"
            );
        }
        let snapshot = t.pool().await.snapshot().await.unwrap();
        let pooled: usize = snapshot.servers.iter().map(|s| s.tools.len()).sum();
        assert_eq!(all.len(), pooled);

        // A hidden tool is not there for the conversation.
        let hidden = t
            .session
            .message(a, call("filesystem__list_directory", json!({"path": "."})))
            .await
            .unwrap();
        assert!(hidden.text.contains("unknown tool"), "{}", hidden.text);
        // A visible one works.
        let listed = t
            .session
            .message(
                b,
                call(
                    "filesystem__read_text_file",
                    json!({"path": servers.dir.path().join("files/hello.txt")}),
                ),
            )
            .await
            .unwrap();
        assert!(
            listed.text.contains("hello from the filesystem"),
            "{}",
            listed.text
        );

        // Unknown entries are refused at open, each named.
        let err = t
            .session
            .open(open_with(&[
                "everything__nope",
                "git__log",
                "memory__read_graph",
            ]))
            .await
            .unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("`everything__nope`") && message.contains("`git__log`"),
            "{message}"
        );
        assert!(!message.contains("`memory__read_graph`"), "{message}");

        // set-context reopens the view; a refused allowlist changes nothing.
        let update = |list: &[&str]| SetContext {
            mcp_tool_allowlist: Some(Some(list.iter().map(|s| (*s).to_owned()).collect())),
            ..SetContext::default()
        };
        t.session
            .set_context(a, update(&["memory__create_entities"]))
            .await
            .unwrap();
        t.session.message(a, "and now?").await.unwrap();
        assert_eq!(t.model.offered_to(a), ["memory__create_entities"]);
        let refused = t
            .session
            .set_context(a, update(&["memory__nope"]))
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("`memory__nope`"), "{refused}");
        t.session.message(a, "still?").await.unwrap();
        assert_eq!(t.model.offered_to(a), ["memory__create_entities"]);
    })
    .await;
    t.stop(&servers).await;
}

/// A view of the session's own pool for `conversation`, and a call through it.
async fn pool_call(
    view: &Arc<dyn McpView>,
    conversation: ConversationId,
    tool: &str,
    arguments: Value,
) -> Result<ToolOutput, AgentError> {
    let cancel = CancellationToken::new();
    let call = ToolCall {
        call_id: format!("limits-{tool}"),
        name: tool.into(),
        arguments: Json(arguments),
    };
    view.call_tool(
        &call,
        ToolCallContext {
            conversation_id: conversation,
            task_id: TaskId::new(),
            cancel: &cancel,
            span: &tracing::Span::none(),
            slot: None,
        },
    )
    .await
    .map_err(|failure| failure.error)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_conversation_concurrency_and_rate_limits_hold_then_overload() {
    let servers = Servers::new();
    let t = start(vec![servers.everything()], |c| {
        c.mcp_limits = McpLimits {
            per_conversation_concurrency: 2,
            per_conversation_rate: Some(Rate {
                per_second: 1.0,
                burst: 1,
            }),
            wait_bound: Duration::from_millis(1500),
            ..c.mcp_limits
        };
    })
    .await;
    bounded(async {
        t.wait_tools(&["everything__echo"]).await;
        let pool = t.pool().await;

        // Concurrency: two long calls hold both slots; a third waits the bound, then is
        // refused naming the limit.
        let busy = ConversationId::new();
        let view = pool.open_view(busy, None).await.unwrap();
        let long = || {
            let view = view.clone();
            tokio::spawn(async move {
                pool_call(
                    &view,
                    busy,
                    "everything__trigger-long-running-operation",
                    json!({"duration": 4, "steps": 2}),
                )
                .await
            })
        };
        let running = [long(), long()];
        // The second waits a second for its rate token; then both run.
        tokio::time::sleep(Duration::from_millis(1300)).await;
        let t0 = Instant::now();
        let refused = pool_call(&view, busy, "everything__echo", json!({"message": "x"})).await;
        let waited = t0.elapsed();
        let Err(AgentError::Overloaded { resource, limit }) = refused else {
            panic!("expected Overloaded, got {refused:?}");
        };
        assert!(
            resource.contains("concurrent MCP calls of this conversation"),
            "{resource}"
        );
        assert_eq!(limit, 2);
        assert!(
            waited >= Duration::from_millis(1400),
            "refused after {waited:?}"
        );
        assert!(waited < Duration::from_secs(3), "refused after {waited:?}");
        for r in running {
            assert!(r.await.unwrap().unwrap().output.contains("completed"));
        }

        // Rate: one a second. A call within the bound waits its turn; one beyond it is
        // refused at once.
        let steady = ConversationId::new();
        let view = pool.open_view(steady, None).await.unwrap();
        pool_call(&view, steady, "everything__echo", json!({"message": "1"}))
            .await
            .unwrap();
        let t0 = Instant::now();
        let (second, third) = tokio::join!(
            pool_call(&view, steady, "everything__echo", json!({"message": "2"})),
            pool_call(&view, steady, "everything__echo", json!({"message": "3"})),
        );
        let mut outcomes = [second, third];
        outcomes.sort_by_key(Result::is_ok);
        let [refused, waited_ok] = outcomes;
        assert!(waited_ok.is_ok(), "{waited_ok:?}");
        assert!(
            t0.elapsed() >= Duration::from_millis(800),
            "{:?}",
            t0.elapsed()
        );
        let Err(AgentError::Overloaded { resource, limit }) = refused else {
            panic!("expected Overloaded, got {refused:?}");
        };
        assert!(resource.contains("rate"), "{resource}");
        assert_eq!(limit, 1);
    })
    .await;
    t.stop(&servers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_call_reports_progress_and_cancelling_its_task_tells_the_server() {
    let servers = Servers::new();
    let mut t = start(vec![servers.everything()], |_| {}).await;
    bounded(async {
        t.wait_tools(&["everything__trigger-long-running-operation"])
            .await;
        let long = || {
            call(
                "everything__trigger-long-running-operation",
                json!({"duration": 20, "steps": 20}),
            )
        };
        let sent = troupe_runtime::mcp::metrics::cancel_notices_sent;

        // Cancelled through the task registry.
        let a = t.session.open(OpenConversation::default()).await.unwrap();
        let session = t.session.clone();
        let running = tokio::spawn({
            let text = long();
            async move { session.message(a, text).await }
        });
        let started = t
            .event(Duration::from_secs(10), |e| {
                e.conversation_id == Some(a) && matches!(e.event, EventKind::ToolCallStarted { .. })
            })
            .await;
        let task = started.task_id.unwrap();
        let EventKind::ToolCallStarted {
            call: started_call, ..
        } = &started.event
        else {
            unreachable!()
        };
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let e = t
                .event(Duration::from_secs(10), |e| {
                    e.task_id == Some(task) && matches!(e.event, EventKind::ToolProgress { .. })
                })
                .await;
            let EventKind::ToolProgress {
                call_id,
                progress,
                total,
                ..
            } = &e.event
            else {
                unreachable!()
            };
            assert_eq!(call_id, &started_call.call_id);
            assert_eq!(*total, Some(20.0));
            seen.push(*progress);
        }
        assert!(seen[0] < seen[1], "{seen:?}");
        let before = sent();
        let t0 = Instant::now();
        t.session.cancel_task(task).await.unwrap();
        let reply = running.await.unwrap().unwrap();
        assert_eq!(reply.status, TaskStatus::Cancelled);
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        wait_until("notifications/cancelled is sent", || sent() > before).await;

        // Cancelled by closing its conversation.
        let b = t.session.open(OpenConversation::default()).await.unwrap();
        let session = t.session.clone();
        let running = tokio::spawn({
            let text = long();
            async move { session.message(b, text).await }
        });
        t.event(Duration::from_secs(10), |e| {
            e.conversation_id == Some(b) && matches!(e.event, EventKind::ToolProgress { .. })
        })
        .await;
        let before = sent();
        let closed = t.session.close(b).await.unwrap();
        assert_eq!(closed.outcome, troupe_proto::CloseOutcome::Closed);
        assert_eq!(
            running.await.unwrap().unwrap().status,
            TaskStatus::Cancelled
        );
        wait_until("notifications/cancelled is sent", || sent() > before).await;

        // The server is still fine for everyone else.
        let echo = t
            .session
            .message(
                a,
                call("everything__echo", json!({"message": "still here"})),
            )
            .await
            .unwrap();
        assert_eq!(echo.text, "observed: Echo: still here");
    })
    .await;
    t.stop(&servers).await;
}

async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next pending approval of `conversation`.
async fn next_pending(t: &mut McpSession, conversation: ConversationId) -> PendingApproval {
    let requested = t
        .event(Duration::from_secs(10), |e| {
            e.conversation_id == Some(conversation)
                && matches!(e.event, EventKind::ApprovalRequested { .. })
        })
        .await;
    let pending = t.session.pending_approvals().await.unwrap();
    let EventKind::ApprovalRequested { approval_id, .. } = &requested.event else {
        unreachable!()
    };
    let found = pending
        .into_iter()
        .find(|p| p.approval_id == *approval_id)
        .expect("the request is pending");
    assert_eq!(found.task_id, requested.task_id);
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elicitation_and_sampling_go_through_the_approval_path() {
    let servers = Servers::new();
    let mut t = start(vec![servers.everything()], |_| {}).await;
    bounded(async {
        t.wait_tools(&[
            "everything__trigger-elicitation-request",
            "everything__trigger-sampling-request",
        ])
        .await;
        let a = t.session.open(OpenConversation::default()).await.unwrap();
        let ask = || call("everything__trigger-elicitation-request", json!({}));

        // Approved with content: the server gets it.
        let session = t.session.clone();
        let running = tokio::spawn({
            let text = ask();
            async move { session.message(a, text).await }
        });
        let p = next_pending(&mut t, a).await;
        assert_eq!(p.command, ["mcp", "everything", "elicitation"]);
        let ApprovalSubject::McpElicitation {
            server,
            message,
            schema,
        } = &p.subject
        else {
            panic!("{:?}", p.subject);
        };
        assert_eq!(server, "everything");
        assert!(message.contains("Please provide inputs"), "{message}");
        assert_eq!(schema.0["properties"]["name"]["type"], "string");
        // While a human decides, the task holds no slot: with one slot for the session,
        // another conversation's message runs to its end meanwhile.
        let b = t.session.open(OpenConversation::default()).await.unwrap();
        let other = t.session.message(b, "hello").await.unwrap();
        assert_eq!(other.status, TaskStatus::Ok, "{other:?}");
        assert_eq!(other.text, "model says: hello");
        // `name` is required and has no default: a plain approval is refused, still pending.
        let err = t
            .session
            .respond_approval(p.approval_id, ApprovalDecision::ApproveOnce)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("`name`"), "{err}");
        let content = Json(json!({"name": "Ada Lovelace", "check": true, "integer": 7}));
        t.session
            .respond_approval(
                p.approval_id,
                ApprovalDecision::ApproveWithContent { content },
            )
            .await
            .unwrap();
        let reply = running.await.unwrap().unwrap();
        assert!(
            reply.text.contains("- Name: Ada Lovelace"),
            "{}",
            reply.text
        );
        assert!(
            reply.text.contains("- Favorite Integer: 7"),
            "{}",
            reply.text
        );

        // Denied: declined.
        let session = t.session.clone();
        let running = tokio::spawn({
            let text = ask();
            async move { session.message(a, text).await }
        });
        let p = next_pending(&mut t, a).await;
        t.session
            .respond_approval(p.approval_id, ApprovalDecision::Deny { reason: None })
            .await
            .unwrap();
        let reply = running.await.unwrap().unwrap();
        assert!(
            reply.text.contains("\"action\": \"decline\""),
            "{}",
            reply.text
        );

        // Sampling: approved, the session's model answers the server's messages.
        let sample = || {
            call(
                "everything__trigger-sampling-request",
                json!({"prompt": "name three actors", "maxTokens": 20}),
            )
        };
        let session = t.session.clone();
        let running = tokio::spawn({
            let text = sample();
            async move { session.message(a, text).await }
        });
        let p = next_pending(&mut t, a).await;
        assert_eq!(p.command, ["mcp", "everything", "sampling"]);
        assert!(
            matches!(&p.subject, ApprovalSubject::McpSampling { request, .. }
            if request.0["maxTokens"] == 20)
        );
        t.session
            .respond_approval(p.approval_id, ApprovalDecision::ApproveOnce)
            .await
            .unwrap();
        let reply = running.await.unwrap().unwrap();
        assert!(
            reply.text.contains(
                "model says: Resource trigger-sampling-request context: name three actors"
            ),
            "{}",
            reply.text
        );

        // Sampling denied: an error to the server, which its tool reports.
        let session = t.session.clone();
        let running = tokio::spawn({
            let text = sample();
            async move { session.message(a, text).await }
        });
        let p = next_pending(&mut t, a).await;
        let deny = ApprovalDecision::Deny {
            reason: Some("no sampling today".into()),
        };
        t.session
            .respond_approval(p.approval_id, deny)
            .await
            .unwrap();
        let reply = running.await.unwrap().unwrap();
        assert!(reply.text.contains("no sampling today"), "{}", reply.text);
        assert!(t.session.pending_approvals().await.unwrap().is_empty());
    })
    .await;
    t.stop(&servers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_starts_servers_with_only_their_configured_environment() {
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let servers = Servers::new();
    let t = start(vec![servers.everything()], |_| {}).await;
    bounded(async {
        t.wait_tools(&["everything__get-env"]).await;
        let root = t.session.root().await.unwrap();
        let reply = t
            .session
            .message(root, call("everything__get-env", json!({})))
            .await
            .unwrap();
        let dump = reply.text.strip_prefix("observed: ").unwrap();
        let vars: std::collections::BTreeMap<String, String> = serde_json::from_str(dump).unwrap();
        assert_eq!(
            vars,
            std::collections::BTreeMap::from([(MARKER.to_owned(), servers.marker.clone())])
        );
    })
    .await;
    t.stop(&servers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pool_is_restarted_and_conversations_keep_their_views() {
    let servers = Servers::new();
    let mut t = start(vec![servers.everything()], |_| {}).await;
    bounded(async {
        t.wait_tools(&["everything__echo"]).await;
        let a = t
            .session
            .open(open_with(&["everything__echo"]))
            .await
            .unwrap();
        let echo = |m: &str| call("everything__echo", json!({ "message": m }));
        assert_eq!(
            t.session.message(a, echo("before")).await.unwrap().text,
            "observed: Echo: before"
        );
        let services = t.session.services().await.unwrap();
        while t.events.try_recv().is_ok() {}
        let old = t.pool().await;
        old.actor()
            .cast(troupe_actors::mcp_pool::McpPoolMsg::InjectPanic)
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while t.pool().await.actor().get_id() == old.actor().get_id() {
            assert!(Instant::now() < deadline, "the pool was not restarted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The new pool starts the server again for the reopened views.
        t.event(Duration::from_secs(20), |e| {
            matches!(e.event, EventKind::McpServerReady { .. })
        })
        .await;
        t.wait_tools(&["everything__echo"]).await;
        let after = t.session.message(a, echo("after")).await.unwrap();
        assert_eq!(after.text, "observed: Echo: after");
        // The conversation's allowlist came along; nothing else in the session changed.
        assert_eq!(t.model.offered_to(a), ["everything__echo"]);
        let now = t.session.services().await.unwrap();
        assert_eq!(now.rollout.get_id(), services.rollout.get_id());
        assert_eq!(now.approvals.get_id(), services.approvals.get_id());
        assert_eq!(now.scheduler.get_id(), services.scheduler.get_id());
        assert_eq!(t.session.list().await.unwrap().len(), 2);
        assert_eq!(servers.processes().len(), 1);
    })
    .await;
    t.stop(&servers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_task_calls_its_tools_through_the_pool_that_replaced_a_failed_one() {
    let servers = Servers::new();
    let mut t = start(vec![servers.everything()], |_| {}).await;
    bounded(async {
        t.wait_tools(&["everything__echo"]).await;
        let root = t.session.root().await.unwrap();
        let session = t.session.clone();
        let text = format!(
            "hold, then {}",
            call(
                "everything__echo",
                json!({ "message": "across the restart" })
            )
        );
        let task = tokio::spawn(async move { session.message(root, text).await });
        // The task is in flight: its view is on the first pool, its model step is held.
        let deadline = Instant::now() + Duration::from_secs(10);
        while t.model.held.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < deadline,
                "the task never reached the model"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let old = t.pool().await;
        let first_pid = t.pid("everything").await.unwrap();
        old.actor()
            .cast(troupe_actors::mcp_pool::McpPoolMsg::InjectPanic)
            .unwrap();
        while t.pool().await.actor().get_id() == old.actor().get_id() {
            assert!(Instant::now() < deadline, "the pool was not restarted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The conversation's new view starts the server again on the new pool.
        t.event(Duration::from_secs(20), |e| {
            matches!(e.event, EventKind::McpServerReady { .. })
        })
        .await;
        t.wait_tools(&["everything__echo"]).await;
        assert_ne!(t.pid("everything").await, Some(first_pid));
        // Now the task makes its call: through a view of its own on the new pool.
        t.model.release.notify_one();
        let reply = task.await.unwrap().unwrap();
        assert_eq!(
            (reply.status, reply.text.as_str(), reply.stats.tool_calls),
            (TaskStatus::Ok, "observed: Echo: across the restart", 1)
        );
        assert_eq!(servers.processes().len(), 1);
    })
    .await;
    t.stop(&servers).await;
}

/// The full tool list of a session over the three servers, as the model is offered it.
async fn offered_tools() -> Vec<ToolSpec> {
    let servers = Servers::new();
    let t = start(
        vec![servers.everything(), servers.memory(), servers.filesystem()],
        |_| {},
    )
    .await;
    t.wait_tools(&[
        "everything__trigger-sampling-request",
        "everything__trigger-elicitation-request",
        "everything__get-roots-list",
        "memory__read_graph",
        "filesystem__list_directory",
    ])
    .await;
    let root = t.session.root().await.unwrap();
    t.session.message(root, "which tools?").await.unwrap();
    let tools = t.model.specs_offered_to(root);
    t.stop(&servers).await;
    tools
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_merged_tool_list_is_the_same_in_every_run() {
    // Keys sorted: the same snapshot whether serde_json keeps insertion order or not (its
    // `preserve_order` feature, which the ACP crate turns on for builds that include it).
    let mut sorted = insta::Settings::clone_current();
    sorted.set_sort_maps(true);
    let _sorted = sorted.bind_to_scope();
    bounded(async {
        let first = offered_tools().await;
        let second = offered_tools().await;
        assert_eq!(first, second, "the tool list depends on the run");
        let listed: Vec<Value> = first
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description}))
            .collect();
        insta::assert_json_snapshot!("merged_mcp_tool_list", listed);
    })
    .await;
}

/// C5: an allowlist is checked against the configured servers at open, before any server has
/// connected (the pool is asked at once, with nothing connected yet; without a pool the
/// configuration itself is the reference); an entry of a configured server that turns out,
/// once the server is up, not to be one of its tools gets a clear warning of its
/// conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowlists_are_checked_before_any_server_connects_and_unknown_tools_are_reported() {
    use troupe_proto::WarningCode;
    let servers = Servers::new();
    // The server takes two seconds to start, so that the opens below happen before it is up.
    let mut slow = servers.everything();
    if let McpTransport::Stdio { command, args, .. } = &mut slow.transport {
        let script = format!("sleep 2 && exec {command} {}", args.join(" "));
        *command = "sh".into();
        *args = vec!["-c".into(), script];
    }
    let mut t = start(vec![slow], |_| {}).await;
    bounded(async {
        let err = t
            .session
            .open(open_with(&["git__log", "everything__echo"]))
            .await
            .unwrap_err();
        assert!(matches!(err, AgentError::InvalidInput { .. }), "{err:?}");
        assert!(err.to_string().contains("`git__log`"), "{err}");

        // A configured server's entries are accepted while it starts; once it is up, the one
        // it does not offer is reported to that conversation.
        let c = t
            .session
            .open(open_with(&["everything__echo", "everything__no_such_tool"]))
            .await
            .unwrap();
        let warning = t
            .event(Duration::from_secs(30), |e| {
                e.conversation_id == Some(c)
                    && matches!(&e.event, EventKind::Warning { code, .. } if *code == WarningCode::McpAllowlistUnknownTool)
            })
            .await;
        let EventKind::Warning { message, .. } = &warning.event else {
            unreachable!()
        };
        assert!(message.contains("everything__no_such_tool"), "{message}");
        assert!(!message.contains("everything__echo"), "{message}");

        // That accepted allowlist is opened again as it is: a refresh of the tools succeeds,
        // and a restart of the conversation (from its rollout) brings it back, still
        // answering, rather than losing it to the entry its server does not offer.
        t.session
            .set_context(
                c,
                SetContext {
                    refresh_mcp: true,
                    ..SetContext::default()
                },
            )
            .await
            .unwrap();
        let old = t.session.conversation_actor(c).await.unwrap().unwrap();
        old.cast(troupe_actors::conversation::ConversationMsg::InjectPanic)
            .unwrap();
        t.event(Duration::from_secs(10), |e| {
            e.conversation_id == Some(c)
                && matches!(e.event, EventKind::ConversationRestarted { .. })
        })
        .await;
        let reply = t.session.message(c, "still here?").await.unwrap();
        assert_eq!(reply.status, TaskStatus::Ok, "{reply:?}");
        // A new allowlist naming a tool the server does not offer is still refused.
        let refused = t
            .session
            .set_context(
                c,
                SetContext {
                    mcp_tool_allowlist: Some(Some(vec!["everything__nope".into()])),
                    ..SetContext::default()
                },
            )
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("everything__nope"), "{refused}");
    })
    .await;
    t.stop(&servers).await;

    // A session whose configured servers have no pool (no connector): the configuration
    // still decides, at open and at set-context.
    let data = tempfile::tempdir().unwrap();
    let mut config = SessionConfig {
        data_dir: data.path().to_path_buf(),
        ..SessionConfig::default()
    };
    config.mcp_servers = vec![servers.everything()];
    let ports = SessionPorts {
        model: Arc::new(DirectiveModel::default()),
        mcp: None,
        mcp_connector: None,
        exec: None,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(troupe_actors::history::LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: None,
        agents: None,
    };
    let (session, _join) = SessionHandle::start(SessionId::new(), config, ports)
        .await
        .unwrap();
    let err = session.open(open_with(&["git__log"])).await.unwrap_err();
    assert!(err.to_string().contains("`git__log`"), "{err}");
    let c = session
        .open(open_with(&["everything__echo"]))
        .await
        .unwrap();
    let refused = session
        .set_context(
            c,
            SetContext {
                mcp_tool_allowlist: Some(Some(vec!["git__log".into()])),
                ..SetContext::default()
            },
        )
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("`git__log`"), "{refused}");
    session.shutdown().await.unwrap();
}

/// S11: a conversation counts its MCP calls and their latency (a real server's calls, one of
/// them a second long), apart from its built-in tool calls, and the figures survive the
/// conversation's restart from its rollout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_call_counts_and_latency_are_per_conversation_and_survive_a_restart() {
    let servers = Servers::new();
    let mut t = start(vec![servers.everything()], |_| {}).await;
    bounded(async {
        t.wait_tools(&[
            "everything__echo",
            "everything__trigger-long-running-operation",
        ])
        .await;
        let a = t.session.open(OpenConversation::default()).await.unwrap();
        let b = t.session.open(OpenConversation::default()).await.unwrap();
        t.session
            .message(a, call("everything__echo", json!({"message": "hi"})))
            .await
            .unwrap();
        let long = call(
            "everything__trigger-long-running-operation",
            json!({"duration": 1, "steps": 1}),
        );
        let reply = t.session.message(a, long).await.unwrap();
        assert_eq!(reply.stats.mcp_calls, 1, "{reply:?}");
        assert!(reply.stats.mcp_latency_ms >= 1000, "{reply:?}");
        t.session.message(b, "no tools").await.unwrap();

        let before = conversation_stats(&t.session, a).await;
        assert_eq!(
            (before.tasks, before.tool_calls, before.mcp_calls),
            (2, 2, 2)
        );
        assert!(before.mcp_latency_ms_total >= 1000, "{before:?}");
        let other = conversation_stats(&t.session, b).await;
        assert_eq!((other.mcp_calls, other.mcp_latency_ms_total), (0, 0));

        // The conversation fails and is restarted from its rollout: same figures.
        let old = t.session.conversation_actor(a).await.unwrap().unwrap();
        old.cast(troupe_actors::conversation::ConversationMsg::InjectPanic)
            .unwrap();
        t.event(Duration::from_secs(10), |e| {
            e.conversation_id == Some(a)
                && matches!(e.event, EventKind::ConversationRestarted { .. })
        })
        .await;
        let after = conversation_stats(&t.session, a).await;
        assert_eq!(
            (
                after.tasks,
                after.tool_calls,
                after.mcp_calls,
                after.mcp_latency_ms_total
            ),
            (
                before.tasks,
                before.tool_calls,
                before.mcp_calls,
                before.mcp_latency_ms_total
            )
        );
        assert_eq!(after.usage, before.usage);
    })
    .await;
    t.stop(&servers).await;
}

/// A server that dies while a human is asked for its elicitation takes its question with it:
/// the request is withdrawn (not left pending for a human to answer in vain), whichever end
/// of the connection notices first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elicitation_of_a_server_that_died_is_withdrawn() {
    let servers = Servers::new();
    let mut t = start(vec![servers.everything()], |_| {}).await;
    bounded(async {
        t.wait_tools(&["everything__trigger-elicitation-request"])
            .await;
        let a = t.session.open(OpenConversation::default()).await.unwrap();
        let session = t.session.clone();
        let _running = tokio::spawn(async move {
            session
                .message(
                    a,
                    call("everything__trigger-elicitation-request", json!({})),
                )
                .await
        });
        let p = next_pending(&mut t, a).await;
        for pid in servers.processes() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let t0 = std::time::Instant::now();
        while !t.session.pending_approvals().await.unwrap().is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "still asked: {:?}",
                p.approval_id
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    t.stop(&servers).await;
}
