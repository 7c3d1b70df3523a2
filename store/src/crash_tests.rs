//! Acknowledged writes survive a SIGKILL of the process that made them.
//!
//! The parent test re-runs this test binary as a child that only runs [`crash_child`] (with
//! the database directory in an environment variable). The child writes messages and rollout
//! batches from several threads at once and prints a line after each acknowledged write; the
//! parent kills it with SIGKILL mid-stream, reopens the database and looks for every write
//! the child printed.

use super::backends::{Db, Kind};
use super::{
    MAX_PAGE_BYTES, PgRolloutStorage, PgStore, SqliteRolloutStorage, SqliteStore, Store, db_path,
};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::rollout::{RecordLevel, RecordMeta, RolloutRecord};
use troupe_proto::store::{ConversationRecord, ConversationState, NewMessage, SessionRecord};
use troupe_proto::{ConversationId, EventKind, EventName, Json, OpenConversation, Role, SessionId};

const CHILD_ENV: &str = "TROUPE_STORE_CRASH_DIR";
/// Set when the child writes to PostgreSQL: the database's URL.
const CHILD_URL_ENV: &str = "TROUPE_STORE_CRASH_URL";
const CHILD_TEST: &str = "crash_tests::crash_child";
/// The child stops on its own after this, should the parent be gone.
const CHILD_LIFETIME: Duration = Duration::from_secs(60);

/// Writes until killed when run as the child; passes at once otherwise.
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let path = db_path(std::path::Path::new(&dir));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (store, storage): (Arc<dyn Store>, Arc<dyn RolloutStorage>) =
        match std::env::var(CHILD_URL_ENV) {
            Ok(url) => (
                Arc::new(rt.block_on(PgStore::connect(&url)).unwrap()),
                Arc::new(PgRolloutStorage::connect(&url).unwrap()),
            ),
            Err(_) => (
                Arc::new(SqliteStore::open(&path).unwrap()),
                Arc::new(SqliteRolloutStorage::open(&path).unwrap()),
            ),
        };
    let session = SessionId::new();
    let conv = ConversationId::new();
    rt.block_on(async {
        store
            .create_session(SessionRecord {
                session_id: session,
                project_id: Some("crash".into()),
                title: None,
                created_ms: 1,
                root_conversation_id: conv,
                settings: Json::empty_object(),
                status: troupe_proto::store::SessionStatus::Active,
                updated_ms: 0,
            })
            .await
            .unwrap();
        store
            .put_conversation(ConversationRecord {
                conversation_id: conv,
                session_id: session,
                params: OpenConversation::default(),
                is_root: true,
                state: ConversationState::Open,
                created_ms: 1,
                closed_ms: None,
            })
            .await
            .unwrap();
    });
    // On a line of its own: libtest has printed `test <name> ... ` without a newline.
    println!("\nsession {session} {conv}");
    let deadline = Instant::now() + CHILD_LIFETIME;
    let sink_thread = std::thread::spawn(move || {
        let mut sink = storage.open_sink(session).unwrap();
        let mut seq = 0u64;
        while Instant::now() < deadline {
            for _ in 0..3 {
                seq += 1;
                sink.append(Some(conv), &record(seq, conv)).unwrap();
            }
            sink.commit(seq.is_multiple_of(4), seq).unwrap();
            println!("seq {seq}");
        }
    });
    rt.block_on(async {
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        i += 1;
                        let content = format!("w{w}-{i}");
                        let m = store
                            .append_message(NewMessage {
                                session_id: session,
                                conversation_id: conv,
                                task_id: None,
                                role: Role::User,
                                content: Some(content.clone()),
                                chars: content.len() as u64,
                                created_ms: i,
                                status: None,
                                kind: troupe_proto::store::MessageKind::Text,
                                metadata: None,
                            })
                            .await
                            .unwrap();
                        println!("msg {} {content}", m.message_id);
                    }
                })
            })
            .collect();
        for w in writers {
            w.await.unwrap();
        }
    });
    sink_thread.join().unwrap();
}

fn record(seq: u64, conv: ConversationId) -> RolloutRecord {
    RolloutRecord {
        seq,
        ts_ms: seq,
        conversation_id: Some(conv),
        task_id: None,
        kind: EventName::AssistantMessage,
        level: RecordLevel::Full,
        event: Some(EventKind::AssistantMessage {
            text: format!("record {seq}"),
        }),
        meta: RecordMeta::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill() {
    writes_survive_sigkill(Kind::Sqlite).await;
}

/// The same on PostgreSQL: the child writes to the parent's server, which outlives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill_on_postgres() {
    writes_survive_sigkill(Kind::Postgres).await;
}

async fn writes_survive_sigkill(backend: Kind) {
    let db = Db::fresh(backend);
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, db.dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(url) = &db.url {
        command.env(CHILD_URL_ENV, url);
    }
    let mut child = command.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut session = None;
    let mut messages = BTreeMap::new();
    let mut high_water = 0u64;
    let mut killed = false;
    while let Some(Ok(line)) = lines.next() {
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["session", s, c] => {
                session = Some((
                    s.parse::<SessionId>().unwrap(),
                    c.parse::<ConversationId>().unwrap(),
                ))
            }
            ["msg", id, content] => {
                messages.insert(id.parse::<u64>().unwrap(), (*content).to_owned());
            }
            ["seq", n] => high_water = high_water.max(n.parse().unwrap()),
            _ => {}
        }
        // Kill mid-stream, once both writers are well under way; lines already in the pipe
        // are acknowledged writes too and are read after the kill.
        if !killed && messages.len() >= 400 && high_water >= 300 {
            child.kill().unwrap();
            killed = true;
        }
    }
    let status = child.wait().unwrap();
    assert!(killed, "the child ended on its own: {status}");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{status}"
    );

    let (session, conv) = session.unwrap();
    let store = db.store().await;
    let page = store
        .messages(session, 1_000_000, MAX_PAGE_BYTES, None)
        .await
        .unwrap();
    let stored: BTreeMap<u64, String> = page
        .messages
        .into_iter()
        .map(|m| (m.message_id, m.content.unwrap()))
        .collect();
    for (id, content) in &messages {
        assert_eq!(
            stored.get(id),
            Some(content),
            "acknowledged message {id} lost"
        );
    }

    let storage = db.rollout();
    let records = storage.read_conversation(session, conv).unwrap();
    let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    assert!(seqs.len() as u64 >= high_water);
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert!(storage.last_seq(session).unwrap() >= high_water);
}
