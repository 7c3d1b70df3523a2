//! A session whose actor stops on its own is started again by its host under its ids,
//! with its conversations and their history; the API keeps answering for it. So is one that
//! stops again while it is started, and one whose host ends.

use super::queue::{called, conversation_of, hangs, outcome, outcome_of, post};
use super::{Server, id};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use troupe_runtime::ScriptedReply;
use troupe_service::auth::Scope;
use troupe_store::SqliteStore;

/// The session's run its host has up now.
async fn running(
    server: &Server,
    session_id: troupe_proto::SessionId,
) -> troupe_actors::SessionHandle {
    server
        .service
        .sessions
        .session(Scope::All, session_id)
        .await
        .unwrap()
}

/// The session's run once its host has one up other than `old`.
async fn restarted(
    server: &Server,
    session_id: troupe_proto::SessionId,
    old: ractor::ActorId,
) -> troupe_actors::SessionHandle {
    let t0 = Instant::now();
    loop {
        if let Ok(h) = server
            .service
            .sessions
            .session(Scope::All, session_id)
            .await
            && h.actor().get_id() != old
        {
            return h;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "not restarted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_stops_on_its_own_is_restarted_with_its_conversations() {
    let server = Server::start_with(|_| {}, vec![ScriptedReply::default(); 4]).await;
    let api = server.api();
    let session = api.session(None).await;
    let sid = id(&session, "session_id");
    let root = id(&session, "root_conversation_id");
    let opened = api
        .call("conversation.open", json!({"session_id": sid}))
        .await;
    let other = opened["conversation_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{opened}"))
        .to_owned();
    api.say(&sid, "before").await;
    let stats = |api: super::Api, sid: String, root: String| async move {
        api.call(
            "conversation.stats",
            json!({"session_id": sid, "conversation_id": root}),
        )
        .await
    };
    let items_before = stats(api.clone(), sid.clone(), root.clone()).await["history_items"].clone();
    assert!(items_before.as_u64().unwrap() >= 2, "{items_before}");

    let parsed = sid.parse().unwrap();
    let before = running(&server, parsed).await;
    let old_actor = before.actor().get_id();
    before.actor().kill();

    // Its host notices and starts the session again under the same id.
    let after = restarted(&server, parsed, old_actor).await;
    assert_eq!(after.root().await.unwrap().to_string(), root);
    let open: Vec<String> = after
        .list()
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(open.contains(&other), "{open:?} lacks {other}");
    // The root conversation's history came back from the rollout; the session works.
    let items_after = stats(api.clone(), sid.clone(), root.clone()).await["history_items"].clone();
    assert_eq!(items_after, items_before);
    let reply = api.say(&sid, "after").await;
    assert!(reply.to_string().contains("You said: after"), "{reply}");
    server.stop().await;
}

/// A session that stops again while its host starts it again is started once more, not
/// taken for running: the host is held in a store write (another connection holds the
/// database's write lock) while the new run is killed, so the host hears of the new run only
/// after it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_stops_again_while_it_is_started_is_started_once_more() {
    let server = Server::start_on(
        |dir| Arc::new(SqliteStore::open_in(dir).unwrap()),
        |_| {},
        Vec::new(),
    )
    .await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    // Conversations to restore make the restart long enough to be caught.
    for _ in 0..20 {
        api.call("conversation.open", json!({"session_id": sid}))
            .await;
    }
    let parsed = sid.parse().unwrap();
    let first = running(&server, parsed).await;
    let host = first
        .actor()
        .try_get_supervisor()
        .expect("a session is linked to its host");

    let db = rusqlite::Connection::open(troupe_store::db_path(server.data_dir())).unwrap();
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    first.actor().kill();
    // The host has heard of the stop (it no longer hands out the first run) before the
    // message below holds it in a store write.
    let t0 = Instant::now();
    while let Ok(h) = server.service.sessions.session(Scope::All, parsed).await
        && h.actor().get_id() == first.actor().get_id()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the stop is not heard of"
        );
        tokio::task::yield_now().await;
    }
    // A message sent meanwhile holds the host in its store write until the lock goes.
    let (sent_api, sent_sid) = (api.clone(), sid.clone());
    let sent = tokio::spawn(async move { post(&sent_api, &sent_sid, None, "meanwhile").await });
    let t0 = Instant::now();
    let second = loop {
        let started = host
            .get_children()
            .into_iter()
            .find(|c| c.get_id() != first.actor().get_id());
        if let Some(second) = started {
            break second;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "not started again");
        tokio::task::yield_now().await;
    };
    second.kill();
    while second.get_status() != ractor::ActorStatus::Stopped {
        assert!(t0.elapsed() < Duration::from_secs(10), "not stopped");
        tokio::task::yield_now().await;
    }
    db.execute_batch("ROLLBACK").unwrap();

    let (status, message) = sent.await.unwrap();
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{message}");
    let done = outcome_of(&api, &sid, &message).await;
    assert_eq!(done["status"], "completed", "{done}");
    let reply = api.say(&sid, "after").await;
    assert!(reply.to_string().contains("You said: after"), "{reply}");
    let now = running(&server, parsed).await;
    assert_ne!(now.actor().get_id(), second.get_id());
    assert_eq!(
        now.list().await.unwrap().len(),
        21,
        "every conversation came back"
    );
    server.stop().await;
}

/// A host that ends on its own (killed here; a panic ends it the same way) takes its session
/// with it; the registry activates the session again at once, so the message it ran ends
/// `aborted` and the one that waited runs, with no caller touching the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_ends_on_its_own_is_activated_again_and_settles_its_messages() {
    let server = Server::start_with(|_| {}, hangs()).await;
    let (api, sid, conv) = conversation_of(&server).await;
    let (_, running) = post(&api, &sid, Some(&conv), "runs").await;
    called(&server, 1).await;
    let (_, queued) = post(&api, &sid, Some(&conv), "waits").await;
    let (running, queued) = (
        running["message"]["message_id"].as_u64().unwrap(),
        queued["message"]["message_id"].as_u64().unwrap(),
    );
    let session = server
        .service
        .sessions
        .session(Scope::All, sid.parse().unwrap())
        .await
        .unwrap();
    session
        .actor()
        .try_get_supervisor()
        .expect("a session is linked to its host")
        .kill();

    // Only the store is read from here on: nothing asks for the session.
    let r = outcome(&api, &sid, running).await;
    assert_eq!(r["status"], "aborted", "{r}");
    let q = outcome(&api, &sid, queued).await;
    assert_eq!(q["status"], "completed", "{q}");
    server.stop().await;
}

/// The session run (`via`) that answered a change the host hears of after that run stopped
/// and the next one was started: the next run was restored from what the host held before the
/// answer, so the host tells it the change. The late answers are cast to the host as its own
/// spawned tasks cast them, so the order (run stopped, run started again, answer) is certain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_a_stopped_run_answered_late_are_told_to_the_run_that_replaced_it() {
    use troupe_proto::store::{ConversationRecord, ConversationState};
    use troupe_proto::{CloseOutcome, Closed, OpenConversation};
    use troupe_service::host::HostMsg;

    let server = Server::start_with(|_| {}, vec![ScriptedReply::default(); 4]).await;
    let api = server.api();
    let sid = id(&api.session(None).await, "session_id");
    let closing = id(
        &api.call("conversation.open", json!({"session_id": sid}))
            .await,
        "conversation_id",
    );
    let parsed = sid.parse().unwrap();
    let first = running(&server, parsed).await;
    let host: ractor::ActorRef<HostMsg> = first
        .actor()
        .try_get_supervisor()
        .expect("a session is linked to its host")
        .into();
    // The first run opens two conversations and closes another; no answer has reached the
    // host when the run stops.
    let opened = first.open(OpenConversation::default()).await.unwrap();
    let opened_late = first.open(OpenConversation::default()).await.unwrap();
    let closing_id = closing.parse().unwrap();
    let closed = first.close(closing_id).await.unwrap();
    let via = first.actor().get_id();
    first.actor().kill();
    // The open's answer comes while the run is being started again (most likely: the host
    // hears of the stop first, its supervision events going before its messages).
    let record = |conversation_id| ConversationRecord {
        conversation_id,
        session_id: parsed,
        params: OpenConversation::default(),
        is_root: false,
        state: ConversationState::Open,
        created_ms: 1,
        closed_ms: None,
    };
    // As the open's spawned task casts the session's answer to the host.
    let answer_open = |conversation_id| {
        let host = host.clone();
        async move {
            let answered = ractor::call!(host, |reply| HostMsg::Opened {
                result: Ok(record(conversation_id)),
                via,
                reply,
            })
            .unwrap();
            assert_eq!(answered.unwrap(), conversation_id);
        }
    };
    answer_open(opened).await;
    let second = restarted(&server, parsed, via).await;
    let listed = |h: troupe_actors::SessionHandle| async move {
        h.list()
            .await
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    // The other open's and the close's answers come once the new run is up.
    let before = listed(second.clone()).await;
    assert!(before.contains(&closing), "{before:?}");
    assert!(!before.contains(&opened_late.to_string()), "{before:?}");
    answer_open(opened_late).await;
    let answered = ractor::call!(host, |reply| HostMsg::Closed {
        conversation_id: closing_id,
        result: Ok(Closed {
            conversation_id: closing_id,
            outcome: closed.outcome,
        }),
        via,
        reply,
    })
    .unwrap();
    assert!(
        matches!(&answered, Ok(c) if matches!(c.outcome, CloseOutcome::Closed)),
        "{answered:?}"
    );

    let after = listed(second.clone()).await;
    assert!(after.contains(&opened.to_string()), "{after:?}");
    assert!(after.contains(&opened_late.to_string()), "{after:?}");
    // The close is told off the host's mailbox (it may wait for a running task).
    let t0 = Instant::now();
    while listed(second.clone()).await.contains(&closing) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "never closed in the new run"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The opened conversation runs messages in the new run.
    let (status, message) = post(&api, &sid, Some(&opened.to_string()), "hello").await;
    assert!(status.is_success(), "{message}");
    let done = outcome_of(&api, &sid, &message).await;
    assert_eq!(done["status"], "completed", "{done}");
    server.stop().await;
}

/// A message whose session stops under it ends `aborted`, and its `message_status` reaches
/// the event stream, although the session was being started again when it ended (the update
/// waits for the new run instead of being dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_reached_while_the_session_restarts_is_on_the_event_stream() {
    let server = Server::start_with(|_| {}, hangs()).await;
    let (api, sid, conv) = conversation_of(&server).await;
    let (_, sent) = post(&api, &sid, Some(&conv), "runs").await;
    called(&server, 1).await;
    let message_id = sent["message"]["message_id"].as_u64().unwrap();
    let parsed = sid.parse().unwrap();
    let first = running(&server, parsed).await;
    let old = first.actor().get_id();
    first.actor().kill();
    restarted(&server, parsed, old).await;
    let m = outcome(&api, &sid, message_id).await;
    assert_eq!(m["status"], "aborted", "{m}");
    let events = api
        .sse(&sid, None, |seen| {
            seen.iter().any(|e| {
                e["type"] == "message_status"
                    && e["data"]["message_id"] == message_id
                    && e["data"]["status"] == "aborted"
            })
        })
        .await;
    assert!(!events.is_empty());
    server.stop().await;
}
