//! The shell tool and its fellow built-ins through a real session (S9, C1, C2): the scripted
//! model asks for calls, commands run as real processes through the `troupe sandbox-exec`
//! launcher (Landlock), approvals are answered through the session, and the plan and
//! apply_patch built-ins follow the conversation's tool preferences.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use troupe_proto::WarningCode;
use troupe_proto::{
    AgentError, ApprovalDecision, ApprovalId, ApprovalPolicy, ConversationId, EventEnvelope,
    EventKind, OpenConversation, PlanStep, PlanStepStatus, SandboxPolicy, TaskStatus,
};
use troupe_runtime::ScriptedReply;
use troupe_tests::{RecordingModel, TestSession, start_with_model, troupe_bin};

type Events = broadcast::Receiver<Arc<EventEnvelope>>;

/// A session whose commands run in `workspace` under these policies. The sandbox launcher
/// is the `troupe` binary built next to the tests (`troupe_bin` insists it is there).
async fn start(
    replies: Vec<ScriptedReply>,
    approval: ApprovalPolicy,
    sandbox: SandboxPolicy,
    workspace: &Path,
) -> TestSession {
    let _ = troupe_bin();
    let workspace = workspace.to_path_buf();
    TestSession::start_with(
        replies,
        move |c| {
            c.conversation.approval_policy = approval;
            c.conversation.sandbox_policy = sandbox;
            c.conversation.workspace_roots = vec![workspace];
            c.approval_timeout = Duration::from_secs(300);
        },
        None,
    )
    .await
}

fn sh(script: &str) -> ScriptedReply {
    ScriptedReply::tool(
        "shell",
        serde_json::json!({"command": ["sh", "-c", script]}),
    )
}

fn sh_argv(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

/// The next event `pick` accepts. Bounded by a guard so a missing event fails the test
/// instead of hanging it (time is never paused while this waits).
async fn wait_for<T>(events: &mut Events, mut pick: impl FnMut(&EventEnvelope) -> Option<T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match events.recv().await {
                Ok(e) => {
                    if let Some(found) = pick(&e) {
                        return found;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("event stream closed"),
            }
        }
    })
    .await
    .expect("the expected event within 30 s")
}

async fn next_approval(events: &mut Events) -> (ApprovalId, Vec<String>) {
    wait_for(events, |e| match &e.event {
        EventKind::ApprovalRequested {
            approval_id,
            command,
            ..
        } => Some((*approval_id, command.clone())),
        _ => None,
    })
    .await
}

/// Every event published so far (the flush is a barrier through the rollout).
async fn drain(t: &TestSession, events: &mut Events) -> Vec<EventKind> {
    t.session.flush().await.unwrap();
    let mut out = Vec::new();
    while let Ok(e) = events.try_recv() {
        out.push(e.event.clone());
    }
    out
}

/// Sends a message that must complete without asking anyone (bounded by a guard).
async fn message_unasked(
    t: &TestSession,
    c: ConversationId,
    text: &str,
) -> troupe_proto::MessageReply {
    tokio::time::timeout(Duration::from_secs(30), t.session.message(c, text))
        .await
        .expect("answered without waiting for an approval")
        .unwrap()
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

#[tokio::test]
async fn approval_is_asked_listed_and_granted_once() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log.txt");
    let t = start(
        vec![
            sh("echo ran >> log.txt"),
            ScriptedReply::default(),
            sh("echo ran >> log.txt"),
            ScriptedReply::default(),
        ],
        ApprovalPolicy::Always,
        SandboxPolicy::WorkspaceWrite,
        ws.path(),
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let root = t.root().await;
    for round in 1..=2 {
        let s = t.session.clone();
        let task = tokio::spawn(async move { s.message(root, "log it").await });
        let (approval_id, command) = next_approval(&mut events).await;
        assert_eq!(command, sh_argv("echo ran >> log.txt"));
        let pending = t.session.pending_approvals().await.unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].approval_id, approval_id);
        assert_eq!(pending[0].conversation_id, root);
        assert_eq!(lines(&log), round - 1, "nothing ran before the answer");
        t.session
            .respond_approval(approval_id, ApprovalDecision::ApproveOnce)
            .await
            .unwrap();
        let reply = task.await.unwrap().unwrap();
        assert_eq!(reply.status, TaskStatus::Ok);
        assert!(reply.text.contains("exit code 0"), "{}", reply.text);
        assert_eq!(lines(&log), round, "ran exactly once in round {round}");
    }
    t.stop().await;
}

/// A command whose call names a directory is asked about with that directory (shown in
/// the request and its reason) and an approval for the conversation of the command where it
/// runs by default does not cover it there.
#[tokio::test]
async fn a_command_in_another_directory_is_asked_again_and_shows_where() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join("sub")).unwrap();
    let log = |dir: &str| {
        ScriptedReply::tool(
            "shell",
            serde_json::json!({"command": ["sh", "-c", "echo ran >> log.txt"], "workdir": dir}),
        )
    };
    let t = start(
        vec![
            sh("echo ran >> log.txt"),
            ScriptedReply::default(),
            log("sub"),
            ScriptedReply::default(),
        ],
        ApprovalPolicy::Always,
        SandboxPolicy::WorkspaceWrite,
        ws.path(),
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let root = t.root().await;
    let s = t.session.clone();
    let first = tokio::spawn(async move { s.message(root, "here").await });
    let (approval_id, _) = next_approval(&mut events).await;
    let pending = t.session.pending_approvals().await.unwrap();
    assert_eq!(pending[0].workdir, None, "{pending:?}");
    t.session
        .respond_approval(
            approval_id,
            ApprovalDecision::ApproveForConversation { ttl_secs: None },
        )
        .await
        .unwrap();
    assert_eq!(first.await.unwrap().unwrap().status, TaskStatus::Ok);
    // The same command in `sub`: asked again, saying where.
    let s = t.session.clone();
    let second = tokio::spawn(async move { s.message(root, "there").await });
    let (approval_id, command) = next_approval(&mut events).await;
    assert_eq!(command, sh_argv("echo ran >> log.txt"));
    let pending = t.session.pending_approvals().await.unwrap();
    let sub = ws.path().join("sub").display().to_string();
    assert_eq!(
        pending[0].workdir.as_deref(),
        Some(sub.as_str()),
        "{pending:?}"
    );
    assert!(
        pending[0].reason.contains(&format!("(in {sub})")),
        "{}",
        pending[0].reason
    );
    assert_eq!(
        lines(&ws.path().join("sub/log.txt")),
        0,
        "nothing ran before the answer"
    );
    t.session
        .respond_approval(approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    assert_eq!(second.await.unwrap().unwrap().status, TaskStatus::Ok);
    assert_eq!(lines(&ws.path().join("sub/log.txt")), 1);
    t.stop().await;
}

#[tokio::test]
async fn a_conversation_approval_holds_until_its_ttl_expires() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log.txt");
    let append = || sh("echo ran >> log.txt");
    let t = start(
        vec![
            append(),
            ScriptedReply::text("first"),
            append(),
            ScriptedReply::text("second"),
            append(),
            ScriptedReply::text("third"),
        ],
        ApprovalPolicy::Always,
        SandboxPolicy::WorkspaceWrite,
        ws.path(),
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let root = t.root().await;

    let s = t.session.clone();
    let task = tokio::spawn(async move { s.message(root, "one").await });
    let (approval_id, _) = next_approval(&mut events).await;
    t.session
        .respond_approval(
            approval_id,
            ApprovalDecision::ApproveForConversation { ttl_secs: Some(60) },
        )
        .await
        .unwrap();
    assert_eq!(task.await.unwrap().unwrap().text, "first");

    // Within the TTL: runs without asking.
    drain(&t, &mut events).await;
    assert_eq!(message_unasked(&t, root, "two").await.text, "second");
    assert_eq!(lines(&log), 2);
    let asked = drain(&t, &mut events)
        .await
        .into_iter()
        .any(|e| matches!(e, EventKind::ApprovalRequested { .. }));
    assert!(!asked, "asked again within the TTL");

    // Past the TTL (the session's clock follows tokio's; no process runs meanwhile).
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(61)).await;
    tokio::time::resume();
    let s = t.session.clone();
    let task = tokio::spawn(async move { s.message(root, "three").await });
    let (approval_id, command) = next_approval(&mut events).await;
    assert_eq!(command, sh_argv("echo ran >> log.txt"));
    assert_eq!(lines(&log), 2, "the expired approval did not let it run");
    t.session
        .respond_approval(approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    assert_eq!(task.await.unwrap().unwrap().text, "third");
    assert_eq!(lines(&log), 3);
    t.stop().await;
}

#[tokio::test]
async fn a_denial_reaches_the_model_and_the_task_goes_on() {
    let ws = tempfile::tempdir().unwrap();
    let t = start(
        vec![sh("echo x > denied.txt"), ScriptedReply::default()],
        ApprovalPolicy::Always,
        SandboxPolicy::WorkspaceWrite,
        ws.path(),
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let root = t.root().await;
    let s = t.session.clone();
    let task = tokio::spawn(async move { s.message(root, "write it").await });
    let (approval_id, _) = next_approval(&mut events).await;
    t.session
        .respond_approval(
            approval_id,
            ApprovalDecision::Deny {
                reason: Some("not in prod".into()),
            },
        )
        .await
        .unwrap();
    let reply = task.await.unwrap().unwrap();
    // The model was called again with the denial as its observation, and answered.
    assert_eq!(reply.status, TaskStatus::Ok);
    assert_eq!(t.model.calls(), 2);
    assert!(reply.text.contains("approval denied"), "{}", reply.text);
    assert!(reply.text.contains("not in prod"), "{}", reply.text);
    assert!(!ws.path().join("denied.txt").exists());
    let seen = drain(&t, &mut events).await;
    assert!(seen.iter().any(|e| matches!(
        e,
        EventKind::Error { error: AgentError::ApprovalDenied { command, .. } }
            if *command == sh_argv("echo x > denied.txt")
    )));
    assert!(seen.iter().any(|e| matches!(
        e,
        EventKind::ApprovalResolved {
            approval_id: id,
            decision: ApprovalDecision::Deny { .. }
        } if *id == approval_id
    )));
    t.stop().await;
}

/// A command the sandbox stopped is not run again by a retry policy: the same call would be
/// stopped again. The model sees what it printed and that the sandbox stopped it.
#[tokio::test]
async fn a_retry_policy_does_not_run_again_what_the_sandbox_stopped() {
    let ws = tempfile::tempdir().unwrap();
    let _ = troupe_bin();
    let workspace = ws.path().to_path_buf();
    let t = TestSession::start_with(
        vec![sh("echo x > written.txt"), ScriptedReply::default()],
        move |c| {
            c.conversation.approval_policy = ApprovalPolicy::Never;
            c.conversation.sandbox_policy = SandboxPolicy::ReadOnly;
            c.conversation.workspace_roots = vec![workspace];
            c.conversation.task.tool_errors = troupe_proto::ToolErrorPolicy::Retry { attempts: 2 };
        },
        None,
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let root = t.root().await;
    let reply = message_unasked(&t, root, "write").await;
    assert!(reply.text.contains("Permission denied"), "{}", reply.text);
    assert!(
        reply
            .text
            .contains("the read-only sandbox stopped the command"),
        "{}",
        reply.text
    );
    let runs = drain(&t, &mut events)
        .await
        .into_iter()
        .filter(|e| matches!(e, EventKind::ToolCallFinished { name, .. } if name == "shell"))
        .count();
    assert_eq!(runs, 1, "run once, not retried");
    assert!(!ws.path().join("written.txt").exists());
    t.stop().await;
}

#[tokio::test]
async fn read_only_refuses_a_write_and_allows_a_read() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("readme.txt"), "readable\n").unwrap();
    let t = start(
        vec![
            sh("echo x > written.txt"),
            ScriptedReply::default(),
            sh("cat readme.txt"),
            ScriptedReply::default(),
        ],
        ApprovalPolicy::Never,
        SandboxPolicy::ReadOnly,
        ws.path(),
    )
    .await;
    let root = t.root().await;
    let write = message_unasked(&t, root, "write").await;
    assert!(write.text.contains("Permission denied"), "{}", write.text);
    assert!(!write.text.contains("exit code 0"), "{}", write.text);
    assert!(!ws.path().join("written.txt").exists());
    let read = message_unasked(&t, root, "read").await;
    assert!(
        read.text.contains("exit code 0") && read.text.contains("readable"),
        "{}",
        read.text
    );
    t.stop().await;
}

#[tokio::test]
async fn workspace_write_writes_inside_the_workspace_only() {
    let ws = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let escape: PathBuf = outside.path().join("escape.txt");
    let t = start(
        vec![
            sh("mkdir -p sub && echo in > sub/inside.txt"),
            ScriptedReply::default(),
            sh(&format!("echo out > {}", escape.display())),
            ScriptedReply::default(),
            sh("echo t > \"$TMPDIR/scratch\" && cat \"$TMPDIR/scratch\""),
            ScriptedReply::default(),
        ],
        ApprovalPolicy::Never,
        SandboxPolicy::WorkspaceWrite,
        ws.path(),
    )
    .await;
    let root = t.root().await;
    let inside = message_unasked(&t, root, "inside").await;
    assert!(inside.text.contains("exit code 0"), "{}", inside.text);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("sub/inside.txt")).unwrap(),
        "in\n"
    );
    let out = message_unasked(&t, root, "outside").await;
    assert!(out.text.contains("Permission denied"), "{}", out.text);
    assert!(!escape.exists());
    // The command's private temp dir is writable too.
    let tmp = message_unasked(&t, root, "tmp").await;
    assert!(tmp.text.contains("exit code 0"), "{}", tmp.text);
    t.stop().await;
}

/// A confined command is isolated from what runs outside its sandbox (where the kernel can,
/// Landlock ABI 6): it reaches no TCP listener (troupe's own API among them) and signals no
/// process outside it; under `full-access` it does both.
#[tokio::test]
async fn a_confined_command_reaches_no_tcp_port_and_signals_no_outside_process() {
    let ws = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut outside = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let connect = format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('connected')\""
    );
    let signal = format!("kill -0 {} && echo signalled", outside.id());
    let replies = |n| {
        let mut r = Vec::new();
        for _ in 0..n {
            r.extend([
                sh(&connect),
                ScriptedReply::default(),
                sh(&signal),
                ScriptedReply::default(),
            ]);
        }
        r
    };
    for (sandbox, allowed) in [
        (SandboxPolicy::WorkspaceWrite, false),
        (SandboxPolicy::ReadOnly, false),
        (SandboxPolicy::FullAccess, true),
    ] {
        let t = start(replies(1), ApprovalPolicy::Never, sandbox, ws.path()).await;
        let root = t.root().await;
        let connected = message_unasked(&t, root, "connect").await;
        assert_eq!(
            connected.text.contains("connected"),
            allowed,
            "{sandbox:?}: {}",
            connected.text
        );
        let signalled = message_unasked(&t, root, "signal").await;
        assert_eq!(
            signalled.text.contains("signalled"),
            allowed,
            "{sandbox:?}: {}",
            signalled.text
        );
        t.stop().await;
    }
    outside.kill().unwrap();
    outside.wait().unwrap();
    drop(listener);
}

#[tokio::test]
async fn a_wider_conversation_policy_is_clamped_reported_and_used() {
    let ws = tempfile::tempdir().unwrap();
    let t = start(
        vec![sh("echo x > wide.txt"), ScriptedReply::default()],
        ApprovalPolicy::Always,
        SandboxPolicy::ReadOnly,
        ws.path(),
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let c = t
        .session
        .open(OpenConversation {
            approval_policy: Some(ApprovalPolicy::Never),
            sandbox_policy: Some(SandboxPolicy::FullAccess),
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    let message = wait_for(&mut events, |e| match &e.event {
        EventKind::Warning { code, message }
            if *code == WarningCode::PolicyClamped && e.conversation_id == Some(c) =>
        {
            Some(message.clone())
        }
        _ => None,
    })
    .await;
    assert!(
        message.contains("FullAccess") && message.contains("using ReadOnly"),
        "{message}"
    );
    // Approval is clamped to `always`: the command waits for a human.
    let s = t.session.clone();
    let task = tokio::spawn(async move { s.message(c, "write").await });
    let (approval_id, _) = next_approval(&mut events).await;
    t.session
        .respond_approval(approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    // Sandbox is clamped to `read-only`: the approved write still cannot happen.
    let reply = task.await.unwrap().unwrap();
    assert!(reply.text.contains("Permission denied"), "{}", reply.text);
    assert!(!ws.path().join("wide.txt").exists());
    t.stop().await;
}

#[tokio::test]
async fn a_narrower_conversation_policy_is_used_without_a_warning() {
    let ws = tempfile::tempdir().unwrap();
    let t = start(
        vec![sh("echo x > narrow.txt"), ScriptedReply::default()],
        ApprovalPolicy::Never,
        SandboxPolicy::WorkspaceWrite,
        ws.path(),
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let c = t
        .session
        .open(OpenConversation {
            sandbox_policy: Some(SandboxPolicy::ReadOnly),
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    let clamped = drain(&t, &mut events).await.into_iter().any(
        |e| matches!(e, EventKind::Warning { code, .. } if code == WarningCode::PolicyClamped),
    );
    assert!(!clamped);
    let reply = message_unasked(&t, c, "write").await;
    assert!(reply.text.contains("Permission denied"), "{}", reply.text);
    assert!(!ws.path().join("narrow.txt").exists());
    t.stop().await;
}

#[tokio::test]
async fn update_plan_records_the_plan_as_an_event() {
    let ws = tempfile::tempdir().unwrap();
    let plan = serde_json::json!({
        "explanation": "first look around",
        "plan": [
            {"step": "read the code", "status": "completed"},
            {"step": "write the fix", "status": "in_progress"},
            {"step": "run the tests", "status": "pending"},
        ]
    });
    let t = start(
        vec![
            ScriptedReply::tool("update_plan", plan.clone()),
            ScriptedReply::default(),
            ScriptedReply::tool("update_plan", plan),
            ScriptedReply::default(),
        ],
        ApprovalPolicy::Always,
        SandboxPolicy::ReadOnly,
        ws.path(),
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let with_plan = t
        .session
        .open(OpenConversation {
            include_plan_tool: true,
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    let reply = message_unasked(&t, with_plan, "plan it").await;
    assert!(
        reply.text.contains("plan updated: 3 steps"),
        "{}",
        reply.text
    );
    let recorded = wait_for(&mut events, |e| match &e.event {
        EventKind::PlanUpdated { explanation, plan } => Some((explanation.clone(), plan.clone())),
        _ => None,
    })
    .await;
    assert_eq!(recorded.0.as_deref(), Some("first look around"));
    assert_eq!(
        recorded.1[1],
        PlanStep {
            step: "write the fix".into(),
            status: PlanStepStatus::InProgress
        }
    );
    // Without the preference the tool is not offered, and a call to it is refused.
    let root = t.root().await;
    let reply = message_unasked(&t, root, "plan it").await;
    assert!(reply.text.contains("unknown tool"), "{}", reply.text);
    let again = drain(&t, &mut events)
        .await
        .into_iter()
        .any(|e| matches!(e, EventKind::PlanUpdated { .. }));
    assert!(!again);
    t.stop().await;
}

const PATCH: &str = "*** Begin Patch
*** Add File: new/hello.txt
+hello
*** Update File: notes.txt
@@
 alpha
-beta
+gamma
*** End Patch
";

fn apply_patch(input: &str) -> ScriptedReply {
    ScriptedReply::tool("apply_patch", serde_json::json!({ "input": input }))
}

fn with_patch_tool() -> OpenConversation {
    OpenConversation {
        include_apply_patch_tool: true,
        ..OpenConversation::default()
    }
}

#[tokio::test]
async fn apply_patch_edits_the_workspace_once_approved() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("notes.txt"), "alpha\nbeta\n").unwrap();
    let t = start(
        vec![apply_patch(PATCH), ScriptedReply::default()],
        ApprovalPolicy::Always,
        SandboxPolicy::WorkspaceWrite,
        ws.path(),
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let c = t.session.open(with_patch_tool()).await.unwrap();
    let s = t.session.clone();
    let task = tokio::spawn(async move { s.message(c, "patch it").await });
    let (approval_id, command) = next_approval(&mut events).await;
    assert_eq!(
        command,
        ["apply_patch", "add new/hello.txt", "update notes.txt"]
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("notes.txt")).unwrap(),
        "alpha\nbeta\n",
        "nothing changes before the answer"
    );
    t.session
        .respond_approval(approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    let reply = task.await.unwrap().unwrap();
    assert!(reply.text.contains("Applied the patch"), "{}", reply.text);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("new/hello.txt")).unwrap(),
        "hello\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("notes.txt")).unwrap(),
        "alpha\ngamma\n"
    );
    t.stop().await;
}

#[tokio::test]
async fn apply_patch_is_refused_under_read_only_and_outside_the_workspace() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("notes.txt"), "alpha\nbeta\n").unwrap();
    // Read-only: refused before anyone is asked.
    let t = start(
        vec![apply_patch(PATCH), ScriptedReply::default()],
        ApprovalPolicy::Always,
        SandboxPolicy::ReadOnly,
        ws.path(),
    )
    .await;
    let c = t.session.open(with_patch_tool()).await.unwrap();
    let reply = message_unasked(&t, c, "patch it").await;
    assert!(reply.text.contains("read-only sandbox"), "{}", reply.text);
    assert!(!ws.path().join("new").exists());
    t.stop().await;

    // Workspace-write: a path that leaves the workspace is refused, before anyone is asked.
    let escape = "*** Begin Patch\n*** Add File: ../escape.txt\n+no\n*** End Patch\n";
    let t = start(
        vec![apply_patch(escape), ScriptedReply::default()],
        ApprovalPolicy::Always,
        SandboxPolicy::WorkspaceWrite,
        ws.path(),
    )
    .await;
    let c = t.session.open(with_patch_tool()).await.unwrap();
    let reply = message_unasked(&t, c, "escape").await;
    assert!(
        reply.text.contains("outside the workspace"),
        "{}",
        reply.text
    );
    assert!(!ws.path().parent().unwrap().join("escape.txt").exists());
    t.stop().await;
}

#[tokio::test]
async fn built_in_tools_follow_the_conversation_preferences() {
    let model = Arc::new(RecordingModel::new(vec![]));
    let (session, _dir, join) =
        start_with_model(model.clone(), |c| c.conversation.shell_tool = true, None).await;
    let plain = session.open(OpenConversation::default()).await.unwrap();
    let full = session
        .open(OpenConversation {
            include_plan_tool: true,
            include_apply_patch_tool: true,
            ..OpenConversation::default()
        })
        .await
        .unwrap();
    session.message(plain, "hi").await.unwrap();
    session.message(full, "hi").await.unwrap();
    let sent = model.sent();
    assert_eq!(sent[0].tools, ["shell"]);
    assert_eq!(sent[1].tools, ["shell", "update_plan", "apply_patch"]);
    session.shutdown().await.unwrap();
    let _ = join.await;
}

#[tokio::test]
async fn on_failure_runs_sandboxed_without_asking_and_asks_only_when_the_sandbox_refuses() {
    let ws = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("escaped.txt");
    let write = format!("echo out > {}", target.display());
    let t = start(
        vec![
            sh("echo fine"),
            ScriptedReply::default(),
            sh(&write),
            ScriptedReply::default(),
            sh("exit 3"),
            ScriptedReply::default(),
        ],
        ApprovalPolicy::OnFailure,
        SandboxPolicy::WorkspaceWrite,
        ws.path(),
    )
    .await;
    let mut events = t.session.subscribe().await.unwrap();
    let root = t.root().await;
    // Allowed by the sandbox: runs at once, nobody is asked.
    let fine = message_unasked(&t, root, "fine").await;
    assert!(
        fine.text.contains("exit code 0") && fine.text.contains("fine"),
        "{}",
        fine.text
    );
    assert!(
        !drain(&t, &mut events)
            .await
            .iter()
            .any(|e| matches!(e, EventKind::ApprovalRequested { .. })),
        "no approval for a command the sandbox allows"
    );
    // Refused by the sandbox: a human is asked to run it without; approved, it runs.
    let s = t.session.clone();
    let escaping = tokio::spawn(async move { s.message(root, "write outside").await });
    let (approval_id, command) = next_approval(&mut events).await;
    assert_eq!(command, sh_argv(&write));
    assert!(!target.exists(), "the sandboxed run wrote nothing");
    let pending = t.session.pending_approvals().await.unwrap();
    assert!(
        pending[0]
            .reason
            .contains("failed in the workspace-write sandbox")
            && pending[0].reason.contains("Permission denied"),
        "{}",
        pending[0].reason
    );
    t.session
        .respond_approval(approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    let reply = escaping.await.unwrap().unwrap();
    assert!(reply.text.contains("exit code 0"), "{}", reply.text);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "out\n");
    // A failure that is not the sandbox's goes to the model without asking.
    let own = message_unasked(&t, root, "fail").await;
    assert!(own.text.contains("exit code 3"), "{}", own.text);
    t.stop().await;
}

/// A confined command starts a session of its own: it has no controlling terminal (nothing it
/// writes reaches the user's terminal through `/dev/tty`) and it leads its own process group,
/// which the runner kills with it.
#[tokio::test]
async fn a_confined_command_has_a_session_of_its_own_and_no_terminal() {
    use troupe_actors::ports::{CommandRunner, ExecRequest};
    let runner = troupe_tests::process_runner().with_launcher(troupe_bin());
    for sandbox in [SandboxPolicy::ReadOnly, SandboxPolicy::WorkspaceWrite] {
        let request = ExecRequest {
            argv: sh_argv(
                "echo $$; cat /proc/$$/stat; if echo x > /dev/tty; then echo wrote-the-terminal; fi",
            ),
            workdir: None,
            timeout: Duration::from_secs(30),
            sandbox,
            output_cap: 1 << 16,
            writable_roots: Vec::new(),
            conversation_id: None,
            task_id: None,
        };
        let out = runner
            .run(request, &tokio_util::sync::CancellationToken::new())
            .await
            .unwrap();
        let mut lines = out.stdout.lines();
        let pid = lines.next().unwrap_or_default();
        let stat = lines.next().unwrap_or_default();
        // After the command name: state, ppid, pgrp, session, tty_nr.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        assert!(fields.len() > 4, "{sandbox:?}: {out:?}");
        assert_eq!(fields[2], pid, "{sandbox:?}: leads its process group");
        assert_eq!(fields[3], pid, "{sandbox:?}: leads its own session");
        assert_eq!(fields[4], "0", "{sandbox:?}: has no controlling terminal");
        assert!(
            !out.stdout.contains("wrote-the-terminal"),
            "{sandbox:?}: {out:?}"
        );
    }
}

/// The model names a command's timeout, but never past the session's maximum.
#[tokio::test]
async fn a_command_runs_no_longer_than_the_sessions_maximum() {
    let ws = tempfile::tempdir().unwrap();
    let _ = troupe_bin();
    let workspace = ws.path().to_path_buf();
    let t = TestSession::start_with(
        vec![
            ScriptedReply::tool(
                "shell",
                serde_json::json!({
                    "command": ["sh", "-c", "echo started; sleep 30"],
                    "timeout_ms": 3_600_000,
                }),
            ),
            ScriptedReply::default(),
        ],
        move |c| {
            c.conversation.approval_policy = ApprovalPolicy::Never;
            c.conversation.sandbox_policy = SandboxPolicy::ReadOnly;
            c.conversation.workspace_roots = vec![workspace];
            c.conversation.task.exec_timeout_max = Duration::from_millis(500);
        },
        None,
    )
    .await;
    let root = t.root().await;
    let started = std::time::Instant::now();
    let reply = message_unasked(&t, root, "run it").await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(reply.text.contains("timed out"), "{}", reply.text);
    // What it wrote before it was killed is kept.
    assert!(reply.text.contains("started"), "{}", reply.text);
    t.stop().await;
}
