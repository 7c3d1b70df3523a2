//! `troupe chat --once` against the local test model server: wall time and peak RSS of the
//! whole process over repeated runs, for a text turn and a turn with one tool call.
//!
//!     cargo build --release -p troupe && cargo bench -p troupe-tests --bench chat_once
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use nix::sys::resource::{UsageWho, getrusage};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use troupe_test_support::{ModelServer, Reply};

const RUNS: usize = 30;

fn binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("troupe");
    assert!(
        bin.exists(),
        "build it first: cargo build --release -p troupe"
    );
    bin
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Runs the command once; returns its wall time and its peak RSS in KiB.
fn run(cmd: &mut std::process::Command) -> (Duration, u64) {
    let t = Instant::now();
    let status = cmd.status().unwrap();
    let wall = t.elapsed();
    assert!(status.success());
    // ru_maxrss of RUSAGE_CHILDREN is the largest waited-for child so far; each run is
    // measured in a fresh process below, so this is that run's peak.
    let rss = getrusage(UsageWho::RUSAGE_CHILDREN).unwrap().max_rss() as u64;
    (wall, rss)
}

fn main() {
    let scenario = std::env::args().nth(1);
    if let Some(s) = scenario.as_deref().filter(|s| s.starts_with("scenario=")) {
        return child(s.trim_start_matches("scenario="));
    }
    println!("| turn | tokenizer | runs | wall p50 | wall p90 | wall max | peak RSS max |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (scenario, tokenizer) in [
        ("text", "approx"),
        ("tool", "approx"),
        ("text", "gpt-4o"),
        ("tool", "gpt-4o"),
    ] {
        let mut walls = Vec::new();
        let mut peak = 0;
        for _ in 0..RUNS {
            // A fresh measuring process per run, so RUSAGE_CHILDREN holds only that run.
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .arg(format!("scenario={scenario}:{tokenizer}"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let line = String::from_utf8(out.stdout).unwrap();
            let (wall_us, rss) = line.trim().split_once(' ').unwrap();
            walls.push(Duration::from_micros(wall_us.parse().unwrap()));
            peak = peak.max(rss.parse::<u64>().unwrap());
        }
        walls.sort();
        println!(
            "| {scenario} | {tokenizer} | {RUNS} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} MiB |",
            percentile(&walls, 0.5).as_secs_f64() * 1e3,
            percentile(&walls, 0.9).as_secs_f64() * 1e3,
            walls.last().unwrap().as_secs_f64() * 1e3,
            peak as f64 / 1024.0
        );
    }
}

/// One measured run: start the server, run the CLI once, print "wall_us rss_kib".
fn child(spec: &str) {
    let (scenario, tokenizer) = spec.split_once(':').unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(ModelServer::start());
    if scenario == "tool" {
        server.push(Reply::tool_call("update_plan", ["{\"plan\":[]}"]));
    }
    server.push(Reply::text(["Hello ", "there."]));
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(binary());
    cmd.args([
        "chat",
        "--once",
        "say hello",
        "--provider",
        "openai-chat",
        "--model",
        "gpt-4o-mini",
    ])
    .args(["--base-url", &server.base_url(), "--api-key-env", ""])
    .args(["--tokenizer-model", tokenizer])
    .arg("--data-dir")
    .arg(dir.path())
    .arg("--log-dir")
    .arg(dir.path())
    .env_remove("TROUPE_CONFIG")
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    let (wall, rss) = run(&mut cmd);
    println!("{} {rss}", wall.as_micros());
    drop(server);
}
