//! A warm ACP turn against codex-acp (pointed at the loopback model server) three ways:
//! - direct: a minimal client on the same crate (one connection, prompt, wait for the result);
//! - troupe's client alone (`troupe_acp::AcpAgent`: supervisor actor, operation task, event
//!   stream drained by a task);
//! - through a troupe session: `/hub codex hi` to the root conversation of a session whose
//!   hub holds codex-acp as an ACP agent (the user's task routes, the hub admits, leases and
//!   binds the dispatch, the ACP provider prompts the bound session, its updates become
//!   `agent_update` events, the answer comes back as the task's reply).
//!
//! Prints one table row per way and the ratios of the medians to the direct client.
//!
//!     scripts/install-acp-agents && cargo bench -p troupe-tests --bench acp_turn
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema as acp;
use agent_client_protocol::{Agent, ByteStreams, Client};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use troupe_acp::{
    AcpAgent, AcpAgentSpec, AgentCommand, FixedPermissions, PermissionDecision, StopReason, Turn,
};
use troupe_actors::agents::{AgentPorts, AgentSettings, RouterMode};
use troupe_actors::history::LocalSummarizer;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::SessionId;
use troupe_proto::agent::{AgentCatalog, AgentDefinition};
use troupe_test_support::ModelServer;
use troupe_test_support::acp::{codex_acp_bin, write_codex_home};

const WARMUP: usize = 5;
/// Measured turns per round and way.
const RUNS: usize = 40;
/// Rounds, each running the three ways one after the other.
const ROUNDS: usize = 3;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn row(name: &str, mut t: Vec<Duration>) -> Duration {
    t.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| {name} | {} | {:.1} ms | {:.1} ms | {:.1} ms |",
        t.len(),
        ms(percentile(&t, 0.5)),
        ms(percentile(&t, 0.9)),
        ms(*t.last().unwrap())
    );
    percentile(&t, 0.5)
}

async fn through_troupe(command: &AgentCommand) -> Vec<Duration> {
    let agent = AcpAgent::spawn(AcpAgentSpec::new("bench", command.clone()))
        .await
        .unwrap();
    agent.open_session(None).await.unwrap();
    let permissions = Arc::new(FixedPermissions(PermissionDecision::RejectOnce));
    let mut times = Vec::new();
    for i in 0..WARMUP + RUNS {
        let (tx, mut rx) = mpsc::channel(1024);
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let t = Instant::now();
        let out = agent
            .prompt(Turn {
                text: "hi".into(),
                events: Some(tx),
                permissions: permissions.clone(),
            })
            .await
            .unwrap();
        let took = t.elapsed();
        assert_eq!(out.stop_reason, StopReason::EndTurn);
        drain.await.unwrap();
        if i >= WARMUP {
            times.push(took);
        }
    }
    agent.shutdown().await;
    times
}

async fn through_hub(command: &AgentCommand) -> Vec<Duration> {
    let codex: AgentDefinition = serde_json::from_value(serde_json::json!({
        "id": "codex", "role": "executor",
        "provider": {
            "type": "acp",
            "command": command.command,
            "args": command.args,
            "env": command.env,
            "cwd": command.cwd,
        }
    }))
    .unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = SessionConfig {
        data_dir: data.path().to_path_buf(),
        ..SessionConfig::default()
    };
    let ports = SessionPorts {
        model: Arc::new(troupe_runtime::ScriptedModel::default()),
        mcp: None,
        mcp_connector: None,
        exec: None,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: None,
        agents: Some(AgentPorts {
            catalog: Arc::new(AgentCatalog {
                agents: [(codex.id.clone(), codex)].into_iter().collect(),
                ..AgentCatalog::default()
            }),
            settings: AgentSettings {
                router: RouterMode::Rules,
                ..AgentSettings::default()
            },
            factories: troupe_runtime::agents::factories(),
            models: Default::default(),
            bindings: Arc::new(troupe_store::memory::MemoryStore::new()),
            live: None,
        }),
    };
    let (session, join) = SessionHandle::start(SessionId::new(), config, ports)
        .await
        .unwrap();
    let root = session.root().await.unwrap();
    let mut times = Vec::new();
    for i in 0..WARMUP + RUNS {
        let t = Instant::now();
        let reply = session.message(root, "/hub codex hi").await.unwrap();
        let took = t.elapsed();
        assert_eq!(reply.status, troupe_proto::TaskStatus::Ok, "{reply:?}");
        if i >= WARMUP {
            times.push(took);
        }
    }
    session.shutdown().await.unwrap();
    let _ = join.await;
    times
}

async fn direct(command: &AgentCommand) -> Vec<Duration> {
    let mut child = tokio::process::Command::new(&command.command)
        .envs(&command.env)
        .current_dir(command.cwd.as_ref().unwrap())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let cwd = command.cwd.clone().unwrap();
    let times = Client
        .v1()
        .on_receive_notification(
            async move |n: acp::SessionNotification, _cx| {
                std::hint::black_box(n);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(
            ByteStreams::new(stdin.compat_write(), stdout.compat()),
            async move |cx: ConnectionTo<Agent>| {
                cx.send_request(acp::InitializeRequest::new(ProtocolVersion::V1))
                    .block_task()
                    .await?;
                let session = cx
                    .send_request(acp::NewSessionRequest::new(cwd))
                    .block_task()
                    .await?
                    .session_id;
                let mut times = Vec::new();
                for i in 0..WARMUP + RUNS {
                    let t = Instant::now();
                    let r = cx
                        .send_request(acp::PromptRequest::new(
                            session.clone(),
                            vec![acp::ContentBlock::from("hi")],
                        ))
                        .block_task()
                        .await?;
                    let took = t.elapsed();
                    assert_eq!(r.stop_reason, acp::StopReason::EndTurn);
                    if i >= WARMUP {
                        times.push(took);
                    }
                }
                Ok(times)
            },
        )
        .await
        .unwrap();
    let _ = child.start_kill();
    let _ = child.wait().await;
    times
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let server = ModelServer::start().await;
        let home = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let env = write_codex_home(home.path(), &server.base_url(), "never").unwrap();
        let command = AgentCommand {
            command: codex_acp_bin().display().to_string(),
            args: Vec::new(),
            env: env.into_iter().collect(),
            cwd: Some(work.path().to_path_buf()),
        };
        println!("| client | turns | p50 | p90 | max |");
        println!("|---|---:|---:|---:|---:|");
        // Alternated, so that none gets a warmer agent or model server.
        let (mut d, mut t, mut h) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            d.extend(direct(&command).await);
            t.extend(through_troupe(&command).await);
            h.extend(through_hub(&command).await);
        }
        let direct = row("direct (agent-client-protocol)", d);
        let troupe = row("troupe AcpAgent", t);
        let hub = row("troupe session, /hub codex", h);
        println!(
            "\nratio of medians to direct: AcpAgent {:.3}, /hub through a session {:.3}",
            troupe.as_secs_f64() / direct.as_secs_f64(),
            hub.as_secs_f64() / direct.as_secs_f64()
        );
    });
}
