//! One run of an external ACP agent: the child process (its own process group, stdin/stdout
//! the JSON-RPC wire, stderr to the log), the client side of the connection over it, and the
//! `initialize` handshake. What arrives from the agent (session updates, permission requests)
//! goes, in wire order, into one channel that the current operation reads ([`Inbound`]).
//!
//! A watcher task owns the `Child`: it reaps it, publishes how it ended on a watch channel and
//! tells the supervisor. [`terminate`] stops a run: SIGTERM to the process group, SIGKILL
//! after the grace period (some agents, codex-acp among them, do not exit when stdin closes).

use crate::error::AcpError;
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema as acp;
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, ByteStreams, Client};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// How to start the agent's program.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct AgentCommand {
    /// The program (a path, or a name looked up on `PATH`).
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Added to troupe's own environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The process's working directory (troupe's own when unset); also the `cwd` of the
    /// sessions it opens.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
}

impl AgentCommand {
    /// The command line, for messages.
    pub fn display(&self) -> String {
        std::iter::once(self.command.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What the agent sends on its own, in wire order.
pub(crate) enum Inbound {
    Update(acp::SessionNotification),
    Permission {
        request: acp::RequestPermissionRequest,
        responder: Responder<acp::RequestPermissionResponse>,
    },
}

/// How a run's process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exit {
    /// `exit status 1`, `signal 9 (SIGKILL)`, ...
    pub status: String,
    /// Its last stderr lines, joined.
    pub stderr: String,
    /// When it was seen ended (a restart's backoff counts from the crash).
    pub at: tokio::time::Instant,
}

/// A started agent: its connection, its handshake result, and the means to stop it.
pub(crate) struct Run {
    pub generation: u64,
    pub pid: u32,
    pub conn: ConnectionTo<Agent>,
    pub init: acp::InitializeResponse,
    /// Everything the agent sends on its own; read by one operation at a time.
    pub inbound: mpsc::UnboundedReceiver<Inbound>,
    pub exited: watch::Receiver<Option<Exit>>,
    /// Ends the connection's task (dropped or sent: the same).
    _stop: oneshot::Sender<()>,
}

/// Lines of stderr kept for the message of a crash.
const STDERR_TAIL: usize = 8;

/// Starts the program and runs the `initialize` handshake (within `handshake_timeout`).
/// `on_exit` is called once, when the process has ended and been reaped.
pub(crate) async fn launch(
    agent_id: &str,
    command: &AgentCommand,
    generation: u64,
    handshake_timeout: Duration,
    on_exit: impl FnOnce(Exit) + Send + 'static,
) -> Result<Run, AcpError> {
    let mut cmd = tokio::process::Command::new(&command.command);
    cmd.args(&command.args)
        .envs(&command.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group: a stop reaches the commands it runs too.
        .process_group(0)
        // The last resort if troupe itself goes away without stopping it.
        .kill_on_drop(true);
    if let Some(cwd) = &command.cwd {
        cmd.current_dir(cwd);
    }
    let spawn_error = |message: String| AcpError::Spawn {
        command: command.display(),
        message,
    };
    let mut child = cmd.spawn().map_err(|e| spawn_error(e.to_string()))?;
    let pid = child
        .id()
        .ok_or_else(|| spawn_error("the process ended at once".into()))?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(spawn_error("its stdio pipes are missing".into()));
    };

    let stderr_task = tokio::spawn(read_stderr(agent_id.to_owned(), stderr));
    let (exit_tx, exited) = watch::channel(None);
    tokio::spawn(async move {
        let status = match child.wait().await {
            Ok(status) => describe_status(status),
            Err(e) => format!("unknown status ({e})"),
        };
        // The pipe closes with the process (unless a grandchild holds it): bounded wait.
        let stderr = tokio::time::timeout(Duration::from_millis(500), stderr_task)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let exit = Exit {
            status,
            stderr,
            at: tokio::time::Instant::now(),
        };
        let _ = exit_tx.send(Some(exit.clone()));
        on_exit(exit);
    });

    let (inbound_tx, inbound) = mpsc::unbounded_channel();
    let (conn_tx, conn_rx) = oneshot::channel();
    let (stop, stop_rx) = oneshot::channel::<()>();
    let updates = inbound_tx.clone();
    let builder = Client
        .v1()
        .name("troupe")
        .on_receive_notification(
            // Runs in the connection's dispatch loop: a session's updates are queued in wire
            // order, before the response that follows them is delivered.
            async move |n: acp::SessionNotification, _cx| {
                let _ = updates.send(Inbound::Update(n));
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            // Queued, not answered here: the answer may wait for a human, and the dispatch
            // loop must go on meanwhile. A responder dropped unanswered answers an error.
            async move |request: acp::RequestPermissionRequest, responder, _cx| {
                let _ = inbound_tx.send(Inbound::Permission { request, responder });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        );
    let transport = ByteStreams::new(stdin.compat_write(), stdout.compat());
    let agent = agent_id.to_owned();
    tokio::spawn(async move {
        let result = builder
            .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
                let _ = conn_tx.send(cx.clone());
                tokio::select! {
                    _ = stop_rx => {}
                    () = cx.incoming_closed() => {}
                }
                Ok(())
            })
            .await;
        if let Err(error) = result {
            tracing::debug!(agent, %error, "ACP connection ended with an error");
        }
    });
    let conn = conn_rx
        .await
        .map_err(|_| spawn_error("the connection did not start".into()))?;

    let request = acp::InitializeRequest::new(ProtocolVersion::V1).client_info(
        acp::Implementation::new("troupe", env!("CARGO_PKG_VERSION")),
    );
    let init = tokio::select! {
        r = tokio::time::timeout(handshake_timeout, conn.send_request(request).block_task()) => r,
        exit = wait_exit(exited.clone()) => {
            // What it started before it ended goes with it.
            signal_group(pid, Signal::SIGKILL);
            return Err(AcpError::Exited { during: "initialize", status: exit.status, stderr: exit.stderr });
        }
    };
    let init = match init {
        Ok(Ok(init)) => init,
        Ok(Err(e)) => {
            signal_group(pid, Signal::SIGKILL);
            return Err(AcpError::Handshake { message: e.message });
        }
        Err(_) => {
            signal_group(pid, Signal::SIGKILL);
            return Err(AcpError::Handshake {
                message: format!("no answer to `initialize` within {handshake_timeout:?}"),
            });
        }
    };
    Ok(Run {
        generation,
        pid,
        conn,
        init,
        inbound,
        exited,
        _stop: stop,
    })
}

/// Waits until the run's process has ended.
pub(crate) async fn wait_exit(mut exited: watch::Receiver<Option<Exit>>) -> Exit {
    match exited.wait_for(Option::is_some).await {
        Ok(exit) => exit.clone().unwrap_or_else(unknown_exit),
        Err(_) => unknown_exit(),
    }
}

fn unknown_exit() -> Exit {
    Exit {
        status: "unknown status".into(),
        stderr: String::new(),
        at: tokio::time::Instant::now(),
    }
}

/// How [`terminate`] ended a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stopped {
    /// It had already ended.
    AlreadyExited,
    /// It ended within the grace period after SIGTERM.
    Terminated,
    /// It was still running after the grace period: SIGKILL.
    Killed,
}

/// SIGTERM to the run's process group, then SIGKILL if it is still there after `grace`;
/// returns once the process is reaped. Whatever the agent started in its group goes too, also
/// when the agent itself had already ended or ended on SIGTERM: its group is killed then.
pub(crate) async fn terminate(
    pid: u32,
    exited: watch::Receiver<Option<Exit>>,
    grace: Duration,
) -> Stopped {
    if exited.borrow().is_some() {
        signal_group(pid, Signal::SIGKILL);
        return Stopped::AlreadyExited;
    }
    signal_group(pid, Signal::SIGTERM);
    if tokio::time::timeout(grace, wait_exit(exited.clone()))
        .await
        .is_ok()
    {
        signal_group(pid, Signal::SIGKILL);
        return Stopped::Terminated;
    }
    signal_group(pid, Signal::SIGKILL);
    wait_exit(exited).await;
    Stopped::Killed
}

/// SIGKILL to the run's process group, without waiting.
pub(crate) fn kill_group(pid: u32) {
    signal_group(pid, Signal::SIGKILL);
}

fn signal_group(pid: u32, signal: Signal) {
    let Ok(raw) = i32::try_from(pid) else { return };
    // ESRCH (already gone) is what we wanted anyway.
    let _ = killpg(Pid::from_raw(raw), signal);
}

fn describe_status(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(s) => format!("signal {sig} ({})", s.as_str()),
            Err(_) => format!("signal {sig}"),
        },
        (None, None) => "unknown status".into(),
    }
}

/// Logs the agent's stderr line by line; returns its last lines once it closes.
async fn read_stderr(agent: String, stderr: tokio::process::ChildStderr) -> String {
    let mut lines = BufReader::new(stderr).lines();
    let mut tail = VecDeque::with_capacity(STDERR_TAIL);
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(target: "troupe_acp::agent_stderr", agent, "{line}");
        if tail.len() == STDERR_TAIL {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    Vec::from(tail).join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `pid` still runs (a zombie, waiting for its reaper, does not).
    fn running(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let after = stat.rsplit_once(')')?.1;
                after.split_whitespace().next().map(|state| state != "Z")
            })
            .unwrap_or(false)
    }

    /// An agent that ended (or ends on SIGTERM) leaves nothing of its group running: the
    /// command it started in the background is killed too.
    #[tokio::test]
    async fn a_stop_kills_what_the_agent_left_in_its_group() {
        for ends_itself in [true, false] {
            let script = if ends_itself {
                "sleep 600 </dev/null >/dev/null 2>&1 & echo $!; exit 0"
            } else {
                // The agent ends on SIGTERM; its command ignores it.
                "trap 'exit 0' TERM; sh -c 'trap \"\" TERM; exec sleep 600' \
                 </dev/null >/dev/null 2>&1 & echo $!; while :; do sleep 1; done"
            };
            let mut child = tokio::process::Command::new("sh")
                .args(["-c", script])
                .stdout(Stdio::piped())
                .process_group(0)
                .spawn()
                .unwrap();
            let pid = child.id().unwrap();
            let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
            let background: u32 = out.next_line().await.unwrap().unwrap().parse().unwrap();
            assert!(running(background));
            let (tx, rx) = watch::channel(None);
            let reaper = tokio::spawn(async move {
                let status = child.wait().await.unwrap();
                let _ = tx.send(Some(Exit {
                    status: describe_status(status),
                    stderr: String::new(),
                    at: tokio::time::Instant::now(),
                }));
            });
            if ends_itself {
                wait_exit(rx.clone()).await;
            }
            let stopped = terminate(pid, rx, Duration::from_secs(5)).await;
            assert_eq!(
                stopped,
                if ends_itself {
                    Stopped::AlreadyExited
                } else {
                    Stopped::Terminated
                }
            );
            reaper.await.unwrap();
            let t0 = std::time::Instant::now();
            while running(background) {
                if t0.elapsed() > Duration::from_secs(5) {
                    let _ = nix::sys::signal::kill(
                        Pid::from_raw(i32::try_from(background).unwrap()),
                        Signal::SIGKILL,
                    );
                    panic!("{background} outlived its agent (ends itself: {ends_itself})");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}
