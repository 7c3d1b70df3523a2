//! Shared helpers for troupe's integration tests: a session on a temporary data dir with the
//! scripted model, and small ports for fault injection.
#![forbid(unsafe_code)]
// Test support: a failed set-up step should stop the test loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use troupe_actors::history::LocalSummarizer;
use troupe_actors::ports::{
    CommandRunner, DeltaSink, McpPort, McpView, ModelClient, ModelInfo, ModelRequest,
    ModelResponse, ToolCallContext, ToolFailure,
};
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::{AgentError, ConversationId, SessionId, ToolCall, ToolOutput, ToolSpec};
use troupe_runtime::{ProcessRunner, ScriptedModel, ScriptedReply};

/// A session for one test; the data dir lives as long as this value.
pub struct TestSession {
    pub session: SessionHandle,
    pub model: Arc<ScriptedModel>,
    pub dir: tempfile::TempDir,
    pub join: tokio::task::JoinHandle<()>,
}

impl TestSession {
    /// A session with the scripted model and these replies queued.
    pub async fn start(replies: Vec<ScriptedReply>) -> Self {
        Self::start_with(replies, |_| {}, None).await
    }

    /// Same, with a config tweak and an optional MCP port.
    pub async fn start_with(
        replies: Vec<ScriptedReply>,
        tweak: impl FnOnce(&mut SessionConfig),
        mcp: Option<Arc<dyn McpPort>>,
    ) -> Self {
        Self::start_with_runner(replies, tweak, mcp, Arc::new(process_runner())).await
    }

    /// Same, with a command runner of the test's choosing.
    pub async fn start_with_runner(
        replies: Vec<ScriptedReply>,
        tweak: impl FnOnce(&mut SessionConfig),
        mcp: Option<Arc<dyn McpPort>>,
        exec: Arc<dyn CommandRunner>,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = Arc::new(ScriptedModel::new(replies));
        let mut config = SessionConfig {
            data_dir: dir.path().to_path_buf(),
            ..SessionConfig::default()
        };
        config.conversation.shell_tool = true;
        tweak(&mut config);
        let ports = SessionPorts {
            model: model.clone(),
            mcp,
            mcp_connector: None,
            exec: Some(exec),
            effects: troupe_actors::ports::Effects::Live,
            summarizer: Arc::new(LocalSummarizer::default()),
            tokens: Arc::new(troupe_actors::ports::ApproxTokens),
            rollout_storage: None,
            agents: None,
        };
        let (session, join) = SessionHandle::start(SessionId::new(), config, ports)
            .await
            .expect("session starts");
        Self {
            session,
            model,
            dir,
            join,
        }
    }

    pub async fn root(&self) -> ConversationId {
        self.session.root().await.expect("root")
    }

    /// Every byte under the data dir, for canary checks.
    pub fn disk_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        collect(self.dir.path(), &mut out);
        out
    }

    pub async fn stop(self) {
        self.session.shutdown().await.expect("shutdown");
        let _ = self.join.await;
    }
}

fn collect(path: &std::path::Path, out: &mut Vec<u8>) {
    if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                collect(&p, out);
            } else if let Ok(bytes) = std::fs::read(&p) {
                out.extend_from_slice(&bytes);
            }
        }
    }
}

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// A model that records how many calls run at once, then answers like the scripted model
/// after an optional delay.
pub struct ProbeModel {
    inner: ScriptedModel,
    pub current: AtomicUsize,
    pub max_seen: AtomicUsize,
    pub delay: Duration,
}

impl ProbeModel {
    pub fn new(delay: Duration) -> Self {
        Self {
            inner: ScriptedModel::default(),
            current: AtomicUsize::new(0),
            max_seen: AtomicUsize::new(0),
            delay,
        }
    }
}

#[async_trait]
impl ModelClient for ProbeModel {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn step(
        &self,
        request: ModelRequest<'_>,
        deltas: &mut dyn DeltaSink,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, AgentError> {
        let now = self.current.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_seen.fetch_max(now, Ordering::SeqCst);
        // Counted down on drop too: an aborted runner never reaches the end of this call.
        let _running = Running(&self.current);
        tokio::select! {
            () = tokio::time::sleep(self.delay) => self.inner.step(request, deltas, cancel).await,
            () = cancel.cancelled() => Err(AgentError::cancelled("cancelled")),
        }
    }
}

struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An in-process MCP port with fixed tools, for tests of the tool list before real MCP
/// servers are wired in. Each view answers calls by echoing the arguments.
pub struct FixedTools {
    pub tools: Vec<ToolSpec>,
    pub released: AtomicUsize,
}

#[async_trait]
impl McpPort for FixedTools {
    async fn open_view(
        &self,
        _conversation_id: ConversationId,
        _allowlist: Option<&[String]>,
    ) -> Result<Arc<dyn McpView>, AgentError> {
        Ok(Arc::new(FixedView {
            tools: self.tools.clone(),
        }))
    }
}

struct FixedView {
    tools: Vec<ToolSpec>,
}

#[async_trait]
impl McpView for FixedView {
    async fn list_tools(&self) -> Result<Vec<ToolSpec>, AgentError> {
        Ok(self.tools.clone())
    }

    async fn call_tool(
        &self,
        call: &ToolCall,
        _ctx: ToolCallContext<'_>,
    ) -> Result<ToolOutput, ToolFailure> {
        Ok(ToolOutput {
            call_id: call.call_id.clone(),
            output: call.arguments.0.to_string(),
            is_error: false,
        })
    }

    async fn release(&self) {}
}

/// What one model call was sent.
#[derive(Debug, Clone, PartialEq)]
pub struct SentRequest {
    pub instructions: String,
    pub prompt: Vec<troupe_proto::HistoryItem>,
    pub tools: Vec<String>,
    pub prompt_cache_key: String,
}

/// A scripted model that records every request it answers.
pub struct RecordingModel {
    pub inner: ScriptedModel,
    pub sent: std::sync::Mutex<Vec<SentRequest>>,
}

impl RecordingModel {
    pub fn new(replies: Vec<ScriptedReply>) -> Self {
        Self {
            inner: ScriptedModel::new(replies),
            sent: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub fn sent(&self) -> Vec<SentRequest> {
        self.sent.lock().unwrap().clone()
    }
}

#[async_trait]
impl ModelClient for RecordingModel {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn step(
        &self,
        request: ModelRequest<'_>,
        deltas: &mut dyn DeltaSink,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, AgentError> {
        self.sent.lock().unwrap().push(SentRequest {
            instructions: request.instructions.to_owned(),
            prompt: request.prompt.iter().cloned().collect(),
            tools: request.tools.iter().map(|t| t.name.clone()).collect(),
            prompt_cache_key: request.prompt_cache_key.to_owned(),
        });
        self.inner.step(request, deltas, cancel).await
    }
}

/// Starts a session around any model.
pub async fn start_with_model(
    model: Arc<dyn ModelClient>,
    tweak: impl FnOnce(&mut SessionConfig),
    mcp: Option<Arc<dyn McpPort>>,
) -> (
    SessionHandle,
    tempfile::TempDir,
    tokio::task::JoinHandle<()>,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = SessionConfig {
        data_dir: dir.path().to_path_buf(),
        ..SessionConfig::default()
    };
    tweak(&mut config);
    let ports = SessionPorts {
        model,
        mcp,
        mcp_connector: None,
        exec: Some(Arc::new(process_runner())),
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: None,
        agents: None,
    };
    let (session, join) = SessionHandle::start(SessionId::new(), config, ports)
        .await
        .expect("session starts");
    (session, dir, join)
}

/// The command runner of test sessions: sandboxed commands go through the `troupe` binary
/// built next to this test binary when it is there (`scripts/test` builds it; the shell
/// tests insist on it), and are refused otherwise.
pub fn process_runner() -> ProcessRunner {
    let runner = ProcessRunner::new();
    match troupe_bin_path() {
        Some(bin) => runner.with_launcher(bin),
        None => runner,
    }
}

fn troupe_bin_path() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("troupe");
    bin.exists().then_some(bin)
}

/// The statistics of `conversation`, from its actor.
pub async fn conversation_stats(
    session: &SessionHandle,
    conversation: ConversationId,
) -> troupe_proto::ConversationStats {
    let actor = session
        .conversation_actor(conversation)
        .await
        .unwrap()
        .unwrap();
    ractor::call!(actor, |reply| {
        troupe_actors::conversation::ConversationMsg::Stats { reply }
    })
    .unwrap()
}

/// Fails `conversation`'s actor (an injected fault) and waits, at most 30 s, for the session
/// to have restored it in a new one. Polled, not awaited as an event: the restore reads the
/// rollout on threads paused time does not wait for, so a timeout would fire while it runs.
pub async fn restart_conversation(session: &SessionHandle, conversation: ConversationId) {
    let actor = session
        .conversation_actor(conversation)
        .await
        .unwrap()
        .unwrap();
    actor
        .cast(troupe_actors::conversation::ConversationMsg::InjectPanic)
        .unwrap();
    let t0 = std::time::Instant::now();
    while session
        .conversation_actor(conversation)
        .await
        .unwrap()
        .is_none_or(|a| a.get_id() == actor.get_id())
    {
        assert!(t0.elapsed() < Duration::from_secs(30), "not restarted");
        tokio::task::yield_now().await;
    }
}

/// The `troupe` binary built next to this test binary (`cargo build -p troupe` first; the
/// test command does).
pub fn troupe_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let bin = dir.join("troupe");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p troupe` (scripts/test does)",
        bin.display()
    );
    bin
}

/// Spawns a `troupe serve` command (its stdout piped) and reads the address it prints first:
/// the child and `http://host:port`.
pub fn spawn_serve(command: &mut std::process::Command) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("troupe serve starts");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .expect("troupe serve prints its address");
    let base = line
        .trim()
        .strip_prefix("troupe serve listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    (child, base)
}

/// An MCP port with one tool, `flaky__op`, that fails its first `failures` calls.
pub struct FlakyTools {
    pub failures: usize,
    pub calls: Arc<AtomicUsize>,
}

#[async_trait]
impl McpPort for FlakyTools {
    async fn open_view(
        &self,
        _conversation_id: ConversationId,
        _allowlist: Option<&[String]>,
    ) -> Result<Arc<dyn McpView>, AgentError> {
        Ok(Arc::new(FlakyView {
            failures: self.failures,
            calls: self.calls.clone(),
        }))
    }
}

struct FlakyView {
    failures: usize,
    calls: Arc<AtomicUsize>,
}

#[async_trait]
impl McpView for FlakyView {
    async fn list_tools(&self) -> Result<Vec<ToolSpec>, AgentError> {
        Ok(vec![ToolSpec {
            name: "flaky__op".into(),
            description: "fails, then works".into(),
            parameters: troupe_proto::Json(serde_json::json!({"type": "object"})),
        }])
    }

    async fn call_tool(
        &self,
        call: &ToolCall,
        _ctx: ToolCallContext<'_>,
    ) -> Result<ToolOutput, ToolFailure> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n < self.failures {
            return Err(AgentError::McpError {
                server: "flaky".into(),
                message: format!("failure {}", n + 1),
            }
            .into());
        }
        Ok(ToolOutput {
            call_id: call.call_id.clone(),
            output: "worked".into(),
            is_error: false,
        })
    }

    async fn release(&self) {}
}
