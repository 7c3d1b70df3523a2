//! The node transport (a build with the `cluster` feature): real `troupe serve` nodes joined
//! over ractor_cluster on loopback, sharing one real PostgreSQL database.
//!
//! - Nodes that share the cookie see each other (`troupe_cluster_peers`), a node joining
//!   through one seed meets that seed's peers too; a node with another cookie is refused; a
//!   seed killed and restarted on its address is joined again.
//! - A node stopped with SIGTERM gives its leases back and tells the others (`leaving`): its
//!   queued message runs on the other node well within a 60 s lease ttl and a 120 s periodic
//!   scan, so neither the lease's expiry nor that scan can have done it.
//! - A node killed with SIGKILL: its connection drops, and the other node looks for its
//!   sessions once its leases can have expired (`peer_lost`), long before its own periodic
//!   scan (120 s) would.

use super::forwarding::metrics;
use super::{
    create_here, kill9, messages, node_command, running_and_queued, send, send_here, signal,
    status_of, until,
};
use reqwest::StatusCode;
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const COOKIE: &str = "the cluster's secret";
/// Far longer than any test waits: the periodic scan never runs after the one at start.
const SCAN_EVERY: &str = "120s";

/// A free port on loopback (bound, then released for the node to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A node on the transport: `listen` on `port`, joining `seeds`, with `cookie`.
struct Joined<'a> {
    name: &'a str,
    delay_ms: u64,
    ttl: &'a str,
    port: u16,
    seeds: &'a [u16],
    cookie: &'a str,
}

/// Starts the node `n`. Its stderr goes to `stderr-<name>.log` in `dir` (appended: a
/// restarted node adds to it).
fn joined(dir: &Path, url: &str, n: Joined<'_>) -> (super::Node, String) {
    let Joined {
        name,
        delay_ms,
        ttl,
        port,
        seeds,
        cookie,
    } = n;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("stderr-{name}.log")))
        .unwrap();
    let seeds: Vec<String> = seeds.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut command = node_command(dir, url, name, delay_ms, ttl);
    command
        .args(["--cluster-listen", &format!("127.0.0.1:{port}")])
        .env("TROUPE_CLUSTER_COOKIE", cookie)
        .env("TROUPE_CLUSTER_SCAN_EVERY", SCAN_EVERY)
        .stderr(Stdio::from(log));
    if !seeds.is_empty() {
        command.args(["--seeds", &seeds.join(",")]);
    }
    super::spawn_node(&mut command)
}

fn stderr_of(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("stderr-{name}.log"))).unwrap_or_default()
}

/// The value of one series (`name{labels}` as /metrics prints it).
fn series(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {metrics}"))
}

/// Polls a node's /metrics until `series` has `check`ed, for at most `within`.
async fn until_series(
    base: &str,
    name: &str,
    within: Duration,
    check: impl Fn(f64) -> bool,
    dir: &Path,
) -> f64 {
    let started = Instant::now();
    loop {
        let v = series(&metrics(base).await, name);
        if check(v) {
            return v;
        }
        assert!(
            started.elapsed() < within,
            "{name} = {v} after {within:?}\n--- a\n{}\n--- b\n{}",
            stderr_of(dir, "a"),
            stderr_of(dir, "b")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const PEERS: &str = "troupe_cluster_peers";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_see_each_other_a_wrong_cookie_is_refused_and_a_restarted_seed_is_joined_again() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let (mut a, base_a) = joined(
        d,
        &url,
        Joined {
            name: "a",
            delay_ms: 10,
            ttl: "2s",
            port: pa,
            seeds: &[],
            cookie: COOKIE,
        },
    );
    let (mut b, base_b) = joined(
        d,
        &url,
        Joined {
            name: "b",
            delay_ms: 10,
            ttl: "2s",
            port: pb,
            seeds: &[pa],
            cookie: COOKIE,
        },
    );
    let within = Duration::from_secs(20);
    until_series(&base_a, PEERS, within, |v| v == 1.0, d).await;
    until_series(&base_b, PEERS, within, |v| v == 1.0, d).await;
    assert!(
        stderr_of(d, "b").contains(&format!("node transport listening on 127.0.0.1:{pb}")),
        "{}",
        stderr_of(d, "b")
    );

    // Another cookie: a connects nobody new, c has no peer, and a counts the refusal.
    let refused = r#"troupe_cluster_peer_events_total{event="refused"}"#;
    let before = series(&metrics(&base_a).await, refused);
    let (mut c, base_c) = joined(
        d,
        &url,
        Joined {
            name: "c",
            delay_ms: 10,
            ttl: "2s",
            port: pc,
            seeds: &[pa],
            cookie: "another secret",
        },
    );
    until_series(&base_a, refused, within, |v| v > before, d).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(series(&metrics(&base_a).await, PEERS), 1.0, "only b");
    assert_eq!(
        series(&metrics(&base_c).await, PEERS),
        0.0,
        "c is nobody's peer"
    );
    kill9(&mut c);

    // A node that joins through b alone meets a too (b tells it its peers).
    let pd = free_port();
    let (mut d_node, base_d) = joined(
        d,
        &url,
        Joined {
            name: "d",
            delay_ms: 10,
            ttl: "2s",
            port: pd,
            seeds: &[pb],
            cookie: COOKIE,
        },
    );
    for base in [&base_a, &base_b, &base_d] {
        until_series(base, PEERS, within, |v| v == 2.0, d).await;
    }
    kill9(&mut d_node);
    until_series(&base_b, PEERS, within, |v| v == 1.0, d).await;

    // The seed dies: b loses it; restarted on its address, b joins it again by itself.
    kill9(&mut a);
    until_series(&base_b, PEERS, within, |v| v == 0.0, d).await;
    assert_eq!(
        series(
            &metrics(&base_b).await,
            r#"troupe_cluster_peer_events_total{event="lost"}"#
        ),
        2.0,
        "d, then a"
    );
    let (mut a, base_a) = joined(
        d,
        &url,
        Joined {
            name: "a",
            delay_ms: 10,
            ttl: "2s",
            port: pa,
            seeds: &[],
            cookie: COOKIE,
        },
    );
    until_series(&base_b, PEERS, within, |v| v == 1.0, d).await;
    until_series(&base_a, PEERS, within, |v| v == 1.0, d).await;
    kill9(&mut a);
    kill9(&mut b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopping_gracefully_hands_its_sessions_over_at_once() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ttl = Duration::from_secs(60);
    let (pa, pb) = (free_port(), free_port());
    // a's model answers after 2 s: its first message is running when it is stopped.
    let (mut a, base_a) = joined(
        d,
        &url,
        Joined {
            name: "a",
            delay_ms: 2_000,
            ttl: "60s",
            port: pa,
            seeds: &[pb],
            cookie: COOKIE,
        },
    );
    let (mut b, base_b) = joined(
        d,
        &url,
        Joined {
            name: "b",
            delay_ms: 10,
            ttl: "60s",
            port: pb,
            seeds: &[pa],
            cookie: COOKIE,
        },
    );
    let within = Duration::from_secs(20);
    until_series(&base_a, PEERS, within, |v| v == 1.0, d).await;
    until_series(&base_b, PEERS, within, |v| v == 1.0, d).await;

    let (session, first, second) = running_and_queued(&base_a).await;
    let (status, refused) = send_here(&base_b, &session, "to b while a lives").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");

    let leaving = r#"troupe_cluster_remote_messages_total{direction="received",kind="leaving"}"#;
    assert_eq!(series(&metrics(&base_b).await, leaving), 0.0);
    signal(&a, nix::sys::signal::Signal::SIGTERM);
    let stopped = Instant::now();
    assert!(a.wait().unwrap().success(), "{}", stderr_of(d, "a"));
    // a finished what ran, gave its lease back and told b; b runs the queued message.
    until(&base_b, &session, Duration::from_secs(20), |m| {
        status_of(m, first).as_deref() == Some("completed")
            && status_of(m, second).as_deref() == Some("completed")
    })
    .await;
    let handover = stopped.elapsed();
    eprintln!("the queued message answered {handover:?} after SIGTERM (lease ttl {ttl:?})");
    assert!(
        handover < ttl / 3,
        "not before the lease could have expired: {handover:?}"
    );
    let m = metrics(&base_b).await;
    assert_eq!(series(&m, leaving), 1.0);
    assert_eq!(
        series(&m, r#"troupe_session_scans_total{trigger="peer_left"}"#),
        1.0
    );
    assert_eq!(
        series(&m, r#"troupe_session_scans_total{trigger="periodic"}"#),
        0.0,
        "no periodic scan ran"
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
    let lease = troupe_test_postgres::server()
        .psql_at(
            &url,
            &format!("SELECT owner FROM session_leases WHERE session_id = '{session}'"),
        )
        .unwrap();
    assert_eq!(lease.trim(), "b");
    kill9(&mut b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_is_taken_over_once_its_leases_can_have_expired() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ttl = Duration::from_secs(3);
    let (pa, pb) = (free_port(), free_port());
    let (mut a, base_a) = joined(
        d,
        &url,
        Joined {
            name: "a",
            delay_ms: 600_000,
            ttl: "3s",
            port: pa,
            seeds: &[],
            cookie: COOKIE,
        },
    );
    let (mut b, base_b) = joined(
        d,
        &url,
        Joined {
            name: "b",
            delay_ms: 10,
            ttl: "3s",
            port: pb,
            seeds: &[pa],
            cookie: COOKIE,
        },
    );
    let within = Duration::from_secs(20);
    until_series(&base_b, PEERS, within, |v| v == 1.0, d).await;

    let (session, first, second) = running_and_queued(&base_a).await;

    kill9(&mut a);
    let killed = Instant::now();
    // Nothing is asked of b that activates the session: its scan after the drop takes it.
    until(&base_b, &session, Duration::from_secs(20), |m| {
        status_of(m, first).as_deref() == Some("aborted")
            && status_of(m, second).as_deref() == Some("completed")
    })
    .await;
    let failover = killed.elapsed();
    eprintln!(
        "taken over {failover:?} after kill -9 (lease ttl {ttl:?}, periodic scan {SCAN_EVERY})"
    );
    assert!(
        failover >= ttl / 3,
        "before the lease could expire: {failover:?}"
    );
    assert!(failover < Duration::from_secs(15), "{failover:?}");
    let m = metrics(&base_b).await;
    assert_eq!(
        series(&m, r#"troupe_cluster_peer_events_total{event="lost"}"#),
        1.0
    );
    assert!(series(&m, r#"troupe_session_scans_total{trigger="peer_lost"}"#) >= 1.0);
    assert_eq!(
        series(&m, r#"troupe_session_scans_total{trigger="periodic"}"#),
        0.0,
        "no periodic scan ran"
    );
    assert!(series(&m, "troupe_lease_takeovers_total") >= 1.0);
    kill9(&mut b);
}

/// One failover: a session with a running and a queued message on `a`, `a` killed; how long
/// until `b` answered the queued message. `transport`: both nodes joined (b looks when the
/// connection drops); otherwise PostgreSQL alone (b looks at its periodic scan, every ttl).
async fn failover_once(transport: bool, ttl: &str) -> Duration {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (pa, pb) = (free_port(), free_port());
    let (mut a, base_a, mut b, base_b) = if transport {
        let (a, base_a) = joined(
            d,
            &url,
            Joined {
                name: "a",
                delay_ms: 600_000,
                ttl,
                port: pa,
                seeds: &[],
                cookie: COOKIE,
            },
        );
        let (b, base_b) = joined(
            d,
            &url,
            Joined {
                name: "b",
                delay_ms: 10,
                ttl,
                port: pb,
                seeds: &[pa],
                cookie: COOKIE,
            },
        );
        until_series(&base_b, PEERS, Duration::from_secs(20), |v| v == 1.0, d).await;
        (a, base_a, b, base_b)
    } else {
        let (a, base_a) = super::node_with_ttl(d, &url, "a", 600_000, ttl);
        let (b, base_b) = super::node_with_ttl(d, &url, "b", 10, ttl);
        (a, base_a, b, base_b)
    };
    let (status, s) = create_here(&base_a).await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let session = s["session_id"].as_str().unwrap().to_owned();
    let (_, first) = send(&base_a, &session, "runs on a").await;
    let (_, second) = send(&base_a, &session, "queued on a").await;
    let first = first["message"]["message_id"].as_u64().unwrap();
    let second = second["message"]["message_id"].as_u64().unwrap();
    until(&base_a, &session, Duration::from_secs(10), |m| {
        status_of(m, first).as_deref() == Some("running")
    })
    .await;
    kill9(&mut a);
    let killed = Instant::now();
    until(&base_b, &session, Duration::from_secs(60), |m| {
        status_of(m, second).as_deref() == Some("completed")
    })
    .await;
    let took = killed.elapsed();
    kill9(&mut b);
    took
}

/// Failover time after kill -9, by the dropped connection against by the periodic scan alone,
/// with the same lease ttl (BENCHMARKS.md, "The node transport"). Prints a table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_by_disconnect_and_by_lease_expiry() {
    let rounds: usize = std::env::var("TROUPE_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let ttl = Duration::from_secs(4);
    let mut table = Vec::new();
    for transport in [true, false] {
        let mut times = Vec::new();
        for _ in 0..rounds {
            times.push(failover_once(transport, "4s").await);
        }
        for t in &times {
            // Never before the lease could expire (a renewal is at most ttl/3 old).
            assert!(*t >= ttl * 2 / 3, "{t:?}");
        }
        table.push((transport, times));
    }
    eprintln!("| path (lease ttl 4 s) | kill -9 → queued message answered by b |");
    eprintln!("|---|---|");
    for (transport, times) in table {
        let path = if transport {
            "connection dropped (peer_lost scan)"
        } else {
            "PostgreSQL alone (periodic scan every ttl)"
        };
        let list: Vec<String> = times
            .iter()
            .map(|t| format!("{:.2} s", t.as_secs_f64()))
            .collect();
        eprintln!("| {path} | {} |", list.join(", "));
    }
}

/// A node with seeds but no `listen` says at start that it does not join the transport; one
/// with `listen` but no cookie refuses to start, naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_says_what_of_its_transport_settings_it_cannot_use() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = std::fs::File::create(d.join("stderr-a.log")).unwrap();
    let mut command = node_command(d, &url, "a", 10, "2s");
    command
        .args(["--seeds", "127.0.0.1:1"])
        .stderr(Stdio::from(log));
    let (mut a, base_a) = super::spawn_node(&mut command);
    let said = stderr_of(d, "a");
    assert!(
        said.contains(
            "troupe: warning: [cluster] seeds and cookie are ignored without [cluster] listen"
        ),
        "{said}"
    );
    assert_eq!(series(&metrics(&base_a).await, PEERS), 0.0);
    kill9(&mut a);

    let out = node_command(d, &url, "b", 10, "2s")
        .args(["--cluster-listen", &format!("127.0.0.1:{}", free_port())])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the node transport needs [cluster] cookie (TROUPE_CLUSTER_COOKIE)"),
        "{stderr}"
    );
}

/// Two nodes that name each other as seeds (the usual configuration) join once and stay
/// joined: neither keeps dialling the other (no connection refused after they joined).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_seed_each_other_join_once_and_stop_dialling() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (pa, pb) = (free_port(), free_port());
    let node = |name, port, seeds| Joined {
        name,
        delay_ms: 10,
        ttl: "2s",
        port,
        seeds,
        cookie: COOKIE,
    };
    let (seeds_a, seeds_b) = ([pb], [pa]);
    let (mut a, base_a) = joined(d, &url, node("a", pa, &seeds_a));
    let (mut b, base_b) = joined(d, &url, node("b", pb, &seeds_b));
    let within = Duration::from_secs(20);
    until_series(&base_a, PEERS, within, |v| v == 1.0, d).await;
    until_series(&base_b, PEERS, within, |v| v == 1.0, d).await;
    // Joined: settle, then watch both nodes over more than two redial periods (5 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let refused = r#"troupe_cluster_peer_events_total{event="refused"}"#;
    let before = (
        series(&metrics(&base_a).await, refused),
        series(&metrics(&base_b).await, refused),
    );
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after = (
        series(&metrics(&base_a).await, refused),
        series(&metrics(&base_b).await, refused),
    );
    assert_eq!(
        before,
        after,
        "no more dials once joined\n--- a\n{}\n--- b\n{}",
        stderr_of(d, "a"),
        stderr_of(d, "b")
    );
    assert_eq!(series(&metrics(&base_a).await, PEERS), 1.0);
    assert_eq!(series(&metrics(&base_b).await, PEERS), 1.0);
    kill9(&mut a);
    kill9(&mut b);
}
