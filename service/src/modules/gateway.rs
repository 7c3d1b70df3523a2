//! StdioGateway: one stdio module's resident process, supervised.
//!
//! The actor starts the module's program with piped stdin and stdout and owns what talks to
//! it: a writer task (lines to its stdin), a reader task (its stdout, one frame a line, back
//! to the actor as [`GatewayMsg::Line`]), a task that logs its stderr, and a waiter that
//! reports its exit ([`GatewayMsg::Exited`]). Each process has a generation; what an older
//! one reports is ignored.
//!
//! Mailbox: `Write` puts a frame on its stdin (with an acknowledgement to wait for, kept by
//! id until the module's `ack` line answers it); `Line` is what the module wrote: an `ack`
//! resolves its waiter, a `message` goes to the module's feeder (its input is fed into a
//! session in order), anything else is answered with an `error` frame. `Probe` writes a
//! `ping` every health interval; one not acknowledged within the probe's timeout kills the
//! process.
//!
//! When the process exits (or is killed), every acknowledgement it owed fails at once, and
//! [`plan::after_exit`] decides: start it again after a backoff, or, past `max_restarts`
//! within the restart window, leave it down (`troupe_module_up` 0, health `failed`).
//! Stopping the actor closes the module's stdin, gives it a moment to exit, then kills it.
//! Each process leads its own process group, and kills reach the whole group.

use super::frame::{self, Incoming, InputMessage};
use super::{metrics, plan};
use futures::StreamExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;
use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use troupe_runtime::modules::ModuleDefinition;

/// How long a stopping module may take to exit once its stdin is closed.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// An acknowledgement's waiter: the module's `result`, or why there is none.
pub type AckWaiter = oneshot::Sender<Result<Option<Value>, String>>;

pub struct StdioGateway;

pub struct GatewayArgs {
    pub def: Arc<ModuleDefinition>,
    /// Where the module's input messages go (`None`: it is an output module).
    pub feeder: Option<mpsc::Sender<InputMessage>>,
}

/// A gateway's state as `modules.list` and the health endpoint show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GatewayStatus {
    /// Its process runs.
    pub up: bool,
    /// Past its restart budget: it stays down until troupe restarts.
    pub given_up: bool,
    /// Starts after the first.
    pub restarts: u64,
    /// How its last process ended.
    pub last_exit: Option<String>,
}

pub enum GatewayMsg {
    /// Writes `frame` on the module's stdin; with `ack`, the module's acknowledgement of that
    /// id answers the waiter. Answers once written (or why it could not be).
    Write {
        frame: Value,
        ack: Option<(String, AckWaiter)>,
        reply: RpcReplyPort<Result<(), String>>,
    },
    /// A line the process of `generation` wrote.
    Line { generation: u64, line: String },
    /// The process of `generation` exited.
    Exited { generation: u64, status: String },
    /// The process of `generation` wrote a line longer than [`MAX_LINE`] (skipped).
    TooLong { generation: u64 },
    /// Its stdout of `generation` ended or cannot be read any more.
    ReaderEnded { generation: u64 },
    /// Time to start the process again.
    Restart,
    /// Time to probe its health.
    Probe,
    /// The process answered its probe.
    Probed,
    /// The process of `generation` did not answer its probe.
    ProbeFailed { generation: u64, why: String },
    /// Its state.
    Status { reply: RpcReplyPort<GatewayStatus> },
}

/// The running process, as the actor reaches it.
struct Running {
    lines: mpsc::Sender<String>,
    /// Kills the process (its waiter reports the exit).
    kill: Option<oneshot::Sender<()>>,
    /// Fires when the process has exited.
    done: oneshot::Receiver<()>,
}

pub struct GatewayState {
    def: Arc<ModuleDefinition>,
    feeder: Option<mpsc::Sender<InputMessage>>,
    process: Option<Running>,
    generation: u64,
    /// Acknowledgements owed by the running process, by frame id.
    pending: HashMap<String, AckWaiter>,
    /// When the process was started again, within the restart window.
    restarts: Vec<Instant>,
    restarted: u64,
    given_up: bool,
    last_exit: Option<String>,
    /// A probe is out: no second one until it is answered or failed.
    probing: bool,
}

#[ractor::async_trait]
impl Actor for StdioGateway {
    type Msg = GatewayMsg;
    type State = GatewayState;
    type Arguments = GatewayArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: GatewayArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut state = GatewayState {
            def: args.def,
            feeder: args.feeder,
            process: None,
            generation: 0,
            pending: HashMap::new(),
            restarts: Vec::new(),
            restarted: 0,
            given_up: false,
            last_exit: None,
            probing: false,
        };
        state.start(&myself);
        if let Some(health) = &state.def.health {
            myself.send_interval(health.interval, || GatewayMsg::Probe);
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: GatewayMsg,
        state: &mut GatewayState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            GatewayMsg::Write { frame, ack, reply } => {
                let _ = reply.send(state.write(frame, ack));
            }
            GatewayMsg::Line { generation, line } if generation == state.generation => {
                state.line(&line);
            }
            GatewayMsg::Line { .. } => {}
            GatewayMsg::Exited { generation, status } if generation == state.generation => {
                state.exited(&myself, status);
            }
            GatewayMsg::Exited { .. } => {}
            GatewayMsg::TooLong { generation } if generation == state.generation => {
                tracing::warn!(module = %state.def.id, "module wrote a line over {MAX_LINE} bytes; skipped");
                let message = format!("a line longer than {MAX_LINE} bytes is not read");
                let _ = state.write(frame::refused(None, "invalid_input", &message), None);
            }
            GatewayMsg::TooLong { .. } => {}
            GatewayMsg::ReaderEnded { generation } if generation == state.generation => {
                if let Some(process) = &mut state.process
                    && let Some(kill) = process.kill.take()
                {
                    let _ = kill.send(());
                }
            }
            GatewayMsg::ReaderEnded { .. } => {}
            GatewayMsg::Restart => {
                state.restarts.push(Instant::now());
                state.restarted += 1;
                state.start(&myself);
            }
            GatewayMsg::Probe => state.probe(&myself),
            GatewayMsg::Probed => state.probing = false,
            GatewayMsg::ProbeFailed { generation, why } => {
                state.probing = false;
                if generation == state.generation
                    && let Some(process) = &mut state.process
                {
                    tracing::warn!(module = %state.def.id, %why, "module failed its health probe; restarting it");
                    if let Some(kill) = process.kill.take() {
                        let _ = kill.send(());
                    }
                }
            }
            GatewayMsg::Status { reply } => {
                let _ = reply.send(GatewayStatus {
                    up: state.process.is_some(),
                    given_up: state.given_up,
                    restarts: state.restarted,
                    last_exit: state.last_exit.clone(),
                });
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut GatewayState,
    ) -> Result<(), ActorProcessingErr> {
        metrics::up(&state.def, false);
        let Some(mut process) = state.process.take() else {
            return Ok(());
        };
        // Its stdin closes: a module that reads until EOF ends by itself; else it is killed.
        drop(process.lines);
        let done = &mut process.done;
        if tokio::time::timeout(STOP_GRACE, &mut *done).await.is_err() {
            if let Some(kill) = process.kill.take() {
                let _ = kill.send(());
            }
            let _ = tokio::time::timeout(STOP_GRACE, done).await;
        }
        tracing::info!(module = %state.def.id, "module stopped");
        Ok(())
    }
}

impl GatewayState {
    /// Starts a process of the next generation; a start that fails is handled as an exit.
    fn start(&mut self, myself: &ActorRef<GatewayMsg>) {
        self.generation += 1;
        match spawn(&self.def, myself, self.generation) {
            Ok(running) => {
                tracing::info!(module = %self.def.id, generation = self.generation, "module started");
                if self.generation > 1 {
                    metrics::restarted(&self.def, "restarted");
                }
                metrics::up(&self.def, true);
                self.process = Some(running);
            }
            Err(why) => {
                tracing::error!(module = %self.def.id, %why, "module could not start");
                if self.generation > 1 {
                    metrics::restarted(&self.def, "failed");
                }
                self.exited(myself, why);
            }
        }
    }

    fn write(&mut self, frame: Value, ack: Option<(String, AckWaiter)>) -> Result<(), String> {
        let Some(process) = &self.process else {
            return Err(format!("module `{}` is down", self.def.id));
        };
        let id = ack.as_ref().map(|(id, _)| id.clone());
        if let Some((id, waiter)) = ack {
            // Waiters whose caller gave up (a timeout) are dropped here.
            self.pending.retain(|_, w| !w.is_closed());
            self.pending.insert(id, waiter);
        }
        if let Err(e) = process.lines.try_send(frame.to_string()) {
            if let Some(id) = id {
                self.pending.remove(&id);
            }
            return Err(match e {
                mpsc::error::TrySendError::Full(_) => format!(
                    "module `{}` does not read its input ({WRITE_QUEUE} frames wait)",
                    self.def.id
                ),
                mpsc::error::TrySendError::Closed(_) => {
                    format!("module `{}` does not read its input", self.def.id)
                }
            });
        }
        Ok(())
    }

    /// A line the module wrote.
    fn line(&mut self, line: &str) {
        if line.trim().is_empty() {
            return;
        }
        match frame::parse_line(line) {
            Ok(Incoming::Ack { id, result, error }) => {
                if let Some(waiter) = self.pending.remove(&id) {
                    let _ = waiter.send(error.map_or(Ok(result), Err));
                }
            }
            Ok(Incoming::Message(message)) => match &self.feeder {
                Some(feeder) => {
                    if let Err(refused) = feed(feeder, message) {
                        metrics::message(&self.def, "refused");
                        tracing::warn!(module = %self.def.id, "module's messages refused: its queue is full");
                        let _ = self.write(refused, None);
                    }
                }
                None => {
                    let refused = frame::refused(
                        message.id.as_deref(),
                        "invalid_input",
                        &format!(
                            "module `{}` is an output module: its messages are not taken",
                            self.def.id
                        ),
                    );
                    let _ = self.write(refused, None);
                }
            },
            Err(bad) => {
                tracing::warn!(module = %self.def.id, message = %bad.message, "module wrote a line that is not a frame");
                let _ = self.write(
                    frame::refused(bad.id.as_deref(), "invalid_input", &bad.message),
                    None,
                );
            }
        }
    }

    /// The process ended (or could not start): its waiters fail, and it starts again or not.
    fn exited(&mut self, myself: &ActorRef<GatewayMsg>, status: String) {
        self.process = None;
        self.probing = false;
        metrics::up(&self.def, false);
        for (_, waiter) in self.pending.drain() {
            let _ = waiter.send(Err(format!("module `{}` exited ({status})", self.def.id)));
        }
        match plan::after_exit(&self.def.restart, &mut self.restarts, Instant::now()) {
            plan::AfterExit::Restart(delay) => {
                tracing::warn!(module = %self.def.id, %status, delay_ms = delay.as_millis() as u64, "module exited; starting it again");
                myself.send_after(delay, || GatewayMsg::Restart);
            }
            plan::AfterExit::GiveUp => {
                tracing::error!(module = %self.def.id, %status, "module keeps exiting; it stays down");
                metrics::restarted(&self.def, "given_up");
                self.given_up = true;
            }
        }
        self.last_exit = Some(status);
    }

    fn probe(&mut self, myself: &ActorRef<GatewayMsg>) {
        let Some(health) = self.def.health.clone() else {
            return;
        };
        if self.process.is_none() || self.probing {
            return;
        }
        let id = frame::new_id("p");
        let (waiter, answered) = oneshot::channel();
        if self.write(frame::ping(&id), Some((id, waiter))).is_err() {
            return;
        }
        self.probing = true;
        let generation = self.generation;
        let me = myself.clone();
        tokio::spawn(async move {
            let why = match tokio::time::timeout(health.timeout, answered).await {
                Ok(Ok(Ok(_))) => None,
                Ok(Ok(Err(e))) => Some(e),
                Ok(Err(_)) => Some("the probe was dropped".to_owned()),
                Err(_) => Some(format!("no answer within {:?}", health.timeout)),
            };
            let _ = me.cast(match why {
                Some(why) => GatewayMsg::ProbeFailed { generation, why },
                None => GatewayMsg::Probed,
            });
        });
    }
}

/// The longest line read from a module's stdout or stderr; a longer one is skipped.
pub const MAX_LINE: usize = 1 << 20;

/// At most this many frames wait to be written to a module's stdin; past it, a write fails
/// (the module does not read its input).
pub const WRITE_QUEUE: usize = 1024;

/// At most this many of a module's messages wait for its feeder; past it, a message is
/// refused (`overloaded`).
pub const FEED_QUEUE: usize = 256;

/// Hands `message` to the feeder; when its queue is full, the refusal to write back.
fn feed(feeder: &mpsc::Sender<InputMessage>, message: InputMessage) -> Result<(), Value> {
    match feeder.try_send(message) {
        Ok(()) => Ok(()),
        Err(mpsc::error::TrySendError::Full(message)) => Err(frame::refused(
            message.id.as_deref(),
            "overloaded",
            &format!("more than {FEED_QUEUE} messages wait to be stored; send it again later"),
        )),
        // The feeder ended with the service: nothing is taken any more.
        Err(mpsc::error::TrySendError::Closed(message)) => Err(frame::refused(
            message.id.as_deref(),
            "overloaded",
            "troupe is stopping: no message is taken",
        )),
    }
}

/// Starts the module's process and the tasks around it.
fn spawn(
    def: &ModuleDefinition,
    myself: &ActorRef<GatewayMsg>,
    generation: u64,
) -> Result<Running, String> {
    let program = def
        .program()
        .ok_or_else(|| "no command to start".to_owned())?;
    let mut child = tokio::process::Command::new(&program)
        .args(&def.args)
        .envs(&def.env)
        .current_dir(def.workdir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // Its own process group: stopping or restarting it kills whatever it started too.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", program.display()))?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err("the process has no pipes".to_owned());
    };
    let (lines, mut to_write) = mpsc::channel::<String>(WRITE_QUEUE);
    tokio::spawn(async move {
        while let Some(mut line) = to_write.recv().await {
            line.push('\n');
            if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
    });
    let me = myself.clone();
    let id = def.id.clone();
    tokio::spawn(async move {
        let mut out = FramedRead::new(stdout, LinesCodec::new_with_max_length(MAX_LINE));
        // After a decoding error the stream yields one `None` and then reads on.
        let mut skipped = false;
        loop {
            match out.next().await {
                Some(Ok(line)) => {
                    skipped = false;
                    if me.cast(GatewayMsg::Line { generation, line }).is_err() {
                        return;
                    }
                }
                Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                    skipped = true;
                    if me.cast(GatewayMsg::TooLong { generation }).is_err() {
                        return;
                    }
                }
                Some(Err(LinesCodecError::Io(e))) => {
                    tracing::warn!(module = %id, error = %e, "module's stdout cannot be read (not UTF-8?); restarting it");
                    break;
                }
                None if skipped => skipped = false,
                None => break,
            }
        }
        // Nothing it writes is heard any more: a process still running is killed (and
        // started again like one that exited).
        let _ = me.cast(GatewayMsg::ReaderEnded { generation });
    });
    let id = def.id.clone();
    tokio::spawn(async move {
        // Bytes, not UTF-8 lines: a line that is not UTF-8 is logged with replacement
        // characters, and the reading goes on (stopping it would break the module's stderr).
        let codec = tokio_util::codec::AnyDelimiterCodec::new_with_max_length(
            b"\n".to_vec(),
            Vec::new(),
            MAX_LINE,
        );
        let mut err = FramedRead::new(stderr, codec);
        while let Some(line) = err.next().await {
            match line {
                Ok(line) => {
                    let line = String::from_utf8_lossy(&line);
                    let line = line.strip_suffix('\r').unwrap_or(&line);
                    tracing::info!(module = %id, "{line}");
                }
                Err(tokio_util::codec::AnyDelimiterCodecError::MaxChunkLengthExceeded) => {
                    tracing::warn!(module = %id, "module wrote a stderr line over {MAX_LINE} bytes; skipped");
                }
                Err(tokio_util::codec::AnyDelimiterCodecError::Io(_)) => break,
            }
        }
    });
    let (kill, killed) = oneshot::channel::<()>();
    let (exited, done) = oneshot::channel::<()>();
    let me = myself.clone();
    let pid = child.id();
    tokio::spawn(async move {
        let status = tokio::select! {
            status = child.wait() => status,
            _ = killed => {
                kill_group(pid);
                let _ = child.start_kill();
                child.wait().await
            }
        };
        // What it left running in its group (a crashed wrapper's children) goes with it: the
        // group's id stays reserved while any member lives, so this names no stranger.
        kill_group(pid);
        let status = match status {
            Ok(s) => s.to_string(),
            Err(e) => format!("wait failed: {e}"),
        };
        let _ = exited.send(());
        let _ = me.cast(GatewayMsg::Exited { generation, status });
    });
    Ok(Running {
        lines,
        kill: Some(kill),
        done,
    })
}

/// SIGKILL to the process group led by `pid`.
fn kill_group(pid: Option<u32>) {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str) -> InputMessage {
        InputMessage {
            id: Some(id.into()),
            session: None,
            conversation: None,
            text: "hi".into(),
        }
    }

    #[test]
    fn a_full_feeder_refuses_the_message_as_overloaded() {
        let (feeder, _taken) = mpsc::channel(1);
        assert_eq!(feed(&feeder, message("m1")), Ok(()));
        let refused = feed(&feeder, message("m2")).unwrap_err();
        assert_eq!(refused["id"], "m2");
        assert_eq!(refused["code"], "overloaded");
    }

    #[test]
    fn writes_to_a_module_that_does_not_read_fail_once_its_queue_is_full() {
        let def: ModuleDefinition = serde_json::from_str(
            r#"{"id":"deaf","direction":"output","protocol":"stdio","command":"x"}"#,
        )
        .unwrap();
        let (lines, _unread) = mpsc::channel(WRITE_QUEUE);
        let (_exited, done) = oneshot::channel();
        let mut state = GatewayState {
            def: Arc::new(def),
            feeder: None,
            process: Some(Running {
                lines,
                kill: None,
                done,
            }),
            generation: 1,
            pending: HashMap::new(),
            restarts: Vec::new(),
            restarted: 0,
            given_up: false,
            last_exit: None,
            probing: false,
        };
        for n in 0..WRITE_QUEUE {
            assert_eq!(state.write(frame::ping(&n.to_string()), None), Ok(()));
        }
        let (waiter, _answer) = oneshot::channel();
        let full = state
            .write(frame::ping("one more"), Some(("one more".into(), waiter)))
            .unwrap_err();
        assert!(full.contains("does not read its input"), "{full}");
        assert!(state.pending.is_empty(), "no acknowledgement is awaited");
    }
}

// A message of actors on this process only (see `local_message!`).
troupe_actors::local_message!(GatewayMsg);
