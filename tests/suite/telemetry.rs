//! Telemetry (S11, O4): with the OpenTelemetry layer installed, every event of a task carries
//! the task's trace id and a span id, and the reply's stats name the same trace.
//!
//! Installs a global subscriber, so it relies on cargo-nextest's process per test.

use std::collections::HashSet;
use troupe_runtime::ScriptedReply;
use troupe_tests::TestSession;

#[tokio::test]
async fn task_events_carry_the_task_trace() {
    let _guard = troupe_runtime::telemetry::init("troupe-test");
    let t = TestSession::start_with(
        vec![
            ScriptedReply::tool("update_plan", serde_json::json!({"plan": []})),
            ScriptedReply::text("traced").chunked(2),
        ],
        |c| c.root.include_plan_tool = true,
        None,
    )
    .await;
    // Live events are published once committed: the root's opening may still be on its way.
    t.session.flush().await.unwrap();
    let mut events = t.session.subscribe().await.unwrap();
    let root = t.root().await;
    let reply = t.session.message(root, "trace me").await.unwrap();
    assert_eq!(reply.stats.trace_id.len(), 32);
    let mut spans = HashSet::new();
    let mut n = 0;
    // Events are published once committed: a flush is the barrier.
    t.session.flush().await.unwrap();
    while let Ok(e) = events.try_recv() {
        assert_eq!(e.task_id, Some(reply.task_id), "{:?}", e.event);
        assert_eq!(e.conversation_id, Some(root));
        assert_eq!(
            e.trace_id.as_deref(),
            Some(reply.stats.trace_id.as_str()),
            "{:?}",
            e.event
        );
        let span = e.span_id.clone().unwrap();
        assert_eq!(span.len(), 16);
        spans.insert(span);
        n += 1;
    }
    assert!(n >= 6, "saw {n} events");
    // Task, model call and tool call spans: more than one span within the one trace.
    assert!(spans.len() >= 3, "{spans:?}");
    t.stop().await;
}
