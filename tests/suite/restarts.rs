//! Service actors that fail while a task runs (O2 with S3, S4, S9, S10): the Session replaces
//! each one and the running task keeps every promise. Single-flight holds across a Scheduler
//! restart; the task stays listed and cancellable across a TaskRegistry restart; an approval
//! pending across an ApprovalStore restart is asked again, and a later one goes to the new
//! store; the task's later events reach the new Rollout with `seq` unbroken and its policy
//! known. (The McpPool's restart under a running task is in `mcp_servers`, against a real
//! server.) Each test makes the service fail through its `InjectPanic` message.

use std::future::Future;
use std::time::Duration;
use troupe_actors::approval_store::ApprovalMsg;
use troupe_actors::rollout::{RecordLevel, RolloutMsg};
use troupe_actors::scheduler::{SchedulerMsg, SchedulerSnapshot};
use troupe_actors::task_registry::TaskRegistryMsg;
use troupe_proto::EventName;
use troupe_proto::{
    AgentError, ApprovalDecision, ConversationId, EventKind, MessageReply, OpenConversation,
    PendingApproval, SandboxPolicy, TaskState, TaskStatus,
};
use troupe_runtime::ScriptedReply;
use troupe_tests::TestSession;

/// Longer than any test: nothing here may time out on its own.
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// Polls `probe` until it answers, within a bound of real time (the clock is paused).
async fn until<T, F: Future<Output = Option<T>>>(what: &str, mut probe: impl FnMut() -> F) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::task::yield_now().await;
    }
}

fn message(
    t: &TestSession,
    conversation_id: ConversationId,
    text: &str,
) -> tokio::task::JoinHandle<Result<MessageReply, AgentError>> {
    let (session, text) = (t.session.clone(), text.to_owned());
    tokio::spawn(async move { session.message(conversation_id, text).await })
}

async fn scheduler_snapshot(
    scheduler: &ractor::ActorRef<SchedulerMsg>,
) -> Option<SchedulerSnapshot> {
    ractor::call!(scheduler, |reply| SchedulerMsg::Snapshot { reply }).ok()
}

async fn pending(t: &TestSession) -> Vec<PendingApproval> {
    t.session.pending_approvals().await.unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn single_flight_holds_across_a_scheduler_restart() {
    let t = TestSession::start(vec![
        ScriptedReply::hang(true),
        ScriptedReply::text("second done"),
        ScriptedReply::text("third done"),
    ])
    .await;
    let a = t.root().await;
    let b = t.session.open(OpenConversation::default()).await.unwrap();
    let c = t.session.open(OpenConversation::default()).await.unwrap();
    let first = message(&t, a, "long");
    until("the first task calls the model", || async {
        (t.model.calls() == 1).then_some(())
    })
    .await;
    let second = message(&t, b, "short");
    let old = t.session.services().await.unwrap().scheduler;
    let (running, waiting) = until("the second task waits", || async {
        let snap = scheduler_snapshot(&old).await?;
        (snap.running.len() == 1 && snap.waiting.len() == 1)
            .then(|| (snap.running[0], snap.waiting[0]))
    })
    .await;

    old.cast(SchedulerMsg::InjectPanic).unwrap();
    let new = until("a new scheduler", || async {
        let now = t.session.services().await.ok()?.scheduler;
        (now.get_id() != old.get_id()).then_some(now)
    })
    .await;
    // The running task re-declared its grant; the waiting one asked again and still waits.
    let snap = until("the holders answered the new scheduler", || async {
        let snap = scheduler_snapshot(&new).await?;
        (snap.recovering == 0 && !snap.running.is_empty() && !snap.waiting.is_empty())
            .then_some(snap)
    })
    .await;
    assert_eq!((snap.running, snap.waiting), (vec![running], vec![waiting]));
    // A task asked for after the restart waits too.
    let third = message(&t, c, "after");
    until("the third task waits", || async {
        (scheduler_snapshot(&new).await?.waiting.len() == 2).then_some(())
    })
    .await;
    // However long the first runs, nothing starts beside it.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(t.model.calls(), 1);
    assert!(!second.is_finished() && !third.is_finished());
    assert_eq!(
        scheduler_snapshot(&new).await.unwrap().running,
        vec![running]
    );

    t.session.cancel_task(running).await.unwrap();
    assert_eq!(first.await.unwrap().unwrap().status, TaskStatus::Cancelled);
    let second = second.await.unwrap().unwrap();
    assert_eq!(
        (second.status, second.text.as_str()),
        (TaskStatus::Ok, "second done")
    );
    assert_eq!(second.task_id, waiting);
    let third = third.await.unwrap().unwrap();
    assert_eq!(
        (third.status, third.text.as_str()),
        (TaskStatus::Ok, "third done")
    );
    assert_eq!(t.model.calls(), 3);
    // The slot went back to the new scheduler: nothing is left held.
    let snap = until("every slot given back", || async {
        let snap = scheduler_snapshot(&new).await?;
        snap.running.is_empty().then_some(snap)
    })
    .await;
    assert!(snap.waiting.is_empty());
    t.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_running_task_stays_listed_and_cancellable_across_a_registry_restart() {
    let t = TestSession::start(vec![ScriptedReply::hang(true)]).await;
    let root = t.root().await;
    let task = message(&t, root, "long");
    let before = until("the task runs", || async {
        t.session
            .tasks(None)
            .await
            .ok()?
            .into_iter()
            .find(|i| i.state == TaskState::Running)
    })
    .await;

    let old = t.session.services().await.unwrap().registry;
    old.cast(TaskRegistryMsg::InjectPanic).unwrap();
    until("a new registry", || async {
        let now = t.session.services().await.ok()?.registry;
        (now.get_id() != old.get_id()).then_some(())
    })
    .await;
    // Listed again as it was: same start time, same state.
    let after = until("the task is registered again", || async {
        t.session.tasks(None).await.ok()?.pop()
    })
    .await;
    assert_eq!(after, before);

    let cancelled = t.session.cancel_task(before.task_id).await.unwrap();
    assert_eq!(cancelled.state, TaskState::Cancelling);
    assert_eq!(task.await.unwrap().unwrap().status, TaskStatus::Cancelled);
    until("the task is deregistered", || async {
        t.session.tasks(None).await.ok()?.is_empty().then_some(())
    })
    .await;
    assert!(matches!(
        t.session.cancel_task(before.task_id).await,
        Err(AgentError::NotFound { .. })
    ));
    t.stop().await;
}

fn add_file(name: &str) -> ScriptedReply {
    let patch = format!("*** Begin Patch\n*** Add File: {name}\n+{name}\n*** End Patch\n");
    ScriptedReply::tool("apply_patch", serde_json::json!({ "input": patch }))
}

/// A session whose conversations may patch `workspace` once a human approves.
async fn patching(replies: Vec<ScriptedReply>, workspace: &std::path::Path) -> TestSession {
    let workspace = workspace.to_path_buf();
    TestSession::start_with(
        replies,
        move |c| {
            c.conversation.sandbox_policy = SandboxPolicy::WorkspaceWrite;
            c.conversation.workspace_roots = vec![workspace];
            c.approval_timeout = NEVER;
        },
        None,
    )
    .await
}

fn with_patch_tool() -> OpenConversation {
    OpenConversation {
        include_apply_patch_tool: true,
        ..OpenConversation::default()
    }
}

#[tokio::test(start_paused = true)]
async fn approvals_are_asked_of_the_store_that_replaced_a_failed_one() {
    let ws = tempfile::tempdir().unwrap();
    let t = patching(
        vec![
            add_file("one.txt"),
            add_file("two.txt"),
            ScriptedReply::text("patched"),
        ],
        ws.path(),
    )
    .await;
    let c = t.session.open(with_patch_tool()).await.unwrap();
    let task = message(&t, c, "patch twice");
    let first = until("the first approval is asked", || async {
        pending(&t).await.pop()
    })
    .await;
    assert_eq!(first.command, ["apply_patch", "add one.txt"]);

    let old = t.session.services().await.unwrap().approvals;
    old.cast(ApprovalMsg::InjectPanic).unwrap();
    until("a new approval store", || async {
        let now = t.session.services().await.ok()?.approvals;
        (now.get_id() != old.get_id()).then_some(())
    })
    .await;
    // Pending across the restart: asked again of the new store, not denied.
    let again = until("the approval is asked again", || async {
        pending(&t).await.pop()
    })
    .await;
    assert_ne!(again.approval_id, first.approval_id);
    assert_eq!(
        (&again.command, again.task_id, again.conversation_id),
        (&first.command, first.task_id, c)
    );
    assert!(matches!(
        t.session
            .respond_approval(first.approval_id, ApprovalDecision::ApproveOnce)
            .await,
        Err(AgentError::NotFound { .. })
    ));
    t.session
        .respond_approval(again.approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    // Asked after the restart: the new store has it.
    let second = until("the second approval is asked", || async {
        pending(&t)
            .await
            .into_iter()
            .find(|p| p.command == ["apply_patch", "add two.txt"])
    })
    .await;
    t.session
        .respond_approval(second.approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();

    let reply = task.await.unwrap().unwrap();
    assert_eq!(
        (reply.status, reply.text.as_str(), reply.stats.tool_calls),
        (TaskStatus::Ok, "patched", 2)
    );
    for name in ["one.txt", "two.txt"] {
        assert_eq!(
            std::fs::read_to_string(ws.path().join(name)).unwrap(),
            format!("{name}\n")
        );
    }
    t.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_running_task_records_on_the_rollout_that_replaced_a_failed_one() {
    let ws = tempfile::tempdir().unwrap();
    let t = patching(
        vec![add_file("after.txt"), ScriptedReply::text("recorded")],
        ws.path(),
    )
    .await;
    let c = t.session.open(with_patch_tool()).await.unwrap();
    let task = message(&t, c, "patch");
    let asked = until("the task waits for its approval", || async {
        pending(&t).await.pop()
    })
    .await;
    t.session.flush().await.unwrap();
    let old = t.session.services().await.unwrap().rollout;
    let last_before = ractor::call!(old, |reply| RolloutMsg::LastSeq { reply }).unwrap();

    old.cast(RolloutMsg::InjectPanic).unwrap();
    until("a new rollout", || async {
        let now = t.session.services().await.ok()?.rollout;
        (now.get_id() != old.get_id()).then_some(())
    })
    .await;
    t.session
        .respond_approval(asked.approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    let reply = task.await.unwrap().unwrap();
    assert_eq!(reply.status, TaskStatus::Ok);
    t.session.flush().await.unwrap();

    // Every number from 1 is recorded once, in order: no gap where the old rollout stopped.
    let records = t.session.events_after(0, 100_000).await.unwrap();
    let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected);
    // The task's later events are there, after the restart, recorded under its policy (Full)
    // by a rollout that never saw the conversation open.
    let later: Vec<_> = records
        .iter()
        .filter(|r| r.seq > last_before && r.task_id == asked.task_id)
        .collect();
    let kinds: Vec<&str> = later.iter().map(|r| r.kind.as_str()).collect();
    for kind in [
        "approval_resolved",
        "tool_call_finished",
        "assistant_message",
        "task_finished",
    ] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    let finished = later
        .iter()
        .find(|r| r.kind == EventName::ToolCallFinished)
        .unwrap();
    assert_eq!(finished.level, RecordLevel::Full);
    assert!(matches!(
        finished.event,
        Some(EventKind::ToolCallFinished {
            is_error: false,
            ..
        })
    ));
    assert_eq!(later.last().unwrap().kind, EventName::TaskFinished);
    t.stop().await;
}
