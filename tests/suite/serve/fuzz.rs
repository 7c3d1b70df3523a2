//! Arbitrary bytes and arbitrary JSON into `/rpc`, the REST bodies, query strings and path
//! segments, and `/rpc/ws` frames: always a well-formed answer (a JSON-RPC error, or an HTTP
//! error with its body), never a panic or an undocumented 5xx, and a WebSocket that goes on
//! answering. Bounded: a few hundred cases each. (The A2A decoder, the JSON-RPC envelope and
//! the edge checks have their own property tests beside them.)

use super::{Server, id};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use troupe_proto::SessionId;

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|n| json!(n)),
        "\\PC{0,12}".prop_map(Value::String),
        Just(json!("2.0")),
        Just(json!(SessionId::new())),
        proptest::sample::select(troupe_service::rpc::METHODS.to_vec()).prop_map(|m| json!(m)),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("jsonrpc".to_owned()),
                    Just("id".to_owned()),
                    Just("method".to_owned()),
                    Just("params".to_owned()),
                    Just("session_id".to_owned()),
                    Just("text".to_owned()),
                    Just("project_id".to_owned()),
                    Just("wait".to_owned()),
                    "[a-z_]{1,8}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// What a fuzzed request may answer.
fn well_formed(status: reqwest::StatusCode, body: &str, rpc: bool) -> Result<(), TestCaseError> {
    prop_assert!(
        !status.is_server_error() || status == reqwest::StatusCode::SERVICE_UNAVAILABLE,
        "undocumented {} {}",
        status,
        body
    );
    if status == reqwest::StatusCode::NO_CONTENT {
        prop_assert!(body.is_empty());
        return Ok(());
    }
    let v: Value = serde_json::from_str(body)
        .map_err(|e| TestCaseError::fail(format!("not JSON ({e}): {status} {body}")))?;
    if status.is_client_error() || status.is_server_error() {
        prop_assert!(v["code"].is_string() && v["message"].is_string(), "{}", v);
    } else if rpc {
        let answers = match &v {
            Value::Array(a) => a.clone(),
            other => vec![other.clone()],
        };
        for a in answers {
            prop_assert_eq!(&a["jsonrpc"], "2.0");
            prop_assert!(
                a.get("result").is_some() != a.get("error").is_some(),
                "{}",
                a
            );
            if let Some(e) = a.get("error") {
                prop_assert!(e["code"].is_i64() && e["message"].is_string(), "{}", a);
            }
        }
    }
    Ok(())
}

#[test]
fn arbitrary_input_gets_a_well_formed_answer() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(Server::start_with(
        |c| c.server.body_limit = 4096,
        Vec::new(),
    ));
    let api = server.api();
    let sid = id(&rt.block_on(api.session(Some("p"))), "session_id");
    let post = |path: String, body: Vec<u8>| {
        let api = api.clone();
        async move {
            let r = api
                .request(reqwest::Method::POST, &path)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = r.status();
            (status, r.text().await.unwrap())
        }
    };
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..512), |bytes| {
            rt.block_on(async {
                let (status, body) = post("/rpc".into(), bytes.clone()).await;
                well_formed(status, &body, true)?;
                let (status, body) = post("/api/sessions".into(), bytes).await;
                well_formed(status, &body, false)
            })
        })
        .unwrap();
    runner
        .run(&(arb_json(), 0usize..4), |(value, target)| {
            let bytes = serde_json::to_vec(&value).unwrap();
            rt.block_on(async {
                let (path, rpc) = match target {
                    0 => ("/rpc".to_owned(), true),
                    1 => ("/api/sessions".to_owned(), false),
                    2 => (format!("/api/sessions/{sid}/messages"), false),
                    _ => ("/rpc".to_owned(), true),
                };
                let (status, body) = post(path, bytes.clone()).await;
                well_formed(status, &body, rpc)?;
                let r = api
                    .request(reqwest::Method::PUT, "/api/projects/p/current-session")
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(bytes)
                    .send()
                    .await
                    .unwrap();
                let status = r.status();
                well_formed(status, &r.text().await.unwrap(), false)
            })
        })
        .unwrap();
    // Query strings and path segments, percent-encoding broken or not.
    runner
        .run(
            &("[a-zA-Z0-9=&%._~+-]{0,40}", 0usize..3),
            |(text, target)| {
                let path = match target {
                    0 => format!("/api/sessions/{text}"),
                    1 => format!("/api/sessions/{sid}/messages?{text}"),
                    _ => format!("/api/sessions/{sid}/messages/{text}"),
                };
                rt.block_on(async {
                    let r = api
                        .request(reqwest::Method::GET, &path)
                        .send()
                        .await
                        .unwrap();
                    let status = r.status();
                    well_formed(status, &r.text().await.unwrap(), false)
                })
            },
        )
        .unwrap();
    // WebSocket frames: each is answered well-formed (or not at all, for notifications),
    // and the connection goes on answering.
    rt.block_on(async {
        use futures::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        let url = format!("{}/rpc/ws", server.base.replace("http://", "ws://"));
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let mut cases = TestRunner::new(Config {
            cases: 200,
            failure_persistence: None,
            ..Config::default()
        });
        let frames = (
            proptest::collection::vec(any::<u8>(), 0..512),
            arb_json(),
            any::<bool>(),
        );
        for _ in 0..200 {
            let (bytes, value, raw) =
                proptest::strategy::ValueTree::current(&frames.new_tree(&mut cases).unwrap());
            let frame = if raw {
                Message::binary(bytes)
            } else {
                Message::text(value.to_string())
            };
            ws.send(frame).await.unwrap();
            let sentinel = json!({"jsonrpc": "2.0", "id": "sentinel", "method": "session.list"});
            ws.send(Message::text(sentinel.to_string())).await.unwrap();
            loop {
                let next = tokio::time::timeout(std::time::Duration::from_secs(10), ws.next())
                    .await
                    .expect("an answer")
                    .expect("the connection stays open")
                    .unwrap();
                let answer: Value = serde_json::from_str(next.to_text().unwrap()).unwrap();
                let answers = match &answer {
                    Value::Array(a) => a.clone(),
                    other => vec![other.clone()],
                };
                for a in answers.iter().filter(|a| a.get("method").is_none()) {
                    assert_eq!(a["jsonrpc"], "2.0", "{a}");
                    assert!(a.get("result").is_some() != a.get("error").is_some(), "{a}");
                }
                if answer["id"] == "sentinel" {
                    break;
                }
            }
        }
    });
    rt.block_on(server.stop());
}
