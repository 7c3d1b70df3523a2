//! The OpenAI providers against the local model server (real sockets, real time; every
//! timeout and backoff is a few milliseconds so the file runs in seconds).
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use troupe_actors::history::{HistoryLimits, HistorySnapshot, HistoryStore, LocalSummarizer};
use troupe_actors::ports::{DeltaSink, ModelClient, ModelRequest, ModelResponse};
use troupe_proto::{
    AgentError, ConversationId, HistoryItem, Json, TaskId, ToolCall, ToolOutput, ToolSpec, Usage,
};
use troupe_runtime::OpenAiClient;
use troupe_runtime::config::{ModelConfig, Provider, ToolMode};
use troupe_test_support::{CallScript, ModelServer, Reply};

const KEY: &str = "sk-test-123";

fn config(server: &ModelServer, provider: Provider) -> ModelConfig {
    ModelConfig {
        provider,
        base_url: server.base_url(),
        api_key_env: None,
        api_key: Some(KEY.into()),
        model: "gpt-4o-mini-2024-07-18".into(),
        tool_mode: ToolMode::Native,
        headers: BTreeMap::from([("x-team".to_owned(), "troupe".to_owned())]),
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(2),
        max_retries: 3,
        retry_base: Duration::from_millis(2),
        retry_max: Duration::from_millis(10),
        max_response_bytes: 1 << 20,
    }
}

/// A prompt: history items plus the new input.
struct Prompt {
    snapshot: HistorySnapshot,
    input: Vec<HistoryItem>,
    tools: Vec<ToolSpec>,
    conversation_id: ConversationId,
    task_id: TaskId,
}

impl Prompt {
    fn new(history: Vec<HistoryItem>, input: &str) -> Self {
        let mut store = HistoryStore::new(
            HistoryLimits::default(),
            Arc::new(LocalSummarizer::default()),
        );
        store.append(history);
        Self {
            snapshot: store.snapshot(),
            input: vec![HistoryItem::user(input)],
            tools: Vec::new(),
            conversation_id: ConversationId::new(),
            task_id: TaskId::new(),
        }
    }

    fn with_tools(mut self, tools: Vec<ToolSpec>) -> Self {
        self.tools = tools;
        self
    }

    fn request(&self) -> ModelRequest<'_> {
        ModelRequest {
            conversation_id: self.conversation_id,
            task_id: self.task_id,
            instructions: "You are terse.",
            prompt: self.snapshot.view(None, &[], &self.input),
            tools: &self.tools,
            prompt_cache_key: "conv-key-1",
        }
    }
}

#[derive(Default)]
struct Deltas(Vec<String>);

impl DeltaSink for Deltas {
    fn text_delta(&mut self, delta: &str) {
        self.0.push(delta.to_owned());
    }
}

fn tool(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("The {name} tool"),
        parameters: Json(json!({"type": "object", "properties": {"a": {"type": "number"}}})),
    }
}

fn call(id: &str, name: &str, args: Value) -> HistoryItem {
    HistoryItem::ToolCall(ToolCall {
        call_id: id.into(),
        name: name.into(),
        arguments: Json(args),
    })
}

fn output(id: &str, text: &str) -> HistoryItem {
    HistoryItem::ToolOutput(ToolOutput {
        call_id: id.into(),
        output: text.into(),
        is_error: false,
    })
}

async fn step(
    client: &OpenAiClient,
    prompt: &Prompt,
) -> (Result<ModelResponse, AgentError>, Deltas) {
    let mut deltas = Deltas::default();
    let cancel = CancellationToken::new();
    let result = client.step(prompt.request(), &mut deltas, &cancel).await;
    (result, deltas)
}

fn model_error(result: Result<ModelResponse, AgentError>) -> (String, bool) {
    match result {
        Err(AgentError::ModelError { message, retryable }) => (message, retryable),
        other => panic!("expected a model error, got {other:?}"),
    }
}

/// Runs `$body(provider)` once per provider, as two tests in a module.
macro_rules! both_providers {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn chat() {
                super::$name(troupe_runtime::config::Provider::OpenaiChat).await;
            }
            #[tokio::test]
            async fn responses() {
                super::$name(troupe_runtime::config::Provider::OpenaiResponses).await;
            }
        }
    )*};
}

both_providers!(
    streamed_text_arrives_in_order,
    two_tool_calls_with_fragmented_arguments,
    usage_is_captured,
    request_carries_prompt_tools_and_headers,
    key_comes_from_the_environment,
    rate_limit_with_retry_after_is_retried,
    server_errors_are_retried,
    retries_run_out,
    unauthorized_is_not_retried,
    malformed_stream_fails,
    early_end_fails,
    stall_hits_the_idle_timeout,
    cancel_during_a_stall_closes_the_connection,
    request_timeout_bounds_the_call,
    refused_connections_are_retried,
    invalid_tool_arguments_name_the_tool,
    text_dialect_end_to_end,
    a_huge_error_body_is_read_only_in_part,
    an_endless_event_fails_the_step_and_is_not_read_on,
    streamed_text_past_the_response_bound_fails_the_step,
    tool_arguments_past_the_response_bound_fail_the_step,
);

/// A raw HTTP/1.1 server on 127.0.0.1 for one request: it answers with `head`, then writes
/// `first` and `byte` after `byte` (in 64 KiB writes) until `total` bytes of body were
/// written or the client closed the connection. Its URL, and a handle to the body bytes it
/// wrote.
async fn endless_server(
    head: String,
    first: &'static [u8],
    byte: u8,
    total: usize,
) -> (String, tokio::task::JoinHandle<usize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let written = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        // The request: its head, then as many body bytes as it announced.
        let mut request = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        let body_start = loop {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0, "the client left before its request was in");
            request.extend_from_slice(&buf[..n]);
            if let Some(i) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head_text = String::from_utf8_lossy(&request[..body_start]).to_ascii_lowercase();
        let length: usize = head_text
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while request.len() - body_start < length {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0);
            request.extend_from_slice(&buf[..n]);
        }
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(first).await.unwrap();
        let chunk = vec![byte; 64 * 1024];
        let mut written = first.len();
        while written < total {
            match socket.write(&chunk).await {
                Ok(n) if n > 0 => written += n,
                _ => break,
            }
        }
        written
    });
    (url, written)
}

/// How many bytes the server wrote before the client closed the connection (it must close it
/// within two seconds).
async fn written_before_close(server: tokio::task::JoinHandle<usize>) -> usize {
    tokio::time::timeout(Duration::from_secs(2), server)
        .await
        .expect("the client closed the connection")
        .unwrap()
}

async fn a_huge_error_body_is_read_only_in_part(provider: Provider) {
    const BODY: usize = 1 << 30;
    let (url, server) = endless_server(
        format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
             content-length: {BODY}\r\n\r\n"
        ),
        br#"{"error": {"message": ""#,
        b'a',
        BODY,
    )
    .await;
    let client = raw_server_client(provider, url, ModelConfig::default().max_response_bytes);
    let started = Instant::now();
    let (result, _) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    let (message, retryable) = model_error(result);
    assert!(!retryable);
    let prefix = format!(
        "HTTP 400 from {}: {{\"error\": {{\"message\": \"aaa",
        client.shown_url()
    );
    assert!(message.starts_with(&prefix), "{message}");
    assert!(
        message.ends_with("aaa (body truncated: only its first 65536 bytes were read)"),
        "{message}"
    );
    assert!(
        message.len() < 1024,
        "only the start is shown: {}",
        message.len()
    );
    let written = written_before_close(server).await;
    // What the socket buffers took, and not much more.
    assert!(written < 32 << 20, "the server wrote {written} bytes");
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// A client of the raw server at `url`: no key, short timeouts, responses bounded at `max`.
fn raw_server_client(provider: Provider, url: String, max: usize) -> OpenAiClient {
    let mut cfg = ModelConfig {
        provider,
        base_url: url,
        max_response_bytes: max,
        ..ModelConfig::default()
    };
    cfg.api_key_env = None;
    cfg.idle_timeout = Duration::from_secs(2);
    cfg.request_timeout = Duration::from_secs(5);
    OpenAiClient::new(cfg).unwrap()
}

async fn an_endless_event_fails_the_step_and_is_not_read_on(provider: Provider) {
    let (url, server) = endless_server(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
            .to_owned(),
        b"data: ",
        b'x',
        usize::MAX,
    )
    .await;
    let client = raw_server_client(provider, url, 1024);
    let started = Instant::now();
    let (result, deltas) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    let (message, retryable) = model_error(result);
    assert!(!retryable);
    assert_eq!(
        message,
        format!(
            "malformed stream: an event is larger than {} bytes (no blank line ended it)",
            1024 + 4 * 1024 * 1024
        )
    );
    assert!(deltas.0.is_empty());
    let written = written_before_close(server).await;
    assert!(written < 32 << 20, "the server wrote {written} bytes");
    assert!(started.elapsed() < Duration::from_secs(2));
}

async fn streamed_text_past_the_response_bound_fails_the_step(provider: Provider) {
    let server = ModelServer::start().await;
    // 200 deltas of 100 bytes: 20 000 bytes, against a bound of 4096.
    let chunks: Vec<String> = (0..200).map(|i| format!("{:0100}", i)).collect();
    server.push(Reply::text(chunks));
    let mut cfg = config(&server, provider);
    cfg.max_response_bytes = 4096;
    let client = OpenAiClient::new(cfg).unwrap();
    let (result, deltas) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    let (message, retryable) = model_error(result);
    assert!(!retryable);
    assert_eq!(
        message,
        "model response too large: its text and tool calls passed 4096 bytes \
         (model.max_response_bytes)"
    );
    // The text up to the delta that passed the bound was streamed, no more; not retried.
    assert_eq!(deltas.0.concat().len(), 4100);
    assert_eq!(server.requests().len(), 1);
}

async fn tool_arguments_past_the_response_bound_fail_the_step(provider: Provider) {
    let server = ModelServer::start().await;
    let mut fragments = vec!["{\"a\": \"".to_owned()];
    fragments.extend((0..200).map(|_| "x".repeat(100)));
    fragments.push("\"}".to_owned());
    server.push(Reply::tool_call("add", fragments));
    let mut cfg = config(&server, provider);
    cfg.max_response_bytes = 4096;
    let client = OpenAiClient::new(cfg).unwrap();
    let prompt = Prompt::new(Vec::new(), "hi").with_tools(vec![tool("add")]);
    let (result, _) = step(&client, &prompt).await;
    let (message, _) = model_error(result);
    assert!(
        message.starts_with("model response too large: "),
        "{message}"
    );
    assert_eq!(server.requests().len(), 1);
}

async fn streamed_text_arrives_in_order(provider: Provider) {
    let server = ModelServer::start().await;
    server.push(Reply::text(["Hel", "lo", ", wor", "ld"]));
    let client = OpenAiClient::new(config(&server, provider)).unwrap();
    let (result, deltas) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    let response = result.unwrap();
    assert_eq!(deltas.0.concat(), "Hello, world");
    assert_eq!(response.text, "Hello, world");
    assert!(response.tool_calls.is_empty());
    // What the chat span reports: the model that answered and its completion id.
    assert_eq!(
        response.response_model.as_deref(),
        Some("gpt-4o-mini-2024-07-18")
    );
    assert!(response.response_id.is_some());
    // A stream read to its end is no disconnect.
    assert_eq!(server.disconnects(), 0);
    let info = client.info();
    assert_eq!(info.family, "gpt-4o");
    assert_eq!(
        info.provider,
        match provider {
            Provider::OpenaiChat => "openai-chat",
            _ => "openai-responses",
        }
    );
}

async fn two_tool_calls_with_fragmented_arguments(provider: Provider) {
    let server = ModelServer::start().await;
    server.push(
        Reply::tool_calls([
            CallScript::new("add", ["{\"a\":", "2,\"b\"", ":3}"]),
            CallScript::new("echo", ["", "{\"text\":\"h", "i\"}"]).with_id("call_echo"),
        ])
        .with_text(["Let me ", "check."]),
    );
    let client = OpenAiClient::new(config(&server, provider)).unwrap();
    let prompt = Prompt::new(Vec::new(), "add").with_tools(vec![tool("add"), tool("echo")]);
    let (result, deltas) = step(&client, &prompt).await;
    let response = result.unwrap();
    assert_eq!(deltas.0.concat(), "Let me check.");
    assert_eq!(response.text, "Let me check.");
    assert_eq!(
        response.tool_calls,
        vec![
            ToolCall {
                call_id: "call_1".into(),
                name: "add".into(),
                arguments: Json(json!({"a": 2, "b": 3})),
            },
            ToolCall {
                call_id: "call_echo".into(),
                name: "echo".into(),
                arguments: Json(json!({"text": "hi"})),
            },
        ]
    );
}

async fn usage_is_captured(provider: Provider) {
    let server = ModelServer::start().await;
    server.push(Reply::text(["ok"]).with_usage(1200, 80, 1024, 32));
    let client = OpenAiClient::new(config(&server, provider)).unwrap();
    let (result, _) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    assert_eq!(
        result.unwrap().usage,
        Some(Usage {
            input_tokens: 1200,
            output_tokens: 80,
            cached_tokens: 1024,
            reasoning_tokens: 32,
        })
    );
}

async fn request_carries_prompt_tools_and_headers(provider: Provider) {
    let server = ModelServer::start().await;
    let client = OpenAiClient::new(config(&server, provider)).unwrap();
    let history = vec![
        HistoryItem::Summary {
            text: "we met".into(),
            replaced_items: 4,
        },
        HistoryItem::user("what is 2+3?"),
        HistoryItem::assistant("checking"),
        call("call_9", "add", json!({"a": 2, "b": 3})),
        output("call_9", "5"),
        HistoryItem::assistant("It is 5."),
    ];
    let prompt = Prompt::new(history, "thanks").with_tools(vec![tool("zeta"), tool("add")]);
    let (result, _) = step(&client, &prompt).await;
    assert_eq!(result.unwrap().text, "ok");

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.header("authorization"), Some("Bearer sk-test-123"));
    assert_eq!(r.header("x-team"), Some("troupe"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let b = &r.body;
    assert_eq!(b["model"], "gpt-4o-mini-2024-07-18");
    assert_eq!(b["stream"], true);
    assert_eq!(b["prompt_cache_key"], "conv-key-1");
    match provider {
        Provider::OpenaiChat => {
            assert_eq!(r.path, "/v1/chat/completions");
            assert_eq!(b["stream_options"], json!({"include_usage": true}));
            let names: Vec<&Value> = b["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| &t["function"]["name"])
                .collect();
            assert_eq!(names, [&json!("zeta"), &json!("add")]);
            assert_eq!(b["tools"][1]["type"], "function");
            assert_eq!(b["tools"][1]["function"]["description"], "The add tool");
            assert_eq!(b["tools"][1]["function"]["parameters"]["type"], "object");
            assert_eq!(
                b["messages"],
                json!([
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Summary of the earlier conversation:\nwe met"},
                    {"role": "user", "content": "what is 2+3?"},
                    {"role": "assistant", "content": "checking", "tool_calls": [
                        {"id": "call_9", "type": "function",
                         "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_9", "content": "5"},
                    {"role": "assistant", "content": "It is 5."},
                    {"role": "user", "content": "thanks"},
                ])
            );
        }
        _ => {
            assert_eq!(r.path, "/v1/responses");
            assert_eq!(b["instructions"], "You are terse.");
            assert_eq!(b["store"], false);
            assert_eq!(b["tool_choice"], "auto");
            assert_eq!(b["parallel_tool_calls"], true);
            assert_eq!(
                b["tools"],
                json!([
                    {"type": "function", "name": "zeta", "description": "The zeta tool",
                     "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}},
                    {"type": "function", "name": "add", "description": "The add tool",
                     "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}},
                ])
            );
            let text = |role: &str, kind: &str, t: &str| json!({"type": "message", "role": role, "content": [{"type": kind, "text": t}]});
            assert_eq!(
                b["input"],
                json!([
                    text("user", "input_text", "Summary of the earlier conversation:\nwe met"),
                    text("user", "input_text", "what is 2+3?"),
                    text("assistant", "output_text", "checking"),
                    {"type": "function_call", "call_id": "call_9", "name": "add",
                     "arguments": "{\"a\":2,\"b\":3}"},
                    {"type": "function_call_output", "call_id": "call_9", "output": "5"},
                    text("assistant", "output_text", "It is 5."),
                    text("user", "input_text", "thanks"),
                ])
            );
        }
    }
}

async fn key_comes_from_the_environment(provider: Provider) {
    // Cargo and nextest set this variable for every test process; no test can set one.
    let Ok(value) = std::env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let server = ModelServer::start().await;
    let mut cfg = config(&server, provider);
    cfg.api_key = None;
    cfg.api_key_env = Some("CARGO_MANIFEST_DIR".into());
    let client = OpenAiClient::new(cfg.clone()).unwrap();
    step(&client, &Prompt::new(Vec::new(), "hi"))
        .await
        .0
        .unwrap();
    // An unset variable sends no header at all.
    cfg.api_key_env = Some("TROUPE_TEST_SURELY_UNSET_VARIABLE".into());
    let client = OpenAiClient::new(cfg).unwrap();
    step(&client, &Prompt::new(Vec::new(), "hi"))
        .await
        .0
        .unwrap();
    let requests = server.requests();
    assert_eq!(
        requests[0].header("authorization"),
        Some(format!("Bearer {value}").as_str())
    );
    assert_eq!(requests[1].header("authorization"), None);
}

async fn rate_limit_with_retry_after_is_retried(provider: Provider) {
    let server = ModelServer::start().await;
    server.push(Reply::error(429, "Rate limit reached").retry_after("1"));
    server.push(Reply::text(["after the wait"]));
    let mut cfg = config(&server, provider);
    // Backoff alone would wait at most 1 ms; the 1 s Retry-After is capped at 250 ms.
    cfg.retry_base = Duration::from_millis(1);
    cfg.retry_max = Duration::from_millis(250);
    let client = OpenAiClient::new(cfg).unwrap();
    let started = Instant::now();
    let (result, _) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    assert_eq!(result.unwrap().text, "after the wait");
    assert_eq!(server.requests().len(), 2);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(240), "{waited:?}");
    assert!(waited < Duration::from_secs(1), "{waited:?}");
}

async fn server_errors_are_retried(provider: Provider) {
    let server = ModelServer::start().await;
    server.push(Reply::error(503, "overloaded"));
    server.push(Reply::error(503, "still overloaded"));
    server.push(Reply::text(["third time"]));
    let client = OpenAiClient::new(config(&server, provider)).unwrap();
    let (result, _) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    assert_eq!(result.unwrap().text, "third time");
    assert_eq!(server.requests().len(), 3);
}

async fn retries_run_out(provider: Provider) {
    let server = ModelServer::start().await;
    for _ in 0..4 {
        server.push(Reply::error(500, "boom"));
    }
    let client = OpenAiClient::new(config(&server, provider)).unwrap();
    let (result, _) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    let (message, retryable) = model_error(result);
    assert!(retryable);
    assert!(
        message.starts_with("HTTP 500 from http://127.0.0.1:"),
        "{message}"
    );
    assert!(
        message.contains(": boom (gave up after 4 attempts)"),
        "{message}"
    );
    assert_eq!(server.requests().len(), 4);
}

async fn unauthorized_is_not_retried(provider: Provider) {
    let server = ModelServer::start().await;
    server.push(Reply::error(401, "Incorrect API key provided"));
    let client = OpenAiClient::new(config(&server, provider)).unwrap();
    let (result, _) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    let (message, retryable) = model_error(result);
    assert!(!retryable);
    assert_eq!(
        message,
        format!(
            "HTTP 401 from {}: Incorrect API key provided",
            client.shown_url()
        )
    );
    assert_eq!(server.requests().len(), 1);
}

async fn malformed_stream_fails(provider: Provider) {
    let server = ModelServer::start().await;
    server.push(Reply::text(["a", "b"]).malformed());
    let client = OpenAiClient::new(config(&server, provider)).unwrap();
    let (result, _) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    let (message, _) = model_error(result);
    assert!(message.starts_with("malformed stream: "), "{message}");
    assert_eq!(server.requests().len(), 1);
}

async fn early_end_fails(provider: Provider) {
    let server = ModelServer::start().await;
    server.push(Reply::text(["a", "b"]).end_early());
    let client = OpenAiClient::new(config(&server, provider)).unwrap();
    let (result, deltas) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    let (message, _) = model_error(result);
    assert!(message.starts_with("stream ended early"), "{message}");
    // The text before the cut was streamed, and nothing was retried.
    assert_eq!(deltas.0.concat(), "ab");
    assert_eq!(server.requests().len(), 1);
}

async fn stall_hits_the_idle_timeout(provider: Provider) {
    let server = ModelServer::start().await;
    server.push(Reply::text(["a", "b"]).stall_after(2));
    let mut cfg = config(&server, provider);
    cfg.idle_timeout = Duration::from_millis(200);
    let client = OpenAiClient::new(cfg).unwrap();
    let started = Instant::now();
    let (result, _) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    let (message, _) = model_error(result);
    assert_eq!(message, "stream idle for 0.2s");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(server.requests().len(), 1);
}

async fn cancel_during_a_stall_closes_the_connection(provider: Provider) {
    let server = ModelServer::start().await;
    // Stall right after the first text delta.
    let events = match provider {
        Provider::OpenaiChat => 2,
        _ => 4,
    };
    server.push(Reply::text(["a", "b"]).stall_after(events));
    let mut cfg = config(&server, provider);
    cfg.idle_timeout = Duration::from_secs(30);
    let client = OpenAiClient::new(cfg).unwrap();
    let prompt = Prompt::new(Vec::new(), "hi");
    let cancel = CancellationToken::new();
    let mut deltas = Deltas::default();
    let canceller = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        cancel.cancel();
        Instant::now()
    };
    let (result, cancelled_at) = tokio::join!(
        client.step(prompt.request(), &mut deltas, &cancel),
        canceller
    );
    assert!(
        matches!(result, Err(AgentError::Cancelled { .. })),
        "{result:?}"
    );
    assert!(cancelled_at.elapsed() < Duration::from_millis(100));
    assert_eq!(deltas.0.concat(), "a");
    assert_eq!(server.wait_disconnects(1, Duration::from_secs(2)).await, 1);
}

async fn request_timeout_bounds_the_call(provider: Provider) {
    let server = ModelServer::start().await;
    server.push(Reply::text(["late"]).delayed(Duration::from_secs(3)));
    let mut cfg = config(&server, provider);
    cfg.request_timeout = Duration::from_millis(150);
    let client = OpenAiClient::new(cfg).unwrap();
    let started = Instant::now();
    let (result, _) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    assert!(
        matches!(result, Err(AgentError::Timeout { after_ms: 150, .. })),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
}

async fn refused_connections_are_retried(provider: Provider) {
    // A port that was just free: connecting is refused at once.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let server = ModelServer::start().await;
    let mut cfg = config(&server, provider);
    cfg.base_url = format!("http://127.0.0.1:{port}/v1");
    cfg.max_retries = 2;
    let client = OpenAiClient::new(cfg).unwrap();
    let (result, _) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    let (message, retryable) = model_error(result);
    assert!(retryable);
    assert!(
        message.starts_with("request to http://127.0.0.1:"),
        "{message}"
    );
    assert!(message.ends_with("(gave up after 3 attempts)"), "{message}");
}

async fn invalid_tool_arguments_name_the_tool(provider: Provider) {
    let server = ModelServer::start().await;
    server.push(Reply::tool_call("add", ["{\"a\":", "2,"]));
    let client = OpenAiClient::new(config(&server, provider)).unwrap();
    let (result, _) = step(&client, &Prompt::new(Vec::new(), "hi")).await;
    let (message, retryable) = model_error(result);
    assert!(!retryable);
    assert!(
        message.starts_with("invalid JSON arguments for tool `add`"),
        "{message}"
    );
}

async fn text_dialect_end_to_end(provider: Provider) {
    let server = ModelServer::start().await;
    server.push(Reply::text([
        "I will add.\n<action tool=\"add\">",
        "{\"a\": 2, \"b\": 3}",
        "</action>",
    ]));
    server.push(Reply::text(["<final>The sum ", "is 5.</final>"]));
    let mut cfg = config(&server, provider);
    cfg.tool_mode = ToolMode::Text;
    let client = OpenAiClient::new(cfg).unwrap();

    let first = Prompt::new(Vec::new(), "add 2 and 3").with_tools(vec![tool("add")]);
    let (result, deltas) = step(&client, &first).await;
    let response = result.unwrap();
    assert_eq!(response.text, "I will add.");
    // The raw reply (with its tags) is not streamed; the parsed text is.
    assert_eq!(deltas.0.concat(), "I will add.");
    assert_eq!(
        response.tool_calls,
        vec![ToolCall {
            call_id: "call_1".into(),
            name: "add".into(),
            arguments: Json(json!({"a": 2, "b": 3})),
        }]
    );

    let history = vec![
        HistoryItem::user("add 2 and 3"),
        HistoryItem::assistant("I will add."),
        HistoryItem::ToolCall(response.tool_calls[0].clone()),
        output("call_1", "5"),
    ];
    let mut second = Prompt::new(history, "");
    second.input.clear();
    second.tools = vec![tool("add")];
    let (result, deltas) = step(&client, &second).await;
    let response = result.unwrap();
    assert_eq!(response.text, "The sum is 5.");
    assert!(response.tool_calls.is_empty());
    assert_eq!(deltas.0.concat(), "The sum is 5.");

    let requests = server.requests();
    let (first_body, second_body) = (&requests[0].body, &requests[1].body);
    for body in [first_body, second_body] {
        assert!(body.get("tools").is_none(), "{body}");
    }
    // The instructions carry the tools and the rules; history shows tags.
    let (instructions, turns): (&str, Vec<(String, String)>) = match provider {
        Provider::OpenaiChat => {
            let messages = second_body["messages"].as_array().unwrap();
            (
                first_body["messages"][0]["content"].as_str().unwrap(),
                messages[1..]
                    .iter()
                    .map(|m| {
                        (
                            m["role"].as_str().unwrap().to_owned(),
                            m["content"].as_str().unwrap().to_owned(),
                        )
                    })
                    .collect(),
            )
        }
        _ => (
            first_body["instructions"].as_str().unwrap(),
            second_body["input"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    (
                        m["role"].as_str().unwrap().to_owned(),
                        m["content"][0]["text"].as_str().unwrap().to_owned(),
                    )
                })
                .collect(),
        ),
    };
    assert!(instructions.starts_with("You are terse.\n\n# Tools"));
    assert!(instructions.contains("## add\nThe add tool\n"));
    assert!(instructions.contains("<action tool=\"NAME\">"));
    assert!(instructions.contains("<final>"));
    assert_eq!(
        turns,
        [
            ("user".to_owned(), "add 2 and 3".to_owned()),
            (
                "assistant".to_owned(),
                "I will add.\n<action tool=\"add\">{\"a\":2,\"b\":3}</action>".to_owned()
            ),
            ("user".to_owned(), "<observation>5</observation>".to_owned()),
        ]
    );
}
