//! Replay (A9, seed 003 §12): a recorded task is run again from its rollout — JSONL files or
//! SQLite, as `troupe chat` and `troupe serve` write them — against the model answers, tool
//! results and agent replies it recorded, and comes out with the same events and the same
//! error class; nothing runs again (no command, no MCP server, no agent), and a recording
//! that was altered, or kept without content, is reported as such.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use troupe_actors::agents::{AgentPorts, AgentSettings, RouterMode};
use troupe_actors::history::LocalSummarizer;
use troupe_actors::ports::{Effects, McpPort, McpServerConfig, McpTransport};
use troupe_actors::replay::{RefusalReason, ReplayOutcome, ReplayReport, ReplayRequest, replay};
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::agent::{AgentCatalog, AgentDefinition, ProviderSpec};
use troupe_proto::{
    AgentError, ApprovalDecision, ErrorKind, EventKind, MessageReply, SandboxPolicy, SessionId,
    StoragePolicy, TaskId, TaskStatus, ToolErrorPolicy,
};
use troupe_runtime::{RmcpConnector, ScriptedModel, ScriptedReply};
use troupe_store::{MemoryRolloutStorage, SqliteRolloutStorage, find_task};
use troupe_tests::{FlakyTools, process_runner};

/// A session that records what it runs: the scripted model, a real command runner, and
/// the rollout in `dir` (JSONL files, or SQLite when `storage` says so).
struct Recorder {
    session: SessionHandle,
    join: tokio::task::JoinHandle<()>,
    config: SessionConfig,
}

impl Recorder {
    async fn start(
        dir: &Path,
        replies: Vec<ScriptedReply>,
        tweak: impl FnOnce(&mut SessionConfig),
        storage: Option<Arc<dyn RolloutStorage>>,
        mcp: Option<Arc<dyn McpPort>>,
        agents: Option<AgentPorts>,
    ) -> Self {
        let mut config = SessionConfig {
            data_dir: dir.to_path_buf(),
            ..SessionConfig::default()
        };
        config.conversation.shell_tool = true;
        config.conversation.approval_policy = troupe_proto::ApprovalPolicy::Never;
        config.conversation.sandbox_policy = SandboxPolicy::FullAccess;
        config.root.include_plan_tool = true;
        tweak(&mut config);
        let ports = SessionPorts {
            model: Arc::new(ScriptedModel::new(replies)),
            mcp,
            mcp_connector: (!config.mcp_servers.is_empty()).then(|| {
                Arc::new(RmcpConnector::new()) as Arc<dyn troupe_actors::ports::McpConnector>
            }),
            exec: Some(Arc::new(process_runner())),
            effects: Effects::Live,
            summarizer: Arc::new(LocalSummarizer::default()),
            tokens: Arc::new(troupe_actors::ports::ApproxTokens),
            rollout_storage: storage,
            agents,
        };
        let (session, join) = SessionHandle::start(SessionId::new(), config.clone(), ports)
            .await
            .unwrap();
        Self {
            session,
            join,
            config,
        }
    }

    async fn send(&self, text: &str) -> MessageReply {
        let root = self.session.root().await.unwrap();
        tokio::time::timeout(Duration::from_secs(60), self.session.message(root, text))
            .await
            .expect("answered in time")
            .unwrap()
    }

    /// Ends the session (its rollout flushed); the configuration it ran under.
    async fn stop(self) -> SessionConfig {
        self.session.shutdown().await.unwrap();
        let _ = self.join.await;
        self.config
    }
}

/// The records of `task_id`'s conversation under `dir`, as `troupe replay` finds them.
async fn found(dir: &Path, task_id: TaskId) -> troupe_store::FoundTask {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || find_task(&dir, task_id))
        .await
        .unwrap()
        .unwrap()
        .expect("the task is in the data directory's rollout")
}

async fn replay_found(
    found: troupe_store::FoundTask,
    task_id: TaskId,
    config: SessionConfig,
    agents: Option<AgentPorts>,
) -> ReplayReport {
    tokio::time::timeout(
        Duration::from_secs(60),
        replay(ReplayRequest {
            task_id,
            session_id: found.session_id,
            records: found.records,
            config,
            agents,
            storage: Arc::new(MemoryRolloutStorage::new()),
        }),
    )
    .await
    .expect("a replay ends in time")
    .unwrap()
}

async fn replay_from(dir: &Path, task_id: TaskId, config: SessionConfig) -> ReplayReport {
    replay_found(found(dir, task_id).await, task_id, config, None).await
}

/// Every file under `dir` with its bytes, sorted by path.
fn contents(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                out.push((path, bytes));
            }
        }
    }
    out.sort();
    out
}

fn shell(argv: &[&str]) -> ScriptedReply {
    ScriptedReply::tool("shell", serde_json::json!({ "command": argv }))
}

fn assert_identical(report: &ReplayReport) {
    assert_eq!(
        report.outcome,
        ReplayOutcome::Identical,
        "{}",
        report.human()
    );
    assert_eq!(report.same_end, Some(true));
    let events = report.events.as_ref().unwrap();
    assert_eq!(events.difference_count, 0);
    assert_eq!(events.recorded, events.replayed);
}

#[tokio::test]
async fn a_task_with_tool_calls_replays_identically_and_runs_nothing_again() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("made-by-the-task");
    let touch = marker.display().to_string();
    let t = Recorder::start(
        dir.path(),
        vec![
            shell(&["touch", &touch]).chunked(3),
            ScriptedReply::tool(
                "update_plan",
                serde_json::json!({"plan": [{"step": "touch the file", "status": "completed"}]}),
            ),
            ScriptedReply::text("The file is there.").chunked(4),
        ],
        // A human approves the command: the approval is part of what is played back.
        |c| c.conversation.approval_policy = troupe_proto::ApprovalPolicy::Always,
        None,
        None,
        None,
    )
    .await;
    let root = t.session.root().await.unwrap();
    let s = t.session.clone();
    let running = tokio::spawn(async move { s.message(root, "make the file").await });
    let pending = loop {
        if let Some(p) = t.session.pending_approvals().await.unwrap().pop() {
            break p;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    t.session
        .respond_approval(pending.approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    let reply = running.await.unwrap().unwrap();
    assert_eq!(reply.status, TaskStatus::Ok);
    assert_eq!(reply.stats.tool_calls, 2);
    let config = t.stop().await;
    assert!(marker.exists(), "the recorded run made the file");
    std::fs::remove_file(&marker).unwrap();
    let before = contents(dir.path());

    let report = replay_from(dir.path(), reply.task_id, config).await;
    assert_identical(&report);
    assert!(!marker.exists(), "the replay ran no command");
    assert_eq!(
        contents(dir.path()),
        before,
        "the replay wrote nothing into the data directory"
    );
    let played = report.played_back.unwrap();
    assert_eq!(
        (
            played.model_answers,
            played.tool_results,
            played.dispatch_answers
        ),
        (3, 1, 0)
    );
    let events = report.events.unwrap();
    // The approval's request and answer came from a human: played back, not asked again.
    assert_eq!(events.played_back, 2);
    let replayed = report.replayed.unwrap();
    assert_ne!(replayed.task_id, reply.task_id, "a run of its own");
    assert_eq!(replayed.status, TaskStatus::Ok);
}

#[tokio::test]
async fn a_failed_model_step_replays_with_the_same_error_class_from_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteRolloutStorage::path_in(dir.path()).unwrap();
    let storage = Arc::new(SqliteRolloutStorage::open(&db).unwrap());
    let t = Recorder::start(
        dir.path(),
        vec![
            ScriptedReply::text("hello"),
            shell(&["echo", "hi"]),
            ScriptedReply::error("the model is down"),
        ],
        |_| {},
        Some(storage.clone()),
        None,
        None,
    )
    .await;
    // A second turn: the replay restores the conversation as it was before it (its history,
    // its turn number, which the events carry).
    assert_eq!(t.send("hello").await.status, TaskStatus::Ok);
    let reply = t.send("say hi").await;
    assert_eq!(reply.stats.turn, 2);
    assert_eq!(reply.status, TaskStatus::Error);
    assert_eq!(
        reply.error.as_ref().map(AgentError::kind),
        Some(ErrorKind::ModelError)
    );
    let config = t.stop().await;
    drop(storage);

    let report = replay_from(dir.path(), reply.task_id, config).await;
    assert_identical(&report);
    let (recorded, replayed) = (report.recorded.unwrap(), report.replayed.unwrap());
    assert_eq!(recorded.error_kind, Some(ErrorKind::ModelError));
    assert_eq!(replayed.error_kind, Some(ErrorKind::ModelError));
    assert_eq!(
        replayed.error, recorded.error,
        "the same error, detail included"
    );
}

#[tokio::test]
async fn a_task_stopped_at_its_step_limit_replays_under_any_configured_limit() {
    let dir = tempfile::tempdir().unwrap();
    let t = Recorder::start(
        dir.path(),
        vec![
            shell(&["echo", "1"]),
            shell(&["echo", "2"]),
            shell(&["echo", "3"]),
        ],
        |c| c.conversation.task.max_steps = 2,
        None,
        None,
        None,
    )
    .await;
    let reply = t.send("loop").await;
    assert_eq!(reply.status, TaskStatus::MaxSteps);
    let mut config = t.stop().await;
    config.conversation.task.max_steps = 100;
    let report = replay_from(dir.path(), reply.task_id, config).await;
    assert_identical(&report);
    assert_eq!(report.replayed.unwrap().status, TaskStatus::MaxSteps);
}

#[tokio::test]
async fn a_tool_error_that_terminated_replays_with_its_class_and_differs_under_skip() {
    let dir = tempfile::tempdir().unwrap();
    let t = Recorder::start(
        dir.path(),
        vec![shell(&["false"]), ScriptedReply::text("never asked")],
        |c| c.conversation.task.tool_errors = ToolErrorPolicy::Terminate,
        None,
        None,
        None,
    )
    .await;
    let reply = t.send("fail").await;
    assert_eq!(reply.status, TaskStatus::Error);
    assert_eq!(
        reply.error.as_ref().map(AgentError::kind),
        Some(ErrorKind::ToolError)
    );
    let config = t.stop().await;

    let same = replay_from(dir.path(), reply.task_id, config.clone()).await;
    assert_identical(&same);
    assert_eq!(
        same.replayed.as_ref().unwrap().error_kind,
        Some(ErrorKind::ToolError)
    );

    // Under another policy the same recording goes on to a step it never recorded.
    let mut skip = config;
    skip.conversation.task.tool_errors = ToolErrorPolicy::Skip;
    let other = replay_from(dir.path(), reply.task_id, skip).await;
    assert_eq!(other.outcome, ReplayOutcome::Differs);
    assert_eq!(other.same_end, Some(false));
    assert_eq!(
        other.replayed.as_ref().unwrap().error_kind,
        Some(ErrorKind::ModelError),
        "{}",
        other.human()
    );
    let first = &other.events.as_ref().unwrap().differences[0];
    assert_eq!(first.replayed.as_ref().unwrap().kind, "step_started");
    assert!(
        other.human().contains("the error class differs"),
        "{}",
        other.human()
    );
}

#[tokio::test]
async fn an_altered_recording_shows_where_it_differs() {
    let dir = tempfile::tempdir().unwrap();
    let t = Recorder::start(
        dir.path(),
        vec![
            shell(&["echo", "one"]),
            ScriptedReply::error("the model is down"),
        ],
        |_| {},
        None,
        None,
        None,
    )
    .await;
    let reply = t.send("go").await;
    let config = t.stop().await;
    let original = found(dir.path(), reply.task_id).await;

    // The failed step's error, changed: the replay ends with the changed class, which the
    // recorded end does not say.
    let mut altered = original.clone();
    for r in &mut altered.records {
        if let Some(EventKind::Error { error }) = &mut r.event
            && r.task_id == Some(reply.task_id)
        {
            *error = AgentError::timeout("the model", Duration::from_secs(30));
        }
    }
    let report = replay_found(altered, reply.task_id, config.clone(), None).await;
    assert_eq!(report.outcome, ReplayOutcome::Differs);
    assert_eq!(report.same_end, Some(false));
    assert_eq!(
        report.replayed.as_ref().unwrap().error_kind,
        Some(ErrorKind::Timeout)
    );
    let events = report.events.as_ref().unwrap();
    assert_eq!(events.difference_count, 1, "{}", report.human());
    let d = &events.differences[0];
    assert_eq!(d.recorded.as_ref().unwrap().kind, "task_finished");
    assert_eq!(d.replayed.as_ref().unwrap().kind, "task_finished");

    // A tool result taken out of the record: the call finds nothing to play back.
    let mut cut = original;
    cut.records.retain(|r| {
        !(r.task_id == Some(reply.task_id)
            && matches!(r.event, Some(EventKind::ToolCallFinished { .. })))
    });
    let report = replay_found(cut, reply.task_id, config, None).await;
    assert_eq!(report.outcome, ReplayOutcome::Differs);
    let text = report.human();
    assert!(text.contains("recorded result of the tool call"), "{text}");
}

#[tokio::test]
async fn a_task_kept_as_headers_only_is_refused_naming_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let t = Recorder::start(
        dir.path(),
        vec![shell(&["echo", "x"]), ScriptedReply::text("done")],
        |c| c.root.storage_policy = StoragePolicy::HeadersOnly,
        None,
        None,
        None,
    )
    .await;
    let reply = t.send("secret question").await;
    let config = t.stop().await;
    let report = replay_from(dir.path(), reply.task_id, config).await;
    assert_eq!(report.outcome, ReplayOutcome::Refused);
    let refusal = report.refusal.unwrap();
    assert_eq!(refusal.reason, RefusalReason::ContentNotKept);
    assert!(
        refusal.message.contains("headers only"),
        "{}",
        refusal.message
    );
    assert!(
        refusal
            .message
            .contains("the task's input, the model's answers (2 steps), the tool results (1 call)"),
        "{}",
        refusal.message
    );
}

#[tokio::test]
async fn retried_mcp_calls_replay_attempt_by_attempt_without_calling_the_tool() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let t = Recorder::start(
        dir.path(),
        vec![
            ScriptedReply::tool("flaky__op", serde_json::json!({})),
            ScriptedReply::text("it worked"),
        ],
        |c| c.conversation.task.tool_errors = ToolErrorPolicy::Retry { attempts: 2 },
        None,
        Some(Arc::new(FlakyTools {
            failures: 2,
            calls: calls.clone(),
        })),
        None,
    )
    .await;
    let reply = t.send("try").await;
    assert_eq!(reply.status, TaskStatus::Ok);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "two failures, then it worked"
    );
    let config = t.stop().await;

    let report = replay_from(dir.path(), reply.task_id, config).await;
    assert_identical(&report);
    assert_eq!(report.played_back.unwrap().tool_results, 3);
    assert_eq!(calls.load(Ordering::SeqCst), 3, "the replay called nothing");
}

#[tokio::test]
async fn a_real_mcp_servers_answer_replays_without_starting_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let marker = format!("replay-{}", TaskId::new());
    let server = McpServerConfig {
        name: "everything".into(),
        transport: McpTransport::Stdio {
            command: "node".into(),
            args: vec![
                troupe_test_support::mcp::server_entry("server-everything")
                    .display()
                    .to_string(),
                "stdio".into(),
            ],
            env: [("TROUPE_TEST_MARKER".to_owned(), marker.clone())].into(),
            cwd: None,
        },
    };
    let t = Recorder::start(
        dir.path(),
        vec![
            ScriptedReply::tool("everything__echo", serde_json::json!({"message": "ping"})),
            ScriptedReply::text("echoed"),
        ],
        |c| c.mcp_servers = vec![server],
        None,
        None,
        None,
    )
    .await;
    // The server connects in the background: the tool is offered once it is up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let pool = t.session.mcp_pool().await.unwrap().expect("a pool");
        let snapshot = pool.snapshot().await.unwrap();
        if snapshot
            .servers
            .iter()
            .flat_map(|s| &s.tools)
            .any(|tool| tool == "everything__echo")
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server never came up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reply = t.send("echo ping").await;
    assert_eq!(reply.status, TaskStatus::Ok);
    assert_eq!(reply.stats.mcp_calls, 1);
    let config = t.stop().await;
    let gone = tokio::time::Instant::now() + Duration::from_secs(10);
    while !troupe_test_support::mcp::processes_with_env("TROUPE_TEST_MARKER", &marker).is_empty() {
        assert!(
            tokio::time::Instant::now() < gone,
            "the server outlived its session"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let report = replay_from(dir.path(), reply.task_id, config).await;
    assert_identical(&report);
    assert_eq!(report.played_back.unwrap().tool_results, 1);
    assert!(
        troupe_test_support::mcp::processes_with_env("TROUPE_TEST_MARKER", &marker).is_empty(),
        "the replay started no server"
    );
}

fn model_agent(id: &str) -> AgentDefinition {
    AgentDefinition {
        id: id.into(),
        role: "executor".into(),
        description: Some(format!("does {id} work")),
        provider: ProviderSpec::Model {
            model: None,
            provider: None,
            base_url: None,
            instructions: Some(format!("You are {id}.")),
        },
        session: Default::default(),
        tools: Default::default(),
        workers: Vec::new(),
        governance: None,
        output: None,
    }
}

fn team(router: RouterMode) -> AgentPorts {
    let coder = model_agent("coder");
    AgentPorts {
        catalog: Arc::new(AgentCatalog {
            agents: [(coder.id.clone(), coder)].into(),
            ..AgentCatalog::default()
        }),
        settings: AgentSettings {
            router,
            ..AgentSettings::default()
        },
        factories: Vec::new(),
        models: Default::default(),
        bindings: Arc::new(troupe_store::memory::MemoryStore::new()),
        live: None,
    }
}

/// How many conversations the replay's record opened for agents: none, since nothing is
/// dispatched. The recorded session opened one for `coder`.
async fn agent_conversations(dir: &Path, session_id: SessionId) -> usize {
    let storage = troupe_actors::rollout::FileRolloutStorage::new(dir.join("rollout"));
    let records = tokio::task::spawn_blocking(move || storage.read_after(session_id, 0, 100_000))
        .await
        .unwrap()
        .unwrap();
    let mut opened: Vec<_> = records
        .iter()
        .filter(|r| r.kind == troupe_proto::EventName::ConversationOpened)
        .filter_map(|r| r.conversation_id)
        .collect();
    opened.dedup();
    opened.len()
}

#[tokio::test]
async fn a_routed_dispatch_replays_from_the_agents_recorded_answer() {
    for (router, hub) in [
        (RouterMode::Rules, false),
        (RouterMode::Rules, true),
        (RouterMode::Model, false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (input, replies) = match router {
            RouterMode::Rules if hub => (
                "/hub coder fix the build",
                vec![ScriptedReply::text("fixed it")],
            ),
            RouterMode::Rules => (
                "@coder fix the build",
                vec![ScriptedReply::text("fixed it")],
            ),
            RouterMode::Model => (
                "please fix the build",
                vec![
                    ScriptedReply::tool(
                        "route",
                        serde_json::json!({
                            "decision": "dispatch_agent",
                            "agent_id": "coder",
                            "input": "fix the build",
                            "reason": "code work",
                            "confidence": 0.8,
                        }),
                    ),
                    ScriptedReply::text("fixed it"),
                ],
            ),
        };
        let t = Recorder::start(dir.path(), replies, |_| {}, None, None, Some(team(router))).await;
        let session_id = t.session.id();
        let reply = t.send(input).await;
        assert_eq!(
            (reply.status, reply.text.as_str()),
            (TaskStatus::Ok, "fixed it")
        );
        let config = t.stop().await;
        assert_eq!(agent_conversations(dir.path(), session_id).await, 2);

        // The configuration's router is the rules; the recording says how it was routed.
        let report = replay_found(
            found(dir.path(), reply.task_id).await,
            reply.task_id,
            config,
            Some(team(RouterMode::Rules)),
        )
        .await;
        assert_identical(&report);
        let played = report.played_back.unwrap();
        assert_eq!(played.dispatch_answers, 1, "{router:?}");
        let routing_steps = usize::from(router == RouterMode::Model);
        assert_eq!(
            played.model_answers, routing_steps,
            "the agent's steps are not run"
        );
        // The dispatch's own events (sent, bound, result) were played back.
        assert!(report.events.unwrap().played_back >= 2);
    }
}

// ----- the command -----

/// `troupe` in `cwd`, stdin closed, with no variable of this process choosing its model or
/// configuration.
fn troupe(cwd: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(troupe_tests::troupe_bin());
    for k in [
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "TROUPE_CONFIG",
        "TROUPE_PROVIDER",
        "TROUPE_BASE_URL",
        "TROUPE_SCRIPT",
        "TROUPE_DATA_DIR",
        "TROUPE_AGENTS_DIR",
    ] {
        cmd.env_remove(k);
    }
    cmd.current_dir(cwd).stdin(std::process::Stdio::null());
    cmd
}

async fn output(mut cmd: tokio::process::Command) -> std::process::Output {
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("troupe did not finish in time")
        .unwrap()
}

/// One `chat --once` turn that runs `touch <marker>` through the shell tool; its task id.
async fn chat_turn(dir: &Path, marker: &Path, policy: &str) -> String {
    let script = dir.join(format!("script-{policy}.json"));
    std::fs::write(
        &script,
        serde_json::json!({"replies": [
            {"text": "", "tool_calls": [{"name": "shell", "arguments": {"command": ["touch", marker]}}]},
            {"text": "made it", "chunk_chars": 3},
        ]})
        .to_string(),
    )
    .unwrap();
    let mut cmd = troupe(dir);
    cmd.args(["chat", "--once", "--json", "--data-dir", "data"])
        .arg("--script")
        .arg(&script)
        .args([
            "--approval-policy",
            "never",
            "--sandbox-policy",
            "full-access",
        ])
        .args(["--storage-policy", policy, "make the file"]);
    let out = output(cmd).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["status"], "ok", "{reply}");
    reply["task_id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn the_command_replays_a_chat_turn_and_says_when_it_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker");
    let task = chat_turn(dir.path(), &marker, "full").await;
    assert!(marker.exists(), "the chat turn ran its command");
    std::fs::remove_file(&marker).unwrap();

    let mut cmd = troupe(dir.path());
    cmd.args(["replay", &task, "--data-dir", "data"]);
    let out = output(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(&format!("replay of task {task}: identical")),
        "{stdout}"
    );
    assert!(
        stdout.contains("recorded: ok   replayed: ok   same end"),
        "{stdout}"
    );
    assert!(
        stdout.contains("2 model answers, 1 tool results"),
        "{stdout}"
    );
    assert!(!marker.exists(), "the replay ran no command");

    let mut cmd = troupe(dir.path());
    cmd.args(["replay", &task, "--json"])
        .env("TROUPE_DATA_DIR", "data");
    let out = output(cmd).await;
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "identical");
    assert_eq!(report["recorded"]["status"], "ok");
    assert_eq!(report["events"]["difference_count"], 0);
    assert!(!marker.exists());

    // The recorded end, edited: the replay ends otherwise (exit 3) and says where.
    let file = contents(&dir.path().join("data/rollout"))
        .into_iter()
        .map(|(path, _)| path)
        .find(|p| std::fs::read_to_string(p).unwrap().contains(&task))
        .unwrap();
    let edited: Vec<String> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| {
            if l.contains("task_finished") && l.contains(&task) {
                l.replace("made it", "made two")
            } else {
                l.to_owned()
            }
        })
        .collect();
    std::fs::write(&file, edited.join("\n") + "\n").unwrap();
    let mut cmd = troupe(dir.path());
    cmd.args(["replay", &task, "--data-dir", "data"]);
    let out = output(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(stdout.contains(": differs (1 difference)"), "{stdout}");
    assert!(
        stdout.contains(r#"- recorded #12 task_finished {"text":"made two"}"#),
        "{stdout}"
    );
    assert!(
        stdout.contains(r#"replayed #12 task_finished {"text":"made it"}"#),
        "{stdout}"
    );
    assert!(!marker.exists());

    // Kept as headers only: refused (exit 4), saying what is missing.
    let headers = chat_turn(dir.path(), &marker, "headers-only").await;
    std::fs::remove_file(&marker).unwrap();
    let mut cmd = troupe(dir.path());
    cmd.args(["replay", &headers, "--data-dir", "data"]);
    let out = output(cmd).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("keep headers only"), "{stderr}");
    assert!(stderr.contains("missing: the task's input"), "{stderr}");
    assert!(!marker.exists());

    // Unknown, and not a task id at all.
    let mut cmd = troupe(dir.path());
    cmd.args([
        "replay",
        &TaskId::new().to_string(),
        "--data-dir",
        "data",
        "--json",
    ]);
    let out = output(cmd).await;
    assert_eq!(out.status.code(), Some(4));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "refused");
    assert_eq!(report["refusal"]["reason"], "not_found");
    let mut cmd = troupe(dir.path());
    cmd.args(["replay", "not-a-task", "--data-dir", "data"]);
    let out = output(cmd).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a task id"));
}

/// A task of `troupe serve` on PostgreSQL is replayed from the rollout there: `troupe replay`
/// reads where the configuration's store is (`[store] backend = "postgres"`), and says where
/// it looked when the task is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_replays_a_task_recorded_on_postgres() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        serde_json::json!({"replies": [{"text": "kept on postgres", "chunk_chars": 4}]})
            .to_string(),
    )
    .unwrap();
    let mut serve = std::process::Command::new(troupe_tests::troupe_bin());
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir", "data"])
        .arg("--script")
        .arg(&script)
        .current_dir(dir.path())
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_NODE")
        .env("TROUPE_STORE_BACKEND", "postgres")
        .env("TROUPE_POSTGRES_URL", &url)
        .stderr(std::process::Stdio::null());
    let (mut child, base) = troupe_tests::spawn_serve(&mut serve);
    let http = reqwest::Client::new();
    let session: serde_json::Value = http
        .post(format!("{base}/api/sessions"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session = session["session_id"].as_str().unwrap().to_owned();
    let reply: serde_json::Value = http
        .post(format!("{base}/api/sessions/{session}/messages"))
        .json(&serde_json::json!({"text": "say it"}))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task = reply["reply"]["task_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply}"))
        .to_owned();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap();

    let mut cmd = troupe(dir.path());
    cmd.args(["replay", &task, "--data-dir", "data"])
        .env("TROUPE_STORE_BACKEND", "postgres")
        .env("TROUPE_POSTGRES_URL", &url);
    let out = output(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(&format!("replay of task {task}: identical")),
        "{stdout}"
    );

    // The data directory holds no rollout of it: refused, naming where it looked.
    let mut cmd = troupe(dir.path());
    cmd.args(["replay", &task, "--data-dir", "data"])
        .env("TROUPE_STORE_BACKEND", "sqlite")
        .env_remove("TROUPE_POSTGRES_URL");
    let out = output(cmd).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("no rollout in data holds task"), "{stderr}");
}
