//! Every JSON-RPC method over `POST /rpc`, its errors, batches and notifications, and the
//! Overloaded answer of a full queue.

use super::{Server, id};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use troupe_runtime::ScriptedReply;
use troupe_service::error::{
    INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, NOT_FOUND, OVERLOADED, PARSE_ERROR,
};

#[tokio::test]
async fn sessions_and_conversations() {
    let server = Server::start().await;
    let api = server.api();
    let s = api
        .call(
            "session.create",
            json!({"project_id": "p", "title": "first"}),
        )
        .await;
    let sid = id(&s, "session_id");
    assert_eq!(s["title"], "first");
    assert_eq!(api.call("session.get", json!({"session_id": sid})).await, s);
    let listed = api.call("session.list", json!({"project_id": "p"})).await;
    assert_eq!(listed, json!([s]));
    assert_eq!(api.call("session.list", json!({})).await, json!([s]));

    let opened = api
        .call(
            "conversation.open",
            json!({"session_id": sid, "base_instructions": "be brief", "storage_policy": "headers_only"}),
        )
        .await;
    let cid = id(&opened, "conversation_id");
    let sent = api
        .call(
            "conversation.message",
            json!({"session_id": sid, "conversation_id": cid, "text": "hello"}),
        )
        .await;
    assert_eq!(sent["reply"]["text"], "You said: hello");
    assert_eq!(sent["reply"]["status"], "ok");
    assert_eq!(
        sent["message"]["content"],
        Value::Null,
        "headers_only keeps no content"
    );
    assert_eq!(sent["message"]["chars"], 5);
    assert_eq!(sent["assistant"]["chars"], 15);

    let root_reply = api
        .call(
            "conversation.message",
            json!({"session_id": sid, "text": "root"}),
        )
        .await;
    assert_eq!(
        root_reply["message"]["conversation_id"],
        s["root_conversation_id"]
    );
    assert_eq!(root_reply["assistant"]["content"], "You said: root");

    api.call(
        "conversation.setContext",
        json!({"session_id": sid, "conversation_id": cid, "user_instructions": "call me Al"}),
    )
    .await;
    let convs = api
        .call("conversation.list", json!({"session_id": sid}))
        .await;
    let convs = convs.as_array().unwrap();
    assert_eq!(convs.len(), 2);
    assert_eq!(convs[0]["is_root"], true);
    // headers_only keeps no instruction text in the stored parameters; the rest is there.
    assert_eq!(convs[1]["params"]["user_instructions"], Value::Null);
    assert_eq!(convs[1]["params"]["base_instructions"], Value::Null);
    assert_eq!(convs[1]["params"]["storage_policy"], "headers_only");

    let stats = api
        .call(
            "conversation.stats",
            json!({"session_id": sid, "conversation_id": cid}),
        )
        .await;
    assert_eq!(stats["tasks"], 1);

    let page = api
        .call("messages.list", json!({"session_id": sid, "limit": 3}))
        .await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 3);
    assert!(page["next_before"].is_u64());

    let closed = api
        .call(
            "conversation.close",
            json!({"session_id": sid, "conversation_id": cid}),
        )
        .await;
    assert_eq!(closed["outcome"], "closed");
    let again = api
        .call(
            "conversation.close",
            json!({"session_id": sid, "conversation_id": cid}),
        )
        .await;
    assert_eq!(again["outcome"], "already_closed", "close is idempotent");
    // An id that is no conversation of this session is not found, not "already closed".
    let other = api.call("session.create", json!({})).await;
    for unknown in [
        json!(troupe_proto::ConversationId::new()),
        other["root_conversation_id"].clone(),
    ] {
        assert_eq!(
            api.call_err(
                "conversation.close",
                json!({"session_id": sid, "conversation_id": unknown})
            )
            .await,
            NOT_FOUND,
            "{unknown}"
        );
    }
    let convs = api
        .call("conversation.list", json!({"session_id": sid}))
        .await;
    assert_eq!(convs[1]["state"], "closed");
    assert_eq!(
        api.call_err(
            "conversation.message",
            json!({"session_id": sid, "conversation_id": cid, "text": "x"})
        )
        .await,
        NOT_FOUND,
        "a closed conversation takes no message"
    );

    api.call(
        "project.setCurrentSession",
        json!({"project_id": "p", "session_id": sid}),
    )
    .await;
    let current = api
        .call("project.currentSession", json!({"project_id": "p"}))
        .await;
    assert_eq!(super::identity(&current), super::identity(&s));
    server.stop().await;
}

#[tokio::test]
async fn tasks_and_approvals() {
    let echo = ScriptedReply::tool("shell", json!({"command": ["echo", "approved"]}));
    let server = Server::start_with(|_| {}, vec![echo, ScriptedReply::text("done")]).await;
    let api = server.api();
    let sid = id(&api.call("session.create", json!({})).await, "session_id");
    let waiting = {
        let api = api.clone();
        let sid = sid.clone();
        tokio::spawn(async move {
            api.call(
                "conversation.message",
                json!({"session_id": sid, "text": "run it"}),
            )
            .await
        })
    };
    let pending = loop {
        let p = api.call("approval.list", json!({"session_id": sid})).await;
        if let Some(first) = p.as_array().and_then(|a| a.first()) {
            break first.clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(pending["command"], json!(["echo", "approved"]));
    let tasks = api.call("task.list", json!({"session_id": sid})).await;
    assert_eq!(tasks.as_array().unwrap().len(), 1);
    assert_eq!(tasks[0]["state"], "running");
    api.call(
        "approval.respond",
        json!({"session_id": sid, "approval_id": pending["approval_id"], "decision": "approve_once"}),
    )
    .await;
    let reply = waiting.await.unwrap();
    assert_eq!(reply["reply"]["text"], "done");
    assert_eq!(reply["reply"]["stats"]["tool_calls"], 1);
    assert_eq!(
        api.call_err(
            "approval.respond",
            json!({"session_id": sid, "approval_id": pending["approval_id"], "decision": "approve_once"})
        )
        .await,
        NOT_FOUND,
        "an answered approval is gone"
    );

    // A running task can be cancelled; the waiting caller gets the cancelled reply.
    server.model.push([ScriptedReply::hang(true)]);
    let waiting = {
        let api = api.clone();
        let sid = sid.clone();
        tokio::spawn(async move {
            api.call(
                "conversation.message",
                json!({"session_id": sid, "text": "hang"}),
            )
            .await
        })
    };
    let task = loop {
        let t = api.call("task.list", json!({"session_id": sid})).await;
        if let Some(first) = t.as_array().and_then(|a| a.first()) {
            break first.clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let cancelled = api
        .call(
            "task.cancel",
            json!({"session_id": sid, "task_id": task["task_id"]}),
        )
        .await;
    assert_eq!(cancelled["task_id"], task["task_id"]);
    let reply = waiting.await.unwrap();
    assert_eq!(reply["reply"]["status"], "cancelled");
    assert_eq!(
        api.call_err(
            "task.cancel",
            json!({"session_id": sid, "task_id": troupe_proto::TaskId::new()})
        )
        .await,
        NOT_FOUND
    );
    server.stop().await;
}

#[tokio::test]
async fn protocol_errors() {
    let server = Server::start().await;
    let api = server.api();
    let unknown = troupe_proto::SessionId::new().to_string();
    for method in [
        "session.get",
        "conversation.list",
        "approval.list",
        "task.list",
        "messages.list",
    ] {
        assert_eq!(
            api.call_err(method, json!({"session_id": unknown})).await,
            NOT_FOUND,
            "{method}"
        );
    }
    assert_eq!(api.call_err("nope.nope", json!({})).await, METHOD_NOT_FOUND);
    assert_eq!(
        api.call_err("session.get", json!({"session_id": 7})).await,
        INVALID_PARAMS
    );
    assert_eq!(
        api.call_err("messages.list", json!({"session_id": unknown, "limit": 0}))
            .await,
        INVALID_PARAMS
    );
    assert_eq!(
        api.call_err("events.subscribe", json!({"session_id": unknown}))
            .await,
        METHOD_NOT_FOUND,
        "subscriptions need a streaming transport"
    );

    let (status, v) = api.post_raw("/rpc", b"{\"jsonrpc\": ".to_vec()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["error"]["code"], PARSE_ERROR);
    assert_eq!(v["id"], Value::Null);
    let (_, v) = api.post_raw("/rpc", b"[]".to_vec()).await;
    assert_eq!(v["error"]["code"], INVALID_REQUEST);
    let (_, v) = api
        .post("/rpc", json!({"jsonrpc": "2.0", "id": "a", "method": 5}))
        .await;
    assert_eq!(
        (v["id"].clone(), v["error"]["code"].clone()),
        (json!("a"), json!(INVALID_REQUEST))
    );

    // A batch: answers for calls, none for notifications, errors in place.
    let (status, v) = api
        .post(
            "/rpc",
            json!([
                {"jsonrpc": "2.0", "id": 1, "method": "session.list"},
                {"jsonrpc": "2.0", "method": "session.list"},
                {"jsonrpc": "2.0", "id": 2, "method": "nope"},
                1
            ]),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let answers = v.as_array().unwrap();
    assert_eq!(answers.len(), 3);
    assert_eq!(answers[0]["id"], 1);
    assert_eq!(answers[0]["result"], json!([]));
    assert_eq!(answers[1]["error"]["code"], METHOD_NOT_FOUND);
    assert_eq!(answers[2]["error"]["code"], INVALID_REQUEST);
    // Only notifications: nothing to answer.
    let (status, v) = api
        .post(
            "/rpc",
            json!([{"jsonrpc": "2.0", "method": "session.list"}]),
        )
        .await;
    assert_eq!((status, v), (StatusCode::NO_CONTENT, Value::Null));
    let (status, _) = api
        .post("/rpc", json!({"jsonrpc": "2.0", "method": "session.list"}))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    server.stop().await;
}

#[tokio::test]
async fn a_full_queue_answers_overloaded_at_once() {
    let server = Server::start_with(
        |c| {
            c.server.grace_period = Duration::from_millis(100);
            c.server.max_running_tasks = 1;
            c.server.task_queue = 0;
            c.server.conversation_queue = 0;
        },
        vec![ScriptedReply::hang(true)],
    )
    .await;
    let api = server.api();
    let s = api.session(None).await;
    let sid = id(&s, "session_id");
    let busy = api
        .call(
            "conversation.send",
            json!({"session_id": sid, "text": "hang"}),
        )
        .await;
    assert_eq!(busy["message"]["content"], "hang", "stored before it runs");

    let t0 = Instant::now();
    assert_eq!(
        api.call_err(
            "conversation.message",
            json!({"session_id": sid, "text": "more"})
        )
        .await,
        OVERLOADED,
        "the conversation's own queue is full"
    );
    let other = id(
        &api.call("conversation.open", json!({"session_id": sid}))
            .await,
        "conversation_id",
    );
    let v = api
        .rpc(
            "conversation.message",
            json!({"session_id": sid, "conversation_id": other, "text": "elsewhere"}),
        )
        .await;
    assert_eq!(
        v["error"]["code"], OVERLOADED,
        "the scheduler queue is full"
    );
    assert_eq!(
        v["error"]["data"]["overloaded"]["resource"],
        "scheduler queue"
    );
    let (status, body) = api
        .post(
            &format!("/api/sessions/{sid}/messages"),
            json!({"text": "rest"}),
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["code"], "overloaded");
    assert!(t0.elapsed() < Duration::from_secs(2), "answered at once");

    let page = api.call("messages.list", json!({"session_id": sid})).await;
    assert_eq!(
        page["messages"].as_array().unwrap().len(),
        1,
        "refused messages are not stored"
    );
    server.stop().await;
}

/// A compaction takes a scheduler place as a message does, so it is admitted like one: while
/// it holds the session's only place, a message to another conversation is refused at once
/// and stored nowhere (it was stored and then failed `overloaded` by the scheduler), and a
/// message to the compacting conversation waits behind it.
#[tokio::test]
async fn a_compaction_is_admitted_and_counted_like_a_message() {
    let server = Server::start_with(
        |c| {
            c.server.grace_period = Duration::from_millis(100);
            c.server.max_running_tasks = 1;
            c.server.task_queue = 0;
        },
        vec![
            ScriptedReply::text("first answer"),
            ScriptedReply::text("SUMMARY").delayed(Duration::from_millis(1500)),
            ScriptedReply::text("after the summary"),
        ],
    )
    .await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    let conv = id(
        &api.call("conversation.open", json!({"session_id": sid}))
            .await,
        "conversation_id",
    );
    let other = id(
        &api.call("conversation.open", json!({"session_id": sid}))
            .await,
        "conversation_id",
    );
    api.call(
        "conversation.message",
        json!({"session_id": sid, "conversation_id": conv, "text": "one"}),
    )
    .await;
    let compaction = {
        let api = server.api();
        let (sid, conv) = (sid.clone(), conv.clone());
        tokio::spawn(async move {
            api.call(
                "conversation.compact",
                json!({"session_id": sid, "conversation_id": conv}),
            )
            .await
        })
    };
    loop {
        let tasks = api.call("task.list", json!({"session_id": sid})).await;
        if tasks
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["state"] == "running"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let v = api
        .rpc(
            "conversation.send",
            json!({"session_id": sid, "conversation_id": other, "text": "elsewhere"}),
        )
        .await;
    assert_eq!(v["error"]["code"], OVERLOADED, "{v}");
    assert_eq!(
        v["error"]["data"]["overloaded"]["resource"], "scheduler queue",
        "{v}"
    );
    // The compacting conversation's own message is taken and waits for the compaction.
    let queued = api
        .call(
            "conversation.send",
            json!({"session_id": sid, "conversation_id": conv, "text": "two"}),
        )
        .await;
    assert_eq!(queued["message"]["status"], "queued", "{queued}");

    let compacted = compaction.await.unwrap();
    assert!(
        compacted["text"].as_str().unwrap().contains("SUMMARY"),
        "{compacted}"
    );
    let message_id = queued["message"]["message_id"].clone();
    let mut done = Value::Null;
    for _ in 0..200 {
        done = api
            .call(
                "messages.get",
                json!({"session_id": sid, "message_id": message_id}),
            )
            .await;
        if done["status"] == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(done["status"], "completed", "{done}");
    let page = api.call("messages.list", json!({"session_id": sid})).await;
    let texts: Vec<_> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(!texts.iter().any(|t| t == "elsewhere"), "{texts:?}");
    server.stop().await;
}

/// `conversation.compact` (and its REST twin) replaces a conversation's history by the
/// summary its model writes, and answers the compaction's reply; an unknown conversation is
/// not found.
#[tokio::test]
async fn a_conversation_is_compacted_over_json_rpc_and_rest() {
    let server = Server::start_with(
        |_| {},
        vec![
            ScriptedReply::text("first answer"),
            ScriptedReply::text("SUMMARY one"),
            ScriptedReply::text("SUMMARY two"),
        ],
    )
    .await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    let conv = id(
        &api.call("conversation.open", json!({"session_id": sid}))
            .await,
        "conversation_id",
    );
    api.call(
        "conversation.message",
        json!({"session_id": sid, "conversation_id": conv, "text": "one"}),
    )
    .await;
    let compacted = api
        .call(
            "conversation.compact",
            json!({"session_id": sid, "conversation_id": conv}),
        )
        .await;
    assert_eq!(compacted["status"], "ok", "{compacted}");
    assert_eq!(compacted["text"], "SUMMARY one");
    let stats = api
        .call(
            "conversation.stats",
            json!({"session_id": sid, "conversation_id": conv}),
        )
        .await;
    assert_eq!(stats["history_items"], 1, "the summary alone: {stats}");
    let (status, rest) = api
        .post(
            &format!("/api/sessions/{sid}/conversations/{conv}/compact"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{rest}");
    assert_eq!(rest["text"], "SUMMARY two");
    let unknown = api
        .rpc(
            "conversation.compact",
            json!({"session_id": sid, "conversation_id": troupe_proto::ConversationId::new()}),
        )
        .await;
    assert_eq!(unknown["error"]["code"], NOT_FOUND, "{unknown}");
    server.stop().await;
}
