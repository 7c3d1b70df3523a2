//! An external agent over ACP as a sub-agent (A2, O5): the real codex-acp (installed by
//! scripts/install-acp-agents) pointed at the test model server, plugged into a session's hub
//! by troupe's ACP provider. `/hub` to it, its updates as `agent_update` events, a permission
//! request answered through troupe's approvals, the binding reused and resumed by the next
//! run (`session/load`), the process stopped with the session (with its dispatch when the
//! dispatch has its own), and a process killed mid-turn started again by the next dispatch.

use super::{Team, agent_kinds, settings};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use troupe_acp::{AcpFactory, RestartPolicy};
use troupe_actors::agents::{AgentProviderFactory, RouterMode};
use troupe_proto::agent::{
    AgentDefinition, AgentUpdateKind, DispatchStatus, ProviderKind, ProviderSpec,
};
use troupe_proto::{AgentError, ApprovalDecision, EventKind, MessageReply, TaskStatus};
use troupe_store::BindingStore;
use troupe_test_support::acp::{codex_acp_bin, write_codex_home};
use troupe_test_support::{ModelServer, Reply};

/// The model server, codex-acp's home pointing at it, and its workspace.
struct Codex {
    server: ModelServer,
    home: tempfile::TempDir,
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
            home,
            work,
            env,
        }
    }

    fn definition(&self) -> AgentDefinition {
        AgentDefinition {
            provider: ProviderSpec::Acp {
                command: codex_acp_bin().display().to_string(),
                args: Vec::new(),
                env: self.env.iter().cloned().collect(),
                cwd: Some(self.work.path().to_path_buf()),
            },
            ..super::model_agent("codex", "", &[])
        }
    }

    async fn team(&self) -> Team {
        self.team_of(self.definition()).await
    }

    async fn team_of(&self, definition: AgentDefinition) -> Team {
        let factory = AcpFactory {
            restart: RestartPolicy {
                min_delay: Duration::from_millis(50),
                max_delay: Duration::from_millis(400),
                factor: 2.0,
            },
            ..AcpFactory::default()
        };
        let factories: Vec<Arc<dyn AgentProviderFactory>> = vec![Arc::new(factory)];
        Team::start_with_factories(
            vec![definition],
            Vec::new(),
            settings(RouterMode::Rules),
            |_| {},
            factories,
        )
        .await
    }

    /// The codex-acp processes of this home that are alive.
    fn pids(&self) -> Vec<u32> {
        let want = format!("CODEX_HOME={}", self.home.path().display());
        let bin = codex_acp_bin();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                let has_home = environ.split(|b| *b == 0).any(|v| v == want.as_bytes());
                let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
                has_home && same_file(&exe, &bin) && alive(*pid)
            })
            .collect()
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p));
    canon(a) == canon(b)
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen in time"))
}

/// Sends `text` to the root conversation from a task of its own.
fn send_later(team: &Team, text: &str) -> tokio::task::JoinHandle<MessageReply> {
    let session = team.session.clone();
    let text = text.to_owned();
    tokio::spawn(async move {
        let root = session.root().await.unwrap();
        session.message(root, &text).await.unwrap()
    })
}

/// A team with the agent of `definition`, and `/hub codex think hard` sent to it from a task
/// of its own: answered with a first chunk, then nothing (the model server stalls).
async fn thinking_hard(
    codex: &Codex,
    definition: AgentDefinition,
) -> (Team, tokio::task::JoinHandle<MessageReply>) {
    codex
        .server
        .push(Reply::text(["thinking", " forever"]).stall_after(4));
    let team = codex.team_of(definition).await;
    let running = send_later(&team, "/hub codex think hard");
    bounded("the first chunk", async {
        while !updates(&team.events().await)
            .iter()
            .any(|(_, t, _)| t == "thinking")
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    (team, running)
}

/// Cancels the root conversation's running task; its message ends `cancelled`.
async fn cancel(team: &Team, running: tokio::task::JoinHandle<MessageReply>) {
    let root = team.session.root().await.unwrap();
    let task = team.session.tasks(Some(root)).await.unwrap().remove(0);
    team.session.cancel_task(task.task_id).await.unwrap();
    let cancelled = bounded("the cancelled reply", running).await.unwrap();
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
}

fn updates(events: &[EventKind]) -> Vec<(AgentUpdateKind, String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::AgentUpdate {
                update,
                text,
                provider_session_id,
                agent_id,
                ..
            } => {
                assert_eq!(agent_id, "codex");
                Some((*update, text.clone(), provider_session_id.clone()))
            }
            _ => None,
        })
        .collect()
}

fn results(events: &[EventKind]) -> Vec<(DispatchStatus, Option<String>)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::DispatchResult {
                status,
                provider_session_id,
                ..
            } => Some((*status, provider_session_id.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_to_codex_streams_its_answer_and_binds_its_session() {
    let codex = Codex::start("never").await;
    codex.server.push(Reply::text(["Hel", "lo", " there"]));
    let team = codex.team().await;
    let reply = team.send("/hub codex say hello").await;
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "Hello there"),
        "{:?}",
        reply.error
    );
    let events = team.events().await;
    assert_eq!(
        agent_kinds(&events),
        [
            "route_decided",
            "dispatch_sent",
            "session_created",
            "session_bound",
            "dispatch_result"
        ]
    );
    let bound = results(&events)[0]
        .1
        .clone()
        .expect("the result names the session");
    assert!(events.iter().any(|e| matches!(e,
        EventKind::SessionBound { provider: ProviderKind::Acp, provider_session_id, .. }
            if *provider_session_id == bound)));
    let chunks: Vec<String> = updates(&events)
        .into_iter()
        .filter(|(kind, _, psid)| *kind == AgentUpdateKind::MessageChunk && *psid == bound)
        .map(|(_, text, _)| text)
        .collect();
    assert_eq!(chunks, ["Hel", "lo", " there"]);
    // The model behind the agent got the dispatched text, not the /hub command.
    let body = codex.server.requests().last().unwrap().body.to_string();
    assert!(
        body.contains("say hello") && !body.contains("/hub"),
        "{body}"
    );
    let stored = team.store.bindings(Some(team.session_id)).await.unwrap();
    assert_eq!(
        (stored[0].provider, stored[0].provider_session_id.as_str()),
        (ProviderKind::Acp, bound.as_str())
    );

    // The next dispatch reuses the bound session in the same process.
    let pids = codex.pids();
    assert_eq!(pids.len(), 1, "one process for the binding");
    codex.server.push(Reply::text(["again"]));
    let again = team.send("/hub codex once more").await;
    assert_eq!(again.text, "again");
    let events = team.events().await;
    assert_eq!(
        agent_kinds(&events)[5..],
        ["route_decided", "dispatch_sent", "dispatch_result"]
    );
    assert_eq!(
        results(&events)[1],
        (DispatchStatus::Ok, Some(bound.clone()))
    );
    let body = codex.server.requests().last().unwrap().body.to_string();
    assert!(
        body.contains("say hello") && body.contains("once more"),
        "{body}"
    );
    assert_eq!(codex.pids(), pids);
    // A listing of the running session names the process.
    let listed = team.session.agents().await.unwrap();
    let health = &listed[0].health;
    assert_eq!(health.status, troupe_proto::agent::HealthStatus::Ok);
    assert_eq!(
        health.detail.as_deref(),
        Some(format!("pid {} ready", pids[0]).as_str())
    );
    assert_eq!(listed[0].bindings[0].provider_session_id, bound);
    team.session.shutdown().await.unwrap();
    assert!(codex.pids().is_empty(), "codex-acp outlived its session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_dispatcher_cancels_the_codex_turn() {
    let codex = Codex::start("never").await;
    let (team, running) = thinking_hard(&codex, codex.definition()).await;
    cancel(&team, running).await;
    // The agent heard session/cancel: its turn ended and it takes the next one at once
    // (a turn still running would make it refuse as busy).
    codex.server.push(Reply::text(["free again"]));
    let next = team.send("/hub codex are you free?").await;
    assert_eq!(
        (next.status, next.text.as_str()),
        (TaskStatus::Ok, "free again"),
        "{:?}",
        next.error
    );
    let statuses: Vec<DispatchStatus> = results(&team.events().await)
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(statuses, [DispatchStatus::Cancelled, DispatchStatus::Ok]);
    assert_eq!(codex.pids().len(), 1, "the same process goes on");
    team.session.shutdown().await.unwrap();
}

/// An agent whose sessions are its dispatches' own (`bindingScope = "dispatch"`) runs each
/// dispatch in a process of its own; a dispatch cancelled mid-turn stops its process then,
/// not when the session ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_dispatch_to_a_per_dispatch_codex_stops_its_process() {
    let codex = Codex::start("never").await;
    let mut definition = codex.definition();
    definition.session.binding_scope = troupe_proto::agent::BindingScope::Dispatch;
    let (team, running) = thinking_hard(&codex, definition).await;
    assert_eq!(codex.pids().len(), 1, "the dispatch's own process");
    cancel(&team, running).await;
    bounded("the process's end", async {
        while !codex.pids().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // The next dispatch gets a process of its own, stopped when it answered.
    codex.server.push(Reply::text(["fresh"]));
    let next = team.send("/hub codex again").await;
    assert_eq!((next.status, next.text.as_str()), (TaskStatus::Ok, "fresh"));
    assert!(codex.pids().is_empty(), "{:?}", codex.pids());
    team.session.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_permission_requests_are_troupe_approvals_of_the_dispatching_task() {
    let codex = Codex::start("untrusted").await;
    let team = codex.team().await;
    let root = team.session.root().await.unwrap();
    for (file, decision) in [
        ("approved.txt", ApprovalDecision::ApproveOnce),
        ("denied.txt", ApprovalDecision::Deny { reason: None }),
    ] {
        codex.server.push(Reply::tool_call(
            "exec_command",
            [format!(r#"{{"cmd":"touch {file}"}}"#)],
        ));
        codex.server.push(Reply::text(["done"]));
        let running = send_later(&team, &format!("/hub codex make {file}"));
        let pending = bounded("the approval request", async {
            loop {
                if let Some(p) = team.session.pending_approvals().await.unwrap().pop() {
                    return p;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        // Asked as the dispatching task: the root conversation's, with the agent named.
        let task = team.session.tasks(Some(root)).await.unwrap().remove(0);
        assert_eq!(
            (pending.conversation_id, pending.task_id),
            (root, Some(task.task_id))
        );
        assert_eq!(
            pending.command,
            ["/bin/bash", "-lc", &format!("touch {file}")]
        );
        assert!(pending.reason.contains("`codex`"), "{}", pending.reason);
        team.session
            .respond_approval(pending.approval_id, decision.clone())
            .await
            .unwrap();
        let reply = bounded("the reply", running).await.unwrap();
        let path = codex.work.path().join(file);
        match decision {
            ApprovalDecision::ApproveOnce => {
                assert_eq!(
                    (reply.status, reply.text.as_str()),
                    (TaskStatus::Ok, "done")
                );
                assert!(path.exists(), "the approved command did not run");
            }
            _ => {
                assert_eq!(reply.status, TaskStatus::Error);
                assert!(
                    matches!(&reply.error, Some(AgentError::ApprovalDenied { command, .. })
                        if command.last().is_some_and(|c| c.contains("denied.txt"))),
                    "{:?}",
                    reply.error
                );
                assert!(!path.exists(), "a refused command ran");
            }
        }
    }
    let events = team.events().await;
    let resolved = events
        .iter()
        .filter(|e| matches!(e, EventKind::ApprovalResolved { .. }))
        .count();
    assert_eq!(resolved, 2);
    let kinds: Vec<AgentUpdateKind> = updates(&events).into_iter().map(|u| u.0).collect();
    assert!(kinds.contains(&AgentUpdateKind::ToolCall), "{kinds:?}");
    assert_eq!(
        results(&events)
            .into_iter()
            .map(|r| r.0)
            .collect::<Vec<_>>(),
        [DispatchStatus::Ok, DispatchStatus::Error]
    );
    team.session.shutdown().await.unwrap();
}

/// Tool governance (A5) over an ACP agent: its file denies `shell`, codex (asking under its
/// `untrusted` approval policy) asks to run `touch`; troupe refuses at once, asks nobody, and
/// says so with `policy_rejected` (live and in the rollout); the command does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_the_codex_agents_policy_denies_is_refused_without_asking_anyone() {
    let codex = Codex::start("untrusted").await;
    let mut definition = codex.definition();
    definition.tools.blacklist = vec!["shell".into()];
    let factory = AcpFactory::default();
    let team = Team::start_with_factories(
        vec![definition],
        Vec::new(),
        settings(RouterMode::Rules),
        |_| {},
        vec![Arc::new(factory) as Arc<dyn AgentProviderFactory>],
    )
    .await;
    let mut live = team.session.subscribe().await.unwrap();
    let root = team.session.root().await.unwrap();
    codex.server.push(Reply::tool_call(
        "exec_command",
        [r#"{"cmd":"touch refused.txt"}"#],
    ));
    codex.server.push(Reply::text(["done"]));
    let reply = bounded(
        "the reply",
        send_later(&team, "/hub codex make refused.txt"),
    )
    .await
    .unwrap();
    // The dispatch fails with the policy's refusal, which names the layer.
    assert_eq!(reply.status, TaskStatus::Error);
    match &reply.error {
        Some(AgentError::PolicyRejected {
            reason, message, ..
        }) => {
            assert_eq!(*reason, troupe_proto::agent::PolicyReason::ToolDenied);
            assert!(
                message.contains("tool `shell` is denied by agent `codex`'s blacklist"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !codex.work.path().join("refused.txt").exists(),
        "a command the policy denies ran"
    );
    assert!(team.session.pending_approvals().await.unwrap().is_empty());
    let is_refusal = |e: &EventKind| {
        matches!(e, EventKind::PolicyRejected { agent_id, tool, reason, chain, message }
            if agent_id == "codex"
                && tool.as_deref() == Some("shell")
                && *reason == troupe_proto::agent::PolicyReason::ToolDenied
                && chain.0.last().map(String::as_str) == Some("codex")
                && message.contains("agent `codex`'s blacklist (`shell`)")
                && message.contains("touch refused.txt"))
    };
    // In the rollout, as the dispatching task's; nobody was asked.
    team.session.flush().await.unwrap();
    let records = team.session.events_after(0, 100_000).await.unwrap();
    let refusals: Vec<_> = records
        .iter()
        .filter(|r| r.event.as_ref().is_some_and(is_refusal))
        .collect();
    assert_eq!(refusals.len(), 1, "{records:?}");
    // The task that dispatched to codex.
    let dispatcher = records
        .iter()
        .find(|r| matches!(r.event, Some(EventKind::DispatchSent { .. })))
        .and_then(|r| r.task_id)
        .expect("the dispatching task");
    assert_eq!(
        (refusals[0].conversation_id, refusals[0].task_id),
        (Some(root), Some(dispatcher))
    );
    assert_eq!(refusals[0].meta.tool.as_deref(), Some("shell"));
    assert!(
        !records.iter().any(|r| matches!(
            r.event,
            Some(EventKind::ApprovalRequested { .. } | EventKind::ApprovalResolved { .. })
        )),
        "an approval was asked"
    );
    // And in the live stream.
    let mut seen = false;
    while let Ok(env) = live.try_recv() {
        if is_refusal(&env.event) {
            assert_eq!(env.task_id, Some(dispatcher));
            seen = true;
        }
    }
    assert!(seen, "no policy_rejected in the event stream");
    // codex asked (it did not run the call on its own): no ungoverned warning.
    assert!(!records.iter().any(|r| matches!(
        &r.event,
        Some(EventKind::Warning { code, .. }) if *code == troupe_proto::WarningCode::UngovernedToolCall
    )));
    team.session.shutdown().await.unwrap();
}

/// codex under its `never` approval policy, with `rules` applied to its agent file, runs
/// `touch <file>` without asking: the file is made (troupe cannot stop it); the events, and
/// the `ungoverned_tool_call` warnings among them.
async fn unasked_touch(
    rules: impl FnOnce(&mut troupe_proto::agent::ToolRules),
    file: &str,
) -> (Vec<EventKind>, Vec<String>) {
    let codex = Codex::start("never").await;
    let mut definition = codex.definition();
    rules(&mut definition.tools);
    let team = Team::start_with_factories(
        vec![definition],
        Vec::new(),
        settings(RouterMode::Rules),
        |_| {},
        vec![Arc::new(AcpFactory::default()) as Arc<dyn AgentProviderFactory>],
    )
    .await;
    codex.server.push(Reply::tool_call(
        "exec_command",
        [format!(r#"{{"cmd":"touch {file}"}}"#).as_str()],
    ));
    codex.server.push(Reply::text(["done"]));
    let reply = bounded(
        "the reply",
        send_later(&team, &format!("/hub codex make {file}")),
    )
    .await
    .unwrap();
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "done")
    );
    assert!(codex.work.path().join(file).exists(), "it ran");
    let events = team.events().await;
    let warnings = events
        .iter()
        .filter_map(|e| match e {
            EventKind::Warning { code, message }
                if *code == troupe_proto::WarningCode::UngovernedToolCall =>
            {
                Some(message.clone())
            }
            _ => None,
        })
        .collect();
    team.session.shutdown().await.unwrap();
    (events, warnings)
}

/// An ACP agent that does not ask (codex under its `never` approval policy) runs a denied
/// tool on its own: troupe cannot stop it, and says so with an `ungoverned_tool_call`
/// warning naming the call and the layer that denies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_tool_codex_runs_without_asking_is_reported_as_ungoverned() {
    let (events, warnings) =
        unasked_touch(|t| t.blacklist = vec!["shell".into()], "unasked.txt").await;
    assert_eq!(warnings.len(), 1, "{events:?}");
    assert!(
        warnings[0].contains("ACP agent `codex` ran a tool call troupe did not allow")
            && warnings[0].contains("tool `shell` is denied by agent `codex`'s blacklist")
            && warnings[0].contains("kind `execute`"),
        "{}",
        warnings[0]
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, EventKind::PolicyRejected { .. })),
        "nothing was refused"
    );
}

/// A tool that runs only with an authorization token, which codex (under `never`) runs
/// without asking: no token was used, and troupe says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_needs_a_token_codex_runs_without_asking_is_reported_as_ungoverned() {
    let (events, warnings) = unasked_touch(
        |t| t.authorization_required = vec!["shell".into()],
        "untokened.txt",
    )
    .await;
    assert_eq!(warnings.len(), 1, "{events:?}");
    assert!(
        warnings[0].contains("tool `shell` needs an authorization token")
            && warnings[0].contains("no token was used"),
        "{}",
        warnings[0]
    );
}

/// A shell call codex asks about, which its agent file lists `authorizationRequired`: the
/// dispatcher's token (for `codex`, `shell`, `touch tokened*`, one use) lets it on to the
/// approval; the next call finds the use spent and is refused `unauthorized` without asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_call_that_needs_a_token_uses_the_dispatchers_token() {
    use troupe_actors::token_book;
    use troupe_proto::governance::{IssueToken, MessageOptions, TokenScope};
    let codex = Codex::start("untrusted").await;
    let mut definition = codex.definition();
    definition.tools.authorization_required = vec!["shell".into()];
    let book = token_book::spawn(Arc::new(troupe_store::memory::MemoryStore::new()))
        .await
        .unwrap();
    let issued = token_book::issue(
        &book,
        IssueToken {
            scope: TokenScope {
                agent: "codex".into(),
                tool: "shell".into(),
                args: Some("touch tokened*".into()),
                fields: Default::default(),
            },
            ttl_secs: 600,
            max_uses: 1,
            issued_by: None,
        },
    )
    .await
    .unwrap();
    let team = Team::start_with_factories_extra(
        vec![definition],
        vec![Arc::new(AcpFactory::default()) as Arc<dyn AgentProviderFactory>],
        super::Extras {
            token_book: Some(book.clone()),
            exec: false,
            ..Default::default()
        },
    )
    .await;
    let root = team.session.root().await.unwrap();
    let send = |text: String| {
        let session = team.session.clone();
        let options = MessageOptions {
            tools: None,
            authorization: vec![issued.token.clone()],
        };
        tokio::spawn(async move { session.message_with(root, &text, options).await.unwrap() })
    };
    // With the token: on to the approval, approved, run.
    codex.server.push(Reply::tool_call(
        "exec_command",
        [r#"{"cmd":"touch tokened.txt"}"#],
    ));
    codex.server.push(Reply::text(["done"]));
    let running = send("/hub codex make tokened.txt".into());
    let pending = bounded("the approval request", async {
        loop {
            if let Some(p) = team.session.pending_approvals().await.unwrap().pop() {
                return p;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    team.session
        .respond_approval(pending.approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    let reply = bounded("the reply", running).await.unwrap();
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "done")
    );
    assert!(codex.work.path().join("tokened.txt").exists());
    // Its one use is spent: refused at once, nobody asked, nothing run.
    codex.server.push(Reply::tool_call(
        "exec_command",
        [r#"{"cmd":"touch tokened-again.txt"}"#],
    ));
    codex.server.push(Reply::text(["done"]));
    let reply = bounded(
        "the reply",
        send("/hub codex make tokened-again.txt".into()),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, TaskStatus::Error);
    assert!(
        matches!(&reply.error, Some(AgentError::PolicyRejected { reason, message, .. })
            if *reason == troupe_proto::agent::PolicyReason::Unauthorized
                && message.contains("tool `shell` needs an authorization token")),
        "{:?}",
        reply.error
    );
    assert!(!codex.work.path().join("tokened-again.txt").exists());
    let events = team.events().await;
    let asked = events
        .iter()
        .filter(|e| matches!(e, EventKind::ApprovalRequested { .. }))
        .count();
    assert_eq!(asked, 1, "only the call with a token was asked about");
    assert!(events.iter().any(|e| matches!(e,
        EventKind::PolicyRejected { agent_id, reason, tool, .. }
            if agent_id == "codex"
                && *reason == troupe_proto::agent::PolicyReason::Unauthorized
                && tool.as_deref() == Some("shell"))));
    team.session.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_run_loads_the_bound_codex_session() {
    let codex = Codex::start("never").await;
    codex.server.push(Reply::text(["first answer"]));
    let team = codex.team().await;
    let first = team.send("/hub codex remember the word pelican").await;
    assert_eq!(first.text, "first answer");
    let bound = team.store.bindings(None).await.unwrap().remove(0);

    // Another run of the session: its hub starts a new process, which loads the session.
    let team = team.restart(Vec::new()).await;
    assert!(
        codex.pids().is_empty(),
        "the first run's process was stopped"
    );
    codex.server.push(Reply::text(["second answer"]));
    let second = team.send("/hub codex which word?").await;
    assert_eq!(second.text, "second answer", "{:?}", second.error);
    let events = team.events().await;
    let resumed: Vec<&EventKind> = events
        .iter()
        .filter(|e| matches!(e, EventKind::SessionResumed { .. }))
        .collect();
    assert!(
        matches!(resumed.as_slice(), [EventKind::SessionResumed { provider: ProviderKind::Acp, provider_session_id, .. }]
            if *provider_session_id == bound.provider_session_id),
        "{:?}",
        agent_kinds(&events)
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, EventKind::SessionCreated { .. }))
            .count(),
        1,
        "the second run opened nothing"
    );
    // The model got the earlier exchange with the new question.
    let body = codex.server.requests().last().unwrap().body.to_string();
    assert!(
        body.contains("pelican") && body.contains("first answer") && body.contains("which word?"),
        "{body}"
    );
    team.session.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_process_killed_mid_turn_fails_its_dispatch_and_the_next_starts_it_again() {
    let codex = Codex::start("never").await;
    codex.server.push(Reply::text(["warm"]));
    let team = codex.team().await;
    assert_eq!(team.send("/hub codex warm up").await.text, "warm");
    let bound = team.store.bindings(None).await.unwrap().remove(0);
    // The next answer stalls after its first text.
    codex
        .server
        .push(Reply::text(["partial", " never"]).stall_after(4));
    let running = send_later(&team, "/hub codex go on");
    bounded("the first chunk", async {
        loop {
            let events = team.events().await;
            if updates(&events).iter().any(|(_, t, _)| t == "partial") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let pids = codex.pids();
    assert_eq!(pids.len(), 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pids[0]).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let failed = bounded("the failed reply", running).await.unwrap();
    assert_eq!(failed.status, TaskStatus::Error);
    let error = failed.error.unwrap();
    assert!(
        matches!(error, AgentError::Interrupted { .. })
            && error.to_string().contains("exited during session/prompt"),
        "{error}"
    );

    // The next dispatch starts a new process, which loads the same session.
    codex.server.push(Reply::text(["back"]));
    let back = team.send("/hub codex are you back?").await;
    assert_eq!(
        (back.status, back.text.as_str()),
        (TaskStatus::Ok, "back"),
        "{:?}",
        back.error
    );
    let now = codex.pids();
    assert_eq!(now.len(), 1);
    assert_ne!(now, pids);
    let events = team.events().await;
    assert_eq!(
        results(&events),
        [
            (DispatchStatus::Ok, Some(bound.provider_session_id.clone())),
            (
                DispatchStatus::Error,
                Some(bound.provider_session_id.clone())
            ),
            (DispatchStatus::Ok, Some(bound.provider_session_id.clone())),
        ]
    );
    assert!(
        updates(&events)
            .iter()
            .any(|(kind, text, _)| *kind == AgentUpdateKind::Status
                && text.contains("started again")),
        "{:?}",
        updates(&events)
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, EventKind::Warning { .. })),
        "the binding was kept"
    );
    team.session.shutdown().await.unwrap();
}

/// A reload that changes an external agent's provider (A7) retires the old provider: once no
/// dispatch holds it, its codex-acp process is stopped, and the next dispatch starts one for
/// the new definition, which loads the bound session. Edits never pile up processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_a_reload_replaced_stops_its_process() {
    let codex = Codex::start("never").await;
    let first = codex.definition();
    let catalog = |def: &AgentDefinition| {
        Arc::new(troupe_proto::agent::AgentCatalog {
            agents: [(def.id.clone(), def.clone())].into_iter().collect(),
            ..Default::default()
        })
    };
    let (edits, live) = tokio::sync::watch::channel(catalog(&first));
    let factory = AcpFactory::default();
    let team = Team::start_with_factories_extra(
        vec![first.clone()],
        vec![Arc::new(factory) as Arc<dyn AgentProviderFactory>],
        super::Extras {
            live: Some(live),
            ..Default::default()
        },
    )
    .await;
    codex.server.push(Reply::text(["first answer"]));
    let reply = team.send("/hub codex remember the word pelican").await;
    assert_eq!(reply.text, "first answer", "{:?}", reply.error);
    let before = codex.pids();
    assert_eq!(before.len(), 1, "one process for the binding");

    // The file is edited: another environment variable for the agent's process.
    let mut edited = first.clone();
    if let ProviderSpec::Acp { env, .. } = &mut edited.provider {
        env.insert("TROUPE_TEST_EDIT".into(), "2".into());
    }
    edits.send(catalog(&edited)).unwrap();
    bounded("the retired process stops", async {
        while codex.pids().iter().any(|pid| before.contains(pid)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    codex.server.push(Reply::text(["second answer"]));
    let again = team.send("/hub codex which word?").await;
    assert_eq!(again.text, "second answer", "{:?}", again.error);
    let after = codex.pids();
    assert_eq!(after.len(), 1, "one process again: {after:?}");
    assert!(!before.contains(&after[0]));
    let body = codex.server.requests().last().unwrap().body.to_string();
    assert!(body.contains("pelican"), "the binding was loaded: {body}");
    team.session.shutdown().await.unwrap();
    assert!(codex.pids().is_empty());
}
