//! Passivated conversations (virtual actors): what one costs in memory, passivated and
//! active, how long a reactivation takes, and one session holding a million conversations of
//! which ten thousand are active. Prints a table.
//!
//!     cargo bench -p troupe-tests --bench passivation
//!
//! One session, a SQLite rollout in a temporary directory (under `TROUPE_BENCH_DIR`, default
//! the system's), the scripted model, `passivate_after` = `PASSIVATE_AFTER`.
//! 1. `SAMPLE` conversations are opened (heap measured: per active conversation, no history),
//!    each is sent one message (per active conversation with one turn), then left idle until
//!    every one is passivated (per passivated conversation). The heap is counted by the
//!    global allocator (`cap`): exact live bytes of the Rust heap, the session's index, the
//!    Rollout's policy map and whatever else a conversation leaves behind included. SQLite's
//!    own page cache (C allocations) is not in it; RSS is printed beside it.
//! 2. Conversations are opened in batches of `BATCH` up to `TOTAL`, each batch left idle until
//!    it is passivated (so the process never holds more than a batch of live actors).
//! 3. The `SAMPLE` conversations of step 1 are reactivated one by one (each call times the
//!    session's reactivation: the actor's start and its restore window read from SQLite),
//!    and the heap and RSS are measured with `TOTAL` conversations held, `SAMPLE` active.
//!
//! `TROUPE_BENCH_TOTAL` (default 1,000,000) and `TROUPE_BENCH_SAMPLE` (default 10,000)
//! change the sizes.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_actors::conversation::live_conversations;
use troupe_actors::history::LocalSummarizer;
use troupe_actors::session::Standing;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::{ConversationId, OpenConversation, SessionId};
use troupe_runtime::ScriptedModel;
use troupe_store::SqliteRolloutStorage;

#[global_allocator]
static ALLOC: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

const PASSIVATE_AFTER: Duration = Duration::from_secs(10);
const BATCH: usize = 50_000;
/// Calls in flight at once while opening and messaging.
const IN_FLIGHT: usize = 64;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
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

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn start(dir: &std::path::Path) -> (SessionHandle, tokio::task::JoinHandle<()>) {
    let mut config = SessionConfig {
        data_dir: dir.to_path_buf(),
        max_conversations: 10_000_000,
        ..SessionConfig::default()
    };
    config.conversation.passivate_after = Some(PASSIVATE_AFTER);
    config.scheduler.limit = 2;
    config.scheduler.queue_capacity = 100_000;
    let storage = SqliteRolloutStorage::open_in(dir).unwrap();
    let ports = SessionPorts {
        model: Arc::new(ScriptedModel::default()),
        mcp: None,
        mcp_connector: None,
        exec: None,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: Some(Arc::new(storage)),
        agents: None,
    };
    SessionHandle::start(SessionId::new(), config, ports)
        .await
        .unwrap()
}

async fn open_many(session: &SessionHandle, n: usize) -> Vec<ConversationId> {
    futures::stream::iter(0..n)
        .map(|_| {
            let session = session.clone();
            async move { session.open(OpenConversation::default()).await.unwrap() }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await
}

/// Waits until at most `live` conversation actors are alive.
async fn passivated_down_to(live: usize) -> Duration {
    let started = Instant::now();
    while live_conversations() > live {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

fn kib(bytes: f64) -> String {
    format!("{:.2} KiB", bytes / 1024.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let total = env_usize("TROUPE_BENCH_TOTAL", 1_000_000);
    let sample = env_usize("TROUPE_BENCH_SAMPLE", 10_000);
    let base = std::env::var_os("TROUPE_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::tempdir_in(base).unwrap();
    let (session, _join) = start(dir.path()).await;
    passivated_down_to(0).await; // the root conversation
    let (heap0, rss0) = (ALLOC.allocated(), rss_kib());

    // 1. Memory per conversation.
    let ids = open_many(&session, sample).await;
    let (heap_open, rss_open) = (ALLOC.allocated(), rss_kib());
    futures::stream::iter(ids.iter().copied())
        .map(|c| {
            let session = session.clone();
            async move { session.message(c, "hello").await.unwrap() }
        })
        .buffer_unordered(IN_FLIGHT)
        .for_each(|_| async {})
        .await;
    let (heap_turn, rss_turn) = (ALLOC.allocated(), rss_kib());
    let waited = passivated_down_to(0).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // the last stops settle
    let (heap_passive, rss_passive) = (ALLOC.allocated(), rss_kib());
    let per = |heap: usize| (heap as f64 - heap0 as f64) / sample as f64;

    // 2. Up to `total` conversations, a batch at a time.
    let started = Instant::now();
    let mut held = sample;
    while held < total {
        let n = BATCH.min(total - held);
        open_many(&session, n).await;
        held += n;
        passivated_down_to(0).await;
        eprintln!(
            "{held} conversations held, {} MiB heap, {} MiB RSS, {:.0?}",
            ALLOC.allocated() >> 20,
            rss_kib() >> 10,
            started.elapsed()
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fill = started.elapsed();
    let (heap_held, rss_held) = (ALLOC.allocated(), rss_kib());

    // 3. Reactivate the sample, one at a time.
    let mut latencies = Vec::with_capacity(sample);
    let reactivating = Instant::now();
    for &c in &ids {
        assert_eq!(
            session.standing(c).await.unwrap(),
            Some(Standing::Passivated)
        );
        let t = Instant::now();
        session.conversation_actor(c).await.unwrap().unwrap();
        latencies.push(t.elapsed());
    }
    let reactivation = reactivating.elapsed();
    assert!(
        reactivation < PASSIVATE_AFTER,
        "measure before they idle out"
    );
    let active = live_conversations();
    let (heap_mixed, rss_mixed) = (ALLOC.allocated(), rss_kib());
    latencies.sort();

    println!("## Passivated conversations, one session (SQLite rollout, scripted model)");
    println!();
    println!(
        "size_of::<OpenConversation>() = {} B; sample {sample}, total {total}, passivate_after {PASSIVATE_AFTER:?}",
        std::mem::size_of::<OpenConversation>()
    );
    println!();
    println!("| measure | heap per conversation | RSS per conversation |");
    println!("|---|---:|---:|");
    let rss_per = |rss: u64| kib((rss as f64 - rss0 as f64) * 1024.0 / sample as f64);
    println!(
        "| active, just opened | {} | {} |",
        kib(per(heap_open)),
        rss_per(rss_open)
    );
    println!(
        "| active, one turn of history | {} | {} |",
        kib(per(heap_turn)),
        rss_per(rss_turn)
    );
    println!(
        "| passivated (one turn in the store) | {} | (RSS keeps freed pages) |",
        kib(per(heap_passive))
    );
    let _ = rss_passive;
    println!();
    println!("| run | figure |");
    println!("|---|---:|");
    println!(
        "| passivation of the sample after its idle period | {waited:.1?} after the last turn (period {PASSIVATE_AFTER:?}) |"
    );
    println!(
        "| reactivation, one at a time ({sample}) | p50 {:.0?}, p99 {:.0?}, max {:.0?}; {:.1?} in all |",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1],
        reactivation
    );
    println!(
        "| opening {} more conversations in batches of {BATCH}, each passivated | {fill:.1?} |",
        total - sample
    );
    println!(
        "| {total} held, all passivated | heap {} MiB ({} per conversation), RSS {} MiB |",
        (heap_held - heap0) >> 20,
        kib((heap_held - heap0) as f64 / total as f64),
        rss_held >> 10
    );
    println!(
        "| {total} held, {active} active | heap {} MiB, RSS {} MiB (RSS at start {} MiB) |",
        (heap_mixed - heap0) >> 20,
        rss_mixed >> 10,
        rss0 >> 10
    );
    session.shutdown().await.unwrap();
}
