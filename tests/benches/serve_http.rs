//! `troupe serve` over HTTP on 127.0.0.1 with the scripted model; prints a table.
//!
//!     cargo bench -p troupe-tests --bench serve_http
//!
//! - warm turn latency: one client, keep-alive, `POST /api/sessions/{id}/messages` (waits for
//!   the reply), after a warm-up;
//! - turns per second with 100 concurrent clients, each in its own session;
//! - SSE fan-out: 1,000 subscribers on one session's `/events` while turns run in it; events
//!   delivered per second summed over the subscribers.
//!
//! Each figure is taken with the default store (SQLite under a temporary data dir, the
//! rollout in the same database), with the SQLite store and the rollout in JSONL files, and
//! with `--ephemeral` (store and rollout in memory).
//! The service runs in this process, on a multi-threaded tokio runtime; the clients share it.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use futures::StreamExt;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_actors::ports::ApproxTokens;
use troupe_runtime::config::TroupeConfig;
use troupe_runtime::{ScriptedModel, assembly};
use troupe_service::Service;

const WARM_UP: usize = 200;
const TURNS: usize = 2_000;
const CLIENTS: usize = 100;
const THROUGHPUT_FOR: Duration = Duration::from_secs(10);
const SUBSCRIBERS: usize = 1_000;
const FANOUT_TURNS: usize = 50;

struct Running {
    base: String,
    service: Service,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// Where the service keeps things in a run.
#[derive(Clone, Copy)]
enum Storage {
    /// The default: the store and the rollout in one SQLite database.
    Sqlite,
    /// The SQLite store, the rollout as JSONL files: shows what the two SQLite writers
    /// sharing one database's write lock cost.
    SqliteStoreFileRollout,
    /// `--ephemeral`: the store and the rollout in memory.
    Memory,
}

async fn start(storage: Storage) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let mut config = TroupeConfig {
        data_dir: dir.path().to_owned(),
        ..TroupeConfig::default()
    };
    config.server.task_queue = 1_024;
    let model = Arc::new(ScriptedModel::new(Vec::new()));
    let mut ports = assembly::session_ports(&config, model, Arc::new(ApproxTokens));
    let opened = troupe_service::open_store(&config, matches!(storage, Storage::Memory))
        .await
        .unwrap();
    let store = match storage {
        Storage::Sqlite | Storage::Memory => {
            ports.rollout_storage = opened.rollout;
            opened.store
        }
        Storage::SqliteStoreFileRollout => opened.store,
    };
    let service = Service::start(&config, store, ports, None).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let s = service.clone();
    let task = tokio::spawn(async move { s.serve_http(listener).await.unwrap() });
    Running {
        base,
        service,
        task,
        _dir: dir,
    }
}

impl Running {
    async fn stop(self) {
        self.service.shutdown_token().cancel();
        let _ = tokio::time::timeout(Duration::from_secs(30), self.task).await;
    }
}

async fn new_session(http: &reqwest::Client, base: &str) -> String {
    let v: Value = http
        .post(format!("{base}/api/sessions"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["session_id"].as_str().unwrap().to_owned()
}

async fn turn(http: &reqwest::Client, base: &str, session: &str) {
    let r = http
        .post(format!("{base}/api/sessions/{session}/messages"))
        .json(&json!({"text": "hello"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let _ = r.bytes().await.unwrap();
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

async fn warm_turns(base: &str) -> Vec<Duration> {
    let http = reqwest::Client::new();
    let session = new_session(&http, base).await;
    for _ in 0..WARM_UP {
        turn(&http, base, &session).await;
    }
    let mut times = Vec::with_capacity(TURNS);
    for _ in 0..TURNS {
        let t = Instant::now();
        turn(&http, base, &session).await;
        times.push(t.elapsed());
    }
    times.sort();
    times
}

async fn throughput(base: &str) -> (usize, Duration) {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS)
        .build()
        .unwrap();
    let mut sessions = Vec::new();
    for _ in 0..CLIENTS {
        sessions.push(new_session(&http, base).await);
    }
    let t = Instant::now();
    let deadline = t + THROUGHPUT_FOR;
    let clients = sessions.into_iter().map(|session| {
        let http = http.clone();
        let base = base.to_owned();
        tokio::spawn(async move {
            let mut n = 0;
            while Instant::now() < deadline {
                turn(&http, &base, &session).await;
                n += 1;
            }
            n
        })
    });
    let counts = futures::future::join_all(clients).await;
    (counts.into_iter().map(|c| c.unwrap()).sum(), t.elapsed())
}

/// One subscriber: counts events until it has seen `turns` message_complete events.
async fn subscriber(
    http: reqwest::Client,
    url: String,
    after: u64,
    turns: usize,
    ready: tokio::sync::mpsc::Sender<()>,
) -> (usize, Instant) {
    use eventsource_stream::Eventsource;
    let response = http
        .get(url)
        .header("Last-Event-ID", after.to_string())
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
    ready.send(()).await.unwrap();
    let mut stream = response.bytes_stream().eventsource();
    let mut events = 0;
    let mut completes = 0;
    while let Some(e) = stream.next().await {
        let e = e.unwrap();
        events += 1;
        if e.event == "message_complete" {
            completes += 1;
            if completes == turns {
                break;
            }
        }
    }
    (events, Instant::now())
}

async fn fanout(base: &str) -> (usize, Duration, usize) {
    let http = reqwest::Client::new();
    let session = new_session(&http, base).await;
    turn(&http, base, &session).await;
    // Subscribers start after the newest event so far: they count live events only.
    let after = last_seq(&http, base, &session).await;
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(SUBSCRIBERS);
    let url = format!("{base}/api/sessions/{session}/events");
    let subs: Vec<_> = (0..SUBSCRIBERS)
        .map(|_| {
            let http = reqwest::Client::new();
            tokio::spawn(subscriber(
                http,
                url.clone(),
                after,
                FANOUT_TURNS,
                ready_tx.clone(),
            ))
        })
        .collect();
    for _ in 0..SUBSCRIBERS {
        ready_rx.recv().await.unwrap();
    }
    let t = Instant::now();
    for _ in 0..FANOUT_TURNS {
        turn(&http, base, &session).await;
    }
    let mut delivered = 0;
    let mut last = t;
    let mut per_sub = 0;
    for s in futures::future::join_all(subs).await {
        let (n, at) = s.unwrap();
        delivered += n;
        per_sub = n;
        last = last.max(at);
    }
    (delivered, last - t, per_sub)
}

/// The seq of the newest event of the session (read from its stream's first events).
async fn last_seq(http: &reqwest::Client, base: &str, session: &str) -> u64 {
    use eventsource_stream::Eventsource;
    let response = http
        .get(format!("{base}/api/sessions/{session}/events"))
        .send()
        .await
        .unwrap();
    let mut stream = response.bytes_stream().eventsource();
    let mut seq = 0;
    // The stream replays the record, then waits for live events: stop at the first pause.
    while let Ok(Some(Ok(e))) =
        tokio::time::timeout(Duration::from_millis(300), stream.next()).await
    {
        seq = e.id.parse().unwrap_or(seq);
    }
    seq
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!(
            "| store | warm turn p50 ms | p90 ms | p99 ms | turns/s, {CLIENTS} clients | SSE events/s to {SUBSCRIBERS} subscribers | events per subscriber |"
        );
        println!("|---|---|---|---|---|---|---|");
        for (name, storage) in [
            ("SQLite (default)", Storage::Sqlite),
            ("SQLite store, JSONL rollout", Storage::SqliteStoreFileRollout),
            ("memory (--ephemeral)", Storage::Memory),
        ] {
            let server = start(storage).await;
            let warm = warm_turns(&server.base).await;
            let (turns, took) = throughput(&server.base).await;
            let (delivered, fan_took, per_sub) = fanout(&server.base).await;
            println!(
                "| {name} | {} | {} | {} | {:.0} | {:.0} | {per_sub} |",
                ms(pct(&warm, 0.5)),
                ms(pct(&warm, 0.9)),
                ms(pct(&warm, 0.99)),
                turns as f64 / took.as_secs_f64(),
                delivered as f64 / fan_took.as_secs_f64(),
            );
            server.stop().await;
        }
    });
}
