//! The service's own actors are supervised: a failed sessions registry is replaced and the
//! API keeps working with everything stored; one that cannot be kept alive turns `/healthz`
//! to 503 and makes `serve_http` return an error (so `troupe serve` exits non-zero).

use super::{Api, Server, id};
use reqwest::StatusCode;
use serde_json::json;
use std::time::{Duration, Instant};
use troupe_service::supervisor::SupervisorMsg;

/// Makes the registry fail and waits until a new one runs (or none will: the supervisor
/// gave up).
async fn fail_registry(sessions: &troupe_service::sessions_api::SessionsApi) {
    let before = sessions.current_registry().map(|r| r.get_id());
    sessions
        .supervisor()
        .cast(SupervisorMsg::FailRegistry)
        .unwrap();
    let mut health = sessions.health();
    let t0 = Instant::now();
    loop {
        let now = sessions.current_registry().map(|r| r.get_id());
        let failed = *health.borrow_and_update() != troupe_service::supervisor::Health::Ok;
        if failed || (now.is_some() && now != before) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no new registry");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls `/readyz` until it answers 200 (at most 10 s).
async fn ready(api: &Api) {
    let t0 = Instant::now();
    loop {
        if api.get("/readyz").await.0 == StatusCode::OK {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "never ready again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_registry_is_replaced_and_the_sessions_come_back() {
    let server = Server::start().await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    api.say(&sid, "before").await;
    let session = server
        .service
        .sessions
        .session(troupe_service::auth::Scope::All, sid.parse().unwrap())
        .await
        .unwrap();

    server
        .service
        .sessions
        .supervisor()
        .cast(SupervisorMsg::FailRegistry)
        .unwrap();
    // The registry's failure stops its sessions with it; a new registry starts them again
    // on their next use, from the store.
    let t0 = Instant::now();
    while session.actor().get_status() != ractor::ActorStatus::Stopped {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the old session still runs"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ready(&api).await;
    let (status, health) = api.get("/healthz").await;
    assert_eq!(
        (status, health["status"].clone()),
        (StatusCode::OK, json!("ok"))
    );
    let reply = api.say(&sid, "after").await;
    assert_eq!(reply["reply"]["text"], "You said: after");
    let (_, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
    let texts: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts,
        ["before", "You said: before", "after", "You said: after"]
    );
    let again = server
        .service
        .sessions
        .session(troupe_service::auth::Scope::All, sid.parse().unwrap())
        .await
        .unwrap();
    assert_ne!(again.actor().get_id(), session.actor().get_id());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_keeps_failing_makes_the_service_unhealthy() {
    let dir = tempfile::tempdir().unwrap();
    let config = troupe_runtime::config::TroupeConfig {
        data_dir: dir.path().to_owned(),
        ..Default::default()
    };
    let model = std::sync::Arc::new(troupe_runtime::ScriptedModel::new(Vec::new()));
    let ports = troupe_runtime::assembly::session_ports(
        &config,
        model,
        std::sync::Arc::new(troupe_actors::ports::ApproxTokens),
    );
    let store = std::sync::Arc::new(troupe_store::memory::MemoryStore::new());
    let service = troupe_service::Service::start(&config, store, ports, None)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = Api::new(&format!("http://{}", listener.local_addr().unwrap()), None);
    let s = service.clone();
    let served = tokio::spawn(async move { s.serve_http(listener).await });

    let budget = troupe_service::supervisor::RESTARTS_PER_WINDOW;
    for _ in 0..budget {
        ready(&api).await;
        fail_registry(&service.sessions).await;
    }
    ready(&api).await;
    fail_registry(&service.sessions).await;
    let result = tokio::time::timeout(Duration::from_secs(30), served)
        .await
        .expect("serve_http returns")
        .unwrap();
    let err = result.expect_err("an unrecoverable failure is an error");
    assert!(err.to_string().contains("keeps failing"), "{err}");
}

/// `/healthz` says why, for as long as the process still answers (here the router is served
/// without `serve_http`, which would shut it down at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_reports_the_failure() {
    use troupe_service::supervisor::Health;
    let dir = tempfile::tempdir().unwrap();
    let config = troupe_runtime::config::TroupeConfig {
        data_dir: dir.path().to_owned(),
        ..Default::default()
    };
    let model = std::sync::Arc::new(troupe_runtime::ScriptedModel::new(Vec::new()));
    let ports = troupe_runtime::assembly::session_ports(
        &config,
        model,
        std::sync::Arc::new(troupe_actors::ports::ApproxTokens),
    );
    let store = std::sync::Arc::new(troupe_store::memory::MemoryStore::new());
    let service = troupe_service::Service::start(&config, store, ports, None)
        .await
        .unwrap();
    let app = service.router(troupe_service::ExtraRoutes::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = Api::new(&format!("http://{}", listener.local_addr().unwrap()), None);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let (status, body) = api.get("/healthz").await;
    assert_eq!(
        (status, body["status"].clone()),
        (StatusCode::OK, json!("ok"))
    );
    let mut health = service.sessions.health();
    let budget = troupe_service::supervisor::RESTARTS_PER_WINDOW;
    for _ in 0..=budget {
        ready(&api).await;
        fail_registry(&service.sessions).await;
    }
    tokio::time::timeout(
        Duration::from_secs(10),
        health.wait_for(|h| h != &Health::Ok),
    )
    .await
    .unwrap()
    .unwrap();
    let (status, body) = api.get("/healthz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], "failed");
    assert_eq!(body["component"], "registry");
    assert!(
        body["reason"].as_str().unwrap().contains("keeps failing"),
        "{body}"
    );
    let (status, _) = api.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

/// A part of the service that gives up (the A2A endpoint's supervisor does this through
/// `report_failure`) fails the whole service the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_that_gives_up_fails_the_service() {
    let server = Server::start().await;
    let api = server.api();
    let mut health = server.service.sessions.health();
    server
        .service
        .sessions
        .report_failure("a2a", "the A2A endpoint keeps failing (drill)".into());
    let failed = tokio::time::timeout(
        Duration::from_secs(10),
        health.wait_for(|h| h != &troupe_service::supervisor::Health::Ok),
    )
    .await
    .unwrap()
    .unwrap()
    .clone();
    assert_eq!(
        failed,
        troupe_service::supervisor::Health::Failed {
            component: "a2a".into(),
            reason: "the A2A endpoint keeps failing (drill)".into()
        }
    );
    // Until it closes its listener, the service says why.
    let (status, body) = api.get("/healthz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["component"], "a2a");
    // serve_http notices and shuts down with an error (Server::stop would panic on it).
    let t0 = Instant::now();
    while api
        .http
        .get(format!("{}/healthz", api.base))
        .send()
        .await
        .is_ok()
    {
        assert!(t0.elapsed() < Duration::from_secs(30), "still serving");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
