//! The six P6 properties, each over >= 100 generated cases against the running service over
//! HTTP: message round trip, unique session ids, current-session switch, current-session
//! load, pagination (min(N, M) and the cursor), and resume without loss or duplicates.

use super::{Api, Server, completes, id, seqs};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A multi-threaded runtime with a service on it; cases run with `block_on`.
fn harness() -> (tokio::runtime::Runtime, Server) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(Server::start());
    (rt, server)
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: 100,
        failure_persistence: None,
        ..Config::default()
    })
}

fn finish(rt: tokio::runtime::Runtime, server: Server) {
    rt.block_on(server.stop());
}

async fn page(api: &Api, sid: &str, limit: usize, before: Option<u64>) -> Value {
    let path = match before {
        Some(b) => format!("/api/sessions/{sid}/messages?limit={limit}&before={b}"),
        None => format!("/api/sessions/{sid}/messages?limit={limit}"),
    };
    let (status, v) = api.get(&path).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

#[test]
fn p6_message_round_trip() {
    let (rt, server) = harness();
    let api = server.api();
    let sid = id(&rt.block_on(api.session(None)), "session_id");
    runner()
        .run(&"\\PC{1,64}", |text| {
            rt.block_on(async {
                let sent = api.say(&sid, &text).await;
                let want_reply = format!("You said: {text}");
                prop_assert_eq!(sent["reply"]["text"].as_str(), Some(want_reply.as_str()));
                let last = page(&api, &sid, 2, None).await;
                let m = last["messages"].as_array().unwrap();
                prop_assert_eq!(m[0]["content"].as_str(), Some(text.as_str()));
                prop_assert_eq!(&m[0]["role"], "user");
                prop_assert_eq!(m[0]["chars"].as_u64(), Some(text.chars().count() as u64));
                prop_assert_eq!(m[1]["content"].as_str(), Some(want_reply.as_str()));
                prop_assert_eq!(&m[1]["role"], "assistant");
                prop_assert_eq!(&m[0], &sent["message"]);
                prop_assert_eq!(&m[1], &sent["assistant"]);
                Ok(())
            })
        })
        .unwrap();
    finish(rt, server);
}

#[test]
fn p6_unique_session_ids() {
    let (rt, server) = harness();
    let api = server.api();
    let seen = std::cell::RefCell::new(std::collections::HashSet::new());
    runner()
        .run(&(1usize..6), |n| {
            rt.block_on(async {
                let created = futures::future::join_all((0..n).map(|_| api.session(None))).await;
                for s in created {
                    let sid = id(&s, "session_id");
                    prop_assert!(seen.borrow_mut().insert(sid.clone()), "{} twice", sid);
                    let (_, got) = api.get(&format!("/api/sessions/{sid}")).await;
                    prop_assert_eq!(got, s);
                }
                Ok(())
            })
        })
        .unwrap();
    finish(rt, server);
}

#[test]
fn p6_current_session_switch() {
    let (rt, server) = harness();
    let api = server.api();
    runner()
        .run(
            &(1usize..5, proptest::collection::vec(0usize..5, 1..8)),
            |(n, switches)| {
                let project = format!("switch-{}", troupe_proto::SessionId::new());
                rt.block_on(async {
                    let sessions =
                        futures::future::join_all((0..n).map(|_| api.session(Some(&project))))
                            .await;
                    for i in switches {
                        let s = &sessions[i % n];
                        let (status, _) = api
                            .put(
                                &format!("/api/projects/{project}/current-session"),
                                json!({"session_id": s["session_id"]}),
                            )
                            .await;
                        prop_assert_eq!(status, StatusCode::OK);
                        let (_, cur) = api
                            .get(&format!("/api/projects/{project}/current-session"))
                            .await;
                        prop_assert_eq!(&cur["session"], s);
                    }
                    Ok(())
                })
            },
        )
        .unwrap();
    finish(rt, server);
}

#[test]
fn p6_current_session_load() {
    let (rt, server) = harness();
    let api = server.api();
    runner()
        .run(&proptest::collection::vec("[a-z ]{1,16}", 0..4), |texts| {
            let project = format!("load-{}", troupe_proto::SessionId::new());
            rt.block_on(async {
                let s = api.session(Some(&project)).await;
                let sid = id(&s, "session_id");
                for t in &texts {
                    api.say(&sid, t).await;
                }
                api.put(
                    &format!("/api/projects/{project}/current-session"),
                    json!({"session_id": sid}),
                )
                .await;
                // Load it as a client would: the current session, then its history.
                let (_, cur) = api
                    .get(&format!("/api/projects/{project}/current-session"))
                    .await;
                prop_assert_eq!(super::identity(&cur["session"]), super::identity(&s));
                let loaded = id(&cur["session"], "session_id");
                let history = page(&api, &loaded, 100, None).await;
                let users: Vec<&str> = history["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|m| m["role"] == "user")
                    .map(|m| m["content"].as_str().unwrap())
                    .collect();
                prop_assert_eq!(users, texts.iter().map(String::as_str).collect::<Vec<_>>());
                Ok(())
            })
        })
        .unwrap();
    finish(rt, server);
}

#[test]
fn p6_pagination_min_n_m_and_cursor() {
    let (rt, server) = harness();
    let api = server.api();
    runner()
        .run(&(0usize..12, 1usize..10), |(posts, limit)| {
            rt.block_on(async {
                let sid = id(&api.session(None).await, "session_id");
                for i in 0..posts {
                    api.say(&sid, &format!("m{i}")).await;
                }
                let n = posts * 2;
                let mut before = None;
                let mut walked: Vec<u64> = Vec::new();
                let mut remaining = n;
                loop {
                    let p = page(&api, &sid, limit, before).await;
                    let ids: Vec<u64> = p["messages"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|m| m["message_id"].as_u64().unwrap())
                        .collect();
                    prop_assert_eq!(ids.len(), remaining.min(limit), "a page is min(N, M)");
                    prop_assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest first");
                    if let (Some(b), Some(last)) = (before, ids.last()) {
                        prop_assert!(*last < b, "the cursor is honoured");
                    }
                    remaining -= ids.len();
                    let mut older = ids;
                    older.extend(walked);
                    walked = older;
                    match p["next_before"].as_u64() {
                        Some(b) => before = Some(b),
                        None => break,
                    }
                }
                prop_assert_eq!(walked.len(), n, "every message once");
                prop_assert!(walked.windows(2).all(|w| w[0] < w[1]));
                Ok(())
            })
        })
        .unwrap();
    finish(rt, server);
}

#[test]
fn p6_resume_without_loss_or_duplicates() {
    let (rt, server) = harness();
    let api = server.api();
    runner()
        .run(
            &(1usize..3, 0usize..3, 0usize..40),
            |(before, after, cut)| {
                rt.block_on(async {
                    let sid = id(&api.session(None).await, "session_id");
                    for i in 0..before {
                        api.say(&sid, &format!("b{i}")).await;
                    }
                    // Read part of the stream, then drop the connection.
                    let first = api
                        .sse(&sid, None, |e| e.len() > cut || completes(e) == before)
                        .await;
                    let last_seen = first.last().map(|e| e["seq"].as_u64().unwrap());
                    // Meanwhile the session goes on.
                    for i in 0..after {
                        api.say(&sid, &format!("a{i}")).await;
                    }
                    let total = before + after;
                    let seen = completes(&first);
                    let rest = if seen == total {
                        Vec::new()
                    } else {
                        api.sse(&sid, last_seen, |e| seen + completes(e) == total)
                            .await
                    };
                    let reference = api.sse(&sid, None, |e| completes(e) == total).await;
                    let mut joined = seqs(&first);
                    joined.extend(seqs(&rest));
                    prop_assert_eq!(joined, seqs(&reference), "nothing lost, nothing twice");
                    Ok(())
                })
            },
        )
        .unwrap();
    finish(rt, server);
}
