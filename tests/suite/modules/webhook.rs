//! HTTP output modules: a webhook server in the test receives the replies to what a stdio
//! input gateway fed: a sync one acknowledges with 2xx (one too slow times out), an async
//! one answering 500 is tried again.

use super::*;
use axum::Json;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use std::sync::{Arc, Mutex};

/// What the webhook received, by route, in order.
#[derive(Clone, Default)]
pub struct Received(Arc<Mutex<Vec<(String, Value)>>>);

impl Received {
    pub fn on(&self, route: &str) -> Vec<Value> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| r == route)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// A webhook receiver on 127.0.0.1: `/ok` answers 200, `/slow` after 2 s (noting
/// `slow:answered` then), `/flaky` 500 to its first post and 200 after, `/answer` 200 with
/// `{"answer": 42}`. Its base URL.
pub async fn webhook() -> (String, Received) {
    let received = Received::default();
    async fn hook(
        State(received): State<Received>,
        UrlPath(route): UrlPath<String>,
        Json(body): Json<Value>,
    ) -> (StatusCode, Json<Value>) {
        let seen = {
            let mut all = received.0.lock().unwrap();
            all.push((route.clone(), body));
            all.iter().filter(|(r, _)| *r == route).count()
        };
        match route.as_str() {
            "slow" => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                received
                    .0
                    .lock()
                    .unwrap()
                    .push(("slow:answered".into(), Value::Null));
                (StatusCode::OK, Json(json!({})))
            }
            "flaky" if seen == 1 => (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"error": "down"})),
            ),
            "answer" => (StatusCode::OK, Json(json!({"answer": 42}))),
            _ => (StatusCode::OK, Json(json!({}))),
        }
    }
    let app = axum::Router::new()
        .route("/{route}", axum::routing::post(hook))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, received)
}

pub fn http_module(id: &str, mode: &str, url: String, extra: Value) -> Value {
    let mut m = json!({
        "id": id,
        "description": format!("the webhook {id}"),
        "direction": "output",
        "mode": mode,
        "protocol": "http",
        "url": url,
    });
    for (k, v) in extra.as_object().unwrap() {
        m[k] = v.clone();
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_receive_the_replies_sync_with_a_timeout_and_async_with_retries() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (hooks, posted) = webhook().await;
    // An input-only gateway: its replies go to the outputs that list it.
    module(
        d,
        "watcher",
        gateway_module(
            d,
            "watcher",
            "input",
            "sync",
            json!({"GATEWAY_FEED": "[\"a file changed\"]"}),
        ),
    );
    module(
        d,
        "ok",
        http_module(
            "ok",
            "sync",
            format!("{hooks}/ok"),
            json!({"sources": ["watcher"]}),
        ),
    );
    module(
        d,
        "slow",
        http_module(
            "slow",
            "sync",
            format!("{hooks}/slow"),
            json!({"sources": ["*"], "timeout": "300ms"}),
        ),
    );
    module(
        d,
        "flaky",
        http_module(
            "flaky",
            "async",
            format!("{hooks}/flaky"),
            json!({"sources": ["*"], "retries": 3, "restart": {"backoff_min": "50ms", "backoff_max": "100ms"}}),
        ),
    );
    // Waits for its slow answer (2 s, within its timeout), and sorts before `ok`: were the
    // recipients served one after the other, `ok` would be posted after that answer.
    module(
        d,
        "late",
        http_module(
            "late",
            "sync",
            format!("{hooks}/slow"),
            json!({"sources": ["*"], "timeout": "10s"}),
        ),
    );
    // Lists no source: it receives no reply.
    module(
        d,
        "quiet",
        http_module("quiet", "sync", format!("{hooks}/quiet"), json!({})),
    );
    let serving = serve(d, "", json!([{"text": "noted"}]));
    let base = &serving.base;
    metric_reaches(
        base,
        r#"troupe_module_deliveries_total{module="ok",direction="output",outcome="delivered"}"#,
        1.0,
    )
    .await;
    let ok = posted.on("ok");
    assert_eq!(ok.len(), 1, "{ok:?}");
    // All at once: `ok` did not wait for the slow answer of `late`, sorted before it.
    let order: Vec<String> = posted
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(r, _)| r.clone())
        .collect();
    let at = |route: &str| order.iter().position(|r| r == route);
    assert!(
        at("slow:answered").is_none_or(|answered| at("ok").unwrap() < answered),
        "{order:?}"
    );
    assert_eq!(ok[0]["type"], "reply");
    assert_eq!(ok[0]["text"], "noted");
    assert_eq!(ok[0]["source"], "watcher");
    assert!(ok[0]["in_reply_to"].as_str().unwrap().starts_with("m-"));
    metric_reaches(
        base,
        r#"troupe_module_deliveries_total{module="slow",direction="output",outcome="timeout"}"#,
        1.0,
    )
    .await;
    metric_reaches(
        base,
        r#"troupe_module_deliveries_total{module="flaky",direction="output",outcome="delivered"}"#,
        1.0,
    )
    .await;
    assert_eq!(
        metric(
            base,
            r#"troupe_module_deliveries_total{module="flaky",direction="output",outcome="retried"}"#
        )
        .await,
        Some(1.0)
    );
    let flaky = posted.on("flaky");
    assert_eq!(flaky.len(), 2, "one 500, then the same reply again");
    assert_eq!(flaky[0], flaky[1]);
    assert!(posted.on("quiet").is_empty());
    // The input-only gateway got troupe's acknowledgement, and no reply.
    let frames = received(d, "watcher");
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0]["type"], "ack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_scoped_to_a_project_lists_only_that_projects_modules() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for id in ["alpha", "beta"] {
        module(
            d,
            id,
            json!({"id": id, "direction": "output", "protocol": "http", "url": "http://127.0.0.1:9/hook"}),
        );
    }
    module(
        d,
        "broken",
        json!({"id": "broken", "direction": "sideways"}),
    );
    let tokens = r#"
[[server.tokens]]
token = "all-token"
projects = ["*"]

[[server.tokens]]
token = "alpha-token"
projects = ["alpha"]
"#;
    let serving = serve(d, tokens, json!([]));
    let ids = |listing: &Value| -> Vec<String> {
        listing["modules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let all = Api::new(&serving.base, Some("all-token"));
    let (status, listing) = all.get("/api/modules").await;
    assert_eq!(status, reqwest::StatusCode::OK, "{listing}");
    assert_eq!(ids(&listing), ["alpha", "beta"]);
    assert_eq!(listing["errors"].as_array().unwrap().len(), 1, "{listing}");
    let alpha = Api::new(&serving.base, Some("alpha-token"));
    let (status, listing) = alpha.get("/api/modules").await;
    assert_eq!(status, reqwest::StatusCode::OK, "{listing}");
    assert_eq!(ids(&listing), ["alpha"]);
    assert_eq!(
        listing["errors"],
        json!([]),
        "the host's paths are not shown"
    );
    let rpc = alpha.call("modules.list", json!({})).await;
    assert_eq!(ids(&rpc), ["alpha"], "{rpc}");
}
