//! The MCP client against the real npm reference servers (child processes over stdio, one over
//! streamable HTTP). The servers come from `scripts/install-mcp-servers`; a missing server is a
//! failure that says so, never a skip. Every test is bounded in time.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_trait::async_trait;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio_util::sync::CancellationToken;
use troupe_actors::ports::{
    McpCall, McpClientHandler, McpConnection, McpConnector, McpNotice, McpServerConfig,
    McpTransport,
};
use troupe_proto::{AgentError, Json, ToolOutput};
use troupe_runtime::RmcpConnector;

/// Bound of a whole test.
const TEST_LIMIT: Duration = Duration::from_secs(40);

async fn bounded<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(TEST_LIMIT, test)
        .await
        .expect("the test did not finish in time");
}

use troupe_test_support::mcp::server_entry;

fn stdio(name: &str, package: &str, args: &[&str], env: &[(&str, &str)]) -> McpServerConfig {
    let mut argv = vec![server_entry(package).display().to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    McpServerConfig {
        name: name.into(),
        transport: McpTransport::Stdio {
            command: "node".into(),
            args: argv,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: None,
        },
    }
}

fn everything_stdio() -> McpServerConfig {
    stdio(
        "everything",
        "server-everything",
        &["stdio"],
        &[("TROUPE_MCP_TEST", "1")],
    )
}

/// Answers the server's requests the way a test wants, and remembers the sampling requests.
#[derive(Default)]
struct TestHandler {
    roots: Vec<String>,
    /// `None` declines.
    elicit_answer: Option<Value>,
    elicited: Mutex<Vec<(String, Value)>>,
    sampled: Mutex<Vec<Value>>,
    refuse_sampling: bool,
}

#[async_trait]
impl McpClientHandler for TestHandler {
    async fn list_roots(&self) -> Vec<String> {
        self.roots.clone()
    }

    async fn elicit(&self, message: String, schema: Json) -> Result<Json, AgentError> {
        self.elicited.lock().unwrap().push((message, schema.0));
        match &self.elicit_answer {
            Some(answer) => Ok(Json(answer.clone())),
            None => Err(AgentError::Cancelled {
                reason: "the user declined".into(),
            }),
        }
    }

    async fn sample(&self, request: Json) -> Result<Json, AgentError> {
        self.sampled.lock().unwrap().push(request.0);
        if self.refuse_sampling {
            return Err(AgentError::invalid("sampling is off for this conversation"));
        }
        Ok(Json(json!({
            "role": "assistant",
            "content": {"type": "text", "text": "sampled by troupe"},
            "model": "test-model",
            "stopReason": "endTurn"
        })))
    }
}

async fn connect(
    config: &McpServerConfig,
    handler: TestHandler,
) -> (Arc<dyn McpConnection>, UnboundedReceiver<McpNotice>) {
    let (tx, rx) = unbounded_channel();
    let connection = RmcpConnector::new()
        .connect(config, Arc::new(handler), tx)
        .await
        .unwrap();
    (connection, rx)
}

async fn call(
    connection: &dyn McpConnection,
    tool: &str,
    arguments: Value,
) -> Result<ToolOutput, AgentError> {
    let cancel = CancellationToken::new();
    let arguments = Json(arguments);
    connection
        .call_tool(McpCall {
            tool,
            arguments: &arguments,
            cancel: &cancel,
            progress: None,
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            timeout: Duration::from_secs(20),
            span: tracing::Span::none(),
        })
        .await
}

/// Waits for a notice matching `pred`, skipping others.
async fn next_notice(
    rx: &mut UnboundedReceiver<McpNotice>,
    within: Duration,
    pred: impl Fn(&McpNotice) -> bool,
) -> McpNotice {
    tokio::time::timeout(within, async {
        loop {
            let notice = rx.recv().await.expect("the notice channel closed");
            if pred(&notice) {
                return notice;
            }
        }
    })
    .await
    .expect("the expected notice did not arrive")
}

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_lists_its_tools_including_those_of_declared_capabilities() {
    bounded(async {
        let (connection, mut notices) = connect(&everything_stdio(), TestHandler::default()).await;
        assert!(connection.process_id().is_some());
        // It registers the capability-dependent tools after `initialized` and says so.
        next_notice(&mut notices, Duration::from_secs(5), |n| {
            *n == McpNotice::ToolsChanged
        })
        .await;
        let tools = connection.list_tools().await.unwrap();
        let names: BTreeSet<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        for expected in [
            "echo",
            "get-env",
            "get-sum",
            "trigger-long-running-operation",
            "simulate-research-query",
            "get-roots-list",
            "trigger-elicitation-request",
            "trigger-sampling-request",
        ] {
            assert!(
                names.contains(expected),
                "{expected} missing from {names:?}"
            );
        }
        let by_name = |n: &str| tools.iter().find(|t| t.name == n).unwrap();
        assert!(by_name("simulate-research-query").requires_task);
        assert!(!by_name("echo").requires_task);
        assert_eq!(by_name("echo").description, "Echoes back the input string");
        assert_eq!(
            by_name("echo").input_schema.0["properties"]["message"]["type"],
            "string"
        );
        connection.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_and_get_sum_answer_with_text() {
    bounded(async {
        let (connection, _notices) = connect(&everything_stdio(), TestHandler::default()).await;
        let echo = call(&*connection, "echo", json!({"message": "hello troupe"}))
            .await
            .unwrap();
        assert_eq!(echo.output, "Echo: hello troupe");
        assert!(!echo.is_error);
        assert_eq!(echo.call_id, "");
        let sum = call(&*connection, "get-sum", json!({"a": 2, "b": 40}))
            .await
            .unwrap();
        assert!(sum.output.contains("42"), "{}", sum.output);
        // A task-only tool called plainly is the server's error, not a transport failure.
        let research = call(
            &*connection,
            "simulate-research-query",
            json!({"topic": "actors"}),
        )
        .await;
        match research {
            Ok(out) => assert!(out.is_error, "{}", out.output),
            Err(AgentError::McpError { .. }) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
        connection.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_sees_only_its_configured_environment() {
    // The test process has these (cargo sets CARGO_*), so their absence below means something.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    bounded(async {
        let (connection, _notices) = connect(&everything_stdio(), TestHandler::default()).await;
        let env = call(&*connection, "get-env", json!({})).await.unwrap();
        let vars: BTreeMap<String, String> = serde_json::from_str(&env.output).unwrap();
        assert_eq!(
            vars,
            BTreeMap::from([("TROUPE_MCP_TEST".to_owned(), "1".to_owned())])
        );
        for leaked in [
            "HOME",
            "PATH",
            "CARGO_PKG_NAME",
            "CARGO_MANIFEST_DIR",
            "USER",
        ] {
            assert!(!vars.contains_key(leaked), "{leaked} leaked into {vars:?}");
        }
        for (key, _) in std::env::vars() {
            assert!(
                key == "TROUPE_MCP_TEST" || !vars.contains_key(&key),
                "{key} of the test process is visible to the server"
            );
        }
        connection.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_call_reports_progress_to_its_sender() {
    bounded(async {
        let (connection, _notices) = connect(&everything_stdio(), TestHandler::default()).await;
        let (progress_tx, mut progress_rx) = unbounded_channel();
        let cancel = CancellationToken::new();
        let arguments = Json(json!({"duration": 2, "steps": 4}));
        let out = connection
            .call_tool(McpCall {
                tool: "trigger-long-running-operation",
                arguments: &arguments,
                cancel: &cancel,
                progress: Some(progress_tx),
                traceparent: None,
                timeout: Duration::from_secs(20),
                span: tracing::Span::none(),
            })
            .await
            .unwrap();
        assert!(out.output.contains("completed"), "{}", out.output);
        let mut seen = Vec::new();
        while let Ok(notice) = progress_rx.try_recv() {
            seen.push(notice);
        }
        assert!(!seen.is_empty(), "no progress arrived");
        for notice in &seen {
            match notice {
                McpNotice::Progress { total, .. } => assert_eq!(*total, Some(4.0)),
                other => panic!("unexpected notice {other:?}"),
            }
        }
        connection.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_call_returns_at_once_and_the_connection_stays_usable() {
    bounded(async {
        let (connection, _notices) = connect(&everything_stdio(), TestHandler::default()).await;
        let (progress_tx, mut progress_rx) = unbounded_channel();
        let cancel = CancellationToken::new();
        let arguments = Json(json!({"duration": 20, "steps": 20}));
        let call = connection.call_tool(McpCall {
            tool: "trigger-long-running-operation",
            arguments: &arguments,
            cancel: &cancel,
            progress: Some(progress_tx),
            traceparent: None,
            timeout: Duration::from_secs(30),
            span: tracing::Span::none(),
        });
        let canceller = async {
            // The first progress proves the server is running the call.
            progress_rx.recv().await.unwrap();
            let at = Instant::now();
            cancel.cancel();
            at
        };
        let (result, cancelled_at) = tokio::join!(call, canceller);
        let took = cancelled_at.elapsed();
        assert!(
            matches!(result, Err(AgentError::Cancelled { .. })),
            "{result:?}"
        );
        assert!(took < Duration::from_millis(200), "cancel took {took:?}");

        let echo = call_echo(&*connection).await;
        assert_eq!(echo, "Echo: still here");
        connection.close().await;
    })
    .await;
}

async fn call_echo(connection: &dyn McpConnection) -> String {
    call(connection, "echo", json!({"message": "still here"}))
        .await
        .unwrap()
        .output
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_bounds_a_call() {
    bounded(async {
        let (connection, _notices) = connect(&everything_stdio(), TestHandler::default()).await;
        let cancel = CancellationToken::new();
        let arguments = Json(json!({"duration": 10, "steps": 2}));
        let started = Instant::now();
        let result = connection
            .call_tool(McpCall {
                tool: "trigger-long-running-operation",
                arguments: &arguments,
                cancel: &cancel,
                progress: None,
                traceparent: None,
                timeout: Duration::from_millis(300),
                span: tracing::Span::none(),
            })
            .await;
        assert!(
            matches!(result, Err(AgentError::Timeout { after_ms: 300, .. })),
            "{result:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(call_echo(&*connection).await, "Echo: still here");
        connection.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_roots_list_shows_the_handlers_roots() {
    bounded(async {
        let handler = TestHandler {
            roots: vec![
                "file:///tmp/troupe-root-a".into(),
                "file:///tmp/troupe-root-b".into(),
            ],
            ..TestHandler::default()
        };
        let (connection, _notices) = connect(&everything_stdio(), handler).await;
        let out = call(&*connection, "get-roots-list", json!({}))
            .await
            .unwrap();
        assert!(out.output.contains("(2 total)"), "{}", out.output);
        assert!(out.output.contains("file:///tmp/troupe-root-a"));
        assert!(out.output.contains("file:///tmp/troupe-root-b"));
        connection.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elicitation_is_answered_by_the_handler() {
    bounded(async {
        let handler = Arc::new(TestHandler {
            elicit_answer: Some(json!({"name": "Ada Lovelace", "check": true, "integer": 7})),
            ..TestHandler::default()
        });
        let (tx, _notices) = unbounded_channel();
        let connection = RmcpConnector::new()
            .connect(&everything_stdio(), handler.clone(), tx)
            .await
            .unwrap();
        let out = call(&*connection, "trigger-elicitation-request", json!({}))
            .await
            .unwrap();
        assert!(out.output.contains("User provided"), "{}", out.output);
        assert!(
            out.output.contains("- Name: Ada Lovelace"),
            "{}",
            out.output
        );
        assert!(
            out.output.contains("- Favorite Integer: 7"),
            "{}",
            out.output
        );
        let elicited = handler.elicited.lock().unwrap().clone();
        assert_eq!(elicited.len(), 1);
        assert!(
            elicited[0].0.contains("Please provide"),
            "{}",
            elicited[0].0
        );
        assert_eq!(elicited[0].1["type"], "object");
        assert!(elicited[0].1["properties"]["name"].is_object());
        connection.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_elicitation_declines() {
    bounded(async {
        let (connection, _notices) = connect(&everything_stdio(), TestHandler::default()).await;
        let out = call(&*connection, "trigger-elicitation-request", json!({}))
            .await
            .unwrap();
        assert!(out.output.contains("declined"), "{}", out.output);
        assert!(
            out.output.contains("\"action\": \"decline\""),
            "{}",
            out.output
        );
        connection.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampling_request_reaches_the_handler() {
    bounded(async {
        let handler = Arc::new(TestHandler::default());
        let (tx, _notices) = unbounded_channel();
        let connection = RmcpConnector::new()
            .connect(&everything_stdio(), handler.clone(), tx)
            .await
            .unwrap();
        let out = call(
            &*connection,
            "trigger-sampling-request",
            json!({"prompt": "name three actors", "maxTokens": 50}),
        )
        .await
        .unwrap();
        assert!(!out.is_error, "{}", out.output);
        assert!(out.output.contains("sampled by troupe"), "{}", out.output);
        let sampled = handler.sampled.lock().unwrap().clone();
        assert_eq!(sampled.len(), 1);
        assert_eq!(sampled[0]["maxTokens"], 50);
        let text = sampled[0]["messages"][0]["content"]["text"]
            .as_str()
            .unwrap();
        assert!(text.contains("name three actors"), "{text}");
        connection.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_sampling_request_fails_the_servers_tool() {
    bounded(async {
        let handler = TestHandler {
            refuse_sampling: true,
            ..TestHandler::default()
        };
        let (connection, _notices) = connect(&everything_stdio(), handler).await;
        let result = call(
            &*connection,
            "trigger-sampling-request",
            json!({"prompt": "anything"}),
        )
        .await;
        // The server turns the JSON-RPC error into a tool error (or passes it on).
        let message = match result {
            Ok(out) => {
                assert!(out.is_error, "{}", out.output);
                out.output
            }
            Err(AgentError::McpError { message, .. }) => message,
            Err(other) => panic!("unexpected {other:?}"),
        };
        assert!(message.contains("sampling is off"), "{message}");
        // The connection is fine.
        assert_eq!(call_echo(&*connection).await, "Echo: still here");
        connection.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_connection_ends_its_server() {
    bounded(async {
        let (connection, _notices) = connect(&everything_stdio(), TestHandler::default()).await;
        let pid = connection.process_id().unwrap();
        drop(connection);
        let deadline = Instant::now() + Duration::from_secs(5);
        while process_exists(pid) {
            assert!(
                Instant::now() < deadline,
                "process {pid} outlived its connection"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_fails_its_calls_at_once_and_announces_the_end() {
    bounded(async {
        let (connection, mut notices) = connect(&everything_stdio(), TestHandler::default()).await;
        let pid = connection.process_id().unwrap();
        let (progress_tx, mut progress_rx) = unbounded_channel();
        let cancel = CancellationToken::new();
        let arguments = Json(json!({"duration": 30, "steps": 30}));
        let call = connection.call_tool(McpCall {
            tool: "trigger-long-running-operation",
            arguments: &arguments,
            cancel: &cancel,
            progress: Some(progress_tx),
            traceparent: None,
            timeout: Duration::from_secs(35),
            span: tracing::Span::none(),
        });
        let killer = async {
            progress_rx.recv().await.unwrap();
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
            Instant::now()
        };
        let (result, killed_at) = tokio::join!(call, killer);
        let took = killed_at.elapsed();
        match &result {
            Err(AgentError::McpError { server, message }) => {
                assert_eq!(server, "everything");
                assert!(message.contains("closed"), "{message}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            took < Duration::from_secs(2),
            "the call failed after {took:?}"
        );
        let closed = next_notice(&mut notices, Duration::from_secs(2), |n| {
            matches!(n, McpNotice::Closed { .. })
        })
        .await;
        let McpNotice::Closed { reason } = closed else {
            unreachable!()
        };
        assert!(
            reason.contains("exited") || reason.contains("closed"),
            "{reason}"
        );
        // Later calls fail without waiting.
        let started = Instant::now();
        let later = call_result(&*connection).await;
        assert!(
            matches!(later, Err(AgentError::McpError { .. })),
            "{later:?}"
        );
        assert!(started.elapsed() < Duration::from_millis(100));
        assert!(matches!(
            connection.list_tools().await,
            Err(AgentError::McpError { .. })
        ));
        // Reaped by the connection: no zombie left.
        connection.close().await;
        assert!(!process_exists(pid), "process {pid} is still there");
        // Exactly one Closed.
        while let Ok(notice) = notices.try_recv() {
            assert!(
                !matches!(notice, McpNotice::Closed { .. }),
                "a second Closed"
            );
        }
    })
    .await;
}

async fn call_result(connection: &dyn McpConnection) -> Result<ToolOutput, AgentError> {
    call(connection, "echo", json!({"message": "x"})).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_kills_and_reaps_the_server() {
    bounded(async {
        let (connection, mut notices) = connect(&everything_stdio(), TestHandler::default()).await;
        let pid = connection.process_id().unwrap();
        assert!(process_exists(pid));
        connection.close().await;
        assert!(!process_exists(pid), "process {pid} is still there");
        // Idempotent.
        connection.close().await;
        let closed = next_notice(&mut notices, Duration::from_secs(1), |n| {
            matches!(n, McpNotice::Closed { .. })
        })
        .await;
        assert!(matches!(closed, McpNotice::Closed { .. }));
        assert!(matches!(
            call_result(&*connection).await,
            Err(AgentError::McpError { .. })
        ));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_start_is_an_mcp_error() {
    bounded(async {
        let missing = McpServerConfig {
            name: "missing".into(),
            transport: McpTransport::Stdio {
                command: "troupe-no-such-mcp-server".into(),
                args: vec![],
                env: BTreeMap::new(),
                cwd: None,
            },
        };
        let (tx, _rx) = unbounded_channel();
        let result = RmcpConnector::new()
            .connect(&missing, Arc::new(TestHandler::default()), tx.clone())
            .await;
        assert!(
            matches!(&result, Err(AgentError::McpError { server, message }) if server == "missing" && message.contains("not found")),
            "{:?}",
            result.err()
        );

        let exits = McpServerConfig {
            name: "exits".into(),
            transport: McpTransport::Stdio {
                command: "node".into(),
                args: vec!["-e".into(), "process.exit(3)".into()],
                env: BTreeMap::new(),
                cwd: None,
            },
        };
        let started = Instant::now();
        let result = RmcpConnector::new()
            .connect(&exits, Arc::new(TestHandler::default()), tx)
            .await;
        assert!(
            matches!(&result, Err(AgentError::McpError { .. })),
            "{:?}",
            result.err()
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    })
    .await;
}

/// `[mcp.limits] connect_timeout` bounds the handshake of the service's connector, whichever
/// way it is set (its 30 s default held it whatever the configuration said).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_connect_timeout_bounds_the_handshake() {
    bounded(async {
        let mut config = troupe_runtime::config::TroupeConfig::default();
        config.mcp.limits.connect_timeout = Duration::from_millis(300);
        let silent = McpServerConfig {
            name: "silent".into(),
            transport: McpTransport::Stdio {
                command: "sleep".into(),
                args: vec!["30".into()],
                env: BTreeMap::new(),
                cwd: None,
            },
        };
        config.mcp.servers = vec![silent.clone()];
        let ports = troupe_runtime::assembly::session_ports(
            &config,
            Arc::new(troupe_runtime::ScriptedModel::new(Vec::new())),
            Arc::new(troupe_actors::ports::ApproxTokens),
        );
        let connector = ports.mcp_connector.expect("servers are configured");
        let (tx, _rx) = unbounded_channel();
        let started = Instant::now();
        let result = connector
            .connect(&silent, Arc::new(TestHandler::default()), tx)
            .await;
        let error = result.err().expect("a server that never answers");
        assert!(error.to_string().contains("300 ms"), "{error}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_server_lists_its_tools() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let memory = dir.path().join("memory.jsonl");
        let config = stdio(
            "memory",
            "server-memory",
            &[],
            &[("MEMORY_FILE_PATH", memory.to_str().unwrap())],
        );
        let (connection, _notices) = connect(&config, TestHandler::default()).await;
        let tools = connection.list_tools().await.unwrap();
        let names: BTreeSet<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(tools.len(), 9, "{names:?}");
        assert!(names.contains("create_entities") && names.contains("read_graph"));
        let graph = call(&*connection, "read_graph", json!({})).await.unwrap();
        assert!(!graph.is_error, "{}", graph.output);
        connection.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filesystem_server_refuses_a_path_outside_its_directory() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().canonicalize().unwrap();
        std::fs::write(allowed.join("inside.txt"), "inside text").unwrap();
        let config = stdio("fs", "server-filesystem", &[allowed.to_str().unwrap()], &[]);
        // Declared roots replace the server's allowlist: give it the same directory.
        let handler = TestHandler {
            roots: vec![format!("file://{}", allowed.display())],
            ..TestHandler::default()
        };
        let (connection, _notices) = connect(&config, handler).await;
        let tools = connection.list_tools().await.unwrap();
        let names: BTreeSet<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(tools.len(), 14, "{names:?}");
        assert!(names.contains("read_text_file"), "{names:?}");

        let inside = call(
            &*connection,
            "read_text_file",
            json!({"path": allowed.join("inside.txt")}),
        )
        .await
        .unwrap();
        assert!(!inside.is_error, "{}", inside.output);
        assert_eq!(inside.output, "inside text");

        let outside_dir = tempfile::tempdir().unwrap();
        let outside = outside_dir.path().join("secret.txt");
        std::fs::write(&outside, "secret").unwrap();
        let denied = call(&*connection, "read_text_file", json!({"path": outside}))
            .await
            .unwrap();
        assert!(denied.is_error, "{}", denied.output);
        assert!(denied.output.contains("Access denied"), "{}", denied.output);
        connection.close().await;
    })
    .await;
}

/// server-everything in streamableHttp mode on a free port, killed on drop.
struct HttpServer {
    child: tokio::process::Child,
    port: u16,
}

impl HttpServer {
    async fn start() -> Self {
        let entry = server_entry("server-everything");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = tokio::process::Command::new("node")
            .arg(entry)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "the HTTP server did not listen");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { child, port }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_streamable_http_lists_and_calls() {
    bounded(async {
        let mut server = HttpServer::start().await;
        let config = McpServerConfig {
            name: "everything-http".into(),
            transport: McpTransport::StreamableHttp {
                url: format!("http://127.0.0.1:{}/mcp", server.port),
                headers: BTreeMap::from([("x-troupe-test".to_owned(), "1".to_owned())]),
                oauth: None,
            },
        };
        let (connection, _notices) = connect(&config, TestHandler::default()).await;
        assert_eq!(connection.process_id(), None);
        let tools = connection.list_tools().await.unwrap();
        let echo = tools.iter().find(|t| t.name == "echo").expect("echo");
        assert!(!echo.requires_task);
        let research = tools
            .iter()
            .find(|t| t.name == "simulate-research-query")
            .expect("simulate-research-query");
        assert!(research.requires_task);
        let out = call(&*connection, "echo", json!({"message": "over http"}))
            .await
            .unwrap();
        assert_eq!(out.output, "Echo: over http");
        connection.close().await;
        server.child.kill().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_stderr_becomes_log_events() {
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    let logs = Buffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    // Global: the child's stderr is read on another task (nextest: one test per process).
    tracing::subscriber::set_global_default(subscriber).unwrap();
    bounded(async {
        let (connection, _notices) = connect(&everything_stdio(), TestHandler::default()).await;
        // The handshake worked, so the banner on stderr did not reach the protocol.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
            if let Some(line) = text
                .lines()
                .find(|l| l.contains("Starting default (STDIO) server"))
            {
                assert!(line.contains("mcp_server=everything"), "{line}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no stderr line was logged:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        connection.close().await;
    })
    .await;
}

/// A minimal stdio server in node: pages its tool list and echoes a call's `_meta`.
const PAGING_SERVER: &str = r#"
const rl = require('readline').createInterface({ input: process.stdin });
const send = (m) => process.stdout.write(JSON.stringify(m) + '\n');
const schema = { type: 'object', properties: {} };
rl.on('line', (line) => {
  const m = JSON.parse(line);
  if (m.id === undefined) return;
  if (m.method === 'initialize') {
    send({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: '2025-11-25',
      capabilities: { tools: {} }, serverInfo: { name: 'paging', version: '1' } } });
  } else if (m.method === 'tools/list') {
    const cursor = m.params && m.params.cursor;
    const result = !cursor
      ? { tools: [{ name: 'first', inputSchema: schema }], nextCursor: 'page-2' }
      : cursor === 'page-2'
        ? { tools: [{ name: 'second', inputSchema: schema, execution: { taskSupport: 'required' } }], nextCursor: 'page-3' }
        : { tools: [{ name: 'meta', description: 'echoes _meta', inputSchema: schema }] };
    send({ jsonrpc: '2.0', id: m.id, result });
  } else if (m.method === 'tools/call') {
    send({ jsonrpc: '2.0', id: m.id, result: {
      content: [{ type: 'text', text: JSON.stringify(m.params._meta || {}) }] } });
  } else {
    send({ jsonrpc: '2.0', id: m.id, error: { code: -32601, message: 'no ' + m.method } });
  }
});
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_is_listed_and_the_traceparent_is_sent() {
    bounded(async {
        let config = McpServerConfig {
            name: "paging".into(),
            transport: McpTransport::Stdio {
                command: "node".into(),
                args: vec!["-e".into(), PAGING_SERVER.into()],
                env: BTreeMap::new(),
                cwd: None,
            },
        };
        let (connection, _notices) = connect(&config, TestHandler::default()).await;
        let tools = connection.list_tools().await.unwrap();
        let summary: Vec<(&str, bool)> = tools
            .iter()
            .map(|t| (t.name.as_str(), t.requires_task))
            .collect();
        assert_eq!(
            summary,
            vec![("first", false), ("second", true), ("meta", false)]
        );
        assert_eq!(tools[2].description, "echoes _meta");

        let out = call(&*connection, "meta", json!({})).await.unwrap();
        let meta: Value = serde_json::from_str(&out.output).unwrap();
        assert_eq!(
            meta["traceparent"],
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
        // A progress token goes with every call, so a sender can always be routed.
        assert!(meta.get("progressToken").is_some(), "{meta}");
        connection.close().await;
    })
    .await;
}

// ----- OAuth: a real MCP server behind a local authorization server -----

mod oauth {
    use super::*;
    use troupe_actors::ports::{McpOAuth, McpOAuthGrant};
    use troupe_runtime::mcp::oauth::{self, EnvLookup, TokenStore};
    use troupe_test_support::mcp::EverythingHttp;
    use troupe_test_support::oauth::{OAuthOptions, ProtectedMcp};

    fn remote(url: &str, oauth: McpOAuth) -> McpServerConfig {
        McpServerConfig {
            name: "remote".into(),
            transport: McpTransport::StreamableHttp {
                url: url.to_owned(),
                headers: BTreeMap::new(),
                oauth: Some(oauth),
            },
        }
    }

    fn no_env() -> EnvLookup {
        Arc::new(|_| None)
    }

    fn env(pairs: &[(&str, &str)]) -> EnvLookup {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Arc::new(move |k| map.get(k).cloned())
    }

    async fn open(
        connector: &RmcpConnector,
        config: &McpServerConfig,
    ) -> Result<(Arc<dyn McpConnection>, UnboundedReceiver<McpNotice>), AgentError> {
        let (tx, rx) = unbounded_channel();
        let connection = connector
            .connect(config, Arc::new(TestHandler::default()), tx)
            .await?;
        Ok((connection, rx))
    }

    /// Plays the user's browser: opens the authorization URL and follows its redirect to the
    /// loopback listener of the login. Returns the page the browser lands on.
    async fn browse(url: &str) -> (u16, String) {
        let response = reqwest::Client::new().get(url).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// Runs `oauth::login` for `config`, playing the browser with `browse`.
    async fn login(
        config: &McpServerConfig,
        store: TokenStore,
    ) -> (
        Result<oauth::LoginOutcome, oauth::OAuthError>,
        Option<(u16, String)>,
    ) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let config = config.clone();
        let login = tokio::spawn(async move {
            let mut show = move |url: &str| {
                let _ = tx.send(url.to_owned());
            };
            oauth::login(
                &config,
                store,
                &no_env(),
                Duration::from_secs(20),
                &mut show,
            )
            .await
        });
        let page = match rx.recv().await {
            Some(url) => Some(browse(&url).await),
            None => None,
        };
        (login.await.unwrap(), page)
    }

    /// Span names and counters of this process, seen by a global subscriber and recorder
    /// (nextest runs each test in a process of its own).
    struct Seen {
        spans: Arc<Mutex<Vec<String>>>,
        counters: metrics_util::debugging::Snapshotter,
    }

    struct SpanNames(Arc<Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SpanNames {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _id: &tracing::span::Id,
            _ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            self.0
                .lock()
                .unwrap()
                .push(attrs.metadata().name().to_owned());
        }
    }

    fn seen() -> &'static Seen {
        static SEEN: std::sync::OnceLock<Seen> = std::sync::OnceLock::new();
        SEEN.get_or_init(|| {
            use tracing_subscriber::layer::SubscriberExt;
            let spans = Arc::new(Mutex::new(Vec::new()));
            let subscriber = tracing_subscriber::registry().with(SpanNames(spans.clone()));
            tracing::subscriber::set_global_default(subscriber).unwrap();
            let recorder = metrics_util::debugging::DebuggingRecorder::new();
            let counters = recorder.snapshotter();
            recorder.install().unwrap();
            troupe_runtime::describe_metrics();
            Seen { spans, counters }
        })
    }

    /// Counter values by name and labels (`name{k=v,...}`, labels sorted).
    fn counters(seen: &Seen) -> BTreeMap<String, u64> {
        seen.counters
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| {
                let metrics_util::debugging::DebugValue::Counter(v) = value else {
                    return None;
                };
                let mut labels: Vec<String> = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                labels.sort();
                Some((format!("{}{{{}}}", key.key().name(), labels.join(",")), v))
            })
            .collect()
    }

    fn file_of(dir: &Path) -> TokenStore {
        TokenStore::file(&oauth::token_dir(dir), "remote")
    }

    fn stored_access_token(store: &TokenStore) -> String {
        store
            .read()
            .unwrap()
            .unwrap()
            .snapshot()
            .unwrap()
            .access_token
    }

    /// Moves the stored token's receipt into the past, as if troupe had been stopped for
    /// `age`.
    fn age_token(store: &TokenStore, age: Duration) {
        let mut login = store.read().unwrap().unwrap();
        let credentials = login.credentials.as_mut().unwrap();
        credentials.token_received_at =
            Some(credentials.token_received_at.unwrap() - age.as_secs());
        store.write(&login).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn authorization_code_with_pkce_then_calls_restarts_and_refreshes() {
        let seen = seen();
        bounded(async {
            let everything = EverythingHttp::start().await;
            let protected = ProtectedMcp::start(&everything.url(), OAuthOptions::default()).await;
            let dir = tempfile::tempdir().unwrap();
            let config = remote(&protected.url, McpOAuth::default());
            let connector = RmcpConnector::new().with_token_dir(oauth::token_dir(dir.path()));

            // Nobody logged in: a clear error at once, and not a request to the server.
            let started = Instant::now();
            let error = open(&connector, &config).await.err().unwrap().to_string();
            assert!(error.contains("run `troupe mcp login remote`"), "{error}");
            assert!(started.elapsed() < Duration::from_secs(2));
            assert_eq!(
                protected.stats().unauthorized + protected.stats().proxied,
                0
            );

            // The login: discovery from the 401, registration, PKCE, the loopback redirect.
            let store = file_of(dir.path());
            let (outcome, page) = login(&config, store.clone()).await;
            let outcome = outcome.unwrap();
            let (status, page) = page.unwrap();
            assert_eq!(status, 200, "{page}");
            assert!(page.contains("troupe is logged in"), "{page}");
            assert!(outcome.registered);
            assert!(outcome.has_refresh_token);
            assert_eq!(outcome.scopes, ["mcp:tools"]);
            let stats = protected.stats();
            assert_eq!(
                (
                    stats.registrations,
                    stats.authorizations,
                    stats.code_exchanges
                ),
                (1, 1, 1)
            );
            // RFC 8707: every request named the MCP server as its resource.
            assert!(
                stats.resources.iter().all(|r| r == &protected.url),
                "{:?}",
                stats.resources
            );
            let path = outcome.path.unwrap();
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );

            // Connected with the stored token: the real server's tools, through the proxy.
            let (connection, _notices) = open(&connector, &config).await.unwrap();
            let tools = connection.list_tools().await.unwrap();
            assert!(tools.iter().any(|t| t.name == "echo"));
            let out = call(&*connection, "echo", json!({"message": "with a token"}))
                .await
                .unwrap();
            assert_eq!(out.output, "Echo: with a token");
            let token = stored_access_token(&store);
            assert!(protected.stats().tokens_seen.iter().all(|t| t == &token));
            connection.close().await;

            // A restart (a new connector on the same directory) reuses the login.
            let connector = RmcpConnector::new().with_token_dir(oauth::token_dir(dir.path()));
            let (connection, mut notices) = open(&connector, &config).await.unwrap();
            call(&*connection, "echo", json!({"message": "again"}))
                .await
                .unwrap();
            let stats = protected.stats();
            assert_eq!((stats.code_exchanges, stats.refreshes), (1, 0));

            // The server stops accepting the token mid-session: one refresh, one retry.
            protected.revoke_access_tokens();
            let unauthorized = protected.stats().unauthorized;
            let out = call(&*connection, "echo", json!({"message": "after revocation"}))
                .await
                .unwrap();
            assert_eq!(out.output, "Echo: after revocation");
            let stats = protected.stats();
            assert_eq!(stats.refreshes, 1);
            assert_eq!(stats.unauthorized, unauthorized + 1);
            let refreshed = stored_access_token(&store);
            assert_ne!(refreshed, token);

            // A token about to expire is refreshed before it is sent (no 401 on the way).
            age_token(&store, Duration::from_secs(3590));
            let out = call(&*connection, "echo", json!({"message": "before expiry"}))
                .await
                .unwrap();
            assert_eq!(out.output, "Echo: before expiry");
            let stats = protected.stats();
            assert_eq!(stats.refreshes, 2);
            assert_eq!(stats.unauthorized, unauthorized + 1);
            assert!(!stats.tokens_seen[stats.tokens_seen.len() - 1].eq(&refreshed));

            // The refresh token is revoked too: the call fails naming the command, and the
            // connection ends with that reason.
            protected.revoke_access_tokens();
            protected.revoke_refresh_tokens();
            let error = call(&*connection, "echo", json!({"message": "x"}))
                .await
                .unwrap_err()
                .to_string();
            assert!(error.contains("run `troupe mcp login remote`"), "{error}");
            let closed = next_notice(&mut notices, Duration::from_secs(10), |n| {
                matches!(n, McpNotice::Closed { .. })
            })
            .await;
            let McpNotice::Closed { reason } = closed else {
                unreachable!()
            };
            assert!(reason.contains("troupe mcp login remote"), "{reason}");
            // Refused at least once: on a loaded machine a second attempt can come before the
            // connection has ended, and is refused the same way.
            assert!(protected.stats().refused_refreshes >= 1);
        })
        .await;

        // Told in spans and counters.
        let spans = seen.spans.lock().unwrap().clone();
        for name in ["mcp_oauth_login", "mcp_oauth_renew"] {
            assert!(spans.iter().any(|s| s == name), "no {name} span: {spans:?}");
        }
        let counters = counters(seen);
        let renewals = |trigger: &str, outcome: &str| {
            counters
                .get(&format!(
                    "troupe_mcp_client_oauth_renewals_total{{grant=authorization_code,outcome={outcome},trigger={trigger}}}"
                ))
                .copied()
        };
        assert_eq!(renewals("rejected", "ok"), Some(1), "{counters:?}");
        assert_eq!(renewals("expiring", "ok"), Some(1), "{counters:?}");
        assert!(
            renewals("rejected", "login_required") >= Some(1),
            "{counters:?}"
        );
        assert!(
            counters
                .get("troupe_mcp_client_oauth_failures_total{reason=login_required}")
                .is_some_and(|n| *n >= 2),
            "{counters:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_sharing_a_login_renew_it_without_spending_a_refresh_token_twice() {
        bounded(async {
            let everything = EverythingHttp::start().await;
            let protected = ProtectedMcp::start(&everything.url(), OAuthOptions::default()).await;
            let dir = tempfile::tempdir().unwrap();
            let config = remote(&protected.url, McpOAuth::default());
            let (outcome, _) = login(&config, file_of(dir.path())).await;
            outcome.unwrap();
            // Two sessions (two connectors) on one data directory.
            let mut connections = Vec::new();
            for _ in 0..2 {
                let connector = RmcpConnector::new().with_token_dir(oauth::token_dir(dir.path()));
                connections.push(open(&connector, &config).await.unwrap().0);
            }
            for round in 0..3 {
                protected.revoke_access_tokens();
                let calls =
                    connections.iter().map(|c| {
                        let c = c.clone();
                        async move {
                            call(&*c, "echo", json!({"message": format!("round {round}")})).await
                        }
                    });
                for result in futures::future::join_all(calls).await {
                    assert_eq!(result.unwrap().output, format!("Echo: round {round}"));
                }
            }
            // Rotated refresh tokens, never one presented twice.
            let stats = protected.stats();
            assert_eq!(stats.refused_refreshes, 0, "{stats:?}");
            assert!(stats.refreshes >= 3, "{stats:?}");
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_login_keeps_to_its_url_and_reports_a_refusal() {
        bounded(async {
            let everything = EverythingHttp::start().await;
            let protected = ProtectedMcp::start(&everything.url(), OAuthOptions::default()).await;
            let dir = tempfile::tempdir().unwrap();
            let config = remote(&protected.url, McpOAuth::default());
            let store = file_of(dir.path());

            // The user refuses: the login fails with the server's answer, nothing is stored.
            protected.deny_next_authorization();
            let (outcome, page) = login(&config, store.clone()).await;
            let error = outcome.unwrap_err().to_string();
            assert!(error.contains("access_denied"), "{error}");
            assert_eq!(page.unwrap().0, 400);
            assert!(store.read().unwrap().is_none());

            // A login for one URL is not used for another.
            let (outcome, _) = login(&config, store.clone()).await;
            outcome.unwrap();
            let elsewhere = remote(
                &protected.url.replace("/mcp", "/other/mcp"),
                McpOAuth::default(),
            );
            let connector = RmcpConnector::new().with_token_dir(oauth::token_dir(dir.path()));
            let error = open(&connector, &elsewhere)
                .await
                .err()
                .unwrap()
                .to_string();
            assert!(error.contains("needs a login"), "{error}");
            assert!(
                !protected
                    .stats()
                    .tokens_seen
                    .contains(&stored_access_token(&store)),
                "no token was sent anywhere"
            );

            // No refresh token and an expired access token: a login is needed again.
            let everything2 = EverythingHttp::start().await;
            let no_refresh = ProtectedMcp::start(
                &everything2.url(),
                OAuthOptions {
                    refresh_tokens: false,
                    ..OAuthOptions::default()
                },
            )
            .await;
            let config = remote(&no_refresh.url, McpOAuth::default());
            let (outcome, _) = login(&config, store.clone()).await;
            assert!(!outcome.unwrap().has_refresh_token);
            age_token(&store, Duration::from_secs(7200));
            let error = open(&connector, &config).await.err().unwrap().to_string();
            assert!(error.contains("run `troupe mcp login remote`"), "{error}");
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn client_credentials_without_a_person() {
        bounded(async {
            let everything = EverythingHttp::start().await;
            let protected = ProtectedMcp::start(
                &everything.url(),
                OAuthOptions {
                    clients: vec![("svc".into(), Some("svc-secret".into()))],
                    ..OAuthOptions::default()
                },
            )
            .await;
            let dir = tempfile::tempdir().unwrap();
            let config = remote(
                &protected.url,
                McpOAuth {
                    grant: McpOAuthGrant::ClientCredentials,
                    client_id: Some("svc".into()),
                    client_secret_env: Some("SVC_SECRET".into()),
                    ..McpOAuth::default()
                },
            );
            let connector = RmcpConnector::new()
                .with_token_dir(oauth::token_dir(dir.path()))
                .with_env(env(&[("SVC_SECRET", "svc-secret")]));
            let (connection, _notices) = open(&connector, &config).await.unwrap();
            let out = call(&*connection, "echo", json!({"message": "headless"}))
                .await
                .unwrap();
            assert_eq!(out.output, "Echo: headless");
            assert_eq!(protected.stats().client_credentials, 1);
            assert!(
                protected
                    .stats()
                    .resources
                    .iter()
                    .all(|r| r == &protected.url)
            );

            // A refused token: the grant is asked again, the call goes through.
            protected.revoke_access_tokens();
            call(&*connection, "echo", json!({"message": "renewed"}))
                .await
                .unwrap();
            assert_eq!(protected.stats().client_credentials, 2);
            // An expiring one too, before it is sent.
            age_token(&file_of(dir.path()), Duration::from_secs(3590));
            call(&*connection, "echo", json!({"message": "renewed again"}))
                .await
                .unwrap();
            assert_eq!(protected.stats().client_credentials, 3);
            connection.close().await;

            // The wrong secret: refused, said so.
            let _ = file_of(dir.path()).remove();
            let wrong = RmcpConnector::new()
                .with_token_dir(oauth::token_dir(dir.path()))
                .with_env(env(&[("SVC_SECRET", "wrong")]));
            let error = open(&wrong, &config).await.err().unwrap().to_string();
            assert!(
                error.contains("refused troupe's client credentials"),
                "{error}"
            );
            // A missing variable: named.
            let unset = RmcpConnector::new().with_env(no_env());
            let error = open(&unset, &config).await.err().unwrap().to_string();
            assert!(error.contains("`SVC_SECRET` is not set"), "{error}");
        })
        .await;
    }
}
