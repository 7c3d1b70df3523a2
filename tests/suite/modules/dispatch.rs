//! `dispatch_module`: a model's call reaches a webhook and a stdio gateway, their answers are
//! the observations; a tool policy that denies `module__<id>` refuses the call before
//! anything is delivered.

use super::webhook::{Received, http_module, webhook};
use super::*;

/// The session's events once `n` tool calls finished.
async fn tool_results(api: &Api, session: &str, n: usize) -> Vec<Value> {
    api.sse(session, None, |seen| {
        seen.iter()
            .filter(|e| e["kind"] == "tool_call_finished")
            .count()
            >= n
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_dispatches_to_a_webhook_and_to_a_stdio_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (hooks, posted) = webhook().await;
    module(
        d,
        "answer",
        http_module("answer", "sync", format!("{hooks}/answer"), json!({})),
    );
    module(
        d,
        "bridge",
        gateway_module(d, "bridge", "duplex", "async", json!({})),
    );
    let serving = serve(
        d,
        "",
        json!([
            {"tool_calls": [{"name": "dispatch_module", "arguments": {"module": "answer", "payload": {"question": "?"}}}]},
            {"text": "first done"},
            {"tool_calls": [{"name": "dispatch_module", "arguments": {"module": "bridge", "payload": "ping me"}}]},
            {"text": "second done"},
        ]),
    );
    // The gateway runs before the message is sent.
    eventually(Duration::from_secs(10), async || {
        d.join("bridge.pid").exists().then_some(())
    })
    .await;
    let api = &serving.api;
    let sid = crate::suite::serve::id(&api.session(None).await, "session_id");
    let first = api.say(&sid, "ask the webhook").await;
    assert_eq!(first["reply"]["text"], "first done", "{first}");
    let second = api.say(&sid, "ask the gateway").await;
    assert_eq!(second["reply"]["text"], "second done", "{second}");

    let answers = posted.on("answer");
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["type"], "dispatch");
    assert_eq!(answers[0]["payload"], json!({"question": "?"}));
    let frames = received(d, "bridge");
    let dispatch = frames.iter().find(|f| f["type"] == "dispatch").unwrap();
    assert_eq!(dispatch["payload"], "ping me");

    let events = tool_results(api, &sid, 2).await;
    let outputs: Vec<(&str, bool)> = events
        .iter()
        .filter(|e| e["kind"] == "tool_call_finished")
        .map(|e| {
            assert_eq!(e["data"]["name"], "dispatch_module");
            (
                e["data"]["output"].as_str().unwrap(),
                e["data"]["is_error"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outputs,
        [
            (r#"{"answer":42}"#, false),
            (r#"{"echo":"ping me"}"#, false)
        ]
    );
    metric_reaches(
        &serving.base,
        r#"troupe_module_dispatches_total{module="answer",direction="output",outcome="ok"}"#,
        1.0,
    )
    .await;
    metric_reaches(
        &serving.base,
        r#"troupe_module_dispatches_total{module="bridge",direction="duplex",outcome="ok"}"#,
        1.0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_denies_the_module_refuses_the_dispatch() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (hooks, posted) = webhook().await;
    module(
        d,
        "answer",
        http_module("answer", "sync", format!("{hooks}/answer"), json!({})),
    );
    module(
        d,
        "other",
        http_module("other", "sync", format!("{hooks}/ok"), json!({})),
    );
    let serving = serve(
        d,
        "[tools]\nblacklist = [\"module__answer\"]\n",
        json!([
            {"tool_calls": [{"name": "dispatch_module", "arguments": {"module": "answer", "payload": 1}}]},
            {"text": "refused"},
            {"tool_calls": [{"name": "dispatch_module", "arguments": {"module": "other", "payload": 2}}]},
            {"text": "allowed"},
        ]),
    );
    let api = &serving.api;
    let sid = crate::suite::serve::id(&api.session(None).await, "session_id");
    assert_eq!(api.say(&sid, "one").await["reply"]["text"], "refused");
    assert_eq!(api.say(&sid, "two").await["reply"]["text"], "allowed");
    let events = tool_results(api, &sid, 2).await;
    let rejected: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "policy_rejected")
        .collect();
    assert_eq!(rejected.len(), 1, "{events:?}");
    assert_eq!(rejected[0]["data"]["tool"], "module__answer");
    assert_eq!(rejected[0]["data"]["reason"], "tool_denied");
    let finished: Vec<bool> = events
        .iter()
        .filter(|e| e["kind"] == "tool_call_finished")
        .map(|e| e["data"]["is_error"].as_bool().unwrap())
        .collect();
    assert_eq!(finished, [true, false]);
    assert!(posted.on("answer").is_empty(), "nothing was delivered");
    assert_eq!(posted.on("ok").len(), 1);
}

/// A dispatch is governed once: under `authorizationRequired = ["*"]`, one use of a token
/// covers it (`dispatch_module` and `module__answer` are not each charged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_that_needs_a_token_uses_one_use() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (hooks, posted) = webhook().await;
    module(
        d,
        "answer",
        http_module("answer", "sync", format!("{hooks}/answer"), json!({})),
    );
    let serving = serve(
        d,
        "[tools]\nauthorizationRequired = [\"*\"]\n",
        json!([
            {"tool_calls": [{"name": "dispatch_module", "arguments": {"module": "answer", "payload": 1}}]},
            {"text": "dispatched"},
        ]),
    );
    let api = &serving.api;
    let (status, issued) = api
        .post(
            "/api/tokens",
            json!({"agent": "*", "tool": "*", "ttl_secs": 600, "max_uses": 1}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{issued}");
    let sid = crate::suite::serve::id(&api.session(None).await, "session_id");
    let (status, sent) = api
        .post(
            &format!("/api/sessions/{sid}/messages"),
            json!({"text": "go", "authorization": [issued["token"]]}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{sent}");
    assert_eq!(sent["reply"]["text"], "dispatched", "{sent}");
    let events = tool_results(api, &sid, 1).await;
    assert!(
        !events.iter().any(|e| e["kind"] == "policy_rejected"),
        "{events:?}"
    );
    assert_eq!(posted.on("answer").len(), 1, "delivered");
    let (_, listed) = api.get("/api/tokens").await;
    assert_eq!(listed[0]["uses"], 1, "{listed}");
}

/// `troupe serve` in `d` with the `answer` webhook module, an agent (so a supervisor routes,
/// by model) and a model whose first answer routes the message to `answer`; `extra`: more
/// configuration. The service and what the webhook received.
async fn routed_to_the_answer_module(d: &std::path::Path, extra: &str) -> (Serving, Received) {
    let (hooks, posted) = webhook().await;
    module(
        d,
        "answer",
        http_module("answer", "sync", format!("{hooks}/answer"), json!({})),
    );
    std::fs::create_dir_all(d.join("agents")).unwrap();
    std::fs::write(
        d.join("agents/coder.json"),
        r#"{"id": "coder", "role": "executor", "provider": {"type": "model", "instructions": "You write code."}}"#,
    )
    .unwrap();
    let serving = serve(
        d,
        &format!("[agents]\nrouter = \"model\"\n{extra}"),
        json!([
            {"tool_calls": [{"name": "route", "arguments": {"decision": "dispatch_module", "module": "answer", "input": "what is it?", "confidence": 0.9}}]},
        ]),
    );
    (serving, posted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_supervisor_routes_a_message_to_a_module() {
    let dir = tempfile::tempdir().unwrap();
    let (serving, posted) = routed_to_the_answer_module(dir.path(), "").await;
    let api = &serving.api;
    let sid = crate::suite::serve::id(&api.session(None).await, "session_id");
    let sent = api.say(&sid, "ask the answering service").await;
    assert_eq!(sent["reply"]["status"], "ok", "{sent}");
    assert_eq!(sent["reply"]["text"], r#"{"answer":42}"#, "{sent}");
    let answers = posted.on("answer");
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["payload"], "what is it?");
    let events = api
        .sse(&sid, None, |seen| {
            seen.iter().any(|e| e["kind"] == "route_decided")
        })
        .await;
    let routed = events
        .iter()
        .find(|e| e["kind"] == "route_decided")
        .unwrap();
    assert_eq!(routed["data"]["decision"], "dispatch_module", "{routed}");
    assert_eq!(routed["data"]["module"], "answer", "{routed}");
}

/// The supervisor's route to a module is governed as a call of `dispatch_module` is: a
/// policy that denies `dispatch_module` itself stops it before anything is delivered (only
/// `module__<id>` was checked on the route).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_denies_dispatch_module_stops_the_supervisors_route() {
    let dir = tempfile::tempdir().unwrap();
    let (serving, posted) =
        routed_to_the_answer_module(dir.path(), "[tools]\nblacklist = [\"dispatch_module\"]\n")
            .await;
    let api = &serving.api;
    let sid = crate::suite::serve::id(&api.session(None).await, "session_id");
    let sent = api.say(&sid, "ask the answering service").await;
    assert_ne!(sent["reply"]["status"], "ok", "{sent}");
    let events = api
        .sse(&sid, None, |seen| {
            seen.iter().any(|e| e["kind"] == "policy_rejected")
        })
        .await;
    let rejected = events
        .iter()
        .find(|e| e["kind"] == "policy_rejected")
        .unwrap();
    assert_eq!(rejected["data"]["tool"], "dispatch_module", "{rejected}");
    assert!(posted.on("answer").is_empty(), "nothing was delivered");
}

/// The supervisor's route to a module that does not exist, replayed: the replay ends with the
/// same refusal (`policy_rejected`, `unknown_module`) and the same events, from the recording
/// (it ended `not_found` and left the refusal's event out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_to_an_unknown_module_replays_identically() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("agents")).unwrap();
    std::fs::write(
        d.join("agents/coder.json"),
        r#"{"id": "coder", "role": "executor", "provider": {"type": "model", "instructions": "You write code."}}"#,
    )
    .unwrap();
    let serving = serve(
        d,
        "[agents]\nrouter = \"model\"\n",
        json!([
            {"tool_calls": [{"name": "route", "arguments": {"decision": "dispatch_module", "module": "ghost", "input": "boo", "confidence": 0.9}}]},
        ]),
    );
    let api = &serving.api;
    let sid = crate::suite::serve::id(&api.session(None).await, "session_id");
    let sent = api.say(&sid, "to the ghost").await;
    assert_eq!(sent["reply"]["status"], "error", "{sent}");
    assert_eq!(
        sent["reply"]["error"]["policy_rejected"]["reason"], "unknown_module",
        "{sent}"
    );
    let task = sent["reply"]["task_id"].as_str().unwrap().to_owned();
    serving.terminate();
    let out = tokio::process::Command::new(troupe_tests::troupe_bin())
        .args(["replay", &task, "--config"])
        .arg(d.join("troupe.toml"))
        .current_dir(d)
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_AGENTS_DIR")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(&format!("replay of task {task}: identical")),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
