//! `ProcessRunner`: the shell tool's command runner. Runs argv as a child process (never via
//! a shell string) with a working directory, a timeout, an output cap and a scrubbed
//! environment, in its own process group. The group is killed as soon as the command exits
//! (so a background job neither outlives it nor keeps it waiting on its output), on timeout
//! or cancellation, and when the run's future is dropped; a process that made its own session
//! (`setsid`) leaves the group and is not killed. A timed-out command keeps what it wrote.
//!
//! Sandboxing (see [`sandbox`]): `full-access` runs the command directly. `read-only` and
//! `workspace-write` run it through the sandbox launcher (`troupe sandbox-exec`), which
//! starts a new session (so the command has no controlling terminal and leads its own process
//! group), confines itself with Landlock and then execs the command. A policy that cannot be fully
//! enforced (no launcher, no Landlock, a partially enforced ruleset) is refused with
//! `SandboxError`: a command never runs less confined than asked.

pub mod metrics;
pub mod sandbox;

use self::metrics::Outcome;
use self::sandbox::{LaunchFailure, SandboxSpec};
use async_trait::async_trait;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use troupe_actors::ports::{CommandRunner, ExecOutput, ExecRequest};
use troupe_proto::{AgentError, SandboxPolicy};

/// Environment variables a command inherits; everything else is dropped.
const KEPT_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TERM", "TMPDIR", "USER"];

/// Runs commands as child processes.
#[derive(Debug, Clone)]
pub struct ProcessRunner {
    /// The `troupe` binary that provides `sandbox-exec`; `None`: sandboxed commands are
    /// refused.
    launcher: Option<PathBuf>,
}

impl Default for ProcessRunner {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessRunner {
    /// A runner whose launcher is [`default_launcher`].
    pub fn new() -> Self {
        metrics::describe();
        Self {
            launcher: default_launcher(),
        }
    }

    /// Uses `path` (a `troupe` binary) as the sandbox launcher.
    pub fn with_launcher(mut self, path: impl Into<PathBuf>) -> Self {
        self.launcher = Some(path.into());
        self
    }

    /// The sandbox launcher, if there is one.
    pub fn launcher(&self) -> Option<&Path> {
        self.launcher.as_deref()
    }
}

/// This process's own executable when it is the `troupe` binary (which has the
/// `sandbox-exec` subcommand); otherwise none, and an embedder names one.
pub fn default_launcher() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()
        .filter(|exe| exe.file_name().is_some_and(|name| name == "troupe"))
}

#[async_trait]
impl CommandRunner for ProcessRunner {
    async fn run(
        &self,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> Result<ExecOutput, AgentError> {
        let policy = request.sandbox;
        let span = tracing::info_span!(
            "exec",
            program = request.argv.first().map_or("", String::as_str),
            sandbox = sandbox::policy_arg(policy),
            pid = tracing::field::Empty,
            exit_code = tracing::field::Empty,
            conversation_id = request.conversation_id.map(tracing::field::display),
            task_id = request.task_id.map(tracing::field::display),
        );
        let started = Instant::now();
        let result = self.run_inner(request, cancel).instrument(span).await;
        let (result, outcome) = match result {
            Ok(out) => {
                let outcome = match (out.timed_out, out.exit_code) {
                    (true, _) => Outcome::TimedOut,
                    (false, Some(0)) => Outcome::Ok,
                    _ => Outcome::Failed,
                };
                (Ok(out), outcome)
            }
            Err((error, outcome)) => (Err(error), outcome),
        };
        if outcome == Outcome::Refused {
            tracing::warn!(sandbox = sandbox::policy_arg(policy), error = ?result.as_ref().err(), "command refused by the sandbox");
        }
        metrics::command_finished(policy, outcome, started.elapsed());
        result
    }
}

/// A private temp dir for one sandboxed command, removed when the command ends.
fn private_tmp() -> Result<tempfile::TempDir, AgentError> {
    tempfile::Builder::new()
        .prefix("troupe-exec-")
        .tempdir()
        .map_err(|e| AgentError::SandboxError {
            message: format!("cannot create the command's private temp dir: {e}"),
        })
}

type Failure = (AgentError, Outcome);

impl ProcessRunner {
    async fn run_inner(
        &self,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> Result<ExecOutput, Failure> {
        let Some((program, args)) = request.argv.split_first() else {
            return Err((AgentError::invalid("empty command"), Outcome::SpawnFailed));
        };
        let refused = |message: String| (AgentError::SandboxError { message }, Outcome::Refused);
        // Kept alive until the command ends; its drop removes the directory.
        let mut tmp = None;
        let mut cmd = match request.sandbox {
            SandboxPolicy::FullAccess => {
                let mut cmd = Command::new(program);
                cmd.args(args);
                cmd
            }
            policy => {
                let Some(launcher) = &self.launcher else {
                    return Err(refused(format!(
                        "the {} sandbox needs the `troupe sandbox-exec` launcher and none is configured; refusing to run `{}`",
                        sandbox::policy_arg(policy),
                        request.argv.join(" ")
                    )));
                };
                let mut writable = Vec::new();
                if policy == SandboxPolicy::WorkspaceWrite {
                    let dir = private_tmp().map_err(|e| (e, Outcome::Refused))?;
                    writable.extend(request.writable_roots.iter().cloned());
                    writable.push(dir.path().to_path_buf());
                    tmp = Some(dir);
                }
                let spec = SandboxSpec { policy, writable };
                let mut cmd = Command::new(launcher);
                cmd.args(sandbox::launcher_args(&spec, &request.argv));
                cmd
            }
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .env_clear();
        if request.sandbox == SandboxPolicy::FullAccess {
            // Its own group, so that what it starts is killed with it. A confined command's
            // launcher makes its own session instead (which a group leader may not).
            cmd.process_group(0);
        }
        for key in KEPT_ENV {
            if let Ok(v) = std::env::var(key) {
                cmd.env(key, v);
            }
        }
        if let Some(dir) = &tmp {
            cmd.env("TMPDIR", dir.path());
        }
        if let Some(dir) = &request.workdir {
            // Checked here, so that a missing directory is named as such rather than taken
            // for a launcher that cannot start.
            check_workdir(dir)
                .await
                .map_err(|e| (e, Outcome::SpawnFailed))?;
            cmd.current_dir(dir);
        }
        let mut child = cmd.spawn().map_err(|e| {
            let error = match (request.sandbox, &self.launcher) {
                (SandboxPolicy::FullAccess, _) | (_, None) => AgentError::ToolError {
                    name: "shell".into(),
                    message: format!("cannot start `{program}`: {e}"),
                },
                (_, Some(launcher)) => AgentError::SandboxError {
                    message: format!(
                        "cannot start the sandbox launcher {}: {e}",
                        launcher.display()
                    ),
                },
            };
            let outcome = match error {
                AgentError::SandboxError { .. } => Outcome::Refused,
                _ => Outcome::SpawnFailed,
            };
            (error, outcome)
        })?;
        let pid = child.id();
        tracing::Span::current().record("pid", pid);
        // From here on, however this future ends (even dropped), the group goes too.
        let mut group = Group::new(pid);
        let cap = request.output_cap;
        let mut out = Capture::new(cap);
        // The launcher's protocol line must survive a small cap; the cap is applied after.
        let mut err = Capture::new(cap.max(PROTOCOL_BYTES));
        let (stdout_pipe, stderr_pipe) = (child.stdout.take(), child.stderr.take());
        let ended = {
            let reading = async {
                tokio::join!(
                    read_into(stdout_pipe, &mut out),
                    read_into(stderr_pipe, &mut err)
                )
            };
            let wait = child.wait();
            let deadline = tokio::time::sleep(request.timeout);
            tokio::pin!(reading, wait, deadline);
            let mut exited = None;
            let mut drained = false;
            let mut timed_out = false;
            loop {
                tokio::select! {
                    () = cancel.cancelled() => {
                        group.kill();
                        break Ended::Cancelled;
                    }
                    status = &mut wait, if exited.is_none() && !timed_out => {
                        // The command is done: what it left running in its group goes too
                        // (a background job holding the pipes open would otherwise keep it
                        // waiting). A process that made its own session escapes the group
                        // and may hold a pipe, so the drain that follows is bounded.
                        group.leader_exited();
                        if drained {
                            break Ended::Exited(status);
                        }
                        exited = Some(status);
                        deadline.as_mut().reset(Instant::now() + DRAIN);
                    }
                    ((), ()) = &mut reading, if !drained => {
                        drained = true;
                        if let Some(status) = exited.take() {
                            break Ended::Exited(status);
                        }
                        if timed_out {
                            break Ended::TimedOut;
                        }
                    }
                    () = &mut deadline => {
                        if let Some(status) = exited.take() {
                            tracing::debug!("a process outside the command's group still holds its output open; not waiting for it");
                            break Ended::Exited(status);
                        }
                        if timed_out {
                            break Ended::TimedOut;
                        }
                        group.kill();
                        tracing::info!(timeout_ms = u64::try_from(request.timeout.as_millis()).unwrap_or(u64::MAX), "command timed out; killed its process group");
                        timed_out = true;
                        if drained {
                            break Ended::TimedOut;
                        }
                        // What it wrote before it was killed is kept.
                        deadline.as_mut().reset(Instant::now() + DRAIN);
                    }
                }
            }
        };
        let status = match ended {
            Ended::Exited(status) => status,
            Ended::Cancelled => {
                return Err((
                    AgentError::cancelled("command cancelled"),
                    Outcome::Cancelled,
                ));
            }
            Ended::TimedOut => {
                // `child` is dropped: `kill_on_drop` reaps the killed leader.
                let (stdout, out_trunc) = out.into_text();
                let (stderr, err_trunc) = err.into_text();
                let (stderr, err_cut) = cut(stderr, cap);
                return Ok(ExecOutput {
                    exit_code: None,
                    stdout,
                    stderr,
                    timed_out: true,
                    truncated: out_trunc || err_trunc || err_cut,
                });
            }
        };
        let (stdout, out_trunc) = out.into_text();
        let (stderr, err_trunc) = err.into_text();
        let status = status.map_err(|e| {
            (
                AgentError::ToolError {
                    name: "shell".into(),
                    message: e.to_string(),
                },
                Outcome::Failed,
            )
        })?;
        let exit_code = status.code();
        tracing::Span::current().record("exit_code", exit_code);
        if request.sandbox != SandboxPolicy::FullAccess {
            match sandbox::launch_failure(exit_code, &stderr) {
                Some(LaunchFailure::Refused(message)) => return Err(refused(message)),
                Some(LaunchFailure::ExecFailed(message)) => {
                    return Err((
                        AgentError::ToolError {
                            name: "shell".into(),
                            message: format!("cannot start {message}"),
                        },
                        Outcome::SpawnFailed,
                    ));
                }
                None => {}
            }
        }
        drop(tmp);
        let (stderr, err_cut) = cut(stderr, cap);
        Ok(ExecOutput {
            exit_code,
            stdout,
            stderr,
            timed_out: false,
            truncated: out_trunc || err_trunc || err_cut,
        })
    }
}

/// Bytes of stderr always read, whatever the cap: room for the launcher's protocol line.
const PROTOCOL_BYTES: usize = 4096;

/// `text` cut to at most `cap` bytes (on a character boundary); whether it was cut.
fn cut(mut text: String, cap: usize) -> (String, bool) {
    if text.len() <= cap {
        return (text, false);
    }
    let mut end = cap;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    (text, true)
}

/// How long the pipes are still read once the command has exited or been killed: what its
/// group wrote is in them by then; a process that left the group may hold them open forever.
const DRAIN: std::time::Duration = std::time::Duration::from_millis(500);

/// How a run ended.
enum Ended {
    /// The command exited (the leader's status, as reaped).
    Exited(std::io::Result<std::process::ExitStatus>),
    TimedOut,
    Cancelled,
}

/// Whether `dir` can be a command's working directory; if not, an error naming it.
async fn check_workdir(dir: &Path) -> Result<(), AgentError> {
    let error = |what: String| AgentError::ToolError {
        name: "shell".into(),
        message: format!("workdir `{}` {what}", dir.display()),
    };
    match tokio::fs::metadata(dir).await {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(error("is not a directory".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(error("does not exist".into())),
        Err(e) => Err(error(format!("cannot be used: {e}"))),
    }
}

/// The command's process group (its id is the leader's pid), killed once: when the leader
/// exits, on timeout or cancellation, or when the run's future is dropped before any of
/// these (`kill_on_drop` alone would kill the leader only). A process that made its own
/// session (`setsid`) has left the group and is not reached.
struct Group {
    leader: Option<nix::unistd::Pid>,
    killed: bool,
}

impl Group {
    fn new(pid: Option<u32>) -> Self {
        Self {
            leader: pid
                .and_then(|p| i32::try_from(p).ok())
                .map(nix::unistd::Pid::from_raw),
            killed: false,
        }
    }

    /// Kills the group and its leader, which has not been reaped: its pid still names it.
    /// The leader is killed by pid as well, since a sandbox launcher that has not made its
    /// session yet leads no group.
    fn kill(&mut self) {
        use nix::sys::signal::{Signal, kill, killpg};
        if let (Some(pid), false) = (self.leader, self.killed) {
            let _ = killpg(pid, Signal::SIGKILL);
            let _ = kill(pid, Signal::SIGKILL);
        }
        self.killed = true;
    }

    /// Kills what the leader, just reaped, left in its group. A group keeps its id while it
    /// has a member, so the id names no other group; once it is empty the signal finds
    /// nobody (it would take the kernel handing out every pid in between for it to land
    /// elsewhere).
    fn leader_exited(&mut self) {
        use nix::sys::signal::{Signal, killpg};
        if let (Some(pid), false) = (self.leader, self.killed) {
            let _ = killpg(pid, Signal::SIGKILL);
        }
        self.killed = true;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Output read from one pipe, up to `cap` bytes. Kept outside the reading future, so that a
/// run that stops reading early (a timeout) still has what was read.
struct Capture {
    buf: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            buf: Vec::new(),
            cap,
            truncated: false,
        }
    }

    /// The text read (invalid UTF-8 replaced) and whether more was dropped.
    fn into_text(self) -> (String, bool) {
        (
            String::from_utf8_lossy(&self.buf).into_owned(),
            self.truncated,
        )
    }
}

/// Reads `pipe` into `into` until its end (or an error).
async fn read_into<R: tokio::io::AsyncRead + Unpin>(pipe: Option<R>, into: &mut Capture) {
    let Some(mut pipe) = pipe else {
        return;
    };
    let mut chunk = [0u8; 8192];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = into.cap.saturating_sub(into.buf.len());
                if n > room {
                    into.truncated = true;
                }
                into.buf.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn req(argv: &[&str], sandbox: SandboxPolicy) -> ExecRequest {
        ExecRequest {
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            workdir: None,
            timeout: Duration::from_secs(10),
            sandbox,
            output_cap: 16,
            writable_roots: Vec::new(),
            conversation_id: None,
            task_id: None,
        }
    }

    fn runner() -> ProcessRunner {
        ProcessRunner { launcher: None }
    }

    #[tokio::test]
    async fn runs_and_caps_output() {
        let out = runner()
            .run(
                req(
                    &["printf", "0123456789abcdefXYZ"],
                    SandboxPolicy::FullAccess,
                ),
                &CancellationToken::new(),
            )
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(0));
        assert_eq!(out.stdout, "0123456789abcdef");
        assert!(out.truncated);
    }

    #[tokio::test]
    async fn a_sandbox_without_a_launcher_is_refused() {
        for policy in [SandboxPolicy::ReadOnly, SandboxPolicy::WorkspaceWrite] {
            let err = runner()
                .run(req(&["true"], policy), &CancellationToken::new())
                .await
                .unwrap_err();
            assert!(matches!(err, AgentError::SandboxError { .. }), "{err}");
        }
    }

    #[tokio::test]
    async fn a_missing_launcher_is_a_refusal_not_a_tool_error() {
        let err = runner()
            .with_launcher("/nonexistent/troupe")
            .run(
                req(&["true"], SandboxPolicy::ReadOnly),
                &CancellationToken::new(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, AgentError::SandboxError { .. }), "{err}");
    }

    /// A stand-in launcher (a shell script) that answers with the refusal protocol, as the
    /// real one does on a kernel without Landlock: the runner must report a `SandboxError`
    /// and never treat it as the command's own failure.
    #[tokio::test]
    async fn a_launcher_refusal_becomes_a_sandbox_error() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("troupe");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\necho '{}no Landlock here' >&2\nexit {}\n",
                sandbox::REFUSED_PREFIX,
                sandbox::REFUSED_EXIT
            ),
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = runner()
            .with_launcher(&fake)
            .run(
                req(&["true"], SandboxPolicy::WorkspaceWrite),
                &CancellationToken::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(
            err,
            AgentError::SandboxError {
                message: "no Landlock here".into()
            }
        );
    }

    #[tokio::test]
    async fn environment_is_scrubbed() {
        // Whatever the test process has, the child sees only the kept variables.
        let mut request = req(&["env"], SandboxPolicy::FullAccess);
        request.output_cap = 1 << 16;
        let out = runner()
            .run(request, &CancellationToken::new())
            .await
            .unwrap();
        for line in out.stdout.lines() {
            let key = line.split('=').next().unwrap_or_default();
            assert!(KEPT_ENV.contains(&key), "leaked {key}");
        }
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        // A grandchild in the background, which outlives its parent unless the group dies.
        let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
        let mut request = req(&["sh", "-c", &script], SandboxPolicy::FullAccess);
        request.timeout = Duration::from_millis(300);
        let out = runner()
            .run(request, &CancellationToken::new())
            .await
            .unwrap();
        assert!(out.timed_out);
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        assert!(
            gone(pid.trim()),
            "the background sleep survived the timeout"
        );
    }

    /// Whether a process is gone (or a zombie waiting for init): SIGKILL is delivered at
    /// once, but the kernel tears the process down asynchronously, so look a few times.
    fn gone(pid: &str) -> bool {
        let stat = format!("/proc/{pid}/stat");
        (0..200).any(|_| {
            let dead = std::fs::read_to_string(&stat).map_or(true, |s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            });
            if !dead {
                std::thread::yield_now();
                std::thread::sleep(Duration::from_millis(10));
            }
            dead
        })
    }

    /// The pid a script printed on the first line of its stdout.
    fn first_line(out: &ExecOutput) -> String {
        out.stdout.lines().next().unwrap_or_default().to_owned()
    }

    #[tokio::test]
    async fn a_background_job_neither_holds_the_command_nor_outlives_it() {
        let mut request = req(
            &["sh", "-c", "sleep 30 & echo $!; echo hi"],
            SandboxPolicy::FullAccess,
        );
        request.timeout = Duration::from_secs(20);
        request.output_cap = 1024;
        let started = Instant::now();
        let out = runner()
            .run(request, &CancellationToken::new())
            .await
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "waited for the background job: {:?}",
            started.elapsed()
        );
        assert!(!out.timed_out);
        assert_eq!(out.exit_code, Some(0));
        assert!(out.stdout.ends_with("hi\n"), "{out:?}");
        assert!(gone(&first_line(&out)), "the background sleep survived");
    }

    #[tokio::test]
    async fn a_timed_out_command_keeps_what_it_wrote() {
        let mut request = req(
            &["sh", "-c", "echo partial; echo oops >&2; sleep 30"],
            SandboxPolicy::FullAccess,
        );
        request.timeout = Duration::from_millis(500);
        let out = runner()
            .run(request, &CancellationToken::new())
            .await
            .unwrap();
        assert!(out.timed_out);
        assert_eq!(out.exit_code, None);
        assert_eq!(out.stdout, "partial\n");
        assert_eq!(out.stderr, "oops\n");
    }

    #[tokio::test]
    async fn a_cancelled_command_leaves_no_background_job() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
        let cancel = CancellationToken::new();
        let canceller = {
            let (cancel, pidfile) = (cancel.clone(), pidfile.clone());
            tokio::spawn(async move {
                while !pidfile.exists() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                cancel.cancel();
            })
        };
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            runner().run(
                req(&["sh", "-c", &script], SandboxPolicy::FullAccess),
                &cancel,
            ),
        )
        .await
        .expect("cancelled within 10 s");
        canceller.await.unwrap();
        assert!(
            matches!(result, Err(AgentError::Cancelled { .. })),
            "{result:?}"
        );
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        assert!(gone(pid.trim()), "the background sleep survived");
    }

    /// A run whose future is dropped (its task aborted, no cancellation) takes its whole
    /// group with it, not only the leader.
    #[tokio::test]
    async fn a_dropped_run_leaves_no_background_job() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
        let runner = runner();
        let cancel = CancellationToken::new();
        let mut run = Box::pin(runner.run(
            req(&["sh", "-c", &script], SandboxPolicy::FullAccess),
            &cancel,
        ));
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::select! {
                _ = &mut run => panic!("the command ended by itself"),
                () = async {
                    while !pidfile.exists() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                } => {}
            }
        })
        .await;
        assert!(waited.is_ok(), "the command started within 10 s");
        drop(run);
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        assert!(gone(pid.trim()), "the background sleep survived the drop");
    }

    #[tokio::test]
    async fn a_missing_workdir_is_named_not_taken_for_the_launcher() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        for (workdir, policy, what) in [
            (&missing, SandboxPolicy::ReadOnly, "does not exist"),
            (&missing, SandboxPolicy::FullAccess, "does not exist"),
            (&file, SandboxPolicy::WorkspaceWrite, "is not a directory"),
        ] {
            let mut request = req(&["true"], policy);
            request.workdir = Some(workdir.clone());
            let err = runner()
                .with_launcher("/bin/true")
                .run(request, &CancellationToken::new())
                .await
                .unwrap_err();
            assert_eq!(
                err,
                AgentError::ToolError {
                    name: "shell".into(),
                    message: format!("workdir `{}` {what}", workdir.display()),
                }
            );
        }
    }

    #[tokio::test]
    async fn cancellation_kills_the_command() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        let started = Instant::now();
        let result = runner()
            .run(req(&["sleep", "30"], SandboxPolicy::FullAccess), &cancel)
            .await;
        assert!(matches!(result, Err(AgentError::Cancelled { .. })));
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn default_launcher_is_only_the_troupe_binary() {
        // The test binary is not `troupe`: no launcher unless one is named.
        assert_eq!(default_launcher(), None);
        let r = ProcessRunner::new().with_launcher("/usr/local/bin/troupe");
        assert_eq!(r.launcher(), Some(Path::new("/usr/local/bin/troupe")));
    }
}
