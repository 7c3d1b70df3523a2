//! The store of `troupe serve` on SQLite and on PostgreSQL, side by side; prints a table.
//!
//!     cargo bench -p troupe-tests --bench store_backends
//!
//! Four set-ups, each on a store of its own:
//! - `sqlite`: `<dir>/troupe.db`, the default (`synchronous = NORMAL`: a write survives a crash
//!   of the process, the WAL is fsynced at checkpoints);
//! - `sqlite, power_loss_durable`: an fsync per group commit;
//! - `postgres`: a local PostgreSQL 15 server with its default durability (`fsync = on`,
//!   `synchronous_commit = on`: every commit waits for its WAL flush), over TCP on loopback;
//! - `postgres, synchronous_commit off`: the same server, commits not waiting for the flush
//!   (what survives is the same as SQLite's default: a crash of troupe, not of the server).
//!
//! Measured: `append_message` throughput (1 and 16 callers), a message's whole life
//! (`append_message` queued, `start_message`, `finish_message` with a reply) per second (1 and
//! 16 callers), rollout `append` + `commit` throughput (1 and 8 sinks, batches of 16, without
//! `sync`), and the latency of a page of 50 messages at a random cursor in a session of
//! 20,000 messages.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::rollout::{RecordLevel, RecordMeta, RolloutRecord};
use troupe_proto::store::{
    ConversationRecord, ConversationState, FinishMessage, MessageStatus, NewMessage, SessionRecord,
};
use troupe_proto::{ConversationId, EventKind, EventName, Json, OpenConversation, Role, SessionId};
use troupe_store::{
    MAX_PAGE_BYTES, PgRolloutStorage, PgStore, SqliteOptions, SqliteRolloutStorage, SqliteStore,
    Store, db_path,
};

const TEXT: &str = "The quick brown fox jumps over the lazy dog; a message of a typical chat turn, \
    about two hundred bytes long, so that rows and pages look like the real ones do in use.";

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn session(store: &dyn Store) -> (SessionId, ConversationId) {
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

fn msg(s: SessionId, c: ConversationId, role: Role, status: Option<MessageStatus>) -> NewMessage {
    NewMessage {
        session_id: s,
        conversation_id: c,
        task_id: None,
        role,
        content: Some(TEXT.to_owned()),
        chars: TEXT.len() as u64,
        created_ms: 1,
        status,
        kind: troupe_proto::store::MessageKind::Text,
        metadata: None,
    }
}

/// Operations/s of `op` run `total` times by `callers` concurrent callers, each in a session
/// of its own (as the service's conversations are).
async fn rate<F, Fut>(store: &Arc<dyn Store>, callers: usize, total: usize, op: F) -> f64
where
    F: Fn(Arc<dyn Store>, SessionId, ConversationId) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let mut targets = Vec::new();
    for _ in 0..callers {
        targets.push(session(&**store).await);
    }
    let per = total / callers;
    let started = Instant::now();
    let tasks: Vec<_> = targets
        .into_iter()
        .map(|(s, c)| {
            let (store, op) = (store.clone(), op.clone());
            tokio::spawn(async move {
                for _ in 0..per {
                    op(store.clone(), s, c).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (per * callers) as f64 / started.elapsed().as_secs_f64()
}

async fn append(store: Arc<dyn Store>, s: SessionId, c: ConversationId) {
    store
        .append_message(msg(s, c, Role::Assistant, None))
        .await
        .unwrap();
}

/// A message's life: stored queued, started, ended with its reply.
async fn lifecycle(store: Arc<dyn Store>, s: SessionId, c: ConversationId) {
    let m = store
        .append_message(msg(s, c, Role::User, Some(MessageStatus::Queued)))
        .await
        .unwrap();
    store.start_message(m.message_id).await.unwrap();
    store
        .finish_message(FinishMessage {
            message_id: m.message_id,
            status: MessageStatus::Completed,
            task_id: None,
            reply: Some(msg(s, c, Role::Assistant, None)),
            items: Vec::new(),
            session_status: None,
        })
        .await
        .unwrap();
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

/// Records/s with `sinks` sinks on threads of their own, batches of 16, `records` per sink.
fn rollout(storage: &Arc<dyn RolloutStorage>, sinks: usize, records: u64) -> f64 {
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..sinks {
            scope.spawn(|| {
                let conv = ConversationId::new();
                let mut sink = storage.open_sink(SessionId::new()).unwrap();
                let mut seq = 0;
                while seq < records {
                    for _ in 0..16 {
                        seq += 1;
                        sink.append(Some(conv), &record(seq, conv)).unwrap();
                    }
                    sink.commit(false, seq).unwrap();
                }
            });
        }
    });
    (records * sinks as u64) as f64 / started.elapsed().as_secs_f64()
}

/// Page latencies (p50, p99) at random cursors in a session of 20,000 messages.
async fn pages(store: &Arc<dyn Store>) -> (Duration, Duration) {
    let (s, c) = session(&**store).await;
    let mut ids = Vec::new();
    let writers: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for _ in 0..20_000 / 8 {
                    let m = store
                        .append_message(msg(s, c, Role::Assistant, None))
                        .await
                        .unwrap();
                    ids.push(m.message_id);
                }
                ids
            })
        })
        .collect();
    for w in writers {
        ids.extend(w.await.unwrap());
    }
    ids.sort_unstable();
    let mut times = Vec::new();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..2_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let before = ids[200 + (x as usize) % (ids.len() - 200)];
        let t = Instant::now();
        let page = store
            .messages(s, 50, MAX_PAGE_BYTES, Some(before))
            .await
            .unwrap();
        times.push(t.elapsed());
        assert_eq!(page.messages.len(), 50);
    }
    times.sort_unstable();
    (pct(&times, 0.5), pct(&times, 0.99))
}

struct Setup {
    name: &'static str,
    store: Arc<dyn Store>,
    rollout: Arc<dyn RolloutStorage>,
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = |sub: &str, durable: bool| {
        let path = db_path(&dir.path().join(sub));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let store = SqliteStore::open_with(
            &path,
            SqliteOptions {
                power_loss_durable: durable,
                ..SqliteOptions::default()
            },
        )
        .unwrap();
        (
            Arc::new(store) as Arc<dyn Store>,
            Arc::new(SqliteRolloutStorage::open(path.with_file_name("rollout.db")).unwrap())
                as Arc<dyn RolloutStorage>,
        )
    };
    let server = troupe_test_postgres::durable_server();
    let postgres = |options: &str| {
        let url = format!("{}{options}", server.fresh_database());
        let store = rt.block_on(PgStore::connect(&url)).unwrap();
        (
            Arc::new(store) as Arc<dyn Store>,
            Arc::new(PgRolloutStorage::connect(&url).unwrap()) as Arc<dyn RolloutStorage>,
        )
    };
    let mut setups = Vec::new();
    for (name, (store, rollout)) in [
        ("sqlite", sqlite("a", false)),
        ("sqlite, power_loss_durable", sqlite("b", true)),
        ("postgres", postgres("")),
        (
            "postgres, synchronous_commit off",
            postgres("?options=-c%20synchronous_commit%3Doff"),
        ),
    ] {
        setups.push(Setup {
            name,
            store,
            rollout,
        });
    }
    println!(
        "| measure | {} |",
        setups
            .iter()
            .map(|s| s.name)
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---:|".repeat(setups.len()));
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut put = |name: &str, value: String| match rows.iter_mut().find(|(n, _)| n == name) {
        Some((_, v)) => v.push(value),
        None => rows.push((name.to_owned(), vec![value])),
    };
    for setup in &setups {
        eprintln!("measuring {}", setup.name);
        rt.block_on(async {
            let r = rate(&setup.store, 1, 2_000, append).await;
            put("append_message, 1 caller", format!("{r:.0} /s"));
            let r = rate(&setup.store, 16, 16_000, append).await;
            put("append_message, 16 callers", format!("{r:.0} /s"));
            let r = rate(&setup.store, 1, 500, lifecycle).await;
            put(
                "message queued → started → finished with its reply, 1 caller",
                format!("{r:.0} /s"),
            );
            let r = rate(&setup.store, 16, 4_000, lifecycle).await;
            put(
                "message queued → started → finished with its reply, 16 callers",
                format!("{r:.0} /s"),
            );
        });
        let r = rollout(&setup.rollout, 1, 16_000);
        put(
            "rollout append+commit, 1 sink, batch 16",
            format!("{r:.0} records/s"),
        );
        let r = rollout(&setup.rollout, 8, 4_000);
        put(
            "rollout append+commit, 8 sinks, batch 16",
            format!("{r:.0} records/s"),
        );
        let (p50, p99) = rt.block_on(pages(&setup.store));
        put("messages page of 50, p50", format!("{p50:.1?}"));
        put("messages page of 50, p99", format!("{p99:.1?}"));
    }
    for (name, values) in rows {
        println!("| {name} | {} |", values.join(" | "));
    }
}
