//! The A2A endpoint's records (P5) and the open-conversation reads, against the `Store` rules:
//! the same rules for the SQLite, PostgreSQL and memory stores, surviving a reopen on both
//! databases, then what only SQLite has (its query plans, the upgrades from versions 5 and 6).

use super::backends::{Db, Kind, on_every_backend};
use super::memory::MemoryStore;
use super::schema;
use super::{BindingStore, SqliteStore, Store, db_path};
use serde_json::json;
use troupe_proto::store::{
    A2aContextRecord, A2aPruned, A2aPushRecord, A2aTaskQuery, A2aTaskRecord, ConversationRecord,
    ConversationState, SessionRecord, SessionStatus,
};
use troupe_proto::{ConversationId, ErrorKind, Json, OpenConversation, SessionId};

fn context(id: &str, created_ms: u64, open: bool) -> A2aContextRecord {
    A2aContextRecord {
        context_id: id.into(),
        session_id: SessionId::new(),
        conversation_id: ConversationId::new(),
        created_ms,
        active_ms: created_ms,
        open,
    }
}

fn task(id: &str, context_id: &str, state: &str, updated_ms: u64) -> A2aTaskRecord {
    A2aTaskRecord {
        task_id: id.into(),
        context_id: context_id.into(),
        state: state.into(),
        terminal: state == "TASK_STATE_COMPLETED",
        created_ms: 1,
        updated_ms,
        body: Json(json!({"id": id, "history": [{"text": format!("hello {id}")}]})),
        redacted: None,
        expires_ms: None,
    }
}

fn push(task_id: &str, id: &str, created_ms: u64) -> A2aPushRecord {
    A2aPushRecord {
        task_id: task_id.into(),
        config_id: id.into(),
        created_ms,
        body: Json(json!({"url": format!("http://127.0.0.1:9/{id}"), "token": "t"})),
    }
}

fn ids(tasks: &[A2aTaskRecord]) -> Vec<&str> {
    tasks.iter().map(|t| t.task_id.as_str()).collect()
}

async fn a2a_rules(store: &dyn Store) {
    // Contexts: upserted, read back, the open ones listed oldest first.
    assert_eq!(store.a2a_context("c1").await.unwrap(), None);
    let c1 = context("c1", 10, true);
    store.put_a2a_context(c1.clone()).await.unwrap();
    store.put_a2a_context(context("c0", 5, true)).await.unwrap();
    store
        .put_a2a_context(context("c2", 20, false))
        .await
        .unwrap();
    assert_eq!(store.a2a_context("c1").await.unwrap(), Some(c1.clone()));
    let open: Vec<String> = store
        .a2a_open_contexts()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.context_id)
        .collect();
    assert_eq!(open, ["c0", "c1"]);
    let closed = A2aContextRecord {
        open: false,
        active_ms: 30,
        ..c1.clone()
    };
    store.put_a2a_context(closed.clone()).await.unwrap();
    assert_eq!(store.a2a_context("c1").await.unwrap(), Some(closed));
    assert_eq!(store.a2a_open_contexts().await.unwrap().len(), 1);

    // Tasks need their context.
    let orphan = store
        .put_a2a_task(task("t0", "nope", "TASK_STATE_WORKING", 1))
        .await;
    assert_eq!(orphan.unwrap_err().kind(), ErrorKind::NotFound);
    let working = task("t1", "c1", "TASK_STATE_WORKING", 100);
    store.put_a2a_task(working.clone()).await.unwrap();
    assert_eq!(store.a2a_task("t1").await.unwrap(), Some(working.clone()));
    assert_eq!(store.a2a_task("t-none").await.unwrap(), None);
    for (id, ctx, at) in [("t2", "c1", 200), ("t3", "c2", 300), ("t4", "c2", 300)] {
        store
            .put_a2a_task(task(id, ctx, "TASK_STATE_COMPLETED", at))
            .await
            .unwrap();
    }
    assert_eq!(ids(&store.a2a_live_tasks().await.unwrap()), ["t1"]);
    // Replaced whole: t1 finishes.
    let done = task("t1", "c1", "TASK_STATE_COMPLETED", 150);
    store.put_a2a_task(done.clone()).await.unwrap();
    assert_eq!(store.a2a_task("t1").await.unwrap(), Some(done));
    assert!(store.a2a_live_tasks().await.unwrap().is_empty());
    store
        .put_a2a_task(task("t5", "c0", "TASK_STATE_INPUT_REQUIRED", 400))
        .await
        .unwrap();

    // Listing: newest first by (updated_ms, task_id), filtered, paged by the cursor.
    let q = |limit: usize| A2aTaskQuery {
        limit,
        ..A2aTaskQuery::default()
    };
    let page = store.a2a_tasks(q(10)).await.unwrap();
    assert_eq!(ids(&page.tasks), ["t5", "t4", "t3", "t2", "t1"]);
    assert_eq!(page.total, 5);
    let first = store.a2a_tasks(q(2)).await.unwrap();
    assert_eq!((ids(&first.tasks), first.total), (vec!["t5", "t4"], 5));
    let last = first.tasks.last().unwrap();
    let next = store
        .a2a_tasks(A2aTaskQuery {
            after: Some((last.updated_ms, last.task_id.clone())),
            ..q(2)
        })
        .await
        .unwrap();
    assert_eq!((ids(&next.tasks), next.total), (vec!["t3", "t2"], 5));
    let by_context = store
        .a2a_tasks(A2aTaskQuery {
            context_id: Some("c2".into()),
            ..q(10)
        })
        .await
        .unwrap();
    assert_eq!(ids(&by_context.tasks), ["t4", "t3"]);
    let by_state = store
        .a2a_tasks(A2aTaskQuery {
            state: Some("TASK_STATE_INPUT_REQUIRED".into()),
            ..q(10)
        })
        .await
        .unwrap();
    assert_eq!((ids(&by_state.tasks), by_state.total), (vec!["t5"], 1));
    let recent = store
        .a2a_tasks(A2aTaskQuery {
            updated_after_ms: Some(300),
            ..q(1)
        })
        .await
        .unwrap();
    assert_eq!((ids(&recent.tasks), recent.total), (vec!["t5"], 3));
    assert!(store.a2a_tasks(q(0)).await.unwrap().tasks.is_empty());

    // Push configs: need their task; upserted in place; deleted once.
    let orphan = store.put_a2a_push(push("t-none", "p", 1)).await;
    assert_eq!(orphan.unwrap_err().kind(), ErrorKind::NotFound);
    store.put_a2a_push(push("t5", "b", 1)).await.unwrap();
    store.put_a2a_push(push("t5", "a", 2)).await.unwrap();
    let mut replaced = push("t5", "b", 3);
    replaced.body = Json(json!({"url": "http://127.0.0.1:9/other"}));
    store.put_a2a_push(replaced.clone()).await.unwrap();
    let listed = store.a2a_pushes("t5").await.unwrap();
    let names: Vec<&str> = listed.iter().map(|p| p.config_id.as_str()).collect();
    assert_eq!(names, ["b", "a"], "a replaced config keeps its place");
    assert_eq!(listed[0].body, replaced.body);
    assert!(store.delete_a2a_push("t5", "a").await.unwrap());
    assert!(!store.delete_a2a_push("t5", "a").await.unwrap());
    assert_eq!(store.a2a_pushes("t5").await.unwrap().len(), 1);
    store.put_a2a_push(push("t2", "old", 1)).await.unwrap();

    // Retention: fewer finished tasks than kept → nothing goes.
    assert_eq!(store.prune_a2a(10).await.unwrap(), A2aPruned::default());
    // Keep the newest two finished (t4, t3): t2 and t1 go, with t2's push config; c1 is
    // closed and empty, older than the oldest kept: it goes; c0 is open and c2 has tasks.
    let pruned = store.prune_a2a(2).await.unwrap();
    assert_eq!(
        pruned,
        A2aPruned {
            tasks: 2,
            contexts: 1
        }
    );
    assert_eq!(store.a2a_task("t1").await.unwrap(), None);
    assert!(store.a2a_pushes("t2").await.unwrap().is_empty());
    assert_eq!(store.a2a_context("c1").await.unwrap(), None);
    assert!(store.a2a_context("c0").await.unwrap().is_some());
    assert!(store.a2a_context("c2").await.unwrap().is_some());
    assert_eq!(
        ids(&store.a2a_tasks(q(10)).await.unwrap().tasks),
        ["t5", "t4", "t3"],
        "the live task is never forgotten"
    );
    // Again: nothing more.
    assert_eq!(store.prune_a2a(2).await.unwrap(), A2aPruned::default());
    // Keeping none forgets every finished task; the live one and its config stay.
    assert_eq!(store.prune_a2a(0).await.unwrap().tasks, 2);
    assert_eq!(ids(&store.a2a_tasks(q(10)).await.unwrap().tasks), ["t5"]);
    assert_eq!(store.a2a_pushes("t5").await.unwrap().len(), 1);
}

/// Under `ttl` a task is stored whole with its text-less body beside it; the ttl sweep puts
/// that body in place once due, on every backend, and a write of the whole task after that
/// is the endpoint's to decide (it stores the text-less one then).
async fn a2a_expiry_rules(store: &dyn Store) {
    store.put_a2a_context(context("c", 1, true)).await.unwrap();
    let mut kept = task("t", "c", "TASK_STATE_COMPLETED", 5);
    let bare = Json(json!({"id": "t", "history": [{"text": ""}]}));
    kept.redacted = Some(bare.clone());
    kept.expires_ms = Some(1_000);
    store.put_a2a_task(kept.clone()).await.unwrap();
    let mut never = task("n", "c", "TASK_STATE_COMPLETED", 6);
    never.redacted = Some(bare.clone());
    never.expires_ms = Some(u64::MAX);
    store.put_a2a_task(never).await.unwrap();
    store
        .put_a2a_task(task("f", "c", "TASK_STATE_COMPLETED", 7))
        .await
        .unwrap();
    assert_eq!(store.a2a_task("t").await.unwrap(), Some(kept.clone()));

    // Not due yet: nothing changes.
    store.sweep_due(999).await.unwrap();
    assert_eq!(store.a2a_task("t").await.unwrap(), Some(kept.clone()));
    // Due: the text-less body, nothing left to expire; the others as they were.
    assert!(store.sweep_due(1_000).await.unwrap() >= 1);
    let swept = store.a2a_task("t").await.unwrap().unwrap();
    assert_eq!(swept.body, bare);
    assert_eq!((swept.redacted, swept.expires_ms), (None, None));
    assert_eq!(swept.state, kept.state);
    let never = store.a2a_task("n").await.unwrap().unwrap();
    assert!(
        never.body.0.to_string().contains("hello n"),
        "a ttl past the end of time never comes"
    );
    let full = store.a2a_task("f").await.unwrap().unwrap();
    assert!(
        full.body.0.to_string().contains("hello f"),
        "a task without expiry stays whole"
    );
}

async fn a2a_tasks_expire_under_ttl(backend: Kind) {
    let db = Db::fresh(backend);
    a2a_expiry_rules(&*db.store().await).await;
}

#[tokio::test]
async fn a2a_tasks_expire_under_ttl_in_memory() {
    a2a_expiry_rules(&MemoryStore::new()).await;
}

async fn a2a_records_keep_the_store_rules(backend: Kind) {
    let db = Db::fresh(backend);
    a2a_rules(&*db.store().await).await;
}

#[tokio::test]
async fn a2a_records_keep_the_store_rules_in_memory() {
    a2a_rules(&MemoryStore::new()).await;
}

fn session(created_ms: u64) -> SessionRecord {
    SessionRecord {
        session_id: SessionId::new(),
        project_id: Some("p".into()),
        title: None,
        created_ms,
        root_conversation_id: ConversationId::new(),
        settings: Json(json!({})),
        status: SessionStatus::Active,
        updated_ms: created_ms,
    }
}

fn conversation(s: &SessionRecord, id: ConversationId, created_ms: u64) -> ConversationRecord {
    ConversationRecord {
        conversation_id: id,
        session_id: s.session_id,
        params: OpenConversation::default(),
        is_root: id == s.root_conversation_id,
        state: ConversationState::Open,
        created_ms,
        closed_ms: None,
    }
}

async fn open_conversation_rules(store: &dyn Store) {
    let s = session(1);
    let other = session(2);
    store.create_session(s.clone()).await.unwrap();
    store.create_session(other.clone()).await.unwrap();
    let root = s.root_conversation_id;
    store
        .put_conversation(conversation(&s, root, 1))
        .await
        .unwrap();
    let (a, b, c) = (
        ConversationId::new(),
        ConversationId::new(),
        ConversationId::new(),
    );
    for (id, at) in [(a, 2), (b, 3), (c, 4)] {
        store
            .put_conversation(conversation(&s, id, at))
            .await
            .unwrap();
    }
    store
        .put_conversation(conversation(&other, other.root_conversation_id, 2))
        .await
        .unwrap();
    store.close_conversation(b, 10).await.unwrap();
    let open: Vec<ConversationId> = store
        .open_conversations(s.session_id)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.conversation_id)
        .collect();
    assert_eq!(open, [root, a, c]);
    let closed = store.conversation(b).await.unwrap().unwrap();
    assert_eq!(
        (closed.state, closed.closed_ms),
        (ConversationState::Closed, Some(10))
    );
    assert_eq!(
        store.conversation(ConversationId::new()).await.unwrap(),
        None
    );
    // Reopened: stored open again, listed again.
    store
        .put_conversation(conversation(&s, b, closed.created_ms))
        .await
        .unwrap();
    assert_eq!(
        store.open_conversations(s.session_id).await.unwrap().len(),
        4
    );
    assert!(
        store
            .open_conversations(SessionId::new())
            .await
            .unwrap()
            .is_empty()
    );
}

async fn open_conversations_are_read_alone(backend: Kind) {
    let db = Db::fresh(backend);
    open_conversation_rules(&*db.store().await).await;
}

#[tokio::test]
async fn open_conversations_are_read_alone_in_memory() {
    open_conversation_rules(&MemoryStore::new()).await;
}

async fn a2a_records_survive_a_reopen(backend: Kind) {
    let db = Db::fresh(backend);
    {
        let store = db.store().await;
        store.put_a2a_context(context("c", 1, true)).await.unwrap();
        store
            .put_a2a_task(task("t", "c", "TASK_STATE_WORKING", 5))
            .await
            .unwrap();
        store.put_a2a_push(push("t", "p", 1)).await.unwrap();
    }
    let store = db.store().await;
    assert!(store.a2a_context("c").await.unwrap().unwrap().open);
    assert_eq!(ids(&store.a2a_live_tasks().await.unwrap()), ["t"]);
    assert_eq!(store.a2a_pushes("t").await.unwrap()[0].config_id, "p");
}

#[test]
fn the_a2a_reads_use_their_indexes() {
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
    // What a start reads touches only the open and the live rows.
    let p = plan(
        "SELECT * FROM conversations WHERE session_id = 'x' AND state = 'open' ORDER BY created_ms, rowid",
    );
    assert!(p.contains("conversations_open"), "{p}");
    let p = plan("SELECT * FROM a2a_contexts WHERE open = 1 ORDER BY created_ms, context_id");
    assert!(p.contains("a2a_contexts_open"), "{p}");
    let p = plan("SELECT * FROM a2a_tasks WHERE terminal = 0 ORDER BY created_ms, task_id");
    assert!(p.contains("a2a_tasks_live"), "{p}");
    // Retention walks the finished tasks newest first.
    let p = plan(
        "SELECT updated_ms, task_id FROM a2a_tasks WHERE terminal = 1 ORDER BY updated_ms DESC, task_id DESC LIMIT 1 OFFSET 9",
    );
    assert!(
        p.contains("a2a_tasks_finished") && !p.contains("TEMP B-TREE"),
        "{p}"
    );
    // A context's listing is read in order from its index.
    let p = plan(
        "SELECT * FROM a2a_tasks WHERE context_id = 'c' ORDER BY updated_ms DESC, task_id DESC LIMIT 5",
    );
    assert!(
        p.contains("a2a_tasks_by_context") && !p.contains("TEMP B-TREE"),
        "{p}"
    );
}

/// A database written by the build before the agent bindings (v5) and one written by the
/// build before the A2A tables (v6) both reach this version with their rows.
#[tokio::test]
async fn upgrade_from_versions_5_and_6_keeps_rows_and_adds_the_a2a_tables() {
    for from in [5, 6] {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        let s = session(5);
        let c = s.root_conversation_id;
        {
            let mut conn = super::conn::open(&path, super::conn::Role::Writer).unwrap();
            schema::migrate_to(&mut conn, from).unwrap();
            conn.execute_batch(&format!(
                "INSERT INTO sessions (session_id, project_id, title, created_ms, root_conversation_id, settings)
                     VALUES ('{s}', 'p', NULL, 5, '{c}', '{{}}');
                 INSERT INTO conversations VALUES ('{c}', '{s}', '{{}}', 1, 'open', 5, NULL, NULL);",
                s = s.session_id,
            ))
            .unwrap();
            if from == 6 {
                conn.execute_batch(&format!(
                    "INSERT INTO agent_bindings VALUES ('{s}', 'coder', 'acp', 'x', 5, 5);",
                    s = s.session_id,
                ))
                .unwrap();
            }
        }
        let store = SqliteStore::open(&path).unwrap();
        let open = store.open_conversations(s.session_id).await.unwrap();
        assert_eq!(open.len(), 1, "from v{from}");
        assert_eq!(
            store.bindings(Some(s.session_id)).await.unwrap().len(),
            usize::from(from == 6),
            "from v{from}"
        );
        store.put_a2a_context(context("c", 1, true)).await.unwrap();
        assert!(store.a2a_context("c").await.unwrap().is_some());
        let conn = super::conn::open(&path, super::conn::Role::Reader).unwrap();
        assert_eq!(schema::version(&conn).unwrap(), schema::VERSION);
    }
}

on_every_backend!(
    a2a_records_keep_the_store_rules,
    a2a_tasks_expire_under_ttl,
    open_conversations_are_read_alone,
    a2a_records_survive_a_reopen,
);
