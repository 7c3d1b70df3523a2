//! The real `troupe serve` binary as a child process: the bound address on stdout, graceful
//! shutdown on SIGTERM (exit 0, a running task finishes within the grace period, one that
//! would not is cancelled), the stdio transport, and the loopback rule.

use super::{Api, id, seqs};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use troupe_tests::troupe_bin;

/// A `troupe serve` child and the address it printed.
struct Serving {
    child: Child,
    base: String,
    /// The data directory, when the child owns it.
    _dir: Option<tempfile::TempDir>,
}

fn spawn(script: &str, extra: &[&str]) -> Serving {
    let dir = tempfile::tempdir().unwrap();
    let script_path = dir.path().join("script.json");
    std::fs::write(&script_path, script).unwrap();
    let mut command = Command::new(troupe_bin());
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--ephemeral",
            "--data-dir",
        ])
        .arg(dir.path())
        .arg("--script")
        .arg(&script_path)
        .args(extra)
        .current_dir(dir.path())
        .env_remove("TROUPE_API_TOKENS")
        .stderr(Stdio::null());
    let (child, base) = troupe_tests::spawn_serve(&mut command);
    Serving {
        child,
        base,
        _dir: Some(dir),
    }
}

fn sigterm(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

/// Waits for the child to exit, at most `within`.
fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(t0.elapsed() < within, "still running after {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn wait_running(api: &Api, sid: &str) {
    loop {
        let tasks = api.call("task.list", json!({"session_id": sid})).await;
        if tasks
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["state"] == "running"))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `troupe serve --stdio --ephemeral` in `dir` with `extra` flags: its stdin, and the JSON
/// objects it writes, one a line.
struct StdioServe {
    child: Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl StdioServe {
    fn spawn(dir: &std::path::Path, extra: &[&str]) -> Self {
        let mut child = Command::new(troupe_bin())
            .args(["serve", "--stdio", "--ephemeral", "--data-dir"])
            .arg(dir)
            .args(extra)
            .env_remove("TROUPE_SCRIPT")
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// Writes one line.
    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
    }

    /// The next object written.
    fn next(&mut self) -> Value {
        serde_json::from_str(&self.lines.next().unwrap().unwrap()).unwrap()
    }
}

/// The answer of a call whose task was cancelled: its reply says so, or it is an error.
fn assert_cancelled(answer: &Value) {
    let status = answer["result"]["reply"]["status"]
        .as_str()
        .or_else(|| answer.get("error").map(|_| "error"));
    assert!(
        matches!(status, Some("cancelled" | "error")),
        "cancelled, not left hanging: {answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_running_task_finish_then_exits_zero() {
    let mut c = spawn(
        r#"{"replies": [{"text": "finished in time", "delay_ms": 1500}]}"#,
        &["--grace-period", "20s"],
    );
    let api = Api::new(&c.base, None);
    let sid = id(&api.session(None).await, "session_id");
    let pending = {
        let api = api.clone();
        let sid = sid.clone();
        tokio::spawn(async move { api.say(&sid, "slow").await })
    };
    wait_running(&api, &sid).await;
    let t0 = Instant::now();
    sigterm(&c.child);
    let reply = tokio::time::timeout(Duration::from_secs(15), pending)
        .await
        .expect("the reply comes")
        .unwrap();
    assert_eq!(reply["reply"]["status"], "ok");
    assert_eq!(reply["reply"]["text"], "finished in time");
    assert!(
        reply["assistant"]["message_id"].is_u64(),
        "stored before exit"
    );
    let status = tokio::task::block_in_place(|| wait_exit(&mut c.child, Duration::from_secs(15)));
    assert!(status.success(), "{status:?}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    // New connections are refused once it is gone.
    assert!(
        api.http
            .get(format!("{}/healthz", c.base))
            .send()
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cancels_what_outlives_the_grace_period() {
    let mut c = spawn(
        r#"{"replies": [{"hang": true}]}"#,
        &["--grace-period", "300ms"],
    );
    let api = Api::new(&c.base, None);
    let sid = id(&api.session(None).await, "session_id");
    let pending = {
        let api = api.clone();
        let sid = sid.clone();
        tokio::spawn(async move {
            api.rpc(
                "conversation.message",
                json!({"session_id": sid, "text": "forever"}),
            )
            .await
        })
    };
    wait_running(&api, &sid).await;
    let t0 = Instant::now();
    sigterm(&c.child);
    let answer = tokio::time::timeout(Duration::from_secs(15), pending)
        .await
        .expect("an answer comes")
        .unwrap();
    assert_cancelled(&answer);
    let exit = tokio::task::block_in_place(|| wait_exit(&mut c.child, Duration::from_secs(15)));
    assert!(exit.success(), "{exit:?}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}

/// The same over `/rpc/ws`: a call read before the SIGTERM is answered (its task cancelled
/// after the grace period), then the connection closes with 1001, and the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_a_websocket_call_before_closing_it() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let mut c = spawn(
        r#"{"replies": [{"hang": true}]}"#,
        &["--grace-period", "300ms"],
    );
    let api = Api::new(&c.base, None);
    let sid = id(&api.session(None).await, "session_id");
    let url = format!("{}/rpc/ws", c.base.replace("http://", "ws://"));
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "conversation.message",
        "params": {"session_id": sid, "text": "forever"}});
    ws.send(Message::text(call.to_string())).await.unwrap();
    wait_running(&api, &sid).await;
    let t0 = Instant::now();
    sigterm(&c.child);
    let mut answer = None;
    let mut close = None;
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(15), ws.next())
        .await
        .expect("the connection ends")
    {
        match frame {
            Ok(Message::Text(t)) => answer = Some(serde_json::from_str::<Value>(&t).unwrap()),
            Ok(Message::Close(frame)) => close = frame.map(|f| u16::from(f.code)),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let answer = answer.expect("the call is answered before the connection closes");
    assert_eq!(answer["id"], 7, "{answer}");
    assert_cancelled(&answer);
    assert_eq!(close, Some(1001));
    let exit = tokio::task::block_in_place(|| wait_exit(&mut c.child, Duration::from_secs(15)));
    assert!(exit.success(), "{exit:?}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn stdio_speaks_json_rpc_line_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut io = StdioServe::spawn(dir.path(), &[]);
    io.send(r#"{"jsonrpc":"2.0","id":1,"method":"session.create","params":{}}"#);
    let created = io.next();
    let sid = created["result"]["session_id"].as_str().unwrap().to_owned();
    io.send(&format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"events.subscribe","params":{{"session_id":"{sid}"}}}}"#
    ));
    io.send(&format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"conversation.message","params":{{"session_id":"{sid}","text":"from an editor"}}}}"#
    ));
    io.send("not json");
    let mut answers = std::collections::BTreeMap::new();
    let mut events = Vec::new();
    while answers.len() < 3
        || !events
            .iter()
            .any(|e: &Value| e["type"] == "message_complete")
    {
        let v = io.next();
        if v["method"] == "events.event" {
            events.push(v["params"]["event"].clone());
        } else {
            answers.insert(v["id"].to_string(), v);
        }
    }
    assert_eq!(answers["2"]["result"]["subscription"], 1);
    assert_eq!(
        answers["3"]["result"]["reply"]["text"],
        "You said: from an editor"
    );
    assert_eq!(answers["null"]["error"]["code"], -32700);
    let StdioServe {
        mut child, stdin, ..
    } = io;
    drop(stdin);
    let status = wait_exit(&mut child, Duration::from_secs(15));
    assert!(
        status.success(),
        "the end of stdin ends it cleanly: {status:?}"
    );
}

/// SIGTERM to `serve --stdio` while a call waits on a task that never ends: the task gets
/// the grace period, is cancelled, the call is answered, and the process exits 0, with its
/// stdin still open.
#[test]
fn stdio_sigterm_answers_what_waits_and_exits_within_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(&script, r#"{"replies": [{"hang": true}]}"#).unwrap();
    let script = script.to_str().unwrap().to_owned();
    let mut io = StdioServe::spawn(
        dir.path(),
        &["--grace-period", "300ms", "--script", &script],
    );
    io.send(r#"{"jsonrpc":"2.0","id":1,"method":"session.create","params":{}}"#);
    let sid = io.next()["result"]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    io.send(&format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"conversation.message","params":{{"session_id":"{sid}","text":"forever"}}}}"#
    ));
    // Until its task runs.
    let t0 = Instant::now();
    loop {
        io.send(&format!(
            r#"{{"jsonrpc":"2.0","id":"list","method":"task.list","params":{{"session_id":"{sid}"}}}}"#
        ));
        let listed = io.next();
        assert_eq!(listed["id"], "list", "{listed}");
        if listed["result"].as_array().is_some_and(|t| !t.is_empty()) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the task never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let t0 = Instant::now();
    sigterm(&io.child);
    let answer = io.next();
    assert_eq!(answer["id"], 2, "{answer}");
    assert_cancelled(&answer);
    let status = wait_exit(&mut io.child, Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn an_open_api_refuses_a_public_address() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(troupe_bin())
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--ephemeral",
            "--data-dir",
        ])
        .arg(dir.path())
        .current_dir(dir.path())
        .env_remove("TROUPE_API_TOKENS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("without API tokens"), "{stderr}");
    // Refused before the store is created: a durable data directory stays unwritten.
    let data = dir.path().join("data");
    let out = Command::new(troupe_bin())
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(&data)
        .current_dir(dir.path())
        .env_remove("TROUPE_API_TOKENS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!data.exists(), "nothing written for a refused address");
    // With a token it binds (and a SIGTERM ends it).
    let mut child = Command::new(troupe_bin())
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--ephemeral",
            "--data-dir",
        ])
        .arg(dir.path())
        .current_dir(dir.path())
        .env("TROUPE_API_TOKENS", "t=*")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("troupe serve listening on http://0.0.0.0:"),
        "{line}"
    );
    sigterm(&child);
    assert!(wait_exit(&mut child, Duration::from_secs(15)).success());
}

/// Starts `troupe serve` on a durable data directory (no --ephemeral).
fn spawn_durable(dir: &std::path::Path, script: &str) -> Serving {
    let script_path = dir.join("script.json");
    std::fs::write(&script_path, script).unwrap();
    let mut command = Command::new(troupe_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .arg("--script")
        .arg(&script_path)
        .current_dir(dir)
        .env_remove("TROUPE_API_TOKENS")
        .stderr(Stdio::null());
    let (child, base) = troupe_tests::spawn_serve(&mut command);
    Serving {
        child,
        base,
        _dir: None,
    }
}

/// Two services on one data directory would both write its databases and lose records:
/// the second is refused, naming the first's pid, until the first has ended.
#[test]
fn a_second_service_on_one_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = spawn_durable(dir.path(), "{}");
    let mut second = Command::new(troupe_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .current_dir(dir.path())
        .env_remove("TROUPE_API_TOKENS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let refused = wait_exit(&mut second, Duration::from_secs(15));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!refused.success(), "{stderr}");
    assert!(
        stderr.contains("is in use by another troupe serve")
            && stderr.contains(&format!("(pid {})", first.child.id())),
        "{stderr}"
    );
    sigterm(&first.child);
    assert!(wait_exit(&mut first.child, Duration::from_secs(15)).success());
    // Ended, it left the directory to the next one.
    let mut next = spawn_durable(dir.path(), "{}");
    sigterm(&next.child);
    assert!(wait_exit(&mut next.child, Duration::from_secs(15)).success());
}

/// A data directory serve makes is its user's alone: its databases hold the conversations.
#[test]
fn a_data_directory_serve_makes_is_the_users_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("a").join("data");
    let mut command = Command::new(troupe_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .current_dir(dir.path())
        .env_remove("TROUPE_API_TOKENS")
        .stderr(Stdio::null());
    let (mut child, _base) = troupe_tests::spawn_serve(&mut command);
    sigterm(&child);
    assert!(wait_exit(&mut child, Duration::from_secs(15)).success());
    for made in [dir.path().join("a"), data] {
        let mode = std::fs::metadata(&made).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{} is {mode:o}", made.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_message() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"{"replies": [{"text": "a streamed answer of some length", "chunk_chars": 3, "delay_ms": 5}]}"#;
    let mut c = spawn_durable(dir.path(), script);
    let api = Api::new(&c.base, None);
    let s = api.session(Some("p")).await;
    let sid = id(&s, "session_id");
    api.put(
        "/api/projects/p/current-session",
        json!({"session_id": sid}),
    )
    .await;
    // Messages keep arriving (acknowledged once stored) while their replies stream.
    let sender = {
        let api = api.clone();
        let sid = sid.clone();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0.. {
                let r = api
                    .request(
                        reqwest::Method::POST,
                        &format!("/api/sessions/{sid}/messages"),
                    )
                    .json(&json!({"text": format!("message {i}"), "wait": false}))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == reqwest::StatusCode::ACCEPTED => {
                        let v: Value = r.json().await.unwrap();
                        acked.push(v["message"]["message_id"].as_u64().unwrap());
                    }
                    Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                    Err(_) => return acked,
                }
            }
            acked
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    c.child.kill().unwrap();
    c.child.wait().unwrap();
    let acked = sender.await.unwrap();
    assert!(!acked.is_empty());

    let mut c = spawn_durable(dir.path(), script);
    let api = Api::new(&c.base, None);
    let (status, got) = api.get(&format!("/api/sessions/{sid}")).await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(
        super::identity(&got),
        super::identity(&s),
        "the session survives"
    );
    let (_, cur) = api.get("/api/projects/p/current-session").await;
    // The same session; its status and update time may move meanwhile (the restart settles
    // the messages that were pending).
    assert_eq!(
        super::identity(&cur["session"]),
        super::identity(&got),
        "so does the current-session binding"
    );
    let (_, page) = api
        .get(&format!("/api/sessions/{sid}/messages?limit=1000"))
        .await;
    let stored: std::collections::BTreeSet<u64> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["message_id"].as_u64().unwrap())
        .collect();
    for id in &acked {
        assert!(stored.contains(id), "acknowledged message {id} lost");
    }
    sigterm(&c.child);
    let status = tokio::task::block_in_place(|| wait_exit(&mut c.child, Duration::from_secs(15)));
    assert!(status.success());
}

/// Reads a session's SSE stream from the start until the connection drops.
async fn sse_until_gone(base: &str, sid: &str) -> Vec<Value> {
    use eventsource_stream::Eventsource;
    use futures::StreamExt;
    let response = reqwest::get(format!("{base}/api/sessions/{sid}/events"))
        .await
        .unwrap();
    let mut stream = response.bytes_stream().eventsource();
    let mut out = Vec::new();
    while let Some(Ok(e)) = stream.next().await {
        out.push(serde_json::from_str(&e.data).unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_then_a_resuming_stream_sees_no_gap_and_no_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"{"replies": [{"text": "streamed in small chunks for a while", "chunk_chars": 2, "delay_ms": 5}]}"#;
    let mut c = spawn_durable(dir.path(), script);
    let api = Api::new(&c.base, None);
    let sid = id(&api.session(None).await, "session_id");
    let reader = tokio::spawn({
        let (base, sid) = (c.base.clone(), sid.clone());
        async move { sse_until_gone(&base, &sid).await }
    });
    let sender = tokio::spawn({
        let (api, sid) = (api.clone(), sid.clone());
        async move {
            for i in 0.. {
                let r = api
                    .request(
                        reqwest::Method::POST,
                        &format!("/api/sessions/{sid}/messages"),
                    )
                    .json(&json!({"text": format!("message {i}")}))
                    .send()
                    .await;
                if r.is_err() {
                    return;
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.child.kill().unwrap();
    c.child.wait().unwrap();
    sender.await.unwrap();
    let first = reader.await.unwrap();
    assert!(!first.is_empty(), "the stream ran before the kill");
    let last_seen = first.last().unwrap()["seq"].as_u64().unwrap();

    // The new process's model answers by rule (it echoes).
    let mut c = spawn_durable(dir.path(), r#"{"replies": []}"#);
    let api = Api::new(&c.base, None);
    let after = api.say(&sid, "after the restart").await;
    assert_eq!(
        after["reply"]["text"], "You said: after the restart",
        "the session runs again"
    );
    let done = |e: &[Value]| {
        e.iter().any(|x| {
            x["type"] == "message_complete" && x["data"]["text"] == "You said: after the restart"
        })
    };
    let rest = api.sse(&sid, Some(last_seen), done).await;
    let reference = api.sse(&sid, None, done).await;
    let mut joined = seqs(&first);
    joined.extend(seqs(&rest));
    assert_eq!(
        joined,
        seqs(&reference),
        "nothing lost, nothing twice across the restart"
    );
    sigterm(&c.child);
    let status = tokio::task::block_in_place(|| wait_exit(&mut c.child, Duration::from_secs(15)));
    assert!(status.success());
}

/// A pending approval's timeout, as `troupe serve` started with `env` and `flags` (and a
/// `troupe.toml` that sets it to 10 minutes) gives it: its deadline minus its request time.
async fn approval_timeout_ms(env: &[(&str, &str)], flags: &[&str]) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"{"replies": [{"tool_calls": [{"name": "shell", "arguments": {"command": ["echo", "hi"]}}]}]}"#;
    std::fs::write(dir.path().join("script.json"), script).unwrap();
    std::fs::write(
        dir.path().join("troupe.toml"),
        "[conversation]\napproval_timeout = \"10m\"\n",
    )
    .unwrap();
    let mut command = Command::new(troupe_bin());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--ephemeral"])
        .args(["--script", "script.json", "--data-dir", "data"])
        .args(flags)
        .current_dir(dir.path())
        .env_remove("TROUPE_API_TOKENS")
        .env_remove("TROUPE_CONFIG")
        .env_remove("TROUPE_APPROVAL_TIMEOUT")
        .envs(env.iter().copied())
        .stderr(Stdio::null());
    let (mut child, base) = troupe_tests::spawn_serve(&mut command);
    let api = Api::new(&base, None);
    let sid = id(&api.session(None).await, "session_id");
    let (status, v) = api
        .post(
            &format!("/api/sessions/{sid}/messages"),
            json!({"text": "run it", "wait": false}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{v}");
    let t0 = Instant::now();
    let pending = loop {
        let list = api.call("approval.list", json!({"session_id": sid})).await;
        if let Some(p) = list.as_array().and_then(|a| a.first()) {
            break p.clone();
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no approval asked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    child.kill().unwrap();
    child.wait().unwrap();
    pending["deadline_ms"].as_u64().unwrap() - pending["requested_at_ms"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_timeout_comes_from_the_flag_then_the_env_then_the_file() {
    assert_eq!(approval_timeout_ms(&[], &[]).await, 600_000, "the file");
    let env = [("TROUPE_APPROVAL_TIMEOUT", "5m")];
    assert_eq!(
        approval_timeout_ms(&env, &[]).await,
        300_000,
        "env beats the file"
    );
    assert_eq!(
        approval_timeout_ms(&env, &["--approval-timeout", "42s"]).await,
        42_000,
        "a flag beats the env"
    );
}

/// `troupe serve` started in `dir` while another process's transaction holds its database:
/// its start waits for the lock (the returned connection's) to go. Stderr is piped.
fn start_on_a_held_database(dir: &std::path::Path, stdout: Stdio) -> (rusqlite::Connection, Child) {
    let db = rusqlite::Connection::open(dir.join("troupe.db")).unwrap();
    db.execute_batch("CREATE TABLE held(x); BEGIN EXCLUSIVE; INSERT INTO held VALUES (1);")
        .unwrap();
    let child = Command::new(troupe_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .current_dir(dir)
        .env_remove("TROUPE_API_TOKENS")
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (db, child)
}

/// A SIGHUP while `troupe serve` is still starting (here: waiting for its database, which
/// another process holds locked) is a reread once the service runs, not the end of the
/// process.
#[test]
fn a_sighup_during_start_up_does_not_end_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let (db, mut child) = start_on_a_held_database(dir.path(), Stdio::piped());
    let (lines, said) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    // Its first line comes after the handler is in place, while the database is still held.
    let first = said.recv_timeout(Duration::from_secs(30)).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    db.execute_batch("COMMIT").unwrap();
    drop(db);

    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("troupe serve listening on "),
        "{line:?}: ended by the SIGHUP sent after {first:?}?"
    );
    let t0 = Instant::now();
    loop {
        let line = said
            .recv_timeout(Duration::from_secs(10))
            .expect("the SIGHUP is handled once the service runs");
        if line.contains("SIGHUP: reading the configuration again") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
    assert!(child.try_wait().unwrap().is_none(), "still serving");
    sigterm(&child);
    assert!(wait_exit(&mut child, Duration::from_secs(20)).success());
}

/// A SIGTERM while `troupe serve` is still starting stops it gracefully once it has
/// started (exit 0), instead of killing it in the middle of its start-up.
#[test]
fn a_sigterm_during_start_up_is_a_graceful_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (db, mut child) = start_on_a_held_database(dir.path(), Stdio::null());
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    std::thread::spawn(move || for _ in stderr.lines().map_while(Result::ok) {});
    sigterm(&child);
    db.execute_batch("COMMIT").unwrap();
    drop(db);
    let status = wait_exit(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{status:?} after {first:?}");
}
