//! A warm ACP turn against codex-acp (pointed at the loopback model server): through troupe's
//! client (`troupe_acp::AcpAgent`: supervisor actor, operation task, event stream) and through
//! a minimal direct client on the same crate (one connection, prompt, wait for the result).
//! Prints one table row per client and the ratio of the medians.
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
use troupe_test_support::ModelServer;
use troupe_test_support::acp::{codex_acp_bin, write_codex_home};

const WARMUP: usize = 5;
const RUNS: usize = 40;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn row(name: &str, mut t: Vec<Duration>) -> Duration {
    t.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| {name} | {RUNS} | {:.1} ms | {:.1} ms | {:.1} ms |",
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
        // Alternated, so that neither gets a warmer agent or model server.
        let d1 = direct(&command).await;
        let t1 = through_troupe(&command).await;
        let d2 = direct(&command).await;
        let t2 = through_troupe(&command).await;
        let direct = row("direct (agent-client-protocol)", [d1, d2].concat());
        let troupe = row("troupe AcpAgent", [t1, t2].concat());
        println!(
            "\nratio of medians (troupe / direct): {:.3}",
            troupe.as_secs_f64() / direct.as_secs_f64()
        );
    });
}
