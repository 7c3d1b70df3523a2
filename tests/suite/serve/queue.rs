//! The durable queue: every acknowledged message reaches an outcome that the API shows
//! (REST, JSON-RPC, the event stream), queued messages run in order, a full queue refuses
//! before storing, a close cancels what waits, and a restart settles what was pending.

use super::{Api, Server, id};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_actors::ports::ApproxTokens;
use troupe_proto::store::{
    ConversationRecord, ConversationState, MessageStatus, NewMessage, SessionRecord,
};
use troupe_proto::{ConversationId, Json, OpenConversation, Role, SessionId, StoragePolicy};
use troupe_runtime::config::TroupeConfig;
use troupe_runtime::{ScriptedModel, ScriptedReply, assembly};
use troupe_service::Service;
use troupe_store::{SqliteStore, Store};

/// Posts a message without waiting for its reply: the status and the answer.
pub(super) async fn post(
    api: &Api,
    sid: &str,
    conversation: Option<&str>,
    text: &str,
) -> (StatusCode, Value) {
    let mut body = json!({"text": text, "wait": false});
    if let Some(c) = conversation {
        body["conversation_id"] = json!(c);
    }
    api.post(&format!("/api/sessions/{sid}/messages"), body)
        .await
}

/// A model whose first answer never comes: the first message runs until it is cancelled.
pub(super) fn hangs() -> Vec<ScriptedReply> {
    vec![ScriptedReply {
        hang: true,
        ..ScriptedReply::default()
    }]
}

/// A client of `server`, a new session and a conversation opened in it (ids).
pub(super) async fn conversation_of(server: &Server) -> (Api, String, String) {
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    let opened = api
        .call("conversation.open", json!({"session_id": sid}))
        .await;
    let conv = id(&opened, "conversation_id");
    (api, sid, conv)
}

/// Polls a message until it reached an outcome (at most 15 s).
pub(super) async fn outcome(api: &Api, sid: &str, message_id: u64) -> Value {
    let t0 = Instant::now();
    loop {
        let (status, m) = api
            .get(&format!("/api/sessions/{sid}/messages/{message_id}"))
            .await;
        assert_eq!(status, StatusCode::OK, "{m}");
        let s = m["status"].as_str().unwrap_or_default();
        if !matches!(s, "queued" | "running") {
            return m;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "message {message_id} still {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The outcome of the message a `POST .../messages` answer (`sent`) accepted.
pub(super) async fn outcome_of(api: &Api, sid: &str, sent: &Value) -> Value {
    let id = sent["message"]["message_id"].as_u64();
    outcome(
        api,
        sid,
        id.unwrap_or_else(|| panic!("no message id in {sent}")),
    )
    .await
}

/// Waits until the scripted model has been called `n` times (15 s at most).
pub(super) async fn called(server: &Server, n: u64) {
    let t0 = Instant::now();
    while server.model.calls() < n {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the model was called {} times, not {n}",
            server.model.calls()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A service on SQLite (the store the service uses by default) with the scripted `replies`.
async fn on_sqlite(replies: Vec<ScriptedReply>) -> Server {
    Server::start_on(
        |dir| Arc::new(SqliteStore::open_in(dir).unwrap()),
        |_| {},
        replies,
    )
    .await
}

/// A connection of the test's own to `server`'s database (another process's, as far as the
/// service can tell).
fn database_of(server: &Server) -> rusqlite::Connection {
    rusqlite::Connection::open(troupe_store::db_path(server.data_dir())).unwrap()
}

fn delayed(text: &str, ms: u64) -> ScriptedReply {
    ScriptedReply {
        delay_ms: ms,
        ..ScriptedReply::text(text)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_messages_run_in_order_and_each_reports_its_outcome() {
    let server = Server::start_with(
        |_| {},
        vec![
            delayed("one", 400),
            ScriptedReply::text("two"),
            ScriptedReply::text("three"),
        ],
    )
    .await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");

    let mut acked = Vec::new();
    for text in ["a", "b", "c"] {
        let (status, v) = post(&api, &sid, None, text).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        acked.push(v["message"].clone());
    }
    let statuses: Vec<&str> = acked
        .iter()
        .map(|m| m["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["running", "queued", "queued"], "{acked:?}");

    let mut replies = Vec::new();
    for m in &acked {
        let done = outcome(&api, &sid, m["message_id"].as_u64().unwrap()).await;
        assert_eq!(done["status"], "completed", "{done}");
        assert!(done["task_id"].is_string(), "{done}");
        let reply_id = done["reply_message_id"].as_u64().unwrap();
        // JSON-RPC shows the same record.
        let rpc = api
            .call(
                "messages.get",
                json!({"session_id": sid, "message_id": reply_id}),
            )
            .await;
        assert_eq!(rpc["role"], "assistant");
        assert_eq!(rpc["task_id"], done["task_id"]);
        replies.push(rpc["content"].as_str().unwrap().to_owned());
    }
    assert_eq!(replies, ["one", "two", "three"], "in the order sent");

    // The event stream reports each change: the queued ones start, every one ends.
    let events = api
        .sse(&sid, None, |seen| {
            seen.iter()
                .filter(|e| e["type"] == "message_status" && e["data"]["status"] == "completed")
                .count()
                == 3
        })
        .await;
    let updates: Vec<(u64, String)> = events
        .iter()
        .filter(|e| e["type"] == "message_status")
        .map(|e| {
            (
                e["data"]["message_id"].as_u64().unwrap(),
                e["data"]["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let ids: Vec<u64> = acked
        .iter()
        .map(|m| m["message_id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        updates,
        vec![
            (ids[0], "running".into()),
            (ids[0], "completed".into()),
            (ids[1], "running".into()),
            (ids[1], "completed".into()),
            (ids[2], "running".into()),
            (ids[2], "completed".into()),
        ]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_before_storing_and_a_close_cancels_what_waits() {
    let server = Server::start_with(|c| c.server.conversation_queue = 1, hangs()).await;
    let (api, sid, conv) = conversation_of(&server).await;

    let (s1, running) = post(&api, &sid, Some(&conv), "runs").await;
    let (s2, queued) = post(&api, &sid, Some(&conv), "waits").await;
    let (s3, refused) = post(&api, &sid, Some(&conv), "refused").await;
    assert_eq!((s1, s2), (StatusCode::ACCEPTED, StatusCode::ACCEPTED));
    assert_eq!(s3, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert_eq!(refused["code"], "overloaded");
    let (_, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
    let texts: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["runs", "waits"], "nothing of a refusal is stored");

    let closed = api
        .call(
            "conversation.close",
            json!({"session_id": sid, "conversation_id": conv}),
        )
        .await;
    assert_eq!(closed["outcome"], "closed");
    let r = outcome_of(&api, &sid, &running).await;
    let q = outcome_of(&api, &sid, &queued).await;
    assert_eq!(r["status"], "cancelled", "{r}");
    assert_eq!(q["status"], "cancelled", "{q}");
    assert!(q["reply_message_id"].is_null(), "it never ran: {q}");
    server.stop().await;
}

/// A close the store cannot record answers the error and ends nothing: the conversation stays
/// open in the store and its queued message queued (none starts meanwhile); the next close
/// records it and cancels what waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_the_store_cannot_record_keeps_what_waits_until_a_close_is_recorded() {
    let server = on_sqlite(hangs()).await;
    let (api, sid, conv) = conversation_of(&server).await;
    let (_, running) = post(&api, &sid, Some(&conv), "runs").await;
    let (_, queued) = post(&api, &sid, Some(&conv), "waits").await;
    let (running, queued) = (
        running["message"]["message_id"].as_u64().unwrap(),
        queued["message"]["message_id"].as_u64().unwrap(),
    );

    // The database refuses to mark the conversation closed, as a full disk would.
    let db = database_of(&server);
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.execute_batch(
        "CREATE TRIGGER refuse_close BEFORE UPDATE OF state ON conversations
         WHEN NEW.state = 'closed' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
    )
    .unwrap();
    let close = json!({"session_id": sid, "conversation_id": conv});
    api.call_err("conversation.close", close.clone()).await;
    // The running task was cancelled by the session and ends so; the queued message does not
    // start and stays queued, as the store still has the conversation open.
    assert_eq!(outcome(&api, &sid, running).await["status"], "cancelled");
    let (_, q) = api
        .get(&format!("/api/sessions/{sid}/messages/{queued}"))
        .await;
    assert_eq!(q["status"], "queued", "{q}");
    let state = |db: &rusqlite::Connection| -> String {
        db.query_row(
            "SELECT state FROM conversations WHERE conversation_id = ?1",
            [&conv],
            |row| row.get(0),
        )
        .unwrap()
    };
    assert_eq!(state(&db), "open");

    db.execute_batch("DROP TRIGGER refuse_close").unwrap();
    let closed = api.call("conversation.close", close).await;
    assert!(
        matches!(
            closed["outcome"].as_str(),
            Some("closed" | "already_closed")
        ),
        "{closed}"
    );
    let q = outcome(&api, &sid, queued).await;
    assert_eq!(q["status"], "cancelled", "{q}");
    assert!(q["reply_message_id"].is_null(), "it never ran: {q}");
    assert_eq!(state(&db), "closed");
    server.stop().await;
}

/// A message whose outcome cannot be stored for a moment (another connection holds the
/// database's write lock past the store's busy budget) still ends `completed`: the write is
/// tried again, instead of leaving the row `running` until the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_the_store_cannot_write_for_a_moment_is_written_when_it_can() {
    let server = on_sqlite(vec![delayed("late", 300)]).await;
    let (api, sid, conv) = conversation_of(&server).await;
    let (status, sent) = post(&api, &sid, Some(&conv), "runs").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{sent}");
    let message_id = sent["message"]["message_id"].as_u64().unwrap();

    let db = database_of(&server);
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    // The task ends meanwhile; the first write of its outcome gives up after the busy
    // budget (5 s).
    tokio::time::sleep(troupe_store::BUSY_BUDGET + Duration::from_millis(500)).await;
    db.execute_batch("ROLLBACK").unwrap();
    let done = outcome(&api, &sid, message_id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done["reply_message_id"].is_u64(), "{done}");
    server.stop().await;
}

/// How many `task_started` records the session's rollout (the data directory's JSONL files)
/// holds: what a task leaves before its row is stored, when nothing else can be read (the
/// session's host waits for the row meanwhile).
fn tasks_started(server: &Server) -> usize {
    let mut stack = vec![server.data_dir().join("rollout")];
    let mut n = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(text) = std::fs::read_to_string(&path) {
                n += text.matches("\"task_started\"").count();
            }
        }
    }
    n
}

/// Waits (3 s at most, well within the store's 5 s busy budget) until a task has started.
async fn a_task_started(server: &Server) {
    let t0 = Instant::now();
    while tasks_started(server) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "no task started while the message's row was being written"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A message that runs at once starts its task while its row is written (the database's
/// write lock held elsewhere): the task asks the model meanwhile, but its turn goes no
/// further, and the caller hears of the message only once its row is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_runs_now_starts_while_its_row_is_written() {
    let server = on_sqlite(vec![ScriptedReply::text("done")]).await;
    let (api, sid, conv) = conversation_of(&server).await;
    let db = database_of(&server);
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    let sending = {
        let (api, sid, conv) = (api.clone(), sid.clone(), conv.clone());
        tokio::spawn(async move { post(&api, &sid, Some(&conv), "runs").await })
    };
    a_task_started(&server).await;
    called(&server, 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!sending.is_finished(), "answered before the row was stored");
    db.execute_batch("ROLLBACK").unwrap();
    let (status, sent) = sending.await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{sent}");
    let done = outcome_of(&api, &sid, &sent).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done["reply_message_id"].is_u64(), "{done}");
    assert_eq!(server.model.calls(), 1);
    server.stop().await;
}

/// A message whose row cannot be written ends its started task before it acts on anything:
/// its caller hears the write's error, the tool call its model answered is never run,
/// nothing of it is stored, and the conversation runs the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_row_cannot_be_written_runs_nothing() {
    let witness = tempfile::tempdir().unwrap();
    let touched = witness.path().join("ran");
    let server = Server::start_on(
        |dir| Arc::new(SqliteStore::open_in(dir).unwrap()),
        |c| c.chat.approval_policy = troupe_proto::ApprovalPolicy::Never,
        vec![
            ScriptedReply::tool(
                "shell",
                json!({"command": ["touch", touched.to_str().unwrap()]}),
            ),
            ScriptedReply::text("next one"),
        ],
    )
    .await;
    let (api, sid, conv) = conversation_of(&server).await;
    // The task starts while the row waits for the lock; then the database refuses the row,
    // as a full disk would.
    let db = database_of(&server);
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    let sending = {
        let (api, sid, conv) = (api.clone(), sid.clone(), conv.clone());
        tokio::spawn(async move { post(&api, &sid, Some(&conv), "refused").await })
    };
    a_task_started(&server).await;
    // The model answers its tool call while the row waits for the lock.
    called(&server, 1).await;
    db.execute_batch(
        "CREATE TRIGGER refuse_row BEFORE INSERT ON messages WHEN NEW.content = 'refused'
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;
         COMMIT;",
    )
    .unwrap();
    let (status, refused) = sending.await.unwrap();
    assert!(status.is_server_error(), "{status} {refused}");
    assert!(refused["message"].is_string(), "{refused}");
    let (status, sent) = post(&api, &sid, Some(&conv), "next").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{sent}");
    let done = outcome_of(&api, &sid, &sent).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(!touched.exists(), "the unstored message's tool call ran");
    let (_, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
    let texts: Vec<&Value> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["content"])
        .collect();
    assert!(!texts.contains(&&json!("refused")), "{page}");
    assert!(texts.contains(&&json!("next one")), "{page}");
    server.stop().await;
}

/// A row refused at once, wherever its task was by then, leaves no task running and the
/// model unasked: the task ends at its gate (a model that never answers would otherwise hold
/// the conversation for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_refused_at_once_leaves_no_task_running() {
    let server = on_sqlite(hangs()).await;
    let (api, sid, conv) = conversation_of(&server).await;
    let db = database_of(&server);
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.execute_batch(
        "CREATE TRIGGER refuse_row BEFORE INSERT ON messages WHEN NEW.content = 'refused'
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
    )
    .unwrap();
    let (status, refused) = post(&api, &sid, Some(&conv), "refused").await;
    assert!(status.is_server_error(), "{status} {refused}");
    let t0 = Instant::now();
    loop {
        let tasks = api.call("task.list", json!({"session_id": sid})).await;
        if tasks.as_array().is_some_and(Vec::is_empty) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "still running: {tasks}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

/// Sends `text` to `conv` in a task that waits for its reply, and gives back the task and
/// the message's id once the message is stored.
async fn send_waiting(
    api: &Api,
    sid: &str,
    conv: &str,
    text: &str,
) -> (tokio::task::JoinHandle<(StatusCode, Value)>, u64) {
    let waiting = {
        let (api, sid, body) = (
            api.clone(),
            sid.to_owned(),
            json!({"text": text, "conversation_id": conv}),
        );
        tokio::spawn(async move {
            api.post(&format!("/api/sessions/{sid}/messages"), body)
                .await
        })
    };
    let t0 = Instant::now();
    loop {
        let (_, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
        if let Some(m) = page["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["content"] == text)
        {
            assert_eq!(m["status"], "queued", "{m}");
            return (waiting, m["message_id"].as_u64().unwrap());
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A queued message whose start the store refuses (past its tries) ends `failed` in the
/// store, as its waiting caller is told, so that it does not run after a restart either.
/// When its failure cannot be written either, the store still holds it `queued`: its caller
/// is told it stays queued, and it runs once the store takes its start, without a restart
/// (and only once: not again at the next start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_message_the_store_cannot_start_ends_as_its_caller_was_told() {
    let server = on_sqlite(vec![delayed("first", 1000), delayed("second", 1000)]).await;
    let (api, sid, conv) = conversation_of(&server).await;
    let db = database_of(&server);
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    // The database refuses every start of a queued message, as a full disk would (a message
    // sent to an idle conversation is stored running: no start to write).
    let refuse = |statuses: &str| {
        db.execute_batch(&format!(
            "DROP TRIGGER IF EXISTS refuse;
             CREATE TRIGGER refuse BEFORE UPDATE OF status ON messages
             WHEN NEW.status IN ({statuses}) BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
        ))
        .unwrap();
    };
    refuse("'running'");
    let (_, first) = post(&api, &sid, Some(&conv), "runs").await;
    assert_eq!(first["message"]["status"], "running", "{first}");
    let (waiting, unstarted) = send_waiting(&api, &sid, &conv, "never starts").await;

    let (status, body) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["code"], "internal", "{body}");
    let failed = outcome(&api, &sid, unstarted).await;
    assert_eq!(
        failed["status"], "failed",
        "as its caller was told: {failed}"
    );
    assert!(
        failed["reply_message_id"].is_null(),
        "it never ran: {failed}"
    );

    // Its failure cannot be written either: it stays queued, and its caller hears so.
    refuse("'running', 'failed'");
    let (_, second) = post(&api, &sid, Some(&conv), "runs too").await;
    assert_eq!(second["message"]["status"], "running", "{second}");
    let (waiting, kept) = send_waiting(&api, &sid, &conv, "runs once it can").await;
    let (status, body) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["code"], "interrupted", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("message {kept} could not be started"))
            && message.contains("stays queued")
            && message.contains("its start is tried again in 1 s"),
        "{body}"
    );
    let (_, read) = api
        .get(&format!("/api/sessions/{sid}/messages/{kept}"))
        .await;
    assert_eq!(read["status"], "queued", "{read}");
    // A message sent meanwhile waits behind it.
    let (_, behind) = post(&api, &sid, Some(&conv), "sent after it").await;
    assert_eq!(behind["message"]["status"], "queued", "{behind}");
    // Its start is tried again (after 1 s) while the store would write its failure but not
    // its start: it is not failed for that, as its caller was told.
    refuse("'running'");
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let (_, read) = api
        .get(&format!("/api/sessions/{sid}/messages/{kept}"))
        .await;
    assert_eq!(read["status"], "queued", "{read}");
    db.execute_batch("DROP TRIGGER refuse").unwrap();
    drop(db);

    // Once the store takes its start, it runs: no restart needed; then the one behind it.
    let ran = outcome(&api, &sid, kept).await;
    assert_eq!(ran["status"], "completed", "{ran}");
    let next = outcome_of(&api, &sid, &behind).await;
    assert_eq!(next["status"], "completed", "{next}");
    assert!(
        next["reply_message_id"].as_u64() > ran["reply_message_id"].as_u64(),
        "in the order they were sent: {ran} {next}"
    );

    // The next start runs neither again: the one that ran, nor the one its caller was told
    // failed.
    let dir = server.stop_keeping_data().await;
    let (service, base, task) = service_over(dir.path()).await;
    let api = Api::new(&base, None);
    let ran = outcome(&api, &sid, kept).await;
    assert_eq!(ran["status"], "completed", "{ran}");
    let (status, failed) = api
        .get(&format!("/api/sessions/{sid}/messages/{unstarted}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{failed}");
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(
        failed["reply_message_id"].is_null(),
        "it never ran: {failed}"
    );
    let (_, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
    let texts: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(
        texts
            .iter()
            .filter(|t| **t == "You said: runs once it can")
            .count(),
        1,
        "{texts:?}"
    );
    assert!(!texts.contains(&"You said: never starts"), "{texts:?}");
    let why = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["type"] == "status" && m["metadata"]["reply_to"] == unstarted)
        .unwrap_or_else(|| panic!("no status message answers {unstarted}: {page}"));
    assert_eq!(why["metadata"]["status"], "failed", "{why}");
    service.shutdown_token().cancel();
    task.await.unwrap();
}

fn conversation(
    session: &SessionRecord,
    id: ConversationId,
    policy: StoragePolicy,
    state: ConversationState,
) -> ConversationRecord {
    ConversationRecord {
        conversation_id: id,
        session_id: session.session_id,
        params: OpenConversation {
            storage_policy: policy,
            ..OpenConversation::default()
        },
        is_root: id == session.root_conversation_id,
        state,
        created_ms: 1,
        closed_ms: (state == ConversationState::Closed).then_some(2),
    }
}

fn user(
    session: &SessionRecord,
    conversation: ConversationId,
    text: Option<&str>,
    status: MessageStatus,
) -> NewMessage {
    NewMessage {
        session_id: session.session_id,
        conversation_id: conversation,
        task_id: None,
        role: Role::User,
        content: text.map(str::to_owned),
        chars: 5,
        created_ms: 3,
        status: Some(status),
        kind: troupe_proto::store::MessageKind::Text,
        metadata: None,
    }
}

async fn service_over(dir: &std::path::Path) -> (Service, String, tokio::task::JoinHandle<()>) {
    let config = TroupeConfig {
        data_dir: dir.to_owned(),
        ..TroupeConfig::default()
    };
    let model = Arc::new(ScriptedModel::new(Vec::new()));
    let ports = assembly::session_ports(&config, model, Arc::new(ApproxTokens));
    let store = Arc::new(SqliteStore::open_in(dir).unwrap());
    let service = Service::start(&config, store, ports, None).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let s = service.clone();
    let task = tokio::spawn(async move { s.serve_http(listener).await.unwrap() });
    (service, base, task)
}

/// What a crash left in the store is settled at the next start, without any request: a
/// message that was running ends aborted, a queued one runs, one whose conversation keeps no
/// text ends aborted (there is nothing to run), one of a closed conversation is cancelled,
/// and one whose request layer cannot be read fails (it does not run without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_settles_every_pending_message() {
    let dir = tempfile::tempdir().unwrap();
    let session = SessionRecord {
        session_id: SessionId::new(),
        project_id: None,
        title: None,
        created_ms: 1,
        root_conversation_id: ConversationId::new(),
        settings: Json(json!({})),
        status: troupe_proto::store::SessionStatus::Active,
        updated_ms: 0,
    };
    let root = session.root_conversation_id;
    let (headers_only, closed) = (ConversationId::new(), ConversationId::new());
    let ids = {
        let store = SqliteStore::open_in(dir.path()).unwrap();
        store.create_session(session.clone()).await.unwrap();
        for (id, policy, state) in [
            (root, StoragePolicy::Full, ConversationState::Open),
            (
                headers_only,
                StoragePolicy::HeadersOnly,
                ConversationState::Open,
            ),
            (closed, StoragePolicy::Full, ConversationState::Closed),
        ] {
            store
                .put_conversation(conversation(&session, id, policy, state))
                .await
                .unwrap();
        }
        let mut ids = Vec::new();
        for m in [
            user(&session, root, Some("was running"), MessageStatus::Running),
            user(&session, root, Some("was queued"), MessageStatus::Queued),
            user(&session, headers_only, None, MessageStatus::Queued),
            user(&session, closed, Some("closed"), MessageStatus::Queued),
            NewMessage {
                metadata: Some(Json(json!({"tools": {"blacklist": "shell"}}))),
                ..user(&session, root, Some("unrestricted?"), MessageStatus::Queued)
            },
        ] {
            ids.push(store.append_message(m).await.unwrap().message_id);
        }
        ids
    };

    let (service, base, task) = service_over(dir.path()).await;
    let api = Api::new(&base, None);
    let sid = session.session_id.to_string();
    let mut ended = Vec::new();
    for id in &ids {
        ended.push(outcome(&api, &sid, *id).await);
    }
    let statuses: Vec<&str> = ended
        .iter()
        .map(|m| m["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["aborted", "completed", "aborted", "cancelled", "failed"]
    );
    let (_, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
    let why = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["type"] == "status" && m["metadata"]["reply_to"] == ids[4])
        .unwrap_or_else(|| panic!("no status message answers {}: {page}", ids[4]))
        .clone();
    assert_eq!(why["metadata"]["status"], "failed", "{why}");
    assert!(
        why["content"]
            .as_str()
            .is_some_and(|c| c.contains("request layer")),
        "{why}"
    );
    assert!(ended[4]["reply_message_id"].is_null(), "it did not run");
    let reply = api
        .call(
            "messages.get",
            json!({"session_id": sid, "message_id": ended[1]["reply_message_id"]}),
        )
        .await;
    assert_eq!(reply["content"], "You said: was queued");
    assert!(ended[0]["reply_message_id"].is_null());

    // The event stream says so too (recorded, so a client that connects later sees it).
    let events = api
        .sse(&sid, None, |seen| {
            seen.iter()
                .filter(|e| e["type"] == "message_status")
                .count()
                >= 6
        })
        .await;
    let updates: Vec<(u64, &str)> = events
        .iter()
        .filter(|e| e["type"] == "message_status")
        .map(|e| {
            (
                e["data"]["message_id"].as_u64().unwrap(),
                e["data"]["status"].as_str().unwrap(),
            )
        })
        .collect();
    for (id, status) in ids.iter().zip(&statuses) {
        assert!(
            updates.contains(&(*id, *status)),
            "{id} {status}: {updates:?}"
        );
    }
    service.shutdown_token().cancel();
    task.await.unwrap();
}

/// A caller waiting on a queued message when the service stops hears that it stays queued and
/// runs after the next start, not an internal error (a client would send it again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_waiting_on_a_queued_message_at_a_stop_is_told_it_stays_queued() {
    let server = Server::start_on(
        |dir| Arc::new(SqliteStore::open_in(dir).unwrap()),
        |c| c.server.grace_period = Duration::from_millis(300),
        hangs(),
    )
    .await;
    let (api, sid, conv) = conversation_of(&server).await;
    let (_, running) = post(&api, &sid, Some(&conv), "runs until stopped").await;
    assert_eq!(running["message"]["status"], "running", "{running}");
    called(&server, 1).await;
    let waiting = {
        let (api, sid, conv) = (api.clone(), sid.clone(), conv.clone());
        tokio::spawn(async move {
            api.post(
                &format!("/api/sessions/{sid}/messages"),
                json!({"text": "waits its turn", "conversation_id": conv}),
            )
            .await
        })
    };
    // Until it is stored, queued.
    let queued = {
        let t0 = Instant::now();
        loop {
            let (_, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
            if let Some(m) = page["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|m| m["status"] == "queued")
            {
                break m["message_id"].as_u64().unwrap();
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{page}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let dir = server.stop_keeping_data().await;
    let (status, body) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["code"], "interrupted", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("message {queued} stays queued")),
        "{body}"
    );
    let store = SqliteStore::open_in(dir.path()).unwrap();
    let m = store.message(queued).await.unwrap().unwrap();
    assert_eq!(m.status, Some(MessageStatus::Queued), "{m:?}");
}

/// A planned stop (SIGTERM) cancels what runs and leaves what is queued queued in the store;
/// the next start runs it, unless its conversation keeps no text (`headers_only`) or its
/// `ttl` passed while it waited: then there is nothing left to run and it ends `aborted`,
/// saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_stop_leaves_queued_messages_to_the_next_start() {
    let server = Server::start_on(
        |dir| Arc::new(SqliteStore::open_in(dir).unwrap()),
        |c| c.server.grace_period = Duration::from_millis(300),
        [hangs(), hangs(), hangs()].concat(),
    )
    .await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    let mut queued = Vec::new();
    let mut running = Vec::new();
    for policy in [
        json!("full"),
        json!("headers_only"),
        json!({"ttl": {"secs": 1}}),
    ] {
        let opened = api
            .call(
                "conversation.open",
                json!({"session_id": sid, "storage_policy": policy}),
            )
            .await;
        let conv = id(&opened, "conversation_id");
        let (status, sent) = post(&api, &sid, Some(&conv), "runs until stopped").await;
        assert_eq!(status, StatusCode::ACCEPTED, "{sent}");
        assert_eq!(sent["message"]["status"], "running", "{sent}");
        running.push(sent["message"]["message_id"].as_u64().unwrap());
        let (status, sent) = post(&api, &sid, Some(&conv), "waits its turn").await;
        assert_eq!(status, StatusCode::ACCEPTED, "{sent}");
        assert_eq!(sent["message"]["status"], "queued", "{sent}");
        queued.push(sent["message"]["message_id"].as_u64().unwrap());
    }
    let dir = server.stop_keeping_data().await;

    // Stopped: what ran was cancelled, what waited is still queued in the store.
    let store = SqliteStore::open_in(dir.path()).unwrap();
    for id in &running {
        let m = store.message(*id).await.unwrap().unwrap();
        assert_eq!(m.status, Some(MessageStatus::Cancelled), "{m:?}");
    }
    for id in &queued {
        let m = store.message(*id).await.unwrap().unwrap();
        assert_eq!(m.status, Some(MessageStatus::Queued), "{m:?}");
    }
    drop(store);
    // The ttl conversation's queued message is past its ttl before the next start.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let (service, base, task) = service_over(dir.path()).await;
    let api = Api::new(&base, None);
    let mut ended = Vec::new();
    for id in &queued {
        ended.push(outcome(&api, &sid, *id).await);
    }
    let statuses: Vec<&str> = ended
        .iter()
        .map(|m| m["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["completed", "aborted", "aborted"], "{ended:?}");
    let reply = api
        .call(
            "messages.get",
            json!({"session_id": sid, "message_id": ended[0]["reply_message_id"]}),
        )
        .await;
    assert_eq!(reply["content"], "You said: waits its turn");
    // Each abort says why: a `status` message answering it, its content the reason where the
    // policy keeps content (a `ttl` conversation's, until its own ttl), its code everywhere.
    let (status, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let why = |id: u64| {
        page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["type"] == "status" && m["metadata"]["reply_to"] == id)
            .unwrap_or_else(|| panic!("no status message answers {id}: {page}"))
            .clone()
    };
    let not_kept = why(queued[1]);
    assert_eq!(not_kept["metadata"]["code"], "interrupted", "{not_kept}");
    assert_eq!(not_kept["metadata"]["status"], "aborted", "{not_kept}");
    assert!(
        not_kept["content"].is_null(),
        "headers_only keeps no text: {not_kept}"
    );
    let expired = why(queued[2]);
    assert_eq!(expired["metadata"]["code"], "interrupted", "{expired}");
    let reason = expired["content"].as_str().unwrap_or_default();
    assert!(
        reason.contains("passed its conversation's ttl"),
        "{expired}"
    );
    service.shutdown_token().cancel();
    task.await.unwrap();
    drop(dir);
}

/// Stored sessions are not started with the service: only on their first use (or when they
/// hold unfinished messages). Reading a session's record or messages starts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_sessions_start_on_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let mut sessions = Vec::new();
    {
        let store = SqliteStore::open_in(dir.path()).unwrap();
        for i in 0..40 {
            let s = SessionRecord {
                session_id: SessionId::new(),
                project_id: Some("p".into()),
                title: Some(format!("s{i}")),
                created_ms: i,
                root_conversation_id: ConversationId::new(),
                settings: Json(json!({})),
                status: troupe_proto::store::SessionStatus::Active,
                updated_ms: 0,
            };
            store.create_session(s.clone()).await.unwrap();
            let root = s.root_conversation_id;
            store
                .put_conversation(conversation(
                    &s,
                    root,
                    StoragePolicy::Full,
                    ConversationState::Open,
                ))
                .await
                .unwrap();
            sessions.push(s);
        }
    }
    let live = troupe_actors::conversation::live_conversations;
    let (service, base, task) = service_over(dir.path()).await;
    let api = Api::new(&base, None);
    let (status, ready) = api.get("/readyz").await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    let (_, listed) = api.get("/api/projects/p/sessions").await;
    assert_eq!(listed.as_array().unwrap().len(), 40);
    let sid = sessions[7].session_id.to_string();
    let (status, _) = api.get(&format!("/api/sessions/{sid}")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = api.get(&format!("/api/sessions/{sid}/messages")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(live(), 0, "nothing started for reads");

    let reply = api.say(&sid, "wake up").await;
    assert_eq!(reply["reply"]["text"], "You said: wake up");
    assert_eq!(live(), 1, "one session (its root conversation) started");
    service.shutdown_token().cancel();
    task.await.unwrap();
}

/// A token of another project asks for a dormant session: 404 as for an unknown id, and the
/// session is not started (it was activated, then refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_projects_token_starts_no_stored_session() {
    let dir = tempfile::tempdir().unwrap();
    let s = SessionRecord {
        session_id: SessionId::new(),
        project_id: Some("beta".into()),
        title: None,
        created_ms: 1,
        root_conversation_id: ConversationId::new(),
        settings: Json(json!({})),
        status: troupe_proto::store::SessionStatus::Active,
        updated_ms: 0,
    };
    {
        let store = SqliteStore::open_in(dir.path()).unwrap();
        store.create_session(s.clone()).await.unwrap();
        store
            .put_conversation(conversation(
                &s,
                s.root_conversation_id,
                StoragePolicy::Full,
                ConversationState::Open,
            ))
            .await
            .unwrap();
    }
    let mut config = TroupeConfig {
        data_dir: dir.path().to_owned(),
        ..TroupeConfig::default()
    };
    super::with_tokens(&mut config);
    let model = Arc::new(ScriptedModel::new(Vec::new()));
    let ports = assembly::session_ports(&config, model, Arc::new(ApproxTokens));
    let store = Arc::new(SqliteStore::open_in(dir.path()).unwrap());
    let service = Service::start(&config, store, ports, None).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let serving = service.clone();
    let task = tokio::spawn(async move { serving.serve_http(listener).await.unwrap() });
    let alpha = Api::new(&base, Some("alpha-token"));
    let sid = s.session_id;
    for path in [
        format!("/api/sessions/{sid}/events?after=0"),
        format!("/api/sessions/{sid}/tasks"),
        format!("/api/sessions/{sid}/approvals"),
    ] {
        let (status, body) = alpha.get(&path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    // An activation the refusal set off would have started the root conversation by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        troupe_actors::conversation::live_conversations(),
        0,
        "nothing started for another project's token"
    );
    service.shutdown_token().cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_all_ends_the_running_and_the_queued_messages_cancelled() {
    let server = Server::start_with(
        |_| {},
        vec![
            ScriptedReply::hang(true),
            ScriptedReply::hang(true),
            ScriptedReply::text("after"),
        ],
    )
    .await;
    let api = server.api();
    let session = api.session(None).await;
    let sid = id(&session, "session_id");
    let root = id(&session, "root_conversation_id");
    let mut acked = Vec::new();
    for text in ["a", "b", "c"] {
        let (status, v) = post(&api, &sid, None, text).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        acked.push(v["message"]["message_id"].as_u64().unwrap());
    }
    // JSON-RPC: the running one (once its model call has taken the first scripted reply, so
    // the replies left are the ones the test expects next) and the two queued ones.
    called(&server, 1).await;
    let r = api
        .call(
            "conversation.cancelAll",
            json!({"session_id": sid, "conversation_id": root}),
        )
        .await;
    assert_eq!(r, json!({"cancelled": 3}));
    for m in &acked {
        let ended = outcome(&api, &sid, *m).await;
        assert_eq!(ended["status"], "cancelled");
        // Cancelled, not answered: no reply (an empty assistant message was stored as one).
        assert!(ended["reply_message_id"].is_null(), "{ended}");
    }
    // REST: one running message.
    let (_, v) = post(&api, &sid, None, "d").await;
    let running = v["message"]["message_id"].as_u64().unwrap();
    called(&server, 2).await;
    let (status, v) = api
        .post(
            &format!("/api/sessions/{sid}/conversations/{root}/cancel"),
            json!({}),
        )
        .await;
    assert_eq!((status, v), (StatusCode::OK, json!({"cancelled": 1})));
    assert_eq!(outcome(&api, &sid, running).await["status"], "cancelled");
    // The conversation stays open.
    assert_eq!(api.say(&sid, "e").await["reply"]["text"], "after");
    let unknown = ConversationId::new();
    let (status, v) = api
        .post(
            &format!("/api/sessions/{sid}/conversations/{unknown}/cancel"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    server.stop().await;
}
