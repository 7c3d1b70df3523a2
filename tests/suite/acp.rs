//! The ACP client against a real external agent: codex-acp (npm `@zed-industries/codex-acp`,
//! installed by scripts/install-acp-agents) pointed at the test model server in the Responses
//! wire format. A streamed turn, a permission request answered by the handler, a session
//! loaded again by a new process, a crash mid-turn and the restart after it, cancel, and
//! shutdown by signal (SIGTERM, and SIGKILL for a process that ignores it).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use troupe_acp::{
    AcpAgent, AcpAgentSpec, AcpError, AcpEvent, AgentCommand, AgentPhase, FixedPermissions,
    PermissionDecision, PermissionHandler, PermissionRequest, RestartPolicy, SessionOrigin,
    StopReason, Stopped, Turn,
};
use troupe_test_support::acp::{codex_acp_bin, write_codex_home};
use troupe_test_support::{ModelServer, Reply};

/// Bound of a whole test.
const TEST_LIMIT: Duration = Duration::from_secs(90);

async fn bounded(test: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(TEST_LIMIT, test)
        .await
        .expect("the test did not finish in time");
}

/// A model server, a CODEX_HOME pointing at it and a workspace for codex-acp.
struct Codex {
    server: ModelServer,
    // Kept for the life of the test: codex-acp keeps its sessions there.
    _home: tempfile::TempDir,
    work: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Codex {
    async fn start(approval_policy: &str) -> Self {
        let server = ModelServer::start().await;
        let home = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let env = write_codex_home(home.path(), &server.base_url(), approval_policy).unwrap();
        Self {
            server,
            _home: home,
            work,
            env,
        }
    }

    fn spec(&self) -> AcpAgentSpec {
        let mut spec = AcpAgentSpec::new(
            "codex",
            AgentCommand {
                command: codex_acp_bin().display().to_string(),
                args: Vec::new(),
                env: self.env.iter().cloned().collect(),
                cwd: Some(self.work.path().to_path_buf()),
            },
        );
        spec.restart = RestartPolicy {
            min_delay: Duration::from_millis(50),
            max_delay: Duration::from_millis(400),
            factor: 2.0,
        };
        spec
    }

    async fn agent(&self) -> AcpAgent {
        AcpAgent::spawn(self.spec()).await.unwrap()
    }
}

fn turn(
    text: &str,
    events: &mpsc::Sender<AcpEvent>,
    permissions: Arc<dyn PermissionHandler>,
) -> Turn {
    Turn {
        text: text.into(),
        events: Some(events.clone()),
        permissions,
    }
}

fn deny_all() -> Arc<dyn PermissionHandler> {
    Arc::new(FixedPermissions(PermissionDecision::RejectOnce))
}

fn drain(rx: &mut mpsc::Receiver<AcpEvent>) -> Vec<AcpEvent> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        out.push(e);
    }
    out
}

fn alive(pid: u32) -> bool {
    // A zombie is gone for our purpose: it runs nothing.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

/// Waits for the first event that `want` accepts; panics after 30 s.
async fn wait_for(rx: &mut mpsc::Receiver<AcpEvent>, want: impl Fn(&AcpEvent) -> bool) -> AcpEvent {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let e = rx.recv().await.expect("the event channel closed");
            if want(&e) {
                return e;
            }
        }
    })
    .await
    .expect("the event did not come")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_streams_its_text_and_usage() {
    bounded(async {
        let codex = Codex::start("never").await;
        codex.server.push(Reply::text(["Hel", "lo", " there"]));
        let agent = codex.agent().await;
        assert_eq!(agent.health().await.phase, AgentPhase::Idle);
        let info = agent.initialize().await.unwrap();
        assert_eq!(info.name.as_deref(), Some("codex-acp"));
        assert!(info.load_session && info.resume_session, "{info:?}");
        let (tx, mut rx) = mpsc::channel(256);
        let out = agent
            .prompt(turn("say hello", &tx, deny_all()))
            .await
            .unwrap();
        assert_eq!(out.stop_reason, StopReason::EndTurn);
        assert_eq!(out.text, "Hello there");
        let opened = out.reopened.expect("the first turn opens a session");
        assert_eq!(opened.origin, SessionOrigin::New);
        assert_eq!(opened.session_id, out.session_id);
        let events = drain(&mut rx);
        let chunks: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                AcpEvent::MessageChunk { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(chunks, ["Hel", "lo", " there"]);
        assert!(
            events
                .iter()
                .any(|e| matches!(e, AcpEvent::Usage { used, .. } if *used > 0)),
            "{events:?}"
        );
        // The model saw the prompt.
        let sent = codex.server.requests();
        assert!(sent.last().unwrap().body.to_string().contains("say hello"));
        let h = agent.health().await;
        assert_eq!(
            (h.phase, h.ok, h.starts, h.crashes),
            (AgentPhase::Ready, true, 1, 0)
        );
        let pid = h.pid.unwrap();
        assert_eq!(agent.shutdown().await, Stopped::Terminated);
        assert!(!alive(pid), "codex-acp {pid} outlived its shutdown");
    })
    .await;
}

/// Records what it was asked and answers with `decision`.
struct Recorder {
    decision: PermissionDecision,
    asked: Mutex<Vec<PermissionRequest>>,
}

#[async_trait::async_trait]
impl PermissionHandler for Recorder {
    async fn decide(&self, request: &PermissionRequest) -> PermissionDecision {
        self.asked.lock().unwrap().push(request.clone());
        self.decision
    }
}

async fn command_turn(
    decision: PermissionDecision,
) -> (
    Codex,
    StopReason,
    Vec<AcpEvent>,
    Vec<PermissionRequest>,
    PathBuf,
) {
    let codex = Codex::start("untrusted").await;
    let marker = codex.work.path().join("marker.txt");
    codex.server.push(Reply::tool_call(
        "exec_command",
        [r#"{"cmd":"touch marker.txt"}"#],
    ));
    codex.server.push(Reply::text(["done"]));
    let agent = codex.agent().await;
    let recorder = Arc::new(Recorder {
        decision,
        asked: Mutex::new(Vec::new()),
    });
    let (tx, mut rx) = mpsc::channel(256);
    let out = agent
        .prompt(turn("make a marker", &tx, recorder.clone()))
        .await
        .unwrap();
    // codex-acp may send the command's last update after it has answered the prompt: when
    // the command ran, keep reading until it has come (bounded), then stop the agent.
    let mut events = drain(&mut rx);
    let done = |e: &AcpEvent| matches!(e, AcpEvent::ToolCallUpdate { status: Some(s), .. } if s == "completed");
    if out.stop_reason == StopReason::EndTurn && !events.iter().any(done) {
        let _ = tokio::time::timeout(Duration::from_secs(3), async {
            while let Some(e) = rx.recv().await {
                let last = done(&e);
                events.push(e);
                if last {
                    break;
                }
            }
        })
        .await;
    }
    agent.shutdown().await;
    events.extend(drain(&mut rx));
    let asked = recorder.asked.lock().unwrap().clone();
    (codex, out.stop_reason, events, asked, marker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_request_goes_to_the_handler_and_its_answer_to_the_agent() {
    bounded(async {
        let (codex, stop, events, asked, marker) =
            command_turn(PermissionDecision::AllowOnce).await;
        assert_eq!(stop, StopReason::EndTurn);
        assert_eq!(asked.len(), 1, "{asked:?}");
        let ask = &asked[0];
        assert!(
            ask.options.iter().any(|o| o.kind == "allow_once"),
            "{ask:?}"
        );
        assert!(
            serde_json::to_string(ask)
                .unwrap()
                .contains("touch marker.txt"),
            "{ask:?}"
        );
        // Asked, answered, then the command ran: in that order in the stream.
        let pos = |f: &dyn Fn(&AcpEvent) -> bool| events.iter().position(f);
        let requested = pos(&|e| matches!(e, AcpEvent::PermissionRequested(_))).unwrap();
        let answered = pos(&|e| {
            matches!(
                e,
                AcpEvent::PermissionAnswered {
                    decision: PermissionDecision::AllowOnce,
                    ..
                }
            )
        })
        .unwrap();
        let ran = pos(&|e| matches!(e, AcpEvent::ToolCall { kind, .. } if kind == "execute"))
            .unwrap_or_else(|| panic!("no command in {events:#?}"));
        assert!(requested < answered && answered < ran, "{events:#?}");
        // codex-acp reports the command completed in most turns, not all (it can end the turn
        // first and drop the update): when it does, after the command started.
        let completed = pos(
            &|e| matches!(e, AcpEvent::ToolCallUpdate { status: Some(s), .. } if s == "completed"),
        );
        assert!(completed.is_none_or(|c| ran < c), "{events:#?}");
        assert!(marker.exists(), "the approved command did not run");
        // The command's result went back to the model.
        let sent = codex.server.requests();
        assert_eq!(sent.len(), 2);
        assert!(sent[1].body.to_string().contains("function_call_output"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_permission_keeps_the_command_from_running() {
    bounded(async {
        let (codex, stop, events, asked, marker) =
            command_turn(PermissionDecision::RejectOnce).await;
        // codex-acp ends the turn when a command is rejected.
        assert_eq!(stop, StopReason::Cancelled);
        assert_eq!(
            codex.server.requests().len(),
            1,
            "nothing went back to the model"
        );
        assert_eq!(asked.len(), 1);
        assert!(events.iter().any(|e| matches!(
            e,
            AcpEvent::PermissionAnswered {
                decision: PermissionDecision::RejectOnce,
                ..
            }
        )));
        assert!(!marker.exists(), "a rejected command ran");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_loads_the_bound_session() {
    bounded(async {
        let codex = Codex::start("never").await;
        codex.server.push(Reply::text(["first answer"]));
        let (tx, _rx) = mpsc::channel(256);
        let first = codex.agent().await;
        let out = first
            .prompt(turn("remember the word pelican", &tx, deny_all()))
            .await
            .unwrap();
        let session = out.session_id.clone();
        first.shutdown().await;

        // Another process for the same binding: the stored session id is loaded.
        let second = codex.agent().await;
        let opened = second.open_session(Some(&session)).await.unwrap();
        assert_eq!(opened.origin, SessionOrigin::Loaded);
        assert_eq!(opened.session_id, session);
        assert!(opened.replaced.is_none() && opened.resumed());
        codex.server.push(Reply::text(["second answer"]));
        let out = second
            .prompt(turn("which word?", &tx, deny_all()))
            .await
            .unwrap();
        assert_eq!(out.session_id, session);
        assert_eq!(out.reopened, None, "the session was already bound");
        assert_eq!(out.text, "second answer");
        // The model got the earlier exchange with the new question.
        let body = codex.server.requests().last().unwrap().body.to_string();
        assert!(
            body.contains("pelican")
                && body.contains("first answer")
                && body.contains("which word?")
        );

        // An id the agent does not know is replaced, and the reason given.
        let third = codex.agent().await;
        let opened = third.open_session(Some("no-such-session")).await.unwrap();
        assert_eq!(opened.origin, SessionOrigin::New);
        let replaced = opened.replaced.expect("replaced");
        assert_eq!(replaced.previous, "no-such-session");
        assert!(
            replaced.reason.contains("session/load"),
            "{}",
            replaced.reason
        );
        second.shutdown().await;
        third.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_turn_ends_it_and_the_next_turn_restarts_the_agent() {
    bounded(async {
        let codex = Codex::start("never").await;
        codex.server.push(Reply::text(["warm"]));
        let agent = codex.agent().await;
        let (tx, mut rx) = mpsc::channel(256);
        let first = agent
            .prompt(turn("warm up", &tx, deny_all()))
            .await
            .unwrap();
        drain(&mut rx);
        // The next answer stalls after its first text delta.
        codex
            .server
            .push(Reply::text(["partial", " never"]).stall_after(4));
        let running = tokio::spawn({
            let agent = agent.clone();
            let tx = tx.clone();
            async move { agent.prompt(turn("go on", &tx, deny_all())).await }
        });
        wait_for(
            &mut rx,
            |e| matches!(e, AcpEvent::MessageChunk { text } if text == "partial"),
        )
        .await;
        let h = agent.health().await;
        assert_eq!(h.phase, AgentPhase::Busy);
        let pid = h.pid.unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let err = running.await.unwrap().unwrap_err();
        match &err {
            AcpError::Exited { during, status, .. } => {
                assert_eq!(*during, "session/prompt");
                assert!(status.contains("SIGKILL"), "{status}");
            }
            other => panic!("expected Exited, got {other:?}"),
        }
        assert!(
            err.to_string().contains("exited during session/prompt"),
            "{err}"
        );
        let h = agent.health().await;
        assert_eq!((h.phase, h.ok, h.crashes), (AgentPhase::Crashed, false, 1));

        // The next turn starts a new process and loads the session again.
        codex.server.push(Reply::text(["back"]));
        let out = agent
            .prompt(turn("are you back?", &tx, deny_all()))
            .await
            .unwrap();
        assert_eq!(out.text, "back");
        let reopened = out
            .reopened
            .expect("the restarted process reopens the session");
        assert_eq!(reopened.origin, SessionOrigin::Loaded, "{reopened:?}");
        assert_eq!(reopened.session_id, first.session_id);
        let h = agent.health().await;
        assert_eq!((h.phase, h.ok, h.starts), (AgentPhase::Ready, true, 2));
        assert_ne!(h.pid, Some(pid));
        agent.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_the_running_turn_cancelled() {
    bounded(async {
        let codex = Codex::start("never").await;
        codex
            .server
            .push(Reply::text(["thinking", " forever"]).stall_after(4));
        let agent = codex.agent().await;
        let (tx, mut rx) = mpsc::channel(256);
        let running = tokio::spawn({
            let agent = agent.clone();
            async move { agent.prompt(turn("think", &tx, deny_all())).await }
        });
        wait_for(&mut rx, |e| matches!(e, AcpEvent::MessageChunk { .. })).await;
        // A second turn on the same binding is refused while this one runs.
        let (tx2, _rx2) = mpsc::channel(4);
        assert_eq!(
            agent
                .prompt(turn("again", &tx2, deny_all()))
                .await
                .unwrap_err(),
            AcpError::Busy
        );
        assert!(agent.cancel().await.unwrap());
        let out = running.await.unwrap().unwrap();
        assert_eq!(out.stop_reason, StopReason::Cancelled);
        assert_eq!(agent.health().await.phase, AgentPhase::Ready);
        // The binding goes on: the next turn runs in the same session.
        codex.server.push(Reply::text(["after"]));
        let (tx, _rx) = mpsc::channel(64);
        let next = agent.prompt(turn("next", &tx, deny_all())).await.unwrap();
        assert_eq!(
            (next.stop_reason, next.text.as_str()),
            (StopReason::EndTurn, "after")
        );
        assert_eq!(next.reopened, None);
        agent.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_kills_a_process_that_ignores_sigterm() {
    bounded(async {
        // A minimal agent that answers `initialize` and then ignores SIGTERM.
        let script = r#"
import json, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
req = json.loads(sys.stdin.readline())
print(json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": {"protocolVersion": 1}}), flush=True)
while True:
    time.sleep(1)
"#;
        let mut spec = AcpAgentSpec::new(
            "stubborn",
            AgentCommand {
                command: "python3".into(),
                args: vec!["-c".into(), script.into()],
                ..AgentCommand::default()
            },
        );
        spec.shutdown_grace = Duration::from_millis(300);
        let agent = AcpAgent::spawn(spec).await.unwrap();
        agent.initialize().await.unwrap();
        let pid = agent.health().await.pid.unwrap();
        let started = std::time::Instant::now();
        assert_eq!(agent.shutdown().await, Stopped::Killed);
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(!alive(pid));
        assert_eq!(agent.health().await.phase, AgentPhase::Stopped);
        let (tx, _rx) = mpsc::channel(4);
        assert_eq!(
            agent
                .prompt(turn("hello?", &tx, deny_all()))
                .await
                .unwrap_err(),
            AcpError::Stopped
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_cannot_start_is_a_clear_error() {
    bounded(async {
        let agent = AcpAgent::spawn(AcpAgentSpec::new(
            "missing",
            AgentCommand {
                command: "/nonexistent/agent".into(),
                ..AgentCommand::default()
            },
        ))
        .await
        .unwrap();
        let err = agent.initialize().await.unwrap_err();
        assert!(matches!(err, AcpError::Spawn { .. }), "{err:?}");
        assert!(err.to_string().contains("/nonexistent/agent"), "{err}");
        let h = agent.health().await;
        assert!(!h.ok && h.last_error.is_some(), "{h:?}");
        agent.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_request_becomes_a_troupe_approval_of_the_task() {
    bounded(async {
        let codex = Codex::start("untrusted").await;
        let marker = codex.work.path().join("marker.txt");
        codex.server.push(Reply::tool_call(
            "exec_command",
            [r#"{"cmd":"touch marker.txt"}"#],
        ));
        codex.server.push(Reply::text(["done"]));
        // A troupe session whose ApprovalStore answers for the dispatching task.
        let session = troupe_tests::TestSession::start(Vec::new()).await;
        let conversation = session.root().await;
        let task_id = troupe_proto::TaskId::new();
        let approvals = session.session.services().await.unwrap().approvals;
        let permissions = Arc::new(troupe_acp::ApprovalStorePermissions {
            approvals: troupe_actors::directory::ServiceRef::fixed(approvals),
            conversation_id: conversation,
            task_id,
            agent_id: "codex".into(),
            timeout: Some(Duration::from_secs(30)),
            cancel: tokio_util::sync::CancellationToken::new(),
            governed: None,
        });
        let agent = codex.agent().await;
        let (tx, _rx) = mpsc::channel(256);
        let running = tokio::spawn({
            let agent = agent.clone();
            async move { agent.prompt(turn("make a marker", &tx, permissions)).await }
        });
        // A human sees the request among the session's pending approvals and approves it.
        let pending = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let p = session.session.pending_approvals().await.unwrap();
                if let Some(first) = p.into_iter().next() {
                    return first;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the approval was asked");
        assert_eq!(pending.conversation_id, conversation);
        assert_eq!(pending.task_id, Some(task_id));
        // codex-acp gives the argv it will run.
        assert_eq!(pending.command, ["/bin/bash", "-lc", "touch marker.txt"]);
        assert!(
            pending.reason.contains("ACP agent `codex`"),
            "{}",
            pending.reason
        );
        session
            .session
            .respond_approval(
                pending.approval_id,
                troupe_proto::ApprovalDecision::ApproveOnce,
            )
            .await
            .unwrap();
        let out = running.await.unwrap().unwrap();
        assert_eq!(
            (out.stop_reason, out.text.as_str()),
            (StopReason::EndTurn, "done")
        );
        assert!(marker.exists(), "the approved command did not run");
        agent.shutdown().await;
        session.stop().await;
    })
    .await;
}
