//! Determinism (S8, seed 000 §14): the same input gives the same tool list and the same
//! event sequence, run after run.

use std::sync::Arc;
use troupe_proto::{EventKind, Json, OpenConversation, ToolSpec};
use troupe_runtime::ScriptedReply;
use troupe_tests::{FixedTools, RecordingModel, start_with_model};

fn tools() -> Vec<ToolSpec> {
    ["zeta__z", "alpha__a", "mid__m", "alpha__b"]
        .iter()
        .map(|n| ToolSpec {
            name: (*n).into(),
            description: format!("{n} tool"),
            parameters: Json(serde_json::json!({"type": "object"})),
        })
        .collect()
}

/// One run: the tool names sent to the model and the event kinds, with ids and times erased.
async fn run_once(order: &[usize]) -> (Vec<String>, Vec<String>) {
    let all = tools();
    let mcp = Arc::new(FixedTools {
        tools: order.iter().map(|&i| all[i].clone()).collect(),
        released: Default::default(),
    });
    let model = Arc::new(RecordingModel::new(vec![
        ScriptedReply::tool("alpha__a", serde_json::json!({"q": 1})),
        ScriptedReply::text("done").chunked(2),
    ]));
    let (session, _dir, _join) = start_with_model(
        model.clone(),
        |c| {
            c.conversation.shell_tool = true;
            c.root = OpenConversation {
                include_plan_tool: true,
                ..OpenConversation::default()
            };
        },
        Some(mcp),
    )
    .await;
    // Live events are published once committed: the root's opening may still be on its way.
    session.flush().await.unwrap();
    let mut events = session.subscribe().await.unwrap();
    let root = session.root().await.unwrap();
    session.message(root, "go").await.unwrap();
    session.flush().await.unwrap();
    let mut kinds = Vec::new();
    while let Ok(e) = events.try_recv() {
        let detail = match &e.event {
            EventKind::AssistantChunk { delta } => format!(":{delta}"),
            EventKind::ToolCallStarted { call, .. } => format!(":{}", call.name),
            EventKind::TaskFinished { status, .. } => format!(":{}", status.as_str()),
            _ => String::new(),
        };
        kinds.push(format!("{}{detail}", e.event.name()));
    }
    session.shutdown().await.unwrap();
    (model.sent()[0].tools.clone(), kinds)
}

#[tokio::test]
async fn tool_list_and_events_are_identical_across_runs() {
    let first = run_once(&[0, 1, 2, 3]).await;
    assert_eq!(
        first.0,
        vec![
            "shell",
            "update_plan",
            "alpha__a",
            "alpha__b",
            "mid__m",
            "zeta__z"
        ]
    );
    for order in [[3, 2, 1, 0], [1, 3, 0, 2], [0, 1, 2, 3]] {
        assert_eq!(run_once(&order).await, first);
    }
    insta::assert_json_snapshot!("event_sequence", first.1);
}
