//! The stores against the `Store` rules, and the P6 properties (>= 100 cases each): every
//! rule and property on SQLite and on PostgreSQL (`sqlite::`, `postgres::`,
//! `*_properties::`), and on the memory store where it keeps them; then what only SQLite has
//! (its schema's versions and upgrades, its query plans, its files).

use super::backends::{Db, Kind, on_every_backend};
use super::schema;
use super::{BindingStore, MAX_PAGE_BYTES, SqliteStore, Store, db_path};
use crate::TokenStore;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use tempfile::TempDir;
use troupe_proto::store::{
    ConversationRecord, ConversationState, FinishMessage, MessageKind, MessagePage, MessageStatus,
    NewMessage, SessionRecord, SessionStatus,
};
use troupe_proto::{
    AgentError, ConversationId, ErrorKind, Json, OpenConversation, Role, SessionId, StoragePolicy,
    TaskId,
};

fn fresh_sqlite() -> (TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_in(dir.path()).unwrap();
    (dir, store)
}

/// A new store on `backend`, and where it lives.
async fn fresh(backend: Kind) -> (Db, Arc<dyn Store>) {
    let db = Db::fresh(backend);
    let store = db.store().await;
    (db, store)
}

/// The store of `db`, opened again.
async fn reopen(db: &Db) -> Arc<dyn Store> {
    db.store().await
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn session_in(project: Option<&str>, created_ms: u64) -> SessionRecord {
    SessionRecord {
        session_id: SessionId::new(),
        project_id: project.map(str::to_owned),
        title: Some(format!("t{created_ms}")),
        created_ms,
        root_conversation_id: ConversationId::new(),
        settings: Json(serde_json::json!({"model": "scripted", "limits": [1, 2.5, null]})),
        status: troupe_proto::store::SessionStatus::Active,
        updated_ms: created_ms,
    }
}

fn conversation_of(
    session: &SessionRecord,
    id: ConversationId,
    created_ms: u64,
) -> ConversationRecord {
    ConversationRecord {
        conversation_id: id,
        session_id: session.session_id,
        params: OpenConversation {
            base_instructions: Some("be brief".into()),
            storage_policy: StoragePolicy::Full,
            ..OpenConversation::default()
        },
        is_root: id == session.root_conversation_id,
        state: ConversationState::Open,
        created_ms,
        closed_ms: None,
    }
}

fn message(s: SessionId, c: ConversationId, text: &str, created_ms: u64) -> NewMessage {
    NewMessage {
        session_id: s,
        conversation_id: c,
        task_id: Some(TaskId::new()),
        role: Role::User,
        content: Some(text.to_owned()),
        chars: text.len() as u64,
        created_ms,
        status: None,
        kind: troupe_proto::store::MessageKind::Text,
        metadata: None,
    }
}

/// A session with its root conversation.
async fn seeded(store: &dyn Store, project: Option<&str>) -> (SessionRecord, ConversationId) {
    let s = session_in(project, 1);
    store.create_session(s.clone()).await.unwrap();
    let root = s.root_conversation_id;
    store
        .put_conversation(conversation_of(&s, root, 1))
        .await
        .unwrap();
    (s, root)
}

fn kind<T: std::fmt::Debug>(r: Result<T, AgentError>) -> ErrorKind {
    r.unwrap_err().kind()
}

// ---- schema ----

#[test]
fn fresh_open_migrates_to_the_current_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let mut conn = super::conn::open(&path, super::conn::Role::Writer).unwrap();
    assert_eq!(schema::migrate(&mut conn).unwrap(), 0);
    assert_eq!(schema::version(&conn).unwrap(), schema::VERSION);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let fk: i64 = conn
        .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
        .unwrap();
    assert_eq!(fk, 1);
}

#[test]
fn reopening_is_a_no_op_migration() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let mut conn = super::conn::open(&path, super::conn::Role::Writer).unwrap();
    schema::migrate(&mut conn).unwrap();
    let tables = |c: &rusqlite::Connection| -> Vec<String> {
        let mut st = c
            .prepare("SELECT sql FROM sqlite_schema WHERE sql IS NOT NULL ORDER BY name")
            .unwrap();
        st.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let before = tables(&conn);
    assert_eq!(schema::migrate(&mut conn).unwrap(), schema::VERSION);
    assert_eq!(tables(&conn), before);
    drop(conn);
    let _store = SqliteStore::open(&path).unwrap();
    let conn = super::conn::open(&path, super::conn::Role::Reader).unwrap();
    assert_eq!(tables(&conn), before);
}

#[tokio::test]
async fn upgrade_from_version_1_keeps_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let s = session_in(Some("p"), 5);
    let c = s.root_conversation_id;
    {
        let mut conn = super::conn::open(&path, super::conn::Role::Writer).unwrap();
        schema::migrate_to(&mut conn, 1).unwrap();
        assert_eq!(schema::version(&conn).unwrap(), 1);
        conn.execute_batch(&format!(
            "INSERT INTO sessions VALUES ('{s}', 'p', 'old', 5, '{c}', '{{}}');
             INSERT INTO conversations VALUES ('{c}', '{s}', '{{}}', 1, 'open', 5, NULL);
             INSERT INTO messages (session_id, conversation_id, task_id, role, content, chars, created_ms)
                 VALUES ('{s}', '{c}', NULL, 'user', 'hello', 5, 6);
             INSERT INTO project_current VALUES ('p', '{s}');",
            s = s.session_id,
        ))
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let got = store.get_session(s.session_id).await.unwrap().unwrap();
    assert_eq!(got.title.as_deref(), Some("old"));
    assert_eq!(store.conversations(s.session_id).await.unwrap().len(), 1);
    let page = store
        .messages(s.session_id, 10, MAX_PAGE_BYTES, None)
        .await
        .unwrap();
    assert_eq!(page.messages.len(), 1);
    assert_eq!(page.messages[0].content.as_deref(), Some("hello"));
    assert_eq!(
        store.current_session("p").await.unwrap(),
        Some(s.session_id)
    );
    // And the new version's tables work.
    let conn = super::conn::open(&path, super::conn::Role::Reader).unwrap();
    assert_eq!(schema::version(&conn).unwrap(), schema::VERSION);
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM rollout_events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 0);
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let conn = super::conn::open(&path, super::conn::Role::Writer).unwrap();
    conn.pragma_update(None, "user_version", schema::VERSION + 1)
        .unwrap();
    drop(conn);
    let err = SqliteStore::open(&path).err().unwrap();
    assert!(err.to_string().contains("newer"), "{err}");
}

#[test]
fn the_query_plans_use_the_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let mut conn = super::conn::open(&path, super::conn::Role::Writer).unwrap();
    schema::migrate(&mut conn).unwrap();
    let plan = |sql: &str| -> String {
        let mut st = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        st.query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect::<Vec<_>>()
            .join("; ")
    };
    // A page: planned from sizes newest first, then its rows read by id range.
    let p = plan(
        "SELECT message_id, octet_length(content) FROM messages WHERE session_id = 'x' AND message_id < 5 ORDER BY message_id DESC",
    );
    assert!(
        p.contains("messages_by_session") && !p.contains("TEMP B-TREE"),
        "{p}"
    );
    let p = plan(
        "SELECT * FROM messages WHERE session_id = 'x' AND message_id BETWEEN 2 AND 5 ORDER BY message_id",
    );
    assert!(
        p.contains("messages_by_session") && !p.contains("TEMP B-TREE"),
        "{p}"
    );
    let p =
        plan("SELECT * FROM sessions WHERE project_id = 'p' ORDER BY created_ms DESC, rowid DESC");
    assert!(
        p.contains("sessions_by_project") && !p.contains("TEMP B-TREE"),
        "{p}"
    );
    let p = plan(
        "SELECT * FROM messages WHERE session_id = 'x' AND status IN ('queued', 'running') ORDER BY message_id",
    );
    assert!(
        p.contains("messages_pending") && !p.contains("TEMP B-TREE"),
        "{p}"
    );
    let p = plan(
        "SELECT min(message_id), session_id FROM messages WHERE status IN ('queued', 'running') GROUP BY session_id",
    );
    assert!(p.contains("messages_pending"), "{p}");
    let p = plan(
        "SELECT seq, record FROM rollout_events WHERE session_id = 'x' AND seq > 3 ORDER BY seq LIMIT 5",
    );
    assert!(p.contains("INDEX") && !p.contains("TEMP B-TREE"), "{p}");
    let p = plan(
        "SELECT seq, record FROM rollout_events WHERE session_id = 'x' AND conversation_id = 'c' ORDER BY seq",
    );
    assert!(
        p.contains("rollout_events_by_conversation") && !p.contains("TEMP B-TREE"),
        "{p}"
    );
    // The Ttl sweeps read only the rows that have an expiry.
    let p = plan("UPDATE messages SET content = NULL, expires_ms = NULL WHERE expires_ms <= 5");
    assert!(p.contains("messages_by_expiry"), "{p}");
}

// ---- the Store rules ----

async fn sessions_round_trip_and_list_in_order(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    let a = session_in(Some("p"), 10);
    let b = session_in(Some("p"), 20);
    let c = session_in(None, 15);
    for s in [&a, &b, &c] {
        store.create_session(s.clone()).await.unwrap();
    }
    assert_eq!(
        store.get_session(a.session_id).await.unwrap(),
        Some(a.clone())
    );
    let all: Vec<_> = store.all_sessions().await.unwrap();
    assert_eq!(all, vec![a.clone(), c.clone(), b.clone()]);
    assert_eq!(store.project_sessions("p").await.unwrap(), vec![b, a]);
    assert!(store.project_sessions("q").await.unwrap().is_empty());
}

async fn unknown_ids_read_as_none_or_empty(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    assert_eq!(store.get_session(SessionId::new()).await.unwrap(), None);
    assert!(
        store
            .conversations(SessionId::new())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .messages(SessionId::new(), 10, MAX_PAGE_BYTES, None)
            .await
            .unwrap(),
        MessagePage {
            messages: vec![],
            next_before: None
        }
    );
    assert_eq!(store.current_session("nobody").await.unwrap(), None);
    store.ping().await.unwrap();
}

/// Text keeps every character, NUL included, in a title, a message and its metadata.
async fn every_character_round_trips(backend: Kind) {
    let (_db, store) = fresh(backend).await;
    let odd = "nul \0 bell \u{7} bom \u{feff} emoji \u{1F600} é";
    let s = SessionRecord {
        title: Some(odd.to_owned()),
        ..session_in(None, 1)
    };
    store.create_session(s.clone()).await.unwrap();
    let root = s.root_conversation_id;
    store
        .put_conversation(conversation_of(&s, root, 1))
        .await
        .unwrap();
    let m = NewMessage {
        metadata: Some(Json(serde_json::json!({ "odd": odd }))),
        ..message(s.session_id, root, odd, 2)
    };
    let stored = store.append_message(m).await.unwrap();
    let got = store.get_session(s.session_id).await.unwrap().unwrap();
    assert_eq!(got.title.as_deref(), Some(odd));
    assert_eq!(
        store.message(stored.message_id).await.unwrap(),
        Some(stored.clone())
    );
    assert_eq!(stored.content.as_deref(), Some(odd));
}

async fn a_duplicate_session_is_invalid_input(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    let s = session_in(None, 1);
    store.create_session(s.clone()).await.unwrap();
    let mut again = s.clone();
    again.title = Some("other".into());
    assert_eq!(
        kind(store.create_session(again).await),
        ErrorKind::InvalidInput
    );
    assert_eq!(store.get_session(s.session_id).await.unwrap(), Some(s));
}

async fn conversations_upsert_close_and_keep_their_order(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    let (s, root) = seeded(&*store, None).await;
    let child = ConversationId::new();
    let mut second = conversation_of(&s, child, 1);
    store.put_conversation(second.clone()).await.unwrap();
    // A changed context replaces the row in place.
    second.params.user_instructions = Some("changed".into());
    store.put_conversation(second.clone()).await.unwrap();
    store.close_conversation(child, 99).await.unwrap();
    store.close_conversation(child, 120).await.unwrap();
    let got = store.conversations(s.session_id).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].conversation_id, root);
    assert!(got[0].is_root);
    assert_eq!(got[1].params.user_instructions.as_deref(), Some("changed"));
    assert_eq!(got[1].state, ConversationState::Closed);
    assert_eq!(got[1].closed_ms, Some(99));

    let mut orphan = conversation_of(&s, ConversationId::new(), 1);
    orphan.session_id = SessionId::new();
    assert_eq!(
        kind(store.put_conversation(orphan).await),
        ErrorKind::NotFound
    );
    let other = session_in(None, 2);
    store.create_session(other.clone()).await.unwrap();
    let mut stolen = second.clone();
    stolen.session_id = other.session_id;
    assert_eq!(
        kind(store.put_conversation(stolen).await),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        kind(store.close_conversation(ConversationId::new(), 1).await),
        ErrorKind::NotFound
    );
}

async fn append_message_checks_its_session_and_conversation(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    let (s, root) = seeded(&*store, None).await;
    let (other, other_root) = seeded(&*store, None).await;
    let err = store
        .append_message(message(SessionId::new(), ConversationId::new(), "x", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::NotFound { what, .. } if what == "session"),
        "{err}"
    );
    let err = store
        .append_message(message(s.session_id, ConversationId::new(), "x", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::NotFound { what, .. } if what == "conversation"),
        "{err}"
    );
    assert_eq!(
        kind(
            store
                .append_message(message(s.session_id, other_root, "x", 1))
                .await
        ),
        ErrorKind::InvalidInput
    );
    let ok = store
        .append_message(message(other.session_id, other_root, "y", 1))
        .await
        .unwrap();
    assert_eq!(ok.content.as_deref(), Some("y"));
    assert!(
        store
            .messages(s.session_id, 10, MAX_PAGE_BYTES, None)
            .await
            .unwrap()
            .messages
            .is_empty()
    );
    let _ = root;
}

async fn out_of_range_numbers_are_invalid_input(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    let mut s = session_in(None, u64::MAX);
    assert_eq!(
        kind(store.create_session(s.clone()).await),
        ErrorKind::InvalidInput
    );
    s.created_ms = 1;
    assert_eq!(
        kind(store.create_session(s.clone()).await),
        ErrorKind::InvalidInput,
        "nor an update time"
    );
    s.updated_ms = 1;
    store.create_session(s.clone()).await.unwrap();
    let root = s.root_conversation_id;
    store
        .put_conversation(conversation_of(&s, root, 1))
        .await
        .unwrap();
    let mut m = message(s.session_id, root, "x", 1);
    m.chars = u64::MAX;
    assert_eq!(kind(store.append_message(m).await), ErrorKind::InvalidInput);
    // Cursors past the representable range just mean "everything".
    store
        .append_message(message(s.session_id, root, "x", 1))
        .await
        .unwrap();
    let page = store
        .messages(s.session_id, 5, MAX_PAGE_BYTES, Some(u64::MAX))
        .await
        .unwrap();
    assert_eq!(page.messages.len(), 1);
}

/// The Ttl rules every store keeps: content of a `Ttl` conversation is dropped once due (at
/// its `created_ms` + the ttl), in open and closed conversations alike, its size stays,
/// nothing else is touched, and a second sweep changes nothing.
async fn ttl_rules(store: &dyn Store) {
    let s = session_in(None, 1);
    store.create_session(s.clone()).await.unwrap();
    let (ttl, closed, full) = (
        s.root_conversation_id,
        ConversationId::new(),
        ConversationId::new(),
    );
    // Opened at 1 s: a conversation's instructions are due like a message written then.
    let with_policy = |id, policy| {
        let mut c = conversation_of(&s, id, 1_000);
        c.params.storage_policy = policy;
        c
    };
    store
        .put_conversation(with_policy(ttl, StoragePolicy::Ttl { secs: 10 }))
        .await
        .unwrap();
    store
        .put_conversation(with_policy(closed, StoragePolicy::Ttl { secs: 1 }))
        .await
        .unwrap();
    store
        .put_conversation(with_policy(full, StoragePolicy::Full))
        .await
        .unwrap();
    let sid = s.session_id;
    for (conv, text, at) in [
        (ttl, "ttl early", 1_000),
        (ttl, "ttl late", 5_000),
        (closed, "closed", 1_000),
        (full, "full", 1_000),
    ] {
        store
            .append_message(message(sid, conv, text, at))
            .await
            .unwrap();
    }
    // A message stored without content (a refused reply) has nothing to expire.
    let mut empty = message(sid, ttl, "", 1_000);
    empty.content = None;
    store.append_message(empty).await.unwrap();
    store.close_conversation(closed, 1_500).await.unwrap();

    let contents = |page: MessagePage| -> Vec<Option<String>> {
        page.messages.into_iter().map(|m| m.content).collect()
    };
    let instructions = || async {
        store
            .conversations(sid)
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.conversation_id, c.params.base_instructions))
            .collect::<BTreeMap<_, _>>()
    };
    let brief = || Some("be brief".to_owned());
    assert_eq!(store.sweep_due(1_999).await.unwrap(), 0, "nothing due yet");
    assert_eq!(
        store.sweep_due(2_000).await.unwrap(),
        2,
        "the closed one and its conversation's instructions, at 1 s + 1 s"
    );
    assert_eq!(
        instructions().await,
        BTreeMap::from([(ttl, brief()), (closed, None), (full, brief())])
    );
    assert_eq!(
        store.sweep_due(11_000).await.unwrap(),
        2,
        "ttl early and its conversation's instructions, at 1 s + 10 s"
    );
    assert_eq!(store.sweep_due(11_000).await.unwrap(), 0, "idempotent");
    assert_eq!(
        instructions().await,
        BTreeMap::from([(ttl, None), (closed, None), (full, brief())]),
        "Full instructions never expire"
    );
    let swept = store
        .conversations(sid)
        .await
        .unwrap()
        .into_iter()
        .find(|c| c.conversation_id == ttl)
        .unwrap();
    assert_eq!(
        swept.params,
        with_policy(ttl, StoragePolicy::Ttl { secs: 10 })
            .params
            .without_instructions(),
        "the other parameters stay"
    );
    let page = store.messages(sid, 10, MAX_PAGE_BYTES, None).await.unwrap();
    assert_eq!(
        page.messages[0].chars,
        "ttl early".len() as u64,
        "the size stays"
    );
    assert_eq!(
        contents(page),
        vec![
            None,
            Some("ttl late".to_owned()),
            None,
            Some("full".to_owned()),
            None
        ]
    );
    assert_eq!(store.sweep_due(u64::MAX).await.unwrap(), 1, "ttl late");
    let page = store.messages(sid, 10, MAX_PAGE_BYTES, None).await.unwrap();
    assert_eq!(
        contents(page),
        vec![None, None, None, Some("full".to_owned()), None],
        "Full content never expires"
    );
}

async fn ttl_content_is_dropped_when_due(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    ttl_rules(&*store).await;
}

#[tokio::test]
async fn ttl_content_is_dropped_when_due_in_memory() {
    ttl_rules(&crate::memory::MemoryStore::new()).await;
}

/// Every byte of the store's files: the database, its WAL and shared-memory index. A file
/// that SQLite removes between the listing and the read (a journal) holds nothing any more.
fn file_bytes(dir: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        match std::fs::read(entry.unwrap().path()) {
            Ok(bytes) => out.extend(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("reading the store's files: {e}"),
        }
    }
    out
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_leaves_no_byte_of_due_content_in_the_files() {
    let (dir, store) = fresh_sqlite();
    let s = session_in(None, 1);
    store.create_session(s.clone()).await.unwrap();
    let mut c = conversation_of(&s, s.root_conversation_id, 1);
    c.params.storage_policy = StoragePolicy::Ttl { secs: 1 };
    c.params.base_instructions = Some("CANARY-BASE-7730".into());
    c.params.user_instructions = Some("CANARY-USER-7731".into());
    store.put_conversation(c).await.unwrap();
    let big = format!("CANARY-BIG-4410 {}", "y".repeat(30_000));
    for text in ["CANARY-SMALL-6620", big.as_str()] {
        store
            .append_message(message(s.session_id, s.root_conversation_id, text, 10))
            .await
            .unwrap();
    }
    // Let the background checkpoint copy the rows into the database file as well.
    let db = db_path(dir.path());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !contains(&std::fs::read(&db).unwrap(), "CANARY-SMALL-6620") {
        assert!(std::time::Instant::now() < deadline, "never checkpointed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let before = file_bytes(dir.path());
    assert!(contains(&before, "CANARY-SMALL-6620") && contains(&before, "CANARY-BIG-4410"));
    assert!(contains(&before, "CANARY-BASE-7730") && contains(&before, "CANARY-USER-7731"));
    assert_eq!(
        store.sweep_due(1_010).await.unwrap(),
        3,
        "both messages and the conversation's instructions"
    );
    let after = file_bytes(dir.path());
    for canary in ["CANARY-BASE-7730", "CANARY-USER-7731"] {
        assert!(!contains(&after, canary), "{canary} left in the files");
    }
    assert!(
        !contains(&after, "CANARY-SMALL-6620"),
        "small content left in the files"
    );
    assert!(
        !contains(&after, "CANARY-BIG-4410"),
        "big content left in the files"
    );
    let page = store
        .messages(s.session_id, 10, MAX_PAGE_BYTES, None)
        .await
        .unwrap();
    assert_eq!(page.messages[1].chars, big.len() as u64);
    assert!(page.messages.iter().all(|m| m.content.is_none()));
}

/// Messages stored before expiries were (schema 2) are dated by the migration from their
/// conversation's policy, and swept like new ones.
#[tokio::test]
async fn messages_from_before_expiries_are_dated_by_the_migration() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let s = session_in(None, 5);
    let (ttl, full) = (s.root_conversation_id, ConversationId::new());
    let params = |policy: StoragePolicy| {
        serde_json::to_string(&OpenConversation {
            storage_policy: policy,
            ..OpenConversation::default()
        })
        .unwrap()
    };
    {
        let mut conn = super::conn::open(&path, super::conn::Role::Writer).unwrap();
        schema::migrate_to(&mut conn, 2).unwrap();
        conn.execute_batch(&format!(
            "INSERT INTO sessions VALUES ('{s}', NULL, NULL, 5, '{ttl}', '{{}}');
             INSERT INTO conversations VALUES ('{ttl}', '{s}', '{p_ttl}', 1, 'closed', 5, 6);
             INSERT INTO conversations VALUES ('{full}', '{s}', '{p_full}', 0, 'open', 5, NULL);
             INSERT INTO messages (session_id, conversation_id, task_id, role, content, chars, created_ms)
                 VALUES ('{s}', '{ttl}', NULL, 'user', 'old ttl', 7, 1000),
                        ('{s}', '{full}', NULL, 'user', 'old full', 8, 1000);",
            s = s.session_id,
            p_ttl = params(StoragePolicy::Ttl { secs: 2 }),
            p_full = params(StoragePolicy::Full),
        ))
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.sweep_due(2_999).await.unwrap(), 0);
    assert_eq!(store.sweep_due(3_000).await.unwrap(), 1);
    let page = store
        .messages(s.session_id, 10, MAX_PAGE_BYTES, None)
        .await
        .unwrap();
    let contents: Vec<_> = page.messages.iter().map(|m| m.content.clone()).collect();
    assert_eq!(contents, vec![None, Some("old full".to_owned())]);
    // New messages of the migrated conversation get their expiry from its stored policy.
    store
        .append_message(message(s.session_id, ttl, "new ttl", 10_000))
        .await
        .unwrap();
    assert_eq!(store.sweep_due(11_999).await.unwrap(), 0);
    assert_eq!(store.sweep_due(12_000).await.unwrap(), 1);
}

async fn current_session_must_exist_and_belong_to_the_project(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    let (a, _) = seeded(&*store, Some("p")).await;
    let (b, _) = seeded(&*store, Some("q")).await;
    let (loose, _) = seeded(&*store, None).await;
    assert_eq!(
        kind(store.set_current_session("p", SessionId::new()).await),
        ErrorKind::NotFound
    );
    assert_eq!(
        kind(store.set_current_session("p", b.session_id).await),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        kind(store.set_current_session("p", loose.session_id).await),
        ErrorKind::InvalidInput
    );
    store.set_current_session("p", a.session_id).await.unwrap();
    assert_eq!(
        store.current_session("p").await.unwrap(),
        Some(a.session_id)
    );
    assert_eq!(store.current_session("q").await.unwrap(), None);
}

async fn a_corrupt_row_is_an_error_naming_it(backend: Kind) {
    let (db, store) = fresh(backend).await;
    let (s, root) = seeded(&*store, Some("p")).await;
    store
        .append_message(message(s.session_id, root, "x", 1))
        .await
        .unwrap();
    // Foreign keys off: SQLite's pragma, PostgreSQL's replica role (no triggers run).
    let no_foreign_keys = match backend {
        Kind::Sqlite => "PRAGMA foreign_keys = OFF;",
        Kind::Postgres => "SET session_replication_role = replica;",
    };
    db.raw(&format!(
        "{no_foreign_keys}
         UPDATE sessions SET settings = '{{not json';
         UPDATE messages SET role = 'robot';
         UPDATE conversations SET session_id = 'not-a-uuid';"
    ));
    let err = store.get_session(s.session_id).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal);
    assert!(
        err.to_string().contains("sessions row 1: column settings"),
        "{err}"
    );
    let err = store
        .messages(s.session_id, 5, MAX_PAGE_BYTES, None)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("messages row 1: column role"),
        "{err}"
    );
    let err = store.project_sessions("p").await.unwrap_err();
    assert!(err.to_string().contains("sessions row 1"), "{err}");
    db.raw(
        "UPDATE conversations SET session_id = (SELECT session_id FROM sessions), state = 'half';",
    );
    let err = store.conversations(s.session_id).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("conversations row 1: column state"),
        "{err}"
    );
}

async fn concurrent_writes_are_group_committed_and_isolated(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    let (s, root) = seeded(&*store, None).await;
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            if i % 10 == 0 {
                // Fails inside a batch without taking the others down.
                store
                    .append_message(message(s.session_id, ConversationId::new(), "bad", i))
                    .await
            } else {
                store
                    .append_message(message(s.session_id, root, &format!("m{i}"), i))
                    .await
            }
        }));
    }
    let mut ids = HashSet::new();
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            Ok(m) => {
                assert_ne!(i % 10, 0);
                assert!(ids.insert(m.message_id));
            }
            Err(e) => {
                assert_eq!(i % 10, 0);
                assert_eq!(e.kind(), ErrorKind::NotFound);
            }
        }
    }
    assert_eq!(ids.len(), 180);
    let page = store
        .messages(s.session_id, 1000, MAX_PAGE_BYTES, None)
        .await
        .unwrap();
    let got: Vec<_> = page.messages.iter().map(|m| m.message_id).collect();
    let mut want: Vec<_> = ids.into_iter().collect();
    want.sort_unstable();
    assert_eq!(got, want);
}

async fn a_zero_limit_page_keeps_the_cursor(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    let (s, root) = seeded(&*store, None).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            store
                .append_message(message(s.session_id, root, "m", i))
                .await
                .unwrap()
                .message_id,
        );
    }
    let page = store
        .messages(s.session_id, 0, MAX_PAGE_BYTES, None)
        .await
        .unwrap();
    assert!(page.messages.is_empty());
    let next = page.next_before.unwrap();
    let rest = store
        .messages(s.session_id, 10, MAX_PAGE_BYTES, Some(next))
        .await
        .unwrap();
    assert_eq!(rest.messages.len(), 3);
    assert_eq!(rest.next_before, None);
    let none = store
        .messages(s.session_id, 0, MAX_PAGE_BYTES, Some(ids[0]))
        .await
        .unwrap();
    assert_eq!(none.next_before, None);
}

/// The byte budget of a page, the same in every store: a page stops before the message that
/// would take its content past the budget (a larger message comes alone), its cursor is the
/// oldest message it holds, contentless messages cost nothing, and walking the cursor returns
/// every message once.
async fn page_budget_rules(store: &dyn Store) {
    let s = session_in(None, 1);
    store.create_session(s.clone()).await.unwrap();
    let root = s.root_conversation_id;
    store
        .put_conversation(conversation_of(&s, root, 1))
        .await
        .unwrap();
    let sid = s.session_id;
    // Oldest to newest: 10, 30, 40, 5 (no content, 5 chars), 25, 100 bytes.
    let mut ids = Vec::new();
    for (i, size) in [10usize, 30, 40, 5, 25, 100].into_iter().enumerate() {
        let mut m = message(sid, root, &"x".repeat(size), i as u64);
        if size == 5 {
            m.content = None;
        }
        ids.push(store.append_message(m).await.unwrap().message_id);
    }
    let page_ids =
        |page: &MessagePage| -> Vec<u64> { page.messages.iter().map(|m| m.message_id).collect() };
    // The newest is larger than the budget: alone, and the cursor moves past it.
    let page = store.messages(sid, 100, 64, None).await.unwrap();
    assert_eq!(page_ids(&page), vec![ids[5]]);
    assert_eq!(page.next_before, Some(ids[5]));
    // 25 + 0 + 40 = 65 > 64: stops before the 40-byte message.
    let page = store.messages(sid, 100, 64, Some(ids[5])).await.unwrap();
    assert_eq!(page_ids(&page), vec![ids[3], ids[4]]);
    assert_eq!(page.next_before, Some(ids[3]));
    // Exactly at the budget (40 + 30 = 70) is in; the count still bounds too.
    let page = store.messages(sid, 100, 70, Some(ids[3])).await.unwrap();
    assert_eq!(page_ids(&page), vec![ids[1], ids[2]]);
    assert_eq!(page.next_before, Some(ids[1]));
    let page = store.messages(sid, 1, 1000, Some(ids[3])).await.unwrap();
    assert_eq!(page_ids(&page), vec![ids[2]]);
    assert_eq!(page.next_before, Some(ids[2]));
    // The last page has no cursor.
    let page = store.messages(sid, 100, 70, Some(ids[1])).await.unwrap();
    assert_eq!(page_ids(&page), vec![ids[0]]);
    assert_eq!(page.next_before, None);
    // The whole walk at a budget of 1 byte: one message a page, each once.
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.messages(sid, 1000, 1, cursor).await.unwrap();
        assert_eq!(page.messages.len(), 1);
        seen.splice(0..0, page_ids(&page));
        match page.next_before {
            Some(b) => cursor = Some(b),
            None => break,
        }
    }
    assert_eq!(seen, ids);
}

async fn a_page_stops_at_its_byte_budget(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    page_budget_rules(&*store).await;
}

#[tokio::test]
async fn a_page_stops_at_its_byte_budget_in_memory() {
    page_budget_rules(&crate::memory::MemoryStore::new()).await;
}

/// At the real budget: pages of 1 MiB messages asked for 1000 at a time hold 4 MiB each.
async fn large_messages_page_at_max_page_bytes(store: &dyn Store) {
    let s = session_in(None, 1);
    store.create_session(s.clone()).await.unwrap();
    let root = s.root_conversation_id;
    store
        .put_conversation(conversation_of(&s, root, 1))
        .await
        .unwrap();
    let mib = "m".repeat(1024 * 1024);
    let mut ids = Vec::new();
    for i in 0..9 {
        let m = message(s.session_id, root, &mib, i);
        ids.push(store.append_message(m).await.unwrap().message_id);
    }
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .messages(s.session_id, 1000, MAX_PAGE_BYTES, cursor)
            .await
            .unwrap();
        let bytes: usize = page
            .messages
            .iter()
            .map(|m| m.content.as_ref().map_or(0, String::len))
            .sum();
        assert!(bytes <= MAX_PAGE_BYTES, "{bytes}");
        sizes.push(page.messages.len());
        let mut ids: Vec<u64> = page.messages.iter().map(|m| m.message_id).collect();
        ids.extend(seen);
        seen = ids;
        match page.next_before {
            Some(b) => cursor = Some(b),
            None => break,
        }
    }
    assert_eq!(sizes, vec![4, 4, 1]);
    assert_eq!(seen, ids);
}

async fn large_messages_page_at_the_byte_budget(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    large_messages_page_at_max_page_bytes(&*store).await;
}

#[tokio::test]
async fn large_messages_page_at_the_byte_budget_in_memory() {
    large_messages_page_at_max_page_bytes(&crate::memory::MemoryStore::new()).await;
}

/// Stores a conversation under each policy with a canary in both instruction fields and
/// reads them back: `full` and `ttl` keep the instructions, `headers_only` and `none` keep
/// every parameter but them. Returns the canaries that must not be stored.
async fn instructions_rules(store: &dyn Store, tag: &str) -> Vec<String> {
    let s = session_in(None, 1);
    store.create_session(s.clone()).await.unwrap();
    let mut forbidden = Vec::new();
    for (i, policy) in [
        StoragePolicy::Full,
        StoragePolicy::Ttl { secs: 60 },
        StoragePolicy::HeadersOnly,
        StoragePolicy::None,
    ]
    .into_iter()
    .enumerate()
    {
        let id = if i == 0 {
            s.root_conversation_id
        } else {
            ConversationId::new()
        };
        let mut c = conversation_of(&s, id, i as u64);
        let base = format!("CANARY-BASE-{tag}-{i}");
        let user = format!("CANARY-USER-{tag}-{i}");
        c.params = OpenConversation {
            base_instructions: Some(base.clone()),
            user_instructions: Some(user.clone()),
            mcp_tool_allowlist: Some(vec!["srv.tool".into()]),
            include_plan_tool: true,
            storage_policy: policy,
            ..OpenConversation::default()
        };
        store.put_conversation(c.clone()).await.unwrap();
        let stored = store
            .conversations(s.session_id)
            .await
            .unwrap()
            .into_iter()
            .find(|x| x.conversation_id == id)
            .unwrap();
        if policy.keeps_content() {
            assert_eq!(stored, c, "{policy:?} keeps everything");
        } else {
            let mut want = c.clone();
            want.params.base_instructions = None;
            want.params.user_instructions = None;
            assert_eq!(stored, want, "{policy:?} keeps all but the instructions");
            forbidden.extend([base, user]);
        }
    }
    forbidden
}

async fn no_instructions_are_stored_against_the_policy_on_any_backend(backend: Kind) {
    let (_db, store) = fresh(backend).await;
    instructions_rules(&*store, "any").await;
}

#[tokio::test]
async fn no_instructions_are_stored_against_the_policy_in_memory() {
    instructions_rules(&crate::memory::MemoryStore::new(), "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_instructions_are_stored_against_the_policy() {
    let (dir, store) = fresh_sqlite();
    let forbidden = instructions_rules(&store, "sqlite").await;
    drop(store);
    let bytes = file_bytes(dir.path());
    for canary in &forbidden {
        assert!(!contains(&bytes, canary), "{canary} is in the files");
    }
    // The ones `full` and `ttl` keep are there: the scan can see them.
    assert!(contains(&bytes, "CANARY-BASE-sqlite-0"));
    assert!(contains(&bytes, "CANARY-USER-sqlite-1"));
}

async fn writes_survive_a_reopen(backend: Kind) {
    let (dir, store) = fresh(backend).await;
    let (s, root) = seeded(&*store, Some("p")).await;
    let m = store
        .append_message(message(s.session_id, root, "kept", 3))
        .await
        .unwrap();
    store.set_current_session("p", s.session_id).await.unwrap();
    let before = store.get_session(s.session_id).await.unwrap().unwrap();
    assert!(before.updated_ms > s.updated_ms, "the writes moved it");
    drop(store);
    let store = reopen(&dir).await;
    assert_eq!(store.get_session(s.session_id).await.unwrap(), Some(before));
    assert_eq!(
        store
            .messages(s.session_id, 5, MAX_PAGE_BYTES, None)
            .await
            .unwrap()
            .messages,
        vec![m]
    );
    assert_eq!(
        store.current_session("p").await.unwrap(),
        Some(s.session_id)
    );
}

// ---- the durable queue ----

fn user(s: SessionId, c: ConversationId, text: &str, status: MessageStatus) -> NewMessage {
    NewMessage {
        task_id: None,
        status: Some(status),
        ..message(s, c, text, 10)
    }
}

fn reply_to(s: SessionId, c: ConversationId, task: TaskId) -> NewMessage {
    NewMessage {
        task_id: Some(task),
        role: Role::Assistant,
        ..message(s, c, "the reply", 11)
    }
}

async fn a_message_goes_from_queued_to_its_outcome_with_its_reply(backend: Kind) {
    let (dir, store) = fresh(backend).await;
    let (s, root) = seeded(&*store, None).await;
    let (other, other_root) = seeded(&*store, None).await;
    let queued = store
        .append_message(user(s.session_id, root, "q", MessageStatus::Queued))
        .await
        .unwrap();
    let running = store
        .append_message(user(s.session_id, root, "r", MessageStatus::Running))
        .await
        .unwrap();
    store
        .append_message(user(
            other.session_id,
            other_root,
            "x",
            MessageStatus::Queued,
        ))
        .await
        .unwrap();
    assert_eq!(queued.status, Some(MessageStatus::Queued));
    let pending = store.pending_messages(s.session_id).await.unwrap();
    assert_eq!(pending, vec![queued.clone(), running.clone()]);
    assert_eq!(
        store.sessions_with_pending_messages().await.unwrap(),
        vec![s.session_id, other.session_id]
    );

    // Only a queued message starts; only a pending one finishes, and only with an outcome.
    assert_eq!(
        kind(store.start_message(running.message_id).await),
        ErrorKind::InvalidInput
    );
    let started = store.start_message(queued.message_id).await.unwrap();
    assert_eq!(started.status, Some(MessageStatus::Running));
    let not_an_outcome = FinishMessage {
        message_id: queued.message_id,
        status: MessageStatus::Queued,
        task_id: None,
        reply: None,
        items: Vec::new(),
        session_status: None,
    };
    assert_eq!(
        kind(store.finish_message(not_an_outcome).await),
        ErrorKind::InvalidInput
    );
    let task = TaskId::new();
    let done = store
        .finish_message(FinishMessage {
            message_id: queued.message_id,
            status: MessageStatus::Completed,
            task_id: Some(task),
            reply: Some(reply_to(s.session_id, root, task)),
            items: Vec::new(),
            session_status: None,
        })
        .await
        .unwrap();
    let reply = done.reply.unwrap();
    assert_eq!(done.message.status, Some(MessageStatus::Completed));
    assert_eq!(done.message.task_id, Some(task));
    assert_eq!(done.message.reply_message_id, Some(reply.message_id));
    assert!(reply.message_id > running.message_id);
    let again = FinishMessage {
        message_id: queued.message_id,
        status: MessageStatus::Failed,
        task_id: None,
        reply: Some(reply_to(s.session_id, root, task)),
        items: Vec::new(),
        session_status: None,
    };
    assert_eq!(
        kind(store.finish_message(again).await),
        ErrorKind::InvalidInput
    );
    let aborted = store
        .finish_message(FinishMessage {
            message_id: running.message_id,
            status: MessageStatus::Aborted,
            task_id: None,
            reply: None,
            items: Vec::new(),
            session_status: None,
        })
        .await
        .unwrap();
    assert_eq!(aborted.reply, None);
    assert_eq!(
        kind(store.start_message(reply.message_id).await),
        ErrorKind::NotFound,
        "a reply is not a user message"
    );
    assert_eq!(kind(store.start_message(9_999).await), ErrorKind::NotFound);
    assert!(
        store
            .pending_messages(s.session_id)
            .await
            .unwrap()
            .is_empty()
    );

    // What a restart sees: the outcomes and the other session's queue.
    drop(store);
    let store = reopen(&dir).await;
    assert_eq!(
        store.sessions_with_pending_messages().await.unwrap(),
        vec![other.session_id]
    );
    let page = store
        .messages(s.session_id, 10, MAX_PAGE_BYTES, None)
        .await
        .unwrap()
        .messages;
    let statuses: Vec<Option<MessageStatus>> = page.iter().map(|m| m.status).collect();
    assert_eq!(
        statuses,
        vec![
            Some(MessageStatus::Completed),
            Some(MessageStatus::Aborted),
            None
        ]
    );
    assert_eq!(page[0], done.message);
    assert_eq!(page[2], reply);
}

async fn a_failed_reply_leaves_the_message_pending(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    let (s, root) = seeded(&*store, None).await;
    let m = store
        .append_message(user(s.session_id, root, "q", MessageStatus::Running))
        .await
        .unwrap();
    // A reply into another session's conversation fails: nothing of the finish is kept.
    let (other, other_root) = seeded(&*store, None).await;
    let bad = FinishMessage {
        message_id: m.message_id,
        status: MessageStatus::Completed,
        task_id: None,
        reply: Some(reply_to(s.session_id, other_root, TaskId::new())),
        items: Vec::new(),
        session_status: None,
    };
    assert!(store.finish_message(bad).await.is_err());
    assert_eq!(store.pending_messages(s.session_id).await.unwrap(), vec![m]);
    assert!(
        store
            .messages(other.session_id, 5, MAX_PAGE_BYTES, None)
            .await
            .unwrap()
            .messages
            .is_empty()
    );
}

// ---- P6 properties ----

fn cases() -> ProptestConfig {
    ProptestConfig {
        cases: 128,
        ..ProptestConfig::default()
    }
}

fn arb_role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::System), Just(Role::User), Just(Role::Assistant)]
}

const MAX_INT: u64 = i64::MAX as u64;

/// Walks every page of a session whose messages have the given sizes (`None`: no content)
/// among another session's messages; checks each page's bounds and returns the ids seen,
/// oldest first, and the ids stored.
async fn walk_sized_pages(
    store: &dyn Store,
    sizes: &[Option<usize>],
    limit: usize,
    max_bytes: usize,
) -> Result<(Vec<u64>, Vec<u64>), TestCaseError> {
    let s = session_in(None, 1);
    let other = session_in(None, 1);
    for x in [&s, &other] {
        store.create_session(x.clone()).await.unwrap();
        store
            .put_conversation(conversation_of(x, x.root_conversation_id, 1))
            .await
            .unwrap();
    }
    let mut ids = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let mut m = message(s.session_id, s.root_conversation_id, "", i as u64);
        m.content = size.map(|n| "é".repeat(n / 2) + &"a".repeat(n % 2));
        ids.push(store.append_message(m).await.unwrap().message_id);
        if i % 3 == 0 {
            let noise = message(other.session_id, other.root_conversation_id, "noise", 0);
            store.append_message(noise).await.unwrap();
        }
    }
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .messages(s.session_id, limit, max_bytes, cursor)
            .await
            .unwrap();
        let bytes: usize = page
            .messages
            .iter()
            .map(|m| m.content.as_ref().map_or(0, String::len))
            .sum();
        prop_assert!(page.messages.len() <= limit);
        prop_assert!(bytes <= max_bytes || page.messages.len() == 1, "{bytes}");
        prop_assert!(!page.messages.is_empty() || (seen.is_empty() && ids.is_empty()));
        prop_assert!(page.messages.iter().all(|m| m.session_id == s.session_id));
        // The cursor is the oldest message of the page.
        if let Some(b) = page.next_before {
            prop_assert_eq!(Some(b), page.messages.first().map(|m| m.message_id));
        }
        let mut got: Vec<u64> = page.messages.iter().map(|m| m.message_id).collect();
        got.extend(seen);
        seen = got;
        match page.next_before {
            Some(b) => cursor = Some(b),
            None => break,
        }
    }
    Ok((seen, ids))
}

fn arb_sizes() -> impl Strategy<Value = Vec<Option<usize>>> {
    proptest::collection::vec(proptest::option::weighted(0.9, 0usize..300), 0..30)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkpointer_copies_the_wal_into_the_database() {
    let (dir, store) = fresh_sqlite();
    let (s, root) = seeded(&store, None).await;
    let db = db_path(dir.path());
    let before = std::fs::metadata(&db).unwrap().len();
    let text = "x".repeat(1000);
    for i in 0..300 {
        store
            .append_message(message(s.session_id, root, &text, i))
            .await
            .unwrap();
    }
    // Far below the writers' own autocheckpoint threshold: only the checkpointer copies.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::metadata(&db).unwrap().len() < before + 300 * 1000 {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Names and labels of every counter increment and histogram record, in order.
#[derive(Default, Clone)]
struct Recorded(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Recorded {
    fn handle(&self, key: &metrics::Key) -> std::sync::Arc<Handle> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        std::sync::Arc::new(Handle(
            format!("{}{{{}}}", key.name(), labels.join(",")),
            self.clone(),
        ))
    }

    fn count(&self, line: &str) -> usize {
        self.0.lock().unwrap().iter().filter(|l| *l == line).count()
    }
}

struct Handle(String, Recorded);

impl metrics::CounterFn for Handle {
    fn increment(&self, _: u64) {
        self.1.0.lock().unwrap().push(self.0.clone());
    }
    fn absolute(&self, _: u64) {}
}

impl metrics::HistogramFn for Handle {
    fn record(&self, _: f64) {
        self.1.0.lock().unwrap().push(self.0.clone());
    }
}

impl metrics::Recorder for Recorded {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::from_arc(self.handle(key))
    }
}

#[test]
fn operations_are_timed_and_failures_counted_by_op_and_kind() {
    operations_are_timed(Kind::Sqlite);
}

#[test]
fn operations_are_timed_and_failures_counted_by_op_and_kind_on_postgres() {
    operations_are_timed(Kind::Postgres);
}

fn operations_are_timed(backend: Kind) {
    let recorded = Recorded::default();
    metrics::with_local_recorder(&recorded, || {
        runtime().block_on(async {
            let (_dir, store) = fresh(backend).await;
            let (s, root) = seeded(&*store, None).await;
            store
                .append_message(message(s.session_id, root, "x", 1))
                .await
                .unwrap();
            let _ = store
                .append_message(message(s.session_id, ConversationId::new(), "x", 1))
                .await;
            store
                .messages(s.session_id, 10, MAX_PAGE_BYTES, None)
                .await
                .unwrap();
        });
    });
    let d = super::metrics::OPERATION_DURATION;
    let e = super::metrics::ERRORS;
    assert_eq!(recorded.count(&format!("{d}{{op=append_message}}")), 2);
    assert_eq!(recorded.count(&format!("{d}{{op=messages}}")), 1);
    assert_eq!(recorded.count(&format!("{d}{{op=create_session}}")), 1);
    assert_eq!(
        recorded.count(&format!("{e}{{kind=not_found,op=append_message}}")),
        1
    );
    assert_eq!(
        recorded.count(&format!("{e}{{kind=not_found,op=messages}}")),
        0
    );
}

// ---- P1: session status and updates, message types and metadata ----

/// The rules of session status, `updated_ms`, and typed messages with metadata, for any store.
async fn status_and_types_rules(store: &dyn Store) {
    let s = session_in(Some("p"), 1);
    store.create_session(s.clone()).await.unwrap();
    let got = store.get_session(s.session_id).await.unwrap().unwrap();
    assert_eq!(got.status, SessionStatus::Active, "a new session is active");
    assert_eq!(got.updated_ms, 1, "updated when created");
    let root = s.root_conversation_id;
    store
        .put_conversation(conversation_of(&s, root, 1))
        .await
        .unwrap();
    let after_open = store.get_session(s.session_id).await.unwrap().unwrap();
    assert!(after_open.updated_ms > 1, "a conversation stored moves it");

    // A message written later moves it to the message's time; an older one never back.
    let future = after_open.updated_ms + 1_000_000;
    let user = store
        .append_message(NewMessage {
            status: Some(MessageStatus::Running),
            task_id: None,
            ..message(s.session_id, root, "run a tool", future)
        })
        .await
        .unwrap();
    assert_eq!(user.kind, MessageKind::Text);
    assert_eq!(user.metadata, None);
    let got = store.get_session(s.session_id).await.unwrap().unwrap();
    assert_eq!(got.updated_ms, future);
    store
        .append_message(message(s.session_id, root, "old", 2))
        .await
        .unwrap();
    let got = store.get_session(s.session_id).await.unwrap().unwrap();
    assert_eq!(got.updated_ms, future, "never moved back");

    // The end of a message stores its exchange before its reply, in one go and in order.
    let task = TaskId::new();
    let typed = |kind, text: &str, meta: serde_json::Value| NewMessage {
        kind,
        metadata: Some(Json(meta)),
        role: Role::Assistant,
        task_id: Some(task),
        ..message(s.session_id, root, text, future + 1)
    };
    let done = store
        .finish_message(FinishMessage {
            message_id: user.message_id,
            status: MessageStatus::Completed,
            task_id: Some(task),
            items: vec![
                typed(
                    MessageKind::ToolCall,
                    r#"{"command":["echo","hi"]}"#,
                    serde_json::json!({"tool": "shell", "call_id": "c1"}),
                ),
                typed(
                    MessageKind::ToolResult,
                    "hi\n",
                    serde_json::json!({"tool": "shell", "call_id": "c1", "is_error": false}),
                ),
            ],
            reply: Some(reply_to(s.session_id, root, task)),
            session_status: None,
        })
        .await
        .unwrap();
    let ids: Vec<u64> = done.items.iter().map(|m| m.message_id).collect();
    let reply_id = done.reply.as_ref().unwrap().message_id;
    assert!(
        ids[0] < ids[1] && ids[1] < reply_id,
        "items, then the reply"
    );
    assert_eq!(done.message.reply_message_id, Some(reply_id));
    let page = store
        .messages(s.session_id, 10, MAX_PAGE_BYTES, None)
        .await
        .unwrap();
    let kinds: Vec<MessageKind> = page.messages.iter().map(|m| m.kind).collect();
    assert_eq!(
        kinds,
        vec![
            MessageKind::Text,
            MessageKind::Text,
            MessageKind::ToolCall,
            MessageKind::ToolResult,
            MessageKind::Text
        ]
    );
    assert_eq!(page.messages[2].metadata, done.items[0].metadata);
    assert_eq!(
        page.messages[3].metadata.as_ref().unwrap().0["is_error"],
        false
    );
    assert_eq!(
        store
            .message(ids[1])
            .await
            .unwrap()
            .unwrap()
            .content
            .as_deref(),
        Some("hi\n")
    );
    // An exchange item naming another session's conversation fails the whole end.
    let other = session_in(None, 1);
    store.create_session(other.clone()).await.unwrap();
    let pending = store
        .append_message(NewMessage {
            status: Some(MessageStatus::Running),
            ..message(s.session_id, root, "again", future + 2)
        })
        .await
        .unwrap();
    let bad = store
        .finish_message(FinishMessage {
            message_id: pending.message_id,
            status: MessageStatus::Completed,
            task_id: None,
            items: vec![NewMessage {
                conversation_id: ConversationId::new(),
                ..typed(MessageKind::ToolCall, "{}", serde_json::json!({}))
            }],
            reply: None,
            session_status: Some(SessionStatus::Completed),
        })
        .await;
    assert_eq!(kind(bad), ErrorKind::NotFound);
    assert_eq!(
        store
            .get_session(s.session_id)
            .await
            .unwrap()
            .unwrap()
            .status,
        SessionStatus::Active,
        "its status neither"
    );
    assert_eq!(
        store
            .message(pending.message_id)
            .await
            .unwrap()
            .unwrap()
            .status,
        Some(MessageStatus::Running),
        "nothing of a failed end is kept"
    );

    // Status: set, listed, and its time kept monotonic.
    store
        .set_session_status(s.session_id, SessionStatus::Completed, 3)
        .await
        .unwrap();
    let got = store.get_session(s.session_id).await.unwrap().unwrap();
    assert_eq!(got.status, SessionStatus::Completed);
    assert_eq!(got.updated_ms, future + 2);
    store
        .set_session_status(s.session_id, SessionStatus::Failed, future + 9)
        .await
        .unwrap();
    let listed = store.project_sessions("p").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, SessionStatus::Failed);
    assert_eq!(listed[0].updated_ms, future + 9);
    assert_eq!(
        kind(
            store
                .set_session_status(SessionId::new(), SessionStatus::Active, 1)
                .await
        ),
        ErrorKind::NotFound
    );
    // Closing a conversation moves it too.
    store.close_conversation(root, future + 20).await.unwrap();
    let got = store.get_session(s.session_id).await.unwrap().unwrap();
    assert_eq!(got.updated_ms, future + 20);

    // A user message makes the session active; its end sets the status it names, with it.
    let (t, t_root) = (session_in(None, 1), ConversationId::new());
    let t = SessionRecord {
        root_conversation_id: t_root,
        status: SessionStatus::Cancelled,
        ..t
    };
    store.create_session(t.clone()).await.unwrap();
    store
        .put_conversation(conversation_of(&t, t_root, 1))
        .await
        .unwrap();
    let status_of = |id| async move { store.get_session(id).await.unwrap().unwrap().status };
    assert_eq!(status_of(t.session_id).await, SessionStatus::Cancelled);
    store
        .append_message(reply_to(t.session_id, t_root, TaskId::new()))
        .await
        .unwrap();
    assert_eq!(
        status_of(t.session_id).await,
        SessionStatus::Cancelled,
        "a reply alone changes nothing"
    );
    let asked = store
        .append_message(self::user(
            t.session_id,
            t_root,
            "go",
            MessageStatus::Queued,
        ))
        .await
        .unwrap();
    assert_eq!(status_of(t.session_id).await, SessionStatus::Active);
    store
        .finish_message(FinishMessage {
            message_id: asked.message_id,
            status: MessageStatus::Failed,
            task_id: None,
            items: Vec::new(),
            reply: None,
            session_status: Some(SessionStatus::Failed),
        })
        .await
        .unwrap();
    assert_eq!(status_of(t.session_id).await, SessionStatus::Failed);
}

async fn sessions_have_a_status_and_messages_a_type(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    status_and_types_rules(&*store).await;
}

#[tokio::test]
async fn sessions_have_a_status_and_messages_a_type_in_memory() {
    status_and_types_rules(&crate::memory::MemoryStore::new()).await;
}

async fn status_and_types_survive_a_reopen(backend: Kind) {
    let (dir, store) = fresh(backend).await;
    let (s, root) = seeded(&*store, None).await;
    store
        .set_session_status(s.session_id, SessionStatus::Cancelled, 7)
        .await
        .unwrap();
    let m = store
        .append_message(NewMessage {
            kind: MessageKind::Status,
            metadata: Some(Json(
                serde_json::json!({"status": "cancelled", "reply_to": 1}),
            )),
            ..message(s.session_id, root, "cancelled", 8)
        })
        .await
        .unwrap();
    drop(store);
    let store = reopen(&dir).await;
    let got = store.get_session(s.session_id).await.unwrap().unwrap();
    assert_eq!(got.status, SessionStatus::Cancelled);
    assert_eq!(store.message(m.message_id).await.unwrap().unwrap(), m);
}

#[tokio::test]
async fn upgrade_from_version_4_types_old_messages_as_text_and_sessions_as_active() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let s = session_in(Some("p"), 5);
    let quiet = session_in(Some("p"), 9);
    let c = s.root_conversation_id;
    let qc = quiet.root_conversation_id;
    {
        let mut conn = super::conn::open(&path, super::conn::Role::Writer).unwrap();
        schema::migrate_to(&mut conn, 4).unwrap();
        assert_eq!(schema::version(&conn).unwrap(), 4);
        conn.execute_batch(&format!(
            "INSERT INTO sessions VALUES ('{s}', 'p', 'old', 5, '{c}', '{{}}');
             INSERT INTO sessions VALUES ('{q}', 'p', 'quiet', 9, '{qc}', '{{}}');
             INSERT INTO conversations VALUES ('{c}', '{s}', '{{}}', 1, 'open', 5, NULL, NULL);
             INSERT INTO messages (session_id, conversation_id, task_id, role, content, chars, created_ms, status)
                 VALUES ('{s}', '{c}', NULL, 'user', 'hello', 5, 6, 'completed');
             INSERT INTO messages (session_id, conversation_id, task_id, role, content, chars, created_ms)
                 VALUES ('{s}', '{c}', NULL, 'assistant', 'hi', 2, 8);",
            s = s.session_id,
            q = quiet.session_id,
        ))
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let got = store.get_session(s.session_id).await.unwrap().unwrap();
    assert_eq!(got.status, SessionStatus::Active);
    assert_eq!(got.updated_ms, 8, "updated at its newest message");
    let got = store.get_session(quiet.session_id).await.unwrap().unwrap();
    assert_eq!(
        (got.status, got.updated_ms),
        (SessionStatus::Active, 9),
        "no message: updated when created"
    );
    let page = store
        .messages(s.session_id, 10, MAX_PAGE_BYTES, None)
        .await
        .unwrap();
    assert_eq!(page.messages.len(), 2);
    for m in &page.messages {
        assert_eq!((m.kind, &m.metadata), (MessageKind::Text, &None));
    }
    assert_eq!(page.messages[0].content.as_deref(), Some("hello"));
    // And the new columns take writes.
    store
        .set_session_status(s.session_id, SessionStatus::Completed, 10)
        .await
        .unwrap();
    let conn = super::conn::open(&path, super::conn::Role::Reader).unwrap();
    assert_eq!(schema::version(&conn).unwrap(), schema::VERSION);
}

// ---- agent bindings (A1) ----

fn binding(
    session_id: SessionId,
    agent: &str,
    provider_session_id: &str,
    at: u64,
) -> troupe_proto::agent::AgentBinding {
    troupe_proto::agent::AgentBinding {
        session_id,
        agent_id: agent.to_owned(),
        provider: troupe_proto::agent::ProviderKind::Model,
        provider_session_id: provider_session_id.to_owned(),
        created_ms: at,
        updated_ms: at,
    }
}

/// What every store keeps of bindings: one per (session, agent), replaced by a later put,
/// listed per session or for all, ordered by session then agent; removing is idempotent; a
/// binding needs no session row (a session's hub may bind before the service writes one).
async fn binding_rules(store: &dyn Store) {
    use troupe_proto::agent::ProviderKind;
    let (a, b) = {
        let (x, y) = (SessionId::new(), SessionId::new());
        if x < y { (x, y) } else { (y, x) }
    };
    assert!(store.bindings(Some(a)).await.unwrap().is_empty());
    store
        .put_binding(binding(a, "reviewer", "r1", 5))
        .await
        .unwrap();
    store
        .put_binding(binding(a, "coder", "c1", 6))
        .await
        .unwrap();
    store
        .put_binding(binding(b, "coder", "c2", 7))
        .await
        .unwrap();
    let of_a = store.bindings(Some(a)).await.unwrap();
    assert_eq!(
        of_a.iter().map(|x| x.agent_id.as_str()).collect::<Vec<_>>(),
        ["coder", "reviewer"]
    );
    let all = store.bindings(None).await.unwrap();
    assert_eq!(
        all.iter()
            .map(|x| (x.session_id, x.provider_session_id.as_str()))
            .collect::<Vec<_>>(),
        [(a, "c1"), (a, "r1"), (b, "c2")]
    );
    // A later put replaces: another provider session, another kind, another time.
    let replaced = troupe_proto::agent::AgentBinding {
        provider: ProviderKind::Acp,
        provider_session_id: "sess-9".into(),
        updated_ms: 11,
        ..binding(a, "coder", "x", 6)
    };
    store.put_binding(replaced.clone()).await.unwrap();
    let of_a = store.bindings(Some(a)).await.unwrap();
    assert_eq!(of_a.len(), 2);
    assert_eq!(of_a[0], replaced);
    store.remove_binding(a, "coder").await.unwrap();
    store.remove_binding(a, "coder").await.unwrap();
    store.remove_binding(a, "nobody").await.unwrap();
    assert_eq!(store.bindings(Some(a)).await.unwrap().len(), 1);
    // Out of range numbers are refused, as for every other row.
    let huge = troupe_proto::agent::AgentBinding {
        updated_ms: u64::MAX,
        ..binding(a, "x", "y", 1)
    };
    assert_eq!(kind(store.put_binding(huge).await), ErrorKind::InvalidInput);
}

async fn bindings_follow_the_rules(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    binding_rules(&*store).await;
}

#[tokio::test]
async fn bindings_follow_the_rules_in_memory() {
    binding_rules(&crate::memory::MemoryStore::new()).await;
}

async fn bindings_survive_a_reopen(backend: Kind) {
    let (dir, store) = fresh(backend).await;
    let s = SessionId::new();
    let b = binding(s, "coder", "0190-conversation", 42);
    store.put_binding(b.clone()).await.unwrap();
    drop(store);
    let store = reopen(&dir).await;
    assert_eq!(store.bindings(Some(s)).await.unwrap(), [b]);
}

#[tokio::test]
async fn upgrade_from_version_5_adds_bindings_and_keeps_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let s = session_in(Some("p"), 5);
    let c = s.root_conversation_id;
    {
        let mut conn = super::conn::open(&path, super::conn::Role::Writer).unwrap();
        schema::migrate_to(&mut conn, 5).unwrap();
        conn.execute_batch(&format!(
            "INSERT INTO sessions (session_id, project_id, title, created_ms, root_conversation_id, settings)
                 VALUES ('{s}', 'p', 'old', 5, '{c}', '{{}}');",
            s = s.session_id,
        ))
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    assert!(store.get_session(s.session_id).await.unwrap().is_some());
    assert!(store.bindings(None).await.unwrap().is_empty());
    store
        .put_binding(binding(s.session_id, "coder", "c", 6))
        .await
        .unwrap();
    assert_eq!(store.bindings(Some(s.session_id)).await.unwrap().len(), 1);
    let conn = super::conn::open(&path, super::conn::Role::Reader).unwrap();
    assert_eq!(schema::version(&conn).unwrap(), schema::VERSION);
}

#[tokio::test]
async fn upgrade_from_version_9_keeps_tokens_as_they_were_issued() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    {
        let mut conn = super::conn::open(&path, super::conn::Role::Writer).unwrap();
        schema::migrate_to(&mut conn, 9).unwrap();
        conn.execute_batch(
            r#"INSERT INTO auth_tokens (token_id, digest, agent, tool, args, issued_by, issued_ms,
                   expires_ms, max_uses, uses, revoked_ms)
               VALUES ('old', 'd', '*', 'files__write', '*"path":"notes/*', 'ann', 1, 2, 1, 0, NULL);"#,
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let old = store.token_by_digest("d").await.unwrap().unwrap();
    // Its pattern is read as it was written (the token book refuses it: `obsolete`), with
    // no field patterns.
    assert_eq!(old.scope.args.as_deref(), Some(r#"*"path":"notes/*"#));
    assert!(old.scope.fields.is_empty());
    {
        let conn = super::conn::open(&path, super::conn::Role::Writer).unwrap();
        conn.execute("UPDATE auth_tokens SET arg_fields = '[1]'", [])
            .unwrap();
    }
    let err = store.token_by_digest("d").await.unwrap_err();
    assert!(err.to_string().contains("arg_fields"), "{err}");
}

#[tokio::test]
async fn a_corrupt_binding_row_is_an_error_naming_it() {
    let (dir, store) = fresh_sqlite();
    let s = SessionId::new();
    store
        .put_binding(binding(s, "coder", "c", 1))
        .await
        .unwrap();
    {
        let conn = super::conn::open(&db_path(dir.path()), super::conn::Role::Writer).unwrap();
        conn.execute("UPDATE agent_bindings SET provider = 'iflow'", [])
            .unwrap();
    }
    let err = store.bindings(Some(s)).await.unwrap_err();
    assert!(
        err.to_string().contains("agent_bindings") && err.to_string().contains("iflow"),
        "{err}"
    );
}

/// One step of a binding history.
#[derive(Debug, Clone)]
enum BindingOp {
    Put {
        session: usize,
        agent: usize,
        psid: u8,
        at: u32,
    },
    Remove {
        session: usize,
        agent: usize,
    },
}

fn arb_binding_op() -> impl Strategy<Value = BindingOp> {
    prop_oneof![
        (0..3usize, 0..3usize, any::<u8>(), any::<u32>()).prop_map(|(session, agent, psid, at)| {
            BindingOp::Put {
                session,
                agent,
                psid,
                at,
            }
        }),
        (0..3usize, 0..3usize).prop_map(|(session, agent)| BindingOp::Remove { session, agent }),
    ]
}

/// The P6 properties (and the byte budget's and the bindings'), on one backend.
macro_rules! store_properties {
    ($kind:expr) => {
        proptest! {
            #![proptest_config(cases())]

            /// What append_message acknowledged reads back identical, before and after a reopen.
            #[test]
            fn prop_message_round_trip(
                contents in proptest::collection::vec(
                    // Any character, NUL and controls included.
                    (proptest::option::of("(?s).{0,24}"), arb_role(), any::<bool>(), 0..=MAX_INT, 0..=MAX_INT),
                    1..8,
                ),
            ) {
                let rt = runtime();
                rt.block_on(async {
                    let (dir, store) = fresh($kind).await;
                    let (s, root) = seeded(&*store, None).await;
                    let mut acked = Vec::new();
                    for (content, role, with_task, chars, created_ms) in contents {
                        let m = NewMessage {
                            session_id: s.session_id,
                            conversation_id: root,
                            task_id: with_task.then(TaskId::new),
                            role,
                            content,
                            chars,
                            created_ms,
                            status: None,
                            kind: troupe_proto::store::MessageKind::Text,
                            metadata: None,
                        };
                        let record = store.append_message(m.clone()).await.unwrap();
                        prop_assert_eq!(&record.content, &m.content);
                        prop_assert_eq!(record.role, m.role);
                        prop_assert_eq!(record.task_id, m.task_id);
                        prop_assert_eq!(record.chars, m.chars);
                        prop_assert_eq!(record.created_ms, m.created_ms);
                        acked.push(record);
                    }
                    let page = store.messages(s.session_id, acked.len(), MAX_PAGE_BYTES, None).await.unwrap();
                    prop_assert_eq!(&page.messages, &acked);
                    drop(store);
                    let page = reopen(&dir).await.messages(s.session_id, acked.len(), MAX_PAGE_BYTES, None).await.unwrap();
                    prop_assert_eq!(&page.messages, &acked);
                    Ok(())
                })?;
            }

            /// Each session id names one session: a repeated id is refused and changes nothing.
            #[test]
            fn prop_unique_session_ids(picks in proptest::collection::vec(0usize..6, 1..20)) {
                let rt = runtime();
                rt.block_on(async {
                    let (_dir, store) = fresh($kind).await;
                    let pool: Vec<SessionRecord> =
                        (0..6).map(|i| session_in(Some("p"), i)).collect();
                    let mut created: Vec<SessionRecord> = Vec::new();
                    for i in picks {
                        let result = store.create_session(pool[i].clone()).await;
                        if created.iter().any(|s| s.session_id == pool[i].session_id) {
                            prop_assert_eq!(kind(result), ErrorKind::InvalidInput);
                        } else {
                            prop_assert!(result.is_ok());
                            created.push(pool[i].clone());
                        }
                    }
                    let all = store.all_sessions().await.unwrap();
                    let ids: HashSet<_> = all.iter().map(|s| s.session_id).collect();
                    prop_assert_eq!(ids.len(), all.len());
                    prop_assert_eq!(all.len(), created.len());
                    for s in &created {
                        let got = store.get_session(s.session_id).await.unwrap();
                        prop_assert_eq!(got.as_ref(), Some(s));
                    }
                    Ok(())
                })?;
            }

            /// After any sequence of switches, each project's current session is the last one set
            /// successfully; refused switches change nothing.
            #[test]
            fn prop_current_session_switch(
                ops in proptest::collection::vec((0usize..3, 0usize..7), 1..25),
            ) {
                let rt = runtime();
                rt.block_on(async {
                    let (_dir, store) = fresh($kind).await;
                    let projects = ["a", "b", "c"];
                    let mut sessions = Vec::new();
                    for (i, p) in projects.iter().enumerate() {
                        for _ in 0..2 {
                            let s = session_in(Some(p), i as u64);
                            store.create_session(s.clone()).await.unwrap();
                            sessions.push(s);
                        }
                    }
                    let mut model: BTreeMap<&str, SessionId> = BTreeMap::new();
                    for (p, s) in ops {
                        let project = projects[p];
                        // Index 6 names no session at all.
                        let (id, owner) = sessions
                            .get(s)
                            .map_or((SessionId::new(), None), |s| (s.session_id, s.project_id.clone()));
                        let result = store.set_current_session(project, id).await;
                        match owner {
                            None => prop_assert_eq!(kind(result), ErrorKind::NotFound),
                            Some(o) if o != project => prop_assert_eq!(kind(result), ErrorKind::InvalidInput),
                            Some(_) => {
                                prop_assert!(result.is_ok());
                                model.insert(project, id);
                            }
                        }
                        for p in projects {
                            prop_assert_eq!(store.current_session(p).await.unwrap(), model.get(p).copied());
                        }
                    }
                    Ok(())
                })?;
            }

            /// The current sessions read back the same from a reopened store.
            #[test]
            fn prop_current_session_load(
                ops in proptest::collection::vec((0usize..3, 0usize..2), 0..10),
            ) {
                let rt = runtime();
                rt.block_on(async {
                    let (dir, store) = fresh($kind).await;
                    let projects = ["a", "b", "c"];
                    let mut sessions = BTreeMap::new();
                    for p in projects {
                        for i in 0..2 {
                            let s = session_in(Some(p), i);
                            store.create_session(s.clone()).await.unwrap();
                            sessions.insert((p, i), s.session_id);
                        }
                    }
                    let mut model: BTreeMap<&str, SessionId> = BTreeMap::new();
                    for (p, i) in ops {
                        let id = sessions[&(projects[p], i as u64)];
                        store.set_current_session(projects[p], id).await.unwrap();
                        model.insert(projects[p], id);
                    }
                    drop(store);
                    let store = reopen(&dir).await;
                    for p in projects {
                        prop_assert_eq!(store.current_session(p).await.unwrap(), model.get(p).copied());
                    }
                    Ok(())
                })?;
            }

            /// A page holds min(N, M) messages, where M is how many are older than the cursor: the
            /// newest such ones, oldest first. Following `next_before` visits every message once.
            #[test]
            fn prop_pagination_min_n_m_and_cursor(
                total in 0usize..40,
                noise in 0usize..10,
                limit in 0usize..12,
                cursor_pick in proptest::option::of(0usize..45),
            ) {
                let rt = runtime();
                rt.block_on(async {
                    let (_dir, store) = fresh($kind).await;
                    let (s, root) = seeded(&*store, None).await;
                    let (other, other_root) = seeded(&*store, None).await;
                    let mut ids = Vec::new();
                    for i in 0..total.max(noise) {
                        if i < total {
                            let m = store
                                .append_message(message(s.session_id, root, &format!("m{i}"), i as u64))
                                .await
                                .unwrap();
                            ids.push(m.message_id);
                        }
                        if i < noise {
                            store
                                .append_message(message(other.session_id, other_root, "noise", 0))
                                .await
                                .unwrap();
                        }
                    }
                    // A cursor: some message's id, one past the last, or none.
                    let before = cursor_pick.map(|k| ids.get(k).copied().unwrap_or(u64::MAX / 2));
                    let older: Vec<u64> = ids
                        .iter()
                        .copied()
                        .filter(|id| before.is_none_or(|b| *id < b))
                        .collect();
                    let page = store.messages(s.session_id, limit, MAX_PAGE_BYTES, before).await.unwrap();
                    let got: Vec<u64> = page.messages.iter().map(|m| m.message_id).collect();
                    prop_assert_eq!(got.len(), limit.min(older.len()));
                    prop_assert_eq!(&got[..], &older[older.len() - got.len()..]);
                    prop_assert!(page.messages.iter().all(|m| m.session_id == s.session_id));
                    let has_more = older.len() > limit;
                    prop_assert_eq!(page.next_before.is_some(), has_more);

                    // Walking the cursor from the newest page visits everything once, in order.
                    if limit > 0 {
                        let mut seen = Vec::new();
                        let mut cursor = None;
                        loop {
                            let page = store.messages(s.session_id, limit, MAX_PAGE_BYTES, cursor).await.unwrap();
                            prop_assert!(page.messages.len() <= limit);
                            let mut ids: Vec<u64> = page.messages.iter().map(|m| m.message_id).collect();
                            ids.extend(seen);
                            seen = ids;
                            match page.next_before {
                                Some(b) => cursor = Some(b),
                                None => break,
                            }
                        }
                        prop_assert_eq!(&seen, &ids);
                    }
                    Ok(())
                })?;
            }
        }

        proptest! {
            #![proptest_config(cases())]

            /// Over any message sizes (multi-byte text, contentless messages), both stores page
            /// within the count and the byte budget (a larger message alone) and the cursor walk
            /// returns every message of the session exactly once, in order.
            #[test]
            fn prop_pages_within_the_byte_budget_cover_everything_once(
                sizes in arb_sizes(),
                limit in 1usize..10,
                max_bytes in 0usize..600,
            ) {
                let rt = runtime();
                rt.block_on(async {
                    let (_dir, store) = fresh($kind).await;
                    let (seen, ids) = walk_sized_pages(&*store, &sizes, limit, max_bytes).await?;
                    prop_assert_eq!(seen, ids);
                    let memory = crate::memory::MemoryStore::new();
                    let (seen, ids) = walk_sized_pages(&memory, &sizes, limit, max_bytes).await?;
                    prop_assert_eq!(seen, ids);
                    Ok(())
                })?;
            }
        }

        proptest! {
            #![proptest_config(cases())]

            /// Any history of puts and removes leaves both stores holding exactly what a map keyed by
            /// (session, agent) holds, listed in the same order, before and after a reopen.
            #[test]
            fn prop_bindings_behave_like_a_map(ops in proptest::collection::vec(arb_binding_op(), 0..24)) {
                let rt = runtime();
                rt.block_on(async {
                    let mut sessions: Vec<SessionId> = (0..3).map(|_| SessionId::new()).collect();
                    sessions.sort();
                    let agents = ["a", "b", "c"];
                    let (dir, sqlite) = fresh($kind).await;
                    let memory = crate::memory::MemoryStore::new();
                    let mut model: BTreeMap<(SessionId, &str), troupe_proto::agent::AgentBinding> = BTreeMap::new();
                    for op in &ops {
                        match *op {
                            BindingOp::Put { session, agent, psid, at } => {
                                let b = binding(sessions[session], agents[agent], &format!("p{psid}"), u64::from(at));
                                sqlite.put_binding(b.clone()).await.unwrap();
                                memory.put_binding(b.clone()).await.unwrap();
                                model.insert((sessions[session], agents[agent]), b);
                            }
                            BindingOp::Remove { session, agent } => {
                                sqlite.remove_binding(sessions[session], agents[agent]).await.unwrap();
                                memory.remove_binding(sessions[session], agents[agent]).await.unwrap();
                                model.remove(&(sessions[session], agents[agent]));
                            }
                        }
                    }
                    let expected: Vec<_> = model.values().cloned().collect();
                    prop_assert_eq!(&sqlite.bindings(None).await.unwrap(), &expected);
                    prop_assert_eq!(&memory.bindings(None).await.unwrap(), &expected);
                    for s in &sessions {
                        let of_s: Vec<_> = expected.iter().filter(|b| b.session_id == *s).cloned().collect();
                        prop_assert_eq!(&sqlite.bindings(Some(*s)).await.unwrap(), &of_s);
                    }
                    drop(sqlite);
                    prop_assert_eq!(&reopen(&dir).await.bindings(None).await.unwrap(), &expected);
                    Ok(())
                })?;
            }
        }
    };
}

// ---- authorization tokens (A5) ----

fn auth_token(id: &str, digest: &str, issued_ms: u64) -> troupe_proto::governance::AuthToken {
    troupe_proto::governance::AuthToken {
        id: id.into(),
        digest: digest.into(),
        scope: troupe_proto::governance::TokenScope {
            agent: "coder".into(),
            tool: "shell".into(),
            args: Some("git status*".into()),
            fields: Default::default(),
        },
        issued_by: "ann".into(),
        issued_ms,
        expires_ms: issued_ms + 60_000,
        max_uses: 2,
        uses: 0,
        revoked_ms: None,
    }
}

/// What every store keeps of tokens: found by digest, counted by compare-and-set up to their
/// maximum, revoked once (a revoked one counts nothing), listed newest first.
async fn token_rules(store: &dyn Store) {
    let t = auth_token("t1", "d1", 10);
    store.insert_token(t.clone()).await.unwrap();
    // Field patterns are kept as issued.
    let mut scoped = auth_token("t2", "d2", 20);
    scoped.scope = troupe_proto::governance::TokenScope {
        agent: "*".into(),
        tool: "files__write".into(),
        args: None,
        fields: [("path", "notes/*"), ("mode", "\"a\"=*")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    };
    store.insert_token(scoped.clone()).await.unwrap();
    assert_eq!(store.token_by_digest("d2").await.unwrap(), Some(scoped));
    assert_eq!(
        kind(store.insert_token(auth_token("t3", "d1", 30)).await),
        ErrorKind::InvalidInput,
        "a digest is unique"
    );
    assert_eq!(store.token_by_digest("d1").await.unwrap(), Some(t.clone()));
    assert_eq!(store.token_by_digest("nope").await.unwrap(), None);
    assert!(store.use_token("t1", 0, 100).await.unwrap());
    assert!(
        !store.use_token("t1", 0, 100).await.unwrap(),
        "a stale count loses"
    );
    assert!(store.use_token("t1", 1, 100).await.unwrap());
    assert!(
        !store.use_token("t1", 2, 100).await.unwrap(),
        "never past max_uses"
    );
    assert!(!store.use_token("none", 0, 100).await.unwrap());
    // Expired at the time of the use: not counted, however the caller read it before.
    store
        .insert_token(auth_token("t4", "d4", 15))
        .await
        .unwrap();
    assert!(
        !store.use_token("t4", 0, 60_015).await.unwrap(),
        "not at its expiry"
    );
    assert!(store.use_token("t4", 0, 60_014).await.unwrap());
    assert_eq!(store.token_by_digest("d1").await.unwrap().unwrap().uses, 2);
    let revoked = store.revoke_token("t2", 50).await.unwrap().unwrap();
    assert_eq!(revoked.revoked_ms, Some(50));
    let again = store.revoke_token("t2", 60).await.unwrap().unwrap();
    assert_eq!(again.revoked_ms, Some(50), "the first revocation stays");
    assert!(!store.use_token("t2", 0, 100).await.unwrap());
    assert_eq!(store.revoke_token("none", 1).await.unwrap(), None);
    let ids: Vec<String> = store
        .tokens()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(ids, ["t2", "t4", "t1"]);
}

async fn tokens_follow_the_rules(backend: Kind) {
    let (_dir, store) = fresh(backend).await;
    token_rules(&*store).await;
}

#[tokio::test]
async fn tokens_follow_the_rules_in_memory() {
    token_rules(&super::memory::MemoryStore::new()).await;
}

async fn token_uses_survive_a_reopen(backend: Kind) {
    let (dir, store) = fresh(backend).await;
    store
        .insert_token(auth_token("t1", "digest-of-secret", 1))
        .await
        .unwrap();
    assert!(store.use_token("t1", 0, 100).await.unwrap());
    drop(store);
    let store = reopen(&dir).await;
    let t = store
        .token_by_digest("digest-of-secret")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((t.uses, t.max_uses), (1, 2));
    assert_eq!(t.scope.args.as_deref(), Some("git status*"));
}

#[tokio::test]
async fn no_token_secret_is_stored() {
    let (dir, store) = fresh_sqlite();
    store
        .insert_token(auth_token("t1", "digest-of-secret", 1))
        .await
        .unwrap();
    let conn = super::conn::open(&db_path(dir.path()), super::conn::Role::Reader).unwrap();
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('auth_tokens')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(!columns.iter().any(|c| c.contains("secret")), "{columns:?}");
}
#[tokio::test]
async fn a_lone_write_commits_on_the_callers_thread() {
    let (_dir, store) = fresh_sqlite();
    let store = Arc::new(store);
    let (s, root) = seeded(&*store, None).await;
    let before = store.fast_writes();
    assert_eq!(before, 2, "the session and its root conversation");
    let m = store
        .append_message(message(s.session_id, root, "hi", 1))
        .await
        .unwrap();
    assert_eq!(store.fast_writes(), before + 1);
    let read = store
        .messages(s.session_id, 10, MAX_PAGE_BYTES, None)
        .await
        .unwrap();
    assert_eq!(read.messages, vec![m]);
    // A failing write on the fast path is rolled back alone and leaves the connection clean.
    let bad = store
        .append_message(message(s.session_id, ConversationId::new(), "bad", 2))
        .await;
    assert_eq!(kind(bad), ErrorKind::NotFound);
    store
        .append_message(message(s.session_id, root, "again", 3))
        .await
        .unwrap();
    assert_eq!(store.fast_writes(), before + 3);
}

/// Another connection (another process on the same file) holds the database's write lock: a
/// write does not wait for it on the caller's thread (a runtime worker, which the busy
/// handler would put to sleep for up to the busy budget) but in the writer's queue, and
/// commits once the lock is free.
#[tokio::test(flavor = "current_thread")]
async fn a_write_that_finds_the_database_locked_waits_on_the_writer_thread() {
    let (dir, store) = fresh_sqlite();
    let store = Arc::new(store);
    let (s, root) = seeded(&*store, None).await;
    let (fast, queued) = (store.fast_writes(), store.queued_writes());
    let other = rusqlite::Connection::open(db_path(dir.path())).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let write = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .append_message(message(s.session_id, root, "waits", 1))
                .await
        })
    };
    // On this runtime's only thread: the write's task must have given the thread back.
    let t0 = std::time::Instant::now();
    while store.queued_writes() == queued {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(1) && !write.is_finished(),
            "the write held this thread ({:?})",
            t0.elapsed()
        );
        tokio::task::yield_now().await;
    }
    assert!(!write.is_finished());
    other.execute_batch("ROLLBACK").unwrap();
    write.await.unwrap().unwrap();
    assert_eq!(store.fast_writes(), fast, "not on the caller's thread");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// Holding the connection across awaits is the point: the writes must find it busy.
#[allow(clippy::await_holding_lock)]
async fn writes_that_find_the_connection_busy_wait_in_the_writer_queue() {
    let (_dir, store) = fresh_sqlite();
    let store = Arc::new(store);
    let (s, root) = seeded(&*store, None).await;
    let fast = store.fast_writes();
    assert_eq!(store.queued_writes(), 0);
    let held = store.hold_connection();
    let tasks: Vec<_> = (0..20u64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .append_message(message(s.session_id, root, &format!("m{i}"), i))
                    .await
            })
        })
        .collect();
    // All 20 are handed to the writer thread; none is committed while the connection is held.
    while store.queued_writes() < 20 {
        tokio::task::yield_now().await;
    }
    assert!(tasks.iter().all(|t| !t.is_finished()));
    drop(held);
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(store.fast_writes(), fast, "none went around the queue");
    assert_eq!(store.queued_writes(), 20);
    let page = store
        .messages(s.session_id, 100, MAX_PAGE_BYTES, None)
        .await
        .unwrap();
    assert_eq!(page.messages.len(), 20);
    // With the queue empty again, the next write takes the fast path.
    store
        .append_message(message(s.session_id, root, "after", 99))
        .await
        .unwrap();
    assert_eq!(store.fast_writes(), fast + 1);
}

mod sqlite_properties {
    use super::*;
    store_properties!(Kind::Sqlite);
}

mod postgres_properties {
    use super::*;
    store_properties!(Kind::Postgres);
}

on_every_backend!(
    sessions_round_trip_and_list_in_order,
    every_character_round_trips,
    unknown_ids_read_as_none_or_empty,
    a_duplicate_session_is_invalid_input,
    conversations_upsert_close_and_keep_their_order,
    append_message_checks_its_session_and_conversation,
    out_of_range_numbers_are_invalid_input,
    ttl_content_is_dropped_when_due,
    current_session_must_exist_and_belong_to_the_project,
    a_corrupt_row_is_an_error_naming_it,
    concurrent_writes_are_group_committed_and_isolated,
    a_zero_limit_page_keeps_the_cursor,
    a_page_stops_at_its_byte_budget,
    large_messages_page_at_the_byte_budget,
    no_instructions_are_stored_against_the_policy_on_any_backend,
    writes_survive_a_reopen,
    a_message_goes_from_queued_to_its_outcome_with_its_reply,
    a_failed_reply_leaves_the_message_pending,
    sessions_have_a_status_and_messages_a_type,
    status_and_types_survive_a_reopen,
    bindings_follow_the_rules,
    bindings_survive_a_reopen,
    tokens_follow_the_rules,
    token_uses_survive_a_reopen,
);
