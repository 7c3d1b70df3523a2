//! The rollout storages: append, commit, reads, the Ttl sweep, high water, reopen, the
//! conformance checks and the resume property, on SQLite and on PostgreSQL (`sqlite::`,
//! `postgres::`, `*_properties::`); then what only SQLite has (its files, its migrations).

use super::backends::{Db, Kind};
use super::{SqliteRolloutStorage, SqliteStore, db_path};
use std::collections::HashSet;
use std::sync::Arc;
use tempfile::TempDir;
use troupe_actors::rollout::conformance::{full, ttl};
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::rollout::{RecordLevel, RecordMeta, RolloutRecord, downgrade};
use troupe_proto::EventName;
use troupe_proto::{ConversationId, EventKind, SessionId, StoragePolicy};

fn open_sqlite() -> (TempDir, SqliteRolloutStorage) {
    let dir = tempfile::tempdir().unwrap();
    let storage = SqliteRolloutStorage::open(db_path(dir.path())).unwrap();
    (dir, storage)
}

/// A new rollout storage on `backend`, and where it lives.
fn open(backend: Kind) -> (Db, Arc<dyn RolloutStorage>) {
    let db = Db::fresh(backend);
    let storage = db.rollout();
    (db, storage)
}

fn seqs(records: &[RolloutRecord]) -> Vec<u64> {
    records.iter().map(|r| r.seq).collect()
}

fn nothing_is_visible_before_commit_and_everything_after(backend: Kind) {
    let (_dir, storage) = open(backend);
    let session = SessionId::new();
    let conv = ConversationId::new();
    let mut sink = storage.open_sink(session).unwrap();
    let a = full(1, 10, Some(conv), "a");
    let b = full(2, 11, None, "session-level");
    sink.append(Some(conv), &a).unwrap();
    sink.append(None, &b).unwrap();
    assert!(storage.read_after(session, 0, 10).unwrap().is_empty());
    assert_eq!(storage.last_seq(session).unwrap(), 0);
    sink.commit(false, 2).unwrap();
    assert_eq!(
        storage.read_after(session, 0, 10).unwrap(),
        vec![a.clone(), b]
    );
    assert_eq!(storage.read_conversation(session, conv).unwrap(), vec![a]);
    assert!(
        storage
            .read_conversation(session, ConversationId::new())
            .unwrap()
            .is_empty()
    );
    assert_eq!(storage.last_seq(session).unwrap(), 2);
}

fn read_after_pages_in_seq_order_per_session(backend: Kind) {
    let (_dir, storage) = open(backend);
    let session = SessionId::new();
    let other = SessionId::new();
    let convs = [ConversationId::new(), ConversationId::new()];
    let mut sink = storage.open_sink(session).unwrap();
    let mut noise = storage.open_sink(other).unwrap();
    for seq in 1..=50u64 {
        let c = convs[(seq % 2) as usize];
        sink.append(Some(c), &full(seq, seq, Some(c), "x")).unwrap();
        noise.append(None, &full(seq, seq, None, "n")).unwrap();
        if seq % 7 == 0 {
            sink.commit(seq % 14 == 0, seq).unwrap();
            noise.commit(false, seq).unwrap();
        }
    }
    sink.commit(true, 50).unwrap();
    noise.commit(false, 50).unwrap();
    assert_eq!(
        seqs(&storage.read_after(session, 0, 10).unwrap()),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        seqs(&storage.read_after(session, 45, 10).unwrap()),
        (46..=50).collect::<Vec<_>>()
    );
    assert!(storage.read_after(session, 50, 10).unwrap().is_empty());
    assert!(
        storage
            .read_after(session, u64::MAX, 10)
            .unwrap()
            .is_empty()
    );
    assert!(storage.read_after(session, 0, 0).unwrap().is_empty());
    let mut cursor = 0;
    let mut all = Vec::new();
    loop {
        let page = storage.read_after(session, cursor, 8).unwrap();
        let Some(last) = page.last() else { break };
        cursor = last.seq;
        all.extend(seqs(&page));
    }
    assert_eq!(all, (1..=50).collect::<Vec<_>>());
    let conv0 = seqs(&storage.read_conversation(session, convs[0]).unwrap());
    assert_eq!(conv0, (2..=50).step_by(2).collect::<Vec<_>>());
}

fn the_high_water_mark_outlives_unrecorded_numbers(backend: Kind) {
    let (dir, storage) = open(backend);
    let session = SessionId::new();
    let mut sink = storage.open_sink(session).unwrap();
    sink.append(None, &full(3, 1, None, "x")).unwrap();
    sink.commit(false, 9).unwrap();
    assert_eq!(storage.last_seq(session).unwrap(), 9);
    // A lower mark never lowers it.
    sink.commit(false, 4).unwrap();
    assert_eq!(storage.last_seq(session).unwrap(), 9);
    sink.append(None, &full(12, 1, None, "y")).unwrap();
    sink.commit(false, 10).unwrap();
    assert_eq!(storage.last_seq(session).unwrap(), 12);
    // A batch that records its own mark (no mark written), then marks past every record.
    sink.append(None, &full(13, 1, None, "z")).unwrap();
    sink.commit(false, 13).unwrap();
    assert_eq!(storage.last_seq(session).unwrap(), 13);
    sink.commit(false, 15).unwrap();
    assert_eq!(storage.last_seq(session).unwrap(), 15);
    sink.append(None, &full(16, 1, None, "w")).unwrap();
    sink.commit(false, 16).unwrap();
    assert_eq!(storage.last_seq(session).unwrap(), 16);
    drop(sink);
    drop(storage);
    let storage = dir.rollout();
    assert_eq!(storage.last_seq(session).unwrap(), 16);
    assert_eq!(storage.last_seq(SessionId::new()).unwrap(), 0);
}

/// Every byte of the database's files (the database, its WAL and shared-memory index).
fn file_bytes(db: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    for suffix in ["", "-wal", "-shm"] {
        let mut path = db.as_os_str().to_owned();
        path.push(suffix);
        if let Ok(bytes) = std::fs::read(&path) {
            out.extend(bytes);
        }
    }
    out
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn a_sweep_leaves_no_byte_of_due_content_in_the_files() {
    let (dir, storage) = open_sqlite();
    let db = db_path(dir.path());
    let session = SessionId::new();
    let conv = ConversationId::new();
    let mut sink = storage.open_sink(session).unwrap();
    // One record small enough for its page, one that spills into overflow pages.
    let small = ttl(1, 10, 100, Some(conv), "CANARY-SMALL-9931");
    let big_text = format!("CANARY-BIG-7702 {}", "x".repeat(20_000));
    let big = ttl(2, 10, 100, Some(conv), &big_text);
    let later = ttl(3, 10, 900, Some(conv), "CANARY-LATER-1180");
    for r in [&small, &big, &later] {
        sink.append(r.conversation_id, r).unwrap();
    }
    sink.commit(true, 3).unwrap();
    let before = file_bytes(&db);
    assert!(contains(&before, "CANARY-SMALL-9931") && contains(&before, "CANARY-BIG-7702"));
    let report = storage.sweep_due(100).unwrap();
    assert_eq!((report.downgraded, report.failures), (2, 0));
    let after = file_bytes(&db);
    assert!(
        !contains(&after, "CANARY-SMALL-9931"),
        "small content left in the files"
    );
    assert!(
        !contains(&after, "CANARY-BIG-7702"),
        "big content left in the files"
    );
    assert!(
        contains(&after, "CANARY-LATER-1180"),
        "content not yet due stays"
    );
    let got = storage.read_conversation(session, conv).unwrap();
    assert_eq!(got[0], downgrade(small));
    assert_eq!(got[1], downgrade(big));
    assert_eq!(
        got[1].meta.chars,
        Some(big_text.len() as u64),
        "headers stay"
    );
    assert_eq!(got[2], later);
    assert_eq!(storage.sweep_due(100).unwrap().downgraded, 0, "idempotent");
    // The sweep reads due rows through the expiry index.
    let raw = rusqlite::Connection::open(&db).unwrap();
    let plan: String = raw
        .query_row(
            "EXPLAIN QUERY PLAN SELECT seq FROM rollout_events WHERE expires_ms <= 5 LIMIT 9",
            [],
            |r| r.get(3),
        )
        .unwrap();
    assert!(plan.contains("rollout_events_by_expiry"), "{plan}");
}

fn a_due_record_that_does_not_parse_is_rebuilt_from_its_columns(backend: Kind) {
    let (dir, storage) = open(backend);
    let session = SessionId::new();
    let conv = ConversationId::new();
    let mut sink = storage.open_sink(session).unwrap();
    let record = ttl(4, 10, 20, Some(conv), "CANARY-CORRUPT-5521");
    sink.append(Some(conv), &record).unwrap();
    sink.commit(false, 4).unwrap();
    dir.raw("UPDATE rollout_events SET record = '{\"seq\":4, CANARY-CORRUPT-5521'");
    assert_eq!(storage.sweep_due(20).unwrap().downgraded, 1);
    let got = storage.read_conversation(session, conv).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (
            got[0].seq,
            got[0].ts_ms,
            got[0].conversation_id,
            got[0].task_id
        ),
        (4, 10, Some(conv), record.task_id)
    );
    assert_eq!(got[0].kind, EventName::AssistantMessage);
    assert_eq!(got[0].level, RecordLevel::Headers);
    // On SQLite the sweep also leaves no byte of it in the files.
    if backend == Kind::Sqlite {
        assert!(!contains(
            &file_bytes(&db_path(dir.dir.path())),
            "CANARY-CORRUPT-5521"
        ));
    }
}

fn forget_writes_pending_records_first(backend: Kind) {
    let (_dir, storage) = open(backend);
    let session = SessionId::new();
    let conv = ConversationId::new();
    let mut sink = storage.open_sink(session).unwrap();
    sink.append(Some(conv), &full(1, 1, Some(conv), "first"))
        .unwrap();
    sink.append(Some(conv), &full(2, 1, Some(conv), "last"))
        .unwrap();
    sink.forget(conv).unwrap();
    assert_eq!(
        seqs(&storage.read_conversation(session, conv).unwrap()),
        vec![1, 2]
    );
    sink.forget(conv).unwrap();
}

/// Records written before expiries were stored (schema 2) are dated from their conversation's
/// `conversation_opened` policy by the migration, and swept like new ones.
#[test]
fn records_from_before_expiries_are_dated_by_the_migration() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let session = SessionId::new();
    let (ttl_conv, full_conv) = (ConversationId::new(), ConversationId::new());
    let opened =
        |seq: u64, conv: ConversationId, policy: StoragePolicy, text: &str| RolloutRecord {
            seq,
            ts_ms: 1_000,
            conversation_id: Some(conv),
            task_id: None,
            kind: EventName::ConversationOpened,
            level: RecordLevel::Full,
            event: Some(EventKind::ConversationOpened {
                storage_policy: policy,
                base_instructions: None,
                user_instructions: Some(text.into()),
            }),
            meta: RecordMeta::default(),
        };
    let rows = [
        opened(
            1,
            ttl_conv,
            StoragePolicy::Ttl { secs: 5 },
            "CANARY-OLD-TTL-OPENED",
        ),
        full(2, 3_000, Some(ttl_conv), "CANARY-OLD-TTL"),
        opened(3, full_conv, StoragePolicy::Full, "CANARY-OLD-FULL-OPENED"),
        full(4, 3_000, Some(full_conv), "CANARY-OLD-FULL"),
    ];
    {
        let mut conn = super::conn::open(&path, super::conn::Role::Writer).unwrap();
        super::schema::migrate_to(&mut conn, 2).unwrap();
        for r in &rows {
            conn.execute(
                "INSERT INTO rollout_events (session_id, seq, conversation_id, task_id, kind, ts_ms, level, record)
                 VALUES (?1, ?2, ?3, NULL, ?4, ?5, 'full', ?6)",
                rusqlite::params![
                    session.to_string(),
                    r.seq as i64,
                    r.conversation_id.map(|c| c.to_string()),
                    r.kind.as_str(),
                    r.ts_ms as i64,
                    serde_json::to_string(r).unwrap(),
                ],
            )
            .unwrap();
        }
        // A record whose JSON is broken does not stop the migration.
        conn.execute(
            "INSERT INTO rollout_events (session_id, seq, conversation_id, kind, ts_ms, level, record)
             VALUES (?1, 9, ?2, 'conversation_opened', 1, 'full', '{')",
            rusqlite::params![SessionId::new().to_string(), ConversationId::new().to_string()],
        )
        .unwrap();
    }
    let storage = SqliteRolloutStorage::open(&path).unwrap();
    assert_eq!(
        storage.sweep_due(5_999).unwrap().downgraded,
        0,
        "nothing due yet"
    );
    assert_eq!(
        storage.sweep_due(6_000).unwrap().downgraded,
        1,
        "the opened record (1 s + 5 s)"
    );
    assert_eq!(
        storage.sweep_due(8_000).unwrap().downgraded,
        1,
        "the message (3 s + 5 s)"
    );
    let got = storage.read_conversation(session, ttl_conv).unwrap();
    assert!(got.iter().all(|r| r.level == RecordLevel::Headers));
    assert_eq!(
        storage.read_conversation(session, full_conv).unwrap(),
        rows[2..].to_vec(),
        "a Full conversation keeps everything"
    );
    assert_eq!(storage.sweep_due(u64::MAX).unwrap().downgraded, 0);
    let bytes = file_bytes(&path);
    assert!(!contains(&bytes, "CANARY-OLD-TTL"), "no ttl content left");
    assert!(contains(&bytes, "CANARY-OLD-FULL") && contains(&bytes, "CANARY-OLD-FULL-OPENED"));
}

fn a_duplicate_seq_fails_its_batch_only(backend: Kind) {
    let (_dir, storage) = open(backend);
    let session = SessionId::new();
    let other = SessionId::new();
    let mut sink = storage.open_sink(session).unwrap();
    sink.append(None, &full(1, 1, None, "a")).unwrap();
    sink.commit(false, 1).unwrap();
    sink.append(None, &full(2, 1, None, "b")).unwrap();
    sink.append(None, &full(1, 1, None, "again")).unwrap();
    let err = sink.commit(false, 2).unwrap_err();
    assert_eq!(err.op, "write");
    assert!(err.message.contains("seq 1"), "{err}");
    // The failed batch left nothing behind, and the sink goes on.
    assert_eq!(seqs(&storage.read_after(session, 0, 10).unwrap()), vec![1]);
    sink.append(None, &full(2, 1, None, "b")).unwrap();
    sink.commit(false, 2).unwrap();
    assert_eq!(
        seqs(&storage.read_after(session, 0, 10).unwrap()),
        vec![1, 2]
    );
    let mut sink2 = storage.open_sink(other).unwrap();
    sink2.append(None, &full(1, 1, None, "a")).unwrap();
    sink2.commit(false, 1).unwrap();
}

fn a_corrupt_record_is_an_error_naming_it(backend: Kind) {
    let (dir, storage) = open(backend);
    let session = SessionId::new();
    let mut sink = storage.open_sink(session).unwrap();
    sink.append(None, &full(7, 1, None, "a")).unwrap();
    sink.commit(false, 7).unwrap();
    dir.raw("UPDATE rollout_events SET record = '{'");
    let err = storage.read_after(session, 0, 10).unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("session {session}, seq 7")),
        "{err}"
    );
}

fn many_sinks_commit_concurrently_without_loss(backend: Kind) {
    let (_dir, storage) = open(backend);
    let sessions: Vec<_> = (0..8).map(|_| SessionId::new()).collect();
    std::thread::scope(|scope| {
        for &session in &sessions {
            let storage = storage.clone();
            scope.spawn(move || {
                let mut sink = storage.open_sink(session).unwrap();
                for seq in 1..=200u64 {
                    sink.append(None, &full(seq, seq, None, "x")).unwrap();
                    if seq % 5 == 0 {
                        sink.commit(seq % 50 == 0, seq).unwrap();
                    }
                }
            });
        }
    });
    for session in sessions {
        let got = seqs(&storage.read_after(session, 0, 1000).unwrap());
        assert_eq!(got, (1..=200).collect::<Vec<_>>());
        assert_eq!(storage.last_seq(session).unwrap(), 200);
    }
}

/// The store and the rollout write side by side into one database (SQLite: one file).
async fn the_store_and_the_rollout_share_one_database(backend: Kind) {
    let db = Db::fresh(backend);
    let store = db.store().await;
    let storage = db.rollout();
    let session = SessionId::new();
    let writer = std::thread::spawn({
        let storage = storage.clone();
        move || {
            let mut sink = storage.open_sink(session).unwrap();
            for seq in 1..=300u64 {
                sink.append(None, &full(seq, seq, None, "x")).unwrap();
                sink.commit(false, seq).unwrap();
            }
        }
    });
    let mut ids = HashSet::new();
    for i in 0..100u64 {
        let s = troupe_proto::store::SessionRecord {
            session_id: SessionId::new(),
            project_id: None,
            title: None,
            created_ms: i,
            root_conversation_id: ConversationId::new(),
            settings: troupe_proto::Json::empty_object(),
            status: troupe_proto::store::SessionStatus::Active,
            updated_ms: 0,
        };
        ids.insert(s.session_id);
        store.create_session(s).await.unwrap();
    }
    writer.join().unwrap();
    assert_eq!(store.all_sessions().await.unwrap().len(), ids.len());
    assert_eq!(storage.last_seq(session).unwrap(), 300);
}

fn rollout_storage_conformance(backend: Kind) {
    let db = Db::fresh(backend);
    troupe_actors::rollout::conformance::run_all(&|| db.rollout());
}

/// A new data directory keeps the rollout in `rollout.db`, apart from the store's writer; a
/// directory whose `troupe.db` already holds rollout records keeps reading them there.
/// A task's end (`sync`) is committed without an fsync by default, as every other commit (it
/// survives a crash of the process: see `crash_tests`), and with one when the storage is
/// power-loss durable.
#[test]
fn a_sync_commit_fsyncs_only_when_power_loss_durable() {
    for (durable, synced) in [(false, 0), (true, 1)] {
        let dir = tempfile::tempdir().unwrap();
        let storage = SqliteRolloutStorage::open_with(db_path(dir.path()), durable).unwrap();
        let session = SessionId::new();
        let conv = ConversationId::new();
        let mut sink = storage.open_sink(session).unwrap();
        let a = full(1, 10, Some(conv), "a");
        sink.append(Some(conv), &a).unwrap();
        sink.commit(false, 1).unwrap();
        assert_eq!(storage.synced_commits(), 0, "durable: {durable}");
        let b = full(2, 11, Some(conv), "b");
        sink.append(Some(conv), &b).unwrap();
        sink.commit(true, 2).unwrap();
        assert_eq!(storage.synced_commits(), synced, "durable: {durable}");
        assert_eq!(
            storage.read_conversation(session, conv).unwrap(),
            vec![a, b]
        );
    }
}

/// A sink that finds the writer thread idle and the connection free commits on its own
/// thread; one that finds the connection busy hands its batch to the writer thread, which
/// commits it once the connection is free; then the next commit takes the fast path again.
#[test]
fn sinks_commit_on_their_own_thread_unless_the_connection_is_busy() {
    let (_dir, storage) = open_sqlite();
    let session = SessionId::new();
    let conv = ConversationId::new();
    let mut sink = storage.open_sink(session).unwrap();
    let a = full(1, 10, Some(conv), "a");
    sink.append(Some(conv), &a).unwrap();
    sink.commit(true, 1).unwrap();
    assert_eq!(storage.commits_by_path(), [1, 0]);
    let held = storage.hold_connection();
    let b = full(2, 11, Some(conv), "b");
    let committing = std::thread::spawn(move || {
        sink.append(Some(conv), &b).unwrap();
        sink.commit(false, 2).unwrap();
        sink
    });
    // Handed to the writer thread, which waits for the connection.
    while storage.commits_by_path()[1] == 0 {
        std::thread::yield_now();
    }
    assert!(!committing.is_finished());
    assert_eq!(storage.commits_by_path(), [1, 1]);
    drop(held);
    let mut sink = committing.join().unwrap();
    assert_eq!(storage.commits_by_path(), [1, 1]);
    let c = full(3, 12, Some(conv), "c");
    sink.append(Some(conv), &c).unwrap();
    sink.commit(false, 3).unwrap();
    assert_eq!(storage.commits_by_path(), [2, 1]);
    assert_eq!(
        seqs(&storage.read_conversation(session, conv).unwrap()),
        [1, 2, 3]
    );
}

#[test]
fn the_rollout_has_its_own_file_unless_troupe_db_holds_records() {
    use super::ROLLOUT_DB_FILE;
    let fresh = tempfile::tempdir().unwrap();
    let path = SqliteRolloutStorage::path_in(fresh.path()).unwrap();
    assert_eq!(path, fresh.path().join(ROLLOUT_DB_FILE));
    // The store's database alone (no rollout records) does not change that.
    drop(SqliteStore::open_in(fresh.path()).unwrap());
    assert_eq!(SqliteRolloutStorage::path_in(fresh.path()).unwrap(), path);

    let legacy = tempfile::tempdir().unwrap();
    let session = SessionId::new();
    {
        let storage = SqliteRolloutStorage::open(db_path(legacy.path())).unwrap();
        let mut sink = storage.open_sink(session).unwrap();
        sink.append(None, &full(1, 1, None, "kept")).unwrap();
        sink.commit(false, 1).unwrap();
    }
    let path = SqliteRolloutStorage::path_in(legacy.path()).unwrap();
    assert_eq!(path, db_path(legacy.path()));
    let storage = SqliteRolloutStorage::open(&path).unwrap();
    assert_eq!(
        storage.last_seq(session).unwrap(),
        1,
        "the old records are read"
    );
}

mod sqlite {
    use super::Kind;
    macro_rules! blocking {
        ($($name:ident),*) => { $( #[test] fn $name() { super::$name(Kind::Sqlite) } )* };
    }
    blocking!(
        nothing_is_visible_before_commit_and_everything_after,
        read_after_pages_in_seq_order_per_session,
        the_high_water_mark_outlives_unrecorded_numbers,
        a_due_record_that_does_not_parse_is_rebuilt_from_its_columns,
        forget_writes_pending_records_first,
        a_duplicate_seq_fails_its_batch_only,
        a_corrupt_record_is_an_error_naming_it,
        many_sinks_commit_concurrently_without_loss,
        rollout_storage_conformance
    );

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_store_and_the_rollout_share_one_database() {
        super::the_store_and_the_rollout_share_one_database(Kind::Sqlite).await
    }
}

mod postgres {
    use super::Kind;
    macro_rules! blocking {
        ($($name:ident),*) => { $( #[test] fn $name() { super::$name(Kind::Postgres) } )* };
    }
    blocking!(
        nothing_is_visible_before_commit_and_everything_after,
        read_after_pages_in_seq_order_per_session,
        the_high_water_mark_outlives_unrecorded_numbers,
        a_due_record_that_does_not_parse_is_rebuilt_from_its_columns,
        forget_writes_pending_records_first,
        a_duplicate_seq_fails_its_batch_only,
        a_corrupt_record_is_an_error_naming_it,
        many_sinks_commit_concurrently_without_loss,
        rollout_storage_conformance
    );

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_store_and_the_rollout_share_one_database() {
        super::the_store_and_the_rollout_share_one_database(Kind::Postgres).await
    }
}

/// The resume property, on one backend.
macro_rules! rollout_properties {
    ($backend:expr) => {
        proptest::proptest! {
            #![proptest_config(proptest::prelude::ProptestConfig { cases: 128, ..Default::default() })]

            /// Resuming with `read_after` from any cursor, page after page, yields every record after
            /// the cursor exactly once and in order, however the records were batched and committed.
            #[test]
            fn prop_read_after_resumes_without_loss_or_duplicates(
                batches in proptest::collection::vec((1u64..6, proptest::bool::ANY), 0..15),
                cursor in 0u64..60,
                limit in 1usize..9,
            ) {
                let (_dir, storage) = open($backend);
                let session = SessionId::new();
                let conv = ConversationId::new();
                let mut sink = storage.open_sink(session).unwrap();
                let mut seq = 0;
                for (size, sync) in batches {
                    for _ in 0..size {
                        seq += 1;
                        let c = (seq % 3 != 0).then_some(conv);
                        sink.append(c, &full(seq, seq, c, "x")).unwrap();
                    }
                    sink.commit(sync, seq).unwrap();
                }
                let mut got = Vec::new();
                let mut after = cursor;
                loop {
                    let page = storage.read_after(session, after, limit).unwrap();
                    proptest::prop_assert!(page.len() <= limit);
                    let Some(last) = page.last() else { break };
                    after = last.seq;
                    got.extend(seqs(&page));
                }
                let want: Vec<u64> = (cursor + 1..=seq).collect();
                proptest::prop_assert_eq!(got, want);
                proptest::prop_assert_eq!(storage.last_seq(session).unwrap(), seq);
            }
        }
    };
}

mod sqlite_properties {
    use super::*;
    rollout_properties!(Kind::Sqlite);
}

mod postgres_properties {
    use super::*;
    rollout_properties!(Kind::Postgres);
}
