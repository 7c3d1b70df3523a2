//! The sandbox launcher: `troupe sandbox-exec --policy P [--writable DIR]... -- PROGRAM ARGS...`.
//!
//! A command under `read-only` or `workspace-write` does not start directly. The runner starts
//! this launcher instead; it starts a new session (`setsid`: no controlling terminal, so no
//! writing to the user's terminal, and a process group of its own, which the runner kills
//! with the command), confines itself with Landlock (`landlock_restrict_self`: the
//! calling thread and everything it execs or forks from then on) and then replaces itself with
//! the command (`execvp`), so the command and all its descendants run inside the ruleset. The
//! workspace forbids `unsafe`, which rules out a `pre_exec` hook in the runner; a launcher
//! process is the safe equivalent.
//!
//! Policies (filesystem rights of Landlock ABI 3, Linux 6.2+: every way to change a file,
//! including truncation and cross-directory renames):
//! - `read-only`: read and execute everywhere; write only to [`WRITABLE_DEVICES`].
//! - `workspace-write`: the same, plus every right under each `--writable` directory (the
//!   workspace roots and the runner's private temp dir).
//! - `full-access`: no ruleset; the launcher only execs.
//!
//! Isolation, under `read-only` and `workspace-write`, where the kernel has it (Landlock ABI 6,
//! Linux 6.12+; on an older kernel the filesystem rules alone apply): no TCP connection made
//! or port bound (so no reaching troupe's own API, or anything else, over the network), no
//! signal sent to a process outside the sandbox, no abstract Unix socket outside it reached.
//!
//! A policy the kernel cannot fully enforce (no Landlock, an older ABI, a ruleset enforced only
//! in part, `no_new_privs` not set, no new session) is refused: the command never runs. The runner learns why
//! from the exit protocol below, so a refusal is a `SandboxError`, not a command failure.
//!
//! Exit protocol: a refusal prints one stderr line starting with [`REFUSED_PREFIX`] and exits
//! with [`REFUSED_EXIT`]; a command that cannot be started prints [`EXEC_FAILED_PREFIX`] and
//! exits with [`EXEC_FAILED_EXIT`]. Otherwise the exit status is the command's own.

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, RestrictionStatus, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;
use troupe_proto::{AgentError, SandboxPolicy};

/// The hidden subcommand of the `troupe` binary that runs [`main`].
pub const SUBCOMMAND: &str = "sandbox-exec";

/// Exit status of a refused launch (chosen outside the shell's 126/127 and signal range).
pub const REFUSED_EXIT: u8 = 125;
/// First bytes of the stderr line of a refused launch.
pub const REFUSED_PREFIX: &str = "troupe sandbox-exec: refused: ";
/// Exit status when the command itself cannot be started (as a shell reports it).
pub const EXEC_FAILED_EXIT: u8 = 127;
/// First bytes of the stderr line when the command cannot be started.
pub const EXEC_FAILED_PREFIX: &str = "troupe sandbox-exec: cannot run ";

/// The Landlock ABI whose filesystem rights define "a write": ABI 3 adds truncation, the last
/// right that changes file contents. Asking for it on an older kernel gives a partially
/// enforced ruleset, which is refused.
const ABI_FLOOR: ABI = ABI::V3;

/// Devices any policy may write: writing to them changes no file. Not `/dev/tty`: the
/// command has no controlling terminal, and the user's terminal is not its to write on.
pub const WRITABLE_DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];

/// What one launch enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    pub policy: SandboxPolicy,
    /// Directories a `workspace-write` command may change (ignored by the other policies).
    pub writable: Vec<PathBuf>,
}

/// The policy's name on the launcher's command line.
pub const fn policy_arg(policy: SandboxPolicy) -> &'static str {
    match policy {
        SandboxPolicy::ReadOnly => "read-only",
        SandboxPolicy::WorkspaceWrite => "workspace-write",
        SandboxPolicy::FullAccess => "full-access",
    }
}

/// Reads a policy name (`read-only`, `workspace-write`, `full-access`; `_` for `-` too).
pub fn parse_policy(name: &str) -> Result<SandboxPolicy, AgentError> {
    match name.replace('_', "-").as_str() {
        "read-only" => Ok(SandboxPolicy::ReadOnly),
        "workspace-write" => Ok(SandboxPolicy::WorkspaceWrite),
        "full-access" => Ok(SandboxPolicy::FullAccess),
        other => Err(AgentError::invalid(format!(
            "unknown sandbox policy `{other}` (read-only, workspace-write, full-access)"
        ))),
    }
}

/// The launcher's arguments (after its program path) that run `argv` under `spec`.
pub fn launcher_args(spec: &SandboxSpec, argv: &[String]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        SUBCOMMAND.into(),
        "--policy".into(),
        policy_arg(spec.policy).into(),
    ];
    for dir in &spec.writable {
        args.push("--writable".into());
        args.push(dir.clone().into_os_string());
    }
    args.push("--".into());
    args.extend(argv.iter().map(OsString::from));
    args
}

/// Parses what follows the subcommand: `--policy P [--writable DIR]... -- PROGRAM ARGS...`.
/// Returns the spec and the command's argv (never empty).
pub fn parse_args(args: &[OsString]) -> Result<(SandboxSpec, Vec<OsString>), AgentError> {
    let mut policy = None;
    let mut writable = Vec::new();
    let mut rest = args.iter();
    loop {
        let Some(arg) = rest.next() else {
            return Err(AgentError::invalid(
                "missing `--` before the command to run",
            ));
        };
        match arg.to_str() {
            Some("--") => break,
            Some("--policy") => {
                let value = rest
                    .next()
                    .and_then(|v| v.to_str())
                    .ok_or_else(|| AgentError::invalid("--policy needs a value"))?;
                policy = Some(parse_policy(value)?);
            }
            Some("--writable") => {
                let dir = rest
                    .next()
                    .ok_or_else(|| AgentError::invalid("--writable needs a directory"))?;
                writable.push(PathBuf::from(dir));
            }
            _ => {
                return Err(AgentError::invalid(format!(
                    "unexpected launcher argument `{}`",
                    arg.to_string_lossy()
                )));
            }
        }
    }
    let argv: Vec<OsString> = rest.cloned().collect();
    if argv.is_empty() {
        return Err(AgentError::invalid("no command after `--`"));
    }
    let policy = policy.ok_or_else(|| AgentError::invalid("missing --policy"))?;
    Ok((SandboxSpec { policy, writable }, argv))
}

/// Confines the calling thread, and every process it starts from now on, to `spec`. Fails
/// (leaving the thread possibly confined in part, so the caller must not go on to run
/// anything) unless the kernel enforces the whole policy.
pub fn restrict_current_thread(spec: &SandboxSpec) -> Result<(), AgentError> {
    if spec.policy == SandboxPolicy::FullAccess {
        return Ok(());
    }
    let status = apply_ruleset(spec).map_err(|e| AgentError::SandboxError {
        message: format!(
            "cannot set up the {} Landlock ruleset: {e}",
            policy_arg(spec.policy)
        ),
    })?;
    check_status(spec.policy, &status.ruleset, status.no_new_privs)
}

fn apply_ruleset(spec: &SandboxSpec) -> Result<RestrictionStatus, landlock::RulesetError> {
    // With the isolation when the kernel has all of it (asked as a hard requirement, so that
    // an older kernel refuses it before anything is restricted), else the filesystem alone.
    match ruleset(spec, true) {
        Ok(created) => created.restrict_self(),
        Err(_) => ruleset(spec, false)?.restrict_self(),
    }
}

/// The ruleset of `spec`: its filesystem rules, and with `isolated` no TCP, no signals and no
/// abstract Unix sockets outside the sandbox.
fn ruleset(spec: &SandboxSpec, isolated: bool) -> Result<RulesetCreated, landlock::RulesetError> {
    let read = AccessFs::from_read(ABI_FLOOR);
    let all = AccessFs::from_all(ABI_FLOOR);
    let writable: &[PathBuf] = match spec.policy {
        SandboxPolicy::WorkspaceWrite => &spec.writable,
        SandboxPolicy::ReadOnly | SandboxPolicy::FullAccess => &[],
    };
    let mut rules = Ruleset::default().handle_access(all)?;
    if isolated {
        // No port is allowed: handled and never granted.
        rules = rules
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?
            .scope(Scope::AbstractUnixSocket | Scope::Signal)?;
    }
    // A path that does not exist gets no rule (so no access), which only narrows the policy.
    rules
        .create()?
        .add_rules(path_beneath_rules(["/"], read))?
        .add_rules(path_beneath_rules(WRITABLE_DEVICES, all))?
        .add_rules(path_beneath_rules(writable, all))
}

/// Whether a restriction enforced everything the policy asks for.
fn check_status(
    policy: SandboxPolicy,
    ruleset: &RulesetStatus,
    no_new_privs: bool,
) -> Result<(), AgentError> {
    let refused = |why: &str| {
        Err(AgentError::SandboxError {
            message: format!("the {} sandbox {why}", policy_arg(policy)),
        })
    };
    match ruleset {
        RulesetStatus::FullyEnforced if no_new_privs => Ok(()),
        RulesetStatus::FullyEnforced => refused("could not set no_new_privs"),
        RulesetStatus::PartiallyEnforced => refused(
            "is only partly enforced by this kernel (Landlock ABI 3, Linux 6.2 or later, is needed)",
        ),
        RulesetStatus::NotEnforced => {
            refused("cannot be enforced: Landlock is not available in this kernel")
        }
    }
}

/// The launcher's entry point: `args` are what follows the subcommand. Confines itself and
/// execs the command; returns only when it refuses or the command cannot start.
pub fn main(args: &[OsString]) -> ExitCode {
    let (spec, argv) = match parse_args(args) {
        Ok(parsed) => parsed,
        Err(e) => return refuse(&e),
    };
    // A new session: no controlling terminal (nothing to write to or read from the user's
    // terminal through `/dev/tty`), and a process group of its own that the runner kills.
    if let Err(e) = nix::unistd::setsid() {
        return refuse(&AgentError::SandboxError {
            message: format!("cannot start a new session for the command: {e}"),
        });
    }
    if let Err(e) = restrict_current_thread(&spec) {
        return refuse(&e);
    }
    let Some((program, rest)) = argv.split_first() else {
        return refuse(&AgentError::invalid("no command"));
    };
    // `exec` returns only on failure.
    let error = std::process::Command::new(program).args(rest).exec();
    eprintln!(
        "{EXEC_FAILED_PREFIX}`{}`: {error}",
        program.to_string_lossy()
    );
    ExitCode::from(EXEC_FAILED_EXIT)
}

fn refuse(error: &AgentError) -> ExitCode {
    let message = match error {
        AgentError::SandboxError { message } => message.clone(),
        other => other.to_string(),
    };
    eprintln!("{REFUSED_PREFIX}{message}");
    ExitCode::from(REFUSED_EXIT)
}

/// How a launch ended, read from the launcher's exit status and stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchFailure {
    /// The launcher refused: the command never ran.
    Refused(String),
    /// The command could not be started.
    ExecFailed(String),
}

/// Reads the exit protocol: `None` when the command ran (whatever its status).
pub fn launch_failure(exit_code: Option<i32>, stderr: &str) -> Option<LaunchFailure> {
    let line = stderr.lines().next().unwrap_or_default();
    match exit_code {
        Some(code) if code == i32::from(REFUSED_EXIT) => line
            .strip_prefix(REFUSED_PREFIX)
            .map(|m| LaunchFailure::Refused(m.to_owned())),
        Some(code) if code == i32::from(EXEC_FAILED_EXIT) => line
            .strip_prefix(EXEC_FAILED_PREFIX)
            .map(|m| LaunchFailure::ExecFailed(m.to_owned())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::path::Path;
    use std::process::Command;

    /// Runs `body` on a fresh thread confined to `spec` (Landlock confines one thread and what
    /// it starts, so the test process itself stays free).
    fn confined<T: Send + 'static>(
        spec: SandboxSpec,
        body: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        std::thread::spawn(move || {
            restrict_current_thread(&spec).expect("this kernel enforces Landlock ABI 3");
            body()
        })
        .join()
        .unwrap()
    }

    fn sh(script: &str, dir: &Path) -> std::process::ExitStatus {
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .status()
            .unwrap()
    }

    #[test]
    fn read_only_denies_every_write_but_devices() {
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("existing.txt");
        std::fs::write(&existing, "before").unwrap();
        let root = dir.path().to_path_buf();
        let spec = SandboxSpec {
            policy: SandboxPolicy::ReadOnly,
            writable: vec![root.clone()],
        };
        let (new_file, overwrite, read, dev_null, child, child_rm) = confined(spec, move || {
            (
                std::fs::write(root.join("new.txt"), "x").map_err(|e| e.kind()),
                std::fs::write(root.join("existing.txt"), "after").map_err(|e| e.kind()),
                std::fs::read_to_string(root.join("existing.txt")).unwrap(),
                std::fs::write("/dev/null", "x").is_ok(),
                sh("echo hi > child.txt", &root).success(),
                sh("rm existing.txt", &root).success(),
            )
        });
        assert_eq!(new_file, Err(std::io::ErrorKind::PermissionDenied));
        assert_eq!(overwrite, Err(std::io::ErrorKind::PermissionDenied));
        assert_eq!(read, "before");
        assert!(dev_null);
        assert!(!child && !child_rm);
        assert!(!dir.path().join("new.txt").exists());
        assert!(!dir.path().join("child.txt").exists());
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "before");
    }

    #[test]
    fn workspace_write_allows_the_workspace_only() {
        let workspace = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let (inside_dir, outside_dir) = (workspace.path().to_owned(), outside.path().to_owned());
        let spec = SandboxSpec {
            policy: SandboxPolicy::WorkspaceWrite,
            writable: vec![inside_dir.clone()],
        };
        let (inside, nested, outside_write, outside_child) = confined(spec, move || {
            (
                std::fs::write(inside_dir.join("a.txt"), "ok").is_ok(),
                sh(
                    "mkdir -p sub && echo deep > sub/b.txt && mv sub/b.txt c.txt",
                    &inside_dir,
                )
                .success(),
                std::fs::write(outside_dir.join("x.txt"), "no").map_err(|e| e.kind()),
                sh("echo no > y.txt", &outside_dir).success(),
            )
        });
        assert!(inside && nested);
        assert_eq!(
            std::fs::read_to_string(workspace.path().join("c.txt")).unwrap(),
            "deep\n"
        );
        assert_eq!(outside_write, Err(std::io::ErrorKind::PermissionDenied));
        assert!(!outside_child);
        assert!(!outside.path().join("x.txt").exists());
        assert!(!outside.path().join("y.txt").exists());
    }

    #[test]
    fn full_access_sets_no_ruleset() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let spec = SandboxSpec {
            policy: SandboxPolicy::FullAccess,
            writable: vec![],
        };
        assert!(confined(spec, move || std::fs::write(root.join("f"), "x").is_ok()));
    }

    #[test]
    fn partial_or_missing_enforcement_is_refused() {
        for (ruleset, no_new_privs, ok) in [
            (RulesetStatus::FullyEnforced, true, true),
            (RulesetStatus::FullyEnforced, false, false),
            (RulesetStatus::PartiallyEnforced, true, false),
            (RulesetStatus::NotEnforced, true, false),
        ] {
            let checked = check_status(SandboxPolicy::ReadOnly, &ruleset, no_new_privs);
            assert_eq!(checked.is_ok(), ok, "{ruleset:?} {no_new_privs}");
            if let Err(e) = checked {
                assert!(matches!(e, AgentError::SandboxError { .. }), "{e}");
            }
        }
    }

    #[test]
    fn exit_protocol_is_recognised() {
        let refused = format!("{REFUSED_PREFIX}no landlock\n");
        assert_eq!(
            launch_failure(Some(125), &refused),
            Some(LaunchFailure::Refused("no landlock".into()))
        );
        let failed = format!("{EXEC_FAILED_PREFIX}`nope`: No such file\n");
        assert_eq!(
            launch_failure(Some(127), &failed),
            Some(LaunchFailure::ExecFailed("`nope`: No such file".into()))
        );
        // The command's own status 125 or 127 is just its status.
        assert_eq!(launch_failure(Some(125), "boom"), None);
        assert_eq!(launch_failure(Some(127), "sh: nope: not found"), None);
        assert_eq!(launch_failure(Some(0), &refused), None);
    }

    #[test]
    fn bad_launcher_arguments_are_rejected() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        for args in [
            os(&["--policy", "read-only"]),
            os(&["--policy", "read-only", "--"]),
            os(&["--", "true"]),
            os(&["--policy", "nope", "--", "true"]),
            os(&["--policy"]),
            os(&["--bogus", "--", "true"]),
        ] {
            assert!(parse_args(&args).is_err(), "{args:?}");
        }
        assert_eq!(
            parse_policy("workspace_write").unwrap(),
            SandboxPolicy::WorkspaceWrite
        );
    }

    fn policy() -> impl Strategy<Value = SandboxPolicy> {
        prop_oneof![
            Just(SandboxPolicy::ReadOnly),
            Just(SandboxPolicy::WorkspaceWrite),
            Just(SandboxPolicy::FullAccess),
        ]
    }

    proptest! {
        #[test]
        fn launcher_args_parse_back(
            policy in policy(),
            writable in prop::collection::vec("/[a-z -]{1,12}", 0..3),
            argv in prop::collection::vec("[ -~]{0,10}", 1..5),
        ) {
            let spec = SandboxSpec {
                policy,
                writable: writable.iter().map(PathBuf::from).collect(),
            };
            let args = launcher_args(&spec, &argv);
            prop_assert_eq!(args[0].to_str(), Some(SUBCOMMAND));
            let (back, back_argv) = parse_args(&args[1..]).unwrap();
            prop_assert_eq!(back, spec);
            let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
            prop_assert_eq!(back_argv, argv);
        }
    }
}
