//! A stdio gateway: its message reaches a session through the API's path and its reply comes
//! back to it; a killed gateway is started again, one that keeps exiting is given up; a
//! sync gateway that does not acknowledge times out, visibly.

use super::*;
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_gateway_feeds_a_message_and_receives_its_reply() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    module(
        d,
        "bridge",
        gateway_module(
            d,
            "bridge",
            "duplex",
            "sync",
            json!({"GATEWAY_FEED": "[\"hello from the channel\", \"and then\"]"}),
        ),
    );
    let serving = serve(
        d,
        "",
        json!([{"text": "Hi from troupe", "delay_ms": 100}, {"text": "Second"}]),
    );
    let pid: u32 = eventually(Duration::from_secs(10), async || {
        std::fs::read_to_string(d.join("bridge.pid"))
            .ok()?
            .parse()
            .ok()
    })
    .await;
    let frames = eventually(Duration::from_secs(15), async || {
        let frames = received(d, "bridge");
        (frames.iter().filter(|f| f["type"] == "reply").count() == 2).then_some(frames)
    })
    .await;
    // Taken in order, one conversation for the key: the second waited for the first.
    let replies: Vec<(&str, &str)> = frames
        .iter()
        .filter(|f| f["type"] == "reply")
        .map(|f| {
            (
                f["in_reply_to"].as_str().unwrap(),
                f["text"].as_str().unwrap(),
            )
        })
        .collect();
    let (m0, m1) = (format!("m-{pid}-0"), format!("m-{pid}-1"));
    assert_eq!(
        replies,
        [(m0.as_str(), "Hi from troupe"), (m1.as_str(), "Second")]
    );
    // First troupe's acknowledgement of the stored message, then the reply.
    let ack = &frames[0];
    assert_eq!(ack["type"], "ack", "{frames:?}");
    assert_eq!(ack["id"], format!("m-{pid}-0"));
    assert!(ack["message_id"].as_u64().is_some(), "{ack}");
    let reply = frames.iter().find(|f| f["type"] == "reply").unwrap();
    assert_eq!(reply["text"], "Hi from troupe", "{reply}");
    assert_eq!(reply["status"], "ok");
    assert_eq!(reply["source"], "bridge");
    assert_eq!(reply["in_reply_to"], format!("m-{pid}-0"));
    assert_eq!(reply["session"], ack["session"]);
    assert_eq!(reply["conversation"], ack["conversation"]);

    // The exchange is stored like any other: the session is the module's project's current
    // one, and the key `chan-1` named a conversation of its own.
    let api = &serving.api;
    let (status, current) = api.get("/api/projects/bridge/current-session").await;
    assert_eq!(status, StatusCode::OK, "{current}");
    assert_eq!(current["session"]["session_id"], ack["session"]);
    let sid = ack["session"].as_str().unwrap();
    let (status, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let texts: Vec<(&str, &str)> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["conversation_id"], ack["conversation"]);
            (
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    // Both were stored as they came (the second queued behind the first), then answered.
    assert_eq!(
        texts,
        [
            ("user", "hello from the channel"),
            ("user", "and then"),
            ("assistant", "Hi from troupe"),
            ("assistant", "Second"),
        ]
    );
    let base = &serving.base;
    metric_reaches(
        base,
        r#"troupe_module_messages_total{module="bridge",direction="duplex",outcome="accepted"}"#,
        2.0,
    )
    .await;
    metric_reaches(
        base,
        r#"troupe_module_deliveries_total{module="bridge",direction="duplex",outcome="delivered"}"#,
        2.0,
    )
    .await;
    let (_, listing) = api.get("/api/modules").await;
    assert_eq!(listing["modules"][0]["id"], "bridge", "{listing}");
    assert_eq!(listing["modules"][0]["health"], "up", "{listing}");
    let rpc = api.call("modules.list", json!({})).await;
    assert_eq!(rpc["modules"][0]["id"], "bridge", "{rpc}");

    // Its stderr is in troupe's log.
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(log.contains(&format!("gateway {pid} started")), "{log}");

    // troupe stops its gateways when it stops: no process is left behind.
    serving.terminate();
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok();
    assert!(!alive, "the gateway {pid} outlived troupe");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_is_started_again_and_one_that_keeps_exiting_is_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut bridge = gateway_module(d, "bridge", "duplex", "sync", json!({}));
    bridge["health"] = json!({"interval": "100ms", "timeout": "2s"});
    bridge["restart"] = json!({"backoff_min": "50ms", "backoff_max": "200ms"});
    module(d, "bridge", bridge);
    module(
        d,
        "flapping",
        json!({
            "id": "flapping", "direction": "output", "protocol": "stdio", "command": "false",
            "restart": {"max_restarts": 2, "window": "1m", "backoff_min": "20ms", "backoff_max": "40ms"},
        }),
    );
    let serving = serve(d, "", json!([]));
    let first: i32 = eventually(Duration::from_secs(10), async || {
        std::fs::read_to_string(d.join("bridge.pid"))
            .ok()?
            .parse()
            .ok()
    })
    .await;
    // Its health probe runs.
    eventually(Duration::from_secs(10), async || {
        received(d, "bridge")
            .iter()
            .any(|f| f["type"] == "ping")
            .then_some(())
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let second: i32 = eventually(Duration::from_secs(10), async || {
        std::fs::read_to_string(d.join("bridge.pid"))
            .ok()?
            .parse()
            .ok()
            .filter(|p| *p != first)
    })
    .await;
    // The new process is probed too.
    eventually(Duration::from_secs(10), async || {
        received(d, "bridge")
            .iter()
            .any(|f| f["type"] == "ping" && f["pid"] == second)
            .then_some(())
    })
    .await;
    let base = &serving.base;
    metric_reaches(
        base,
        r#"troupe_module_restarts_total{module="bridge",direction="duplex",outcome="restarted"}"#,
        1.0,
    )
    .await;
    metric_reaches(
        base,
        r#"troupe_module_restarts_total{module="flapping",direction="output",outcome="given_up"}"#,
        1.0,
    )
    .await;
    let listing = eventually(Duration::from_secs(10), async || {
        let (_, listing) = serving.api.get("/api/modules").await;
        (listing["modules"][0]["health"] == "up").then_some(listing)
    })
    .await;
    let modules = listing["modules"].as_array().unwrap();
    assert_eq!(modules[0]["id"], "bridge");
    assert!(
        modules[0]["process"]["restarts"].as_u64().unwrap() >= 1,
        "{listing}"
    );
    assert_eq!(modules[1]["id"], "flapping");
    assert_eq!(modules[1]["health"], "failed", "{listing}");
    assert_eq!(modules[1]["process"]["restarts"], 2, "{listing}");
    assert_eq!(
        metric(
            base,
            r#"troupe_module_up{module="flapping",direction="output"}"#
        )
        .await,
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_gateway_that_does_not_acknowledge_times_out_visibly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut mute = gateway_module(
        d,
        "mute",
        "duplex",
        "sync",
        json!({
            "GATEWAY_ACK": "no",
            "GATEWAY_FEED": "[\"anyone there?\"]",
            "GATEWAY_RAW": json!([
                "not json",
                json!({"type": "message", "id": "lost", "session": "0199a1b2-0000-7000-8000-000000000000", "text": "hi"}).to_string(),
            ]).to_string(),
        }),
    );
    mute["timeout"] = json!("300ms");
    module(d, "mute", mute);
    // A bad definition beside it is reported and does not stop it.
    module(
        d,
        "broken",
        json!({"id": "broken", "direction": "output", "protocol": "websocket", "url": "ws://127.0.0.1:9"}),
    );
    let serving = serve(d, "", json!([{"text": "yes"}]));
    eventually(Duration::from_secs(15), async || {
        received(d, "mute")
            .iter()
            .any(|f| f["type"] == "reply" && f["text"] == "yes")
            .then_some(())
    })
    .await;
    metric_reaches(
        &serving.base,
        r#"troupe_module_deliveries_total{module="mute",direction="duplex",outcome="timeout"}"#,
        1.0,
    )
    .await;
    // A line that is not a frame, and a message for a session that does not exist, are
    // answered with errors; the module goes on.
    let errors: Vec<(Value, Value)> = received(d, "mute")
        .into_iter()
        .filter(|f| f["type"] == "error")
        .map(|f| (f["id"].clone(), f["code"].clone()))
        .collect();
    assert_eq!(
        errors,
        [
            (Value::Null, json!("invalid_input")),
            (json!("lost"), json!("not_found"))
        ]
    );
    metric_reaches(
        &serving.base,
        r#"troupe_module_messages_total{module="mute",direction="duplex",outcome="refused"}"#,
        1.0,
    )
    .await;
    let (_, listing) = serving.api.get("/api/modules").await;
    assert_eq!(listing["modules"].as_array().unwrap().len(), 1, "{listing}");
    let error = listing["errors"][0].as_str().unwrap();
    assert!(
        error.contains("broken/module.json")
            && error.contains("`protocol`")
            && error.contains("not supported yet"),
        "{error}"
    );
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    assert!(
        log.contains("delivery to a module failed") && log.contains("mute"),
        "{log}"
    );
    // And in the session of the reply, as a warning.
    let ack = received(d, "mute")
        .into_iter()
        .find(|f| f["type"] == "ack")
        .unwrap();
    let sid = ack["session"].as_str().unwrap();
    let events = serving
        .api
        .sse(sid, None, |seen| {
            seen.iter()
                .any(|e| e["kind"] == "warning" && e["data"]["code"] == "module_delivery_failed")
        })
        .await;
    // (Its message is for live subscribers: a session-level event is recorded without
    // content.)
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "warning" && e["data"]["code"] == "module_delivery_failed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_gateway_kills_what_its_process_started() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pidfile = d.join("grandchild.pid");
    // A wrapper that starts a grandchild and waits: it never reads its stdin, so it is killed.
    wrapper_module(d, &pidfile);
    let serving = serve(d, "", json!([]));
    let grandchild: i32 = eventually(Duration::from_secs(10), async || {
        std::fs::read_to_string(&pidfile).ok()?.trim().parse().ok()
    })
    .await;
    assert!(alive(grandchild));
    serving.terminate();
    eventually(Duration::from_secs(10), async || {
        (!alive(grandchild)).then_some(())
    })
    .await;
}

/// A `troupe serve` that cannot listen (its port taken) stops its modules, and what they
/// started, before it exits: they had started with the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_cannot_listen_leaves_no_module_process_behind() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pidfile = d.join("grandchild.pid");
    wrapper_module(d, &pidfile);
    std::fs::write(
        d.join("troupe.toml"),
        format!(
            "data_dir = {:?}\nlog_dir = {:?}\n",
            d.join("data"),
            d.join("history")
        ),
    )
    .unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    // The module may or may not have started its grandchild before the service fails to
    // listen: tried until it has, and then nothing of it may be left.
    let mut seen = false;
    for _ in 0..20 {
        let _ = std::fs::remove_file(&pidfile);
        let out = tokio::process::Command::new(troupe_bin())
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--config",
            ])
            .arg(d.join("troupe.toml"))
            .current_dir(d)
            .env_remove("TROUPE_AGENTS_DIR")
            .env_remove("TROUPE_MODULES_DIR")
            .env_remove("TROUPE_CONFIG")
            .env_remove("TROUPE_API_TOKENS")
            .env_remove("TROUPE_LISTEN")
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), out)
            .await
            .unwrap()
            .unwrap();
        assert!(!out.status.success());
        if let Some(grandchild) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            eventually(Duration::from_secs(10), async || {
                (!alive(grandchild)).then_some(())
            })
            .await;
            seen = true;
            break;
        }
    }
    assert!(seen, "the module never started its grandchild");
    drop(taken);
}

/// A module `wrapper` that starts a grandchild (its pid written to `pidfile`) and waits, never
/// reading its stdin.
fn wrapper_module(d: &std::path::Path, pidfile: &std::path::Path) {
    module(
        d,
        "wrapper",
        json!({
            "id": "wrapper", "direction": "output", "protocol": "stdio", "command": "sh",
            "args": ["-c", format!("sleep 300 & echo $! > {}; wait", pidfile.display())],
        }),
    );
}

/// Whether `pid` runs (a zombie waiting to be reaped does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_long_line_is_refused_and_unreadable_output_restarts_the_module() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // First run: a line over the cap (refused, the module keeps running), then bytes that
    // are not UTF-8 (the module is restarted). Later runs only read.
    let script = r#"
import os, sys
d = sys.argv[1]
with open(os.path.join(d, "pids"), "a") as f:
    f.write(f"{os.getpid()}\n")
first = len(open(os.path.join(d, "pids")).read().split()) == 1
out = sys.stdout.buffer
if first:
    out.write(b"a" * (2 << 20) + b"\n"); out.flush()
for line in sys.stdin:
    with open(os.path.join(d, "frames"), "a") as f:
        f.write(line)
    if first:
        out.write(b"\xff\xfe not utf-8\n"); out.flush()
        first = False
"#;
    module(
        d,
        "noisy",
        json!({
            "id": "noisy", "direction": "output", "protocol": "stdio", "command": "python3",
            "args": ["-c", script, d],
            "restart": {"backoff_min": "20ms", "backoff_max": "40ms"},
        }),
    );
    let serving = serve(d, "", json!([]));
    let refused: Value = eventually(Duration::from_secs(10), async || {
        let frames = std::fs::read_to_string(d.join("frames")).ok()?;
        serde_json::from_str(frames.lines().next()?).ok()
    })
    .await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["code"], "invalid_input", "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("longer than"),
        "{refused}"
    );
    eventually(Duration::from_secs(10), async || {
        let pids = std::fs::read_to_string(d.join("pids")).ok()?;
        (pids.lines().count() >= 2).then_some(())
    })
    .await;
    metric_reaches(
        &serving.base,
        r#"troupe_module_restarts_total{module="noisy",direction="output",outcome="restarted"}"#,
        1.0,
    )
    .await;
}

/// A module whose stderr is not UTF-8 keeps its stderr: troupe logs the line with
/// replacement characters and goes on reading (a stopped reader broke the pipe, and the
/// module's next write to stderr killed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_that_is_not_utf8_does_not_break_the_module() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let script = r#"
import os, sys
d = sys.argv[1]
with open(os.path.join(d, "pids"), "a") as f:
    f.write(f"{os.getpid()}\n")
sys.stderr.buffer.write(b"latin-1: caf\xe9\n"); sys.stderr.flush()
# A line over the cap: troupe answers with an error frame, read below.
sys.stdout.buffer.write(b"a" * (2 << 20) + b"\n"); sys.stdout.flush()
for line in sys.stdin:
    sys.stderr.write("still logging\n"); sys.stderr.flush()
    with open(os.path.join(d, "after"), "a") as f:
        f.write(line)
"#;
    module(
        d,
        "latin",
        json!({
            "id": "latin", "direction": "output", "protocol": "stdio", "command": "python3",
            "args": ["-c", script, d],
            "restart": {"backoff_min": "20ms", "backoff_max": "40ms"},
        }),
    );
    let _serving = serve(d, "", json!([]));
    eventually(Duration::from_secs(10), async || {
        std::fs::read_to_string(d.join("after"))
            .ok()
            .filter(|a| !a.is_empty())
    })
    .await;
    let pids = std::fs::read_to_string(d.join("pids")).unwrap();
    assert_eq!(pids.lines().count(), 1, "restarted: {pids}");
}

/// A modules directory where nothing loads still reports what did not: `modules.list` and
/// `GET /api/modules` list the file under `errors` (with no module, both answered empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_where_nothing_loads_still_lists_its_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    module(
        d,
        "broken",
        json!({"id": "broken", "direction": "output", "protocol": "websocket", "url": "ws://127.0.0.1:9"}),
    );
    let serving = serve(d, "", json!([]));
    let (_, listing) = serving.api.get("/api/modules").await;
    assert_eq!(listing["modules"], json!([]), "{listing}");
    let errors = listing["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{listing}");
    assert!(
        errors[0].as_str().unwrap().contains("broken/module.json"),
        "{listing}"
    );
    let listed = serving.api.call("modules.list", json!({})).await;
    assert_eq!(listed, listing);
}
