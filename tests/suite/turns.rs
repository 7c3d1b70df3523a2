//! The turn loop (T1, T2, T5, T6, C3): token budgets, per-step token events, tool error
//! policies, compaction under a one-turn override.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use troupe_actors::conversation::COMPACT_INSTRUCTIONS;
use troupe_proto::WarningCode;
use troupe_proto::{
    AgentError, EventKind, HistoryItem, OpenConversation, OverBudget, TaskStatus, ToolErrorPolicy,
};
use troupe_runtime::ScriptedReply;
use troupe_tests::{FlakyTools, RecordingModel, TestSession, start_with_model};

fn long(n: usize) -> String {
    "word ".repeat(n)
}

#[tokio::test]
async fn over_budget_prompt_is_rejected_and_the_conversation_stays_usable() {
    let t = TestSession::start_with(
        vec![],
        |c| c.conversation.task.max_prompt_tokens = Some(400),
        None,
    )
    .await;
    let root = t.root().await;
    let reply = t.session.message(root, long(2_000)).await.unwrap();
    assert_eq!(reply.status, TaskStatus::Error);
    match reply.error {
        Some(AgentError::InvalidInput { message }) => {
            assert!(message.contains("max-prompt-tokens 400"), "{message}")
        }
        other => panic!("expected a budget error, got {other:?}"),
    }
    assert_eq!(t.model.calls(), 0, "nothing was sent");
    let ok = t.session.message(root, "short").await.unwrap();
    assert_eq!(ok.status, TaskStatus::Ok);
    t.stop().await;
}

/// Under `reject`, a history grown past the budget rejects every turn; a compaction gets the
/// conversation going again: it summarizes what fits rather than being rejected for the size
/// it is there to shrink (it was, so nothing but a restart with other limits helped).
#[tokio::test]
async fn a_compaction_gets_a_conversation_over_budget_going_again() {
    let t = TestSession::start_with(
        vec![
            ScriptedReply::text(long(600)),
            ScriptedReply::text("SUMMARY: a long answer"),
            ScriptedReply::text("fine"),
        ],
        |c| c.conversation.task.max_prompt_tokens = Some(400),
        None,
    )
    .await;
    let root = t.root().await;
    assert_eq!(
        t.session.message(root, "hi").await.unwrap().status,
        TaskStatus::Ok
    );
    let stuck = t.session.message(root, "next").await.unwrap();
    assert_eq!(
        stuck.status,
        TaskStatus::Error,
        "the history is over the budget"
    );
    assert_eq!(t.model.calls(), 1);
    let compacted = t.session.compact(root).await.unwrap();
    assert_eq!(compacted.status, TaskStatus::Ok, "{:?}", compacted.error);
    assert_eq!(compacted.text, "SUMMARY: a long answer");
    let again = t.session.message(root, "again").await.unwrap();
    assert_eq!(again.status, TaskStatus::Ok, "{:?}", again.error);
    assert_eq!(again.text, "fine");
    t.stop().await;
}

#[tokio::test]
async fn trim_leaves_out_the_oldest_history_and_warns() {
    let model = Arc::new(RecordingModel::new(vec![]));
    let (session, _dir, _join) = start_with_model(
        model.clone(),
        |c| {
            c.conversation.task.max_prompt_tokens = Some(700);
            c.conversation.task.over_budget = OverBudget::Trim;
        },
        None,
    )
    .await;
    let c = session
        .open(OpenConversation {
            user_instructions: Some("pinned instructions".into()),
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    let mut events = session.subscribe().await.unwrap();
    for i in 0..4 {
        session
            .message(c, format!("m{i} {}", long(100)))
            .await
            .unwrap();
    }
    let last = model.sent().pop().unwrap();
    // The instructions stay first and this turn's message stays last; old turns went.
    assert_eq!(last.prompt[0], HistoryItem::user("pinned instructions"));
    assert!(
        matches!(last.prompt.last(), Some(HistoryItem::Message { text, .. }) if text.starts_with("m3"))
    );
    assert!(last.prompt.len() < 1 + 4 * 2, "{} items", last.prompt.len());
    let mut trimmed = false;
    // Events are published once committed: a flush is the barrier.
    session.flush().await.unwrap();
    while let Ok(e) = events.try_recv() {
        if let EventKind::Warning { code, .. } = &e.event {
            trimmed |= *code == WarningCode::PromptTrimmed;
        }
    }
    assert!(trimmed);
    session.shutdown().await.unwrap();
}

#[tokio::test]
async fn warn_threshold_and_step_tokens_are_reported() {
    let t = TestSession::start_with(
        vec![
            ScriptedReply::tool("update_plan", serde_json::json!({"plan": []})),
            ScriptedReply::text("done"),
        ],
        |c| {
            c.conversation.task.warn_prompt_tokens = Some(10);
            c.root.include_plan_tool = true;
        },
        None,
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let root = t.root().await;
    let reply = t.session.message(root, "hello").await.unwrap();
    let mut warned = 0;
    let mut steps = Vec::new();
    // Events are published once committed: a flush is the barrier.
    t.session.flush().await.unwrap();
    while let Ok(e) = events.try_recv() {
        match &e.event {
            EventKind::Warning { code, .. } if *code == WarningCode::PromptTokensWarning => {
                warned += 1
            }
            EventKind::StepFinished {
                turn,
                step,
                estimated_prompt_tokens,
                usage,
                ..
            } => {
                assert_eq!(*turn, 1);
                steps.push((*step, *estimated_prompt_tokens, usage.unwrap()));
            }
            _ => {}
        }
    }
    assert_eq!(warned, 2, "one warning per step");
    assert_eq!(steps.len(), 2);
    assert!(
        steps[1].1 > steps[0].1,
        "the second prompt holds the tool call and output"
    );
    let estimated: u64 = steps.iter().map(|s| s.1).sum();
    assert_eq!(reply.stats.estimated_prompt_tokens, estimated);
    let output: u64 = steps.iter().map(|s| s.2.output_tokens).sum();
    assert_eq!(reply.stats.usage.output_tokens, output);
    // Turns count per conversation.
    t.session.message(root, "again").await.unwrap();
    let mut turn = 0;
    // Events are published once committed: a flush is the barrier.
    t.session.flush().await.unwrap();
    while let Ok(e) = events.try_recv() {
        if let EventKind::StepStarted { turn: n, .. } = e.event {
            turn = n;
        }
    }
    assert_eq!(turn, 2);
    t.stop().await;
}

async fn flaky(policy: ToolErrorPolicy, failures: usize) -> (troupe_proto::MessageReply, usize) {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mcp = Arc::new(FlakyTools {
        failures,
        calls: calls.clone(),
    });
    let model = Arc::new(RecordingModel::new(vec![
        ScriptedReply::tool("flaky__op", serde_json::json!({})),
        ScriptedReply::default(),
    ]));
    let (session, _dir, _join) = start_with_model(
        model,
        |c| c.conversation.task.tool_errors = policy,
        Some(mcp),
    )
    .await;
    let root = session.root().await.unwrap();
    let reply = session.message(root, "go").await.unwrap();
    session.shutdown().await.unwrap();
    (reply, calls.load(Ordering::SeqCst))
}

#[tokio::test]
async fn tool_error_policy_skip_gives_the_error_to_the_model() {
    let (reply, calls) = flaky(ToolErrorPolicy::Skip, 1).await;
    assert_eq!(calls, 1);
    assert_eq!(reply.status, TaskStatus::Ok);
    assert!(reply.text.contains("failure 1"), "{}", reply.text);
}

#[tokio::test]
async fn tool_error_policy_terminate_ends_the_turn() {
    let (reply, calls) = flaky(ToolErrorPolicy::Terminate, 1).await;
    assert_eq!(calls, 1);
    assert_eq!(reply.status, TaskStatus::Error);
    assert!(matches!(reply.error, Some(AgentError::McpError { .. })));
}

#[tokio::test]
async fn tool_error_policy_retry_runs_the_call_again() {
    let (reply, calls) = flaky(ToolErrorPolicy::Retry { attempts: 2 }, 2).await;
    assert_eq!(calls, 3);
    assert_eq!(reply.status, TaskStatus::Ok);
    assert!(reply.text.contains("worked"), "{}", reply.text);
    let (reply, calls) = flaky(ToolErrorPolicy::Retry { attempts: 1 }, 5).await;
    assert_eq!(calls, 2, "one retry, then skip");
    assert!(reply.text.contains("failure 2"), "{}", reply.text);
}

#[tokio::test]
async fn compaction_uses_a_one_turn_override_and_replaces_history() {
    let model = Arc::new(RecordingModel::new(vec![
        ScriptedReply::text("first answer"),
        ScriptedReply::text("SUMMARY: the user said one"),
    ]));
    let (session, _dir, _join) = start_with_model(model.clone(), |_| {}, None).await;
    let c = session
        .open(OpenConversation {
            base_instructions: Some("base prompt".into()),
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    session.message(c, "one").await.unwrap();
    let compacted = session.compact(c).await.unwrap();
    assert_eq!(compacted.text, "SUMMARY: the user said one");
    session.message(c, "two").await.unwrap();
    let sent = model.sent();
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[1].instructions, COMPACT_INSTRUCTIONS);
    assert!(sent[1].tools.is_empty(), "a compaction offers no tools");
    // The override was not written back; history is now the summary.
    assert_eq!(sent[2].instructions, "base prompt");
    assert_eq!(
        sent[2].prompt,
        vec![
            HistoryItem::Summary {
                text: "SUMMARY: the user said one".into(),
                replaced_items: 2
            },
            HistoryItem::user("two"),
        ]
    );
    // A restart from the rollout rebuilds the compacted history, not the old one.
    let actor = session.conversation_actor(c).await.unwrap().unwrap();
    let mut events = session.subscribe().await.unwrap();
    actor
        .cast(troupe_actors::conversation::ConversationMsg::InjectPanic)
        .unwrap();
    loop {
        if let EventKind::ConversationRestarted { restored_items, .. } =
            events.recv().await.unwrap().event
        {
            assert_eq!(restored_items, 3, "summary, two, its answer");
            break;
        }
    }
    session.message(c, "three").await.unwrap();
    let last = model.sent().pop().unwrap();
    assert!(matches!(&last.prompt[0], HistoryItem::Summary { .. }));
    assert_eq!(last.prompt.len(), 4);
    session.shutdown().await.unwrap();
}

/// T5: a provider that reports no usage (an OpenAI-compatible server over real HTTP, Chat and
/// Responses) gets its completions counted locally: the turn's stats say how many tokens and
/// that no step had provider usage; a step with usage is not counted again.
#[tokio::test]
async fn completions_without_provider_usage_are_counted_locally() {
    use troupe_actors::ports::{ApproxTokens, TokenCounter};
    use troupe_runtime::config::{ModelConfig, Provider};
    use troupe_runtime::openai::OpenAiClient;
    use troupe_test_support::{ModelServer, Reply};

    for provider in [Provider::OpenaiChat, Provider::OpenaiResponses] {
        let server = ModelServer::start().await;
        server.push(Reply::text(["Hello", " there, friend"]).without_usage());
        server.push(Reply::text(["counted upstream"]).with_usage(10, 3, 0, 0));
        let model = OpenAiClient::new(ModelConfig {
            provider,
            base_url: server.base_url(),
            model: "m".into(),
            api_key_env: None,
            ..ModelConfig::default()
        })
        .unwrap();
        let (session, _dir, _join) = start_with_model(Arc::new(model), |_| {}, None).await;
        let root = session.root().await.unwrap();

        let reply = session.message(root, "hi").await.unwrap();
        assert_eq!(reply.text, "Hello there, friend", "{provider:?}");
        let stats = &reply.stats;
        assert_eq!(stats.usage.output_tokens, 0, "{provider:?}");
        assert_eq!(
            (stats.steps, stats.steps_with_usage),
            (1, 0),
            "{provider:?}"
        );
        let local = ApproxTokens.count("Hello there, friend") as u64;
        assert!(local > 0);
        assert_eq!(stats.estimated_completion_tokens, local, "{provider:?}");

        let reply = session.message(root, "again").await.unwrap();
        let stats = &reply.stats;
        assert_eq!(stats.usage.output_tokens, 3, "{provider:?}");
        assert_eq!(
            (stats.steps, stats.steps_with_usage),
            (1, 1),
            "{provider:?}"
        );
        assert_eq!(stats.estimated_completion_tokens, 0, "{provider:?}");
        session.shutdown().await.unwrap();
    }
}
