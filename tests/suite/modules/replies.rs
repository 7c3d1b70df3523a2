//! Where a reply goes survives the process: a module's message keeps its origin in the
//! store, so its reply reaches the module after `troupe serve` was killed and started again;
//! and a stopping service waits for the replies it is still routing.

use super::*;

/// The `reply` frames a test gateway received, by the id of the message they answer.
fn replies(d: &Path, id: &str) -> Vec<Value> {
    received(d, id)
        .into_iter()
        .filter(|f| f["type"] == "reply")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_reaches_its_gateway_after_troupe_was_killed_and_started_again() {
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
            json!({"GATEWAY_FEED": "[\"first\", \"second\"]"}),
        ),
    );
    // The first reply never comes before the kill; the second message waits behind it.
    let mut serving = serve(d, "", json!([{"text": "too late", "delay_ms": 120_000}]));
    let fed: u32 = eventually(Duration::from_secs(10), async || {
        std::fs::read_to_string(d.join("bridge.pid"))
            .ok()?
            .parse()
            .ok()
    })
    .await;
    eventually(Duration::from_secs(15), async || {
        let acks = received(d, "bridge")
            .into_iter()
            .filter(|f| f["type"] == "ack" && f["message_id"].is_u64())
            .count();
        (acks == 2).then_some(())
    })
    .await;
    // SIGKILL: nothing is delivered on the way out.
    serving.child.kill().unwrap();
    serving.child.wait().unwrap();
    assert!(replies(d, "bridge").is_empty());

    // Started again, the gateway (a new process) feeds nothing this time.
    module(
        d,
        "bridge",
        gateway_module(d, "bridge", "duplex", "sync", json!({})),
    );
    let _serving = serve(d, "", json!([{"text": "Answer after the restart"}]));
    let got = eventually(Duration::from_secs(20), async || {
        let got = replies(d, "bridge");
        (got.len() == 2).then_some(got)
    })
    .await;
    let to = |n: u32| {
        got.iter()
            .find(|f| f["in_reply_to"] == format!("m-{fed}-{n}"))
            .unwrap_or_else(|| panic!("no reply to m-{fed}-{n}: {got:?}"))
    };
    // The queued message ran after the restart; its reply went to the gateway it came from.
    let second = to(1);
    assert_eq!(second["text"], "Answer after the restart", "{second}");
    assert_eq!(second["status"], "ok", "{second}");
    assert_eq!(second["source"], "bridge");
    assert_ne!(
        second["pid"],
        json!(fed),
        "received by the new gateway process"
    );
    // The one the kill interrupted is answered too: it ended, and says how.
    let first = to(0);
    assert_eq!(first["status"], "error", "{first}");
    assert_eq!(first["error"]["code"], "interrupted", "{first}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_service_waits_for_the_replies_it_is_routing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // It acknowledges a reply half a second after receiving it.
    module(
        d,
        "bridge",
        gateway_module(
            d,
            "bridge",
            "duplex",
            "sync",
            json!({"GATEWAY_FEED": "[\"hello\"]", "GATEWAY_ACK_DELAY": "0.5"}),
        ),
    );
    let serving = serve(d, "", json!([{"text": "Bye", "delay_ms": 300}]));
    eventually(Duration::from_secs(15), async || {
        received(d, "bridge")
            .iter()
            .any(|f| f["type"] == "ack" && f["message_id"].is_u64())
            .then_some(())
    })
    .await;
    // SIGTERM while the task runs: it drains, its reply is delivered and acknowledged, then
    // the gateway stops.
    serving.terminate();
    let got = replies(d, "bridge");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["text"], "Bye");
    let log = std::fs::read_to_string(d.join("serve.log")).unwrap();
    let delivered = log
        .lines()
        .any(|l| l.contains("delivered to a module") && l.contains("bridge"));
    assert!(
        delivered,
        "the reply's acknowledgement was not awaited:\n{log}"
    );
    assert!(!log.contains("delivery to a module failed"), "{log}");
}

/// An input module's messages that name no session go to its project's current session as
/// it is when each arrives: one made current meanwhile (the console's **Make current**) takes
/// the next message (the first session was kept for the life of the process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_made_current_takes_the_modules_next_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let gate = d.join("gate");
    module(
        d,
        "bridge",
        gateway_module(
            d,
            "bridge",
            "duplex",
            "sync",
            json!({"GATEWAY_FEED": "[\"first\", \"second\"]", "GATEWAY_FEED_GATE": gate}),
        ),
    );
    let serving = serve(d, "", json!([{"text": "one"}, {"text": "two"}]));
    let acked = |n: usize| {
        let d = d.to_owned();
        async move {
            eventually(Duration::from_secs(15), async || {
                let acks: Vec<Value> = received(&d, "bridge")
                    .into_iter()
                    .filter(|f| f["type"] == "ack" && f["message_id"].is_u64())
                    .collect();
                (acks.len() == n).then(|| acks[n - 1].clone())
            })
            .await
        }
    };
    let first = acked(1).await;
    let before = first["session"].as_str().unwrap().to_owned();
    let api = &serving.api;
    let made = crate::suite::serve::id(&api.session(Some("bridge")).await, "session_id");
    let (status, body) = api
        .put(
            "/api/projects/bridge/current-session",
            json!({"session_id": made}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    std::fs::write(format!("{}.1", gate.display()), "").unwrap();
    let second = acked(2).await;
    assert_ne!(made, before);
    assert_eq!(second["session"], json!(made), "{second}");
}
