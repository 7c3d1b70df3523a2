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
        // Created in project `p`, so that the read below names a project that exists.
        let (status, v) = send(
            &api,
            reqwest::Method::POST,
            "/api/sessions",
            &mine,
            r#"{"project_id": "p"}"#,
        )
        .await;
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
        // A project that exists, so that the allowed read below answers 200.
        api.session(Some("p")).await;
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

/// The error body every error has.
fn assert_error(status: StatusCode, v: &Value, want: StatusCode, code: &str) {
    assert_eq!(status, want, "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(v.get("details").is_some(), "{v}");
}

#[tokio::test]
async fn every_error_is_json() {
    let server = Server::start_with(|c| c.server.body_limit = 1024, Vec::new()).await;
    let api = server.api();
    let json = [("content-type", "application/json")];
    // Ids that do not decode are unknown ids, as the README promises.
    for path in [
        "/api/sessions/%ff",
        "/api/sessions/%ff/messages",
        "/api/sessions/%ff/events",
        "/api/projects/%ff%fe/sessions",
    ] {
        let (status, v) = api.get(path).await;
        assert_error(status, &v, StatusCode::NOT_FOUND, "not_found");
    }
    // A WebSocket route asked without the upgrade.
    for path in ["/rpc/ws", "/api/sessions/x/events/ws"] {
        let (status, v) = api.get(path).await;
        assert!(status.is_client_error(), "{path}: {status}");
        assert!(v["code"].is_string(), "{path}: {v}");
        assert!(v["message"].is_string(), "{path}: {v}");
    }
    // Over the body limit, on every route that takes a body.
    let big = "x".repeat(4096);
    let big: &'static str = Box::leak(format!("{{\"text\": \"{big}\"}}").into_boxed_str());
    let sid = super::id(&api.session(None).await, "session_id");
    let messages = format!("/api/sessions/{sid}/messages");
    for path in ["/rpc", "/a2a", "/api/sessions", messages.as_str()] {
        let (status, v) = send(&api, reqwest::Method::POST, path, &json, big).await;
        assert_error(
            status,
            &v,
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        );
    }
    // The fallbacks.
    let (status, v) = api.get("/nope").await;
    assert_error(status, &v, StatusCode::NOT_FOUND, "not_found");
    let (status, v) = send(&api, reqwest::Method::DELETE, "/rpc", &[], "").await;
    assert_error(
        status,
        &v,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    let (status, v) = send(&api, reqwest::Method::GET, "/rpc", &[], "").await;
    assert_error(
        status,
        &v,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    // Unreadable JSON.
    let (status, v) = send(&api, reqwest::Method::POST, "/api/sessions", &json, "{").await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, "bad_request");
    server.stop().await;
}

#[tokio::test]
async fn a_new_session_is_an_object_with_a_real_project() {
    let server = Server::start().await;
    let api = server.api();
    let json = [("content-type", "application/json")];
    for (body, code) in [
        (r#"["p", "t"]"#, "bad_request"),
        ("\"p\"", "bad_request"),
        (r#"{"settings": "x"}"#, "invalid_input"),
        (r#"{"settings": [1]}"#, "invalid_input"),
        (r#"{"project_id": ""}"#, "invalid_input"),
    ] {
        let (status, v) = send(&api, reqwest::Method::POST, "/api/sessions", &json, body).await;
        assert_error(status, &v, StatusCode::BAD_REQUEST, code);
    }
    // JSON-RPC agrees.
    for params in [
        serde_json::json!(["p", "t"]),
        serde_json::json!({"settings": "x"}),
        serde_json::json!({"project_id": ""}),
    ] {
        let code = api.call_err("session.create", params.clone()).await;
        assert_eq!(code, troupe_service::error::INVALID_PARAMS, "{params}");
    }
    let (status, v) = send(
        &api,
        reqwest::Method::POST,
        "/api/sessions",
        &json,
        r#"{"project_id": "p", "settings": {"k": 1}}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    server.stop().await;
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let server = Server::start_with(with_tokens, Vec::new()).await;
    let api = server.api();
    // A project that exists, so that an accepted token reads 200.
    server.api_as("alpha-token").session(Some("alpha")).await;
    for header in ["Bearer ops-token", "bearer ops-token", "BEARER ops-token"] {
        let (status, v) = send(
            &api,
            reqwest::Method::GET,
            "/api/projects/alpha/sessions",
            &[("authorization", header)],
            "",
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{header}: {v}");
    }
    let (status, v) = send(
        &api,
        reqwest::Method::GET,
        "/api/projects/alpha/sessions",
        &[("authorization", "bearer OPS-TOKEN")],
        "",
    )
    .await;
    assert_error(status, &v, StatusCode::UNAUTHORIZED, "unauthorized");
    server.stop().await;
}

#[tokio::test]
async fn policies_take_both_spellings_and_are_written_one_way() {
    let server = Server::start().await;
    let api = server.api();
    let sid = super::id(&api.session(None).await, "session_id");
    for (storage, sandbox, written_storage, written_sandbox) in [
        (
            serde_json::json!("headers-only"),
            "full-access",
            serde_json::json!("headers_only"),
            "full_access",
        ),
        (
            serde_json::json!("ttl:60"),
            "read-only",
            serde_json::json!({"ttl": {"secs": 60}}),
            "read_only",
        ),
        (
            serde_json::json!({"ttl": {"secs": 5}}),
            "workspace_write",
            serde_json::json!({"ttl": {"secs": 5}}),
            "workspace_write",
        ),
    ] {
        let opened = api
            .call(
                "conversation.open",
                serde_json::json!({
                    "session_id": sid,
                    "storage_policy": storage,
                    "sandbox_policy": sandbox,
                }),
            )
            .await;
        let cid = opened["conversation_id"].clone();
        let list = api
            .call("conversation.list", serde_json::json!({"session_id": sid}))
            .await;
        let record = list
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["conversation_id"] == cid)
            .unwrap_or_else(|| panic!("{cid} in {list}"));
        assert_eq!(
            record["params"]["storage_policy"], written_storage,
            "{record}"
        );
        assert_eq!(
            record["params"]["sandbox_policy"], written_sandbox,
            "{record}"
        );
    }
    // REST takes them too, in a new session's root conversation.
    let (status, v) = api
        .post(
            "/api/sessions",
            serde_json::json!({"root": {"storage_policy": "ttl:30", "sandbox_policy": "read-only"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let code = api
        .call_err(
            "conversation.open",
            serde_json::json!({"session_id": sid, "storage_policy": "forever"}),
        )
        .await;
    assert_eq!(code, troupe_service::error::INVALID_PARAMS);
    server.stop().await;
}

/// `troupe serve` uses the configured limits: a half-sent head is cut off at the header
/// timeout (well before the idle timeout).
#[tokio::test]
async fn the_service_applies_its_configured_header_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start_with(
        |c| {
            c.server.header_timeout = std::time::Duration::from_millis(200);
            c.server.idle_timeout = std::time::Duration::from_secs(600);
        },
        Vec::new(),
    )
    .await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /rpc HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
        .await
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(30), s.read_to_end(&mut rest))
        .await
        .expect("closed by the header timeout, not the idle one")
        .unwrap();
    assert!(rest.is_empty());
    server.stop().await;
}

mod slow_clients {
    //! The connection limits, against a small router on a real socket, in paused time: the
    //! clock only moves when every task waits, so each close happens at its timeout exactly.

    use axum::Router;
    use axum::body::Bytes;
    use axum::extract::rejection::BytesRejection;
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;
    use troupe_service::listen::{ConnLimits, serve};

    const LIMITS: ConnLimits = ConnLimits {
        header_timeout: Duration::from_secs(2),
        body_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(20),
        max_connections: 2,
    };

    async fn start(limits: ConnLimits) -> (std::net::SocketAddr, CancellationToken) {
        let app = Router::new().route("/", get(|| async { "ok" })).route(
            "/echo",
            post(|b: Result<Bytes, BytesRejection>| async move {
                match troupe_service::extract::body(b, 1024) {
                    Ok(b) => b.into_response(),
                    Err(e) => e.into_response(),
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, app, limits, stop.clone()));
        (addr, stop)
    }

    /// Reads until the peer closes; what was read.
    async fn read_to_close(s: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Reads one response (headers and a body of `Content-Length`).
    async fn read_response(s: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = s.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before a response: {:?}",
                String::from_utf8_lossy(&out)
            );
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map_or(0, |l| l.trim().parse().unwrap());
                if body.len() >= len {
                    return text;
                }
            }
        }
    }

    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

    #[tokio::test(start_paused = true)]
    async fn half_a_header_is_cut_off_at_the_header_timeout() {
        let (addr, _stop) = start(LIMITS).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let t0 = Instant::now();
        s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0").await.unwrap();
        let answer = read_to_close(&mut s).await;
        assert_eq!(answer, "", "no answer, just the close");
        let waited = t0.elapsed();
        assert!(
            waited >= LIMITS.header_timeout && waited < LIMITS.idle_timeout,
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_keep_alive_connection_is_closed() {
        let (addr, _stop) = start(LIMITS).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(GET).await.unwrap();
        assert!(read_response(&mut s).await.ends_with("ok"));
        let t0 = Instant::now();
        // A second request well within the idle timeout is served on the same connection.
        tokio::time::sleep(LIMITS.idle_timeout / 2).await;
        s.write_all(GET).await.unwrap();
        assert!(read_response(&mut s).await.ends_with("ok"));
        let t1 = Instant::now();
        assert_eq!(read_to_close(&mut s).await, "");
        assert!(t1 - t0 >= LIMITS.idle_timeout / 2);
        assert!(t1.elapsed() >= LIMITS.idle_timeout, "{:?}", t1.elapsed());
        // A connection that never sends a byte goes the same way.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let t2 = Instant::now();
        assert_eq!(read_to_close(&mut silent).await, "");
        assert!(t2.elapsed() >= LIMITS.idle_timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_body_is_answered_408() {
        let (addr, _stop) = start(LIMITS).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\nabc")
            .await
            .unwrap();
        let t0 = Instant::now();
        let answer = read_response(&mut s).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");
        assert!(t0.elapsed() >= LIMITS.body_timeout);
        // A whole body in time is read.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\n\r\nabc")
            .await
            .unwrap();
        assert!(read_response(&mut s).await.ends_with("abc"));
    }

    #[tokio::test(start_paused = true)]
    async fn connections_beyond_the_cap_wait_for_a_free_slot() {
        let (addr, _stop) = start(LIMITS).await;
        let mut held = Vec::new();
        for _ in 0..LIMITS.max_connections {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(GET).await.unwrap();
            assert!(read_response(&mut s).await.ends_with("ok"));
            held.push(s);
        }
        // The kernel completes the handshake (backlog), but the service does not take it.
        let mut waiting = TcpStream::connect(addr).await.unwrap();
        waiting.write_all(GET).await.unwrap();
        let early =
            tokio::time::timeout(LIMITS.idle_timeout / 2, read_response(&mut waiting)).await;
        assert!(early.is_err(), "answered beyond the cap: {early:?}");
        drop(held.pop());
        assert!(read_response(&mut waiting).await.ends_with("ok"));
    }

    #[tokio::test(start_paused = true)]
    async fn streams_and_websockets_outlive_the_timeouts() {
        use axum::extract::ws::{Message, WebSocketUpgrade};
        use futures::{SinkExt, StreamExt};
        let app = Router::new()
            .route(
                "/slow",
                get(|| async {
                    // Six chunks, five seconds apart: longer than every timeout.
                    let chunks = futures::stream::unfold(0u8, |n| async move {
                        if n == 6 {
                            return None;
                        }
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        Some((
                            Ok::<_, std::convert::Infallible>(Bytes::from(vec![b'a' + n])),
                            n + 1,
                        ))
                    });
                    axum::body::Body::from_stream(chunks)
                }),
            )
            .route(
                "/ws",
                get(|ws: WebSocketUpgrade| async move {
                    ws.on_upgrade(|mut socket| async move {
                        while let Some(Ok(Message::Text(t))) = socket.recv().await {
                            if socket.send(Message::Text(t)).await.is_err() {
                                break;
                            }
                        }
                    })
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, app, LIMITS, stop.clone()));

        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let t0 = Instant::now();
        let answer = read_to_close(&mut s).await;
        assert!(t0.elapsed() >= LIMITS.idle_timeout, "{:?}", t0.elapsed());
        let body: String = answer
            .split("\r\n\r\n")
            .nth(1)
            .unwrap()
            .lines()
            .filter(|l| l.len() == 1 && l.as_bytes()[0].is_ascii_lowercase())
            .collect();
        assert_eq!(body, "abcdef", "{answer}");

        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
            .await
            .unwrap();
        for round in 0..3 {
            tokio::time::sleep(LIMITS.idle_timeout + LIMITS.header_timeout).await;
            let text = format!("still here {round}");
            ws.send(tokio_tungstenite::tungstenite::Message::text(text.clone()))
                .await
                .unwrap();
            let echo = ws.next().await.unwrap().unwrap();
            assert_eq!(echo.into_text().unwrap().as_str(), text);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_closes_idle_connections_and_returns() {
        let app = Router::new().route("/", get(|| async { "ok" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let served = tokio::spawn(serve(listener, app, LIMITS, stop.clone()));
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(GET).await.unwrap();
        assert!(read_response(&mut s).await.ends_with("ok"));
        let t0 = Instant::now();
        stop.cancel();
        served.await.unwrap();
        assert_eq!(read_to_close(&mut s).await, "");
        assert!(t0.elapsed() < LIMITS.header_timeout, "not by a timeout");
    }
}
