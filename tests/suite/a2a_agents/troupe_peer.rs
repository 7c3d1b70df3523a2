//! A second `troupe serve` process as a remote A2A sub-agent: its answer streamed here as
//! agent updates, its own question (the A2A reply form's `input-required`) asked of this
//! session's human and answered, its conversation kept across runs of this session through
//! the bound contextId, and the process killed mid-task: a clear error, the agent shown
//! unavailable, and back to ok once a troupe answers at that address again.

use super::{Hub, Peer, a2a_agent, remote_tasks, updates};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use troupe_a2a::client::ListFilter;
use troupe_a2a::client::card::Endpoint;
use troupe_a2a::model::TaskState;
use troupe_a2a::version::Version;
use troupe_a2a::{A2aClient, ClientOptions};
use troupe_proto::agent::{AgentHealth, AgentUpdateKind, HealthStatus};
use troupe_proto::approval::agent_answer;
use troupe_proto::{AgentError, ApprovalSubject, EventKind, PendingApproval, TaskStatus};
use troupe_runtime::ScriptedReply;
use troupe_store::BindingStore;

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
        assert!(t0.elapsed() < Duration::from_secs(30), "nothing was asked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The health the session shows for `agent_id`.
async fn health(hub: &Hub, agent_id: &str) -> AgentHealth {
    hub.session
        .agents()
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.id == agent_id)
        .unwrap_or_else(|| panic!("no agent {agent_id}"))
        .health
}

fn peer_client(peer: &Peer) -> A2aClient {
    A2aClient::at(
        Endpoint {
            url: peer.rpc(),
            version: Version::V1_0,
        },
        None,
        ClientOptions::default(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_troupe_streams_asks_its_own_question_and_keeps_its_conversation_across_runs() {
    let peer = Peer::troupe(vec![
        ScriptedReply::text("Hello from the other troupe").chunked(4),
        ScriptedReply::a2a(json!({"state": "input-required", "text": "Which city?"})),
        ScriptedReply::default(),
        ScriptedReply::default(),
    ]);
    let hub = Arc::new(Hub::start(vec![a2a_agent("peer", &peer.rpc(), None)]).await);

    // The answer streams: the peer's artifact chunks are message_chunk updates here.
    let reply = hub.send("/hub peer hi").await;
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "Hello from the other troupe"),
        "{:?}",
        reply.error
    );
    let chunks: Vec<String> = updates(&hub.events().await, "peer")
        .into_iter()
        .filter(|(k, _, _)| *k == AgentUpdateKind::MessageChunk)
        .map(|(_, t, _)| t)
        .collect();
    assert!(chunks.len() > 1, "streamed in pieces: {chunks:?}");
    assert_eq!(chunks.concat(), "Hello from the other troupe");

    // The peer's model asks (INPUT_REQUIRED): a question for this session's human, whose
    // answer goes back into the peer's task, which runs again and completes.
    let h = hub.clone();
    let asked = tokio::spawn(async move { h.send("/hub peer book a trip").await });
    let p = pending(&hub).await;
    assert_eq!(
        p.subject,
        ApprovalSubject::AgentQuestion {
            agent_id: "peer".into(),
            question: "Which city?".into()
        }
    );
    assert_eq!(p.command, ["a2a", "peer", "question"]);
    hub.session
        .respond_approval(p.approval_id, agent_answer("Paris"))
        .await
        .unwrap();
    let reply = asked.await.unwrap();
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "You said: Paris"),
        "{:?}",
        reply.error
    );
    let states: Vec<String> = updates(&hub.events().await, "peer")
        .into_iter()
        .filter_map(|(k, _, d)| {
            (k == AgentUpdateKind::Status).then(|| d.unwrap()["state"].as_str().unwrap().to_owned())
        })
        .collect();
    assert!(
        states.iter().any(|s| s == "TASK_STATE_INPUT_REQUIRED"),
        "{states:?}"
    );

    // Another run of this session resumes the binding: the peer gets the message in the
    // same context, that is in the same conversation of its own.
    let context = hub.store.bindings(Some(hub.session_id)).await.unwrap()[0]
        .provider_session_id
        .clone();
    let hub = Arc::into_inner(hub).expect("one owner").restart().await;
    assert_eq!(hub.send("/hub peer again").await.text, "You said: again");
    assert!(hub.events().await.iter().any(|e| matches!(e,
        EventKind::SessionResumed { agent_id, provider_session_id, .. }
            if agent_id == "peer" && *provider_session_id == context)));
    let page = peer_client(&peer)
        .list_tasks(&ListFilter {
            context_id: Some(context.clone()),
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(page.tasks.len(), 3, "{:?}", page.tasks);
    assert!(
        page.tasks
            .iter()
            .all(|t| t.status.state == TaskState::Completed)
    );
    let conversations: std::collections::BTreeSet<String> = page
        .tasks
        .iter()
        .map(|t| {
            t.metadata.as_ref().unwrap()["troupe"]["conversationId"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(conversations.len(), 1, "{conversations:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_troupe_peer_killed_mid_task_fails_the_dispatch_clearly_and_shows_unavailable_until_it_is_back()
 {
    let peer = Peer::troupe(vec![ScriptedReply::default(), ScriptedReply::hang(true)]);
    let url = peer.rpc();
    let listen = peer.base.trim_start_matches("http://").to_owned();
    let hub = Arc::new(Hub::start(vec![a2a_agent("peer", &url, None)]).await);
    assert_eq!(hub.send("/hub peer hello").await.status, TaskStatus::Ok);
    assert_eq!(health(&hub, "peer").await.status, HealthStatus::Ok);

    // The peer's model hangs; once its task works, the peer process is killed.
    let before = remote_tasks(&hub.events().await, "peer");
    let h = hub.clone();
    let running = tokio::spawn(async move { h.send("/hub peer wait").await });
    hub.wait_for(|e| match e {
        EventKind::AgentUpdate { data, .. } => data.as_ref().and_then(|d| {
            let id = d.0["taskId"].as_str()?;
            (d.0["state"] == "TASK_STATE_WORKING" && !before.iter().any(|b| b == id)).then_some(())
        }),
        _ => None,
    })
    .await;
    drop(peer);
    let reply = running.await.unwrap();
    assert_eq!(reply.status, TaskStatus::Error);
    let Some(AgentError::ToolError { message, .. }) = &reply.error else {
        panic!("{:?}", reply.error)
    };
    assert!(
        message.contains(&format!("cannot reach the A2A agent at {url}")),
        "{message}"
    );
    let down = health(&hub, "peer").await;
    assert_eq!(down.status, HealthStatus::Unavailable, "{down:?}");
    assert!(
        down.detail.as_deref().unwrap_or_default().contains(&url),
        "{down:?}"
    );
    // A dispatch while it is down fails the same way, at once.
    let refused = hub.send("/hub peer anyone?").await;
    assert!(
        matches!(&refused.error, Some(AgentError::ToolError { message, .. })
            if message.contains(&format!("cannot reach the A2A agent at {url}"))
                && message.contains("Connection refused")),
        "{:?}",
        refused.error
    );

    // A troupe answers at that address again: the next dispatch goes through (in a context
    // the new process takes up as named), and the agent is ok again.
    let _back = Peer::troupe_at(Vec::new(), &listen);
    let reply = hub.send("/hub peer back?").await;
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "You said: back?"),
        "{:?}",
        reply.error
    );
    assert_eq!(health(&hub, "peer").await.status, HealthStatus::Ok);
}
