//! The SQLite store of `troupe serve`; prints a table.
//!
//!     cargo bench -p troupe-tests --bench store
//!
//! - `append_message` throughput, one caller and 64 concurrent callers (group commit), with
//!   the default durability (survives a process crash) and with `power_loss_durable`;
//! - rollout `append` + `commit` throughput from 1 and 8 sinks, batches of 1 and 16 records,
//!   with and without `sync`;
//! - `messages` page latency (50 messages at a random cursor) in a session of 100,000
//!   messages, in a database of 200,000;
//! - the Ttl sweep: 50,000 due messages and 50,000 due rollout records among everything above
//!   (the WAL truncation included), and a sweep with nothing due.
//!
//! The database lives in a temporary directory under `TROUPE_BENCH_DIR` (default: the system
//! temporary directory), so the figures are those of that file system.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::rollout::{RecordLevel, RecordMeta, RolloutRecord};
use troupe_proto::store::{ConversationRecord, ConversationState, NewMessage, SessionRecord};
use troupe_proto::{
    ConversationId, EventKind, EventName, Json, OpenConversation, Role, SessionId, StoragePolicy,
};
use troupe_store::{
    MAX_PAGE_BYTES, SqliteOptions, SqliteRolloutStorage, SqliteStore, Store, db_path,
};

const TEXT: &str = "The quick brown fox jumps over the lazy dog; a message of a typical chat turn, \
    about two hundred bytes long, so that rows and pages look like the real ones do in use.";

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn session(store: &SqliteStore) -> (SessionId, ConversationId) {
    let s = SessionId::new();
    let c = ConversationId::new();
    store
        .create_session(SessionRecord {
            session_id: s,
            project_id: Some("bench".into()),
            title: None,
            created_ms: 1,
            root_conversation_id: c,
            settings: Json::empty_object(),
            status: troupe_proto::store::SessionStatus::Active,
            updated_ms: 0,
        })
        .await
        .unwrap();
    store
        .put_conversation(ConversationRecord {
            conversation_id: c,
            session_id: s,
            params: OpenConversation::default(),
            is_root: true,
            state: ConversationState::Open,
            created_ms: 1,
            closed_ms: None,
        })
        .await
        .unwrap();
    (s, c)
}

fn msg(s: SessionId, c: ConversationId, i: u64) -> NewMessage {
    NewMessage {
        session_id: s,
        conversation_id: c,
        task_id: None,
        role: if i.is_multiple_of(2) {
            Role::User
        } else {
            Role::Assistant
        },
        content: Some(TEXT.to_owned()),
        chars: TEXT.len() as u64,
        created_ms: i,
        status: None,
        kind: troupe_proto::store::MessageKind::Text,
        metadata: None,
    }
}

/// Appends/s with `callers` concurrent callers, `total` messages in all.
async fn appends(store: &SqliteStore, callers: usize, total: usize) -> f64 {
    let (s, c) = session(store).await;
    let per = total / callers;
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..per {
                    store.append_message(msg(s, c, i as u64)).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (per * callers) as f64 / started.elapsed().as_secs_f64()
}

fn record(seq: u64, conv: ConversationId) -> RolloutRecord {
    RolloutRecord {
        seq,
        ts_ms: seq,
        conversation_id: Some(conv),
        task_id: None,
        kind: EventName::AssistantMessage,
        level: RecordLevel::Full,
        event: Some(EventKind::AssistantMessage { text: TEXT.into() }),
        meta: RecordMeta::default(),
    }
}

/// Records/s and the commit p50 with `sinks` sinks on threads of their own, each committing
/// `batch` records at a time, `records` per sink.
fn rollout(
    storage: &SqliteRolloutStorage,
    sinks: usize,
    batch: u64,
    sync: bool,
    records: u64,
) -> (f64, Duration) {
    let started = Instant::now();
    let mut commit_times: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..sinks)
            .map(|_| {
                scope.spawn(|| {
                    let session = SessionId::new();
                    let conv = ConversationId::new();
                    let mut sink = storage.open_sink(session).unwrap();
                    let mut times = Vec::new();
                    let mut seq = 0;
                    while seq < records {
                        for _ in 0..batch {
                            seq += 1;
                            sink.append(Some(conv), &record(seq, conv)).unwrap();
                        }
                        let t = Instant::now();
                        sink.commit(sync, seq).unwrap();
                        times.push(t.elapsed());
                    }
                    times
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let rate = (records * sinks as u64) as f64 / started.elapsed().as_secs_f64();
    commit_times.sort_unstable();
    (rate, pct(&commit_times, 0.5))
}

fn main() {
    let base = std::env::var_os("TROUPE_BENCH_DIR").map(std::path::PathBuf::from);
    let dir = match &base {
        Some(b) => tempfile::tempdir_in(b).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("database in {}", dir.path().display());
    println!();
    println!("| measure | value | note |");
    println!("|---|---:|---|");

    let path = db_path(dir.path());
    let store = SqliteStore::open(&path).unwrap();
    let row = |name: &str, v: String, note: &str| println!("| {name} | {v} | {note} |");
    rt.block_on(async {
        let rate = appends(&store, 1, 20_000).await;
        row(
            "append_message, 1 caller",
            format!("{rate:.0} /s"),
            "20,000 appends, one at a time",
        );
        let rate = appends(&store, 64, 100_000).await;
        row(
            "append_message, 64 callers",
            format!("{rate:.0} /s"),
            "100,000 appends; group commit",
        );
    });
    let durable_path = db_path(&dir.path().join("durable"));
    std::fs::create_dir_all(durable_path.parent().unwrap()).unwrap();
    let durable = SqliteStore::open_with(
        &durable_path,
        SqliteOptions {
            power_loss_durable: true,
            ..SqliteOptions::default()
        },
    )
    .unwrap();
    rt.block_on(async {
        let rate = appends(&durable, 1, 2_000).await;
        row(
            "append_message, 1 caller, power_loss_durable",
            format!("{rate:.0} /s"),
            "2,000 appends; an fsync each",
        );
        let rate = appends(&durable, 64, 20_000).await;
        row(
            "append_message, 64 callers, power_loss_durable",
            format!("{rate:.0} /s"),
            "20,000 appends; an fsync per group",
        );
    });
    drop(durable);

    let storage = SqliteRolloutStorage::open(&path).unwrap();
    for (sinks, batch, sync, records) in [
        (1, 1, false, 20_000),
        (1, 16, false, 100_000),
        (8, 1, false, 10_000),
        (8, 16, false, 25_000),
        (1, 16, true, 8_000),
        (8, 16, true, 8_000),
    ] {
        let (rate, p50) = rollout(&storage, sinks, batch, sync, records);
        row(
            &format!(
                "rollout append+commit, {sinks} sink(s), batch {batch}{}",
                if sync { ", sync" } else { "" }
            ),
            format!("{rate:.0} records/s"),
            &format!("commit p50 {p50:.1?}"),
        );
    }

    // Pages: one session of 100,000 messages among as many of another session.
    rt.block_on(async {
        let (s, c) = session(&store).await;
        let (o, oc) = session(&store).await;
        let mut first = None;
        let mut last = 0;
        let tasks: Vec<_> = (0..2)
            .map(|k| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut ids = Vec::new();
                    for i in 0..100_000u64 {
                        let m = if k == 0 { msg(s, c, i) } else { msg(o, oc, i) };
                        ids.push(store.append_message(m).await.unwrap().message_id);
                    }
                    ids
                })
            })
            .collect();
        for (k, t) in tasks.into_iter().enumerate() {
            let ids = t.await.unwrap();
            if k == 0 {
                first = ids.first().copied();
                last = *ids.last().unwrap();
            }
        }
        let first = first.unwrap();
        let mut times = Vec::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..5_000 {
            // xorshift: a cursor anywhere in the session.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let before = first + 200 + x % (last - first - 200);
            let t = Instant::now();
            let page = store
                .messages(s, 50, MAX_PAGE_BYTES, Some(before))
                .await
                .unwrap();
            times.push(t.elapsed());
            assert_eq!(page.messages.len(), 50);
        }
        times.sort_unstable();
        row(
            "messages page of 50, p50",
            format!("{:.1?}", pct(&times, 0.5)),
            "5,000 pages at random cursors; 100,000-message session",
        );
        row(
            "messages page of 50, p99",
            format!("{:.1?}", pct(&times, 0.99)),
            "",
        );
        let t = Instant::now();
        let page = store.messages(s, 50, MAX_PAGE_BYTES, None).await.unwrap();
        row(
            "messages newest page of 50",
            format!("{:.1?}", t.elapsed()),
            "cold statement cache on that reader",
        );
        assert_eq!(page.messages.len(), 50);
    });
    // The Ttl sweep, among everything written above.
    rt.block_on(async {
        let (s, c) = session(&store).await;
        store
            .put_conversation(ConversationRecord {
                conversation_id: c,
                session_id: s,
                params: OpenConversation {
                    storage_policy: StoragePolicy::Ttl { secs: 1 },
                    ..OpenConversation::default()
                },
                is_root: true,
                state: ConversationState::Open,
                created_ms: 1,
                closed_ms: None,
            })
            .await
            .unwrap();
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0..50_000u64 / 64 {
                        store.append_message(msg(s, c, i)).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let t = Instant::now();
        let n = store.sweep_due(u64::MAX).await.unwrap();
        let took = t.elapsed();
        row(
            "ttl sweep of messages",
            format!("{:.0} messages/s", n as f64 / took.as_secs_f64()),
            &format!("{n} due among ~370,000, in {took:.1?} with the WAL truncation"),
        );
        let t = Instant::now();
        assert_eq!(store.sweep_due(u64::MAX).await.unwrap(), 0);
        row(
            "ttl sweep of messages, nothing due",
            format!("{:.1?}", t.elapsed()),
            "the expiry index holds no row",
        );
    });
    let conv = ConversationId::new();
    let mut sink = storage.open_sink(SessionId::new()).unwrap();
    for seq in 1..=50_000u64 {
        let mut r = record(seq, conv);
        r.meta.expires_ms = Some(seq);
        sink.append(Some(conv), &r).unwrap();
        if seq % 256 == 0 {
            sink.commit(false, seq).unwrap();
        }
    }
    sink.commit(true, 50_000).unwrap();
    let t = Instant::now();
    let report = storage.sweep_due(u64::MAX).unwrap();
    let took = t.elapsed();
    row(
        "ttl sweep of rollout records",
        format!(
            "{:.0} records/s",
            report.downgraded as f64 / took.as_secs_f64()
        ),
        &format!(
            "{} due among ~520,000, in {took:.1?} with the WAL truncation",
            report.downgraded
        ),
    );
    let t = Instant::now();
    assert_eq!(storage.sweep_due(u64::MAX).unwrap().downgraded, 0);
    row(
        "ttl sweep of rollout records, nothing due",
        format!("{:.1?}", t.elapsed()),
        "the expiry index holds no row",
    );
    drop(sink);

    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let wal = path.with_extension("db-wal");
    row(
        "database size",
        format!("{:.1} MiB", (size(&path) + size(&wal)) as f64 / 1048576.0),
        "file + WAL after everything above",
    );
}
