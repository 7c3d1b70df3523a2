//! History trimmed inside a running conversation (S6): the next prompt the model receives
//! starts with the summary of what was trimmed, written locally or by the model (in a task of
//! its own, reported back to the conversation), with the local one kept when the model fails.

use std::sync::Arc;
use std::time::Duration;
use troupe_actors::conversation::COMPACT_INSTRUCTIONS;
use troupe_actors::conversation::summary::SUMMARY_REQUEST;
use troupe_actors::history::SummaryMode;
use troupe_actors::{SessionConfig, SessionHandle};
use troupe_proto::{EventKind, HistoryItem, OpenConversation, WarningCode};
use troupe_runtime::ScriptedReply;
use troupe_tests::{RecordingModel, conversation_stats, restart_conversation, start_with_model};

/// Four items at most, trimmed two by two: the third message's end trims the first two
/// exchanges.
fn small_history(summary: SummaryMode) -> impl FnOnce(&mut SessionConfig) {
    move |c| {
        c.conversation.history.max_items = 4;
        c.conversation.history.segment_items = 2;
        c.conversation.summary = summary;
    }
}

fn summary_of(prompt: &[HistoryItem]) -> Option<&str> {
    prompt.iter().find_map(|item| match item {
        HistoryItem::Summary { text, .. } => Some(text.as_str()),
        _ => None,
    })
}

async fn three_messages(session: &SessionHandle) -> troupe_proto::ConversationId {
    let c = session.open(OpenConversation::default()).await.unwrap();
    for text in ["alpha question", "beta question", "gamma question"] {
        session.message(c, text).await.unwrap();
    }
    c
}

#[tokio::test(start_paused = true)]
async fn the_local_summary_of_a_trim_is_in_the_next_prompt() {
    let model = Arc::new(RecordingModel::new(
        ["r1", "r2", "r3", "r4"].map(ScriptedReply::text).into(),
    ));
    let (session, _dir, join) =
        start_with_model(model.clone(), small_history(SummaryMode::Local), None).await;
    let c = three_messages(&session).await;
    let sent = model.sent();
    assert_eq!(summary_of(&sent[2].prompt), None, "nothing trimmed yet");
    session.message(c, "delta question").await.unwrap();
    let sent = model.sent();
    assert_eq!(sent.len(), 4, "no model call but the four messages'");
    let summary = summary_of(&sent[3].prompt).expect("the next prompt has the summary");
    assert!(summary.contains("user: alpha question"), "{summary}");
    assert!(summary.contains("assistant: r2"), "{summary}");
    // What was trimmed is not sent again; what was kept is.
    let texts: Vec<_> = sent[3]
        .prompt
        .iter()
        .filter_map(|i| match i {
            HistoryItem::Message { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["gamma question", "r3", "delta question"]);
    session.shutdown().await.unwrap();
    let _ = join.await;
}

#[tokio::test(start_paused = true)]
async fn the_model_summary_is_written_outside_the_mailbox_and_reaches_the_next_prompt() {
    let model = Arc::new(RecordingModel::new(vec![
        ScriptedReply::text("r1"),
        ScriptedReply::text("r2"),
        ScriptedReply::text("r3"),
        // The summary call, slow: the conversation answers meanwhile.
        ScriptedReply::text("MODEL SUMMARY: alpha then beta").delayed(Duration::from_secs(5)),
        ScriptedReply::text("r4"),
    ]));
    let mode = SummaryMode::Model {
        timeout: Duration::from_secs(30),
    };
    let (session, _dir, join) = start_with_model(model.clone(), small_history(mode), None).await;
    let mut events = session.subscribe().await.unwrap();
    let c = three_messages(&session).await;
    // While the model writes, the conversation's mailbox is free.
    let stats = session.conversation_actor(c).await.unwrap().unwrap();
    let live = ractor::call!(stats, |reply| {
        troupe_actors::conversation::ConversationMsg::Stats { reply }
    })
    .unwrap();
    assert_eq!(
        live.history_items, 3,
        "the local summary and the kept exchange"
    );
    loop {
        // (Not under a timeout guard: with paused time it would fire while the rollout
        // writes the event.)
        let e = events.recv().await.unwrap();
        if let EventKind::HistoryTrimmed {
            removed_items: 0,
            summary,
        } = &e.event
        {
            assert_eq!(summary, "MODEL SUMMARY: alpha then beta");
            break;
        }
    }
    session.message(c, "delta question").await.unwrap();
    // (The fourth message trims again, and asks the model for a summary again.)
    let sent = model.sent();
    let asked = &sent[3];
    assert_eq!(asked.instructions, COMPACT_INSTRUCTIONS);
    assert!(asked.tools.is_empty());
    assert!(asked.prompt.contains(&HistoryItem::user("alpha question")));
    assert!(asked.prompt.contains(&HistoryItem::assistant("r2")));
    assert_eq!(
        asked.prompt.last(),
        Some(&HistoryItem::user(SUMMARY_REQUEST))
    );
    assert_eq!(
        summary_of(&sent[4].prompt),
        Some("MODEL SUMMARY: alpha then beta"),
        "the next prompt has the model's summary"
    );
    session.shutdown().await.unwrap();
    let _ = join.await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_model_summary_leaves_the_local_one_with_a_warning() {
    let model = Arc::new(RecordingModel::new(vec![
        ScriptedReply::text("r1"),
        ScriptedReply::text("r2"),
        ScriptedReply::text("r3"),
        ScriptedReply::error("the summary endpoint is down"),
        ScriptedReply::text("r4"),
    ]));
    let mode = SummaryMode::Model {
        timeout: Duration::from_secs(30),
    };
    let (session, _dir, join) = start_with_model(model.clone(), small_history(mode), None).await;
    let mut events = session.subscribe().await.unwrap();
    let c = three_messages(&session).await;
    let message = summary_fallback(&mut events).await;
    assert!(
        message.contains("the summary endpoint is down"),
        "{message}"
    );
    session.message(c, "delta question").await.unwrap();
    let sent = model.sent();
    let summary = summary_of(&sent[4].prompt).expect("a summary all the same");
    assert!(
        summary.contains("user: alpha question"),
        "the local one: {summary}"
    );
    session.shutdown().await.unwrap();
    let _ = join.await;
}

#[tokio::test(start_paused = true)]
async fn a_model_summary_past_its_timeout_leaves_the_local_one() {
    let model = Arc::new(RecordingModel::new(vec![
        ScriptedReply::text("r1"),
        ScriptedReply::text("r2"),
        ScriptedReply::text("r3"),
        ScriptedReply::hang(false),
        ScriptedReply::text("r4"),
    ]));
    let mode = SummaryMode::Model {
        timeout: Duration::from_secs(2),
    };
    let (session, _dir, join) = start_with_model(model.clone(), small_history(mode), None).await;
    let mut events = session.subscribe().await.unwrap();
    let c = three_messages(&session).await;
    let message = summary_fallback(&mut events).await;
    assert!(message.contains("2000 ms"), "{message}");
    session.message(c, "delta question").await.unwrap();
    let summary = summary_of(&model.sent()[4].prompt).map(str::to_owned);
    assert!(summary.is_some_and(|s| s.contains("alpha question")));
    session.shutdown().await.unwrap();
    let _ = join.await;
}

/// The message of the next `summary_fallback` warning. (Not under a timeout guard: with
/// paused time it would fire while the rollout writes the event.)
async fn summary_fallback(
    events: &mut tokio::sync::broadcast::Receiver<Arc<troupe_proto::EventEnvelope>>,
) -> String {
    loop {
        let e = events.recv().await.unwrap();
        if let EventKind::Warning {
            code: WarningCode::SummaryFallback,
            message,
        } = &e.event
        {
            return message.clone();
        }
    }
}

/// A model summary that arrives while the next message runs, when the trim kept nothing,
/// checkpoints the history from that message's start: a restore after it ends (with no trim
/// since) brings back the whole exchange, question included, as the live history holds it.
#[tokio::test(start_paused = true)]
async fn a_summary_written_while_a_message_runs_restores_that_whole_message() {
    let long = "word ".repeat(400);
    let model = Arc::new(RecordingModel::new(vec![
        // Too long to keep: the first exchange is trimmed whole.
        ScriptedReply::text(long),
        // The summary call, answered while the second message runs.
        ScriptedReply::text("MODEL SUMMARY").delayed(Duration::from_secs(5)),
        ScriptedReply::text("short").delayed(Duration::from_secs(10)),
    ]));
    let mode = SummaryMode::Model {
        timeout: Duration::from_secs(30),
    };
    let small = move |c: &mut SessionConfig| {
        c.conversation.history.max_tokens = 64;
        c.conversation.summary = mode;
    };
    let (session, _dir, join) = start_with_model(model.clone(), small, None).await;
    let c = session.open(OpenConversation::default()).await.unwrap();
    session.message(c, "first question").await.unwrap();
    while model.sent().len() < 2 {
        tokio::task::yield_now().await;
    }
    let s2 = session.clone();
    let second = tokio::spawn(async move { s2.message(c, "second question").await });
    let reply = second.await.unwrap().unwrap();
    assert_eq!(reply.text, "short");
    let live = conversation_stats(&session, c).await;
    assert_eq!(live.history_items, 3, "the summary and the second exchange");
    restart_conversation(&session, c).await;
    let restored = conversation_stats(&session, c).await;
    assert_eq!(restored.history_items, live.history_items);
    session.shutdown().await.unwrap();
    let _ = join.await;
}

/// Under `ttl`, a compaction's answer summarizes older content: every record of the
/// compaction task that holds it (its chunks, its answer, its end, the `compacted` record) is
/// due no later than the oldest message it stands for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_under_ttl_is_due_with_the_oldest_content_it_summarizes() {
    use troupe_actors::rollout::RolloutMsg;
    use troupe_proto::{EventName, StoragePolicy};
    let model = Arc::new(RecordingModel::new(vec![
        ScriptedReply::text("first answer"),
        ScriptedReply::text("a summary of the first exchange"),
    ]));
    let (session, _dir, join) = start_with_model(model, |_| {}, None).await;
    let c = session
        .open(OpenConversation {
            storage_policy: StoragePolicy::Ttl { secs: 600 },
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    session.message(c, "first question").await.unwrap();
    // The compaction is written well after the first exchange.
    tokio::time::sleep(Duration::from_millis(200)).await;
    session.compact(c).await.unwrap();
    session.flush().await.unwrap();
    let services = session.services().await.unwrap();
    let records = ractor::call!(services.rollout, |reply| RolloutMsg::ReadConversation {
        conversation_id: c,
        reply
    })
    .unwrap()
    .unwrap();
    let first = records
        .iter()
        .find(|r| r.kind == EventName::TaskStarted)
        .unwrap();
    let due = first.meta.expires_ms.unwrap();
    let compaction = records
        .iter()
        .find(|r| r.kind == EventName::CompactionStarted)
        .and_then(|r| r.task_id)
        .unwrap();
    let carrying: Vec<_> = records
        .iter()
        .filter(|r| {
            r.task_id == Some(compaction)
                && matches!(
                    r.kind,
                    EventName::AssistantChunk
                        | EventName::AssistantMessage
                        | EventName::TaskFinished
                        | EventName::Compacted
                )
        })
        .collect();
    assert!(carrying.len() >= 3, "{carrying:?}");
    for r in carrying {
        assert!(r.ts_ms >= first.ts_ms + 200, "{r:?}");
        assert!(
            r.meta.expires_ms.unwrap() <= due,
            "{:?} outlives the first question",
            r.kind
        );
    }
    session.shutdown().await.unwrap();
    let _ = join.await;
}
