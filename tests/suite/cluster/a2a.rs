//! The A2A endpoint through any node: its session (the current session of the `a2a` project)
//! lives on the node that answered the first A2A call; calls asked of another node are
//! forwarded to it, streams included, and answered by its model.

use super::forwarding::{forwarded_ok, metrics};
use super::{http, kill9, node};
use serde_json::{Value, json};
use std::time::Duration;

async fn a2a(base: &str, method: &str, params: Value) -> Value {
    http()
        .post(format!("{base}/a2a"))
        .header("A2A-Version", "1.0")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn message(text: &str, context: Option<&str>) -> Value {
    let mut m = json!({"messageId": format!("m-{text}"), "role": "ROLE_USER",
                       "parts": [{"text": text}]});
    if let Some(c) = context {
        m["contextId"] = json!(c);
    }
    m
}

/// Waits for the task to complete (asked of `base`); its answer's text.
async fn answer(base: &str, task_id: &str) -> String {
    for _ in 0..500 {
        let got = a2a(base, "GetTask", json!({"id": task_id})).await;
        if got["result"]["status"]["state"] == "TASK_STATE_COMPLETED" {
            return got["result"]["artifacts"][0]["parts"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("task {task_id} did not complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2a_calls_asked_of_any_node_are_answered_by_the_a2a_sessions_node() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let (mut a, base_a) = node(dir.path(), &url, "a", 10);
    let (mut b, base_b) = node(dir.path(), &url, "b", 10);

    // The first A2A call, on A: the A2A session is made there.
    let first = a2a(
        &base_a,
        "SendMessage",
        json!({"message": message("one", None)}),
    )
    .await;
    let task = &first["result"]["task"];
    let context = task["contextId"]
        .as_str()
        .unwrap_or_else(|| panic!("{first}"));
    let said = answer(&base_a, task["id"].as_str().unwrap()).await;
    assert!(said.contains("a reply"), "{said}");

    // The same context through B: forwarded to A, answered by A's model.
    let forwarded = forwarded_ok(&metrics(&base_b).await);
    let second = a2a(
        &base_b,
        "SendMessage",
        json!({"message": message("two", Some(context))}),
    )
    .await;
    let task = &second["result"]["task"];
    assert_eq!(task["contextId"], context, "{second}");
    let said = answer(&base_b, task["id"].as_str().unwrap()).await;
    assert!(said.contains("a reply"), "answered on A: {said}");
    assert!(forwarded_ok(&metrics(&base_b).await) >= forwarded + 2.0);

    // A stream through B: A's events, ending with its reply.
    let streamed = http()
        .post(format!("{base_b}/a2a"))
        .header("A2A-Version", "1.0")
        .json(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "SendStreamingMessage",
                      "params": {"message": message("three", Some(context))}}),
        )
        .send()
        .await
        .unwrap();
    assert!(
        streamed
            .headers()
            .get("content-type")
            .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream")),
        "{:?}",
        streamed.headers()
    );
    let body = tokio::time::timeout(Duration::from_secs(20), streamed.text())
        .await
        .expect("the stream ends with the task")
        .unwrap();
    assert!(body.contains("a reply"), "{body}");
    assert!(!body.contains("b reply"), "{body}");

    kill9(&mut a);
    kill9(&mut b);
}

/// A node that starts while another runs an A2A task leaves that task alone: only the node
/// that runs the A2A session settles its tasks after a restart (the new node marked it
/// FAILED, and told its webhook, while its owner still ran it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_starting_leaves_another_nodes_running_a2a_task_alone() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let (_a, base_a) = node(dir.path(), &url, "a", 600_000);
    let sent = a2a(
        &base_a,
        "SendMessage",
        json!({"message": message("slow", None), "configuration": {"returnImmediately": true}}),
    )
    .await;
    let task_id = sent["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{sent}"))
        .to_owned();
    let state = |v: &Value| {
        v["result"]["status"]["state"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    for _ in 0..500 {
        if state(&a2a(&base_a, "GetTask", json!({"id": task_id})).await) == "TASK_STATE_WORKING" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // B starts (its A2A endpoint reads the live tasks of the shared store), and serves.
    let (_b, base_b) = node(dir.path(), &url, "b", 10);
    let _ = a2a(&base_b, "GetTask", json!({"id": task_id})).await;
    let stored = troupe_test_postgres::server()
        .psql_at(
            &url,
            &format!("SELECT terminal FROM a2a_tasks WHERE task_id = '{task_id}'"),
        )
        .unwrap();
    assert_eq!(stored.trim(), "f", "still running in the store");
    assert_eq!(
        state(&a2a(&base_a, "GetTask", json!({"id": task_id})).await),
        "TASK_STATE_WORKING"
    );
}
