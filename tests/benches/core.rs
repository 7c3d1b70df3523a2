//! Core benchmarks of the actor layer; prints a table.
//!
//!     cargo bench -p troupe-tests --bench core
//!
//! - orchestration overhead of one `message` (scripted model, no tools), beside a bare
//!   ractor call round trip measured in the same run;
//! - memory per idle open conversation with 100,000 open;
//! - open + close throughput.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use futures::StreamExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_actors::history::LocalSummarizer;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::{OpenConversation, SessionId, StoragePolicy};
use troupe_runtime::{ScriptedModel, ScriptedReply};

struct Echo;

/// The bare round trip's message: a reply port, as every call carries.
struct Ping(RpcReplyPort<u64>);
troupe_actors::local_message!(Ping);

#[ractor::async_trait]
impl Actor for Echo {
    type Msg = Ping;
    type State = u64;
    type Arguments = ();
    async fn pre_start(&self, _m: ActorRef<Self::Msg>, _a: ()) -> Result<u64, ActorProcessingErr> {
        Ok(0)
    }
    async fn handle(
        &self,
        _m: ActorRef<Self::Msg>,
        reply: Self::Msg,
        state: &mut u64,
    ) -> Result<(), ActorProcessingErr> {
        *state += 1;
        let _ = reply.0.send(*state);
        Ok(())
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 4
}

async fn session(dir: &std::path::Path, model: ScriptedModel) -> SessionHandle {
    let mut config = SessionConfig {
        data_dir: dir.to_path_buf(),
        ..SessionConfig::default()
    };
    config.root.storage_policy = StoragePolicy::Full;
    let ports = SessionPorts {
        model: Arc::new(model),
        mcp: None,
        mcp_connector: None,
        exec: None,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: None,
        agents: None,
    };
    SessionHandle::start(SessionId::new(), config, ports)
        .await
        .unwrap()
        .0
}

fn row(name: &str, value: String, note: &str) {
    println!("| {name:<48} | {value:>18} | {note} |");
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // On a worker thread, as actors and their callers run in the service.
    rt.block_on(async { tokio::spawn(run()).await.unwrap() });
}

async fn run() {
    println!("| measure | value | note |");
    println!("|---|---:|---|");

    // Bare ractor call round trip.
    let (echo, _) = Actor::spawn(None, Echo, ()).await.unwrap();
    for _ in 0..2_000 {
        ractor::call!(echo, Ping).unwrap();
    }
    let mut bare = Vec::with_capacity(20_000);
    for _ in 0..20_000 {
        let t = Instant::now();
        ractor::call!(echo, Ping).unwrap();
        bare.push(t.elapsed());
    }
    bare.sort();
    row(
        "ractor call round trip p50",
        format!("{:.2?}", percentile(&bare, 0.5)),
        "20,000 calls",
    );
    row(
        "ractor call round trip p99",
        format!("{:.2?}", percentile(&bare, 0.99)),
        "",
    );

    // One message through Session → Conversation → Scheduler → runner → model → rollout.
    let dir = tempfile::tempdir().unwrap();
    let n = 5_000;
    let replies: Vec<_> = (0..n + 200).map(|_| ScriptedReply::text("ok")).collect();
    let s = session(dir.path(), ScriptedModel::new(replies)).await;
    let mut c = s.open(OpenConversation::default()).await.unwrap();
    for _ in 0..200 {
        s.message(c, "warm up").await.unwrap();
    }
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        if i % 50 == 0 {
            c = s.open(OpenConversation::default()).await.unwrap();
        }
        let t = Instant::now();
        s.message(c, "hello").await.unwrap();
        lat.push(t.elapsed());
    }
    lat.sort();
    row(
        "message (scripted, no tools) p50",
        format!("{:.2?}", percentile(&lat, 0.5)),
        "5,000 messages, 50 per conversation, Full rollout",
    );
    row(
        "message (scripted, no tools) p99",
        format!("{:.2?}", percentile(&lat, 0.99)),
        "",
    );
    let ratio = percentile(&lat, 0.5).as_secs_f64() / percentile(&bare, 0.5).as_secs_f64();
    row(
        "message p50 / ractor call p50",
        format!("{ratio:.0}x"),
        "Session, Conversation, Scheduler, runner, model, ~6 events through the Rollout",
    );
    s.shutdown().await.unwrap();

    // Open + close throughput.
    let dir = tempfile::tempdir().unwrap();
    let s = session(dir.path(), ScriptedModel::default()).await;
    let cycles = 20_000;
    let t = Instant::now();
    for _ in 0..cycles {
        let c = s.open(OpenConversation::default()).await.unwrap();
        s.close(c).await.unwrap();
    }
    let seq = cycles as f64 / t.elapsed().as_secs_f64();
    row(
        "open + close, sequential",
        format!("{seq:.0}/s"),
        "20,000 cycles",
    );
    let t = Instant::now();
    futures::stream::iter(0..cycles)
        .for_each_concurrent(64, |_| {
            let s = s.clone();
            async move {
                let c = s.open(OpenConversation::default()).await.unwrap();
                s.close(c).await.unwrap();
            }
        })
        .await;
    let conc = cycles as f64 / t.elapsed().as_secs_f64();
    row(
        "open + close, 64 concurrent callers",
        format!("{conc:.0}/s"),
        "20,000 cycles",
    );
    s.shutdown().await.unwrap();

    // Memory per idle open conversation.
    let dir = tempfile::tempdir().unwrap();
    let s = session(dir.path(), ScriptedModel::default()).await;
    s.flush().await.unwrap();
    let before = rss_kib();
    let open = 100_000;
    for _ in 0..open {
        s.open(OpenConversation::default()).await.unwrap();
    }
    s.flush().await.unwrap();
    let after = rss_kib();
    let per = (after.saturating_sub(before)) as f64 / open as f64;
    row(
        "RSS per idle open conversation",
        format!("{per:.2} KiB"),
        "100,000 open (target <= 16 KiB)",
    );
    row("RSS with 100,000 open", format!("{} MiB", after / 1024), "");
    s.shutdown().await.unwrap();
}
