//! `ProcessRunner`: the shell tool's command runner. Runs argv as a child process (never via
//! a shell string) with a working directory, a timeout, an output cap and a scrubbed
//! environment; kills the child on timeout or cancellation.
//!
//! Sandboxing: only `full-access` runs today. A stricter policy that this runner cannot
//! enforce is refused with `SandboxError` rather than run unconfined.

use async_trait::async_trait;
use std::process::Stdio;
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;
use troupe_actors::ports::{CommandRunner, ExecOutput, ExecRequest};
use troupe_proto::{AgentError, SandboxPolicy};

/// Environment variables a command inherits; everything else is dropped.
const KEPT_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TERM", "TMPDIR", "USER"];

/// Runs commands as child processes.
#[derive(Debug, Clone, Default)]
pub struct ProcessRunner;

#[async_trait]
impl CommandRunner for ProcessRunner {
    async fn run(
        &self,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> Result<ExecOutput, AgentError> {
        if request.sandbox != SandboxPolicy::FullAccess {
            return Err(AgentError::SandboxError {
                message: format!(
                    "sandbox policy {:?} cannot be enforced by this runner; refusing to run `{}`",
                    request.sandbox,
                    request.argv.join(" ")
                ),
            });
        }
        let Some((program, args)) = request.argv.split_first() else {
            return Err(AgentError::invalid("empty command"));
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .env_clear();
        for key in KEPT_ENV {
            if let Ok(v) = std::env::var(key) {
                cmd.env(key, v);
            }
        }
        if let Some(dir) = &request.workdir {
            cmd.current_dir(dir);
        }
        let mut child = cmd.spawn().map_err(|e| AgentError::ToolError {
            name: "shell".into(),
            message: format!("cannot start `{program}`: {e}"),
        })?;
        let cap = request.output_cap;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let read_out = read_capped(stdout, cap);
        let read_err = read_capped(stderr, cap);
        let waited = async {
            let (out, err, status) = tokio::join!(read_out, read_err, child.wait());
            (out, err, status)
        };
        tokio::select! {
            ((stdout, out_trunc), (stderr, err_trunc), status) = waited => {
                let status = status.map_err(|e| AgentError::ToolError { name: "shell".into(), message: e.to_string() })?;
                Ok(ExecOutput {
                    exit_code: status.code(),
                    stdout,
                    stderr,
                    timed_out: false,
                    truncated: out_trunc || err_trunc,
                })
            }
            () = tokio::time::sleep(request.timeout) => {
                Ok(ExecOutput { timed_out: true, ..ExecOutput::default() })
            }
            () = cancel.cancelled() => Err(AgentError::cancelled("command cancelled")),
        }
        // Leaving the select drops the child future, and `kill_on_drop` kills the process.
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
        }
    }

    #[tokio::test]
    async fn runs_and_caps_output() {
        let out = ProcessRunner
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
    async fn unenforceable_sandbox_is_refused() {
        let err = ProcessRunner
            .run(
                req(&["true"], SandboxPolicy::ReadOnly),
                &CancellationToken::new(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, AgentError::SandboxError { .. }));
    }

    #[tokio::test]
    async fn environment_is_scrubbed() {
        // Whatever the test process has, the child sees only the kept variables.
        let out = ProcessRunner
            .run(
                req(&["env"], SandboxPolicy::FullAccess),
                &CancellationToken::new(),
            )
            .await
            .unwrap();
        for line in out.stdout.lines() {
            let key = line.split('=').next().unwrap_or_default();
            assert!(KEPT_ENV.contains(&key), "leaked {key}");
        }
    }
}
