//! C6 over the API: set-context puts a field back to its default with `null` (absent leaves
//! it), and `refresh_mcp` reads the MCP tools again, against a real MCP server.

use super::{Api, Server, id};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;
use troupe_actors::ports::{McpServerConfig, McpTransport};
use troupe_proto::ApprovalPolicy;
use troupe_runtime::ScriptedReply;
use troupe_test_support::mcp::server_entry;

fn plan() -> Value {
    json!({"plan": [{"step": "look", "status": "in_progress"}]})
}

/// The stored parameters of a conversation.
async fn params(api: &Api, sid: &str, cid: &str) -> Value {
    let listed = api
        .call("conversation.list", json!({"session_id": sid}))
        .await;
    listed
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conversation_id"] == cid)
        .unwrap()["params"]
        .clone()
}

/// Sends `text` (the model calls one tool, then answers) and returns the stored result of
/// that tool call.
async fn tool_result(api: &Api, sid: &str, cid: &str, text: &str) -> Value {
    let (status, sent) = api
        .post(
            &format!("/api/sessions/{sid}/messages"),
            json!({"text": text, "conversation_id": cid}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{sent}");
    let (_, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
    page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|m| m["type"] == "tool_result")
        .unwrap_or_else(|| panic!("a tool result: {page}"))
        .clone()
}

async fn set_context(api: &Api, sid: &str, cid: &str, body: Value) {
    let (status, v) = api
        .put(
            &format!("/api/sessions/{sid}/conversations/{cid}/context"),
            body,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

#[tokio::test]
async fn null_puts_a_field_back_to_its_default_and_absent_leaves_it() {
    let server = Server::start_with(
        |c| c.chat.approval_policy = ApprovalPolicy::Never,
        vec![
            ScriptedReply::tool("update_plan", plan()),
            ScriptedReply::text("planned"),
            ScriptedReply::tool("update_plan", plan()),
            ScriptedReply::text("no plan tool"),
        ],
    )
    .await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    let opened = api
        .call(
            "conversation.open",
            json!({"session_id": sid, "base_instructions": "custom", "include_plan_tool": true}),
        )
        .await;
    let cid = id(&opened, "conversation_id");

    // A value sets; what the update leaves out stays.
    set_context(&api, &sid, &cid, json!({"base_instructions": "changed"})).await;
    let p = params(&api, &sid, &cid).await;
    assert_eq!(p["base_instructions"], "changed");
    assert_eq!(p["include_plan_tool"], true, "absent: unchanged");
    let result = tool_result(&api, &sid, &cid, "plan it").await;
    assert_eq!(
        result["metadata"]["is_error"], false,
        "the plan tool is offered: {result}"
    );

    // `null` puts the default back (the RPC twin here): no plan tool, built-in instructions.
    api.call(
        "conversation.setContext",
        json!({"session_id": sid, "conversation_id": cid,
               "base_instructions": null, "include_plan_tool": null}),
    )
    .await;
    let p = params(&api, &sid, &cid).await;
    assert_eq!(p["base_instructions"], Value::Null);
    assert_eq!(p["include_plan_tool"], false);
    let result = tool_result(&api, &sid, &cid, "plan it again").await;
    assert_eq!(
        result["metadata"]["is_error"], true,
        "the default offers no plan tool: {result}"
    );
    assert!(
        result["content"].as_str().unwrap().contains("update_plan"),
        "{result}"
    );
    server.stop().await;
}

#[tokio::test]
async fn refresh_mcp_starts_a_server_waiting_to_restart_and_its_tools_appear() {
    let dir = tempfile::tempdir().unwrap();
    // The server's entry does not exist yet: its first start fails, and its restart waits an
    // hour.
    let entry = dir.path().join("late-server.js");
    let config = McpServerConfig {
        name: "late".into(),
        transport: McpTransport::Stdio {
            command: "node".into(),
            args: vec![entry.display().to_string(), "stdio".into()],
            env: Default::default(),
            cwd: None,
        },
    };
    let server = Server::start_with(
        move |c| {
            c.chat.approval_policy = ApprovalPolicy::Never;
            c.mcp.servers = vec![config];
            c.mcp.limits.restart_backoff_base = Duration::from_secs(3600);
            c.mcp.limits.restart_backoff_max = Duration::from_secs(3600);
        },
        vec![
            ScriptedReply::tool("late__echo", json!({"message": "after the refresh"})),
            ScriptedReply::text("echoed"),
        ],
    )
    .await;
    let api = server.api();
    let s = api.session(None).await;
    let (sid, root) = (id(&s, "session_id"), id(&s, "root_conversation_id"));
    let failed = api
        .sse(&sid, None, |events| {
            events
                .iter()
                .any(|e| e["kind"] == "warning" && e["data"]["code"] == "mcp_server_failed")
        })
        .await;
    let last = failed.last().unwrap()["seq"].as_u64().unwrap();

    std::os::unix::fs::symlink(server_entry("server-everything"), &entry).unwrap();
    set_context(&api, &sid, &root, json!({"refresh_mcp": true})).await;
    let ready = api
        .sse(&sid, Some(last), |events| {
            events
                .iter()
                .any(|e| e["kind"] == "mcp_server_ready" && e["data"]["server"] == "late")
        })
        .await;
    assert!(!ready.is_empty());

    let result = tool_result(&api, &sid, &root, "echo it").await;
    assert_eq!(result["metadata"]["tool"], "late__echo");
    assert_eq!(result["metadata"]["is_error"], false, "{result}");
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .contains("after the refresh"),
        "{result}"
    );
    server.stop().await;
}
