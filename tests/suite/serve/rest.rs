//! Every REST route (P2), its errors, body limits, and health.

use super::{Server, id};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert!(body["message"].is_string(), "{body}");
    assert!(body.get("details").is_some(), "{body}");
}

#[tokio::test]
async fn routes() {
    let server = Server::start().await;
    let api = server.api();
    let (status, s) = api
        .post(
            "/api/sessions",
            json!({"project_id": "p", "title": "t", "settings": {"k": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let sid = id(&s, "session_id");
    assert_eq!(s["settings"], json!({"k": 1}));
    let (status, got) = api.get(&format!("/api/sessions/{sid}")).await;
    assert_eq!((status, &got), (StatusCode::OK, &s));
    assert_eq!(s["status"], "active", "a new session is active");
    // Storing the root conversation while the session is created may move `updated_ms` a
    // millisecond past `created_ms`; it never lies before it.
    assert!(s["updated_ms"].as_u64() >= s["created_ms"].as_u64(), "{s}");

    let sent = api.say(&sid, "one").await;
    assert_eq!(sent["reply"]["text"], "You said: one");
    let (status, accepted) = api
        .post(
            &format!("/api/sessions/{sid}/messages"),
            json!({"text": "two", "wait": false}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(accepted["message"]["content"], "two");
    assert!(accepted.get("reply").is_none());

    // The reply of an accepted message lands in the store when its task ends.
    let all = loop {
        let (_, page) = api.get(&format!("/api/sessions/{sid}/messages")).await;
        if page["messages"].as_array().unwrap().len() == 4 {
            break page;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let texts: Vec<&str> = all["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["one", "You said: one", "two", "You said: two"]);
    let (_, page) = api
        .get(&format!("/api/sessions/{sid}/messages?limit=3"))
        .await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 3);
    let before = page["next_before"].as_u64().unwrap();
    let (_, older) = api
        .get(&format!(
            "/api/sessions/{sid}/messages?limit=3&before={before}"
        ))
        .await;
    assert_eq!(older["messages"][0]["content"], "one");
    assert_eq!(older["next_before"], Value::Null);

    // Its messages moved it on, and its last one completed.
    let (_, s) = api.get(&format!("/api/sessions/{sid}")).await;
    assert_eq!(s["status"], "completed");
    assert!(s["updated_ms"].as_u64() >= all["messages"][3]["created_ms"].as_u64());
    let s2 = api.session(Some("p")).await;
    let (status, listed) = api.get("/api/projects/p/sessions").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed, json!([s2, s]), "newest first");
    // A project exists once a session was created in it: before, it is not found.
    for path in [
        "/api/projects/empty/sessions",
        "/api/projects/empty/current-session",
    ] {
        let (status, body) = api.get(path).await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
        assert!(
            body["message"].as_str().unwrap().contains("project"),
            "{body}"
        );
    }
    assert_eq!(
        api.call_err("session.list", json!({"project_id": "empty"}))
            .await,
        troupe_service::error::NOT_FOUND,
        "and its RPC twin"
    );

    let (status, body) = api.get("/api/projects/p/current-session").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    let (status, cur) = api
        .put(
            "/api/projects/p/current-session",
            json!({"session_id": sid}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(cur["session"], s);
    let (_, cur) = api.get("/api/projects/p/current-session").await;
    assert_eq!(cur, json!({"project_id": "p", "session": s}));
    server.stop().await;
}

#[tokio::test]
async fn errors_have_a_status_and_a_body() {
    let server = Server::start_with(|c| c.server.body_limit = 1024, Vec::new()).await;
    let api = server.api();
    let unknown = troupe_proto::SessionId::new();
    for path in [
        format!("/api/sessions/{unknown}"),
        format!("/api/sessions/{unknown}/messages"),
        format!("/api/sessions/{unknown}/events"),
        "/api/sessions/not-an-id".to_owned(),
        "/api/sessions/not-an-id/messages".to_owned(),
        "/no/such/route".to_owned(),
    ] {
        let (status, body) = api.get(&path).await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    }
    let (status, body) = api
        .post(
            &format!("/api/sessions/{unknown}/messages"),
            json!({"text": "x"}),
        )
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    let (status, body) = api
        .put(
            "/api/projects/p/current-session",
            json!({"session_id": unknown}),
        )
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    // A session of another project cannot be the current one.
    let other = api.session(Some("q")).await;
    let (status, body) = api
        .put(
            "/api/projects/p/current-session",
            json!({"session_id": other["session_id"]}),
        )
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    let sid = id(&api.session(None).await, "session_id");
    for (body, why) in [
        (b"{".to_vec(), "malformed JSON"),
        (b"{\"text\": 5}".to_vec(), "a wrong type"),
        (b"{\"txt\": \"x\"}".to_vec(), "an unknown field"),
        (b"[1, 2]".to_vec(), "not an object"),
    ] {
        let (status, v) = api
            .post_raw(&format!("/api/sessions/{sid}/messages"), body)
            .await;
        assert_error(status, &v, StatusCode::BAD_REQUEST, "bad_request");
        let _ = why;
    }
    // Fields that a session's root or a conversation's context does not take are refused
    // too: a misspelt storage policy must not leave the conversation keeping content.
    let (status, v) = api
        .post_raw(
            "/api/sessions",
            br#"{"root": {"storage_polcy": "none"}}"#.to_vec(),
        )
        .await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, "bad_request");
    assert!(
        v["message"].as_str().unwrap().contains("storage_polcy"),
        "{v}"
    );
    let session = api.session(None).await;
    let (owner, root) = (
        id(&session, "session_id"),
        id(&session, "root_conversation_id"),
    );
    let (status, v) = api
        .put(
            &format!("/api/sessions/{owner}/conversations/{root}/context"),
            json!({"modle": "gpt-4.1"}),
        )
        .await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, "bad_request");
    assert!(v["message"].as_str().unwrap().contains("modle"), "{v}");
    let (status, v) = api
        .get(&format!("/api/sessions/{sid}/messages?limit=zero"))
        .await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, "bad_request");
    let (status, v) = api
        .get(&format!("/api/sessions/{sid}/messages?limit=0"))
        .await;
    assert_error(status, &v, StatusCode::BAD_REQUEST, "invalid_input");

    let big = json!({"text": "x".repeat(4096)});
    let (status, v) = api
        .post(&format!("/api/sessions/{sid}/messages"), big.clone())
        .await;
    assert_error(
        status,
        &v,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    );
    let (status, v) = api.post("/rpc", big).await;
    assert_error(
        status,
        &v,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    );

    let (status, v) = Api::answer_of(api.request(Method::DELETE, "/api/sessions")).await;
    assert_error(
        status,
        &v,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    server.stop().await;
}

#[tokio::test]
async fn health() {
    let server = Server::start().await;
    let api = server.api();
    let (status, v) = api.get("/healthz").await;
    assert_eq!((status, v["status"].clone()), (StatusCode::OK, json!("ok")));
    let (status, v) = api.get("/readyz").await;
    assert_eq!(
        (status, v["status"].clone()),
        (StatusCode::OK, json!("ready"))
    );
    server.service.shutdown_token().cancel();
    // Shutting down: no longer ready (the listener may already be closed).
    if let Ok(r) = api.http.get(format!("{}/readyz", api.base)).send().await {
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    server.stop().await;
}

use super::Api;

impl Api {
    async fn answer_of(r: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let response = r.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

/// A page is bounded by bytes as well as by count: `limit=1000` over messages of ~1 MB comes
/// back with at most `MAX_PAGE_BYTES` of content (4 messages of 1 MB), and following
/// `next_before` over REST and JSON-RPC returns every message exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_large_messages_stops_at_the_byte_budget() {
    use troupe_proto::store::MAX_PAGE_BYTES;
    let server = Server::start().await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    let texts: Vec<String> = (0..5u8)
        .map(|i| char::from(b'a' + i).to_string().repeat(1_000_000))
        .collect();
    for text in &texts {
        api.say(&sid, text).await;
    }
    // Every user message and its echoed reply: 10 messages of ~1 MB.
    let mut want: Vec<String> = Vec::new();
    for text in &texts {
        want.push(text.clone());
        want.push(format!("You said: {text}"));
    }

    let mut rest_seen: Vec<(u64, String)> = Vec::new();
    let mut sizes = Vec::new();
    let mut before: Option<u64> = None;
    loop {
        let path = match before {
            Some(b) => format!("/api/sessions/{sid}/messages?limit=1000&before={b}"),
            None => format!("/api/sessions/{sid}/messages?limit=1000"),
        };
        let response = api.request(Method::GET, &path).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.bytes().await.unwrap();
        assert!(
            body.len() < MAX_PAGE_BYTES + 64 * 1024,
            "a page of {} bytes",
            body.len()
        );
        let page: Value = serde_json::from_slice(&body).unwrap();
        let messages = page["messages"].as_array().unwrap();
        sizes.push(messages.len());
        let mut this: Vec<(u64, String)> = messages
            .iter()
            .map(|m| {
                (
                    m["message_id"].as_u64().unwrap(),
                    m["content"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        this.extend(rest_seen);
        rest_seen = this;
        match page["next_before"].as_u64() {
            Some(b) => before = Some(b),
            None => break,
        }
    }
    assert_eq!(sizes, [4, 4, 2], "pages of at most 4 MiB, newest first");
    let contents: Vec<&String> = rest_seen.iter().map(|(_, c)| c).collect();
    assert_eq!(contents, want.iter().collect::<Vec<_>>());
    assert!(rest_seen.windows(2).all(|w| w[0].0 < w[1].0));

    // `messages.list` pages the same way.
    let mut rpc_ids: Vec<u64> = Vec::new();
    let mut before = Value::Null;
    loop {
        let page = api
            .call(
                "messages.list",
                json!({"session_id": sid, "limit": 1000, "before": before}),
            )
            .await;
        let messages = page["messages"].as_array().unwrap();
        let bytes: usize = messages
            .iter()
            .map(|m| m["content"].as_str().unwrap().len())
            .sum();
        assert!(bytes <= MAX_PAGE_BYTES, "{bytes}");
        let mut this: Vec<u64> = messages
            .iter()
            .map(|m| m["message_id"].as_u64().unwrap())
            .collect();
        this.extend(rpc_ids);
        rpc_ids = this;
        if page["next_before"].is_null() {
            break;
        }
        before = page["next_before"].clone();
    }
    let rest_ids: Vec<u64> = rest_seen.iter().map(|(id, _)| *id).collect();
    assert_eq!(rpc_ids, rest_ids);
    server.stop().await;
}
