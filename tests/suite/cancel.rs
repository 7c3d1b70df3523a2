//! Cancelling without closing (S4, S9): a cancelled task that ignores its cancellation is
//! aborted after the close timeout and its conversation goes on; cancelling every task of a
//! conversation reaches the running one and the queued ones; a cancelled task withdraws its
//! pending approvals (so does a conversation that fails), and a late answer to one is told it
//! was withdrawn.

use std::time::Duration;
use troupe_actors::scheduler::SchedulerMsg;
use troupe_proto::{
    AgentError, ApprovalDecision, EventKind, SandboxPolicy, TaskState, TaskStatus, WarningCode,
};
use troupe_runtime::ScriptedReply;
use troupe_tests::{TestSession, conversation_stats, restart_conversation};

async fn wait_running(t: &TestSession) -> troupe_proto::TaskId {
    // An RPC barrier loop: the registry lists the task once the runner holds the slot.
    for _ in 0..10_000 {
        let tasks = t.session.tasks(None).await.unwrap();
        if let Some(task) = tasks.iter().find(|i| i.state == TaskState::Running) {
            return task.task_id;
        }
        tokio::task::yield_now().await;
    }
    panic!("task never started");
}

/// Awaits `work`, failing the test (instead of hanging it) if it never ends: time is paused,
/// so the guard fires as soon as nothing else can happen.
async fn ends<T>(work: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(600), work)
        .await
        .expect("it ends: the task is aborted after the close timeout")
}

async fn scheduler_idle(t: &TestSession) -> bool {
    let s = t.session.services().await.unwrap();
    let snap = ractor::call!(s.scheduler, |reply| SchedulerMsg::Snapshot { reply }).unwrap();
    snap.running.is_empty() && snap.waiting.is_empty()
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_task_that_ignores_it_is_aborted_and_the_conversation_goes_on() {
    let t = TestSession::start_with(
        vec![ScriptedReply::hang(false), ScriptedReply::text("after")],
        |c| c.conversation.close_timeout = Duration::from_secs(3),
        None,
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let c = t.root().await;
    let s2 = t.session.clone();
    let deaf = tokio::spawn(async move { s2.message(c, "deaf").await });
    let task_id = wait_running(&t).await;
    let cancelled_at = tokio::time::Instant::now();
    t.session.cancel_task(task_id).await.unwrap();
    let err = ends(deaf).await.unwrap().unwrap_err();
    assert!(matches!(err, AgentError::Cancelled { .. }), "{err:?}");
    assert!(
        cancelled_at.elapsed() >= Duration::from_secs(3),
        "not before the timeout"
    );
    assert!(scheduler_idle(&t).await, "the aborted task's slot is free");
    assert!(t.session.tasks(None).await.unwrap().is_empty());
    // The conversation is still open and runs its next message.
    let next = t.session.message(c, "next").await.unwrap();
    assert_eq!((next.status, next.text.as_str()), (TaskStatus::Ok, "after"));
    t.session.flush().await.unwrap();
    let (mut warned, mut aborted) = (false, None);
    while let Ok(e) = events.try_recv() {
        match &e.event {
            EventKind::Warning {
                code: WarningCode::CancelIgnored,
                message,
            } if e.task_id == Some(task_id) => {
                assert!(message.contains("3000 ms"), "{message}");
                warned = true;
            }
            EventKind::TaskAborted { waited_ms } if e.task_id == Some(task_id) => {
                aborted = Some(*waited_ms);
            }
            _ => {}
        }
    }
    assert!(warned, "a cancel_ignored warning says why");
    assert_eq!(aborted, Some(3000));

    // The aborted task counts as a cancelled one, also once the conversation is restored
    // from its rollout (the abort is all its record says of it).
    let before = conversation_stats(&t.session, c).await;
    assert_eq!((before.tasks, before.tasks_cancelled), (2, 1), "{before:?}");
    restart_conversation(&t.session, c).await;
    let after = conversation_stats(&t.session, c).await;
    assert_eq!(
        (after.tasks, after.tasks_cancelled, after.tasks_failed),
        (before.tasks, before.tasks_cancelled, before.tasks_failed)
    );
    t.stop().await;
}

/// A task a conversation's failure interrupted is recorded as aborted when it is restored, and
/// counts as a cancelled task from then on, the same after a second restore.
#[tokio::test(start_paused = true)]
async fn an_interrupted_task_counts_once_as_cancelled_across_restores() {
    let t = TestSession::start_with(
        vec![ScriptedReply::text("first"), ScriptedReply::hang(false)],
        |_| {},
        None,
    )
    .await;
    let c = t.root().await;
    t.session.message(c, "first").await.unwrap();
    let s2 = t.session.clone();
    let hung = tokio::spawn(async move { s2.message(c, "hangs").await });
    wait_running(&t).await;
    restart_conversation(&t.session, c).await;
    let err = ends(hung).await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::Interrupted { .. } | AgentError::Internal { .. }
        ),
        "{err:?}"
    );
    let once = conversation_stats(&t.session, c).await;
    assert_eq!((once.tasks, once.tasks_cancelled), (2, 1), "{once:?}");
    restart_conversation(&t.session, c).await;
    let twice = conversation_stats(&t.session, c).await;
    assert_eq!((twice.tasks, twice.tasks_cancelled), (2, 1), "{twice:?}");
    t.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_task_that_honours_its_cancellation_is_not_aborted() {
    let t = TestSession::start_with(
        vec![ScriptedReply::hang(true)],
        |c| c.conversation.close_timeout = Duration::from_secs(3),
        None,
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let c = t.root().await;
    let s2 = t.session.clone();
    let polite = tokio::spawn(async move { s2.message(c, "polite").await });
    let task_id = wait_running(&t).await;
    t.session.cancel_task(task_id).await.unwrap();
    let reply = ends(polite).await.unwrap().unwrap();
    assert_eq!(reply.status, TaskStatus::Cancelled);
    // Past the timeout: the timer was dropped with the task, nothing is aborted.
    tokio::time::sleep(Duration::from_secs(10)).await;
    t.session.flush().await.unwrap();
    while let Ok(e) = events.try_recv() {
        assert!(
            !matches!(e.event, EventKind::TaskAborted { .. }),
            "a task that ended is not aborted"
        );
    }
    t.stop().await;
}

#[tokio::test(start_paused = true)]
async fn cancel_all_reaches_the_running_task_and_the_queued_ones() {
    let t = TestSession::start_with(
        vec![ScriptedReply::hang(false), ScriptedReply::text("later")],
        |c| c.conversation.close_timeout = Duration::from_secs(2),
        None,
    )
    .await;
    let c = t.root().await;
    let s = t.session.clone();
    let first = tokio::spawn(async move { s.message(c, "first").await });
    wait_running(&t).await;
    let queued: Vec<_> = (0..2)
        .map(|i| {
            let s = t.session.clone();
            tokio::spawn(async move { s.message(c, &format!("queued {i}")).await })
        })
        .collect();
    // Barrier: both queued messages reached the conversation (its mailbox is FIFO and the
    // stats call goes through it after them).
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let _ = t.session.list().await.unwrap();
    assert_eq!(t.session.cancel_conversation(c).await.unwrap(), 3);
    for q in queued {
        let err = q.await.unwrap().unwrap_err();
        assert!(matches!(err, AgentError::Cancelled { .. }), "{err:?}");
    }
    let err = ends(first).await.unwrap().unwrap_err();
    assert!(
        matches!(err, AgentError::Cancelled { .. }),
        "aborted: {err:?}"
    );
    assert!(scheduler_idle(&t).await);
    // Still open; nothing left to cancel.
    assert_eq!(t.session.cancel_conversation(c).await.unwrap(), 0);
    assert_eq!(t.session.message(c, "again").await.unwrap().text, "later");
    let unknown = t
        .session
        .cancel_conversation(troupe_proto::ConversationId::new())
        .await
        .unwrap_err();
    assert!(matches!(unknown, AgentError::NotFound { .. }));
    t.stop().await;
}

/// A session whose root conversation's task waits for a human to approve a shell command
/// (`tweak` adds to its configuration): the session, the conversation, the waiting message
/// and the pending approval.
async fn waiting_for_approval(
    tweak: fn(&mut troupe_actors::SessionConfig),
) -> (
    TestSession,
    troupe_proto::ConversationId,
    tokio::task::JoinHandle<Result<troupe_proto::MessageReply, AgentError>>,
    troupe_proto::PendingApproval,
) {
    let t = TestSession::start_with(
        vec![ScriptedReply::tool(
            "shell",
            serde_json::json!({"command": ["echo", "hi"]}),
        )],
        move |c| {
            c.conversation.sandbox_policy = SandboxPolicy::FullAccess;
            c.approval_timeout = Duration::from_secs(3600);
            tweak(c);
        },
        None,
    )
    .await;
    let c = t.root().await;
    let s = t.session.clone();
    let asking = tokio::spawn(async move { s.message(c, "run it").await });
    let pending = loop {
        if let Some(p) = t.session.pending_approvals().await.unwrap().pop() {
            break p;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    (t, c, asking, pending)
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_task_withdraws_its_pending_approvals() {
    let (t, c, asking, pending) = waiting_for_approval(|_| {}).await;
    // Subscribed before the cancel: the withdrawal's `approval_resolved` comes after it.
    let mut events = t.session.subscribe().await.unwrap();
    assert_eq!(t.session.cancel_conversation(c).await.unwrap(), 1);
    let reply = ends(asking).await.unwrap().unwrap();
    assert_eq!(reply.status, TaskStatus::Cancelled);
    // Withdrawn: gone from the list, announced, and a late answer says so.
    t.session.flush().await.unwrap();
    assert!(t.session.pending_approvals().await.unwrap().is_empty());
    let late = t
        .session
        .respond_approval(pending.approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap_err();
    match late {
        AgentError::Cancelled { reason } => {
            assert!(reason.contains("withdrawn"), "{reason}");
            assert!(reason.contains("cancelled"), "{reason}");
        }
        other => panic!("a late answer must say the approval was withdrawn: {other:?}"),
    }
    let mut resolved = None;
    while let Ok(e) = events.try_recv() {
        if let EventKind::ApprovalResolved {
            approval_id,
            decision,
        } = &e.event
            && *approval_id == pending.approval_id
        {
            resolved = Some(decision.clone());
        }
    }
    match resolved {
        Some(ApprovalDecision::Deny {
            reason: Some(reason),
        }) => assert!(reason.starts_with("withdrawn"), "{reason}"),
        other => panic!("approval_resolved must announce the withdrawal: {other:?}"),
    }
    t.stop().await;
}

/// Under `tool_errors = "terminate"`, a task cancelled while it waits for an approval still
/// ends `cancelled` (its call failed because of the cancel), not `error`.
#[tokio::test(start_paused = true)]
async fn a_task_cancelled_while_it_waits_for_approval_ends_cancelled_when_tool_errors_terminate() {
    let (t, c, asking, _) = waiting_for_approval(|c| {
        c.conversation.task.tool_errors = troupe_proto::ToolErrorPolicy::Terminate;
    })
    .await;
    assert_eq!(t.session.cancel_conversation(c).await.unwrap(), 1);
    let reply = ends(asking).await.unwrap().unwrap();
    assert_eq!(reply.status, TaskStatus::Cancelled, "{:?}", reply.error);
    t.stop().await;
}

/// A conversation that fails while its task waits for an approval is started again; the
/// approval its aborted task asked for is withdrawn, not left for a human to answer for
/// nothing.
#[tokio::test(start_paused = true)]
async fn a_conversation_that_fails_withdraws_its_tasks_pending_approvals() {
    let (t, c, _asking, pending) = waiting_for_approval(|_| {}).await;
    let actor = t.session.conversation_actor(c).await.unwrap().unwrap();
    actor
        .cast(troupe_actors::conversation::ConversationMsg::InjectPanic)
        .unwrap();
    ends(async {
        while !t.session.pending_approvals().await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let late = t
        .session
        .respond_approval(pending.approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap_err();
    assert!(
        matches!(&late, AgentError::Cancelled { reason } if reason.contains("failed")),
        "{late:?}"
    );
    // The conversation runs again.
    assert_ne!(
        t.session
            .conversation_actor(c)
            .await
            .unwrap()
            .unwrap()
            .get_id(),
        actor.get_id()
    );
    t.stop().await;
}

/// A task that gave its slot back while it waited for a human asks for it again; if that
/// wait is given up and the task asks once more (two waits for humans in one call), the
/// second request waits for the first one's grant instead of asking the scheduler twice
/// (which refuses a second request of one task and so failed the call).
#[tokio::test(start_paused = true)]
async fn a_second_reclaim_of_a_slot_waits_for_the_first_ones_grant() {
    use troupe_actors::conversation::ConversationMsg;
    let hang = || ScriptedReply {
        hang: true,
        ..ScriptedReply::default()
    };
    let t = TestSession::start_with(vec![hang(), hang()], |c| c.scheduler.limit = 1, None).await;
    let a = t.root().await;
    let b = t
        .session
        .open(troupe_proto::OpenConversation::default())
        .await
        .unwrap();
    let s = t.session.clone();
    let _first = tokio::spawn(async move { s.message(a, "holds the slot").await });
    let task_a = wait_running(&t).await;
    let actor = t.session.conversation_actor(a).await.unwrap().unwrap();
    actor
        .cast(ConversationMsg::YieldSlot { task_id: task_a })
        .unwrap();
    // Another conversation's task takes the slot meanwhile.
    let s = t.session.clone();
    let _second = tokio::spawn(async move { s.message(b, "takes it").await });
    let task_b = ends(async {
        loop {
            let tasks = t.session.tasks(Some(b)).await.unwrap();
            if let Some(task) = tasks.iter().find(|i| i.state == TaskState::Running) {
                return task.task_id;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // A reclaim whose waiter gives up, then another.
    let (given_up, _) = tokio::sync::oneshot::channel();
    actor
        .cast(ConversationMsg::ReclaimSlot {
            task_id: task_a,
            granted: given_up,
        })
        .unwrap();
    let (granted, answer) = tokio::sync::oneshot::channel();
    actor
        .cast(ConversationMsg::ReclaimSlot {
            task_id: task_a,
            granted,
        })
        .unwrap();
    t.session.cancel_task(task_b).await.unwrap();
    let answer = ends(answer).await;
    assert!(matches!(answer, Ok(Ok(()))), "{answer:?}");
    t.stop().await;
}
