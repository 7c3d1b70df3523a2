//! Approvals through a conversation (S9): the shell built-in asks, a human answers through
//! the session, a denial comes back to the model as an observation and an `approval_denied`
//! error event, a timeout denies, and a session-wide approval is shared.

use std::time::Duration;
use troupe_proto::{
    AgentError, ApprovalDecision, EventKind, OpenConversation, SandboxPolicy, TaskStatus,
};
use troupe_runtime::ScriptedReply;
use troupe_tests::TestSession;

fn echo_call(word: &str) -> ScriptedReply {
    ScriptedReply::tool("shell", serde_json::json!({"command": ["echo", word]}))
}

async fn start(replies: Vec<ScriptedReply>, timeout: Duration) -> TestSession {
    TestSession::start_with(
        replies,
        |c| {
            c.conversation.sandbox_policy = SandboxPolicy::FullAccess;
            c.approval_timeout = timeout;
        },
        None,
    )
    .await
}

async fn next_pending(t: &TestSession) -> troupe_proto::PendingApproval {
    loop {
        if let Some(p) = t
            .session
            .pending_approvals()
            .await
            .unwrap()
            .into_iter()
            .next()
        {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn approved_once_runs_and_asks_again_next_time() {
    let t = start(
        vec![
            echo_call("one"),
            ScriptedReply::text("done one"),
            echo_call("one"),
            ScriptedReply::text("done two"),
        ],
        Duration::from_secs(60),
    )
    .await;
    let root = t.root().await;
    for round in 0..2 {
        let s = t.session.clone();
        let task = tokio::spawn(async move { s.message(root, "run it").await });
        let p = next_pending(&t).await;
        assert_eq!(p.command, vec!["echo", "one"]);
        assert_eq!(p.conversation_id, root);
        t.session
            .respond_approval(p.approval_id, ApprovalDecision::ApproveOnce)
            .await
            .unwrap();
        let reply = task.await.unwrap().unwrap();
        assert_eq!(reply.status, TaskStatus::Ok, "round {round}");
        assert_eq!(reply.stats.tool_calls, 1);
    }
    t.stop().await;
}

/// A task waiting for a human gives its slot back: with one slot for the whole session,
/// another conversation's message runs to its end while the first task waits for approval,
/// and the first goes on (its slot asked for again) once approved.
#[tokio::test]
async fn a_task_waiting_for_approval_does_not_hold_the_sessions_slot() {
    let t = start(
        vec![
            echo_call("first"),
            ScriptedReply::text("other done"),
            ScriptedReply::text("first done"),
        ],
        Duration::from_secs(60),
    )
    .await;
    let root = t.root().await;
    let other = t.session.open(OpenConversation::default()).await.unwrap();
    let s = t.session.clone();
    let first = tokio::spawn(async move { s.message(root, "run it").await });
    let p = next_pending(&t).await;
    assert_eq!(p.conversation_id, root);
    // A bound on a hang, not a speed check: holding the slot, this never finishes.
    let reply = tokio::time::timeout(Duration::from_secs(30), t.session.message(other, "hi"))
        .await
        .expect("the other conversation runs while the first task waits for a human")
        .unwrap();
    assert_eq!(reply.status, TaskStatus::Ok);
    assert_eq!(reply.text, "other done");
    t.session
        .respond_approval(p.approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    let reply = first.await.unwrap().unwrap();
    assert_eq!(reply.status, TaskStatus::Ok);
    assert_eq!(reply.text, "first done");
    assert_eq!(reply.stats.tool_calls, 1);
    t.stop().await;
}

#[tokio::test]
async fn denial_is_an_observation_and_an_event() {
    let t = start(
        vec![echo_call("nope"), ScriptedReply::default()],
        Duration::from_secs(60),
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let root = t.root().await;
    let s = t.session.clone();
    let task = tokio::spawn(async move { s.message(root, "try").await });
    let p = next_pending(&t).await;
    t.session
        .respond_approval(
            p.approval_id,
            ApprovalDecision::Deny {
                reason: Some("not today".into()),
            },
        )
        .await
        .unwrap();
    let reply = task.await.unwrap().unwrap();
    assert_eq!(reply.status, TaskStatus::Ok);
    // The scripted model's rule answer quotes the observation it was given.
    assert!(reply.text.contains("approval denied"), "{}", reply.text);
    assert!(reply.text.contains("not today"));
    let mut denied_event = false;
    let mut resolved = false;
    // Events are published once committed: a flush is the barrier.
    t.session.flush().await.unwrap();
    while let Ok(e) = events.try_recv() {
        match &e.event {
            EventKind::Error {
                error: AgentError::ApprovalDenied { command, .. },
            } => {
                assert_eq!(command, &vec!["echo".to_owned(), "nope".to_owned()]);
                denied_event = true;
            }
            EventKind::ApprovalResolved { .. } => resolved = true,
            _ => {}
        }
    }
    assert!(denied_event && resolved);
    t.stop().await;
}

#[tokio::test(start_paused = true)]
async fn nobody_answers_so_it_is_denied() {
    let t = start(
        vec![echo_call("late"), ScriptedReply::default()],
        Duration::from_secs(30),
    )
    .await;
    let root = t.root().await;
    let reply = t.session.message(root, "try").await.unwrap();
    assert!(reply.text.contains("timed out"), "{}", reply.text);
    assert!(t.session.pending_approvals().await.unwrap().is_empty());
    t.stop().await;
}

#[tokio::test]
async fn session_wide_approval_is_shared_and_conversation_scope_is_not() {
    let t = start(
        vec![
            echo_call("shared"),
            ScriptedReply::text("a1"),
            echo_call("shared"),
            ScriptedReply::text("b1"),
            echo_call("mine"),
            ScriptedReply::text("a2"),
            echo_call("mine"),
            ScriptedReply::text("b2"),
        ],
        Duration::from_secs(60),
    )
    .await;
    let a = t.session.open(OpenConversation::default()).await.unwrap();
    let b = t.session.open(OpenConversation::default()).await.unwrap();
    // a: approve "echo shared" for the whole session.
    let s = t.session.clone();
    let task = tokio::spawn(async move { s.message(a, "x").await });
    let p = next_pending(&t).await;
    t.session
        .respond_approval(
            p.approval_id,
            ApprovalDecision::ApproveForSession { ttl_secs: None },
        )
        .await
        .unwrap();
    assert_eq!(task.await.unwrap().unwrap().text, "a1");
    // b: the same command runs without asking.
    assert_eq!(t.session.message(b, "x").await.unwrap().text, "b1");
    // a: approve "echo mine" for conversation a only.
    let s = t.session.clone();
    let task = tokio::spawn(async move { s.message(a, "y").await });
    let p = next_pending(&t).await;
    t.session
        .respond_approval(
            p.approval_id,
            ApprovalDecision::ApproveForConversation {
                ttl_secs: Some(600),
            },
        )
        .await
        .unwrap();
    assert_eq!(task.await.unwrap().unwrap().text, "a2");
    // b must ask again.
    let s = t.session.clone();
    let task = tokio::spawn(async move { s.message(b, "y").await });
    let p = next_pending(&t).await;
    assert_eq!(p.conversation_id, b);
    t.session
        .respond_approval(p.approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    assert_eq!(task.await.unwrap().unwrap().text, "b2");
    t.stop().await;
}

#[tokio::test]
async fn a_sandbox_that_cannot_be_enforced_is_refused() {
    // A runner without the sandbox launcher cannot confine a command: it refuses.
    let t = TestSession::start_with_runner(
        vec![echo_call("hi"), ScriptedReply::default()],
        |c| {
            c.conversation.sandbox_policy = SandboxPolicy::ReadOnly;
            c.conversation.approval_policy = troupe_proto::ApprovalPolicy::Never;
        },
        None,
        std::sync::Arc::new(troupe_runtime::ProcessRunner::new()),
    )
    .await;
    let root = t.root().await;
    let reply = t.session.message(root, "run").await.unwrap();
    assert!(reply.text.contains("sandbox"), "{}", reply.text);
    t.stop().await;
}
