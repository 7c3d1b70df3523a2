//! Traces (O4) end to end, with the real binary: `troupe serve` exports its spans over
//! OTLP/HTTP to a real receiver (`scripts/otlp_receiver.py`, which decodes them with the
//! OpenTelemetry protocol definitions) while its scripted model calls `echo` on the real
//! server-everything, whose stdin is teed to a file. One tree per task, across the actors
//! and into the MCP call: the `traceparent` the server received names the tool call's span.
//! With telemetry off, nothing is sent (not even a connection); with gRPC, the exporter
//! speaks HTTP/2. Loopback only; every wait is bounded.

use super::serve::{Api, id};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use troupe_test_support::mcp::server_entry;
use troupe_tests::troupe_bin;

/// Bound of every wait on a process or a socket.
const LIMIT: Duration = Duration::from_secs(60);

/// The `OTEL_*` variables the children could inherit and that would change what they do.
const OTEL_VARS: &[&str] = &[
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
    "TROUPE_CONFIG",
    "TROUPE_SCRIPT",
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
}

/// An executable on `PATH` (MCP servers start with an empty environment: no `PATH`).
fn program(name: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{name}` is not on PATH"))
}

/// `scripts/otlp_receiver.py` on 127.0.0.1:0; its spans, one JSON value each.
struct Receiver {
    child: Child,
    addr: String,
    spans: mpsc::Receiver<Value>,
}

impl Receiver {
    fn start() -> Self {
        let python = repo().join(".venv/bin/python");
        assert!(
            python.is_file(),
            "{} is missing: run scripts/install-python-peers",
            python.display()
        );
        let mut child = Command::new(python)
            .arg(repo().join("scripts/otlp_receiver.py"))
            .arg("0")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        let addr = first["listening"].as_str().unwrap().to_owned();
        let (tx, spans) = mpsc::channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                    return;
                }
            }
        });
        Self { child, addr, spans }
    }

    /// Every span received until none has come for `quiet`.
    fn drain(&self, quiet: Duration) -> Vec<Value> {
        let mut out = Vec::new();
        while let Ok(span) = self.spans.recv_timeout(quiet) {
            out.push(span);
        }
        out
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A string (or integer) attribute of a received span.
fn attr(span: &Value, key: &str) -> Option<String> {
    let v = &span["attrs"][key];
    v["stringValue"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| v["intValue"].as_str().map(str::to_owned))
}

fn one<'a>(spans: &'a [&'a Value], name: &str) -> &'a Value {
    let found: Vec<_> = spans.iter().filter(|s| s["name"] == name).collect();
    let names: Vec<_> = spans.iter().map(|s| s["name"].to_string()).collect();
    assert_eq!(found.len(), 1, "one `{name}` among {names:?}");
    found[0]
}

fn sigterm(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(t0.elapsed() < LIMIT, "still running after {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `troupe serve` on 127.0.0.1:0 with a config file and a script, telemetry per `env`.
fn serve(dir: &Path, env: &[(&str, &str)]) -> (Child, String) {
    let mut command = Command::new(troupe_bin());
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--ephemeral",
            "--data-dir",
        ])
        .arg(dir)
        .arg("--config")
        .arg(dir.join("troupe.toml"))
        .arg("--script")
        .arg(dir.join("script.json"))
        .current_dir(dir)
        .env_remove("TROUPE_API_TOKENS")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for var in OTEL_VARS {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    let (child, base) = troupe_tests::spawn_serve(&mut command);
    (child, base)
}

/// server-everything over stdio, with everything it reads copied to `log`.
fn teed_everything(log: &Path) -> String {
    let args = json!([
        "-c",
        "\"$1\" -a \"$2\" | exec \"$3\" \"$4\" stdio",
        "sh",
        program("tee"),
        log,
        program("node"),
        server_entry("server-everything"),
    ]);
    format!(
        "[[mcp.servers]]\nname = \"everything\"\ntype = \"stdio\"\ncommand = {}\nargs = {args}\n",
        json!(program("sh"))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_one_trace_from_the_binary_to_the_mcp_server() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let stdin_log = dir.path().join("everything.stdin.jsonl");
    std::fs::write(dir.path().join("troupe.toml"), teed_everything(&stdin_log)).unwrap();
    std::fs::write(
        dir.path().join("script.json"),
        json!({"replies": [
            {"tool_calls": [{"name": "everything__echo", "arguments": {"message": "a private matter"}}]},
            {"text": "echoed"},
        ]})
        .to_string(),
    )
    .unwrap();
    let endpoint = format!("http://{}", receiver.addr);
    let (mut child, base) = serve(
        dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "troupe-trace-test"),
            // Export as spans end, not every 5 s.
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let api = Api::new(&base, None);
    let sid = id(&api.session(None).await, "session_id");
    // The server starts with the session's first conversation; its tools must be listed
    // before the model may call one.
    api.sse(&sid, None, |events| {
        events.iter().any(|e| e["kind"] == "mcp_server_ready")
    })
    .await;
    let answer = api.say(&sid, "echo something private").await;
    let reply = &answer["reply"];
    assert_eq!(reply["status"], "ok", "{answer}");
    assert_eq!(reply["text"], "echoed");
    let trace = id(&reply["stats"], "trace_id");
    let task_id = id(reply, "task_id");
    let conversation_id = id(reply, "conversation_id");

    // A graceful exit flushes every span.
    sigterm(&child);
    let status = tokio::task::block_in_place(|| wait_exit(&mut child));
    assert!(status.success(), "{status:?}");
    let all = receiver.drain(Duration::from_millis(500));
    assert!(all.iter().all(|s| s["path"] == "/v1/traces"));
    assert!(
        all.iter()
            .all(|s| s["resource"]["service.name"]["stringValue"] == "troupe-trace-test")
    );

    let spans: Vec<&Value> = all.iter().filter(|s| s["trace_id"] == trace).collect();
    // No span of the task elsewhere, and every span of the tree names the task.
    for s in &all {
        if attr(s, "task_id").as_deref() == Some(task_id.as_str()) {
            assert_eq!(s["trace_id"], trace, "orphan: {s}");
        }
    }
    for s in &spans {
        assert_eq!(attr(s, "task_id").as_deref(), Some(task_id.as_str()), "{s}");
        assert_eq!(
            attr(s, "conversation_id").as_deref(),
            Some(conversation_id.as_str()),
            "{s}"
        );
        for value in s["attrs"].as_object().unwrap().values() {
            assert!(
                !value.to_string().contains("private"),
                "no content by default: {s}"
            );
        }
    }

    let agent = one(&spans, "invoke_agent troupe");
    assert_eq!(agent["parent_span_id"], "", "the root");
    assert_eq!(agent["kind"], "SPAN_KIND_INTERNAL");
    assert_eq!(
        attr(agent, "gen_ai.operation.name").as_deref(),
        Some("invoke_agent")
    );
    assert_eq!(
        attr(agent, "gen_ai.conversation.id").as_deref(),
        Some(conversation_id.as_str())
    );
    // Linked to the request that brought the message, which is a trace of its own.
    let link = &agent["links"][0];
    let caller = all
        .iter()
        .find(|s| s["span_id"] == link["span_id"])
        .expect("the caller's span was exported too");
    assert_ne!(caller["trace_id"], trace);

    let agent_id = &agent["span_id"];
    let turn = one(&spans, "troupe.turn");
    assert_eq!(&turn["parent_span_id"], agent_id);
    assert_eq!(
        &one(&spans, "troupe.scheduler.wait")["parent_span_id"],
        agent_id
    );
    let chats: Vec<_> = spans
        .iter()
        .filter(|s| s["name"] == "chat scripted")
        .collect();
    assert_eq!(chats.len(), 2, "one per step");
    for chat in &chats {
        assert_eq!(chat["parent_span_id"], turn["span_id"]);
        assert_eq!(chat["kind"], "SPAN_KIND_CLIENT");
        assert_eq!(
            attr(chat, "gen_ai.provider.name").as_deref(),
            Some("scripted")
        );
        assert!(attr(chat, "gen_ai.usage.input_tokens").is_some(), "{chat}");
    }

    let tool = one(&spans, "execute_tool everything__echo");
    assert_eq!(tool["parent_span_id"], turn["span_id"]);
    assert_eq!(tool["kind"], "SPAN_KIND_INTERNAL");
    for (key, value) in [
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", "everything__echo"),
        ("gen_ai.tool.type", "extension"),
        ("mcp.method.name", "tools/call"),
        ("troupe.mcp.server", "everything"),
        ("network.transport", "pipe"),
    ] {
        assert_eq!(attr(tool, key).as_deref(), Some(value), "{key}: {tool}");
    }
    let request_id = attr(tool, "jsonrpc.request.id").expect("jsonrpc.request.id");
    assert!(attr(tool, "mcp.protocol.version").is_some(), "{tool}");

    // What the server read: the tools/call request, with the tool call's span as parent.
    let received = std::fs::read_to_string(&stdin_log).unwrap();
    let call = received
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|m| m["method"] == "tools/call")
        .unwrap_or_else(|| panic!("no tools/call in {received}"));
    assert_eq!(call["id"].to_string(), request_id);
    assert_eq!(
        call["params"]["_meta"]["traceparent"],
        format!("00-{trace}-{}-01", tool["span_id"].as_str().unwrap()),
        "{call}"
    );
}

/// A fake collector on 127.0.0.1:0: what each connection sent first (up to 4 KiB), answered
/// with an empty 200.
struct Listener {
    addr: String,
    first_bytes: mpsc::Receiver<Vec<u8>>,
}

impl Listener {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, first_bytes) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = vec![0; 4096];
                let n = stream.read(&mut buf).unwrap_or(0);
                buf.truncate(n);
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
                if tx.send(buf).is_err() {
                    return;
                }
            }
        });
        Self { addr, first_bytes }
    }
}

/// `troupe chat --once` (scripted) with these variables; its exit status.
fn chat_once(env: &[(&str, &str)]) -> std::process::ExitStatus {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(troupe_bin());
    command
        .args(["chat", "--once", "hello", "--data-dir"])
        .arg(dir.path())
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for var in OTEL_VARS {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    let mut child = command.spawn().unwrap();
    wait_exit(&mut child)
}

#[test]
fn with_telemetry_off_nothing_is_sent() {
    let collector = Listener::start();
    let endpoint = format!("http://{}", collector.addr);
    // An endpoint alone would turn export on; each switch turns it off again. (Without any
    // variable export is off too: see `config::telemetry`'s tests.)
    let off: [&[(&str, &str)]; 2] = [
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SDK_DISABLED", "true"),
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_TRACES_EXPORTER", "none"),
        ],
    ];
    for env in off {
        assert!(chat_once(env).success(), "{env:?}");
        assert!(
            collector.first_bytes.try_recv().is_err(),
            "nothing connects with {env:?}"
        );
    }
    // The same run with export on does reach the collector: the check above can fail.
    assert!(chat_once(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)]).success());
    let first = collector.first_bytes.recv_timeout(LIMIT).unwrap();
    assert!(
        first.starts_with(b"POST /v1/traces HTTP/1.1"),
        "{}",
        String::from_utf8_lossy(&first)
    );
}

#[test]
fn a_header_of_the_file_is_sent_as_written() {
    let collector = Listener::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("troupe.toml");
    std::fs::write(
        &config,
        format!(
            "[telemetry]\nenabled = true\nendpoint = \"http://{}\"\nheaders = {{ \"x-api-key\" = \"k%41y\" }}\n",
            collector.addr
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_owned();
    assert!(
        chat_once(&[
            ("TROUPE_CONFIG", &config),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-other=a%2Cb"),
        ])
        .success()
    );
    let first = collector.first_bytes.recv_timeout(LIMIT).unwrap();
    let head = String::from_utf8_lossy(&first).to_ascii_lowercase();
    assert!(head.starts_with("post /v1/traces http/1.1"), "{head}");
    // Not percent-decoded (`kAy`), as over gRPC, whose metadata goes out as given.
    assert!(head.contains("x-api-key: k%41y\r\n"), "{head}");
    // The variable's values are percent-decoded, as the specification says.
    assert!(head.contains("x-other: a,b\r\n"), "{head}");
}

#[test]
fn grpc_export_speaks_http2() {
    let collector = Listener::start();
    let endpoint = format!("http://{}", collector.addr);
    assert!(
        chat_once(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
        ])
        .success()
    );
    let first = collector.first_bytes.recv_timeout(LIMIT).unwrap();
    assert!(
        first.starts_with(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        "the HTTP/2 preface of a gRPC client: {}",
        String::from_utf8_lossy(&first)
    );
}
