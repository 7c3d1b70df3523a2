//! The McpPool against real MCP servers (installed by scripts/install-mcp-servers).
//!
//!     cargo bench -p troupe-tests --bench mcp_pool
//!
//! - a tool call through the pool (view → limits → connection) against a direct call on the
//!   same connection to the same server process, interleaved;
//! - processes and memory for 1,000 conversations sharing 3 servers.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_trait::async_trait;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use troupe_actors::clock::Clock;
use troupe_actors::mcp_pool::{McpLimits, McpPoolArgs, McpPoolHandle};
use troupe_actors::ports::{
    McpCall, McpClientHandler, McpConnection, McpConnector, McpNotice, McpPort, McpServerConfig,
    McpTransport, ToolCallContext,
};
use troupe_proto::{
    AgentError, ConversationId, EventKind, Json, OpenConversation, TaskId, ToolCall,
};
use troupe_runtime::RmcpConnector;
use troupe_test_support::mcp::{processes_with_env, server_entry};

fn entry(package: &str) -> String {
    server_entry(package).display().to_string()
}

fn server(name: &str, package: &str, args: &[&str], marker: &str) -> McpServerConfig {
    let mut argv = vec![entry(package)];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    McpServerConfig {
        name: name.into(),
        transport: McpTransport::Stdio {
            command: "node".into(),
            args: argv,
            env: [("TROUPE_MCP_MARKER".to_owned(), marker.to_owned())].into(),
            cwd: None,
        },
    }
}

struct NoHandler;

#[async_trait]
impl McpClientHandler for NoHandler {
    async fn list_roots(&self) -> Vec<String> {
        Vec::new()
    }
    async fn elicit(&self, _m: String, _s: Json) -> Result<Json, AgentError> {
        Err(AgentError::invalid("no"))
    }
    async fn sample(&self, _r: Json) -> Result<Json, AgentError> {
        Err(AgentError::invalid("no"))
    }
}

/// Hands the pool an existing connection, so both paths reach the same process. Keeps the
/// pool's notice sender open (a closed channel means a dead connection to the pool).
struct Fixed(
    Arc<dyn McpConnection>,
    std::sync::Mutex<Vec<tokio::sync::mpsc::UnboundedSender<McpNotice>>>,
);

#[async_trait]
impl McpConnector for Fixed {
    async fn connect(
        &self,
        _c: &McpServerConfig,
        _h: Arc<dyn McpClientHandler>,
        notices: tokio::sync::mpsc::UnboundedSender<McpNotice>,
    ) -> Result<Arc<dyn McpConnection>, AgentError> {
        self.1.lock().unwrap().push(notices);
        Ok(self.0.clone())
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn processes_with(marker: &str) -> Vec<u32> {
    processes_with_env("TROUPE_MCP_MARKER", marker)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { tokio::spawn(run()).await.unwrap() });
}

async fn run() {
    println!("| measure | value | note |");
    println!("|---|---:|---|");
    pool_vs_direct().await;
    shared_servers().await;
}

async fn pool_vs_direct() {
    let marker = TaskId::new().to_string();
    let config = server("everything", "server-everything", &["stdio"], &marker);
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let conn = RmcpConnector::new()
        .connect(&config, Arc::new(NoHandler), tx)
        .await
        .unwrap();
    let limits = McpLimits {
        per_conversation_rate: None,
        ..McpLimits::default()
    };
    let (pool, _) = McpPoolHandle::spawn(
        McpPoolArgs {
            servers: vec![config],
            connector: Arc::new(Fixed(conn.clone(), Default::default())),
            events: None,
            limits,
            clock: Clock::new(),
            roots: Vec::new(),
            approvals: None,
            model: None,
        },
        None,
    )
    .await
    .unwrap();
    let conversation = ConversationId::new();
    let view = pool.open_view(conversation, None).await.unwrap();
    while view.list_tools().await.unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let args = Json(serde_json::json!({"message": "bench"}));
    let cancel = CancellationToken::new();
    let call = ToolCall {
        call_id: "c".into(),
        name: "everything__echo".into(),
        arguments: args.clone(),
    };
    let task_id = TaskId::new();
    let direct = || async {
        let t = Instant::now();
        conn.call_tool(McpCall {
            tool: "echo",
            arguments: &args,
            cancel: &cancel,
            progress: None,
            traceparent: None,
            timeout: Duration::from_secs(10),
            span: tracing::Span::none(),
        })
        .await
        .unwrap();
        t.elapsed()
    };
    let pooled = || async {
        let t = Instant::now();
        view.call_tool(
            &call,
            ToolCallContext {
                conversation_id: conversation,
                task_id,
                cancel: &cancel,
                span: &tracing::Span::none(),
                slot: None,
            },
        )
        .await
        .unwrap();
        t.elapsed()
    };
    for _ in 0..200 {
        direct().await;
        pooled().await;
    }
    let n = 2_000;
    let (mut d, mut p) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        d.push(direct().await);
        p.push(pooled().await);
    }
    d.sort();
    p.sort();
    let row = |name: &str, v: Duration, note: &str| println!("| {name} | {v:.1?} | {note} |");
    row(
        "echo, direct rmcp call p50",
        pct(&d, 0.5),
        "2,000 calls, same process, interleaved",
    );
    row("echo, direct rmcp call p99", pct(&d, 0.99), "");
    row(
        "echo, through the pool p50",
        pct(&p, 0.5),
        "view: visibility, limits, connection",
    );
    row("echo, through the pool p99", pct(&p, 0.99), "");
    let ratio = pct(&p, 0.5).as_secs_f64() / pct(&d, 0.5).as_secs_f64();
    println!("| pool / direct (p50) | {ratio:.3} | target <= 1.10 |");
    view.release().await;
    pool.shutdown().await;
    conn.close().await;
}

async fn shared_servers() {
    let marker = TaskId::new().to_string();
    let work = tempfile::tempdir().unwrap();
    let servers = vec![
        server("everything", "server-everything", &["stdio"], &marker),
        server("memory", "server-memory", &[], &marker),
        server(
            "files",
            "server-filesystem",
            &[&work.path().display().to_string()],
            &marker,
        ),
    ];
    let mut config = troupe_actors::SessionConfig {
        data_dir: work.path().join("data"),
        ..troupe_actors::SessionConfig::default()
    };
    config.mcp_servers = servers;
    config.mcp_roots = vec![work.path().display().to_string()];
    let ports = troupe_actors::SessionPorts {
        model: Arc::new(troupe_runtime::ScriptedModel::default()),
        mcp: None,
        mcp_connector: Some(Arc::new(RmcpConnector::new())),
        exec: None,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(troupe_actors::history::LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: None,
        agents: None,
    };
    let before = rss_kib(std::process::id());
    let (session, _) =
        troupe_actors::SessionHandle::start(troupe_proto::SessionId::new(), config, ports)
            .await
            .unwrap();
    let mut events = session.subscribe().await.unwrap();
    for _ in 0..1_000 {
        session.open(OpenConversation::default()).await.unwrap();
    }
    let mut ready = 0;
    tokio::time::timeout(Duration::from_secs(60), async {
        while ready < 3 {
            if let EventKind::McpServerReady { .. } = &events.recv().await.unwrap().event {
                ready += 1;
            }
        }
    })
    .await
    .expect("servers ready");
    let pids = processes_with(&marker);
    let children: u64 = pids.iter().map(|p| rss_kib(*p)).sum();
    let own = rss_kib(std::process::id()).saturating_sub(before);
    println!(
        "| MCP processes for 1,000 conversations × 3 servers | {} | one per server |",
        pids.len()
    );
    println!(
        "| RSS of those processes | {:.1} MiB | node servers |",
        children as f64 / 1024.0
    );
    println!(
        "| troupe RSS for the session + 1,000 conversations | {:.1} MiB | growth of this process |",
        own as f64 / 1024.0
    );
    session.shutdown().await.unwrap();
}
