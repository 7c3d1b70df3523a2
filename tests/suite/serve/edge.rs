//! The HTTP edge over a real socket: the Host, Origin and content-type checks (with and
//! without tokens), the slow-client limits, and the shape of every error.

use super::{Api, Server, with_tokens};
use reqwest::StatusCode;
use serde_json::Value;
use tokio_tungstenite::tungstenite;
use tungstenite::client::IntoClientRequest;

/// The status and JSON body of a WebSocket upgrade of `path` with these extra headers.
async fn upgrade(
    api: &Api,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let url = format!("{}{path}", api.base.replace("http://", "ws://"));
    let mut request = url.into_client_request().unwrap();
    for (name, value) in headers {
        request.headers_mut().insert(
            tungstenite::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    if let Some(t) = token {
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((mut ws, response)) => {
            let _ = ws.close(None).await;
            (response.status().as_u16(), Value::Null)
        }
        Err(tungstenite::Error::Http(response)) => {
            let status = response.status().as_u16();
            let body = response.into_body().unwrap_or_default();
            let v = serde_json::from_slice(&body).unwrap_or_else(|e| {
                panic!(
                    "not JSON ({e}): {status} {}",
                    String::from_utf8_lossy(&body)
                )
            });
            (status, v)
        }
        Err(e) => panic!("upgrade failed: {e}"),
    }
}

/// A request with a raw body and these headers.
async fn send(
    api: &Api,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &'static str,
) -> (StatusCode, Value) {
    let mut r = api.request(method, path).body(body);
    for (name, value) in headers {
        r = r.header(*name, *value);
    }
    let response = r.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    let v = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {status} {text}"))
    };
    (status, v)
}

fn own_origin(api: &Api) -> String {
    api.base.clone()
}

const CALL: &str = r#"{"jsonrpc": "2.0", "id": 1, "method": "session.list"}"#;
const EVIL: &str = "https://evil.example";

#[tokio::test]
async fn a_foreign_origin_cannot_open_a_websocket_or_post() {
    for tokens in [false, true] {
        let server = if tokens {
            Server::start_with(with_tokens, Vec::new()).await
        } else {
            Server::start().await
        };
        let token = tokens.then_some("ops-token");
        let api = match token {
            Some(t) => server.api_as(t),
            None => server.api(),
        };
        let own = own_origin(&api);
        let (status, v) = upgrade(&api, "/rpc/ws", token, &[("origin", EVIL)]).await;
        assert_eq!(
            (status, v["code"].as_str()),
            (403, Some("forbidden")),
            "{v}"
        );
        assert!(v["message"].as_str().unwrap().contains("Origin"), "{v}");
        let (status, _) = upgrade(&api, "/rpc/ws", token, &[("origin", &own)]).await;
        assert_eq!(status, 101, "the service's own origin");
        let (status, _) = upgrade(&api, "/rpc/ws", token, &[]).await;
        assert_eq!(status, 101, "no Origin: not a browser");

        let json = [("content-type", "application/json")];
        let foreign = [("content-type", "application/json"), ("origin", EVIL)];
        let (status, v) = send(&api, reqwest::Method::POST, "/rpc", &foreign, CALL).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
        assert_eq!(v["code"], "forbidden");
        let (status, v) = send(&api, reqwest::Method::POST, "/api/sessions", &foreign, "{}").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
        let (status, v) = send(&api, reqwest::Method::POST, "/rpc", &json, CALL).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert!(v["result"].is_array(), "{v}");
        let mine = [
            ("content-type", "application/json"),
            ("origin", own.as_str()),
        ];
        let (status, v) = send(&api, reqwest::Method::POST, "/api/sessions", &mine, "{}").await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        // Reads carry no Origin check (the browser keeps the answer from a foreign page).
        let (status, _) = send(
            &api,
            reqwest::Method::GET,
            "/api/projects/p/sessions",
            &[("origin", EVIL)],
            "",
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        server.stop().await;
    }
}

#[tokio::test]
async fn json_apis_refuse_bodies_a_browser_sends_cross_site() {
    let server = Server::start().await;
    let api = server.api();
    for (path, body) in [
        ("/rpc", CALL),
        (
            "/a2a",
            r#"{"jsonrpc": "2.0", "id": 1, "method": "GetTask"}"#,
        ),
        ("/api/sessions", "{}"),
    ] {
        for content_type in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            let (status, v) = send(
                &api,
                reqwest::Method::POST,
                path,
                &[("content-type", content_type)],
                body,
            )
            .await;
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{path} {v}");
            assert_eq!(v["code"], "unsupported_media_type", "{v}");
        }
        let (status, v) = send(&api, reqwest::Method::POST, path, &[], body).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "no type: {v}");
        let (status, v) = send(
            &api,
            reqwest::Method::POST,
            path,
            &[("content-type", "application/json; charset=utf-8")],
            body,
        )
        .await;
        assert!(status.is_success(), "{path}: {status} {v}");
    }
    let (status, v) = send(
        &api,
        reqwest::Method::PUT,
        "/api/projects/p/current-session",
        &[("content-type", "text/plain")],
        r#"{"session_id": "x"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{v}");
    let (status, _) = send(&api, reqwest::Method::POST, "/api/sessions", &[], "").await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "no body at all: an empty object"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_foreign_host_is_refused_but_probes_pass() {
    for tokens in [false, true] {
        let server = if tokens {
            Server::start_with(with_tokens, Vec::new()).await
        } else {
            Server::start().await
        };
        let api = if tokens {
            server.api_as("ops-token")
        } else {
            server.api()
        };
        let port = api.base.rsplit(':').next().unwrap().to_owned();
        let rebound = format!("rebind.evil.example:{port}");
        let (status, v) = send(
            &api,
            reqwest::Method::GET,
            "/api/projects/p/sessions",
            &[("host", &rebound)],
            "",
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
        assert!(v["message"].as_str().unwrap().contains("Host"), "{v}");
        let (status, _) = upgrade(&api, "/rpc/ws", None, &[("host", &rebound)]).await;
        assert_eq!(status, 403);
        let localhost = format!("localhost:{port}");
        let (status, _) = send(
            &api,
            reqwest::Method::GET,
            "/api/projects/p/sessions",
            &[("host", &localhost)],
            "",
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        for probe in ["/healthz", "/readyz"] {
            let (status, _) =
                send(&api, reqwest::Method::GET, probe, &[("host", &rebound)], "").await;
            assert_eq!(status, StatusCode::OK, "{probe}");
        }
        server.stop().await;
    }
}

#[tokio::test]
async fn configured_hosts_and_origins_are_let_in() {
    let server = Server::start_with(
        |c| {
            c.server.allowed_hosts = vec!["troupe.test".into()];
            c.server.allowed_origins = vec!["https://console.example".into()];
        },
        Vec::new(),
    )
    .await;
    let api = server.api();
    let headers = [
        ("host", "troupe.test"),
        ("origin", "https://console.example"),
        ("content-type", "application/json"),
    ];
    let (status, v) = send(&api, reqwest::Method::POST, "/api/sessions", &headers, "{}").await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let (status, _) = upgrade(&api, "/rpc/ws", None, &headers[..2]).await;
    assert_eq!(status, 101);
    server.stop().await;
}
