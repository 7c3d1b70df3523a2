//! Every kind of reply over the wire, in both versions' shapes, scripted offline: an answer
//! with a link and a file, a data answer, a plain Message, a question (input required) and
//! the task going on with the client's answer, a rejection; streamed replies; and the files a
//! client may send.

use super::tests::{Fixture, v1_message};
use serde_json::{Value, json};
use troupe_runtime::scripted::ScriptedReply;

const V1: Option<&str> = Some("1.0");

/// A user message in the shape of `version` (`None`: 0.3), with `extra` fields.
fn message(version: Option<&str>, text: &str, extra: Value) -> Value {
    match version {
        Some(_) => v1_message(text, extra),
        None => {
            let mut m = json!({"kind": "message", "messageId": format!("m-{text}"),
                               "role": "user", "parts": [{"kind": "text", "text": text}]});
            if let (Some(m), Some(e)) = (m.as_object_mut(), extra.as_object()) {
                m.extend(e.clone());
            }
            m
        }
    }
}

/// A blocking send's result.
async fn send(f: &Fixture, version: Option<&str>, text: &str, extra: Value) -> Value {
    let method = if version.is_some() {
        "SendMessage"
    } else {
        "message/send"
    };
    let r = f
        .call(
            version,
            method,
            json!({"message": message(version, text, extra)}),
        )
        .await;
    assert!(r["result"].is_object(), "{r}");
    r["result"].clone()
}

/// The task of a result (1.0 wraps it; 0.3 is the task).
fn task(version: Option<&str>, result: &Value) -> Value {
    match version {
        Some(_) => result["task"].clone(),
        None => {
            assert_eq!(result["kind"], "task", "{result}");
            result.clone()
        }
    }
}

fn state(version: Option<&str>, task: &Value) -> String {
    let s = task["status"]["state"].as_str().unwrap_or_default();
    match version {
        Some(_) => s
            .trim_start_matches("TASK_STATE_")
            .to_ascii_lowercase()
            .replace('_', "-"),
        None => s.to_owned(),
    }
}

fn text_of(part: &Value) -> &str {
    part["text"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn every_reply_kind_in_both_versions() {
    let mut replies = Vec::new();
    for _ in 0..2 {
        replies.extend([
            ScriptedReply::a2a(json!({
            "text": "Here is the report.",
            "parts": [
                {"url": "https://example.com/report.pdf", "mediaType": "application/pdf",
                 "filename": "report.pdf"},
                {"raw": "aGVsbG8gZmlsZQ==", "mediaType": "text/plain", "filename": "hello.txt"},
            ]})),
            ScriptedReply::json(json!({"total": 3, "items": ["a", "b", "c"]})),
            ScriptedReply::a2a(json!({"reply": "message", "text": "Just a word."})),
            ScriptedReply::a2a(json!({"state": "input-required", "text": "Which city?"})),
            ScriptedReply::text("Sunny in Paris."),
            ScriptedReply::a2a(json!({"state": "rejected", "text": "I will not do that."})),
        ]);
    }
    let f = Fixture::start(replies).await;
    for v in [V1, None] {
        // A link and a file, after the text.
        let t = task(v, &send(&f, v, "report", json!({})).await);
        assert_eq!(state(v, &t), "completed", "{t}");
        let parts = &t["artifacts"][0]["parts"];
        assert_eq!(text_of(&parts[0]), "Here is the report.");
        match v {
            Some(_) => {
                assert_eq!(parts[1]["url"], "https://example.com/report.pdf", "{t}");
                assert_eq!(parts[1]["mediaType"], "application/pdf");
                assert_eq!(parts[1]["filename"], "report.pdf");
                assert_eq!(parts[2]["raw"], "aGVsbG8gZmlsZQ==");
                assert_eq!(parts[2]["filename"], "hello.txt");
            }
            None => {
                assert_eq!(parts[1]["kind"], "file", "{t}");
                assert_eq!(parts[1]["file"]["uri"], "https://example.com/report.pdf");
                assert_eq!(parts[1]["file"]["mimeType"], "application/pdf");
                assert_eq!(parts[1]["file"]["name"], "report.pdf");
                assert_eq!(parts[2]["file"]["bytes"], "aGVsbG8gZmlsZQ==");
            }
        }
        // Structured data.
        let t = task(v, &send(&f, v, "count", json!({})).await);
        let data = &t["artifacts"][0]["parts"][0];
        assert_eq!(data["data"]["total"], 3, "{t}");
        match v {
            Some(_) => assert_eq!(data["mediaType"], "application/json"),
            None => assert_eq!(data["kind"], "data"),
        }
        // A plain Message, no task.
        let r = send(&f, v, "hello", json!({})).await;
        let m = match v {
            Some(_) => r["message"].clone(),
            None => {
                assert_eq!(r["kind"], "message", "{r}");
                r.clone()
            }
        };
        assert_eq!(text_of(&m["parts"][0]), "Just a word.", "{r}");
        assert_eq!(m["role"], if v.is_some() { "ROLE_AGENT" } else { "agent" });
        assert!(m.get("taskId").is_none(), "{m}");
        assert!(m["contextId"].is_string());
        // A question, then the task goes on with the client's answer.
        let t = task(v, &send(&f, v, "weather?", json!({})).await);
        assert_eq!(state(v, &t), "input-required", "{t}");
        assert_eq!(text_of(&t["status"]["message"]["parts"][0]), "Which city?");
        let id = t["id"].as_str().unwrap();
        let done = task(v, &send(&f, v, "Paris", json!({"taskId": id})).await);
        assert_eq!(state(v, &done), "completed", "{done}");
        assert_eq!(done["id"], id);
        assert_eq!(
            text_of(&done["artifacts"][0]["parts"][0]),
            "Sunny in Paris."
        );
        let said: Vec<&str> = done["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| text_of(&m["parts"][0]))
            .collect();
        assert_eq!(said, ["weather?", "Which city?", "Paris"]);
        // A rejection.
        let t = task(v, &send(&f, v, "do it", json!({})).await);
        assert_eq!(state(v, &t), "rejected", "{t}");
        assert_eq!(
            text_of(&t["status"]["message"]["parts"][0]),
            "I will not do that."
        );
    }
    f.stop().await;
}

#[tokio::test]
async fn streamed_json_arrives_whole_and_a_message_ends_the_stream() {
    let mut replies = Vec::new();
    for _ in 0..2 {
        replies.extend([
            ScriptedReply::json(json!({"answer": 42})).chunked(3),
            ScriptedReply::a2a(json!({"reply": "message", "text": "Bye."})).chunked(4),
        ]);
    }
    let f = Fixture::start(replies).await;
    for (v, method) in [(V1, "SendStreamingMessage"), (None, "message/stream")] {
        let frames = f
            .stream(
                v,
                method,
                json!({"message": message(v, "data please", json!({}))}),
            )
            .await;
        let artifacts: Vec<&Value> = frames
            .iter()
            .filter_map(|e| match v {
                Some(_) => e.get("artifactUpdate"),
                None => (e["kind"] == "artifact-update").then_some(e),
            })
            .collect();
        assert_eq!(artifacts.len(), 1, "no JSON in pieces: {frames:?}");
        assert_eq!(artifacts[0]["artifact"]["parts"][0]["data"]["answer"], 42);
        let frames = f
            .stream(v, method, json!({"message": message(v, "bye", json!({}))}))
            .await;
        let last = frames.last().unwrap();
        let m = match v {
            Some(_) => &last["message"],
            None => {
                assert_eq!(last["kind"], "message", "{frames:?}");
                last
            }
        };
        assert_eq!(text_of(&m["parts"][0]), "Bye.", "{frames:?}");
    }
    f.stop().await;
}

#[tokio::test]
async fn clients_may_send_text_files_but_not_links_or_binaries() {
    let f = Fixture::start(Vec::new()).await;
    // 1.0: a raw part.
    let r = send(
        &f,
        V1,
        "x",
        json!({"parts": [{"text": "Read this:"},
                         {"raw": "bm90ZXMgZnJvbSBhIGZpbGU=", "mediaType": "text/markdown",
                          "filename": "notes.md"}]}),
    )
    .await;
    let answer = text_of(&r["task"]["artifacts"][0]["parts"][0]);
    assert!(
        answer.contains("notes.md") && answer.contains("notes from a file"),
        "the conversation read the file: {answer}"
    );
    // 0.3: a file part with bytes.
    let r = send(
        &f,
        None,
        "x",
        json!({"parts": [{"kind": "file", "file": {"bytes": "bm90ZXMgZnJvbSBhIGZpbGU=",
                                                   "mimeType": "text/plain", "name": "n.txt"}}]}),
    )
    .await;
    assert!(
        text_of(&r["artifacts"][0]["parts"][0]).contains("notes from a file"),
        "{r}"
    );
    // A link, or a binary file: ContentTypeNotSupported, nothing runs.
    let calls = f.model.calls();
    for parts in [
        json!([{"url": "https://example.com/a.txt", "mediaType": "text/plain"}]),
        json!([{"raw": "iVBORw0KGgo=", "mediaType": "image/png", "filename": "a.png"}]),
    ] {
        let r = f
            .call(
                V1,
                "SendMessage",
                json!({"message": v1_message("x", json!({"parts": parts}))}),
            )
            .await;
        assert_eq!(r["error"]["code"], -32005, "{r}");
    }
    assert_eq!(f.model.calls(), calls);
    f.stop().await;
}

#[tokio::test]
async fn a_patch_the_agent_applied_is_a_diff_file_of_the_task() {
    let workspace = tempfile::tempdir().unwrap();
    let root = workspace.path().to_path_buf();
    let patch = "*** Begin Patch\n*** Add File: notes.txt\n+written by the agent\n*** End Patch\n";
    let f = Fixture::start_tuned(
        vec![
            ScriptedReply::tool("apply_patch", json!({ "input": patch })),
            ScriptedReply::text("Patched."),
        ],
        |c| c.conversation.workspace_roots = vec![root],
        |a| a.tasks.open.include_apply_patch_tool = true,
    )
    .await;
    let id = f.send_now("patch it", json!({})).await;
    f.wait_state(&id, "TASK_STATE_INPUT_REQUIRED").await;
    let r = send(&f, V1, "approve", json!({"taskId": id})).await;
    let t = &r["task"];
    assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED", "{r}");
    let file = &t["artifacts"][0];
    assert_eq!(file["name"], "patch", "{t}");
    let part = &file["parts"][0];
    assert_eq!(part["mediaType"], "text/x-diff");
    assert_eq!(part["filename"], "patch-1.diff");
    let bytes = crate::a2a::reply::raw_bytes(part["raw"].as_str().unwrap()).unwrap();
    assert_eq!(String::from_utf8(bytes).unwrap(), patch);
    assert!(
        workspace.path().join("notes.txt").is_file(),
        "the patch applied"
    );
    assert_eq!(text_of(&t["artifacts"][1]["parts"][0]), "Patched.");
    f.stop().await;
}

/// An answer to a question that comes with a push config the task cannot take (it has 16
/// already) is refused before anything of it is applied: the task still waits for its
/// answer, which a send without the config then gives.
#[tokio::test]
async fn an_answer_with_a_push_config_the_task_cannot_take_changes_nothing() {
    let f = Fixture::start(vec![
        ScriptedReply::a2a(json!({"state": "input-required", "text": "Which city?"})),
        ScriptedReply::text("Sunny in Paris."),
    ])
    .await;
    let t = task(V1, &send(&f, V1, "weather?", json!({})).await);
    assert_eq!(state(V1, &t), "input-required", "{t}");
    let id = t["id"].as_str().unwrap().to_owned();
    let url = "http://127.0.0.1:9/hook";
    for n in 0..16 {
        let made = f
            .call(
                V1,
                "CreateTaskPushNotificationConfig",
                json!({"taskId": id, "id": format!("c{n}"), "url": url}),
            )
            .await;
        assert!(made["result"].is_object(), "{made}");
    }
    let refused = f
        .call(
            V1,
            "SendMessage",
            json!({"message": message(V1, "Paris", json!({"taskId": id})),
                   "configuration": {"taskPushNotificationConfig": {"url": url}}}),
        )
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let now = f.call(V1, "GetTask", json!({"id": id})).await;
    assert_eq!(
        now["result"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{now}"
    );
    let done = task(V1, &send(&f, V1, "Paris", json!({"taskId": id})).await);
    assert_eq!(state(V1, &done), "completed", "{done}");
    f.stop().await;
}
