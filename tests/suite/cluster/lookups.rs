//! A call for a session its node holds the lease of is answered there without asking
//! PostgreSQL who owns it; through another node it costs that node one query and a forward.

use super::forwarding::metrics;
use super::{create_here, http, kill9, node, send};
use reqwest::StatusCode;

fn lookups(metrics: &str, source: &str) -> f64 {
    let series = format!("troupe_cluster_owner_lookups_total{{source=\"{source}\"}}");
    metrics
        .lines()
        .find(|l| l.starts_with(&series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_answers_its_sessions_calls_without_an_owner_query() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let (mut a, base_a) = node(dir.path(), &url, "a", 10);
    let (mut b, base_b) = node(dir.path(), &url, "b", 10);
    let (status, s) = create_here(&base_a).await;
    assert_eq!(status, StatusCode::CREATED, "{s}");
    let session = s["session_id"].as_str().unwrap().to_owned();

    let before = metrics(&base_a).await;
    for i in 0..5 {
        let (status, v) = send(&base_a, &session, &format!("m{i}")).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        let r = http()
            .get(format!("{base_a}/api/sessions/{session}/messages?limit=1"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    let after = metrics(&base_a).await;
    assert_eq!(
        lookups(&after, "store"),
        lookups(&before, "store"),
        "no owner query on the owner"
    );
    assert!(lookups(&after, "held") >= lookups(&before, "held") + 10.0);

    // Through B: one query there, forwarded to A (which does not look again).
    let b_before = lookups(&metrics(&base_b).await, "store");
    let r = http()
        .get(format!("{base_b}/api/sessions/{session}/messages?limit=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(lookups(&metrics(&base_b).await, "store"), b_before + 1.0);
    assert_eq!(
        lookups(&metrics(&base_a).await, "store"),
        lookups(&before, "store")
    );
    kill9(&mut a);
    kill9(&mut b);
}
