//! Open, message, set-context: the S5 lifecycle through the Session.

use std::sync::Arc;
use troupe_proto::{AgentError, EventKind, HistoryItem, OpenConversation, SetContext, TaskStatus};
use troupe_runtime::ScriptedReply;
use troupe_tests::{RecordingModel, TestSession, start_with_model};

#[tokio::test]
async fn root_conversation_answers_with_stats() {
    let t = TestSession::start(vec![ScriptedReply::text("hello there").chunked(3)]).await;
    let root = t.root().await;
    let reply = t.session.message(root, "hi").await.unwrap();
    assert_eq!(reply.status, TaskStatus::Ok);
    assert_eq!(reply.text, "hello there");
    assert_eq!(reply.stats.steps, 1);
    assert_eq!(reply.stats.turn, 1);
    assert_eq!(reply.stats.tool_calls, 0);
    assert!(reply.stats.usage.output_tokens > 0);
    assert!(reply.stats.estimated_prompt_tokens > 0);
    assert!(!reply.stats.trace_id.is_empty());
    assert_eq!(t.session.list().await.unwrap(), vec![root]);
    t.stop().await;
}

#[tokio::test]
async fn conversations_are_isolated() {
    let t = TestSession::start(vec![]).await;
    let a = t.session.open(OpenConversation::default()).await.unwrap();
    let b = t.session.open(OpenConversation::default()).await.unwrap();
    t.session.message(a, "alpha-secret").await.unwrap();
    let rb = t.session.message(b, "beta").await.unwrap();
    // The scripted model repeats the last user message it sees in the prompt: b never saw a's.
    assert_eq!(rb.text, "You said: beta");
    let ra = t.session.message(a, "again").await.unwrap();
    assert_eq!(ra.text, "You said: again");
    t.stop().await;
}

#[tokio::test]
async fn tool_calls_run_and_feed_back() {
    let t = TestSession::start_with(
        vec![
            ScriptedReply::tool(
                "update_plan",
                serde_json::json!({"plan": [{"step": "a", "status": "pending"}]}),
            ),
            ScriptedReply::text("planned"),
        ],
        |_| {},
        None,
    )
    .await;
    let root = t.root().await;
    t.session
        .set_context(
            root,
            SetContext {
                include_plan_tool: Some(Some(true)),
                ..SetContext::default()
            },
        )
        .await
        .unwrap();
    let reply = t.session.message(root, "make a plan").await.unwrap();
    assert_eq!(reply.status, TaskStatus::Ok);
    assert_eq!(reply.text, "planned");
    assert_eq!(reply.stats.tool_calls, 1);
    assert_eq!(reply.stats.steps, 2);
    t.stop().await;
}

#[tokio::test]
async fn unknown_tool_becomes_an_error_observation_and_the_turn_goes_on() {
    let t = TestSession::start(vec![
        ScriptedReply::tool("no_such_tool", serde_json::json!({})),
        ScriptedReply::text("recovered"),
    ])
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let root = t.root().await;
    let reply = t.session.message(root, "go").await.unwrap();
    assert_eq!(reply.status, TaskStatus::Ok);
    assert_eq!(reply.text, "recovered");
    let mut saw_error_output = false;
    // Events are published once committed: a flush is the barrier.
    t.session.flush().await.unwrap();
    while let Ok(e) = events.try_recv() {
        if let EventKind::ToolCallFinished {
            is_error: true,
            output,
            ..
        } = &e.event
        {
            assert!(output.contains("unknown tool"));
            saw_error_output = true;
        }
    }
    assert!(saw_error_output);
    t.stop().await;
}

#[tokio::test]
async fn model_error_ends_the_turn_and_the_conversation_stays_usable() {
    let t = TestSession::start(vec![ScriptedReply::error("upstream exploded")]).await;
    let root = t.root().await;
    let reply = t.session.message(root, "first").await.unwrap();
    assert_eq!(reply.status, TaskStatus::Error);
    assert!(matches!(reply.error, Some(AgentError::ModelError { .. })));
    let reply = t.session.message(root, "second").await.unwrap();
    assert_eq!(reply.status, TaskStatus::Ok);
    assert_eq!(reply.text, "You said: second");
    t.stop().await;
}

/// A model call that fails at a later step is not counted: `steps` are the calls that
/// answered, so the turn's tokens come from the provider alone (its source is not `mixed`).
#[tokio::test]
async fn a_step_that_failed_is_not_counted() {
    let t = TestSession::start_with(
        vec![
            ScriptedReply::tool("update_plan", serde_json::json!({"plan": []})),
            ScriptedReply::error("upstream exploded"),
        ],
        |c| c.root.include_plan_tool = true,
        None,
    )
    .await;
    let root = t.root().await;
    let reply = t.session.message(root, "plan").await.unwrap();
    assert_eq!(reply.status, TaskStatus::Error);
    assert_eq!((reply.stats.steps, reply.stats.steps_with_usage), (1, 1));
    assert_eq!(reply.stats.tool_calls, 1);
    t.stop().await;
}

#[tokio::test]
async fn max_steps_ends_the_turn() {
    let looping: Vec<_> = (0..10)
        .map(|_| ScriptedReply::tool("update_plan", serde_json::json!({"plan": []})))
        .collect();
    let t = TestSession::start_with(
        looping,
        |c| {
            c.conversation.task.max_steps = 3;
            c.root.include_plan_tool = true;
        },
        None,
    )
    .await;
    let root = t.root().await;
    let reply = t.session.message(root, "loop").await.unwrap();
    assert_eq!(reply.status, TaskStatus::MaxSteps);
    assert_eq!(reply.stats.steps, 3);
    t.stop().await;
}

#[tokio::test]
async fn unknown_conversation_is_not_found() {
    let t = TestSession::start(vec![]).await;
    let err = t
        .session
        .message(troupe_proto::ConversationId::new(), "x")
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::NotFound { .. }));
    t.stop().await;
}

#[tokio::test]
async fn illegal_allowlist_is_rejected_at_open_naming_the_names() {
    let t = TestSession::start(vec![]).await;
    let err = t
        .session
        .open(OpenConversation {
            mcp_tool_allowlist: Some(vec!["ok__tool".into(), "bad name!".into()]),
            ..OpenConversation::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::InvalidInput { .. }));
    assert!(err.to_string().contains("bad name!"));
    t.stop().await;
}

#[tokio::test]
async fn user_instructions_come_first_and_set_context_keeps_history_order() {
    let model = Arc::new(RecordingModel::new(vec![]));
    let (session, _dir, _join) = start_with_model(model.clone(), |_| {}, None).await;
    let c = session
        .open(OpenConversation {
            user_instructions: Some("be brief".into()),
            base_instructions: Some("you are a test".into()),
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    session.message(c, "one").await.unwrap();
    session
        .set_context(
            c,
            SetContext {
                user_instructions: Some(Some("be verbose".into())),
                ..SetContext::default()
            },
        )
        .await
        .unwrap();
    session.message(c, "two").await.unwrap();
    let sent = model.sent();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].instructions, "you are a test");
    assert_eq!(
        sent[0].prompt,
        vec![HistoryItem::user("be brief"), HistoryItem::user("one")]
    );
    assert_eq!(
        sent[1].prompt,
        vec![
            HistoryItem::user("be verbose"),
            HistoryItem::user("one"),
            HistoryItem::assistant("You said: one"),
            HistoryItem::user("two"),
        ]
    );
    assert!(!sent[0].prompt_cache_key.is_empty());
    session.shutdown().await.unwrap();
}

/// C1: web search has no runner here, so asking for it (at open or by set-context) never
/// puts it in front of the model: the tool list sent holds only tools that run, and the
/// conversation gets a `tool_unavailable` warning instead.
#[tokio::test]
async fn web_search_is_never_offered_without_a_runner() {
    use troupe_proto::WarningCode;
    let model = Arc::new(RecordingModel::new(vec![]));
    let (session, _dir, _join) = start_with_model(model.clone(), |_| {}, None).await;
    let mut events = session.subscribe().await.unwrap();
    let c = session
        .open(OpenConversation {
            tools_web_search_request: true,
            include_plan_tool: true,
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    session.message(c, "search for it").await.unwrap();
    let d = session.open(OpenConversation::default()).await.unwrap();
    session
        .set_context(
            d,
            SetContext {
                tools_web_search_request: Some(Some(true)),
                ..SetContext::default()
            },
        )
        .await
        .unwrap();
    session.message(d, "and here").await.unwrap();
    for sent in model.sent() {
        assert!(
            !sent.tools.iter().any(|t| t == "web_search"),
            "{:?}",
            sent.tools
        );
    }
    assert!(model.sent()[0].tools.iter().any(|t| t == "update_plan"));
    session.flush().await.unwrap();
    let mut warned = Vec::new();
    while let Ok(e) = events.try_recv() {
        if let EventKind::Warning { code, message } = &e.event
            && *code == WarningCode::ToolUnavailable
        {
            assert!(message.contains("web_search"), "{message}");
            warned.extend(e.conversation_id);
        }
    }
    assert_eq!(warned, [c, d]);
}
