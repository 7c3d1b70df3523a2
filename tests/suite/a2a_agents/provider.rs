//! Remote A2A agents as sub-agents of a session: `/hub <agent>` to the Python SDK agent and to
//! a second troupe, the binding (the A2A contextId) kept and resumed, input-required asked of
//! the session's human, and a cancelled dispatch canceling the remote task.

use super::{CuttingProxy, Hub, Peer, a2a_agent, remote_tasks, updates};
use troupe_a2a::client::card::Endpoint;
use troupe_a2a::model::TaskState;
use troupe_a2a::version::Version;
use troupe_a2a::{A2aClient, ClientOptions};
use troupe_proto::agent::{AgentUpdateKind, ProviderKind};
use troupe_proto::approval::agent_answer;
use troupe_proto::{
    AgentError, ApprovalDecision, ApprovalSubject, EventKind, PendingApproval, TaskStatus,
};
use troupe_runtime::ScriptedReply;
use troupe_store::BindingStore;

/// Waits (bounded) until the remote task is CANCELED: the provider cancels it from its own
/// task when the hub drops a cancelled dispatch.
async fn canceled_remotely(peer: &Peer, task_id: &str) {
    let t0 = std::time::Instant::now();
    loop {
        let state = remote_state(peer, task_id).await;
        if state == TaskState::Canceled {
            return;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "the remote task {task_id} is {state:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn remote_state(peer: &Peer, task_id: &str) -> TaskState {
    let client = A2aClient::at(
        Endpoint {
            url: peer.rpc(),
            version: Version::V1_0,
        },
        None,
        ClientOptions::default(),
    )
    .unwrap();
    client
        .get_task(task_id, Some(0))
        .await
        .unwrap()
        .status
        .state
}

/// Waits for the session's first pending approval.
async fn pending(hub: &Hub) -> PendingApproval {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(p) = hub
            .session
            .pending_approvals()
            .await
            .unwrap()
            .into_iter()
            .next()
        {
            return p;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "nothing was asked"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_to_the_python_agent_streams_binds_its_context_and_resumes_it() {
    let peer = Peer::python(&[]);
    let hub = Hub::start(vec![a2a_agent("remote", &peer.base, None)]).await;
    let reply = hub.send("/hub remote echo hello world").await;
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "You said: hello world"),
        "{:?}",
        reply.error
    );
    let events = hub.events().await;
    let chunks: Vec<String> = updates(&events, "remote")
        .into_iter()
        .filter(|(k, _, _)| *k == AgentUpdateKind::MessageChunk)
        .map(|(_, t, _)| t)
        .collect();
    assert!(chunks.len() > 2, "streamed as chunks: {chunks:?}");
    assert_eq!(chunks.concat(), "You said: hello world");
    let states: Vec<String> = updates(&events, "remote")
        .into_iter()
        .filter_map(|(k, _, d)| {
            (k == AgentUpdateKind::Status).then(|| d.unwrap()["state"].as_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(
        states.last().map(String::as_str),
        Some("TASK_STATE_COMPLETED"),
        "{states:?}"
    );
    // The binding is the A2A context the message went to.
    let stored = hub.store.bindings(Some(hub.session_id)).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].provider, ProviderKind::A2a);
    let context = stored[0].provider_session_id.clone();
    assert!(events.iter().any(|e| matches!(e,
        EventKind::SessionBound { agent_id, provider_session_id, .. }
            if agent_id == "remote" && *provider_session_id == context)));
    // Every dispatch of the session goes to that context: the agent counts its messages.
    assert_eq!(
        hub.send("/hub remote count").await.text,
        "messages in this context: 2"
    );
    // Another run of the session resumes the binding: same context, the count goes on.
    let hub = hub.restart().await;
    assert_eq!(
        hub.send("/hub remote count").await.text,
        "messages in this context: 3"
    );
    let events = hub.events().await;
    assert!(
        events.iter().any(|e| matches!(e,
        EventKind::SessionResumed { agent_id, provider_session_id, .. }
            if agent_id == "remote" && *provider_session_id == context)),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_required_is_asked_of_the_human_and_the_answer_goes_back() {
    for streaming in [true, false] {
        let peer = Peer::python(if streaming { &[] } else { &["--no-streaming"] });
        let hub =
            std::sync::Arc::new(Hub::start(vec![a2a_agent("remote", &peer.base, None)]).await);
        let h = hub.clone();
        let asked = tokio::spawn(async move { h.send("/hub remote ask Which branch?").await });
        let p = pending(&hub).await;
        assert_eq!(
            p.subject,
            ApprovalSubject::AgentQuestion {
                agent_id: "remote".into(),
                question: "Which branch?".into()
            }
        );
        assert_eq!(p.command, ["a2a", "remote", "question"]);
        // Approving without an answer is refused and the question stays asked.
        assert!(matches!(
            hub.session
                .respond_approval(p.approval_id, ApprovalDecision::ApproveOnce)
                .await,
            Err(AgentError::InvalidInput { .. })
        ));
        hub.session
            .respond_approval(p.approval_id, agent_answer("main"))
            .await
            .unwrap();
        let reply = asked.await.unwrap();
        assert_eq!(
            (reply.status, reply.text.as_str()),
            (TaskStatus::Ok, "answer: main"),
            "streaming {streaming}: {:?}",
            reply.error
        );
        let events = hub.events().await;
        assert!(
            events
                .iter()
                .any(|e| matches!(e, EventKind::ApprovalRequested { .. }))
        );

        // Refused: the dispatch fails and the remote task is canceled.
        let h = hub.clone();
        let asked = tokio::spawn(async move { h.send("/hub remote ask Really?").await });
        let p = pending(&hub).await;
        hub.session
            .respond_approval(
                p.approval_id,
                ApprovalDecision::Deny {
                    reason: Some("no".into()),
                },
            )
            .await
            .unwrap();
        let reply = asked.await.unwrap();
        assert_eq!(reply.status, TaskStatus::Error);
        assert!(
            matches!(reply.error, Some(AgentError::ApprovalDenied { .. })),
            "{:?}",
            reply.error
        );
        let events = hub.events().await;
        let task = remote_tasks(&events, "remote").pop().unwrap();
        canceled_remotely(&peer, &task).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_dispatch_cancels_the_remote_task() {
    for streaming in [true, false] {
        let peer = Peer::python(if streaming { &[] } else { &["--no-streaming"] });
        let hub =
            std::sync::Arc::new(Hub::start(vec![a2a_agent("remote", &peer.base, None)]).await);
        let h = hub.clone();
        let running = tokio::spawn(async move { h.send("/hub remote slow").await });
        // Once the agent says it works, the dispatching task is cancelled.
        let (task, remote) = hub
            .wait_for(|e| match e {
                EventKind::AgentUpdate { text, data, .. } if text.starts_with("tick") => data
                    .as_ref()
                    .and_then(|d| d.0["taskId"].as_str().map(str::to_owned)),
                _ => None,
            })
            .await;
        hub.session.cancel_task(task.unwrap()).await.unwrap();
        let reply = running.await.unwrap();
        assert_eq!(reply.status, TaskStatus::Cancelled, "streaming {streaming}");
        canceled_remotely(&peer, &remote).await;
        // What the agent answered to the cancel is shown, after the dispatch ended.
        hub.wait_for(|e| match e {
            EventKind::AgentUpdate { data, .. } => data
                .as_ref()
                .filter(|d| d.0["state"] == "TASK_STATE_CANCELED")
                .map(|_| ()),
            _ => None,
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_direct_replies_of_the_python_agent() {
    let peer = Peer::python(&["--no-streaming"]);
    let hub = Hub::start(vec![a2a_agent("remote", &peer.base, None)]).await;
    let failed = hub.send("/hub remote fail").await;
    assert_eq!(failed.status, TaskStatus::Error);
    assert!(
        matches!(&failed.error, Some(AgentError::ToolError { message, .. }) if message.contains("it broke")),
        "{:?}",
        failed.error
    );
    let rejected = hub.send("/hub remote dance").await;
    assert!(
        matches!(&rejected.error, Some(AgentError::ToolError { message, .. }) if message.contains("rejected")),
        "{:?}",
        rejected.error
    );
    assert_eq!(hub.send("/hub remote message hi").await.text, "message: hi");
    let gave_up = hub.send("/hub remote giveup").await;
    assert!(
        matches!(&gave_up.error, Some(AgentError::Cancelled { reason }) if reason.contains("gave up")),
        "{:?}",
        gave_up.error
    );
    // Credentials are not troupe's to give: the task is canceled and the dispatch says why.
    let auth = hub.send("/hub remote auth").await;
    assert!(
        matches!(&auth.error, Some(AgentError::ToolError { message, .. }) if message.contains("authentication")),
        "{:?}",
        auth.error
    );
    let events = hub.events().await;
    let task = remote_tasks(&events, "remote").pop().unwrap();
    canceled_remotely(&peer, &task).await;
    // An agent nobody answers for is an error of the dispatch, not a hang.
    let url = peer.rpc();
    drop(peer);
    let gone = hub.send("/hub remote echo anyone?").await;
    assert_eq!(gone.status, TaskStatus::Error);
    assert!(
        matches!(&gone.error, Some(AgentError::ToolError { message, .. })
            if message.contains(&format!("cannot reach the A2A agent at {url}"))),
        "{:?}",
        gone.error
    );
}

/// A second `troupe serve` as the remote agent: its reply, its approval asked here (under
/// `a2a peer`) and the decision carried out there, and a cancel that reaches its task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_troupe_as_a_sub_agent() {
    let peer = Peer::troupe(vec![
        ScriptedReply::default(),
        ScriptedReply::tool(
            "shell",
            serde_json::json!({"command": ["echo", "relayed-ok"]}),
        ),
        ScriptedReply::default(),
        ScriptedReply::hang(true),
    ]);
    let hub = std::sync::Arc::new(
        Hub::start(vec![a2a_agent("peer", &format!("{}/a2a", peer.base), None)]).await,
    );
    let reply = hub.send("/hub peer hello").await;
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "You said: hello"),
        "{:?}",
        reply.error
    );

    // The peer's model runs a command: its approval request comes here.
    let h = hub.clone();
    let running = tokio::spawn(async move { h.send("/hub peer run it").await });
    let p = pending(&hub).await;
    assert_eq!(p.command, ["a2a", "peer", "echo", "relayed-ok"]);
    assert_eq!(p.subject, ApprovalSubject::Command);
    assert!(p.reason.contains("`peer`"), "{}", p.reason);
    hub.session
        .respond_approval(p.approval_id, ApprovalDecision::ApproveOnce)
        .await
        .unwrap();
    let reply = running.await.unwrap();
    assert_eq!(reply.status, TaskStatus::Ok, "{:?}", reply.error);
    assert!(reply.text.contains("relayed-ok"), "{}", reply.text);

    // A dispatch cancelled while the peer's model hangs: the peer's task is canceled.
    let before = remote_tasks(&hub.events().await, "peer");
    let h = hub.clone();
    let running = tokio::spawn(async move { h.send("/hub peer wait").await });
    let (task, last) = hub
        .wait_for(|e| match e {
            EventKind::AgentUpdate { data, .. } => data.as_ref().and_then(|d| {
                let id = d.0["taskId"].as_str()?;
                (d.0["state"] == "TASK_STATE_WORKING" && !before.iter().any(|b| b == id))
                    .then(|| id.to_owned())
            }),
            _ => None,
        })
        .await;
    hub.session.cancel_task(task.unwrap()).await.unwrap();
    let reply = running.await.unwrap();
    assert_eq!(reply.status, TaskStatus::Cancelled);
    canceled_remotely(&peer, &last).await;
    // Both dispatches went to one context of the peer: one binding.
    let stored = hub.store.bindings(Some(hub.session_id)).await.unwrap();
    assert_eq!(stored.len(), 1);
}

/// A stream that breaks before its task ends is taken up again with SubscribeToTask (three
/// times), then the task is polled; the answer comes whole, each piece shown once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_is_resubscribed_then_polled() {
    let peer = Peer::python(&[]);
    let proxy = CuttingProxy::start(&peer.base, 2).await;
    let hub = Hub::start(vec![a2a_agent("remote", &proxy.base, None)]).await;
    let words: Vec<String> = (0..40).map(|i| format!("w{i}")).collect();
    let reply = hub
        .send(&format!("/hub remote echo {}", words.join(" ")))
        .await;
    let want = format!("You said: {}", words.join(" "));
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, want.as_str()),
        "{:?}",
        reply.error
    );
    let methods = proxy.methods();
    assert_eq!(methods[0], "SendStreamingMessage", "{methods:?}");
    assert_eq!(
        methods.iter().filter(|m| *m == "SubscribeToTask").count(),
        3,
        "{methods:?}"
    );
    assert!(methods.iter().any(|m| m == "GetTask"), "{methods:?}");
    let events = hub.events().await;
    let shown: String = updates(&events, "remote")
        .into_iter()
        .filter(|(k, _, _)| *k == AgentUpdateKind::MessageChunk)
        .map(|(_, t, _)| t)
        .collect();
    assert_eq!(shown, want);
}

/// One dispatch answers at most 16 requests for input; the 17th cancels the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_keeps_asking_is_stopped() {
    let peer = Peer::python(&[]);
    let hub = std::sync::Arc::new(Hub::start(vec![a2a_agent("remote", &peer.base, None)]).await);
    let h = hub.clone();
    let running = tokio::spawn(async move { h.send("/hub remote nag").await });
    let mut answered = 0;
    while !running.is_finished() {
        if let Some(p) = hub
            .session
            .pending_approvals()
            .await
            .unwrap()
            .into_iter()
            .next()
        {
            hub.session
                .respond_approval(p.approval_id, agent_answer(format!("yes {answered}")))
                .await
                .unwrap();
            answered += 1;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let reply = running.await.unwrap();
    assert_eq!(answered, 16);
    assert!(
        matches!(&reply.error, Some(AgentError::ToolError { message, .. }) if message.contains("more than 16")),
        "{:?}",
        reply.error
    );
    let events = hub.events().await;
    let task = remote_tasks(&events, "remote").pop().unwrap();
    canceled_remotely(&peer, &task).await;
}

/// An agent down at its first dispatch fails that dispatch, naming where its card was looked
/// for; once it is up, the next dispatch reads the card and goes through. With
/// `bindingScope: dispatch`, each dispatch is a context of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_down_at_first_is_tried_again_and_dispatch_scope_opens_a_context_each_time() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let mut fresh = a2a_agent("fresh", &url, None);
    fresh.session.binding_scope = troupe_proto::agent::BindingScope::Dispatch;
    let hub = Hub::start(vec![a2a_agent("remote", &url, None), fresh]).await;
    let down = hub.send("/hub remote count").await;
    assert_eq!(down.status, TaskStatus::Error);
    assert!(
        matches!(&down.error, Some(AgentError::ToolError { message, .. })
            if message.contains(&format!("127.0.0.1:{port}/.well-known/agent-card.json"))),
        "{:?}",
        down.error
    );
    let _peer = Peer::python(&["--port", &port.to_string()]);
    assert_eq!(
        hub.send("/hub remote count").await.text,
        "messages in this context: 1"
    );
    assert_eq!(
        hub.send("/hub remote count").await.text,
        "messages in this context: 2"
    );
    for _ in 0..2 {
        assert_eq!(
            hub.send("/hub fresh count").await.text,
            "messages in this context: 1"
        );
    }
}

/// The remote task of the newest `tick` the agent said, once it said one.
async fn ticking(hub: &Hub) -> String {
    hub.wait_for(|e| match e {
        EventKind::AgentUpdate { text, data, .. } if text.starts_with("tick") => data
            .as_ref()
            .and_then(|d| d.0["taskId"].as_str().map(str::to_owned)),
        _ => None,
    })
    .await
    .1
}

/// A dispatch whose lease expires is ended `expired` by the hub, and its remote task is
/// canceled, as when it is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_cancels_the_remote_task() {
    let peer = Peer::python(&[]);
    let hub = Hub::start_with(
        vec![a2a_agent("remote", &peer.base, None)],
        troupe_actors::agents::AgentSettings {
            lease_ttl: std::time::Duration::from_secs(2),
            ..Default::default()
        },
    )
    .await;
    let reply = hub.send("/hub remote slow").await;
    assert_eq!(reply.status, TaskStatus::Error, "{:?}", reply.error);
    assert!(
        matches!(reply.error, Some(AgentError::Timeout { .. })),
        "{:?}",
        reply.error
    );
    let events = hub.events().await;
    assert!(events.iter().any(|e| matches!(e,
        EventKind::DispatchResult { agent_id, status: troupe_proto::agent::DispatchStatus::Expired, .. }
            if agent_id == "remote")), "{events:?}");
    let task = remote_tasks(&events, "remote").pop().unwrap();
    canceled_remotely(&peer, &task).await;
}

/// A session that ends while it waits on a remote agent cancels the remote task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_ends_cancels_the_remote_task() {
    let peer = Peer::python(&[]);
    let hub = std::sync::Arc::new(Hub::start(vec![a2a_agent("remote", &peer.base, None)]).await);
    let h = hub.clone();
    let _running = tokio::spawn(async move {
        let root = h.session.root().await.unwrap();
        let _ = h.session.message(root, "/hub remote slow").await;
    });
    let task = ticking(&hub).await;
    tokio::time::timeout(std::time::Duration::from_secs(30), hub.session.shutdown())
        .await
        .expect("the session ends in time")
        .unwrap();
    canceled_remotely(&peer, &task).await;
}

/// A remote agent's question that its dispatch stops waiting for (the lease expired) is
/// withdrawn with it, not left listed for a human to answer in vain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_whose_dispatch_expired_is_withdrawn() {
    let peer = Peer::python(&[]);
    let hub = std::sync::Arc::new(
        Hub::start_with(
            vec![a2a_agent("remote", &peer.base, None)],
            troupe_actors::agents::AgentSettings {
                lease_ttl: std::time::Duration::from_secs(2),
                ..Default::default()
            },
        )
        .await,
    );
    let h = hub.clone();
    let asked = tokio::spawn(async move { h.send("/hub remote ask Which branch?").await });
    let p = pending(&hub).await;
    let reply = asked.await.unwrap();
    assert!(
        matches!(reply.error, Some(AgentError::Timeout { .. })),
        "{:?}",
        reply.error
    );
    let t0 = std::time::Instant::now();
    while !hub.session.pending_approvals().await.unwrap().is_empty() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "the question is still asked: {p:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let late = hub
        .session
        .respond_approval(p.approval_id, agent_answer("main"))
        .await
        .unwrap_err();
    assert!(matches!(late, AgentError::Cancelled { .. }), "{late:?}");
}
