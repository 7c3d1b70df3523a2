//! Passivation (virtual conversations): a conversation idle for `passivate_after` is stopped
//! and kept only in the store; its next message reactivates it with its history, which the
//! model server sees in the prompt. A message that races the passivation is answered, and its
//! conversation's history is whole. SQLite and PostgreSQL rollouts; paused time for the idle
//! period; a real HTTP model server recording what it was sent.

use std::sync::Arc;
use std::time::Duration;
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::session::{SessionMsg, Standing};
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::{ConversationId, EventName, OpenConversation, SessionId, TaskStatus};
use troupe_runtime::assembly;
use troupe_runtime::config::{Provider, TroupeConfig};
use troupe_store::{PgRolloutStorage, SqliteRolloutStorage};
use troupe_test_support::{ModelServer, Reply};

const IDLE: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, Debug)]
enum Backend {
    Sqlite,
    Postgres,
}

fn storage(backend: Backend, dir: &std::path::Path) -> Arc<dyn RolloutStorage> {
    match backend {
        Backend::Sqlite => Arc::new(SqliteRolloutStorage::open_in(dir).unwrap()),
        Backend::Postgres => {
            let url = troupe_test_postgres::server().fresh_database();
            Arc::new(PgRolloutStorage::connect(&url).unwrap())
        }
    }
}

async fn start(
    server: &ModelServer,
    backend: Backend,
    dir: &std::path::Path,
) -> (SessionHandle, tokio::task::JoinHandle<()>) {
    let mut config = TroupeConfig::default();
    config.model.provider = Provider::OpenaiChat;
    config.model.base_url = server.base_url();
    config.model.model = "m".into();
    config.model.api_key = Some("k".into());
    let model = assembly::build_model(&config, None).unwrap();
    let mut session = SessionConfig {
        data_dir: dir.to_path_buf(),
        ..SessionConfig::default()
    };
    session.conversation.passivate_after = Some(IDLE);
    let ports = SessionPorts {
        model,
        mcp: None,
        mcp_connector: None,
        exec: None,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(troupe_actors::history::LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: Some(storage(backend, dir)),
        agents: None,
    };
    SessionHandle::start(SessionId::new(), session, ports)
        .await
        .unwrap()
}

/// The text of every message of the last request the model server received.
fn last_prompt(server: &ModelServer) -> String {
    let requests = server.requests();
    let last = requests.last().expect("the model was asked");
    last.body["messages"].to_string()
}

async fn standing(session: &SessionHandle, c: ConversationId) -> Option<Standing> {
    session.standing(c).await.unwrap()
}

/// Lets the idle period pass on a paused clock, and waits (on that clock) until the
/// conversation is passivated.
async fn idle_until_passivated(session: &SessionHandle, c: ConversationId) {
    tokio::time::pause();
    tokio::time::advance(IDLE + Duration::from_secs(1)).await;
    for _ in 0..1000 {
        if standing(session, c).await == Some(Standing::Passivated) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(standing(session, c).await, Some(Standing::Passivated));
    tokio::time::resume();
}

async fn reactivated_with_its_history(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let server = ModelServer::start().await;
    let (session, _join) = start(&server, backend, dir.path()).await;
    let c = session.open(OpenConversation::default()).await.unwrap();
    let other = session.open(OpenConversation::default()).await.unwrap();
    server.push(Reply::text(["Noted, ", "Ada."]));
    let first = session.message(c, "My name is Ada.").await.unwrap();
    assert_eq!(first.status, TaskStatus::Ok, "{first:?}");
    assert_eq!(
        troupe_actors::conversation::live_conversations(),
        3,
        "root, c, other"
    );

    idle_until_passivated(&session, c).await;
    // Every idle conversation went: the root and the other one too.
    assert_eq!(standing(&session, other).await, Some(Standing::Passivated));
    assert_eq!(troupe_actors::conversation::live_conversations(), 0);
    assert_eq!(session.list().await.unwrap().len(), 3, "still open");

    server.push(Reply::text(["You are Ada."]));
    let second = session.message(c, "What is my name?").await.unwrap();
    assert_eq!(second.status, TaskStatus::Ok, "{second:?}");
    assert_eq!(second.text, "You are Ada.");
    let prompt = last_prompt(&server);
    for said in ["My name is Ada.", "Noted, Ada.", "What is my name?"] {
        assert!(prompt.contains(said), "{said:?} missing from {prompt}");
    }
    assert_eq!(standing(&session, c).await, Some(Standing::Live));
    assert_eq!(standing(&session, other).await, Some(Standing::Passivated));
    assert_eq!(troupe_actors::conversation::live_conversations(), 1);
    let records = session.events_after(0, 1000).await.unwrap();
    let restarted: Vec<_> = records
        .iter()
        .filter(|r| r.kind == EventName::ConversationRestarted)
        .filter_map(|r| r.event.as_ref())
        .collect();
    assert_eq!(restarted.len(), 1, "{restarted:?}");
    assert!(
        serde_json::to_string(restarted[0])
            .unwrap()
            .contains("reactivated after passivation"),
        "{restarted:?}"
    );
    session.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_passivated_conversation_answers_with_its_history_on_sqlite() {
    reactivated_with_its_history(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_passivated_conversation_answers_with_its_history_on_postgres() {
    reactivated_with_its_history(Backend::Postgres).await;
}

/// Only a `full` conversation is passivated: a store that keeps less (or keeps it only for a
/// while) could not bring its history back, so the others stay live however long idle.
#[tokio::test]
async fn only_full_conversations_are_passivated() {
    let dir = tempfile::tempdir().unwrap();
    let server = ModelServer::start().await;
    let (session, _join) = start(&server, Backend::Sqlite, dir.path()).await;
    let open = |policy: troupe_proto::StoragePolicy| OpenConversation {
        storage_policy: policy,
        ..OpenConversation::default()
    };
    let full = session
        .open(open(troupe_proto::StoragePolicy::Full))
        .await
        .unwrap();
    let kept_less = [
        troupe_proto::StoragePolicy::HeadersOnly,
        troupe_proto::StoragePolicy::None,
        troupe_proto::StoragePolicy::Ttl { secs: 3600 },
    ];
    let mut others = Vec::new();
    for policy in kept_less {
        others.push((policy, session.open(open(policy)).await.unwrap()));
    }
    for (i, c) in std::iter::once(full)
        .chain(others.iter().map(|(_, c)| *c))
        .enumerate()
    {
        server.push(Reply::text([format!("answer {i}")]));
        let reply = session.message(c, "hello").await.unwrap();
        assert_eq!(reply.status, TaskStatus::Ok, "{reply:?}");
    }
    idle_until_passivated(&session, full).await;
    for (policy, c) in others {
        assert_eq!(
            standing(&session, c).await,
            Some(Standing::Live),
            "{policy:?} was passivated"
        );
    }
    session.shutdown().await.unwrap();
}

/// Offers the conversation's passivation as its idle timer would.
async fn offer(session: &SessionHandle, c: ConversationId) {
    let actor = session.conversation_actor(c).await.unwrap().unwrap();
    session
        .actor()
        .cast(SessionMsg::PassivationOffered {
            conversation_id: c,
            actor: actor.get_id(),
        })
        .unwrap();
}

/// A context change or a close that the Session forwarded before it asked for a passivation
/// reaches the conversation first: the change is applied (not `not_found`), the close closes
/// (not `already_closed` for a conversation that stays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_change_or_close_racing_passivation_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let server = ModelServer::start().await;
    let (session, _join) = start(&server, Backend::Sqlite, dir.path()).await;
    for round in 0..20 {
        let c = session.open(OpenConversation::default()).await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let change = {
            let session = session.clone();
            tokio::spawn(async move {
                let _ = tx.send(());
                session
                    .set_context(
                        c,
                        troupe_proto::SetContext {
                            user_instructions: Some(Some(format!("round {round}"))),
                            ..Default::default()
                        },
                    )
                    .await
            })
        };
        rx.await.unwrap();
        tokio::task::yield_now().await;
        offer(&session, c).await;
        change.await.unwrap().unwrap();

        let (tx, rx) = tokio::sync::oneshot::channel();
        let close = {
            let session = session.clone();
            tokio::spawn(async move {
                let _ = tx.send(());
                session.close(c).await
            })
        };
        rx.await.unwrap();
        tokio::task::yield_now().await;
        // Offered as its idle timer would, unless the close already took it.
        if let Some(actor) = session.conversation_actor(c).await.unwrap() {
            let _ = session.actor().cast(SessionMsg::PassivationOffered {
                conversation_id: c,
                actor: actor.get_id(),
            });
        }
        let closed = close.await.unwrap().unwrap();
        assert!(
            matches!(closed.outcome, troupe_proto::CloseOutcome::Closed),
            "round {round}: {closed:?}"
        );
        assert_eq!(standing(&session, c).await, None, "round {round}");
    }
}

#[tokio::test]
async fn a_message_racing_passivation_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let server = ModelServer::start().await;
    let (session, _join) = start(&server, Backend::Sqlite, dir.path()).await;
    let c = session.open(OpenConversation::default()).await.unwrap();
    server.push(Reply::text(["one"]));
    session.message(c, "first").await.unwrap();

    // The offer is ahead of the message: the message is held while the conversation stops,
    // then reactivates it.
    offer(&session, c).await;
    server.push(Reply::text(["two"]));
    let reply = session.message(c, "second").await.unwrap();
    assert_eq!(reply.text, "two", "{reply:?}");
    assert!(last_prompt(&server).contains("first"));
    assert!(last_prompt(&server).contains("one"));
    assert_eq!(standing(&session, c).await, Some(Standing::Live));

    // The message is ahead of the offer: the conversation has work and says no.
    let before = session.conversation_actor(c).await.unwrap().unwrap();
    server.push(Reply::text(["three"]).delayed(Duration::from_millis(300)));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let send = {
        let session = session.clone();
        tokio::spawn(async move {
            let _ = tx.send(());
            session.message(c, "third").await
        })
    };
    rx.await.unwrap();
    // The message is in the session's mailbox before the offer (the spawned task sent it
    // before answering; a call sends at once).
    tokio::task::yield_now().await;
    offer(&session, c).await;
    let reply = send.await.unwrap().unwrap();
    assert_eq!(reply.text, "three", "{reply:?}");
    let after = session.conversation_actor(c).await.unwrap().unwrap();
    assert_eq!(
        before.get_id(),
        after.get_id(),
        "not passivated: it had work"
    );

    // An offer while its task runs (the model was asked): no, and the task goes on.
    server.push(Reply::text(["four"]).delayed(Duration::from_millis(300)));
    let send = {
        let session = session.clone();
        tokio::spawn(async move { session.message(c, "fourth").await })
    };
    while server.requests().len() < 4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    offer(&session, c).await;
    server.push(Reply::text(["five"]));
    let fifth = session.message(c, "fifth").await.unwrap();
    assert_eq!(send.await.unwrap().unwrap().text, "four");
    assert_eq!(fifth.text, "five");
    let prompt = last_prompt(&server);
    for said in [
        "first", "one", "second", "two", "third", "three", "fourth", "four",
    ] {
        assert!(prompt.contains(said), "{said:?} missing from {prompt}");
    }
    let after_all = session.conversation_actor(c).await.unwrap().unwrap();
    assert_eq!(before.get_id(), after_all.get_id());
    session.shutdown().await.unwrap();
}

/// Statistics are a read: reading them neither keeps an idle conversation from passivating
/// nor reactivates a passivated one (a console polls them for every open conversation). A
/// passivated conversation answers with the statistics it stopped with.
#[tokio::test]
async fn statistics_are_read_without_waking_a_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let server = ModelServer::start().await;
    let (session, _join) = start(&server, Backend::Sqlite, dir.path()).await;
    let c = session.open(OpenConversation::default()).await.unwrap();
    server.push(Reply::text(["Noted."]).with_usage(12, 3, 0, 0));
    let reply = session.message(c, "remember this").await.unwrap();
    assert_eq!(reply.status, TaskStatus::Ok, "{reply:?}");
    let live = session.conversation_stats(c).await.unwrap();
    assert_eq!((live.tasks, live.usage.input_tokens), (1, 12), "{live:?}");
    assert!(live.history_items >= 2, "{live:?}");

    // Half the idle period, a read, the other half: the read did not restart the wait.
    tokio::time::pause();
    tokio::time::advance(IDLE / 2).await;
    assert_eq!(session.conversation_stats(c).await.unwrap(), live);
    tokio::time::advance(IDLE / 2 + Duration::from_secs(1)).await;
    for _ in 0..100 {
        if standing(&session, c).await == Some(Standing::Passivated) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(standing(&session, c).await, Some(Standing::Passivated));
    tokio::time::resume();

    for _ in 0..3 {
        assert_eq!(session.conversation_stats(c).await.unwrap(), live);
    }
    assert_eq!(standing(&session, c).await, Some(Standing::Passivated));
    let records = session.events_after(0, 1000).await.unwrap();
    assert!(
        !records
            .iter()
            .any(|r| r.kind == EventName::ConversationRestarted),
        "a read reactivated it"
    );

    // Its next message wakes it, and its statistics go on from where they were.
    server.push(Reply::text(["Again."]).with_usage(20, 2, 0, 0));
    session.message(c, "and this").await.unwrap();
    let after = session.conversation_stats(c).await.unwrap();
    assert_eq!(
        (after.tasks, after.usage.input_tokens),
        (2, 32),
        "{after:?}"
    );
    assert_eq!(standing(&session, c).await, Some(Standing::Live));

    let closed = session.open(OpenConversation::default()).await.unwrap();
    session.close(closed).await.unwrap();
    let error = session.conversation_stats(closed).await.unwrap_err();
    assert!(
        matches!(error, troupe_proto::AgentError::NotFound { .. }),
        "{error:?}"
    );
    session.shutdown().await.unwrap();
}
