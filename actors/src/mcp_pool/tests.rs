//! The pool as an actor, against an in-process fake connector. Timers run on paused time.

use super::*;
use crate::approval_store::{ApprovalStore, ApprovalStoreArgs};
use crate::events::EventDraft;
use crate::ports::{
    DeltaSink, McpCall, McpPort, McpTransport, McpView, ModelInfo, ModelRequest, ModelResponse,
    ToolCallContext, ToolFailure,
};
use crate::rollout::RolloutMsg;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use troupe_proto::{ApprovalDecision, ApprovalSubject, Json, PendingApproval, TaskId};
use troupe_proto::{ToolCall, ToolOutput};

// ----- the fake -----

/// One fake server: its behaviour (set by the test) and what happened to it.
struct FakeServer {
    name: String,
    tools: watch::Sender<Vec<McpTool>>,
    connect_delay: Duration,
    call_delay_ms: AtomicU64,
    /// Connect attempts still to refuse.
    fail_next_connects: AtomicUsize,
    /// Progress notices each call sends.
    progress_per_call: AtomicUsize,
    /// Calls in flight keep running when the connection dies (a transport that does not fail
    /// them), so only the pool can end them.
    calls_survive_death: AtomicBool,
    /// When each connect attempt started.
    attempts: watch::Sender<Vec<Instant>>,
    closes: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    current: watch::Sender<Option<Arc<FakeConn>>>,
    handler: watch::Sender<Option<Arc<dyn McpClientHandler>>>,
    /// What each call asks the client before it answers.
    asks: watch::Sender<Asks>,
}

/// A server request a fake call makes through its client handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asks {
    Nothing,
    Elicitation,
    Sampling,
}

impl FakeServer {
    fn new(name: &str, tools: &[&str]) -> Arc<Self> {
        Self::build(name, tools, Duration::ZERO)
    }

    fn slow(name: &str, tools: &[&str], connect_delay: Duration) -> Arc<Self> {
        Self::build(name, tools, connect_delay)
    }

    fn build(name: &str, tools: &[&str], connect_delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            tools: watch::Sender::new(tools.iter().map(|t| tool(t)).collect()),
            connect_delay,
            call_delay_ms: AtomicU64::new(0),
            fail_next_connects: AtomicUsize::new(0),
            progress_per_call: AtomicUsize::new(0),
            calls_survive_death: AtomicBool::new(false),
            attempts: watch::Sender::new(Vec::new()),
            closes: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            current: watch::Sender::new(None),
            handler: watch::Sender::new(None),
            asks: watch::Sender::new(Asks::Nothing),
        })
    }

    fn config(&self) -> McpServerConfig {
        McpServerConfig {
            name: self.name.clone(),
            transport: McpTransport::Stdio {
                command: format!("fake-{}", self.name),
                args: Vec::new(),
                env: Default::default(),
                cwd: None,
            },
        }
    }

    fn connects(&self) -> usize {
        self.attempts.borrow().len()
    }

    fn set_call_delay(&self, d: Duration) {
        self.call_delay_ms
            .store(d.as_millis() as u64, Ordering::SeqCst);
    }

    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The live connection dies (the process exits).
    fn kill(&self, reason: &str) {
        let conn = self.current.borrow().clone().expect("a live connection");
        conn.dead.cancel();
        let _ = conn.notices.send(McpNotice::Closed {
            reason: reason.to_owned(),
        });
    }

    fn notify(&self, notice: McpNotice) {
        let conn = self.current.borrow().clone().expect("a live connection");
        let _ = conn.notices.send(notice);
    }
}

fn tool(name: &str) -> McpTool {
    McpTool {
        name: name.to_owned(),
        description: format!("the {name} tool"),
        input_schema: Json(json!({"type": "object", "properties": {}})),
        requires_task: false,
    }
}

struct FakeConn {
    server: Arc<FakeServer>,
    notices: mpsc::UnboundedSender<McpNotice>,
    dead: CancellationToken,
    closed: AtomicBool,
}

/// Counts a call in flight until dropped (a call future the pool drops counts down too).
struct InFlight<'a>(&'a FakeServer);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl McpConnection for FakeConn {
    async fn list_tools(&self) -> Result<Vec<McpTool>, AgentError> {
        if self.dead.is_cancelled() {
            return Err(self.died());
        }
        Ok(self.server.tools.borrow().clone())
    }

    async fn call_tool(&self, call: McpCall<'_>) -> Result<ToolOutput, AgentError> {
        if self.dead.is_cancelled() {
            return Err(self.died());
        }
        let s = &self.server;
        let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        s.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let _counted = InFlight(s);
        if let Some(progress) = &call.progress {
            for k in 0..s.progress_per_call.load(Ordering::SeqCst) {
                let _ = progress.send(McpNotice::Progress {
                    progress: k as f64,
                    total: None,
                    message: Some(format!("step {k}")),
                });
            }
        }
        let ask = *s.asks.borrow();
        let asked = match ask {
            Asks::Nothing => String::new(),
            ask => {
                let handler = s.handler.borrow().clone().expect("a handler");
                match ask {
                    Asks::Elicitation => {
                        let schema = Json(json!({
                            "type": "object",
                            "properties": {"name": {"type": "string"}},
                            "required": ["name"]
                        }));
                        let outcome = handler.elicit_outcome("your name?".into(), schema).await;
                        format!(" elicited {outcome:?}")
                    }
                    _ => {
                        let request = Json(json!({
                            "messages": [{"role": "user", "content": {"type": "text", "text": "say hi"}}],
                            "maxTokens": 10
                        }));
                        match handler.sample(request).await {
                            Ok(result) => format!(" sampled {}", result.0["content"]["text"]),
                            Err(error) => format!(" sampling failed: {error}"),
                        }
                    }
                }
            }
        };
        let delay = Duration::from_millis(s.call_delay_ms.load(Ordering::SeqCst));
        let survive = s.calls_survive_death.load(Ordering::SeqCst);
        tokio::select! {
            _ = tokio::time::sleep(delay) => Ok(ToolOutput {
                call_id: String::new(),
                output: format!("{}:{} {}{asked}", s.name, call.tool, call.arguments.0),
                is_error: false,
            }),
            _ = self.dead.cancelled(), if !survive => Err(self.died()),
            _ = call.cancel.cancelled() => Err(AgentError::cancelled("call cancelled")),
        }
    }

    fn process_id(&self) -> Option<u32> {
        Some(4242)
    }

    async fn close(&self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            self.server.closes.fetch_add(1, Ordering::SeqCst);
            self.dead.cancel();
            // A real transport reports its own end too; the pool must ignore it.
            let _ = self.notices.send(McpNotice::Closed {
                reason: "closed by the client".into(),
            });
        }
    }
}

impl FakeConn {
    fn died(&self) -> AgentError {
        AgentError::McpError {
            server: self.server.name.clone(),
            message: "connection died".into(),
        }
    }
}

struct FakeConnector {
    servers: HashMap<String, Arc<FakeServer>>,
}

#[async_trait]
impl McpConnector for FakeConnector {
    async fn connect(
        &self,
        config: &McpServerConfig,
        handler: Arc<dyn McpClientHandler>,
        notices: mpsc::UnboundedSender<McpNotice>,
    ) -> Result<Arc<dyn McpConnection>, AgentError> {
        let server = self
            .servers
            .get(&config.name)
            .cloned()
            .ok_or_else(|| AgentError::internal("unknown fake server"))?;
        server.attempts.send_modify(|a| a.push(Instant::now()));
        server.handler.send_replace(Some(handler));
        tokio::time::sleep(server.connect_delay).await;
        let refuse = server
            .fail_next_connects
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if refuse {
            return Err(AgentError::McpError {
                server: config.name.clone(),
                message: "connection refused".into(),
            });
        }
        let conn = Arc::new(FakeConn {
            server: server.clone(),
            notices,
            dead: CancellationToken::new(),
            closed: AtomicBool::new(false),
        });
        server.current.send_replace(Some(conn.clone()));
        Ok(conn)
    }
}

// ----- harness -----

/// Stands in for the Rollout: forwards every emitted draft to the test.
struct Forward;

#[ractor::async_trait]
impl Actor for Forward {
    type Msg = RolloutMsg;
    type State = mpsc::UnboundedSender<EventDraft>;
    type Arguments = mpsc::UnboundedSender<EventDraft>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        tx: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(tx)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        tx: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let RolloutMsg::Emit { draft } = msg {
            let _ = tx.send(draft);
        }
        Ok(())
    }
}

struct Harness {
    pool: McpPoolHandle,
    events: mpsc::UnboundedReceiver<EventDraft>,
}

fn limits() -> McpLimits {
    McpLimits {
        idle_timeout: Duration::from_secs(60),
        restart_backoff_base: Duration::from_secs(1),
        restart_backoff_max: Duration::from_secs(4),
        per_conversation_concurrency: 8,
        per_conversation_rate: None,
        session_concurrency: 32,
        wait_bound: Duration::from_secs(1),
        call_timeout: Duration::from_secs(600),
        connect_timeout: Duration::from_secs(60),
    }
}

async fn start(servers: &[&Arc<FakeServer>], limits: McpLimits) -> Harness {
    start_with(servers, limits, Vec::new(), None).await
}

async fn start_with_roots(
    servers: &[&Arc<FakeServer>],
    limits: McpLimits,
    roots: Vec<String>,
) -> Harness {
    start_with(servers, limits, roots, None).await
}

/// An approval store that waits `approval_timeout` for a human, and a model that says what it
/// was asked.
async fn start_with_approvals(
    servers: &[&Arc<FakeServer>],
    approval_timeout: Duration,
) -> (Harness, ActorRef<ApprovalMsg>) {
    start_with_approvals_and(servers, approval_timeout, limits()).await
}

async fn start_with_approvals_and(
    servers: &[&Arc<FakeServer>],
    approval_timeout: Duration,
    limits: McpLimits,
) -> (Harness, ActorRef<ApprovalMsg>) {
    let (store, _) = Actor::spawn(
        None,
        ApprovalStore,
        ApprovalStoreArgs {
            clock: Clock::new(),
            sweep_interval: Duration::from_secs(3600),
            request_timeout: approval_timeout,
            events: None,
        },
    )
    .await
    .unwrap();
    let harness = start_with(servers, limits, Vec::new(), Some(store.clone().into())).await;
    (harness, store)
}

async fn start_with(
    servers: &[&Arc<FakeServer>],
    limits: McpLimits,
    roots: Vec<String>,
    approvals: Option<ServiceRef<ApprovalMsg>>,
) -> Harness {
    let (tx, events) = mpsc::unbounded_channel();
    let (rollout, _) = Actor::spawn(None, Forward, tx).await.unwrap();
    let connector = FakeConnector {
        servers: servers
            .iter()
            .map(|s| (s.name.clone(), Arc::clone(s)))
            .collect(),
    };
    let (pool, _) = McpPoolHandle::spawn(
        McpPoolArgs {
            servers: servers.iter().map(|s| s.config()).collect(),
            connector: Arc::new(connector),
            events: Some(EventSink::new(rollout)),
            limits,
            clock: Clock::new(),
            roots,
            approvals,
            model: Some(Arc::new(Parrot)),
        },
        None,
    )
    .await
    .unwrap();
    Harness { pool, events }
}

/// A model that answers "parrot: <the last message>" under the system prompt it got.
struct Parrot;

#[async_trait]
impl ModelClient for Parrot {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "test".into(),
            model: "parrot".into(),
            family: "parrot".into(),
        }
    }

    async fn step(
        &self,
        request: ModelRequest<'_>,
        _deltas: &mut dyn DeltaSink,
        _cancel: &CancellationToken,
    ) -> Result<ModelResponse, AgentError> {
        assert!(request.tools.is_empty(), "sampling offers no tools");
        let last = request.prompt.iter().last().cloned();
        let text = match last {
            Some(troupe_proto::HistoryItem::Message { text, .. }) => format!("parrot: {text}"),
            other => format!("parrot: {other:?}"),
        };
        Ok(ModelResponse {
            text,
            ..ModelResponse::default()
        })
    }
}

impl Harness {
    async fn open(&self, allowlist: Option<&[&str]>) -> Arc<dyn McpView> {
        self.open_for(ConversationId::new(), allowlist).await
    }

    async fn open_for(
        &self,
        conversation_id: ConversationId,
        allowlist: Option<&[&str]>,
    ) -> Arc<dyn McpView> {
        let list: Option<Vec<String>> =
            allowlist.map(|l| l.iter().map(|s| (*s).to_owned()).collect());
        self.pool
            .open_view(conversation_id, list.as_deref())
            .await
            .unwrap()
    }

    /// The next warning with `code`, skipping other events.
    async fn warning(&mut self, code: WarningCode) -> String {
        let wait = async {
            loop {
                let draft = self.events.recv().await.expect("event stream open");
                if let EventKind::Warning { code: c, message } = draft.event
                    && c == code
                {
                    return message;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(24 * 3600), wait)
            .await
            .unwrap_or_else(|_| panic!("no `{code}` warning"))
    }

    /// Waits for `server`'s `mcp_server_ready` event; its tool count.
    async fn ready(&mut self, server: &str) -> u32 {
        let wait = async {
            loop {
                let draft = self.events.recv().await.expect("event stream open");
                if let EventKind::McpServerReady { server: s, tools } = draft.event
                    && s == server
                {
                    assert_eq!(draft.conversation_id, None, "a session event");
                    return tools;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(24 * 3600), wait)
            .await
            .unwrap_or_else(|_| panic!("`{server}` never became ready"))
    }

    async fn snapshot(&self) -> PoolSnapshot {
        self.pool.snapshot().await.unwrap()
    }

    async fn server(&self, name: &str) -> ServerSnapshot {
        self.snapshot()
            .await
            .servers
            .into_iter()
            .find(|s| s.name == name)
            .unwrap()
    }
}

async fn call(view: &Arc<dyn McpView>, name: &str) -> Result<ToolOutput, AgentError> {
    try_call(view, name, &CancellationToken::new())
        .await
        .map_err(|failure| failure.error)
}

async fn call_with(
    view: &Arc<dyn McpView>,
    name: &str,
    cancel: &CancellationToken,
) -> Result<ToolOutput, AgentError> {
    try_call(view, name, cancel)
        .await
        .map_err(|failure| failure.error)
}

/// A call, failing with the kind of failure the view made.
async fn try_call(
    view: &Arc<dyn McpView>,
    name: &str,
    cancel: &CancellationToken,
) -> Result<ToolOutput, ToolFailure> {
    let call = ToolCall {
        call_id: format!("call-{name}"),
        name: name.to_owned(),
        arguments: Json(json!({"n": 1})),
    };
    view.call_tool(
        &call,
        ToolCallContext {
            conversation_id: ConversationId::new(),
            task_id: TaskId::new(),
            cancel,
            span: &tracing::Span::none(),
            slot: None,
        },
    )
    .await
}

fn spawn_call(
    view: &Arc<dyn McpView>,
    name: &str,
) -> tokio::task::JoinHandle<Result<ToolOutput, AgentError>> {
    let view = view.clone();
    let name = name.to_owned();
    tokio::spawn(async move { call(&view, &name).await })
}

async fn names(view: &Arc<dyn McpView>) -> Vec<String> {
    view.list_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect()
}

/// Lets spawned tasks and the pool run without moving the clock.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Yields until `cond` holds (the clock does not move).
async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never happened: {what}");
}

fn overloaded_resource(result: Result<ToolOutput, AgentError>) -> (String, u32) {
    match result {
        Err(AgentError::Overloaded { resource, limit }) => (resource, limit),
        other => panic!("expected Overloaded, got {other:?}"),
    }
}

// ----- tests -----

#[tokio::test(start_paused = true)]
async fn two_hundred_views_share_one_connection_per_server() {
    let a = FakeServer::new("a", &["x"]);
    let b = FakeServer::slow("b", &["y"], Duration::from_secs(1));
    let mut h = start(&[&a, &b], limits()).await;
    let opened =
        futures::future::join_all((0..200).map(|_| h.pool.open_view(ConversationId::new(), None)))
            .await;
    let views: Vec<Arc<dyn McpView>> = opened.into_iter().map(Result::unwrap).collect();
    h.ready("a").await;
    h.ready("b").await;
    assert_eq!((a.connects(), b.connects()), (1, 1));
    let snap = h.snapshot().await;
    assert_eq!(snap.views, 200);
    assert!(
        snap.servers
            .iter()
            .all(|s| s.refs == 200 && s.phase == "ready")
    );
    assert_eq!(snap.servers[0].process_id, Some(4242));

    assert!(call(&views[0], "a__x").await.is_ok());
    assert!(call(&views[199], "b__y").await.is_ok());
    for v in &views {
        v.release().await;
    }
    let snap = h.snapshot().await;
    assert_eq!(snap.views, 0);
    assert!(snap.servers.iter().all(|s| s.refs == 0));
    assert_eq!((a.connects(), b.connects()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn the_allowlist_shows_only_its_tools_and_unknown_entries_are_named() {
    let a = FakeServer::new("a", &["read", "write"]);
    let b = FakeServer::new("b", &["z"]);
    let mut h = start(&[&a, &b], limits()).await;
    let all = h.open(None).await;
    h.ready("a").await;
    h.ready("b").await;
    assert_eq!(names(&all).await, ["a__read", "a__write", "b__z"]);

    let some = h.open(Some(&["a__read", "b__z"])).await;
    assert_eq!(names(&some).await, ["a__read", "b__z"]);
    let out = call(&some, "a__read").await.unwrap();
    assert_eq!(out.call_id, "call-a__read");
    assert_eq!(out.output, r#"a:read {"n":1}"#);
    let hidden = try_call(&some, "a__write", &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(hidden, ToolFailure::unknown_tool("a__write"));

    let refused = h
        .pool
        .open_view(
            ConversationId::new(),
            Some(&[
                "a__read".to_owned(),
                "a__nope".to_owned(),
                "zz__x".to_owned(),
                "b__z".to_owned(),
                "c__q".to_owned(),
            ]),
        )
        .await
        .err()
        .unwrap();
    let AgentError::InvalidInput { message } = refused else {
        panic!("{refused:?}");
    };
    for entry in ["`a__nope`", "`zz__x`", "`c__q`"] {
        assert!(message.contains(entry), "{entry} missing from {message}");
    }
    assert!(!message.contains("`a__read`") && !message.contains("`b__z`"));
    // A refused view took no references.
    assert_eq!(h.server("a").await.refs, 2);
}

#[tokio::test(start_paused = true)]
async fn a_slow_server_delays_neither_a_view_nor_another_servers_calls() {
    let slow = FakeServer::slow("slow", &["t"], Duration::from_secs(10));
    let fast = FakeServer::new("fast", &["f"]);
    let mut h = start(&[&slow, &fast], limits()).await;
    let t0 = Instant::now();
    // Entries of a server still starting are accepted.
    let view = h
        .open(Some(&["slow__t", "slow__not_yet_known", "fast__f"]))
        .await;
    assert_eq!(t0.elapsed(), Duration::ZERO);
    h.ready("fast").await;
    assert_eq!(names(&view).await, ["fast__f"]);
    assert!(call(&view, "fast__f").await.is_ok());
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert_eq!(h.server("slow").await.phase, "connecting");
    let err = call(&view, "slow__t").await.unwrap_err();
    assert!(matches!(err, AgentError::McpError { ref server, .. } if server == "slow"));

    h.ready("slow").await;
    assert_eq!(t0.elapsed(), Duration::from_secs(10));
    assert_eq!(names(&view).await, ["fast__f", "slow__t"]);
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_is_reclaimed_after_the_last_release_unless_reopened() {
    let a = FakeServer::new("a", &["t"]);
    let mut h = start(&[&a], limits()).await;
    let v1 = h.open(None).await;
    h.ready("a").await;
    v1.release().await;
    v1.release().await; // idempotent
    assert_eq!(h.server("a").await.refs, 0);

    tokio::time::advance(Duration::from_secs(59)).await;
    settle().await;
    assert_eq!(h.server("a").await.phase, "ready");
    // Reopened before the reclaim: the connection stays, however long.
    let v2 = h.open(None).await;
    tokio::time::advance(Duration::from_secs(600)).await;
    settle().await;
    assert_eq!(h.server("a").await.phase, "ready");
    assert_eq!((a.connects(), a.closes.load(Ordering::SeqCst)), (1, 0));

    // Dropped without release (a failed conversation): released all the same.
    drop(v2);
    settle().await;
    assert_eq!(h.server("a").await.refs, 0);
    tokio::time::advance(Duration::from_secs(60)).await;
    settle().await;
    let snap = h.server("a").await;
    assert_eq!((snap.phase, snap.refs), ("idle", 0));
    assert_eq!(a.closes.load(Ordering::SeqCst), 1);

    // The next view connects again.
    let _v3 = h.open(None).await;
    h.ready("a").await;
    assert_eq!(a.connects(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_death_fails_the_call_fast_and_the_server_restarts_with_backoff() {
    let a = FakeServer::new("a", &["t"]);
    let b = FakeServer::new("b", &["u"]);
    a.set_call_delay(Duration::from_secs(5));
    let mut h = start(&[&a, &b], limits()).await;
    let va = h.open(Some(&["a__t"])).await;
    let vb = h.open(Some(&["b__u"])).await;
    h.ready("a").await;
    h.ready("b").await;

    let running = spawn_call(&va, "a__t");
    until("the call runs", || a.in_flight() == 1).await;
    let died_at = Instant::now();
    a.fail_next_connects.store(3, Ordering::SeqCst);
    a.kill("exit status 1");
    let err = running.await.unwrap().unwrap_err();
    assert!(
        matches!(err, AgentError::McpError { ref server, .. } if server == "a"),
        "{err:?}"
    );
    assert_eq!(died_at.elapsed(), Duration::ZERO);
    let failed = h.warning(WarningCode::McpServerFailed).await;
    assert!(
        failed.contains("exit status 1") && failed.contains("restarting in 1s"),
        "{failed}"
    );

    // While `a` is down: its calls fail at once, `b` is untouched.
    let down = call(&va, "a__t").await.unwrap_err();
    assert!(matches!(down, AgentError::McpError { .. }), "{down:?}");
    assert!(call(&vb, "b__u").await.is_ok());
    assert_eq!(died_at.elapsed(), Duration::ZERO);

    h.ready("a").await;
    let attempts: Vec<u64> = a
        .attempts
        .borrow()
        .iter()
        .skip(1)
        .map(|t| t.duration_since(died_at).as_secs())
        .collect();
    // Three refused restarts (after 1s, then 2s, then 4s) and a fourth capped at 4s.
    assert_eq!(attempts, [1, 3, 7, 11]);
    assert_eq!(h.server("a").await.failures, 0);
    let later = call(&va, "a__t").await.unwrap();
    assert_eq!(later.call_id, "call-a__t");
    assert_eq!(b.connects(), 1);
}

#[tokio::test(start_paused = true)]
async fn calls_waiting_for_a_slot_fail_when_their_server_dies() {
    let a = FakeServer::new("a", &["t"]);
    a.set_call_delay(Duration::from_secs(10));
    let mut h = start(
        &[&a],
        McpLimits {
            per_conversation_concurrency: 1,
            wait_bound: Duration::from_secs(60),
            ..limits()
        },
    )
    .await;
    // Only the pool can end these calls: the transport lets them run on.
    a.calls_survive_death.store(true, Ordering::SeqCst);
    let v = h.open(None).await;
    h.ready("a").await;
    let first = spawn_call(&v, "a__t");
    until("the first call runs", || a.in_flight() == 1).await;
    let second = spawn_call(&v, "a__t");
    settle().await;
    assert!(!second.is_finished());
    let t0 = Instant::now();
    a.kill("killed");
    let err = first.await.unwrap().unwrap_err();
    assert!(
        matches!(err, AgentError::McpError { ref message, .. } if message.contains("during the call")),
        "{err:?}"
    );
    let err = second.await.unwrap().unwrap_err();
    assert!(
        matches!(err, AgentError::McpError { ref message, .. } if message.contains("waited for a slot")),
        "{err:?}"
    );
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn the_conversation_concurrency_limit_holds_and_overflow_is_overloaded() {
    let a = FakeServer::new("a", &["t"]);
    a.set_call_delay(Duration::from_secs(10));
    let mut h = start(
        &[&a],
        McpLimits {
            per_conversation_concurrency: 2,
            ..limits()
        },
    )
    .await;
    let conv = ConversationId::new();
    let v1 = h.open_for(conv, None).await;
    // A second view of the same conversation shares its slots.
    let v1b = h.open_for(conv, None).await;
    let other = h.open(None).await;
    h.ready("a").await;

    let running = [spawn_call(&v1, "a__t"), spawn_call(&v1b, "a__t")];
    until("two calls run", || a.in_flight() == 2).await;
    let t0 = Instant::now();
    let (resource, limit) = overloaded_resource(call(&v1b, "a__t").await);
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    assert!(resource.contains("this conversation"), "{resource}");
    assert_eq!(limit, 2);

    // Another conversation is not held back.
    let third = spawn_call(&other, "a__t");
    until("the other conversation's call runs", || a.in_flight() == 3).await;
    for handle in running {
        assert!(handle.await.unwrap().is_ok());
    }
    assert!(third.await.unwrap().is_ok());
    assert_eq!(a.max_in_flight.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn the_conversation_rate_limit_spaces_calls_and_refuses_what_cannot_wait() {
    let a = FakeServer::new("a", &["t"]);
    let mut h = start(
        &[&a],
        McpLimits {
            per_conversation_rate: Some(Rate {
                per_second: 1.0,
                burst: 2,
            }),
            wait_bound: Duration::from_millis(1500),
            ..limits()
        },
    )
    .await;
    let v = h.open(None).await;
    let other = h.open(None).await;
    h.ready("a").await;
    let t0 = Instant::now();
    let mut started = Vec::new();
    for _ in 0..4 {
        call(&v, "a__t").await.unwrap();
        started.push(t0.elapsed().as_millis());
    }
    // A burst of two, then one a second.
    assert_eq!(started, [0, 0, 1000, 2000]);

    // Two at once: the first is reserved a second ahead, the second would need two.
    let next = spawn_call(&v, "a__t");
    settle().await;
    let (resource, limit) = overloaded_resource(call(&v, "a__t").await);
    assert_eq!(t0.elapsed().as_millis(), 2000, "refused without waiting");
    assert!(resource.contains("rate"), "{resource}");
    assert_eq!(limit, 2);
    // Another conversation has its own bucket.
    call(&other, "a__t").await.unwrap();
    assert_eq!(t0.elapsed().as_millis(), 2000);
    next.await.unwrap().unwrap();
    assert_eq!(t0.elapsed().as_millis(), 3000);
}

#[tokio::test(start_paused = true)]
async fn the_session_cap_holds_across_conversations() {
    let a = FakeServer::new("a", &["t"]);
    a.set_call_delay(Duration::from_secs(10));
    let mut h = start(
        &[&a],
        McpLimits {
            per_conversation_concurrency: 2,
            session_concurrency: 3,
            ..limits()
        },
    )
    .await;
    let (va, vb, vc) = (h.open(None).await, h.open(None).await, h.open(None).await);
    h.ready("a").await;
    let running = [
        spawn_call(&va, "a__t"),
        spawn_call(&va, "a__t"),
        spawn_call(&vb, "a__t"),
    ];
    until("three calls run", || a.in_flight() == 3).await;
    let t0 = Instant::now();
    let (resource, limit) = overloaded_resource(call(&vc, "a__t").await);
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    assert!(resource.contains("session"), "{resource}");
    assert_eq!(limit, 3);
    for handle in running {
        assert!(handle.await.unwrap().is_ok());
    }
    assert_eq!(a.max_in_flight.load(Ordering::SeqCst), 3);
    // Slots came back.
    assert!(call(&vc, "a__t").await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn tools_changed_refreshes_the_list() {
    let a = FakeServer::new("a", &["x"]);
    let mut h = start(&[&a], limits()).await;
    let v = h.open(None).await;
    h.ready("a").await;
    assert_eq!(names(&v).await, ["a__x"]);
    a.tools.send_replace(vec![tool("y"), tool("x"), tool("w")]);
    a.notify(McpNotice::ToolsChanged);
    let mut listed = Vec::new();
    for _ in 0..100 {
        listed = names(&v).await;
        if listed.len() == 3 {
            break;
        }
        settle().await;
    }
    assert_eq!(listed, ["a__w", "a__x", "a__y"]);
    assert!(call(&v, "a__w").await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn task_augmented_tools_are_left_out() {
    let a = FakeServer::new("a", &[]);
    a.tools.send_replace(vec![
        tool("plain"),
        McpTool {
            requires_task: true,
            ..tool("long_job")
        },
    ]);
    let mut h = start(&[&a], limits()).await;
    let v = h.open(None).await;
    assert_eq!(h.ready("a").await, 1);
    assert_eq!(names(&v).await, ["a__plain"]);
    let err = call(&v, "a__long_job").await.unwrap_err();
    assert!(
        matches!(err, AgentError::ToolError { ref message, .. } if message.contains("task augmentation")),
        "{err:?}"
    );
    let refused = h
        .pool
        .open_view(ConversationId::new(), Some(&["a__long_job".to_owned()]))
        .await
        .err()
        .unwrap();
    assert!(
        refused.to_string().contains("task augmentation"),
        "{refused}"
    );
}

#[tokio::test(start_paused = true)]
async fn illegal_or_repeated_server_names_fail_the_spawn() {
    let servers = ["ok", "a__b", "ok", "bad name"].map(|n| FakeServer::new(n, &[]).config());
    let args = || McpPoolArgs {
        servers: servers.to_vec(),
        connector: Arc::new(FakeConnector {
            servers: HashMap::new(),
        }),
        events: None,
        limits: limits(),
        clock: Clock::new(),
        roots: Vec::new(),
        approvals: None,
        model: None,
    };
    let err = McpPoolHandle::spawn(args(), None).await.unwrap_err();
    let text = err.to_string();
    for needle in ["`a__b`", "`ok` (configured twice)", "`bad name`"] {
        assert!(text.contains(needle), "{needle} missing from {text}");
    }
    // Spawning the actor directly fails the same way.
    assert!(Actor::spawn(None, McpPool, args()).await.is_err());
    let bad_limits = McpPoolArgs {
        servers: Vec::new(),
        limits: McpLimits {
            session_concurrency: 0,
            ..limits()
        },
        ..args()
    };
    let err = McpPoolHandle::spawn(bad_limits, None).await.unwrap_err();
    assert!(err.to_string().contains("session_concurrency"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn servers_get_the_roots_and_their_requests_outside_a_call_are_refused() {
    let a = FakeServer::new("a", &["t"]);
    let roots = vec![
        "/work/proj".to_owned(),
        "/work/proj".to_owned(),
        "/tmp/x y".to_owned(),
    ];
    let mut h = start_with_roots(&[&a], limits(), roots).await;
    let _v = h.open(None).await;
    h.ready("a").await;
    let handler = a.handler.borrow().clone().unwrap();
    assert_eq!(
        handler.list_roots().await,
        ["file:///tmp/x%20y", "file:///work/proj"]
    );
    // No call is running: nobody can answer, whatever the pool was given.
    let elicited = handler
        .elicit_outcome("your name?".into(), Json(json!({"type": "object"})))
        .await;
    assert_eq!(elicited, ElicitOutcome::Decline);
    let warned = h.warning(WarningCode::McpRequestUnattributed).await;
    assert!(warned.contains("none of its tool calls"), "{warned}");
    let err = handler.sample(Json(json!({}))).await.unwrap_err();
    assert!(
        matches!(err, AgentError::McpError { ref server, .. } if server == "a"),
        "{err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn calls_are_cancelled_while_waiting_and_bounded_by_their_timeout() {
    let a = FakeServer::new("a", &["t"]);
    a.set_call_delay(Duration::from_secs(100));
    let mut h = start(
        &[&a],
        McpLimits {
            per_conversation_concurrency: 1,
            wait_bound: Duration::from_secs(30),
            call_timeout: Duration::from_secs(5),
            ..limits()
        },
    )
    .await;
    let v = h.open(None).await;
    h.ready("a").await;
    let t0 = Instant::now();
    let running = spawn_call(&v, "a__t");
    until("the call runs", || a.in_flight() == 1).await;
    let cancel = CancellationToken::new();
    let waiting = {
        let (v, cancel) = (v.clone(), cancel.clone());
        tokio::spawn(async move { call_with(&v, "a__t", &cancel).await })
    };
    settle().await;
    cancel.cancel();
    let err = waiting.await.unwrap().unwrap_err();
    assert!(matches!(err, AgentError::Cancelled { .. }), "{err:?}");
    // The fake ignores the call's own timeout; the pool still ends the call after it (and
    // a short grace).
    let err = running.await.unwrap().unwrap_err();
    assert!(matches!(err, AgentError::Timeout { .. }), "{err:?}");
    assert_eq!(t0.elapsed(), Duration::from_secs(5) + CALL_TIMEOUT_GRACE);
    assert_eq!(a.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn progress_notices_become_tool_progress_events_of_the_task() {
    let a = FakeServer::new("a", &["t"]);
    a.progress_per_call.store(3, Ordering::SeqCst);
    a.set_call_delay(Duration::from_millis(10));
    let mut h = start(&[&a], limits()).await;
    let (c, t) = (ConversationId::new(), TaskId::new());
    let v = h.open_for(c, None).await;
    h.ready("a").await;
    let out = task_call(&v, "a__t", c, t, CancellationToken::new())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.call_id, "call-a__t");
    assert!(!out.is_error);
    let mut seen = Vec::new();
    while let Ok(draft) = h.events.try_recv() {
        if let EventKind::ToolProgress {
            call_id,
            progress,
            total,
            message,
        } = draft.event
        {
            assert_eq!((draft.conversation_id, draft.task_id), (Some(c), Some(t)));
            assert_eq!((call_id.as_str(), total), ("call-a__t", None));
            seen.push((progress, message.unwrap_or_default()));
        }
    }
    assert_eq!(
        seen,
        [
            (0.0, "step 0".to_owned()),
            (1.0, "step 1".to_owned()),
            (2.0, "step 2".to_owned())
        ]
    );
}

// ----- servers' requests -----

fn task_call(
    view: &Arc<dyn McpView>,
    name: &str,
    conversation_id: ConversationId,
    task_id: TaskId,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<Result<ToolOutput, AgentError>> {
    let view = view.clone();
    let call = ToolCall {
        call_id: format!("call-{name}"),
        name: name.to_owned(),
        arguments: Json(json!({})),
    };
    tokio::spawn(async move {
        view.call_tool(
            &call,
            ToolCallContext {
                conversation_id,
                task_id,
                cancel: &cancel,
                span: &tracing::Span::none(),
                slot: None,
            },
        )
        .await
        .map_err(|failure| failure.error)
    })
}

/// The one pending approval, once it is there (the clock does not move).
async fn pending_one(store: &ActorRef<ApprovalMsg>) -> PendingApproval {
    for _ in 0..1000 {
        let mut pending = ractor::call!(store, |reply| ApprovalMsg::ListPending {
            conversation_id: None,
            reply
        })
        .unwrap();
        if !pending.is_empty() {
            assert_eq!(pending.len(), 1, "{pending:?}");
            return pending.remove(0);
        }
        settle().await;
    }
    panic!("no approval request came");
}

async fn respond(store: &ActorRef<ApprovalMsg>, p: &PendingApproval, decision: ApprovalDecision) {
    ractor::call!(store, |reply| ApprovalMsg::Respond {
        approval_id: p.approval_id,
        decision,
        reply
    })
    .unwrap()
    .unwrap();
}

fn output(result: Result<Result<ToolOutput, AgentError>, tokio::task::JoinError>) -> String {
    result.unwrap().unwrap().output
}

#[tokio::test(start_paused = true)]
async fn an_elicitation_during_a_call_is_answered_through_the_approval_path() {
    let a = FakeServer::new("a", &["ask"]);
    a.asks.send_replace(Asks::Elicitation);
    let (mut h, store) = start_with_approvals(&[&a], Duration::from_secs(60)).await;
    let (c, t) = (ConversationId::new(), TaskId::new());
    let view = h.open_for(c, None).await;
    h.ready("a").await;

    // Approved with content: the server gets it.
    let running = task_call(&view, "a__ask", c, t, CancellationToken::new());
    let p = pending_one(&store).await;
    assert_eq!((p.conversation_id, p.task_id), (c, Some(t)));
    assert_eq!(p.command, ["mcp", "a", "elicitation"]);
    assert_eq!(p.reason, "your name?");
    let ApprovalSubject::McpElicitation {
        server,
        message,
        schema,
    } = &p.subject
    else {
        panic!("{:?}", p.subject);
    };
    assert_eq!((server.as_str(), message.as_str()), ("a", "your name?"));
    assert_eq!(schema.0["required"], json!(["name"]));
    let content = Json(json!({"name": "Ada"}));
    respond(&store, &p, ApprovalDecision::ApproveWithContent { content }).await;
    let out = output(running.await);
    assert!(out.ends_with(r#"elicited Accept({"name":"Ada"})"#), "{out}");

    // Denied: declined.
    let running = task_call(&view, "a__ask", c, t, CancellationToken::new());
    let p = pending_one(&store).await;
    respond(&store, &p, ApprovalDecision::Deny { reason: None }).await;
    assert!(output(running.await).ends_with("elicited Decline"));

    // Nobody answers: cancelled when the approval times out.
    let t0 = Instant::now();
    let running = task_call(&view, "a__ask", c, t, CancellationToken::new());
    pending_one(&store).await;
    assert!(output(running.await).ends_with("elicited Cancel"));
    assert_eq!(t0.elapsed(), Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn sampling_runs_the_model_once_approved_and_a_denial_fails_the_request() {
    let a = FakeServer::new("a", &["think"]);
    a.asks.send_replace(Asks::Sampling);
    let (mut h, store) = start_with_approvals(&[&a], Duration::from_secs(60)).await;
    let (c, other) = (ConversationId::new(), ConversationId::new());
    let view = h.open_for(c, None).await;
    let other_view = h.open_for(other, None).await;
    h.ready("a").await;

    let running = task_call(
        &view,
        "a__think",
        c,
        TaskId::new(),
        CancellationToken::new(),
    );
    let p = pending_one(&store).await;
    assert_eq!(p.command, ["mcp", "a", "sampling"]);
    assert!(
        p.reason.contains("asks to sample the model"),
        "{}",
        p.reason
    );
    let ApprovalSubject::McpSampling { server, request } = &p.subject else {
        panic!("{:?}", p.subject);
    };
    assert_eq!(
        (server.as_str(), &request.0["maxTokens"]),
        ("a", &json!(10))
    );
    let scoped = ApprovalDecision::ApproveForConversation { ttl_secs: None };
    respond(&store, &p, scoped).await;
    assert!(output(running.await).ends_with(r#"sampled "parrot: say hi""#));

    // Remembered for this conversation: no human is asked again.
    let again = task_call(
        &view,
        "a__think",
        c,
        TaskId::new(),
        CancellationToken::new(),
    );
    assert!(output(again.await).ends_with(r#"sampled "parrot: say hi""#));

    // Another conversation is asked, and a denial is an error to the server.
    let running = task_call(
        &other_view,
        "a__think",
        other,
        TaskId::new(),
        CancellationToken::new(),
    );
    let p = pending_one(&store).await;
    assert_eq!(p.conversation_id, other);
    let deny = ApprovalDecision::Deny {
        reason: Some("not now".into()),
    };
    respond(&store, &p, deny).await;
    let out = output(running.await);
    assert!(
        out.contains("sampling failed") && out.contains("not now"),
        "{out}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_while_several_tasks_call_the_server_is_refused() {
    let a = FakeServer::new("a", &["t"]);
    a.set_call_delay(Duration::from_secs(10));
    let (mut h, store) = start_with_approvals(&[&a], Duration::from_secs(60)).await;
    let (c1, c2) = (ConversationId::new(), ConversationId::new());
    let (v1, v2) = (h.open_for(c1, None).await, h.open_for(c2, None).await);
    h.ready("a").await;
    let running = [
        task_call(&v1, "a__t", c1, TaskId::new(), CancellationToken::new()),
        task_call(&v2, "a__t", c2, TaskId::new(), CancellationToken::new()),
    ];
    until("both calls run", || a.in_flight() == 2).await;
    h.snapshot().await; // a barrier: both starts are recorded
    let handler = a.handler.borrow().clone().unwrap();
    let outcome = handler
        .elicit_outcome("which of you?".into(), Json(json!({"type": "object"})))
        .await;
    assert_eq!(outcome, ElicitOutcome::Decline);
    let warned = h.warning(WarningCode::McpRequestUnattributed).await;
    assert!(warned.contains("2 tasks"), "{warned}");
    // Nobody was asked.
    let pending = ractor::call!(store, |reply| ApprovalMsg::ListPending {
        conversation_id: None,
        reply
    })
    .unwrap();
    assert!(pending.is_empty());
    for r in running {
        assert!(r.await.unwrap().is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn an_elicitation_waits_for_a_human_no_longer_than_its_call_has_left() {
    let a = FakeServer::new("a", &["ask"]);
    a.asks.send_replace(Asks::Elicitation);
    let short = McpLimits {
        call_timeout: Duration::from_secs(20),
        ..limits()
    };
    let (mut h, store) = start_with_approvals_and(&[&a], Duration::from_secs(60), short).await;
    let (c, t) = (ConversationId::new(), TaskId::new());
    let view = h.open_for(c, None).await;
    h.ready("a").await;
    let t0 = Instant::now();
    let running = task_call(&view, "a__ask", c, t, CancellationToken::new());
    let p = pending_one(&store).await;
    // The deadline shown to a human is the call's, not the approval timeout's 60 s.
    assert_eq!(p.deadline_ms - p.requested_at_ms, 20_000);
    // Nobody answers: the request is cancelled at the call's deadline, and the server's answer
    // to that still reaches the task (the call itself has not timed out yet).
    assert!(output(running.await).ends_with("elicited Cancel"));
    assert_eq!(t0.elapsed(), Duration::from_secs(20));
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_call_ends_its_pending_elicitation_at_once() {
    let a = FakeServer::new("a", &["ask"]);
    a.asks.send_replace(Asks::Elicitation);
    let (mut h, store) = start_with_approvals(&[&a], Duration::from_secs(60)).await;
    let c = ConversationId::new();
    let view = h.open_for(c, None).await;
    h.ready("a").await;
    let cancel = CancellationToken::new();
    let running = task_call(&view, "a__ask", c, TaskId::new(), cancel.clone());
    pending_one(&store).await;
    let t0 = Instant::now();
    cancel.cancel();
    let err = running.await.unwrap().unwrap_err();
    assert!(matches!(err, AgentError::Cancelled { .. }), "{err:?}");
    assert_eq!(t0.elapsed(), Duration::ZERO);
    // Nobody is left to ask: the request is withdrawn.
    for _ in 0..100 {
        let pending = ractor::call!(store, |reply| ApprovalMsg::ListPending {
            conversation_id: None,
            reply
        })
        .unwrap();
        if pending.is_empty() {
            return;
        }
        settle().await;
    }
    panic!("the elicitation stayed pending");
}

#[tokio::test(start_paused = true)]
async fn shutdown_closes_every_connection_and_views_then_fail() {
    let a = FakeServer::new("a", &["t"]);
    let b = FakeServer::new("b", &["u"]);
    let mut h = start(&[&a, &b], limits()).await;
    let v = h.open(None).await;
    h.ready("a").await;
    h.ready("b").await;
    h.pool.shutdown().await;
    assert_eq!(a.closes.load(Ordering::SeqCst), 1);
    assert_eq!(b.closes.load(Ordering::SeqCst), 1);
    let err = v.list_tools().await.unwrap_err();
    assert!(matches!(err, AgentError::Internal { .. }), "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn a_connect_that_fails_with_nobody_waiting_is_not_retried() {
    let a = FakeServer::slow("a", &["t"], Duration::from_secs(2));
    a.fail_next_connects.store(1, Ordering::SeqCst);
    let mut h = start(&[&a], limits()).await;
    let v = h.open(None).await;
    v.release().await;
    let failed = h.warning(WarningCode::McpServerFailed).await;
    assert!(failed.contains("not restarting"), "{failed}");
    tokio::time::advance(Duration::from_secs(3600)).await;
    settle().await;
    assert_eq!(a.connects(), 1);
    assert_eq!(h.server("a").await.phase, "idle");
}

#[tokio::test(start_paused = true)]
async fn without_an_approval_path_requests_are_declined() {
    let a = FakeServer::new("a", &["ask"]);
    a.asks.send_replace(Asks::Elicitation);
    let mut h = start(&[&a], limits()).await;
    let c = ConversationId::new();
    let view = h.open_for(c, None).await;
    h.ready("a").await;
    let out = output(task_call(&view, "a__ask", c, TaskId::new(), CancellationToken::new()).await);
    assert!(out.ends_with("elicited Decline"), "{out}");
}

async fn approval_store() -> ActorRef<ApprovalMsg> {
    let args = ApprovalStoreArgs {
        clock: Clock::new(),
        sweep_interval: Duration::from_secs(3600),
        request_timeout: Duration::from_secs(60),
        events: None,
    };
    Actor::spawn(None, ApprovalStore, args).await.unwrap().0
}

#[tokio::test(start_paused = true)]
async fn a_request_pending_when_the_approval_store_fails_is_asked_of_the_next_one() {
    let a = FakeServer::new("a", &["ask"]);
    a.asks.send_replace(Asks::Elicitation);
    let first = approval_store().await;
    let (slot, live) = crate::directory::TestSlot::new(first.clone());
    let mut h = start_with(&[&a], limits(), Vec::new(), Some(live)).await;
    let c = ConversationId::new();
    let view = h.open_for(c, None).await;
    h.ready("a").await;
    let running = task_call(&view, "a__ask", c, TaskId::new(), CancellationToken::new());
    let before = pending_one(&first).await;
    // The session replaces the failed store in its directory; the pool is told nothing.
    first.cast(ApprovalMsg::InjectPanic).unwrap();
    let second = approval_store().await;
    slot.replace(second.clone());
    let again = pending_one(&second).await;
    assert_ne!(again.approval_id, before.approval_id);
    assert_eq!(again.subject, before.subject);
    respond(
        &second,
        &again,
        ApprovalDecision::ApproveWithContent {
            content: Json(json!({"name": "Ada"})),
        },
    )
    .await;
    assert!(output(running.await).ends_with(r#"elicited Accept({"name":"Ada"})"#));
}

/// A call that ended is forgotten as it ends, not at the next call to its server: it keeps
/// neither its task's span (and so the task's trace) open nor its slot lease.
#[tokio::test(start_paused = true)]
async fn an_ended_call_is_forgotten_as_it_ends() {
    let a = FakeServer::new("a", &["t"]);
    let mut h = start(&[&a], limits()).await;
    let view = h.open(None).await;
    h.ready("a").await;
    assert!(call(&view, "a__t").await.is_ok());
    settle().await;
    assert_eq!(h.snapshot().await.calls_held, 0);
}
