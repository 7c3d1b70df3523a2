//! The supervisor of one external agent: owns its run (process + connection) and its bound
//! session, runs one operation at a time, and knows the process's state for health and
//! shutdown.
//!
//! # Mailbox protocol
//! - `Initialize`, `OpenSession`, `Prompt`: queued (a second prompt while one is running or
//!   queued is `Busy`), then run one at a time by an operation task that takes the [`Slot`]
//!   (run, bound session, failure count) and gives it back with `OpDone`. Nothing in
//!   `handle` waits for the agent: cancel, health and shutdown are answered meanwhile.
//! - `Cancel`: cancels the running operation's token (a turn sends `session/cancel` and ends
//!   `Cancelled`; a start waiting for its backoff ends `Cancelled`) and the queued ones.
//! - `Health`: from the state at once ([`health_of`]).
//! - `Shutdown`: queued work ends `Stopped`, the running operation is told to stop, and the
//!   process gets SIGTERM then SIGKILL after the grace period; the actor stops once the
//!   operation task has given the slot back (a process it started meanwhile is killed).
//! - From the operation task: `Launched`, `LaunchFailed`; from the process's watcher:
//!   `ProcessExited` (a crash unless shutting down).
//!
//! A crash mid-turn ends that turn with `Exited`; the slot keeps the bound session, and the
//! next operation starts a new process after [`RestartPolicy::wait`](super::RestartPolicy)
//! and opens that session again.

use super::process::{self, Exit, Run, Stopped};
use super::session;
use super::{AcpAgentSpec, AgentHealth, AgentInfo, AgentPhase, SessionOpened, SessionOrigin};
use super::{Turn, TurnOutcome};
use crate::error::AcpError;
use crate::metrics;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub(super) struct Supervisor;

pub(super) struct SupervisorArgs {
    pub spec: AcpAgentSpec,
}

pub(super) enum AgentMsg {
    /// Starts the process if needed; answers its `initialize`.
    Initialize {
        reply: RpcReplyPort<Result<AgentInfo, AcpError>>,
    },
    /// Binds a session (the previous one when it can be resumed).
    OpenSession {
        previous: Option<String>,
        reply: RpcReplyPort<Result<SessionOpened, AcpError>>,
    },
    /// Runs one turn.
    Prompt {
        turn: Turn,
        reply: RpcReplyPort<Result<TurnOutcome, AcpError>>,
    },
    /// Cancels the running operation and the queued ones; whether there was any.
    Cancel { reply: RpcReplyPort<bool> },
    /// The agent's health, at once.
    Health { reply: RpcReplyPort<AgentHealth> },
    /// Stops the process and then the supervisor.
    Shutdown { reply: RpcReplyPort<Stopped> },
    /// Operation task: the process of `generation` is initialized.
    Launched {
        generation: u64,
        pid: u32,
        exited: watch::Receiver<Option<Exit>>,
    },
    /// Operation task: a start failed.
    LaunchFailed { error: String },
    /// Watcher: the process of `generation` ended.
    ProcessExited { generation: u64, exit: Exit },
    /// Operation task: done; the slot comes back, and the answer goes out once the state
    /// says so (a caller that asks for health next sees the operation over).
    OpDone { slot: Slot, answer: Answer },
    /// The shutdown's signals did their work.
    ShutdownDone { stopped: Stopped },
}

/// Work waiting for the slot.
enum Op {
    Initialize {
        reply: RpcReplyPort<Result<AgentInfo, AcpError>>,
    },
    Open {
        previous: Option<String>,
        reply: RpcReplyPort<Result<SessionOpened, AcpError>>,
    },
    Prompt {
        turn: Turn,
        reply: RpcReplyPort<Result<TurnOutcome, AcpError>>,
    },
}

impl Op {
    fn fail(self, error: AcpError) {
        match self {
            Self::Initialize { reply } => {
                let _ = reply.send(Err(error));
            }
            Self::Open { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Self::Prompt { reply, .. } => {
                let _ = reply.send(Err(error));
            }
        }
    }

    const fn is_turn(&self) -> bool {
        matches!(self, Self::Prompt { .. })
    }
}

/// What an operation needs and leaves: lent to one operation task at a time.
pub(super) struct Slot {
    run: Option<Run>,
    /// The bound session and the process generation it is open in.
    session: Option<(String, u64)>,
    /// Consecutive failures (crashes, failed starts) since the last good turn.
    failures: u32,
    last_failure: Option<Instant>,
    next_generation: u64,
}

/// The operation holding the slot.
struct Current {
    cancel: CancellationToken,
    turn: bool,
}

/// The running process, as health and shutdown need it.
struct ProcessInfo {
    generation: u64,
    pid: u32,
    exited: watch::Receiver<Option<Exit>>,
}

pub(super) struct SupervisorState {
    spec: Arc<AcpAgentSpec>,
    /// `None` while an operation holds it.
    slot: Option<Slot>,
    queue: VecDeque<Op>,
    current: Option<Current>,
    process: Option<ProcessInfo>,
    /// Told to every operation: a shutdown is under way.
    stop: CancellationToken,
    starts: u64,
    crashes: u64,
    /// The last start failed or the last process crashed, and no start succeeded since.
    down: bool,
    last_error: Option<String>,
    /// Callers of `Shutdown`, answered when the process is gone.
    stopping: Vec<RpcReplyPort<Stopped>>,
    /// The process is gone after a shutdown; the actor stops once the slot is back.
    stopped: Option<Stopped>,
}

#[ractor::async_trait]
impl Actor for Supervisor {
    type Msg = AgentMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: SupervisorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(SupervisorState {
            spec: Arc::new(args.spec),
            slot: Some(Slot {
                run: None,
                session: None,
                failures: 0,
                last_failure: None,
                next_generation: 1,
            }),
            queue: VecDeque::new(),
            current: None,
            process: None,
            stop: CancellationToken::new(),
            starts: 0,
            crashes: 0,
            down: false,
            last_error: None,
            stopping: Vec::new(),
            stopped: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: AgentMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AgentMsg::Initialize { reply } => state.enqueue(&myself, Op::Initialize { reply }),
            AgentMsg::OpenSession { previous, reply } => {
                state.enqueue(&myself, Op::Open { previous, reply });
            }
            AgentMsg::Prompt { turn, reply } => state.enqueue(&myself, Op::Prompt { turn, reply }),
            AgentMsg::Cancel { reply } => {
                let _ = reply.send(state.cancel_all(|| AcpError::Cancelled {
                    reason: "cancelled before it reached the agent".into(),
                }));
            }
            AgentMsg::Health { reply } => {
                let _ = reply.send(health_of(state));
            }
            AgentMsg::Shutdown { reply } => state.shutdown(&myself, reply),
            AgentMsg::Launched {
                generation,
                pid,
                exited,
            } => {
                state.process = Some(ProcessInfo {
                    generation,
                    pid,
                    exited,
                });
                state.starts += 1;
                state.down = false;
            }
            AgentMsg::LaunchFailed { error } => {
                state.down = true;
                state.last_error = Some(error);
            }
            AgentMsg::ProcessExited { generation, exit } => state.exited(generation, &exit),
            AgentMsg::OpDone { slot, answer } => {
                state.current = None;
                state.slot = Some(slot);
                answer.send();
                if state.stopped.is_some() {
                    state.finish(&myself);
                } else if !state.stopping.is_empty() {
                    // The shutdown's signals are on their way; a process started meanwhile
                    // by the operation is another one and must go too.
                    state.kill_unreported();
                } else {
                    state.dispatch(&myself);
                }
            }
            AgentMsg::ShutdownDone { stopped } => {
                state.stopped = Some(stopped);
                for reply in state.stopping.drain(..) {
                    let _ = reply.send(stopped);
                }
                if state.current.is_none() {
                    state.finish(&myself);
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        // Stopped without a shutdown (its owner went away): no process outlives it.
        if let Some(p) = &state.process {
            process::kill_group(p.pid);
        }
        if let Some(run) = state.slot.as_ref().and_then(|s| s.run.as_ref()) {
            process::kill_group(run.pid);
        }
        Ok(())
    }
}

impl SupervisorState {
    fn enqueue(&mut self, myself: &ActorRef<AgentMsg>, op: Op) {
        if !self.stopping.is_empty() || self.stopped.is_some() {
            return op.fail(AcpError::Stopped);
        }
        let turn_running =
            self.current.as_ref().is_some_and(|c| c.turn) || self.queue.iter().any(Op::is_turn);
        if op.is_turn() && turn_running {
            return op.fail(AcpError::Busy);
        }
        self.queue.push_back(op);
        self.dispatch(myself);
    }

    /// Lends the slot to the next queued operation, if it is free.
    fn dispatch(&mut self, myself: &ActorRef<AgentMsg>) {
        if self.current.is_some() {
            return;
        }
        let Some(op) = self.queue.pop_front() else {
            return;
        };
        let Some(slot) = self.slot.take() else {
            self.queue.push_front(op);
            return;
        };
        let cancel = CancellationToken::new();
        self.current = Some(Current {
            cancel: cancel.clone(),
            turn: op.is_turn(),
        });
        let ctx = OpCtx {
            spec: self.spec.clone(),
            myself: myself.clone(),
            cancel,
            stop: self.stop.clone(),
        };
        let me = myself.clone();
        tokio::spawn(async move {
            let (slot, answer) = execute(slot, op, &ctx).await;
            if let Err(ractor::MessagingErr::SendErr(AgentMsg::OpDone { answer, .. })) =
                me.cast(AgentMsg::OpDone { slot, answer })
            {
                answer.send();
            }
        });
    }

    fn cancel_all(&mut self, error: impl Fn() -> AcpError) -> bool {
        let mut any = false;
        if let Some(c) = &self.current {
            c.cancel.cancel();
            any = true;
        }
        for op in self.queue.drain(..) {
            op.fail(error());
            any = true;
        }
        any
    }

    fn shutdown(&mut self, myself: &ActorRef<AgentMsg>, reply: RpcReplyPort<Stopped>) {
        if let Some(stopped) = self.stopped {
            let _ = reply.send(stopped);
            return;
        }
        self.stopping.push(reply);
        if self.stopping.len() > 1 {
            return;
        }
        tracing::info!(agent = %self.spec.agent_id, "stopping the ACP agent");
        self.stop.cancel();
        self.cancel_all(|| AcpError::Stopped);
        let me = myself.clone();
        let grace = self.spec.shutdown_grace;
        let target = self
            .process
            .as_ref()
            .map(|p| (p.pid, p.exited.clone()))
            .or_else(|| {
                let run = self.slot.as_ref()?.run.as_ref()?;
                Some((run.pid, run.exited.clone()))
            });
        tokio::spawn(async move {
            let stopped = match target {
                Some((pid, exited)) => process::terminate(pid, exited, grace).await,
                None => Stopped::AlreadyExited,
            };
            let _ = me.cast(AgentMsg::ShutdownDone { stopped });
        });
    }

    fn exited(&mut self, generation: u64, exit: &Exit) {
        if self
            .process
            .as_ref()
            .is_none_or(|p| p.generation != generation)
        {
            return;
        }
        // What the agent started in its group does not outlive it (a crash leaves its
        // commands running otherwise).
        if let Some(p) = self.process.take() {
            process::kill_group(p.pid);
        }
        let reason = if self.stop.is_cancelled() {
            metrics::ExitReason::Shutdown
        } else {
            self.crashes += 1;
            self.down = true;
            self.last_error = Some(format!("process exited ({})", exit.status));
            tracing::warn!(agent = %self.spec.agent_id, status = %exit.status, stderr = %exit.stderr, "ACP agent process exited");
            metrics::ExitReason::Crashed
        };
        metrics::process_exited(reason);
    }

    /// A process the operation started after the shutdown's signals were sent.
    fn kill_unreported(&mut self) {
        if let Some(run) = self.slot.as_mut().and_then(|s| s.run.take()) {
            let grace = self.spec.shutdown_grace;
            tokio::spawn(async move {
                process::terminate(run.pid, run.exited.clone(), grace).await;
            });
        }
    }

    fn finish(&mut self, myself: &ActorRef<AgentMsg>) {
        self.kill_unreported();
        myself.stop(Some("shut down".into()));
    }
}

/// The agent's health, from the supervisor's state.
fn health_of(s: &SupervisorState) -> AgentHealth {
    let phase = if s.stopped.is_some() || !s.stopping.is_empty() {
        AgentPhase::Stopped
    } else if s.process.is_some() {
        if s.current.as_ref().is_some_and(|c| c.turn) {
            AgentPhase::Busy
        } else {
            AgentPhase::Ready
        }
    } else if s.current.is_some() {
        AgentPhase::Starting
    } else if s.down {
        AgentPhase::Crashed
    } else {
        AgentPhase::Idle
    };
    AgentHealth {
        phase,
        ok: phase != AgentPhase::Stopped && !s.down,
        pid: s.process.as_ref().map(|p| p.pid),
        starts: s.starts,
        crashes: s.crashes,
        last_error: s.last_error.clone(),
    }
}

/// What an operation task is given.
struct OpCtx {
    spec: Arc<AcpAgentSpec>,
    myself: ActorRef<AgentMsg>,
    /// This operation is cancelled.
    cancel: CancellationToken,
    /// The agent is shutting down.
    stop: CancellationToken,
}

/// `cwd` absolute (against the working directory), or the working directory; `/` when even
/// that cannot be read.
fn session_cwd(cwd: Option<&std::path::Path>) -> PathBuf {
    match cwd {
        Some(dir) => std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()),
        None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
    }
}

impl OpCtx {
    /// The session's working directory as ACP requires it, absolute: the command's (made
    /// absolute against troupe's own, as the process was started in it), else troupe's.
    fn cwd(&self) -> PathBuf {
        session_cwd(self.spec.command.cwd.as_deref())
    }

    /// The error to report: `Stopped` once a shutdown is under way.
    fn error(&self, e: AcpError) -> AcpError {
        if self.stop.is_cancelled() {
            AcpError::Stopped
        } else {
            e
        }
    }
}

/// An operation's result with the port it goes to.
pub(super) enum Answer {
    Info(
        RpcReplyPort<Result<AgentInfo, AcpError>>,
        Result<AgentInfo, AcpError>,
    ),
    Opened(
        RpcReplyPort<Result<SessionOpened, AcpError>>,
        Result<SessionOpened, AcpError>,
    ),
    Turn(
        RpcReplyPort<Result<TurnOutcome, AcpError>>,
        Result<TurnOutcome, AcpError>,
    ),
}

impl Answer {
    fn send(self) {
        match self {
            Self::Info(port, r) => {
                let _ = port.send(r);
            }
            Self::Opened(port, r) => {
                let _ = port.send(r);
            }
            Self::Turn(port, r) => {
                let _ = port.send(r);
            }
        }
    }
}

async fn execute(mut slot: Slot, op: Op, ctx: &OpCtx) -> (Slot, Answer) {
    let answer = match op {
        Op::Initialize { reply } => {
            let r = ensure_run(&mut slot, ctx).await.and_then(|()| {
                slot.run
                    .as_ref()
                    .map(|run| AgentInfo::of(&run.init))
                    .ok_or(AcpError::Stopped)
            });
            Answer::Info(reply, r.map_err(|e| ctx.error(e)))
        }
        Op::Open { previous, reply } => {
            let r = open_bound(&mut slot, ctx, previous.as_deref()).await;
            Answer::Opened(reply, r.map_err(|e| ctx.error(e)))
        }
        Op::Prompt { turn, reply } => {
            let started = Instant::now();
            let r = run_turn(&mut slot, ctx, &turn)
                .await
                .map_err(|e| ctx.error(e));
            let outcome = match &r {
                Ok(t) => t.stop_reason.as_str(),
                Err(e) => metrics::error_outcome(e.kind()),
            };
            metrics::turn_finished(outcome, started.elapsed());
            Answer::Turn(reply, r)
        }
    };
    (slot, answer)
}

/// Records a failure that ends the run: the next start waits for its backoff.
fn failed(slot: &mut Slot, e: &AcpError) {
    if matches!(e, AcpError::Exited { .. }) {
        slot.run = None;
        slot.failures += 1;
        slot.last_failure = Some(Instant::now());
    }
}

/// A running, initialized process in `slot.run`: the current one, or a new one started
/// after the backoff the failures so far call for.
async fn ensure_run(slot: &mut Slot, ctx: &OpCtx) -> Result<(), AcpError> {
    if slot
        .run
        .as_ref()
        .is_some_and(|r| r.exited.borrow().is_none())
    {
        return Ok(());
    }
    if let Some(run) = slot.run.take() {
        // It died between operations: that is a failure too, counted from when it died.
        slot.failures += 1;
        let died = run.exited.borrow().as_ref().map(|e| e.at);
        slot.last_failure = Some(died.unwrap_or_else(Instant::now));
    }
    let since = slot
        .last_failure
        .map_or(std::time::Duration::MAX, |t| t.elapsed());
    let wait = ctx.spec.restart.wait(slot.failures, since);
    if !wait.is_zero() {
        tracing::info!(agent = %ctx.spec.agent_id, ?wait, failures = slot.failures, "waiting before starting the ACP agent again");
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = ctx.cancel.cancelled() => {
                return Err(AcpError::Cancelled { reason: "cancelled while waiting to restart the agent".into() });
            }
        }
    }
    if ctx.stop.is_cancelled() {
        return Err(AcpError::Stopped);
    }
    let generation = slot.next_generation;
    slot.next_generation += 1;
    let watcher = ctx.myself.clone();
    let span = tracing::info_span!("acp.start", troupe.agent.id = %ctx.spec.agent_id, acp.generation = generation);
    let launched = process::launch(
        &ctx.spec.agent_id,
        &ctx.spec.command,
        generation,
        ctx.spec.handshake_timeout,
        move |exit| {
            let _ = watcher.cast(AgentMsg::ProcessExited { generation, exit });
        },
    )
    .instrument(span)
    .await;
    match launched {
        Ok(run) => {
            metrics::process_started(true);
            tracing::info!(agent = %ctx.spec.agent_id, pid = run.pid, generation, "ACP agent started");
            let _ = ctx.myself.cast(AgentMsg::Launched {
                generation,
                pid: run.pid,
                exited: run.exited.clone(),
            });
            slot.run = Some(run);
            Ok(())
        }
        Err(e) => {
            metrics::process_started(false);
            tracing::warn!(agent = %ctx.spec.agent_id, error = %e, "ACP agent did not start");
            slot.failures += 1;
            slot.last_failure = Some(Instant::now());
            let _ = ctx.myself.cast(AgentMsg::LaunchFailed {
                error: e.to_string(),
            });
            Err(e)
        }
    }
}

async fn open_bound(
    slot: &mut Slot,
    ctx: &OpCtx,
    previous: Option<&str>,
) -> Result<SessionOpened, AcpError> {
    ensure_run(slot, ctx).await?;
    let Slot { run, session, .. } = slot;
    let run = run.as_mut().ok_or(AcpError::Stopped)?;
    if let Some((id, generation)) = session.as_ref()
        && *generation == run.generation
        && previous.is_none_or(|p| p == id)
    {
        return Ok(SessionOpened {
            session_id: id.clone(),
            origin: SessionOrigin::Live,
            replaced: None,
        });
    }
    match session::open(run, &ctx.cwd(), previous).await {
        Ok(opened) => {
            *session = Some((opened.session_id.clone(), run.generation));
            metrics::session_opened(opened.origin_label());
            tracing::info!(agent = %ctx.spec.agent_id, session = %opened.session_id, origin = opened.origin_label(), "ACP session bound");
            Ok(opened)
        }
        Err(e) => {
            failed(slot, &e);
            Err(e)
        }
    }
}

async fn run_turn(slot: &mut Slot, ctx: &OpCtx, turn: &Turn) -> Result<TurnOutcome, AcpError> {
    ensure_run(slot, ctx).await?;
    let generation = slot.run.as_ref().map_or(0, |r| r.generation);
    // No session, or one from an earlier process: open it (again) first.
    let reopened = match &slot.session {
        Some((_, g)) if *g == generation => None,
        stale => {
            let previous = stale.as_ref().map(|(id, _)| id.clone());
            Some(open_bound(slot, ctx, previous.as_deref()).await?)
        }
    };
    let Slot { run, session, .. } = slot;
    let run = run.as_mut().ok_or(AcpError::Stopped)?;
    let session_id = session
        .as_ref()
        .map(|(id, _)| id.clone())
        .ok_or(AcpError::Stopped)?;
    let span = session::prompt_span(&ctx.spec.agent_id, &session_id);
    let ended = session::prompt(run, &ctx.spec.agent_id, &session_id, turn, &ctx.cancel)
        .instrument(span.clone())
        .await;
    match ended {
        Ok(end) => {
            span.record("acp.stop_reason", end.stop_reason.as_str());
            slot.failures = 0;
            Ok(TurnOutcome {
                stop_reason: end.stop_reason,
                text: end.text,
                session_id,
                reopened,
            })
        }
        Err(e) => {
            span.record("error.type", e.kind().as_str());
            span.in_scope(|| tracing::warn!(error = %e, "ACP turn failed"));
            failed(slot, &e);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ACP wants an absolute `cwd`: a relative one is made absolute against troupe's own
    /// working directory (where the agent's process was started from).
    #[test]
    fn a_sessions_cwd_is_absolute() {
        let here = std::env::current_dir().unwrap();
        assert_eq!(
            session_cwd(Some(std::path::Path::new("work"))),
            here.join("work")
        );
        assert_eq!(
            session_cwd(Some(std::path::Path::new("/srv/x"))),
            PathBuf::from("/srv/x")
        );
        assert_eq!(session_cwd(None), here);
    }

    fn state() -> SupervisorState {
        SupervisorState {
            spec: Arc::new(AcpAgentSpec::new(
                "a",
                super::super::AgentCommand::default(),
            )),
            slot: None,
            queue: VecDeque::new(),
            current: None,
            process: None,
            stop: CancellationToken::new(),
            starts: 0,
            crashes: 0,
            down: false,
            last_error: None,
            stopping: Vec::new(),
            stopped: None,
        }
    }

    #[test]
    fn health_follows_the_process_and_the_work() {
        let mut s = state();
        assert_eq!(health_of(&s).phase, AgentPhase::Idle);
        assert!(health_of(&s).ok);
        s.current = Some(Current {
            cancel: CancellationToken::new(),
            turn: true,
        });
        assert_eq!(health_of(&s).phase, AgentPhase::Starting);
        let (_tx, exited) = watch::channel(None);
        s.process = Some(ProcessInfo {
            generation: 1,
            // No process has this id: `exited` signals its group (a no-op here).
            pid: u32::MAX,
            exited,
        });
        assert_eq!(health_of(&s).phase, AgentPhase::Busy);
        assert_eq!(health_of(&s).pid, Some(u32::MAX));
        s.current = None;
        assert_eq!(health_of(&s).phase, AgentPhase::Ready);
        s.exited(
            1,
            &Exit {
                status: "signal 9 (SIGKILL)".into(),
                stderr: String::new(),
                at: Instant::now(),
            },
        );
        let h = health_of(&s);
        assert_eq!((h.phase, h.ok, h.crashes), (AgentPhase::Crashed, false, 1));
        assert_eq!(
            h.last_error.as_deref(),
            Some("process exited (signal 9 (SIGKILL))")
        );
        s.stopped = Some(Stopped::Terminated);
        assert_eq!(health_of(&s).phase, AgentPhase::Stopped);
    }
}

// A message of actors on this process only (see `local_message!`).
troupe_actors::local_message!(AgentMsg);
