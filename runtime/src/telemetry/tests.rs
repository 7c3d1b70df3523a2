//! The span tree of real tasks (scripted model, a session's own McpPool over an in-process
//! connection, the approval path), read back from the SDK's in-memory exporter through the
//! same OpenTelemetry layer the binary installs.

use super::otel_layer;
use crate::ScriptedModel;
use crate::scripted::{ScriptedCall, ScriptedReply};
use async_trait::async_trait;
use opentelemetry::trace::{SpanId, SpanKind, Status, TraceId};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
use troupe_actors::ports::{
    CommandRunner, ExecOutput, ExecRequest, McpCall, McpClientHandler, McpConnection, McpConnector,
    McpNotice, McpServerConfig, McpTool, McpTransport,
};
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::{
    AgentError, ApprovalDecision, EventEnvelope, EventKind, Json, SessionId, TaskStatus, ToolOutput,
};

/// Spans go to an in-memory exporter, through troupe's OpenTelemetry layer, for this thread
/// (a current-thread runtime runs every actor on it).
struct Traced {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
    _default: tracing::subscriber::DefaultGuard,
}

impl Traced {
    fn new() -> Self {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry().with(otel_layer(&provider));
        let default = tracing::subscriber::set_default(subscriber);
        Self {
            exporter,
            provider,
            _default: default,
        }
    }

    fn spans(&self) -> Vec<SpanData> {
        let _ = self.provider.force_flush();
        self.exporter.get_finished_spans().unwrap()
    }
}

fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one `{name}` in {:#?}", names(spans));
    found[0]
}

fn names(spans: &[SpanData]) -> Vec<String> {
    spans.iter().map(|s| s.name.to_string()).collect()
}

/// An MCP server in process: one `echo` tool; remembers the `traceparent` of each call.
#[derive(Default)]
struct EchoServer {
    traceparents: Arc<Mutex<Vec<Option<String>>>>,
}

#[async_trait]
impl McpConnector for EchoServer {
    async fn connect(
        &self,
        _config: &McpServerConfig,
        _handler: Arc<dyn McpClientHandler>,
        notices: tokio::sync::mpsc::UnboundedSender<McpNotice>,
    ) -> Result<Arc<dyn McpConnection>, AgentError> {
        Ok(Arc::new(EchoConnection {
            traceparents: self.traceparents.clone(),
            _notices: notices,
        }))
    }
}

struct EchoConnection {
    traceparents: Arc<Mutex<Vec<Option<String>>>>,
    /// Held while the connection lives: the pool reads its end as the connection closing.
    _notices: tokio::sync::mpsc::UnboundedSender<McpNotice>,
}

#[async_trait]
impl McpConnection for EchoConnection {
    async fn list_tools(&self) -> Result<Vec<McpTool>, AgentError> {
        Ok(vec![McpTool {
            name: "echo".into(),
            description: "Echoes".into(),
            input_schema: Json(serde_json::json!({"type": "object"})),
            requires_task: false,
        }])
    }

    async fn call_tool(&self, call: McpCall<'_>) -> Result<ToolOutput, AgentError> {
        self.traceparents.lock().unwrap().push(call.traceparent);
        call.span.record("jsonrpc.request.id", "7");
        Ok(ToolOutput {
            call_id: String::new(),
            output: format!("Echo: {}", call.arguments.0["message"]),
            is_error: false,
        })
    }

    fn process_id(&self) -> Option<u32> {
        None
    }

    async fn close(&self) {}
}

/// Runs every command at once, successfully.
struct Instant;

#[async_trait]
impl CommandRunner for Instant {
    async fn run(
        &self,
        _request: ExecRequest,
        _cancel: &CancellationToken,
    ) -> Result<ExecOutput, AgentError> {
        Ok(ExecOutput {
            exit_code: Some(0),
            stdout: "done\n".into(),
            ..ExecOutput::default()
        })
    }
}

struct Run {
    session: SessionHandle,
    join: tokio::task::JoinHandle<()>,
    traceparents: Arc<Mutex<Vec<Option<String>>>>,
    events: tokio::sync::broadcast::Receiver<Arc<EventEnvelope>>,
    _dir: tempfile::TempDir,
}

impl Run {
    /// A session with the scripted model, an `srv` MCP server and the shell, ready to call
    /// `srv__echo`.
    async fn start(replies: Vec<ScriptedReply>, record_content: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = SessionConfig {
            data_dir: dir.path().to_path_buf(),
            ..SessionConfig::default()
        };
        config.conversation.shell_tool = true;
        config.conversation.record_content = record_content;
        config.root.include_plan_tool = true;
        config.mcp_servers = vec![McpServerConfig {
            name: "srv".into(),
            transport: McpTransport::Stdio {
                command: "unused".into(),
                args: Vec::new(),
                env: Default::default(),
                cwd: None,
            },
        }];
        let server = EchoServer::default();
        let traceparents = server.traceparents.clone();
        let ports = SessionPorts {
            model: Arc::new(ScriptedModel::new(replies)),
            mcp: None,
            mcp_connector: Some(Arc::new(server)),
            exec: Some(Arc::new(Instant)),
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
        session.root().await.unwrap();
        // The root conversation's view started the server; its tools must be listed before
        // the model may call one.
        let pool = session.mcp_pool().await.unwrap().unwrap();
        tokio::time::timeout(Duration::from_secs(10), async {
            while pool.snapshot().await.unwrap().servers[0].phase != "ready" {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the server is ready");
        Self {
            session,
            join,
            traceparents,
            events,
            _dir: dir,
        }
    }

    async fn stop(self) {
        self.session.shutdown().await.unwrap();
        let _ = self.join.await;
    }
}

fn echo_then_plan() -> Vec<ScriptedReply> {
    vec![
        ScriptedReply {
            tool_calls: vec![
                ScriptedCall {
                    name: "srv__echo".into(),
                    arguments: serde_json::json!({"message": "secret words"}),
                },
                ScriptedCall {
                    name: "update_plan".into(),
                    arguments: serde_json::json!({"plan": []}),
                },
            ],
            ..ScriptedReply::default()
        },
        ScriptedReply::text("all done"),
    ]
}

#[tokio::test]
async fn a_task_is_one_tree_from_invoke_agent_to_the_mcp_call() {
    let traced = Traced::new();
    let mut run = Run::start(echo_then_plan(), false).await;
    let root = run.session.root().await.unwrap();
    // The caller's own span: the task links to it but does not join its trace.
    let caller = tracing::info_span!("caller");
    let reply = run
        .session
        .message(root, "please echo")
        .instrument(caller.clone())
        .await
        .unwrap();
    assert_eq!(reply.status, TaskStatus::Ok, "{reply:?}");
    run.session.flush().await.unwrap();
    let mut events = Vec::new();
    while let Ok(e) = run.events.try_recv() {
        events.push(e);
    }
    let traceparents = run.traceparents.lock().unwrap().clone();
    let (caller_trace, caller_span) = {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let cx = caller.context();
        let sc = cx.span().span_context().clone();
        (sc.trace_id(), sc.span_id())
    };
    drop(caller);
    run.stop().await;
    let all = traced.spans();

    let task_id = reply.task_id.to_string();
    let conversation_id = root.to_string();
    let trace = TraceId::from_hex(&reply.stats.trace_id).unwrap();
    let spans: Vec<SpanData> = all
        .iter()
        .filter(|s| s.span_context.trace_id() == trace)
        .cloned()
        .collect();
    assert_ne!(trace, caller_trace, "a task is a trace of its own");

    // No span of the task outside its trace.
    for s in &all {
        if attr(s, "task_id").as_deref() == Some(task_id.as_str()) {
            assert_eq!(s.span_context.trace_id(), trace, "orphan: {}", s.name);
        }
    }
    // Every span of the tree names the conversation and the task.
    for s in &spans {
        assert_eq!(
            attr(s, "task_id").as_deref(),
            Some(task_id.as_str()),
            "{}",
            s.name
        );
        assert_eq!(
            attr(s, "conversation_id").as_deref(),
            Some(conversation_id.as_str()),
            "{}",
            s.name
        );
        assert!(s.end_time >= s.start_time);
    }

    let agent = one(&spans, "invoke_agent troupe");
    assert_eq!(agent.parent_span_id, SpanId::INVALID, "the root");
    assert_eq!(agent.span_kind, SpanKind::Internal);
    assert_eq!(
        attr(agent, "gen_ai.operation.name").as_deref(),
        Some("invoke_agent")
    );
    assert_eq!(attr(agent, "gen_ai.agent.name").as_deref(), Some("troupe"));
    assert_eq!(
        attr(agent, "gen_ai.conversation.id").as_deref(),
        Some(conversation_id.as_str())
    );
    assert_eq!(
        attr(agent, "gen_ai.provider.name").as_deref(),
        Some("scripted")
    );
    assert_eq!(attr(agent, "troupe.task.status").as_deref(), Some("ok"));
    assert!(attr(agent, "gen_ai.usage.input_tokens").is_some());
    assert!(
        agent
            .links
            .links
            .iter()
            .any(|l| l.span_context.span_id() == caller_span),
        "linked to the caller"
    );
    let wait = one(&spans, "troupe.scheduler.wait");
    assert_eq!(wait.parent_span_id, agent.span_context.span_id());
    let turn = one(&spans, "troupe.turn");
    assert_eq!(turn.parent_span_id, agent.span_context.span_id());
    assert_eq!(attr(turn, "troupe.turn.steps").as_deref(), Some("2"));

    let chats = named(&spans, "chat scripted");
    assert_eq!(chats.len(), 2, "one per step");
    for chat in &chats {
        assert_eq!(chat.parent_span_id, turn.span_context.span_id());
        assert_eq!(chat.span_kind, SpanKind::Client);
        assert_eq!(attr(chat, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(
            attr(chat, "gen_ai.request.model").as_deref(),
            Some("scripted")
        );
        assert_eq!(
            attr(chat, "gen_ai.response.model").as_deref(),
            Some("scripted")
        );
        assert!(attr(chat, "gen_ai.response.id").is_some());
        assert!(attr(chat, "gen_ai.usage.input_tokens").is_some());
        assert!(attr(chat, "gen_ai.usage.output_tokens").is_some());
        assert_eq!(
            attr(chat, "gen_ai.conversation.id").as_deref(),
            Some(conversation_id.as_str())
        );
    }
    // A string array, as the conventions type it.
    let reasons: Vec<Vec<String>> = chats
        .iter()
        .map(|c| {
            let kv = c
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == "gen_ai.response.finish_reasons")
                .expect("finish reasons");
            match &kv.value {
                opentelemetry::Value::Array(opentelemetry::Array::String(v)) => {
                    v.iter().map(|s| s.as_str().to_owned()).collect()
                }
                other => panic!("{other:?}"),
            }
        })
        .collect();
    assert_eq!(reasons, [["tool_call"], ["stop"]]);

    let echo = one(&spans, "execute_tool srv__echo");
    assert_eq!(echo.parent_span_id, turn.span_context.span_id());
    assert_eq!(echo.span_kind, SpanKind::Internal);
    for (key, value) in [
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", "srv__echo"),
        ("gen_ai.tool.call.id", "call_0_0"),
        ("gen_ai.tool.type", "extension"),
        ("mcp.method.name", "tools/call"),
        ("troupe.mcp.server", "srv"),
        ("jsonrpc.request.id", "7"),
    ] {
        assert_eq!(attr(echo, key).as_deref(), Some(value), "{key}");
    }
    // The server was given the tool call's span as its parent.
    assert_eq!(
        traceparents,
        vec![Some(format!(
            "00-{}-{}-01",
            trace,
            echo.span_context.span_id()
        ))]
    );
    let plan = one(&spans, "execute_tool update_plan");
    assert_eq!(attr(plan, "gen_ai.tool.type").as_deref(), Some("function"));
    assert_eq!(attr(plan, "mcp.method.name"), None);

    // Content stays out unless asked for.
    for s in &spans {
        for key in [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.system_instructions",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
        ] {
            assert_eq!(attr(s, key), None, "{key} on {}", s.name);
        }
        for kv in &s.attributes {
            assert!(
                !kv.value.to_string().contains("secret words"),
                "{} on {}",
                kv.key,
                s.name
            );
        }
    }

    // Every event of the task names the task's trace and one of its spans.
    let span_ids: HashSet<String> = spans
        .iter()
        .map(|s| s.span_context.span_id().to_string())
        .collect();
    let task_events: Vec<_> = events
        .iter()
        .filter(|e| e.task_id == Some(reply.task_id))
        .collect();
    assert!(task_events.len() >= 6, "{task_events:?}");
    let mut by_kind: HashMap<&str, String> = HashMap::new();
    for e in &task_events {
        assert_eq!(
            e.trace_id.as_deref(),
            Some(reply.stats.trace_id.as_str()),
            "{e:?}"
        );
        let span = e.span_id.clone().unwrap();
        assert!(span_ids.contains(&span), "{e:?}");
        by_kind.insert(e.event.name().as_str(), span);
    }
    assert_eq!(
        by_kind["tool_call_started"].as_str(),
        plan.span_context.span_id().to_string(),
        "the last tool's events carry its span"
    );
    assert_eq!(
        by_kind["task_finished"].as_str(),
        agent.span_context.span_id().to_string()
    );
}

#[tokio::test]
async fn content_is_recorded_when_asked_for() {
    let traced = Traced::new();
    let run = Run::start(echo_then_plan(), true).await;
    let root = run.session.root().await.unwrap();
    let reply = run.session.message(root, "please echo").await.unwrap();
    assert_eq!(reply.status, TaskStatus::Ok);
    run.stop().await;
    let spans = traced.spans();
    let chats = named(&spans, "chat scripted");
    let input = attr(chats[0], "gen_ai.input.messages").expect("input messages");
    let input: serde_json::Value = serde_json::from_str(&input).unwrap();
    assert_eq!(input[0]["role"], "user");
    assert_eq!(input[0]["parts"][0]["content"], "please echo");
    assert!(attr(chats[0], "gen_ai.system_instructions").is_some());
    let output: serde_json::Value =
        serde_json::from_str(&attr(chats[0], "gen_ai.output.messages").unwrap()).unwrap();
    assert_eq!(output[0]["parts"][0]["name"], "srv__echo");
    let echo = one(&spans, "execute_tool srv__echo");
    assert!(
        attr(echo, "gen_ai.tool.call.arguments")
            .unwrap()
            .contains("secret words")
    );
    assert!(
        attr(echo, "gen_ai.tool.call.result")
            .unwrap()
            .contains("secret words")
    );
}

#[tokio::test]
async fn the_approval_wait_and_its_answer_stay_in_the_task() {
    let traced = Traced::new();
    let mut run = Run::start(
        vec![
            ScriptedReply::tool(
                "shell",
                serde_json::json!({"command": ["echo", "argv-canary-81"]}),
            ),
            ScriptedReply::text("ran it"),
            ScriptedReply::tool(
                "shell",
                serde_json::json!({"command": ["echo", "argv-canary-82"]}),
            ),
            ScriptedReply::text("it was refused"),
        ],
        false,
    )
    .await;
    let root = run.session.root().await.unwrap();
    let ask = |session: troupe_actors::SessionHandle, text: &'static str| {
        tokio::spawn(async move { session.message(root, text).await })
    };
    let next_approval = |session: troupe_actors::SessionHandle| async move {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(p) = session.pending_approvals().await.unwrap().pop() {
                    return p;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the approval is asked")
    };
    let pending = ask(run.session.clone(), "run it");
    let approval = next_approval(run.session.clone()).await;
    // The answer comes from outside the task, in a trace of its own.
    run.session
        .respond_approval(approval.approval_id, ApprovalDecision::ApproveOnce)
        .instrument(tracing::info_span!("responder"))
        .await
        .unwrap();
    let reply = pending.await.unwrap().unwrap();
    assert_eq!(reply.status, TaskStatus::Ok, "{reply:?}");
    // A second one, refused with a reason of the human's own.
    let refused = ask(run.session.clone(), "run the other");
    let approval = next_approval(run.session.clone()).await;
    run.session
        .respond_approval(
            approval.approval_id,
            ApprovalDecision::Deny {
                reason: Some("deny-canary-83".into()),
            },
        )
        .await
        .unwrap();
    refused.await.unwrap().unwrap();
    run.session.flush().await.unwrap();
    let mut resolved = None;
    while let Ok(e) = run.events.try_recv() {
        if let EventKind::ApprovalResolved { .. } = e.event {
            resolved = resolved.or(Some(e));
        }
    }
    run.stop().await;
    let spans = traced.spans();
    let shell = &named(&spans, "execute_tool shell")[0];
    let wait = &named(&spans, "troupe.approval.wait")[0];
    assert_eq!(wait.parent_span_id, shell.span_context.span_id());
    assert_eq!(
        wait.span_context.trace_id().to_string(),
        reply.stats.trace_id
    );
    assert_eq!(
        attr(wait, "troupe.approval.outcome").as_deref(),
        Some("approved")
    );
    assert_eq!(wait.status, Status::Unset);
    let request = &named(&spans, "approval.request")[0];
    assert_eq!(request.parent_span_id, wait.span_context.span_id());
    assert_eq!(
        attr(request, "task_id").as_deref(),
        Some(reply.task_id.to_string().as_str())
    );
    let resolved = resolved.expect("approval_resolved");
    assert_eq!(
        resolved.trace_id.as_deref(),
        Some(reply.stats.trace_id.as_str()),
        "announced in the task's trace, not the responder's"
    );
    // A command and a human's reason are content: neither is in a span's attributes nor in
    // its events (log lines inside a span are exported as span events).
    for s in &spans {
        let attributes = s.attributes.iter().map(|kv| kv.value.to_string());
        let events = s.events.iter().flat_map(|e| {
            std::iter::once(e.name.to_string())
                .chain(e.attributes.iter().map(|kv| kv.value.to_string()))
        });
        for text in attributes.chain(events) {
            for canary in ["argv-canary", "deny-canary"] {
                assert!(!text.contains(canary), "{canary} in {}: {text}", s.name);
            }
        }
    }
}

#[tokio::test]
async fn a_failed_model_call_is_an_error_span() {
    let traced = Traced::new();
    let run = Run::start(vec![ScriptedReply::error("the model broke")], false).await;
    let root = run.session.root().await.unwrap();
    let reply = run.session.message(root, "hello").await.unwrap();
    assert_eq!(reply.status, TaskStatus::Error);
    run.stop().await;
    let spans = traced.spans();
    let chat = one(&spans, "chat scripted");
    assert_eq!(attr(chat, "error.type").as_deref(), Some("model_error"));
    assert!(
        matches!(chat.status, Status::Error { .. }),
        "{:?}",
        chat.status
    );
    let agent = one(&spans, "invoke_agent troupe");
    assert_eq!(attr(agent, "error.type").as_deref(), Some("model_error"));
    assert_eq!(attr(agent, "troupe.task.status").as_deref(), Some("error"));
}

#[tokio::test]
async fn an_openai_call_is_a_chat_span_over_its_http_attempts() {
    use troupe_test_support::{ModelServer, Reply};
    let traced = Traced::new();
    let server = ModelServer::start().await;
    server.push(Reply::error(503, "busy"));
    server.push(Reply::text(["hi"]).with_usage(10, 2, 4, 1));
    let model = crate::OpenAiClient::new(crate::config::ModelConfig {
        provider: crate::config::Provider::OpenaiChat,
        base_url: server.base_url(),
        api_key_env: None,
        model: "m-request".into(),
        retry_base: Duration::from_millis(1),
        retry_max: Duration::from_millis(2),
        ..crate::config::ModelConfig::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = SessionConfig {
        data_dir: dir.path().to_path_buf(),
        ..SessionConfig::default()
    };
    let ports = SessionPorts {
        model: Arc::new(model),
        mcp: None,
        mcp_connector: None,
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
    let root = session.root().await.unwrap();
    let reply = session.message(root, "hello").await.unwrap();
    assert_eq!(reply.status, TaskStatus::Ok, "{reply:?}");
    session.shutdown().await.unwrap();
    let _ = join.await;
    let spans = traced.spans();
    let chat = one(&spans, "chat m-request");
    assert_eq!(chat.span_kind, SpanKind::Client);
    assert_eq!(
        attr(chat, "gen_ai.provider.name").as_deref(),
        Some("openai")
    );
    assert_eq!(
        attr(chat, "gen_ai.request.model").as_deref(),
        Some("m-request")
    );
    assert_eq!(
        attr(chat, "gen_ai.response.model").as_deref(),
        Some("m-request")
    );
    assert_eq!(
        attr(chat, "gen_ai.usage.input_tokens").as_deref(),
        Some("10")
    );
    assert_eq!(
        attr(chat, "gen_ai.usage.output_tokens").as_deref(),
        Some("2")
    );
    assert_eq!(
        attr(chat, "gen_ai.usage.cache_read.input_tokens").as_deref(),
        Some("4")
    );
    assert_eq!(
        attr(chat, "gen_ai.usage.reasoning.output_tokens").as_deref(),
        Some("1")
    );
    // Each attempt is a client span under the chat span, in the task.
    let attempts = named(&spans, "POST");
    assert_eq!(attempts.len(), 2, "the 503, then the answer");
    for a in &attempts {
        assert_eq!(a.parent_span_id, chat.span_context.span_id());
        assert_eq!(a.span_kind, SpanKind::Client);
        assert_eq!(
            attr(a, "task_id").as_deref(),
            Some(reply.task_id.to_string().as_str())
        );
    }
    let statuses: HashSet<String> = attempts
        .iter()
        .filter_map(|a| attr(a, "http.response.status_code"))
        .collect();
    assert_eq!(
        statuses,
        HashSet::from(["503".to_owned(), "200".to_owned()])
    );
}

#[tokio::test]
async fn a_replay_is_one_span_with_its_task_and_its_outcome() {
    use troupe_actors::replay::{ReplayOutcome, ReplayRequest, replay};
    use troupe_actors::rollout::FileRolloutStorage;
    use troupe_actors::rollout::storage::RolloutStorage;
    let traced = Traced::new();
    let run = Run::start(echo_then_plan(), false).await;
    let root = run.session.root().await.unwrap();
    let session_id = run.session.id();
    let reply = run.session.message(root, "echo and plan").await.unwrap();
    assert_eq!(reply.status, TaskStatus::Ok);
    let recorded = FileRolloutStorage::new(run._dir.path().join("rollout"));
    let echoes = run.traceparents.clone();
    assert_eq!(echoes.lock().unwrap().len(), 1);
    let Run {
        session,
        join,
        _dir,
        ..
    } = run;
    session.shutdown().await.unwrap();
    let _ = join.await;
    let records = recorded.read_conversation(session_id, root).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let report = replay(ReplayRequest {
        task_id: reply.task_id,
        session_id,
        records,
        config: SessionConfig::default(),
        agents: None,
        storage: Arc::new(FileRolloutStorage::new(elsewhere.path())),
    })
    .await
    .unwrap();
    assert_eq!(
        report.outcome,
        ReplayOutcome::Identical,
        "{}",
        report.human()
    );
    let spans = traced.spans();
    let span = one(&spans, "replay");
    assert_eq!(attr(span, "task_id"), Some(reply.task_id.to_string()));
    assert_eq!(attr(span, "conversation_id"), Some(root.to_string()));
    assert_eq!(
        attr(span, "troupe.replay.outcome").as_deref(),
        Some("identical")
    );
    assert_eq!(
        attr(span, "troupe.replay.differences").as_deref(),
        Some("0")
    );
    let replayed = report.replayed.unwrap().task_id.to_string();
    assert_eq!(attr(span, "replay_task_id"), Some(replayed));
    // The replay's task ran (its own `invoke_agent` tree); its MCP call reached no server.
    assert_eq!(named(&spans, "invoke_agent troupe").len(), 2);
    assert_eq!(
        echoes.lock().unwrap().len(),
        1,
        "the server was called once, by the run"
    );
}

mod agents;

/// rmcp's OAuth module stays at `info` and above in the console, even under a directive that
/// enables debug inside the login's span (which an `EnvFilter` alone lets through).
#[test]
fn oauth_debug_lines_stay_out_of_the_console_whatever_the_filter_says() {
    use tracing_subscriber::Layer;
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let filter = tracing_subscriber::EnvFilter::new("warn,[mcp_oauth_login]=debug,rmcp=debug");
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .with_filter(super::console_filter(filter));
    let subscriber = tracing_subscriber::registry().with(fmt);
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("mcp_oauth_login");
        span.in_scope(|| {
            tracing::debug!(target: "rmcp::transport::auth", "exchange code: SECRET-CODE");
            tracing::info!(target: "rmcp::transport::auth", "token received");
            tracing::debug!(target: "troupe_runtime::mcp", "login step");
        });
        tracing::debug!(target: "rmcp::transport::auth", "outside: SECRET-TOO");
        tracing::debug!(target: "rmcp::service", "rmcp's own debug");
    });
    let out = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    assert!(!out.contains("SECRET"), "{out}");
    assert!(out.contains("token received"), "{out}");
    assert!(out.contains("login step"), "{out}");
    assert!(out.contains("rmcp's own debug"), "{out}");
}

/// `OTEL_SERVICE_NAME` names the service, then a `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES`, then the file's `service_name` (or the default).
#[test]
fn the_service_name_follows_the_standard_variables_first() {
    use super::service_name_over as over;
    assert_eq!(over("troupe", None, None).as_deref(), Some("troupe"));
    assert_eq!(
        over(
            "troupe",
            None,
            Some("deployment.environment=prod, service.name=troupe-east")
        ),
        None,
        "the resource's own service.name stands"
    );
    assert_eq!(
        over("troupe", None, Some("deployment.environment=prod")).as_deref(),
        Some("troupe")
    );
    assert_eq!(
        over("west", Some("west"), Some("service.name=troupe-east")).as_deref(),
        Some("west"),
        "OTEL_SERVICE_NAME first"
    );
}

/// A header that is no valid HTTP header is an error at start, over HTTP as over gRPC (the
/// HTTP exporter would drop it silently, and every export be refused).
#[test]
fn a_bad_exporter_header_is_refused_whatever_the_protocol() {
    for protocol in [
        crate::config::OtlpProtocol::HttpProtobuf,
        crate::config::OtlpProtocol::Grpc,
    ] {
        let config = crate::config::TelemetryConfig {
            enabled: Some(true),
            endpoint: Some("http://127.0.0.1:4318".into()),
            protocol,
            headers: [("x-api-key".to_owned(), "abc\ndef".to_owned())].into(),
            ..Default::default()
        };
        let error = match super::exporter(&config) {
            Err(error) => error.to_string(),
            Ok(_) => panic!("{protocol:?}: a bad header was accepted"),
        };
        assert!(error.contains("x-api-key"), "{protocol:?}: {error}");
    }
}
