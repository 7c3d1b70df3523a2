//! P1 (seed 004's entities): a session's status and last update, and typed messages with
//! metadata from which a client rebuilds a whole exchange, tool calls and results included.

use super::{Server, id};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;
use troupe_proto::ApprovalPolicy;
use troupe_runtime::ScriptedReply;

fn never_ask(c: &mut troupe_runtime::config::TroupeConfig) {
    c.chat.approval_policy = ApprovalPolicy::Never;
}

fn messages(page: &Value) -> Vec<Value> {
    page["messages"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_turn_that_calls_tools_is_rebuilt_from_its_messages() {
    let server = Server::start_with(
        never_ask,
        vec![
            ScriptedReply::tool("shell", json!({"command": ["echo", "from the tool"]})),
            ScriptedReply::tool("no_such_tool", json!({"x": 1})),
            ScriptedReply::text("all done"),
        ],
    )
    .await;
    let api = server.api();
    let s = api.session(Some("p")).await;
    let sid = id(&s, "session_id");
    let sent = api.say(&sid, "run echo").await;
    assert_eq!(sent["reply"]["text"], "all done");
    let task = sent["reply"]["task_id"].clone();
    let user_id = sent["message"]["message_id"].as_u64().unwrap();

    let (status, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let all = messages(&page);
    let shape: Vec<(&str, &str)> = all
        .iter()
        .map(|m| (m["type"].as_str().unwrap(), m["role"].as_str().unwrap()))
        .collect();
    assert_eq!(
        shape,
        [
            ("text", "user"),
            ("tool_call", "assistant"),
            ("tool_result", "assistant"),
            ("tool_call", "assistant"),
            ("tool_result", "assistant"),
            ("text", "assistant"),
        ],
        "{page}"
    );
    let ids: Vec<u64> = all
        .iter()
        .map(|m| m["message_id"].as_u64().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "in order");
    assert_eq!(all[0]["metadata"], Value::Null, "a user message has none");
    assert_eq!(all[0]["reply_message_id"], ids[5]);
    for m in &all[1..] {
        assert_eq!(m["task_id"], task, "{m}");
    }
    for m in &all[1..5] {
        assert_eq!(m["metadata"]["reply_to"], user_id, "{m}");
    }

    // The first call and its result.
    let (call, result) = (&all[1], &all[2]);
    assert_eq!(call["metadata"]["tool"], "shell");
    let arguments: Value = serde_json::from_str(call["content"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"command": ["echo", "from the tool"]}));
    let call_id = call["metadata"]["call_id"].clone();
    assert!(call_id.is_string());
    assert_eq!(result["metadata"]["call_id"], call_id);
    assert_eq!(result["metadata"]["tool"], "shell");
    assert_eq!(result["metadata"]["is_error"], false);
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .contains("from the tool"),
        "{result}"
    );
    // The second call named no tool: its result says so, flagged as an error.
    assert_eq!(all[3]["metadata"]["tool"], "no_such_tool");
    assert_eq!(all[4]["metadata"]["call_id"], all[3]["metadata"]["call_id"]);
    assert_eq!(all[4]["metadata"]["is_error"], true);
    assert_eq!(all[5]["content"], "all done");

    // The RPC twin returns the same page, and one message reads the same alone.
    let rpc = api.call("messages.list", json!({"session_id": sid})).await;
    assert_eq!(rpc, page);
    let (_, one) = api
        .get(&format!("/api/sessions/{sid}/messages/{}", ids[2]))
        .await;
    assert_eq!(one, all[2]);

    // The session: completed by its last message, updated by it.
    let (_, got) = api.get(&format!("/api/sessions/{sid}")).await;
    assert_eq!(got["status"], "completed");
    assert!(got["updated_ms"].as_u64() >= all[5]["created_ms"].as_u64());
    let listed = api.call("session.list", json!({"project_id": "p"})).await;
    assert_eq!(listed, json!([got]));
    server.stop().await;
}

/// What a task did is stored dated when it happened, not at the task's end: under `ttl` a
/// tool call and its result expire from then (as the rollout's records of them do), not up to
/// the task's duration later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_calls_are_dated_when_they_happened_and_expire_from_then() {
    let server = Server::start_on(
        |dir| std::sync::Arc::new(troupe_store::SqliteStore::open_in(dir).unwrap()),
        never_ask,
        vec![
            ScriptedReply::tool("shell", json!({"command": ["sleep", "0.4"]})),
            ScriptedReply {
                delay_ms: 400,
                ..ScriptedReply::text("slept")
            },
        ],
    )
    .await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    let opened = api
        .call(
            "conversation.open",
            json!({"session_id": sid, "storage_policy": {"ttl": {"secs": 3600}}}),
        )
        .await;
    let conv = id(&opened, "conversation_id");
    let (status, sent) = api
        .post(
            &format!("/api/sessions/{sid}/messages"),
            json!({"text": "sleep a little", "conversation_id": conv}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{sent}");
    assert_eq!(sent["reply"]["text"], "slept");

    let db = rusqlite::Connection::open(troupe_store::db_path(server.data_dir())).unwrap();
    let rows: Vec<(String, i64, i64)> = db
        .prepare(
            "SELECT kind, created_ms, expires_ms FROM messages
             WHERE conversation_id = ?1 ORDER BY message_id",
        )
        .unwrap()
        .query_map([&conv], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let kinds: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        kinds,
        ["text", "tool_call", "tool_result", "text"],
        "{rows:?}"
    );
    let at: Vec<i64> = rows.iter().map(|r| r.1).collect();
    assert!(
        at[2] - at[1] >= 350,
        "the result ends the 0.4 s call: {rows:?}"
    );
    assert!(
        at[3] - at[2] >= 350,
        "the reply comes 0.4 s after the result: {rows:?}"
    );
    for (kind, created, expires) in &rows {
        assert_eq!(
            *expires,
            created + 3_600_000,
            "{kind} expires a ttl after it happened"
        );
    }
    server.stop().await;
}

/// Polls a message until it ended (its status is terminal).
async fn ended(api: &super::Api, sid: &str, message_id: u64) -> Value {
    loop {
        let (_, m) = api
            .get(&format!("/api/sessions/{sid}/messages/{message_id}"))
            .await;
        if !matches!(m["status"].as_str(), Some("queued" | "running")) {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_session_is_active_while_it_works_then_takes_its_last_outcome() {
    let server = Server::start_with(never_ask, vec![ScriptedReply::error("the model broke")]).await;
    let api = server.api();
    let s = api.session(None).await;
    let sid = id(&s, "session_id");
    let root = id(&s, "root_conversation_id");
    let session = || async {
        let (_, got) = api.get(&format!("/api/sessions/{sid}")).await;
        got
    };

    // A failed task: the session fails with it, and a status message says why.
    let (status, v) = api
        .post(
            &format!("/api/sessions/{sid}/messages"),
            json!({"text": "fail please"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["message"]["status"], "failed");
    assert_eq!(session().await["status"], "failed");
    let (_, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
    let all = messages(&page);
    let last = all
        .iter()
        .find(|m| m["type"] == "status")
        .unwrap_or_else(|| panic!("a status message: {page}"))
        .clone();
    assert_eq!(
        (last["type"].as_str(), last["role"].as_str()),
        (Some("status"), Some("system"))
    );
    assert_eq!(last["metadata"]["status"], "failed");
    assert_eq!(last["metadata"]["reply_to"], v["message"]["message_id"]);
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .contains("the model broke"),
        "{last}"
    );

    // A running task keeps it active; cancelled, it ends cancelled.
    server.model.push([ScriptedReply::hang(true)]);
    let (status, v) = api
        .post(
            &format!("/api/sessions/{sid}/messages"),
            json!({"text": "hang", "wait": false}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let before = session().await;
    assert_eq!(
        before["status"], "active",
        "active as soon as a message is accepted"
    );
    let hung = v["message"]["message_id"].as_u64().unwrap();
    // Cancelled once its task runs (not before it reached its conversation).
    while api
        .call("task.list", json!({"session_id": sid}))
        .await
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, _) = api
        .post(
            &format!("/api/sessions/{sid}/conversations/{root}/cancel"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ended(&api, &sid, hung).await["status"], "cancelled");
    let after = session().await;
    assert_eq!(after["status"], "cancelled");
    assert!(after["updated_ms"].as_u64() >= before["updated_ms"].as_u64());

    // And a completed one completes it again.
    api.say(&sid, "hello").await;
    assert_eq!(session().await["status"], "completed");
    server.stop().await;
}
