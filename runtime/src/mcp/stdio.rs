//! Starting a stdio MCP server: the child process, its scrubbed environment, its stderr, and
//! the task that reaps it.
//!
//! The child gets `env_clear()` plus only the configured variables, so the command is
//! resolved against troupe's own `PATH` first (a server started through a
//! `#!/usr/bin/env node` script needs `PATH` in its configured `env`). It runs in a process
//! group of its own: a Ctrl-C at troupe's terminal reaches troupe, not its servers, and
//! killing the group also ends whatever the server started, whether troupe stops the server
//! or it exits on its own.

use super::Ending;
use super::tap::{TapReader, TaskSupportTap};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio_util::sync::CancellationToken;
use troupe_proto::AgentError;

/// A started server: the halves of its JSON-RPC pipe and the handle that ends it.
pub(crate) struct StdioChild {
    pub(crate) stdout: TapReader<ChildStdout>,
    pub(crate) stdin: ChildStdin,
    pub(crate) control: ChildControl,
}

/// Ends the child and tells when it has been reaped.
#[derive(Debug, Clone)]
pub(crate) struct ChildControl {
    pub(crate) pid: Option<u32>,
    /// Cancelling it kills the child's process group.
    kill: CancellationToken,
    /// Cancelled once `wait()` has returned: no zombie is left.
    reaped: CancellationToken,
}

impl ChildControl {
    /// Kills the child (idempotent) without waiting.
    pub(crate) fn kill(&self) {
        self.kill.cancel();
    }

    /// Kills the child and waits until it has been reaped.
    pub(crate) async fn kill_and_reap(&self) {
        self.kill.cancel();
        self.reaped.cancelled().await;
    }
}

/// Kills the child when dropped armed: a connect whose future is dropped during the
/// handshake (the pool's own connect timeout cut it) must not leave the server running, as
/// nothing else would stop it.
pub(crate) struct KillUnlessKept(Option<ChildControl>);

impl KillUnlessKept {
    pub(crate) fn new(control: &ChildControl) -> Self {
        Self(Some(control.clone()))
    }

    /// The connection holds the child now (and kills it when it closes).
    pub(crate) fn keep(&mut self) {
        self.0 = None;
    }
}

impl Drop for KillUnlessKept {
    fn drop(&mut self) {
        if let Some(control) = self.0.take() {
            control.kill();
        }
    }
}

pub(crate) struct SpawnRequest<'a> {
    pub(crate) server: &'a Arc<str>,
    pub(crate) command: &'a str,
    pub(crate) args: &'a [String],
    pub(crate) env: &'a BTreeMap<String, String>,
    pub(crate) cwd: Option<&'a Path>,
    pub(crate) tap: TaskSupportTap,
    pub(crate) ending: Arc<Ending>,
}

/// Starts the server process and the tasks that log its stderr and reap it.
pub(crate) fn spawn(request: SpawnRequest<'_>) -> Result<StdioChild, AgentError> {
    let server = request.server;
    let fail = |message: String| AgentError::McpError {
        server: server.to_string(),
        message,
    };
    let search_path = std::env::var_os("PATH").unwrap_or_default();
    let program = resolve_program(request.command, &search_path, request.cwd)
        .ok_or_else(|| fail(format!("command `{}` not found", request.command)))?;
    let mut cmd = Command::new(&program);
    cmd.args(request.args)
        .env_clear()
        .envs(request.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = request.cwd {
        cmd.current_dir(cwd);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| fail(format!("cannot start `{}`: {e}", program.display())))?;
    let pid = child.id();
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(fail("the child's stdio pipes are missing".into()));
    };
    tracing::info!(mcp_server = %server, pid, program = %program.display(), "mcp server started");
    tokio::spawn(log_stderr(server.clone(), stderr));
    let control = ChildControl {
        pid,
        kill: CancellationToken::new(),
        reaped: CancellationToken::new(),
    };
    tokio::spawn(supervise(child, control.clone(), request.ending));
    Ok(StdioChild {
        stdout: TapReader::new(stdout, request.tap),
        stdin,
        control,
    })
}

/// Where `command` is: itself when it names a path, else the first executable of that name
/// on `search_path` (troupe's `PATH`, since the child's environment has none).
pub(crate) fn resolve_program(
    command: &str,
    search_path: &std::ffi::OsStr,
    cwd: Option<&Path>,
) -> Option<PathBuf> {
    if command.is_empty() {
        return None;
    }
    if command.contains('/') {
        let path = PathBuf::from(command);
        // A relative path means the same thing whichever directory the child starts in.
        return Some(match cwd {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path,
        });
    }
    std::env::split_paths(search_path)
        .map(|dir| dir.join(command))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Every stderr line becomes a log event of the server (never part of the protocol).
async fn log_stderr(server: Arc<str>, stderr: ChildStderr) {
    let mut lines = BufReader::new(stderr).split(b'\n');
    while let Ok(Some(line)) = lines.next_segment().await {
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end_matches('\r');
        tracing::info!(mcp_server = %server, "{line}");
    }
}

/// Owns the child: waits for it to exit or kills it when asked, reaps it, and ends the
/// connection with the exit status as the reason.
async fn supervise(mut child: Child, control: ChildControl, ending: Arc<Ending>) {
    let status = tokio::select! {
        status = child.wait() => {
            // The server ended on its own: what it started in its group ends with it (a
            // group outlives its leader while members are left, so its id still names it).
            if let Some(pid) = control.pid {
                kill_group(pid);
            }
            status
        }
        _ = control.kill.cancelled() => {
            // The leader is not reaped yet, so its pid still names our group.
            if let Some(pid) = control.pid {
                kill_group(pid);
            }
            let _ = child.start_kill();
            child.wait().await
        }
    };
    let reason = match status {
        Ok(status) => format!("server process exited ({status})"),
        Err(e) => format!("waiting for the server process failed: {e}"),
    };
    tracing::info!(mcp_server = %ending.server, pid = control.pid, %reason, "mcp server reaped");
    ending.end(reason);
    control.reaped.cancel();
}

fn kill_group(pid: u32) {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    if let Ok(pid) = i32::try_from(pid) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    }

    /// A server that exits on its own takes what it started with it: its process group is
    /// killed once it is reaped, as when troupe stops it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_a_server_started_ends_when_the_server_exits_on_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("child.pid");
        let (notices, _rx) = tokio::sync::mpsc::unbounded_channel();
        let server: Arc<str> = Arc::from("exits");
        let ending = Arc::new(Ending::new(
            server.clone(),
            super::super::metrics::Transport::Stdio,
            notices,
        ));
        let args = vec![
            "-c".to_owned(),
            format!("/bin/sleep 600 & echo $! > {}; exit 3", pidfile.display()),
        ];
        let child = spawn(SpawnRequest {
            server: &server,
            command: "/bin/sh",
            args: &args,
            env: &BTreeMap::new(),
            cwd: None,
            tap: TaskSupportTap::default(),
            ending,
        })
        .unwrap();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            child.control.reaped.cancelled(),
        )
        .await
        .expect("reaped");
        let sleeper: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let t0 = std::time::Instant::now();
        while alive(sleeper) {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(5),
                "the server's child {sleeper} outlived it"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    #[test]
    fn resolves_a_bare_name_on_the_search_path() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("tool");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();

        let path = std::env::join_paths(["/nonexistent".into(), dir.path().to_path_buf()]).unwrap();
        assert_eq!(resolve_program("tool", &path, None), Some(exe));
        // Not executable: skipped.
        assert_eq!(resolve_program("plain", &path, None), None);
        assert_eq!(resolve_program("missing", &path, None), None);
        assert_eq!(resolve_program("", &path, None), None);
    }

    #[test]
    fn a_path_is_taken_as_given_relative_to_the_child_directory() {
        let empty = OsString::new();
        assert_eq!(
            resolve_program("/usr/bin/env", &empty, None),
            Some(PathBuf::from("/usr/bin/env"))
        );
        assert_eq!(
            resolve_program("./srv", &empty, Some(Path::new("/work"))),
            Some(PathBuf::from("/work/./srv"))
        );
    }
}
