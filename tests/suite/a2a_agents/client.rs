//! troupe's A2A client against the Python SDK's server and `troupe serve`: the card, send,
//! stream, get, list, cancel, resubscribe and input-required, over 1.0 and 0.3.

use super::Peer;
use std::time::Duration;
use troupe_a2a::client::card::Endpoint;
use troupe_a2a::client::error::TASK_NOT_FOUND;
use troupe_a2a::client::{EventStream, ListFilter, SendOptions};
use troupe_a2a::model::{Message, Part, Role, SendResult, StreamEvent, Task, TaskState};
use troupe_a2a::provider::reply::parts_text;
use troupe_a2a::version::Version;
use troupe_a2a::{A2aClient, ClientError, ClientOptions};
use troupe_runtime::ScriptedReply;

fn user(context_id: &str, task_id: Option<&str>, text: &str) -> Message {
    Message {
        message_id: uuid_like(text),
        context_id: Some(context_id.to_owned()),
        task_id: task_id.map(str::to_owned),
        role: Role::User,
        parts: vec![Part::text(text)],
        metadata: None,
        reference_task_ids: Vec::new(),
        extensions: Vec::new(),
    }
}

fn uuid_like(seed: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("m-{}-{}", N.fetch_add(1, Ordering::Relaxed), seed.len())
}

fn task_of(r: SendResult) -> Task {
    match r {
        SendResult::Task(t) => t,
        SendResult::Message(m) => panic!("a message, not a task: {m:?}"),
    }
}

fn answer(t: &Task) -> String {
    t.artifacts
        .iter()
        .map(|a| parts_text(&a.parts))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Reads a stream to its end (bounded): the events, in order.
async fn drain(mut s: EventStream) -> Vec<StreamEvent> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(item) = s.next().await {
            out.push(item.expect("a valid event").event);
        }
    })
    .await
    .expect("the stream ends");
    out
}

fn states(events: &[StreamEvent]) -> Vec<TaskState> {
    events.iter().filter_map(StreamEvent::state).collect()
}

/// The client of the Python agent, over `version` (1.0: found by its card).
async fn python_client(peer: &Peer, version: Version) -> A2aClient {
    match version {
        Version::V1_0 => A2aClient::discover(&peer.base, None, ClientOptions::default())
            .await
            .unwrap(),
        Version::V0_3 => A2aClient::at(
            Endpoint {
                url: peer.rpc(),
                version,
            },
            None,
            ClientOptions::default(),
        )
        .unwrap(),
    }
}

async fn python_sdk_agent(version: Version) {
    let peer = Peer::python(&[]);
    let client = python_client(&peer, version).await;
    if version == Version::V1_0 {
        let card = client.card().unwrap();
        assert_eq!(card.name, "remote-test-agent");
        assert!(card.streaming);
        assert_eq!(client.endpoint().url, peer.rpc());
    }
    let ctx = format!("ctx-{}", version.as_str());

    // send: a blocking send answers the finished task.
    let t = task_of(
        client
            .send(
                &user(&ctx, None, "echo hello there"),
                &SendOptions::default(),
            )
            .await
            .unwrap(),
    );
    assert_eq!(t.status.state, TaskState::Completed);
    assert_eq!(t.context_id, ctx);
    assert_eq!(answer(&t), "You said: hello there");

    // get: the same task.
    let got = client.get_task(&t.id, None).await.unwrap();
    assert_eq!(
        (got.status.state, answer(&got)),
        (TaskState::Completed, answer(&t))
    );

    // stream: the task, then its chunks as they come, then COMPLETED, and the stream ends.
    let events = drain(
        client
            .stream(&user(&ctx, None, "echo one two three"))
            .await
            .unwrap(),
    )
    .await;
    assert!(matches!(events[0], StreamEvent::Task(_)), "{events:?}");
    let chunks: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Artifact(a) => Some(parts_text(&a.artifact.parts)),
            _ => None,
        })
        .collect();
    assert_eq!(chunks.concat(), "You said: one two three");
    assert!(chunks.len() > 3, "streamed in pieces: {chunks:?}");
    assert_eq!(states(&events).last(), Some(&TaskState::Completed));

    // The context keeps count: this is its third message.
    let t = task_of(
        client
            .send(&user(&ctx, None, "count"), &SendOptions::default())
            .await
            .unwrap(),
    );
    assert_eq!(answer(&t), "messages in this context: 3");

    // input-required: the stream ends there with the question; the reply in the task ends it.
    let events = drain(
        client
            .stream(&user(&ctx, None, "ask Which branch?"))
            .await
            .unwrap(),
    )
    .await;
    let waiting = events
        .iter()
        .rev()
        .find_map(|e| match e {
            StreamEvent::Status(s) if s.status.state == TaskState::InputRequired => Some(s.clone()),
            _ => None,
        })
        .expect("input-required");
    assert_eq!(
        parts_text(&waiting.status.message.unwrap().parts),
        "Which branch?"
    );
    let done = task_of(
        client
            .send(
                &user(&ctx, Some(&waiting.task_id), "main"),
                &SendOptions::default(),
            )
            .await
            .unwrap(),
    );
    assert_eq!(done.id, waiting.task_id);
    assert_eq!(
        (done.status.state, answer(&done)),
        (TaskState::Completed, "answer: main".to_owned())
    );

    // cancel and resubscribe: a slow task, followed on a second stream, canceled.
    let slow = task_of(
        client
            .send(
                &user(&ctx, None, "slow"),
                &SendOptions {
                    return_immediately: true,
                    ..SendOptions::default()
                },
            )
            .await
            .unwrap(),
    );
    assert!(!slow.status.state.is_terminal(), "{slow:?}");
    let mut follow = client.resubscribe(&slow.id).await.unwrap();
    let mut ticks = 0;
    while ticks < 2 {
        let item = tokio::time::timeout(Duration::from_secs(10), follow.next())
            .await
            .expect("ticks come")
            .expect("the stream stays open")
            .unwrap();
        if let StreamEvent::Status(s) = &item.event
            && s.status
                .message
                .as_ref()
                .is_some_and(|m| parts_text(&m.parts).starts_with("tick"))
        {
            ticks += 1;
        }
    }
    let canceled = client.cancel_task(&slow.id).await.unwrap();
    assert_eq!(canceled.status.state, TaskState::Canceled);
    let rest = drain(follow).await;
    assert_eq!(states(&rest).last(), Some(&TaskState::Canceled), "{rest:?}");
    // A finished task cannot be canceled again.
    let again = client.cancel_task(&slow.id).await.unwrap_err();
    assert!(again.rpc_code().is_some(), "{again}");

    // Failures: a failed task says why; an unknown task is TaskNotFound.
    let failed = task_of(
        client
            .send(&user(&ctx, None, "fail"), &SendOptions::default())
            .await
            .unwrap(),
    );
    assert_eq!(failed.status.state, TaskState::Failed);
    assert_eq!(
        parts_text(&failed.status.message.unwrap().parts),
        "it broke"
    );
    let missing = client.get_task("no-such-task", None).await.unwrap_err();
    assert_eq!(missing.rpc_code(), Some(TASK_NOT_FOUND), "{missing}");

    // A direct message reply.
    match client
        .send(&user(&ctx, None, "message hi"), &SendOptions::default())
        .await
        .unwrap()
    {
        SendResult::Message(m) => assert_eq!(parts_text(&m.parts), "message: hi"),
        SendResult::Task(t) => panic!("a task: {t:?}"),
    }

    // list: 1.0 only.
    match version {
        Version::V1_0 => {
            let page = client
                .list_tasks(&ListFilter {
                    context_id: Some(ctx.clone()),
                    ..ListFilter::default()
                })
                .await
                .unwrap();
            assert!(page.tasks.len() >= 6, "{}", page.tasks.len());
            assert!(page.tasks.iter().all(|t| t.context_id == ctx));
        }
        Version::V0_3 => assert!(matches!(
            client.list_tasks(&ListFilter::default()).await,
            Err(ClientError::Unsupported { .. })
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_agent_over_a2a_1_0() {
    python_sdk_agent(Version::V1_0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_agent_over_a2a_0_3() {
    python_sdk_agent(Version::V0_3).await;
}

/// The bearer token goes with every call; without it the agent answers 401, which the
/// client reports as such. A card that is nowhere, or a port nobody listens on, is an
/// error naming where it looked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_unreachable_agents_are_clear_errors() {
    let peer = Peer::python(&["--token", "sesame"]);
    let anonymous = A2aClient::discover(&peer.base, None, ClientOptions::default())
        .await
        .unwrap();
    let refused = anonymous
        .send(&user("c", None, "count"), &SendOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ClientError::Http { status: 401, .. }),
        "{refused}"
    );
    let client = A2aClient::discover(&peer.base, Some("sesame".into()), ClientOptions::default())
        .await
        .unwrap();
    let t = task_of(
        client
            .send(&user("c", None, "count"), &SendOptions::default())
            .await
            .unwrap(),
    );
    assert_eq!(answer(&t), "messages in this context: 1");

    let no_card = A2aClient::discover(
        &format!("{}/elsewhere/card.json", peer.base),
        None,
        ClientOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(
        no_card.to_string().contains("/elsewhere/card.json"),
        "{no_card}"
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let unreachable = A2aClient::discover(&url, None, ClientOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(unreachable, ClientError::Transport { .. }),
        "{unreachable}"
    );
}

async fn troupe_peer(version: Version) {
    let peer = Peer::troupe(vec![
        ScriptedReply::default(),
        ScriptedReply::text("Streamed answer").chunked(3),
        ScriptedReply::hang(true),
    ]);
    let client = A2aClient::discover(
        &peer.base,
        None,
        ClientOptions {
            version: Some(version),
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(client.version(), version);
    assert!(client.card().unwrap().streaming);
    let ctx = format!("troupe-ctx-{}", version.as_str());

    let t = task_of(
        client
            .send(&user(&ctx, None, "hello"), &SendOptions::default())
            .await
            .unwrap(),
    );
    assert_eq!(
        (t.status.state, t.context_id.as_str(), answer(&t).as_str()),
        (TaskState::Completed, ctx.as_str(), "You said: hello")
    );
    assert_eq!(
        client.get_task(&t.id, None).await.unwrap().status.state,
        TaskState::Completed
    );

    let events = drain(client.stream(&user(&ctx, None, "stream it")).await.unwrap()).await;
    let streamed: String = events
        .iter()
        .filter_map(|e| match e {
            // The chunks; the whole answer comes again last.
            StreamEvent::Artifact(a) if !a.last_chunk => Some(parts_text(&a.artifact.parts)),
            _ => None,
        })
        .collect();
    assert_eq!(streamed, "Streamed answer", "{events:?}");
    assert_eq!(states(&events).last(), Some(&TaskState::Completed));

    // A task that hangs: resubscribed, then canceled; the stream ends CANCELED.
    let hung = task_of(
        client
            .send(
                &user(&ctx, None, "hang"),
                &SendOptions {
                    return_immediately: true,
                    ..SendOptions::default()
                },
            )
            .await
            .unwrap(),
    );
    let follow = client.resubscribe(&hung.id).await.unwrap();
    client.cancel_task(&hung.id).await.unwrap();
    let rest = drain(follow).await;
    assert_eq!(states(&rest).last(), Some(&TaskState::Canceled), "{rest:?}");
    let missing = client.get_task("no-such-task", None).await.unwrap_err();
    assert_eq!(missing.rpc_code(), Some(TASK_NOT_FOUND));
    if version == Version::V1_0 {
        let page = client
            .list_tasks(&ListFilter {
                context_id: Some(ctx.clone()),
                ..ListFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(page.tasks.len(), 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_troupe_over_a2a_1_0() {
    troupe_peer(Version::V1_0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_troupe_over_a2a_0_3() {
    troupe_peer(Version::V0_3).await;
}

/// The card is found from the card's own URL, from the JSON-RPC endpoint's, and, for an agent
/// that only serves a 0.3 card at `/.well-known/agent.json`, there: then the client speaks
/// 0.3 to the endpoint that card names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cards_are_found_where_the_url_says() {
    let peer = Peer::python(&[]);
    for url in [
        format!("{}/.well-known/agent-card.json", peer.base),
        peer.rpc(),
    ] {
        let client = A2aClient::discover(&url, None, ClientOptions::default())
            .await
            .unwrap();
        assert_eq!(
            (client.endpoint().url.as_str(), client.version()),
            (peer.rpc().as_str(), Version::V1_0),
            "{url}"
        );
    }
    // A 0.3-era agent: only /.well-known/agent.json, naming the Python agent's endpoint.
    let card = serde_json::json!({
        "name": "old-agent", "protocolVersion": "0.3.0", "url": peer.rpc(),
        "preferredTransport": "JSONRPC", "capabilities": {"streaming": true},
        "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"], "skills": [],
    });
    let app = axum::Router::new().route(
        "/.well-known/agent.json",
        axum::routing::get(move || {
            let card = card.clone();
            async move { axum::Json(card) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let client = A2aClient::discover(&base, None, ClientOptions::default())
        .await
        .unwrap();
    assert_eq!(
        (client.endpoint().url.as_str(), client.version()),
        (peer.rpc().as_str(), Version::V0_3)
    );
    let events = drain(
        client
            .stream(&user("old", None, "echo in 0.3"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(states(&events).last(), Some(&TaskState::Completed));
    server.abort();
}
