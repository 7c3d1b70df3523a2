//! `troupe chat --once` and `troupe serve` choosing what a user means: a base URL or the
//! `OPENAI_*` variables pick an OpenAI-compatible server; MCP servers are connected before the
//! one turn; approvals and elicitations are answered without a terminal as the flags say;
//! tokenizer names are checked; `--ephemeral` writes nothing. Real processes, the test model
//! server, the npm MCP servers.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use troupe_test_support::mcp::server_entry;
use troupe_test_support::{CallScript, ModelServer, Reply};
use troupe_tests::troupe_bin;

/// Variables that would choose the model or the configuration for the child.
const MODEL_ENV: [&str; 7] = [
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "TROUPE_CONFIG",
    "TROUPE_PROVIDER",
    "TROUPE_BASE_URL",
    "TROUPE_SCRIPT",
    "TROUPE_TOKENIZER_MODEL",
];

/// `troupe` in `cwd`, stdin closed, with none of the model variables of this process.
fn troupe(cwd: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(troupe_bin());
    for k in MODEL_ENV {
        cmd.env_remove(k);
    }
    cmd.current_dir(cwd).stdin(Stdio::null());
    cmd
}

async fn output(mut cmd: tokio::process::Command) -> Output {
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("troupe did not finish in time")
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `cmd`, checks that it exits with `code` and that its stderr says `says`; its output.
async fn exits_saying(cmd: tokio::process::Command, code: i32, says: &str) -> Output {
    let out = output(cmd).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert!(stderr.contains(says), "{says:?} not in {stderr}");
    out
}

/// Every path under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().to_owned());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

// ----- provider selection -----

#[tokio::test]
async fn a_base_url_alone_picks_that_server() {
    let server = ModelServer::start().await;
    server.push(Reply::text(["hi ", "from the server"]));
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "--base-url", &server.base_url()])
        .args(["--model", "m", "say hi"]);
    let out = output(cmd).await;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(text(&out.stdout).trim(), "hi from the server");
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert!(
        requests[0].path.ends_with("/chat/completions"),
        "Chat Completions unless told otherwise: {}",
        requests[0].path
    );
    assert_eq!(requests[0].body["model"], "m");
    let line = format!("openai-chat at {}, model m", server.base_url());
    assert!(
        stderr.contains(&line),
        "stderr names the endpoint: {stderr}"
    );
    assert!(!stderr.contains("scripted"), "{stderr}");
}

/// The logs on stderr are plain text when stderr is no terminal (a pipe here): no colour
/// codes in a log file.
#[tokio::test]
async fn logs_to_a_pipe_have_no_colour_codes() {
    let server = ModelServer::start().await;
    server.push(Reply::error(400, "bad request"));
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = troupe(dir.path());
    cmd.env_remove("NO_COLOR")
        .env("TROUPE_LOG", "info")
        .args([
            "chat",
            "--once",
            "--ephemeral",
            "--base-url",
            &server.base_url(),
        ])
        .args(["--model", "m", "say hi"]);
    let out = output(cmd).await;
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(" INFO ") || stderr.contains(" WARN "),
        "logs were written: {stderr}"
    );
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}

#[tokio::test]
async fn openai_variables_pick_the_server_and_a_provider_flag_the_wire_format() {
    let server = ModelServer::start().await;
    server.push(Reply::text(["over chat"]));
    server.push(Reply::text(["over responses"]));
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &'static [&'static str]| {
        let mut cmd = troupe(dir.path());
        cmd.args(["chat", "--once", "say hi"])
            .args(extra)
            .env("OPENAI_BASE_URL", server.base_url())
            .env("OPENAI_API_KEY", "sk-from-env");
        output(cmd)
    };
    let out = run(&[]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "over chat");
    assert!(
        text(&out.stderr).contains(&format!("openai-chat at {}", server.base_url())),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["--provider", "openai-responses"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "over responses");
    assert!(text(&out.stderr).contains("openai-responses at"));
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests[0].path.ends_with("/chat/completions"));
    assert!(requests[1].path.ends_with("/responses"));
    for r in &requests {
        assert_eq!(r.header("authorization"), Some("Bearer sk-from-env"));
    }
    // A provider named scripted keeps the scripted model whatever the variables say.
    let out = run(&["--provider", "scripted"]).await;
    assert!(out.status.success());
    assert_eq!(text(&out.stdout).trim(), "You said: say hi");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn serve_chooses_the_same_way() {
    let server = ModelServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    // stdin at its end: the stdio server stops at once.
    let mut cmd = troupe(dir.path());
    cmd.args(["serve", "--stdio", "--ephemeral"])
        .env("OPENAI_BASE_URL", server.base_url());
    let out = output(cmd).await;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("openai-chat at {}", server.base_url())),
        "{stderr}"
    );
    let mut cmd = troupe(dir.path());
    cmd.args(["serve", "--stdio", "--ephemeral"]);
    let out = output(cmd).await;
    assert!(text(&out.stderr).contains("scripted model"));
}

// ----- tokenizer names -----

#[tokio::test]
async fn tokenizer_names_are_encodings_models_or_approx() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["o200k_base", "cl100k_base", "p50k_base", "gpt-4o", "approx"] {
        let mut cmd = troupe(dir.path());
        cmd.args([
            "chat",
            "--once",
            "--ephemeral",
            "--json",
            "--tokenizer-model",
            name,
        ])
        .arg("count me");
        let out = output(cmd).await;
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(reply["stats"]["estimated_prompt_tokens"].as_u64().unwrap() > 0);
    }
    for name in ["o200k", "llama3", "gpt4o"] {
        let mut cmd = troupe(dir.path());
        cmd.args(["chat", "--once", "--tokenizer-model", name, "count me"]);
        let out = output(cmd).await;
        assert_eq!(out.status.code(), Some(1), "{name}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!("unknown tokenizer `{name}`"))
                && stderr.contains("o200k_base")
                && stderr.contains("gpt-4o")
                && stderr.contains("approx"),
            "{stderr}"
        );
        assert!(out.stdout.is_empty(), "no turn ran");
    }
    let mut cmd = troupe(dir.path());
    cmd.args(["serve", "--stdio", "--ephemeral"])
        .env("TROUPE_TOKENIZER_MODEL", "nonsense");
    let out = output(cmd).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("unknown tokenizer `nonsense`"), "{stderr}");
    // Named with the setting it came from, as a bad value of any other setting is.
    assert!(
        stderr.contains("chat.tokenizer_model (TROUPE_TOKENIZER_MODEL"),
        "{stderr}"
    );
    assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
}

#[tokio::test]
async fn bad_settings_are_refused_before_a_turn_and_a_turn_the_step_limit_stops_says_so() {
    let dir = tempfile::tempdir().unwrap();
    // Zero, from each place a limit comes from: refused before any turn, naming the setting.
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "--ephemeral", "--max-steps", "0", "hi"]);
    exits_saying(cmd, 2, "--max-steps").await;
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "--ephemeral", "hi"])
        .env("TROUPE_MAX_STEPS", "0");
    let bad_env = "bad value for TROUPE_MAX_STEPS: `0` (a whole number of at least 1)";
    exits_saying(cmd, 1, bad_env).await;
    let config = dir.path().join("zero.toml");
    std::fs::write(&config, "[chat]\nmax_steps = 0\n").unwrap();
    let mut cmd = troupe(dir.path());
    cmd.args(["serve", "--stdio", "--ephemeral", "--config"])
        .arg(&config);
    exits_saying(cmd, 1, "chat.max_steps must be at least 1").await;
    assert_eq!(tree(dir.path()), vec![PathBuf::from("zero.toml")]);
    // A configuration file that is not there: said once, with the reason.
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "--config", "missing.toml", "hi"]);
    let out = exits_saying(cmd, 1, "missing.toml").await;
    assert_eq!(
        text(&out.stderr).trim(),
        "troupe: cannot read config file missing.toml: No such file or directory (os error 2)"
    );

    // A model that calls a tool at every step, against a limit of one step: the turn ends
    // with max_steps (exit 3), and stderr says why, which the reply alone does not.
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        serde_json::json!({"replies": [
            {"text": "", "tool_calls": [{"name": "shell", "arguments": {"command": ["true"]}}]},
            {"text": "never reached"},
        ]})
        .to_string(),
    )
    .unwrap();
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "--ephemeral", "--script"])
        .arg(&script)
        .args(["--approval-policy", "never", "--max-steps", "1", "run it"]);
    let stopped = "turn ended with max_steps: stopped after 1 step without a final answer \
                   (raise --max-steps";
    exits_saying(cmd, 3, stopped).await;
    // With --json too: stdout is the reply's JSON, stderr says why.
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "--ephemeral", "--json", "--script"])
        .arg(&script)
        .args(["--approval-policy", "never", "--max-steps", "1", "run it"]);
    let out = exits_saying(cmd, 3, stopped).await;
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["status"], "max_steps");

    // A bad --allow-tool is refused before anything runs or is written.
    let empty = tempfile::tempdir().unwrap();
    let mut cmd = troupe(empty.path());
    cmd.args(["chat", "--once", "--allow-tool", "fs/read", "hi"]);
    exits_saying(cmd, 1, "allow-tool").await;
    assert!(tree(empty.path()).is_empty(), "{:?}", tree(empty.path()));
}

#[tokio::test]
async fn what_cannot_work_together_is_said_before_anything_runs_or_is_written() {
    let dir = tempfile::tempdir().unwrap();
    // A token is counted in the data directory's store; --ephemeral writes nothing.
    let mut cmd = troupe(dir.path());
    cmd.args([
        "chat",
        "--once",
        "--ephemeral",
        "--auth-token",
        "tat_x",
        "hi",
    ]);
    exits_saying(cmd, 1, "--ephemeral writes nothing").await;
    assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
    // `/hub` without agents is refused, not sent to the model as text.
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "--ephemeral", "/hub coder write it"]);
    let out = exits_saying(cmd, 2, "no agents are defined in this session").await;
    assert!(
        !text(&out.stdout).contains("You said"),
        "{}",
        text(&out.stdout)
    );
    // A script next to a configured endpoint: the endpoint answers, and stderr says the
    // script is not used.
    let server = ModelServer::start().await;
    server.push(Reply::text(["from the server"]));
    let script = dir.path().join("script.json");
    std::fs::write(&script, r#"{"replies": [{"text": "from the script"}]}"#).unwrap();
    let mut cmd = troupe(dir.path());
    cmd.args([
        "chat",
        "--once",
        "--ephemeral",
        "--base-url",
        &server.base_url(),
    ])
    .arg("--script")
    .arg(&script)
    .arg("hi");
    let ignored = "--script (or TROUPE_SCRIPT) is for the scripted model; ignored";
    let out = exits_saying(cmd, 0, ignored).await;
    assert_eq!(text(&out.stdout).trim(), "from the server");
}

/// SIGINT (Ctrl-C) during a `--once` turn cancels the turn, not the program: it says so and
/// exits 4.
#[tokio::test]
async fn ctrl_c_cancels_a_once_turn_and_exits_4() {
    let server = ModelServer::start().await;
    server.push(Reply::text(["too late"]).delayed(Duration::from_secs(60)));
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = troupe(dir.path());
    cmd.args([
        "chat",
        "--once",
        "--ephemeral",
        "--base-url",
        &server.base_url(),
    ])
    .args(["--model", "m", "wait for it"])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    // Once the model has the request, the turn is running.
    let t0 = std::time::Instant::now();
    while server.requests().is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the turn never asked the model"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the turn ends")
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("cancelling the turn"), "{stderr}");
}

/// A turn whose model ignores the cancellation is aborted after the close timeout: still a
/// cancelled turn, exit 4, not a failure to run (1).
#[tokio::test]
async fn ctrl_c_on_a_model_that_ignores_it_still_exits_4() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("hang.json");
    std::fs::write(
        &script,
        r#"{"replies":[{"hang":true,"honour_cancel":false}]}"#,
    )
    .unwrap();
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "--ephemeral", "--json", "--script"])
        .arg(&script)
        .arg("hang")
        .env("TROUPE_CLOSE_TIMEOUT", "300ms")
        .env("TROUPE_LOG", "troupe_actors::scheduler=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    // Once its task holds a slot, the turn runs (and Ctrl-C is the turn's, not the process's).
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stderr.take().unwrap()));
    let mut stderr = String::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            stderr.push_str(&line);
            stderr.push('\n');
            if line.contains("slot granted") {
                return;
            }
        }
        panic!("the turn never started: {stderr}");
    })
    .await
    .expect("the turn starts");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let rest = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            stderr.push_str(&line);
            stderr.push('\n');
        }
    };
    let (out, ()) = tokio::time::timeout(
        Duration::from_secs(30),
        futures::future::join(child.wait_with_output(), rest),
    )
    .await
    .expect("the turn ends");
    let out = out.unwrap();
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("turn ended with cancelled: aborted: the task ignored cancellation"),
        "{stderr}"
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["status"], "cancelled", "{json}");
}

/// A turn that failed before any text prints nothing on stdout (not an empty line); `--json`
/// is for `--once` and refused without it rather than ignored.
#[tokio::test]
async fn a_failed_turn_prints_nothing_and_json_needs_once() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("down.json");
    std::fs::write(&script, r#"{"replies":[{"error":"the model is down"}]}"#).unwrap();
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "--ephemeral", "--script"])
        .arg(&script)
        .arg("hi");
    let out = exits_saying(cmd, 2, "the model is down").await;
    assert_eq!(text(&out.stdout), "", "nothing on stdout");
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--ephemeral", "--json"]);
    exits_saying(cmd, 2, "--once").await;
    // No prompt fits in 0 tokens: refused by the parser, not at the turn.
    let mut cmd = troupe(dir.path());
    cmd.args([
        "chat",
        "--once",
        "--ephemeral",
        "--max-prompt-tokens",
        "0",
        "hi",
    ]);
    exits_saying(cmd, 2, "--max-prompt-tokens").await;
}

/// The history file holds the conversation: readable by its user alone, as the rollout is.
#[tokio::test]
async fn the_history_file_is_the_users_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "hi"]);
    exits_saying(cmd, 0, "scripted").await;
    let files: Vec<_> = tree(dir.path())
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    assert!(files.iter().any(|p| p.starts_with("history")), "{files:?}");
    for file in files {
        let mode = std::fs::metadata(dir.path().join(&file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{} is {mode:o}", file.display());
    }
}

/// A data or history directory that cannot be made is said as such before anything runs,
/// and leaves nothing behind.
#[tokio::test]
async fn a_directory_that_cannot_be_made_is_named_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("afile"), "").unwrap();
    for (flag, what) in [("--log-dir", "history"), ("--data-dir", "data")] {
        let mut cmd = troupe(dir.path());
        cmd.args(["chat", "--once", flag, "afile", "hi"]);
        let out = exits_saying(cmd, 1, &format!("cannot create the {what} directory afile")).await;
        let stderr = text(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let left: Vec<_> = tree(dir.path())
        .into_iter()
        .filter(|p| p.starts_with("data"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn a_once_turn_prints_its_warnings_on_stderr_and_only_the_reply_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = troupe(dir.path());
    cmd.args([
        "chat",
        "--once",
        "--ephemeral",
        "--warn-prompt-tokens",
        "1",
        "hi",
    ]);
    let out = exits_saying(cmd, 0, "troupe: warning: prompt is ").await;
    assert_eq!(text(&out.stdout), "You said: hi\n");
    assert!(text(&out.stderr).contains("above warn-prompt-tokens 1"));
}

// ----- --ephemeral -----

#[tokio::test]
async fn ephemeral_chat_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data-dir");
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "--ephemeral", "remember nothing"]);
    let out = output(cmd).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "You said: remember nothing");
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "--ephemeral", "--data-dir"])
        .arg(&data)
        .arg("--log-dir")
        .arg(dir.path().join("logs"))
        .args(["--storage-policy", "ttl:60", "again"]);
    let out = output(cmd).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
    // Without --ephemeral the same run leaves its rollout and history.
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "kept"]);
    assert!(output(cmd).await.status.success());
    let left = tree(dir.path());
    assert!(
        left.iter().any(|p| p.starts_with("data/rollout")),
        "{left:?}"
    );
    assert!(left.iter().any(|p| p.starts_with("history")), "{left:?}");
}

#[test]
fn ephemeral_serve_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data-dir");
    for data_dir in [None, Some(&data)] {
        let mut cmd = Command::new(troupe_bin());
        for k in MODEL_ENV {
            cmd.env_remove(k);
        }
        cmd.args(["serve", "--stdio", "--ephemeral"]);
        if let Some(d) = data_dir {
            cmd.arg("--data-dir").arg(d);
        }
        let mut child = cmd
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next = || -> serde_json::Value {
            serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap()
        };
        writeln!(
            stdin,
            r#"{{"jsonrpc":"2.0","id":1,"method":"session.create","params":{{}}}}"#
        )
        .unwrap();
        let created = next();
        let sid = created["result"]["session_id"].as_str().unwrap().to_owned();
        writeln!(
            stdin,
            r#"{{"jsonrpc":"2.0","id":2,"method":"conversation.message","params":{{"session_id":"{sid}","text":"leave no trace"}}}}"#
        )
        .unwrap();
        let reply = loop {
            let v = next();
            if v["id"] == 2 {
                break v;
            }
        };
        assert_eq!(
            reply["result"]["reply"]["text"], "You said: leave no trace",
            "{reply}"
        );
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("nothing is written to disk"),
            "{}",
            text(&out.stderr)
        );
        assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
    }
}

// ----- MCP servers and unattended answers -----

/// A `troupe.toml` in `dir` naming the npm everything server (and `extra` TOML).
fn mcp_config(dir: &Path, extra: &str) {
    let entry = server_entry("server-everything");
    std::fs::write(
        dir.join("troupe.toml"),
        format!(
            "[[mcp.servers]]\nname = \"everything\"\ntype = \"stdio\"\ncommand = \"node\"\n\
             args = [{:?}, \"stdio\"]\n{extra}",
            entry.display().to_string()
        ),
    )
    .unwrap();
}

fn once_against(server: &ModelServer, dir: &Path, extra: &[&str]) -> tokio::process::Command {
    let mut cmd = troupe(dir);
    cmd.args([
        "chat",
        "--once",
        "--ephemeral",
        "--base-url",
        &server.base_url(),
    ])
    .args(extra)
    .arg("go");
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_waits_for_mcp_servers_and_calls_their_tool() {
    let server = ModelServer::start().await;
    server.push(Reply::tool_call(
        "everything__echo",
        ["{\"message\": \"from the turn\"}"],
    ));
    server.push(Reply::text(["done"]));
    let dir = tempfile::tempdir().unwrap();
    // A second server that cannot start: reported, and the turn goes on without it.
    mcp_config(
        dir.path(),
        "[[mcp.servers]]\nname = \"broken\"\ntype = \"stdio\"\n\
         command = \"/nonexistent/mcp-server\"\n",
    );
    let out = output(once_against(&server, dir.path(), &[])).await;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(text(&out.stdout).trim(), "done");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let offered = requests[0].body["tools"].to_string();
    assert!(
        offered.contains("everything__echo"),
        "the first request offers the server's tools: {offered}"
    );
    let second = requests[1].body.to_string();
    assert!(second.contains("Echo: from the turn"), "{second}");
    assert!(!second.contains("unknown tool"), "{second}");
    assert!(
        stderr.contains("MCP server `broken`") && stderr.contains("goes on without it"),
        "{stderr}"
    );
}

/// Two shell calls that need approval (the default policy asks for every command).
fn two_commands() -> Reply {
    Reply::tool_calls([
        CallScript::new("shell", ["{\"command\": [\"echo\", \"first-ran\"]}"]).with_id("c1"),
        CallScript::new("shell", ["{\"command\": [\"echo\", \"second-ran\"]}"]).with_id("c2"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_without_a_terminal_are_denied_unless_a_flag_approves() {
    let dir = tempfile::tempdir().unwrap();
    // No flag: denied, said once.
    let server = ModelServer::start().await;
    server.push(two_commands());
    server.push(Reply::text(["after"]));
    let out = output(once_against(&server, dir.path(), &[])).await;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("nobody can be asked here").count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("needs an answer; denied").count(),
        2,
        "{stderr}"
    );
    let second = server.requests()[1].body.to_string();
    assert!(
        !second.contains("first-ran\\n") && !second.contains("second-ran\\n"),
        "{second}"
    );
    assert!(second.contains("denied"), "{second}");

    // --approvals approve: both commands run.
    let server = ModelServer::start().await;
    server.push(two_commands());
    server.push(Reply::text(["after"]));
    let out = output(once_against(
        &server,
        dir.path(),
        &["--approvals", "approve"],
    ))
    .await;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("nobody can be asked"), "{stderr}");
    let second = server.requests()[1].body.to_string();
    assert!(
        second.contains("first-ran") && second.contains("second-ran"),
        "{second}"
    );

    // A bad value is a clear error naming the choices.
    let mut cmd = troupe(dir.path());
    cmd.args(["chat", "--once", "--approvals", "maybe", "x"]);
    let out = output(cmd).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("deny, approve"),
        "{}",
        text(&out.stderr)
    );
}

/// An in-process agent's command, dispatched by `/hub`, runs in the agent's own
/// conversation: its approval is answered by `--approvals` (or denied, saying so) all the
/// same, not left waiting for the approval timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_approvals_are_answered_like_the_turns_own() {
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents");
    std::fs::create_dir(&agents).unwrap();
    std::fs::write(
        agents.join("runner.json"),
        r#"{"id": "runner", "role": "executor", "provider": {"type": "model", "instructions": "You run commands."}}"#,
    )
    .unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        serde_json::json!({"replies": [
            {"text": "", "tool_calls": [{"name": "shell", "arguments": {"command": ["echo", "agent-ran"]}}]},
            {"text": "done"},
        ]})
        .to_string(),
    )
    .unwrap();
    for (flags, said) in [
        (&["--approvals", "approve"][..], "`echo agent-ran` approved"),
        (&[][..], "`echo agent-ran` needs an answer; denied"),
    ] {
        let mut cmd = troupe(dir.path());
        cmd.args(["chat", "--once", "--ephemeral", "--script"])
            .arg(&script)
            .args(flags)
            .arg("/hub runner run it")
            .env("TROUPE_AGENTS_DIR", &agents);
        let out = exits_saying(cmd, 0, said).await;
        assert_eq!(text(&out.stdout).trim(), "done");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elicitations_without_a_terminal_are_declined_or_answered_with_defaults() {
    let dir = tempfile::tempdir().unwrap();
    mcp_config(dir.path(), "");
    let elicit = || Reply::tool_call("everything__trigger-elicitation-request", ["{}"]);
    for (flags, said) in [
        (&[][..], "nobody can be asked here"),
        (&["--elicitation", "decline"][..], "declined"),
        // The server's schema requires `name` without a default: accepting with the
        // defaults is refused, and the request is declined rather than left waiting.
        (&["--elicitation", "defaults"][..], "`name`"),
    ] {
        let server = ModelServer::start().await;
        server.push(elicit());
        server.push(Reply::text(["after"]));
        let out = output(once_against(&server, dir.path(), flags)).await;
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{flags:?}: {stderr}");
        assert!(stderr.contains(said), "{flags:?}: {stderr}");
        let requests = server.requests();
        assert_eq!(requests.len(), 2, "{flags:?}: {stderr}");
        let second = requests[1].body.to_string();
        assert!(second.contains("decline"), "{flags:?}: {second}");
    }
}

// ----- the history's first line (T4) -----

/// The JSONL history of a `--once` run starts with a `session_start` line that says how the
/// run was started and configured, and holds no secret.
#[tokio::test]
async fn the_history_starts_with_the_run_and_its_configuration() {
    const KEY: &str = "sk-CANARY-5e1f";
    let server = ModelServer::start().await;
    server.push(Reply::text(["hello"]));
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = troupe(dir.path());
    cmd.env("OPENAI_API_KEY", KEY)
        .args(["chat", "--once", "--base-url", &server.base_url()])
        .args(["--model", "m-history", "--tokenizer-model", "o200k_base"])
        .args([
            "--approval-policy",
            "never",
            "--sandbox-policy",
            "workspace-write",
        ])
        .args(["--log-dir", "logs", "say hello"]);
    let out = output(cmd).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let files: Vec<PathBuf> = std::fs::read_dir(dir.path().join("logs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let history = std::fs::read_to_string(&files[0]).unwrap();
    assert!(!history.contains(KEY), "the API key reached the history");
    let first: serde_json::Value = serde_json::from_str(history.lines().next().unwrap()).unwrap();
    assert_eq!(first["type"], "session_start", "{first}");
    let meta = &first["meta"];
    assert_eq!(meta["mode"], "once", "{meta}");
    assert_eq!(meta["model"], "m-history", "{meta}");
    assert_eq!(meta["provider"], "openai-chat", "{meta}");
    assert!(
        meta.as_object().unwrap().contains_key("temperature"),
        "{meta}"
    );
    assert_eq!(meta["tokenizer"], "o200k_base", "{meta}");
    assert_eq!(meta["approval_policy"], "never", "{meta}");
    assert_eq!(meta["sandbox_policy"], "workspace_write", "{meta}");
    assert_eq!(meta["storage_policy"], "full", "{meta}");
    assert_eq!(meta["tools"]["shell"], true, "{meta}");
    assert_eq!(meta["tools"]["plan"], true, "{meta}");
    assert_eq!(meta["tools"]["apply_patch"], false, "{meta}");
    assert_eq!(meta["tools"]["web_search"], false, "{meta}");
    assert_eq!(
        meta["tools"]["mcp_servers"],
        serde_json::json!([]),
        "{meta}"
    );
    let cwd = std::fs::canonicalize(dir.path()).unwrap();
    assert_eq!(meta["cwd"], cwd.display().to_string(), "{meta}");
    // The rest of the run is there too.
    let types: Vec<String> = history
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["type"].to_string())
        .collect();
    assert_eq!(
        types,
        [
            "\"session_start\"",
            "\"turn_start\"",
            "\"assistant_chunk\"",
            "\"assistant\"",
            "\"final\"",
            "\"turn_end\"",
            "\"session_end\""
        ],
        "{history}"
    );
}
