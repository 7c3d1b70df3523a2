//! The console through any node: a browser signed in to node B (its cookie named for B's
//! port) reads and writes a session that node A owns; B forwards the calls with that cookie
//! and A takes it, since the same tokens signed it.

use super::Node;
use super::http;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const TOKEN: &str = "cluster-console-token";

fn node(dir: &Path, url: &str, name: &str) -> (Node, String) {
    let mut command = super::node_command(dir, url, name, 0, super::LEASE_TTL);
    command
        .env("TROUPE_API_TOKENS", format!("{TOKEN}=*"))
        .stderr(std::process::Stdio::null());
    super::spawn_node(&mut command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_signed_in_to_one_node_uses_a_session_another_node_owns() {
    let url = troupe_test_postgres::server().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let (mut a, base_a) = node(dir.path(), &url, "a");
    let (mut b, base_b) = node(dir.path(), &url, "b");

    // A session on A (asked of A with the token, answered there).
    let created = http()
        .post(format!("{base_a}/api/sessions"))
        .bearer_auth(TOKEN)
        .header("x-troupe-forwarded-by", "test")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let session: Value = created.json().await.unwrap();
    let session = session["session_id"].as_str().unwrap().to_owned();

    // Signed in to B's console: the cookie is named for B's port.
    let signed = http()
        .post(format!("{base_b}/console/sign-in"))
        .json(&json!({"token": TOKEN}))
        .send()
        .await
        .unwrap();
    assert!(signed.status().is_success(), "{:?}", signed.status());
    let set_cookie = signed
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let port_b = base_b.rsplit(':').next().unwrap().trim_end_matches('/');
    let pair = set_cookie.split(';').next().unwrap().to_owned();
    assert!(
        pair.starts_with(&format!("troupe_console_{port_b}=")),
        "{set_cookie}"
    );

    // Read through B with the cookie alone: forwarded to A, which takes B's cookie.
    let read = http()
        .get(format!("{base_b}/api/sessions/{session}/messages"))
        .header(reqwest::header::COOKIE, &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(
        read.status(),
        StatusCode::OK,
        "{}",
        read.text().await.unwrap()
    );

    // A message sent from B's console pages (cookie + Origin) runs on A.
    let sent = http()
        .post(format!("{base_b}/api/sessions/{session}/messages"))
        .header(reqwest::header::COOKIE, &pair)
        .header(reqwest::header::ORIGIN, base_b.trim_end_matches('/'))
        .json(&json!({"text": "hello from b's console", "wait": true}))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap();
    let status = sent.status();
    let body: Value = sent.json().await.unwrap_or(Value::Null);
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body.to_string().contains("a reply"),
        "answered by A: {body}"
    );

    // The console's event stream over a WebSocket through B, signed in by the cookie: relayed
    // from A with A's events.
    let ws = format!(
        "{}/api/sessions/{session}/events/ws?after=0",
        base_b.trim_end_matches('/').replace("http://", "ws://")
    );
    let mut request =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(ws.as_str())
            .unwrap();
    request
        .headers_mut()
        .insert("cookie", pair.parse().unwrap());
    request
        .headers_mut()
        .insert("origin", base_b.trim_end_matches('/').parse().unwrap());
    let (mut stream, _) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::connect_async(request),
    )
    .await
    .unwrap()
    .unwrap();
    let read = async {
        use futures::StreamExt;
        while let Some(Ok(frame)) = stream.next().await {
            if let tokio_tungstenite::tungstenite::Message::Text(t) = frame
                && t.as_str().contains("a reply")
            {
                return;
            }
        }
        panic!("the stream ended before A's reply");
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("A's reply through B's WebSocket");

    // The head of A's session, read through B (forwarded, with the cookie) as from A.
    let head = |base: &str, forwarded: bool| {
        let mut r = http().get(format!("{base}/api/sessions/{session}/events/head"));
        r = if forwarded {
            r.header(reqwest::header::COOKIE, &pair)
        } else {
            r.bearer_auth(TOKEN).header("x-troupe-forwarded-by", "test")
        };
        async move {
            let v: Value = r.send().await.unwrap().json().await.unwrap();
            v["last_seq"].as_u64().unwrap_or_else(|| panic!("{v}"))
        }
    };
    let head_a = head(&base_a, false).await;
    assert!(head_a > 0, "A's session has events");
    assert_eq!(head(&base_b, true).await, head_a);

    // B's console page for A's session: B does not run it, so the page reads its head from
    // A before the messages, and goes live from there (not from the first event, which would
    // take every replayed event for a live one).
    let page = http()
        .get(format!("{base_b}/sessions/{session}"))
        .header(reqwest::header::COOKIE, &pair)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(r#""last_seq":null"#), "{page}");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cluster-console");
    let browser = crate::suite::console::driver::Browser::start(&out).await;
    browser.goto(&format!("{base_b}/")).await;
    browser.type_into("#token", TOKEN).await;
    browser.keys(crate::suite::console::driver::ENTER).await;
    browser
        .wait_for(
            "B's session list",
            "return document.body.dataset.page === 'sessions'",
            Duration::from_secs(20),
        )
        .await;
    browser.goto(&format!("{base_b}/sessions/{session}")).await;
    let live = browser
        .wait_for(
            "the page live from A's head",
            "const S = window.troupeConsole; \
             return S && document.querySelector('#conn').dataset.state === 'live' \
               && S.lastSeq >= S.liveFrom && S.liveFrom > 0 && S.liveFrom",
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(live, json!(head_a), "the page went live at A's head");
    browser.screenshot("b-serves-a-session").await;
    browser.quit().await;

    // Without the cookie, B's forwarded call is still refused.
    let refused = http()
        .get(format!("{base_b}/api/sessions/{session}/messages"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);

    super::kill9(&mut a);
    super::kill9(&mut b);
}
