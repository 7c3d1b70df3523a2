//! A cluster node's edges: one listening on every address must publish an address the
//! others can call, and a session WebSocket asked of a node whose owner just died (its lease
//! not expired yet) is answered by that node at once, not left hanging.

use super::{create_here, kill9, node_with_ttl};
use reqwest::StatusCode;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use troupe_tests::troupe_bin;

#[test]
fn a_node_on_every_address_without_an_api_url_refuses_to_start() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(troupe_bin())
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--node", "everywhere"])
        .current_dir(dir.path())
        .env("TROUPE_API_TOKENS", "edge-token=*")
        .env_remove("TROUPE_STORE_BACKEND")
        .env_remove("TROUPE_NODE")
        .env_remove("TROUPE_CLUSTER_API_URL")
        .env("TROUPE_POSTGRES_URL", &url)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            kill9(&mut child);
            panic!("still running after 60 s: it should have refused to start");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("0.0.0.0") && stderr.contains("[cluster] api_url"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_for_a_dead_owners_session_is_answered_by_the_node_asked() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    // A lease that outlives the test: the session stays the dead node's.
    let (mut a, base_a) = node_with_ttl(dir.path(), &url, "a", 10, "120s");
    let (mut b, base_b) = node_with_ttl(dir.path(), &url, "b", 10, "120s");
    let (status, s) = create_here(&base_a).await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let session = s["session_id"].as_str().unwrap().to_owned();
    kill9(&mut a);

    let ws = format!(
        "{}/api/sessions/{session}/events/ws?after=0",
        base_b.trim_end_matches('/').replace("http://", "ws://")
    );
    let answered = tokio::time::timeout(
        Duration::from_secs(20),
        tokio_tungstenite::connect_async(ws),
    )
    .await
    .expect("answered, not left hanging");
    match answered {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE.as_u16());
            let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
                .into_owned();
            assert!(body.contains("owned by node a"), "{body}");
        }
        Err(other) => panic!("expected 503 from b, got {other}"),
        Ok(_) => {
            panic!("expected 503 from b: the session is a dead node's until its lease expires")
        }
    }
    kill9(&mut b);
}
