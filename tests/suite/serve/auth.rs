//! Bearer tokens: 401 without a valid one; a token sees only its projects, and another
//! project's session is 404 (not 403) so ids do not leak.

use super::{Server, id, with_tokens};
use reqwest::StatusCode;
use serde_json::json;
use troupe_service::error::NOT_FOUND;

#[tokio::test]
async fn tokens_guard_every_route_but_health() {
    let server = Server::start_with(with_tokens, Vec::new()).await;
    let anon = server.api();
    let wrong = server.api_as("guess");
    for api in [&anon, &wrong] {
        for path in ["/api/projects/alpha/sessions", "/metrics"] {
            let (status, body) = api.get(path).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
            assert_eq!(body["code"], "unauthorized");
        }
        let (status, _) = api
            .post(
                "/rpc",
                json!({"jsonrpc": "2.0", "id": 1, "method": "session.list"}),
            )
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _) = api.post("/api/sessions", json!({})).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    let r = anon
        .http
        .get(format!("{}/api/projects/alpha/sessions", anon.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    assert_eq!(anon.get("/healthz").await.0, StatusCode::OK);
    assert_eq!(anon.get("/readyz").await.0, StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn a_token_never_reaches_another_projects_sessions() {
    let server = Server::start_with(with_tokens, Vec::new()).await;
    let alpha = server.api_as("alpha-token");
    let beta = server.api_as("beta-token");
    let ops = server.api_as("ops-token");

    let a = alpha.session(None).await;
    assert_eq!(
        a["project_id"], "alpha",
        "a one-project token creates in its project"
    );
    let b = beta.session(Some("beta")).await;
    let (aid, bid) = (id(&a, "session_id"), id(&b, "session_id"));

    // beta's session through alpha's token: exactly like an unknown id.
    for path in [
        format!("/api/sessions/{bid}"),
        format!("/api/sessions/{bid}/messages"),
        format!("/api/sessions/{bid}/events"),
        "/api/projects/beta/sessions".to_owned(),
        "/api/projects/beta/current-session".to_owned(),
    ] {
        let (status, body) = alpha.get(&path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert_eq!(body["code"], "not_found");
    }
    let (status, _) = alpha
        .post(
            &format!("/api/sessions/{bid}/messages"),
            json!({"text": "hi"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = alpha
        .put(
            "/api/projects/beta/current-session",
            json!({"session_id": bid}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = alpha
        .put(
            "/api/projects/alpha/current-session",
            json!({"session_id": bid}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = alpha
        .post("/api/sessions", json!({"project_id": "beta"}))
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "cannot create in another project"
    );
    for method in [
        "session.get",
        "conversation.list",
        "messages.list",
        "approval.list",
    ] {
        assert_eq!(
            alpha.call_err(method, json!({"session_id": bid})).await,
            NOT_FOUND,
            "{method}"
        );
    }
    assert_eq!(
        alpha
            .call_err(
                "conversation.message",
                json!({"session_id": bid, "text": "hi"})
            )
            .await,
        NOT_FOUND
    );
    let listed = alpha.call("session.list", json!({})).await;
    assert_eq!(listed, json!([a]), "only its own sessions are listed");

    // Its own project works; the "*" token sees both.
    alpha.say(&aid, "mine").await;
    assert_eq!(
        alpha.get(&format!("/api/sessions/{aid}")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        ops.get(&format!("/api/sessions/{bid}")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        ops.get(&format!("/api/sessions/{aid}")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        ops.get("/metrics").await.0,
        StatusCode::NOT_FOUND,
        "no recorder in tests"
    );
    server.stop().await;
}
