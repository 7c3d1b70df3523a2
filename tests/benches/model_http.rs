//! A warm turn of `troupe serve` against an HTTP model server, next to the raw streaming
//! request to the same server; prints a table.
//!
//!     cargo bench -p troupe-tests --bench model_http
//!
//! The model server is `responses_server.py` (next to this file): a Python
//! `ThreadingHTTPServer` speaking the Responses API, each SSE event written and flushed on its
//! own, run twice: with Nagle's algorithm left on (as Python's default, and many small model
//! servers, do) and with `TCP_NODELAY` (`--nodelay`).
//!
//! For each server, [`turns`] requests after `WARM_UP`, back to back on one keep-alive
//! connection (warm: what matters is the connection's state between requests, so the two
//! measures are not interleaved); troupe, raw, troupe, raw, all counted:
//! - troupe: the service in this process (default SQLite store, `openai-responses` provider
//!   pointed at the server), `POST /api/sessions/{id}/messages` waiting for the reply, sent on
//!   one keep-alive connection by a client of the same kind as the raw request's
//!   ([`ApiClient`]: HTTP/1.1 driven by the task that asks; `TROUPE_BENCH_CLIENT=reqwest`
//!   sends them with a `reqwest::Client` instead); two rows per server: each turn the first
//!   of a new session (so every model request has the same size; the session is created
//!   outside the timing), and the later turns of a conversation (sessions of
//!   `TROUPE_BENCH_PER_SESSION` turns, 8 by default, the first of each not timed);
//! - raw: troupe's own model requests (the server hands each back from `GET /last-request`;
//!   for the later turns, those of a whole session, taken in turn) POSTed to `/v1/responses`
//!   by a client of troupe's own transport (`OpenAiClient::raw_request`: the same pooled
//!   keep-alive connection handling, the same headers, the same body bytes), the SSE body read
//!   to its end without parsing. The bench checks that the server saw the same request line
//!   and headers from both (`GET /last-request-head`);
//! - raw on a new connection each time (a `reqwest` client that keeps no connection, as
//!   `curl` would): the server's own time, which no delayed ACK reaches (a new connection
//!   starts in quick-ACK mode);
//! - raw, paced: the keep-alive raw requests again, each after the client's CPU has spun for
//!   troupe's p50 minus the raw p50 (the time troupe's turn spends outside its model request,
//!   at most), plus, for first turns, the p50 of creating a session (the server waits through
//!   it too between two first turns), so that the server's thread idles between requests as
//!   long as it does between troupe's. Back to back, it never idles long enough for its CPU to sleep; between
//!   troupe's requests it does, and on a VM a sleeping CPU wakes slowly (tens of µs). The
//!   last column, troupe − raw paced, is the turn's own cost without that wake.
//!
//! A last row runs the same turn with the built-in scripted model: what the service costs
//! without any model server.
//!
//! With `TROUPE_BENCH_SERVE=<path of a troupe binary>` the service is not in the bench's
//! process but that binary's `troupe serve`, a process of its own on a fresh data directory,
//! as users run it (build it with `cargo build --release -p troupe` to measure what ships):
//! the bench's client then no longer shares the service's tokio workers.
//!
//! `TROUPE_BENCH_PRECREATE=1` creates every session before the first turn (and rests half a
//! second), so that no first turn comes right after its session's creation.
//!
//! For profiling: `TROUPE_BENCH_ROWS` picks rows (a comma list of `nagle`, `nodelay`,
//! `scripted`; all by default), `TROUPE_BENCH_TURN` one kind of turn (`first` or `later`;
//! both by default) and `TROUPE_BENCH_TURNS` the timed turns of each half (500).
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use futures::StreamExt;
use serde_json::Value;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_runtime::config::{Provider, TroupeConfig};
use troupe_runtime::openai::OpenAiClient;
use troupe_runtime::{ScriptedModel, assembly};
use troupe_service::Service;

const WARM_UP: usize = 50;

/// Timed turns (and raw requests) of each half of a row: `TROUPE_BENCH_TURNS`, else 500.
fn turns() -> usize {
    std::env::var("TROUPE_BENCH_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

/// Whether the row `name` runs (`TROUPE_BENCH_ROWS`, a comma list; every row when unset).
fn row(name: &str) -> bool {
    std::env::var("TROUPE_BENCH_ROWS")
        .map_or(true, |rows| rows.split(',').any(|r| r.trim() == name))
}

struct ModelServer {
    child: Child,
    base_url: String,
}

impl ModelServer {
    fn start(nodelay: bool) -> Self {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/responses_server.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script);
        if nodelay {
            cmd.arg("--nodelay");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the model server");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line from the model server: {line:?}"))
            .parse()
            .unwrap();
        Self {
            child,
            base_url: format!("http://127.0.0.1:{port}/v1"),
        }
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The service under measure: in this process, or a `troupe serve` child process.
enum Served {
    InProcess {
        service: Service,
        task: tokio::task::JoinHandle<()>,
    },
    Child(Child),
    Stopped,
}

struct Running {
    base: String,
    served: Served,
    _dir: tempfile::TempDir,
}

/// The `troupe` binary to run as the service (`TROUPE_BENCH_SERVE`), when the service is
/// measured as its own process rather than in the bench's.
fn serve_binary() -> Option<String> {
    std::env::var("TROUPE_BENCH_SERVE")
        .ok()
        .filter(|v| !v.is_empty())
}

/// The service with the default store; the model from `base_url` (the scripted model when
/// `None`): in this process, or `troupe serve` from [`serve_binary`] on a fresh data
/// directory, its own process as users run it.
async fn start(base_url: Option<&str>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    if let Some(bin) = serve_binary() {
        let mut command = Command::new(bin);
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .current_dir(dir.path())
            // The defaults, as the in-process service has them: nothing from the bench's
            // environment (`TROUPE_*`, `OPENAI_*`, `OTEL_*`) changes what is measured.
            .env_clear()
            .envs(std::env::vars().filter(|(k, _)| k == "PATH" || k == "HOME"))
            .stdin(Stdio::null())
            .stderr(Stdio::null());
        match base_url {
            Some(url) => command.args([
                "--provider",
                "openai-responses",
                "--model",
                "bench-model",
                "--base-url",
                url,
            ]),
            None => command.args(["--provider", "scripted"]),
        };
        let (child, base) = troupe_tests::spawn_serve(&mut command);
        return Running {
            base,
            served: Served::Child(child),
            _dir: dir,
        };
    }
    let mut config = TroupeConfig {
        data_dir: dir.path().to_owned(),
        ..TroupeConfig::default()
    };
    let model: Arc<dyn troupe_actors::ports::ModelClient> = match base_url {
        Some(url) => {
            config.model = model_config(url).model;
            assembly::build_model(&config, None).unwrap()
        }
        None => Arc::new(ScriptedModel::new(Vec::new())),
    };
    let mut ports = assembly::session_ports(&config, model, assembly::build_tokens(&config));
    let opened = troupe_service::open_store(&config, false).await.unwrap();
    ports.rollout_storage = opened.rollout;
    let service = Service::start(&config, opened.store, ports, None)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let s = service.clone();
    let task = tokio::spawn(async move { s.serve_http(listener).await.unwrap() });
    Running {
        base,
        served: Served::InProcess { service, task },
        _dir: dir,
    }
}

impl Running {
    async fn stop(mut self) {
        match std::mem::replace(&mut self.served, Served::Stopped) {
            Served::InProcess { service, task } => {
                service.shutdown_token().cancel();
                let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
            }
            Served::Child(child) => stop_child(child).await,
            Served::Stopped => {}
        }
    }
}

/// Stops a `troupe serve` child with SIGTERM, as production would, and reaps it (killed
/// after 30 s).
async fn stop_child(mut child: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Running {
    /// A bench that panicked between start and stop leaves no `troupe serve` behind.
    fn drop(&mut self) {
        if let Served::Child(child) = &mut self.served {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn new_session(api: &mut ApiClient) -> String {
    let (status, body) = api.post("/api/sessions", b"{}").await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert!(status.is_success(), "{v}");
    v["session_id"].as_str().unwrap().to_owned()
}

/// One troupe turn: the message, waiting for its reply (`expect` in it).
async fn turn(api: &mut ApiClient, session: &str, expect: &str) {
    let (status, body) = api
        .post(
            &format!("/api/sessions/{session}/messages"),
            br#"{"text":"hello"}"#,
        )
        .await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert!(status.is_success(), "{v}");
    assert_eq!(v["reply"]["text"], expect, "{v}");
}

type Body = http_body_util::Full<hyper::body::Bytes>;
type Conn =
    hyper::client::conn::http1::Connection<hyper_util::rt::TokioIo<tokio::net::TcpStream>, Body>;
/// A live connection: where requests go, and the connection to poll while they do.
type Live = (
    hyper::client::conn::http1::SendRequest<Body>,
    std::pin::Pin<Box<Conn>>,
);

/// The bench's client of the service, of the same kind as the raw request's (troupe's
/// transport to a local model server): one keep-alive HTTP/1.1 connection with `TCP_NODELAY`,
/// driven by the task that sends the request and reads the answer, so that neither measure
/// pays for a client the other does not. (`TROUPE_BENCH_CLIENT=reqwest` sends the turns with
/// a `reqwest::Client` instead, whose connection is driven by a task of its own: a hop more
/// each way.)
enum ApiClient {
    Lean { base: String, live: Option<Live> },
    Reqwest { base: String, http: reqwest::Client },
}

impl ApiClient {
    fn new(base: &str) -> Self {
        match std::env::var("TROUPE_BENCH_CLIENT").as_deref() {
            Ok("reqwest") => Self::Reqwest {
                base: base.to_owned(),
                http: reqwest::Client::new(),
            },
            Ok("lean") | Err(_) => Self::Lean {
                base: base.to_owned(),
                live: None,
            },
            Ok(other) => panic!("TROUPE_BENCH_CLIENT is `lean` or `reqwest`, not {other:?}"),
        }
    }

    /// POSTs `body` (JSON) to `path`; the status and the whole answer.
    async fn post(&mut self, path: &str, body: &[u8]) -> (reqwest::StatusCode, Vec<u8>) {
        use http_body_util::BodyExt;
        match self {
            Self::Reqwest { base, http } => {
                let r = http
                    .post(format!("{base}{path}"))
                    .header("content-type", "application/json")
                    .body(body.to_vec())
                    .send()
                    .await
                    .unwrap();
                let status = r.status();
                (status, r.bytes().await.unwrap().to_vec())
            }
            Self::Lean { base, live } => {
                let authority = base.trim_start_matches("http://").to_owned();
                if live.as_ref().is_none_or(|(send, _)| send.is_closed()) {
                    let stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
                    stream.set_nodelay(true).unwrap();
                    let (send, conn) =
                        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                            .await
                            .unwrap();
                    *live = Some((send, Box::pin(conn)));
                }
                let (send, conn) = live.as_mut().unwrap();
                let request = hyper::Request::post(path)
                    .header("host", &authority)
                    .header("content-type", "application/json")
                    .body(Body::new(hyper::body::Bytes::copy_from_slice(body)))
                    .unwrap();
                let response = driven(conn, send.send_request(request)).await.unwrap();
                let status = reqwest::StatusCode::from_u16(response.status().as_u16()).unwrap();
                let bytes = driven(conn, response.into_body().collect())
                    .await
                    .unwrap()
                    .to_bytes();
                (status, bytes.to_vec())
            }
        }
    }
}

/// `fut`, with the connection polled alongside it (a closed connection is left to be replaced).
async fn driven<T>(conn: &mut std::pin::Pin<Box<Conn>>, fut: impl Future<Output = T>) -> T {
    let mut fut = std::pin::pin!(fut);
    let mut ended = false;
    std::future::poll_fn(|cx| {
        if !ended && conn.as_mut().poll(cx).is_ready() {
            ended = true;
        }
        fut.as_mut().poll(cx)
    })
    .await
}

/// The model client troupe builds for `base_url`: the raw requests go through it.
fn model_config(base_url: &str) -> TroupeConfig {
    let mut config = TroupeConfig::default();
    config.model.provider = Provider::OpenaiResponses;
    config.model.base_url = base_url.to_owned();
    config.model.model = "bench-model".to_owned();
    config
}

/// One raw streaming request to the model server on a new connection, its SSE body read to
/// the end.
async fn raw_fresh(http: &reqwest::Client, base_url: &str, body: &[u8]) {
    let r = http
        .post(format!("{base_url}/responses"))
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let mut stream = r.bytes_stream();
    let mut seen = 0;
    while let Some(chunk) = stream.next().await {
        seen += chunk.unwrap().len();
    }
    assert!(seen > 0);
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// `a − b` in milliseconds, with its sign.
fn signed_ms(a: Duration, b: Duration) -> String {
    format!("{:+.3}", (a.as_secs_f64() - b.as_secs_f64()) * 1e3)
}

fn sorted(mut times: Vec<Duration>) -> Vec<Duration> {
    times.sort();
    times
}

/// The raw request's times, sorted: `WARM_UP` requests, then [`turns`] timed, back to back
/// on one keep-alive connection of troupe's transport (a new connection for each with
/// `fresh`); `bodies` are what troupe sent for its turns, taken in turn.
async fn measure_raw(
    server: &ModelServer,
    bodies: &[Vec<u8>],
    fresh: bool,
    pace: Duration,
) -> Vec<Duration> {
    let fresh_http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let client = OpenAiClient::new(model_config(&server.base_url).model).unwrap();
    let mut times = Vec::with_capacity(turns());
    for i in 0..WARM_UP + turns() {
        let body = &bodies[i % bodies.len()];
        // The client's CPU kept busy (not asleep) while the server waits, as troupe's are
        // between its model requests: see [`pace`].
        let idle = Instant::now();
        while idle.elapsed() < pace {
            std::hint::spin_loop();
        }
        let t = Instant::now();
        if fresh {
            raw_fresh(&fresh_http, &server.base_url, body).await;
        } else {
            assert!(client.raw_request(body).await.unwrap() > 0);
        }
        if i >= WARM_UP {
            times.push(t.elapsed());
        }
    }
    sorted(times)
}

/// The request line and headers of the model server's last request, but its
/// `Content-Length` (the bodies of a session's turns differ in size; each is replayed as it
/// was).
async fn last_head(server: &ModelServer) -> Vec<String> {
    let url = server.base_url.trim_end_matches("/v1").to_owned() + "/last-request-head";
    let head: Vec<String> = reqwest::get(url).await.unwrap().json().await.unwrap();
    head.into_iter()
        .filter(|line| !line.to_ascii_lowercase().starts_with("content-length:"))
        .collect()
}

/// Troupe's warm turn times, sorted, the same way (the scripted model without a server), the
/// bodies of troupe's model requests to replay raw, and the request line and headers of the
/// first of them. The connection to the model server is
/// the one pooled client of the process, warm after the warm-up. With `per_session` 1, each
/// turn is the first of a new session (created outside the timing), so every model request is
/// the same size; with more, each session takes `per_session` turns and the first is not
/// timed (the later turns of a live conversation: its actors up, its history growing), and
/// the bodies are the last session's requests of its timed turns, one per turn, so the raw
/// requests carry the same sizes.
/// The timed turns (sorted), the bodies of the last session's model requests, the head of
/// the last one, and how long creating each session took (sorted).
async fn measure_turns(
    server: Option<&ModelServer>,
    per_session: usize,
) -> (Vec<Duration>, Vec<Vec<u8>>, Vec<String>, Vec<Duration>) {
    let running = start(server.map(|s| s.base_url.as_str())).await;
    let mut head = Vec::new();
    let expect = if server.is_some() {
        "Hello, world."
    } else {
        "You said: hello"
    };
    let http = reqwest::Client::new();
    let mut api = ApiClient::new(&running.base);
    let mut times = Vec::with_capacity(turns());
    let timed_per_session = per_session.saturating_sub(1).max(1);
    let sessions = (WARM_UP + turns()).div_ceil(timed_per_session);
    let mut bodies = Vec::new();
    let mut creations = Vec::with_capacity(sessions);
    let mut done = 0;
    // `TROUPE_BENCH_PRECREATE`: every session is created first, then the service rests
    // half a second, so that no turn follows the creation of its session.
    let mut created = Vec::new();
    if std::env::var_os("TROUPE_BENCH_PRECREATE").is_some() {
        for _ in 0..sessions {
            created.push(new_session(&mut api).await);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for n in 0..sessions {
        let t = Instant::now();
        let session = match created.get(n) {
            Some(session) => session.clone(),
            None => new_session(&mut api).await,
        };
        creations.push(t.elapsed());
        bodies.clear();
        for k in 0..per_session {
            let t = Instant::now();
            turn(&mut api, &session, expect).await;
            let elapsed = t.elapsed();
            if per_session > 1 && k == 0 {
                continue;
            }
            if done >= WARM_UP {
                times.push(elapsed);
            }
            done += 1;
            if let Some(server) = server.filter(|_| n + 1 == sessions) {
                if head.is_empty() {
                    head = last_head(server).await;
                }
                bodies.push(last_request(&http, server).await);
            }
        }
    }
    running.stop().await;
    (sorted(times), bodies, head, sorted(creations))
}

/// The body of the model server's last request.
async fn last_request(http: &reqwest::Client, server: &ModelServer) -> Vec<u8> {
    let url = server.base_url.trim_end_matches("/v1").to_owned() + "/last-request";
    http.get(url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec()
}

/// Whether turns of `kind` (`first` or `later`) are measured (`TROUPE_BENCH_TURN`; both when
/// unset).
fn turn_kind(kind: &str) -> bool {
    std::env::var("TROUPE_BENCH_TURN").map_or(true, |k| k.trim() == kind)
}

/// Turns a session takes in the "later turns" rows (`TROUPE_BENCH_PER_SESSION`, else 8).
fn per_session() -> usize {
    std::env::var("TROUPE_BENCH_PER_SESSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
        .max(2)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!(
            "| model server | raw, new connection p50 ms | raw keep-alive p50 ms | raw keep-alive p99 ms | troupe turn p50 ms | troupe p99 ms | troupe − raw keep-alive, p50 ms | raw keep-alive, paced, p50 ms | troupe − raw paced, p50 ms |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        let later = per_session();
        for (name, nodelay) in [
            ("Python, Nagle on", false),
            ("Python, TCP_NODELAY", true),
        ] {
            if !row(if nodelay { "nodelay" } else { "nagle" }) {
                continue;
            }
            let server = ModelServer::start(nodelay);
            for (what, per) in [("first turn of a session", 1), ("later turns", later)] {
                if !turn_kind(if per == 1 { "first" } else { "later" }) {
                    continue;
                }
                let (turns, bodies, head, creations) = measure_turns(Some(&server), per).await;
                let mut raws = measure_raw(&server, &bodies, false, Duration::ZERO).await;
                // The raw requests are troupe's, byte for byte: the same head, the same body.
                assert_eq!(last_head(&server).await, head, "raw and troupe requests differ");
                // Troupe again, then raw again: both orders, so a change of load shows.
                let (more, _, _, _) = measure_turns(Some(&server), per).await;
                raws.extend(measure_raw(&server, &bodies, false, Duration::ZERO).await);
                let turns = sorted(turns.into_iter().chain(more).collect());
                let fresh = measure_raw(&server, &bodies, true, Duration::ZERO).await;
                let raws = sorted(raws);
                // Between two first turns the server also waits while the next session is
                // created: the pace counts that too.
                let between = if per == 1 {
                    pct(&creations, 0.5)
                } else {
                    Duration::ZERO
                };
                let pace = (pct(&turns, 0.5) + between).saturating_sub(pct(&raws, 0.5));
                let paced = measure_raw(&server, &bodies, false, pace).await;
                println!(
                    "| {name}, {what} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    ms(pct(&fresh, 0.5)),
                    ms(pct(&raws, 0.5)),
                    ms(pct(&raws, 0.99)),
                    ms(pct(&turns, 0.5)),
                    ms(pct(&turns, 0.99)),
                    signed_ms(pct(&turns, 0.5), pct(&raws, 0.5)),
                    ms(pct(&paced, 0.5)),
                    signed_ms(pct(&turns, 0.5), pct(&paced, 0.5)),
                );
            }
        }
        if !row("scripted") {
            return;
        }
        for (what, per) in [("first turn of a session", 1), ("later turns", later)] {
            if !turn_kind(if per == 1 { "first" } else { "later" }) {
                continue;
            }
            let (turns, _, _, _) = measure_turns(None, per).await;
            println!(
                "| none (scripted model), {what} | – | – | – | {} | {} | – | – | – |",
                ms(pct(&turns, 0.5)),
                ms(pct(&turns, 0.99)),
            );
        }
    });
}
