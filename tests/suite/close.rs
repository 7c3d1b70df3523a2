//! Close semantics (S5): idempotent, cancels the running task, force-aborts one that ignores
//! cancellation after the timeout, answers every concurrent caller, releases what it held.

use std::time::Duration;
use troupe_actors::scheduler::SchedulerMsg;
use troupe_proto::{AgentError, CloseOutcome, EventKind, OpenConversation, TaskStatus};
use troupe_runtime::ScriptedReply;
use troupe_tests::TestSession;

async fn wait_running(t: &TestSession) {
    // An RPC barrier loop: the registry lists the task once the runner holds the slot.
    for _ in 0..10_000 {
        let tasks = t.session.tasks(None).await.unwrap();
        if tasks
            .iter()
            .any(|i| i.state == troupe_proto::TaskState::Running)
        {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("task never started");
}

async fn scheduler_idle(t: &TestSession) -> bool {
    let s = t.session.services().await.unwrap();
    let snap = ractor::call!(s.scheduler, |reply| SchedulerMsg::Snapshot { reply }).unwrap();
    snap.running.is_empty() && snap.waiting.is_empty()
}

#[tokio::test(start_paused = true)]
async fn close_during_a_running_task_cancels_it() {
    let t = TestSession::start(vec![ScriptedReply::hang(true)]).await;
    let c = t.session.open(OpenConversation::default()).await.unwrap();
    let s2 = t.session.clone();
    let msg = tokio::spawn(async move { s2.message(c, "wait forever").await });
    wait_running(&t).await;
    let closed = t.session.close(c).await.unwrap();
    assert_eq!(closed.outcome, CloseOutcome::Closed);
    let reply = msg.await.unwrap().unwrap();
    assert_eq!(reply.status, TaskStatus::Cancelled);
    assert!(scheduler_idle(&t).await);
    assert!(t.session.tasks(None).await.unwrap().is_empty());
    t.stop().await;
}

#[tokio::test(start_paused = true)]
async fn close_twice_is_harmless() {
    let t = TestSession::start(vec![]).await;
    let c = t.session.open(OpenConversation::default()).await.unwrap();
    assert_eq!(
        t.session.close(c).await.unwrap().outcome,
        CloseOutcome::Closed
    );
    assert_eq!(
        t.session.close(c).await.unwrap().outcome,
        CloseOutcome::AlreadyClosed
    );
    let err = t.session.message(c, "hello?").await.unwrap_err();
    assert!(matches!(err, AgentError::NotFound { .. }));
    t.stop().await;
}

#[tokio::test(start_paused = true)]
async fn many_concurrent_closers_all_get_an_answer() {
    let t = TestSession::start(vec![ScriptedReply::hang(true)]).await;
    let c = t.session.open(OpenConversation::default()).await.unwrap();
    let s2 = t.session.clone();
    let msg = tokio::spawn(async move { s2.message(c, "busy").await });
    wait_running(&t).await;
    let closers: Vec<_> = (0..50)
        .map(|_| {
            let s = t.session.clone();
            tokio::spawn(async move { s.close(c).await.unwrap().outcome })
        })
        .collect();
    let mut closed = 0;
    for h in closers {
        match h.await.unwrap() {
            CloseOutcome::Closed => closed += 1,
            CloseOutcome::AlreadyClosed => {}
            CloseOutcome::ForceAborted => panic!("a cooperative task was aborted"),
        }
    }
    assert!(closed >= 1);
    assert_eq!(msg.await.unwrap().unwrap().status, TaskStatus::Cancelled);
    t.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_task_that_ignores_cancellation_is_aborted_after_the_timeout() {
    let t = TestSession::start_with(
        vec![ScriptedReply::hang(false)],
        |c| c.conversation.close_timeout = Duration::from_secs(2),
        None,
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let c = t.session.open(OpenConversation::default()).await.unwrap();
    let s2 = t.session.clone();
    let msg = tokio::spawn(async move { s2.message(c, "deaf").await });
    wait_running(&t).await;
    let started = tokio::time::Instant::now();
    let closed = t.session.close(c).await.unwrap();
    assert_eq!(closed.outcome, CloseOutcome::ForceAborted);
    assert!(started.elapsed() >= Duration::from_secs(2));
    let err = msg.await.unwrap().unwrap_err();
    assert!(matches!(err, AgentError::Cancelled { .. }));
    assert!(scheduler_idle(&t).await, "the aborted task's slot is free");
    // The next conversation can run at once.
    let d = t.session.open(OpenConversation::default()).await.unwrap();
    assert_eq!(
        t.session.message(d, "next").await.unwrap().status,
        TaskStatus::Ok
    );
    let mut aborted = false;
    let mut closed_event = None;
    // Events are published once committed: a flush is the barrier.
    t.session.flush().await.unwrap();
    while let Ok(e) = events.try_recv() {
        match &e.event {
            EventKind::TaskAborted { waited_ms } => {
                assert_eq!(*waited_ms, 2000);
                aborted = true;
            }
            EventKind::ConversationClosed { outcome } if e.conversation_id == Some(c) => {
                closed_event = Some(*outcome);
            }
            _ => {}
        }
    }
    assert!(aborted);
    assert_eq!(closed_event, Some(CloseOutcome::ForceAborted));
    t.stop().await;
}

#[tokio::test(start_paused = true)]
async fn queued_messages_are_cancelled_by_close() {
    let t = TestSession::start(vec![ScriptedReply::hang(true)]).await;
    let c = t.session.open(OpenConversation::default()).await.unwrap();
    let s2 = t.session.clone();
    let first = tokio::spawn(async move { s2.message(c, "first").await });
    wait_running(&t).await;
    let s3 = t.session.clone();
    let second = tokio::spawn(async move { s3.message(c, "second").await });
    // Barrier: the second message reached the conversation before close does.
    tokio::task::yield_now().await;
    let _ = t.session.list().await.unwrap();
    t.session.close(c).await.unwrap();
    assert_eq!(first.await.unwrap().unwrap().status, TaskStatus::Cancelled);
    match second.await.unwrap() {
        Err(AgentError::Cancelled { .. }) | Err(AgentError::NotFound { .. }) => {}
        other => panic!("queued message should be refused, got {other:?}"),
    }
    t.stop().await;
}
