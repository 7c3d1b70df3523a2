//! Failover between two real `troupe serve` processes (nodes `a` and `b`, `[cluster] node`)
//! on loopback over one real PostgreSQL database, with a 2 s lease ttl.
//!
//! A session is created on A, which runs one message (its model answers only after ten
//! minutes) and queues another. B does not activate the session while A lives: a call sent
//! to B with forwarding turned off (`x-troupe-forwarded-by`, as a forwarded call carries) is
//! answered 503 naming A. A is
//! killed with SIGKILL; nobody asks B anything about the session, yet once A's lease has
//! expired B's scan of sessions with unfinished messages takes it over: the message A was
//! running ends `aborted`, the queued one runs on B and completes, and B serves new
//! messages for it. A restarted under its name finds the session B's: its message is refused
//! (503 naming B) and nothing of the session changes. Then B is paused (SIGSTOP) past its
//! lease: A takes the session over on the next request; B, resumed, gives the session up
//! (503 naming A) without writing for it. A stopped with SIGTERM gives its lease back.

use super::{kill9, messages, node, running_and_queued, send, send_here, signal, status_of, until};
use reqwest::StatusCode;
use serde_json::Value;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_session_is_taken_over_and_its_accepted_work_ends() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let (mut a, base_a) = node(dir.path(), &url, "a", 600_000);
    let (mut b, base_b) = node(dir.path(), &url, "b", 10);

    let (session, first, second) = running_and_queued(&base_a).await;

    // A lives: B does not activate the session (asked not to forward, it answers 503).
    let (status, refused) = send_here(&base_b, &session, "to b while a lives").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert!(refused.to_string().contains("owned by node a"), "{refused}");

    kill9(&mut a);
    let killed = Instant::now();
    // Nothing is asked of B: its scan takes the session over once A's lease expired.
    until(&base_b, &session, Duration::from_secs(30), |m| {
        status_of(m, first).as_deref() == Some("aborted")
            && status_of(m, second).as_deref() == Some("completed")
    })
    .await;
    let failover = killed.elapsed();
    eprintln!("taken over and the queued message answered {failover:?} after the kill");
    assert!(
        failover >= Duration::from_secs(1),
        "taken over before the lease could expire: {failover:?}"
    );
    let replies: Vec<Value> = messages(&base_b, &session)
        .await
        .into_iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
    assert!(
        replies.iter().any(|m| m["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("b reply"))),
        "the queued message was answered by b's model: {replies:#?}"
    );

    // B serves the session now.
    let (status, third) = send(&base_b, &session, "to b after the takeover").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{third}");
    let third = third["message"]["message_id"].as_u64().unwrap();
    until(&base_b, &session, Duration::from_secs(10), |m| {
        status_of(m, third).as_deref() == Some("completed")
    })
    .await;

    // A comes back under its name: the session is B's, A neither takes it nor writes for it.
    let (mut a, base_a) = node(dir.path(), &url, "a", 10);
    let before = messages(&base_b, &session).await;
    let (status, refused) = send_here(&base_a, &session, "to a after its restart").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert!(refused.to_string().contains("owned by node b"), "{refused}");
    tokio::time::sleep(Duration::from_secs(3)).await; // a scan of A's runs meanwhile
    assert_eq!(
        messages(&base_a, &session).await,
        before,
        "nothing written by a"
    );

    // B is paused past its lease: A takes the session over on the next request, and B, once
    // it runs again, finds its lease lost and gives the session up without writing for it.
    signal(&b, nix::sys::signal::Signal::SIGSTOP);
    let started = Instant::now();
    let fourth = loop {
        let (status, v) = send_here(&base_a, &session, "to a while b is paused").await;
        if status == StatusCode::ACCEPTED {
            break v["message"]["message_id"].as_u64().unwrap();
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
        assert!(started.elapsed() < Duration::from_secs(15), "{v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    until(&base_a, &session, Duration::from_secs(10), |m| {
        status_of(m, fourth).as_deref() == Some("completed")
    })
    .await;
    signal(&b, nix::sys::signal::Signal::SIGCONT);
    let resumed = Instant::now();
    loop {
        let (status, v) = send_here(&base_b, &session, "to b after its pause").await;
        assert_ne!(
            status,
            StatusCode::ACCEPTED,
            "b wrote for a session it lost: {v}"
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(v.to_string().contains("owned by node a"), "{v}");
            break;
        }
        // Before its renewal fails, B's host still runs: the fence refuses its write.
        assert!(v.to_string().contains("lease lost"), "{status}: {v}");
        assert!(resumed.elapsed() < Duration::from_secs(10), "{v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let last = messages(&base_a, &session).await;
    assert!(
        last.iter().all(|m| m["content"] != "to b after its pause"),
        "{last:#?}"
    );

    // A shuts down gracefully: it gives its leases back (expired at once).
    signal(&a, nix::sys::signal::Signal::SIGTERM);
    a.wait().unwrap();
    let leases = troupe_test_postgres::server()
        .psql_at(
            &url,
            &format!("SELECT owner, expires_ms FROM session_leases WHERE session_id = '{session}'"),
        )
        .unwrap();
    assert_eq!(leases.trim(), "a|0", "given back, expired at once");
    kill9(&mut b);
}

/// A node stopped gracefully while a turn outlasts its grace period stores that turn's
/// outcome (`cancelled`) before it gives its lease back: the write is fenced by the lease, so
/// given back first it was refused and the message stayed `running` for another node to
/// abort.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_stores_the_cancelled_outcome_before_giving_its_lease_back() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let mut command = super::node_command(dir.path(), &url, "a", 600_000, super::LEASE_TTL);
    command
        .env("TROUPE_GRACE_PERIOD", "300ms")
        .stderr(std::process::Stdio::null());
    let (mut a, base_a) = super::spawn_node(&mut command);
    let (session, first, second) = running_and_queued(&base_a).await;
    signal(&a, nix::sys::signal::Signal::SIGTERM);
    a.wait().unwrap();
    let status = |id: u64| {
        troupe_test_postgres::server()
            .psql_at(
                &url,
                &format!("SELECT status FROM messages WHERE message_id = {id}"),
            )
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(status(first), "cancelled", "session {session}");
    assert_eq!(status(second), "queued", "session {session}");
    let leases = troupe_test_postgres::server()
        .psql_at(
            &url,
            &format!("SELECT owner, expires_ms FROM session_leases WHERE session_id = '{session}'"),
        )
        .unwrap();
    assert_eq!(leases.trim(), "a|0", "given back, expired at once");
}
