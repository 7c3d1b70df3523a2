//! Restoring a long conversation (S6): time and records read, from its window (a rollout with
//! history checkpoints) and from its whole record (the same records without checkpoints, as
//! an older troupe wrote them and restored every rollout). Prints a table.
//!
//!     cargo bench -p troupe-tests --bench restore
//!
//! One conversation of `TURNS` scripted turns (history bounded to 64 items) is written to a
//! SQLite rollout through a real session; its records, checkpoints left out, are copied under
//! a second session id. Each restore starts a new incarnation of the session and restores the
//! conversation (`SessionHandle::restore`); the time is that call's, after the session started.
//! The database lives in a temporary directory under `TROUPE_BENCH_DIR` (default: the system
//! temporary directory).
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_actors::history::{HistoryLimits, LocalSummarizer};
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::{ConversationId, EventKind, OpenConversation, SessionId, StoragePolicy};
use troupe_runtime::ScriptedModel;
use troupe_store::SqliteRolloutStorage;

const TURNS: [usize; 2] = [1_000, 10_000];
const RUNS: usize = 10;

async fn start(
    dir: &std::path::Path,
    storage: &SqliteRolloutStorage,
    session_id: SessionId,
) -> (SessionHandle, tokio::task::JoinHandle<()>) {
    let mut config = SessionConfig {
        data_dir: dir.to_path_buf(),
        ..SessionConfig::default()
    };
    config.conversation.history = HistoryLimits {
        max_items: 64,
        max_tokens: 100_000,
        segment_items: 16,
    };
    let ports = SessionPorts {
        model: Arc::new(ScriptedModel::default()),
        mcp: None,
        mcp_connector: None,
        exec: None,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: Some(Arc::new(storage.clone())),
        agents: None,
    };
    SessionHandle::start(session_id, config, ports)
        .await
        .unwrap()
}

fn full() -> OpenConversation {
    OpenConversation {
        storage_policy: StoragePolicy::Full,
        ..OpenConversation::default()
    }
}

/// Restores `c` `RUNS` times: the p50 of the restore call and the records read by one.
async fn restore(
    dir: &std::path::Path,
    storage: &SqliteRolloutStorage,
    session_id: SessionId,
    c: ConversationId,
) -> (Duration, u64) {
    let mut times = Vec::new();
    let mut read = 0;
    for _ in 0..RUNS {
        let (session, join) = start(dir, storage, session_id).await;
        let before = storage.records_read();
        let started = Instant::now();
        session.restore(c, full()).await.unwrap();
        times.push(started.elapsed());
        read = storage.records_read() - before;
        session.shutdown().await.unwrap();
        join.await.unwrap();
    }
    times.sort();
    (times[times.len() / 2], read)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let base = std::env::var_os("TROUPE_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::tempdir_in(base).unwrap();
    let storage = SqliteRolloutStorage::open(dir.path().join("rollout.db")).unwrap();
    println!("| turns | records | from | restore p50 | records read |");
    println!("|---:|---:|---|---:|---:|");
    for turns in TURNS {
        let session_id = SessionId::new();
        let (session, join) = start(dir.path(), &storage, session_id).await;
        let c = session.open(full()).await.unwrap();
        for i in 0..turns {
            session.message(c, &format!("turn {i}")).await.unwrap();
        }
        session.shutdown().await.unwrap();
        join.await.unwrap();
        let records = storage.read_after(session_id, 0, usize::MAX).unwrap();
        let mine = records
            .iter()
            .filter(|r| r.conversation_id == Some(c))
            .count();
        // The same record as an older troupe wrote it: no checkpoints.
        let old_id = SessionId::new();
        let mut sink = storage.open_sink(old_id).unwrap();
        for r in records
            .iter()
            .filter(|r| !matches!(r.event, Some(EventKind::HistoryCheckpoint { .. })))
        {
            sink.append(r.conversation_id, r).unwrap();
        }
        sink.commit(true, records.last().unwrap().seq).unwrap();
        drop(sink);

        let (window, window_read) = restore(dir.path(), &storage, session_id, c).await;
        let (whole, whole_read) = restore(dir.path(), &storage, old_id, c).await;
        println!("| {turns} | {mine} | window (checkpoints) | {window:.1?} | {window_read} |");
        println!(
            "| {turns} | {mine} | whole record (no checkpoints) | {whole:.1?} | {whole_read} |"
        );
    }
}
