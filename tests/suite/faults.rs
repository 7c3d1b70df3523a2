//! Fault injection (seed 000 §14): a panicking conversation actor, a panicking task runner,
//! tool conflicts, cancellation, a slow event subscriber.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::error::TryRecvError;
use troupe_actors::conversation::ConversationMsg;
use troupe_actors::ports::{DeltaSink, ModelClient, ModelInfo, ModelRequest, ModelResponse};
use troupe_proto::{EventKind, HistoryItem, Json, OpenConversation, TaskStatus, ToolSpec};
use troupe_proto::{EventName, WarningCode};
use troupe_runtime::ScriptedReply;
use troupe_tests::{FixedTools, RecordingModel, TestSession, start_with_model};

#[tokio::test]
async fn a_panicking_conversation_restarts_from_its_rollout_and_siblings_are_untouched() {
    let model = Arc::new(RecordingModel::new(vec![]));
    let (session, _dir, _join) = start_with_model(model.clone(), |_| {}, None).await;
    let a = session.open(OpenConversation::default()).await.unwrap();
    let b = session.open(OpenConversation::default()).await.unwrap();
    session.message(a, "remember the lighthouse").await.unwrap();
    session.message(b, "sibling one").await.unwrap();
    let actor_a = session.conversation_actor(a).await.unwrap().unwrap();
    let actor_b = session.conversation_actor(b).await.unwrap().unwrap();
    let mut events = session.subscribe().await.unwrap();
    actor_a.cast(ConversationMsg::InjectPanic).unwrap();
    // Wait for the restart event (bounded).
    let restored = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let e = events.recv().await.unwrap();
            if let EventKind::ConversationRestarted { restored_items, .. } = e.event {
                assert_eq!(e.conversation_id, Some(a));
                return restored_items;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(restored, 2, "user message and reply restored");
    let new_a = session.conversation_actor(a).await.unwrap().unwrap();
    assert_ne!(new_a.get_id(), actor_a.get_id());
    assert_eq!(
        session
            .conversation_actor(b)
            .await
            .unwrap()
            .unwrap()
            .get_id(),
        actor_b.get_id()
    );
    // a remembers; b is unaffected.
    session.message(a, "and now?").await.unwrap();
    let last = model.sent().pop().unwrap();
    assert_eq!(
        last.prompt,
        vec![
            HistoryItem::user("remember the lighthouse"),
            HistoryItem::assistant("You said: remember the lighthouse"),
            HistoryItem::user("and now?"),
        ]
    );
    assert_eq!(
        session.message(b, "sibling two").await.unwrap().status,
        TaskStatus::Ok
    );
    session.shutdown().await.unwrap();
}

/// Answers like the scripted model, except that it panics when the user says "boom".
struct PanickyModel(troupe_runtime::ScriptedModel);

#[async_trait::async_trait]
impl ModelClient for PanickyModel {
    fn info(&self) -> ModelInfo {
        self.0.info()
    }

    async fn step(
        &self,
        request: ModelRequest<'_>,
        deltas: &mut dyn DeltaSink,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<ModelResponse, troupe_proto::AgentError> {
        let boom = request
            .prompt
            .iter()
            .any(|i| matches!(i, HistoryItem::Message { text, .. } if text == "boom"));
        assert!(!boom, "the model client has a bug");
        self.0.step(request, deltas, cancel).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_task_whose_runner_panics_ends_in_error_and_gives_its_slot_back() {
    let model = Arc::new(PanickyModel(troupe_runtime::ScriptedModel::default()));
    let (session, _dir, _join) = start_with_model(model, |_| {}, None).await;
    let root = session.root().await.unwrap();
    let reply = session.message(root, "boom").await.unwrap();
    assert_eq!(reply.status, TaskStatus::Error);
    assert!(
        matches!(reply.error, Some(troupe_proto::AgentError::Internal { .. })),
        "{:?}",
        reply.error
    );
    assert!(session.tasks(None).await.unwrap().is_empty());
    // Single-flight: another conversation's task runs only if the slot was given back.
    let other = session.open(OpenConversation::default()).await.unwrap();
    assert_eq!(
        session.message(other, "fine").await.unwrap().status,
        TaskStatus::Ok
    );
    assert_eq!(
        session.message(root, "still here").await.unwrap().status,
        TaskStatus::Ok
    );
    session.shutdown().await.unwrap();
}

fn tool(name: &str, schema: serde_json::Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: "test tool".into(),
        parameters: Json(schema),
    }
}

#[tokio::test]
async fn tool_conflict_is_a_warning_and_one_copy_is_kept() {
    let mcp = Arc::new(FixedTools {
        tools: vec![
            tool("srv__b", serde_json::json!({"type": "object"})),
            tool("srv__a", serde_json::json!({"type": "object"})),
            tool("srv__a", serde_json::json!({"type": "object"})),
            tool("srv__c", serde_json::json!({"type": "object"})),
            tool(
                "srv__c",
                serde_json::json!({"type": "object", "properties": {"x": {}}}),
            ),
        ],
        released: Default::default(),
    });
    let model = Arc::new(RecordingModel::new(vec![]));
    let (session, _dir, _join) = start_with_model(model.clone(), |_| {}, Some(mcp)).await;
    let mut events = session.subscribe().await.unwrap();
    let root = session.root().await.unwrap();
    session.message(root, "list your tools").await.unwrap();
    let sent = model.sent();
    assert_eq!(sent[0].tools, vec!["srv__a", "srv__b", "srv__c"]);
    let mut conflicts = Vec::new();
    // Events are published once committed: a flush is the barrier.
    session.flush().await.unwrap();
    while let Ok(e) = events.try_recv() {
        if let EventKind::Warning { code, message } = &e.event
            && *code == WarningCode::ToolConflict
        {
            conflicts.push(message.clone());
        }
    }
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    assert!(conflicts[0].contains("srv__c"));
    session.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_task_can_be_cancelled_by_id() {
    let t = TestSession::start(vec![ScriptedReply::hang(true)]).await;
    let root = t.root().await;
    let s = t.session.clone();
    let task = tokio::spawn(async move { s.message(root, "long").await });
    let info = loop {
        if let Some(i) = t
            .session
            .tasks(Some(root))
            .await
            .unwrap()
            .into_iter()
            .next()
        {
            break i;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(info.sub_id, format!("{root}/{}", info.task_id));
    t.session.cancel_task(info.task_id).await.unwrap();
    let reply = task.await.unwrap().unwrap();
    assert_eq!(reply.status, TaskStatus::Cancelled);
    // Cancelling a finished task is a clear NotFound.
    let err = t.session.cancel_task(info.task_id).await.unwrap_err();
    assert!(matches!(err, troupe_proto::AgentError::NotFound { .. }));
    // The conversation goes on.
    assert_eq!(
        t.session.message(root, "again").await.unwrap().status,
        TaskStatus::Ok
    );
    t.stop().await;
}

#[tokio::test]
async fn a_slow_subscriber_lags_and_the_record_loses_nothing() {
    let t = TestSession::start_with(vec![], |c| c.subscriber_capacity = 8, None).await;
    let mut slow = t.session.subscribe().await.unwrap();
    let root = t.root().await;
    for i in 0..30 {
        t.session
            .message(root, format!("message {i}"))
            .await
            .unwrap();
    }
    t.session.flush().await.unwrap();
    // The slow subscriber missed events and is told so.
    assert!(matches!(slow.try_recv(), Err(TryRecvError::Lagged(_))));
    // The rollout has every task, in order.
    let s = t.session.services().await.unwrap();
    let records = ractor::call!(s.rollout, |reply| {
        troupe_actors::rollout::RolloutMsg::ReadConversation {
            conversation_id: root,
            reply,
        }
    })
    .unwrap()
    .unwrap();
    let finished = records
        .iter()
        .filter(|r| r.kind == EventName::TaskFinished)
        .count();
    assert_eq!(finished, 30);
    let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    t.stop().await;
}
