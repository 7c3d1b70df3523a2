//! `ProcessRunner`: the shell tool's command runner. Runs argv as a child process (never via
//! a shell string) with a working directory, a timeout, an output cap and a scrubbed
//! environment, in its own process group, which is killed on timeout or cancellation.
//!
//! Sandboxing (see [`sandbox`]): `full-access` runs the command directly. `read-only` and
//! `workspace-write` run it through the sandbox launcher (`troupe sandbox-exec`), which
//! confines itself with Landlock and then execs the command. A policy that cannot be fully
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
            // Its own group, so a timeout or cancellation kills what it started too.
            .process_group(0)
            .env_clear();
        for key in KEPT_ENV {
            if let Ok(v) = std::env::var(key) {
                cmd.env(key, v);
            }
        }
        if let Some(dir) = &tmp {
            cmd.env("TMPDIR", dir.path());
        }
        if let Some(dir) = &request.workdir {
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
        let cap = request.output_cap;
        let read_out = read_capped(child.stdout.take(), cap);
        // The launcher's protocol line must survive a small cap; the cap is applied after.
        let read_err = read_capped(child.stderr.take(), cap.max(PROTOCOL_BYTES));
        let waited = async {
            let (out, err, status) = tokio::join!(read_out, read_err, child.wait());
            (out, err, status)
        };
        let ((stdout, out_trunc), (stderr, err_trunc), status) = tokio::select! {
            done = waited => done,
            () = tokio::time::sleep(request.timeout) => {
                kill_group(pid);
                tracing::info!(timeout_ms = u64::try_from(request.timeout.as_millis()).unwrap_or(u64::MAX), "command timed out; killed its process group");
                return Ok(ExecOutput { timed_out: true, ..ExecOutput::default() });
            }
            () = cancel.cancelled() => {
                kill_group(pid);
                return Err((AgentError::cancelled("command cancelled"), Outcome::Cancelled));
            }
        };
        // Leaving early drops `child`, and `kill_on_drop` kills (and reaps) the leader.
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

/// Kills the command's process group. Called before the leader is reaped, so its pid still
/// names our group.
fn kill_group(pid: Option<u32>) {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

async fn read_capped<R: tokio::io::AsyncRead + Unpin>(
    pipe: Option<R>,
    cap: usize,
) -> (String, bool) {
    let Some(mut pipe) = pipe else {
        return (String::new(), false);
    };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut truncated = false;
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(buf.len());
                if n > room {
                    truncated = true;
                }
                buf.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
    }
    (String::from_utf8_lossy(&buf).into_owned(), truncated)
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
