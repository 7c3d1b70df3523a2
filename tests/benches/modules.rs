//! Deliveries to modules (A10), per delivery; prints a table.
//!
//!     cargo bench -p troupe-tests --bench modules
//!
//! An in-process `troupe serve` service (memory store, scripted model) with two output
//! modules: a stdio gateway (the tests' `gateway.py`, a real python3 process) and an http
//! webhook (an axum server on 127.0.0.1). Measured, one after the other on a 2-worker
//! runtime: a sync delivery of a reply frame until its acknowledgement (the gateway's `ack`
//! line, the webhook's 200), and a `dispatch_module` round trip until the module's result.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_actors::modules::{ModuleDispatch, ModulePort};
use troupe_runtime::config::TroupeConfig;
use troupe_service::Service;
use troupe_service::modules::Modules;

const RUNS: usize = 2_000;

fn row(what: &str, mut times: Vec<Duration>, note: &str) {
    times.sort();
    let p50 = times[times.len() / 2];
    let p99 = times[(times.len() * 99) / 100];
    println!("| {what} | {p50:.1?} | {p99:.1?} | {note} |");
}

async fn webhook() -> String {
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(|axum::Json(body): axum::Json<Value>| async move {
            axum::Json(json!({"seen": body["type"]}))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let dir = tempfile::tempdir().unwrap();
    let modules_dir = dir.path().join("modules");
    std::fs::create_dir_all(&modules_dir).unwrap();
    let gateway = concat!(env!("CARGO_MANIFEST_DIR"), "/suite/modules/gateway.py");
    std::fs::write(
        modules_dir.join("gw.json"),
        json!({"id": "gw", "direction": "output", "protocol": "stdio", "command": "python3", "args": [gateway]}).to_string(),
    )
    .unwrap();
    let hook = webhook().await;
    std::fs::write(
        modules_dir.join("hook.json"),
        json!({"id": "hook", "direction": "output", "protocol": "http", "url": format!("{hook}/hook")}).to_string(),
    )
    .unwrap();
    let catalog = troupe_runtime::modules::load(&modules_dir, true);
    assert!(catalog.errors.is_empty(), "{:?}", catalog.errors);
    let modules = Modules::new(catalog).unwrap();
    let config = TroupeConfig {
        data_dir: dir.path().join("data"),
        ..TroupeConfig::default()
    };
    let ports = troupe_runtime::assembly::session_ports(
        &config,
        Arc::new(troupe_runtime::ScriptedModel::default()),
        Arc::new(troupe_actors::ports::ApproxTokens),
    );
    let store = Arc::new(troupe_store::memory::MemoryStore::new());
    let service = Service::start_with(
        &config,
        store,
        ports,
        None,
        troupe_service::StartOptions {
            live: None,
            modules: Some(modules.clone()),
            cluster: None,
            agent_errors: Vec::new(),
        },
    )
    .await
    .unwrap();
    // The gateway is up once it acknowledges.
    let frame = |id: &str| json!({"type": "reply", "id": id, "text": "hello", "status": "ok"});
    let started = Instant::now();
    loop {
        let d = ModuleDispatch {
            module: "gw".into(),
            payload: json!("warm up"),
            conversation_id: troupe_proto::ConversationId::new(),
            task_id: troupe_proto::TaskId::new(),
        };
        if modules.dispatch(d).await.is_ok() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the gateway did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    println!("| measure | p50 | p99 | note |");
    println!("|---|---:|---:|---|");
    for (module, note) in [
        (
            "gw",
            "stdio: a reply line written, its `ack` line read back (python3 gateway)",
        ),
        (
            "hook",
            "http: POST of the reply frame, 200 read back (axum on loopback, kept-alive)",
        ),
    ] {
        for i in 0..100 {
            modules.deliver(module, frame(&format!("w-{i}"))).await;
        }
        let mut times = Vec::with_capacity(RUNS);
        for i in 0..RUNS {
            let t = Instant::now();
            modules.deliver(module, frame(&format!("r-{i}"))).await;
            times.push(t.elapsed());
        }
        row(&format!("sync delivery to `{module}`"), times, note);
    }
    for (module, note) in [
        ("gw", "stdio: dispatch line, `ack` with its result"),
        ("hook", "http: POST, the JSON body as the result"),
    ] {
        let mut times = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let d = ModuleDispatch {
                module: module.into(),
                payload: json!({"n": 1}),
                conversation_id: troupe_proto::ConversationId::new(),
                task_id: troupe_proto::TaskId::new(),
            };
            let t = Instant::now();
            let answer = modules.dispatch(d).await.unwrap();
            times.push(t.elapsed());
            assert!(!answer.is_null());
        }
        row(&format!("dispatch to `{module}`"), times, note);
    }
    service.shutdown().await;
}
