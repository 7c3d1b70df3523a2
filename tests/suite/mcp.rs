//! The session's McpPool over real MCP servers (S12): conversations share one process per
//! server, call its tools through the turn loop, and leave nothing running when the session
//! ends. The servers come from `scripts/install-mcp-servers`.

use std::sync::Arc;
use std::time::Duration;
use troupe_actors::ports::{McpServerConfig, McpTransport};
use troupe_proto::{EventKind, OpenConversation, TaskStatus};
use troupe_runtime::{RmcpConnector, ScriptedModel, ScriptedReply};
use troupe_test_support::mcp::{processes_with_env, server_entry};

fn processes_with(marker: &str) -> Vec<u32> {
    processes_with_env("TROUPE_MCP_MARKER", marker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_conversations_share_one_server_process() {
    let marker = troupe_proto::TaskId::new().to_string();
    let server = McpServerConfig {
        name: "everything".into(),
        transport: McpTransport::Stdio {
            command: "node".into(),
            args: vec![
                server_entry("server-everything").display().to_string(),
                "stdio".into(),
            ],
            env: [("TROUPE_MCP_MARKER".to_owned(), marker.clone())].into(),
            cwd: None,
        },
    };
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool(
            "everything__echo",
            serde_json::json!({"message": "through the pool"}),
        ),
        ScriptedReply::default(),
    ]));
    let dir = tempfile::tempdir().unwrap();
    let (session, join) = {
        let mut config = troupe_actors::SessionConfig {
            data_dir: dir.path().to_path_buf(),
            ..troupe_actors::SessionConfig::default()
        };
        config.mcp_servers = vec![server];
        let ports = troupe_actors::SessionPorts {
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
        troupe_actors::SessionHandle::start(troupe_proto::SessionId::new(), config, ports)
            .await
            .unwrap()
    };
    let mut events = session.subscribe().await.unwrap();
    let mut conversations = Vec::new();
    for _ in 0..200 {
        conversations.push(session.open(OpenConversation::default()).await.unwrap());
    }
    // The server starts in the background; wait (bounded) until it is ready.
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let EventKind::McpServerReady { .. } = &events.recv().await.unwrap().event {
                break;
            }
        }
    })
    .await
    .expect("the server became ready");
    assert_eq!(
        processes_with(&marker).len(),
        1,
        "one process for 200 conversations"
    );

    // A conversation calls the server's tool through the turn loop.
    let reply = session
        .message(conversations[17], "echo something")
        .await
        .unwrap();
    assert_eq!(reply.status, TaskStatus::Ok);
    assert!(reply.text.contains("through the pool"), "{}", reply.text);
    assert_eq!(processes_with(&marker).len(), 1);

    for c in conversations {
        session.close(c).await.unwrap();
    }
    session.shutdown().await.unwrap();
    let _ = join.await;
    // Nothing left running.
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        while !processes_with(&marker).is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "server processes left: {:?}",
        processes_with(&marker)
    );
}

struct NoHandler;

#[async_trait::async_trait]
impl troupe_actors::ports::McpClientHandler for NoHandler {
    async fn list_roots(&self) -> Vec<String> {
        Vec::new()
    }
    async fn elicit(
        &self,
        _message: String,
        _schema: troupe_proto::Json,
    ) -> Result<troupe_proto::Json, troupe_proto::AgentError> {
        Err(troupe_proto::AgentError::invalid("no"))
    }
    async fn sample(
        &self,
        _request: troupe_proto::Json,
    ) -> Result<troupe_proto::Json, troupe_proto::AgentError> {
        Err(troupe_proto::AgentError::invalid("no"))
    }
}

/// A connect cut short by its caller (the pool's connect timeout drops it mid-handshake)
/// stops the server process it started, instead of leaving it to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_dropped_mid_handshake_stops_its_server() {
    use troupe_actors::ports::McpConnector;
    let marker = troupe_proto::TaskId::new().to_string();
    // A server that never answers the handshake.
    let server = McpServerConfig {
        name: "silent".into(),
        transport: McpTransport::Stdio {
            command: "/bin/sleep".into(),
            args: vec!["600".into()],
            env: [("TROUPE_MCP_MARKER".to_owned(), marker.clone())].into(),
            cwd: None,
        },
    };
    let (notices, _rx) = tokio::sync::mpsc::unbounded_channel();
    let connector = RmcpConnector::new();
    let connect = connector.connect(&server, Arc::new(NoHandler), notices);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), connect)
            .await
            .is_err(),
        "the silent server cannot complete a handshake"
    );
    let t0 = std::time::Instant::now();
    while !processes_with(&marker).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the server outlived its dropped connect: {:?}",
            processes_with(&marker)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An MCP server that answers the handshake and lists one tool, `wait`, whose calls it never
/// answers; it writes every line it receives to `log`.
const SILENT_CALLS: &str = r#"
import json, sys
log = open(sys.argv[1], "a", buffering=1)
for line in sys.stdin:
    log.write(line)
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}},
                  "serverInfo": {"name": "silent", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "wait", "inputSchema": {"type": "object"}}]}
    else:
        continue
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}) + "\n")
    sys.stdout.flush()
"#;

/// A call whose caller stops waiting without cancelling it (its future dropped, as when its
/// conversation fails mid-call) is cancelled at the server with `notifications/cancelled`,
/// instead of running on there unasked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_by_its_caller_is_cancelled_at_the_server() {
    use troupe_actors::ports::{McpCall, McpConnector};
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("silent.py");
    std::fs::write(&script, SILENT_CALLS).unwrap();
    let log = dir.path().join("received.jsonl");
    let server = McpServerConfig {
        name: "silent".into(),
        transport: McpTransport::Stdio {
            command: "/usr/bin/python3".into(),
            args: vec![script.display().to_string(), log.display().to_string()],
            env: Default::default(),
            cwd: None,
        },
    };
    let (notices, _rx) = tokio::sync::mpsc::unbounded_channel();
    let connection = RmcpConnector::new()
        .connect(&server, Arc::new(NoHandler), notices)
        .await
        .unwrap();
    let arguments = troupe_proto::Json(serde_json::json!({}));
    let cancel = tokio_util::sync::CancellationToken::new();
    let call = connection.call_tool(McpCall {
        tool: "wait",
        arguments: &arguments,
        cancel: &cancel,
        progress: None,
        traceparent: None,
        timeout: Duration::from_secs(60),
        span: tracing::Span::none(),
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(500), call)
            .await
            .is_err(),
        "the server never answers"
    );
    let t0 = std::time::Instant::now();
    loop {
        let received = std::fs::read_to_string(&log).unwrap_or_default();
        if received.contains("notifications/cancelled") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no cancel reached the server: {received}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    connection.close().await;
}
