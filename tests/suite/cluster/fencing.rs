//! Fencing: two store handles with node names ("a" and "b") on one real PostgreSQL database
//! stand for two nodes. B takes a session over once A's lease expired; from then on A's
//! writes for it are refused (the store's and the rollout's), A's renewal fails, and A's
//! lease keeper gives the session up.

use std::sync::Arc;
use std::time::Duration;
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::rollout::{RecordLevel, RecordMeta, RolloutRecord};
use troupe_proto::store::{
    ConversationRecord, ConversationState, MessageKind, NewMessage, SessionRecord, SessionStatus,
};
use troupe_proto::{
    AgentError, ConversationId, EventName, OpenConversation, Role, SessionId, StoragePolicy,
};
use troupe_service::lease_keeper::{LeaseKeeper, LeaseKeeperArgs, LeaseKeeperMsg};
use troupe_store::{Acquired, PgOptions, PgRolloutStorage, PgStore, SessionLeases, Store};

const TTL: Duration = Duration::from_secs(10);

async fn node(url: &str, name: &str) -> PgStore {
    PgStore::connect_with(
        url,
        PgOptions {
            node: Some(name.into()),
            ..PgOptions::default()
        },
    )
    .await
    .unwrap()
}

fn session(id: SessionId) -> SessionRecord {
    SessionRecord {
        session_id: id,
        project_id: None,
        title: None,
        created_ms: 1,
        root_conversation_id: ConversationId::new(),
        settings: troupe_proto::Json(serde_json::json!({})),
        status: SessionStatus::Active,
        updated_ms: 1,
    }
}

fn conversation(s: &SessionRecord) -> ConversationRecord {
    ConversationRecord {
        conversation_id: s.root_conversation_id,
        session_id: s.session_id,
        params: OpenConversation {
            storage_policy: StoragePolicy::Full,
            ..OpenConversation::default()
        },
        is_root: true,
        state: ConversationState::Open,
        created_ms: 1,
        closed_ms: None,
    }
}

fn message(s: &SessionRecord, text: &str) -> NewMessage {
    NewMessage {
        session_id: s.session_id,
        conversation_id: s.root_conversation_id,
        task_id: None,
        role: Role::User,
        content: Some(text.into()),
        chars: text.len() as u64,
        created_ms: 2,
        status: None,
        kind: MessageKind::Text,
        metadata: None,
    }
}

fn record(seq: u64) -> RolloutRecord {
    RolloutRecord {
        seq,
        ts_ms: seq,
        conversation_id: None,
        task_id: None,
        kind: EventName::Warning,
        level: RecordLevel::Minimal,
        event: None,
        meta: RecordMeta::default(),
    }
}

/// Commits one record through a storage's sink for `s`.
fn commit_record(storage: &PgRolloutStorage, s: SessionId, seq: u64) -> Result<(), String> {
    let mut sink = storage.open_sink(s).map_err(|e| e.to_string())?;
    sink.append(None, &record(seq)).map_err(|e| e.to_string())?;
    sink.commit(true, seq).map_err(|e| e.to_string())
}

fn assert_lease_lost<T: std::fmt::Debug>(result: Result<T, AgentError>, taken_by: &str) {
    match result {
        Err(AgentError::Interrupted { reason }) => {
            assert!(reason.contains("lease lost"), "{reason}");
            assert!(reason.contains(taken_by), "{reason}");
        }
        other => panic!("expected a refused write, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_lease_was_taken_over_cannot_write_for_the_session() {
    let url = troupe_test_postgres::server().fresh_database();
    let (a, b) = (node(&url, "a").await, node(&url, "b").await);
    let s = session(SessionId::new());
    let t0 = troupe_actors::clock::unix_now_ms();

    // A owns the session and writes for it.
    let Acquired::Granted { lease, from } = a.acquire(s.session_id, t0, TTL).await.unwrap() else {
        panic!("a free session is granted")
    };
    assert_eq!((lease.fence, from), (1, None));
    a.create_session(s.clone()).await.unwrap();
    a.put_conversation(conversation(&s)).await.unwrap();
    a.append_message(message(&s, "from a")).await.unwrap();
    // B never acquired it: its writes are refused even before any takeover.
    assert_lease_lost(
        b.append_message(message(&s, "b, too early")).await,
        "holds no lease",
    );

    // While A's lease runs, B is told who holds it.
    let held = b.acquire(s.session_id, t0 + 5_000, TTL).await.unwrap();
    assert_eq!(
        held,
        Acquired::Held {
            owner: "a".into(),
            expires_ms: t0 + 10_000
        }
    );

    // A scan of B skips it while A's lease runs, not after; A's own scan keeps it.
    let free = SessionId::new();
    assert_eq!(
        b.not_held_elsewhere(vec![s.session_id, free], t0 + 5_000)
            .await
            .unwrap(),
        vec![free]
    );
    assert_eq!(
        b.not_held_elsewhere(vec![s.session_id], t0 + 11_000)
            .await
            .unwrap(),
        vec![s.session_id]
    );
    assert_eq!(
        a.not_held_elsewhere(vec![s.session_id], t0 + 5_000)
            .await
            .unwrap(),
        vec![s.session_id]
    );

    // A stops renewing (paused, partitioned); once its lease expired B takes over.
    let Acquired::Granted { lease, from } =
        b.acquire(s.session_id, t0 + 11_000, TTL).await.unwrap()
    else {
        panic!("an expired lease is taken over")
    };
    assert_eq!((lease.fence, from.as_deref()), (2, Some("a")));

    // A comes back: every write it makes for the session is refused, B's go through.
    assert_lease_lost(
        a.append_message(message(&s, "stale a")).await,
        "b's with fence 2",
    );
    assert_lease_lost(
        a.set_session_status(s.session_id, SessionStatus::Completed, 3)
            .await,
        "b's with fence 2",
    );
    b.append_message(message(&s, "from b")).await.unwrap();
    let page = b.messages(s.session_id, 10, 1 << 20, None).await.unwrap();
    let texts: Vec<_> = page
        .messages
        .iter()
        .filter_map(|m| m.content.clone())
        .collect();
    assert_eq!(texts, ["from a", "from b"], "nothing of the stale node");

    // The rollout is fenced the same way.
    let a_rollout = PgRolloutStorage::connect_fenced(&url, a.fencing()).unwrap();
    let b_rollout = PgRolloutStorage::connect_fenced(&url, b.fencing()).unwrap();
    let refused = commit_record(&a_rollout, s.session_id, 1).unwrap_err();
    assert!(refused.contains("lease lost"), "{refused}");
    commit_record(&b_rollout, s.session_id, 1).unwrap();
    assert_eq!(b_rollout.last_seq(s.session_id).unwrap(), 1);

    // A's renewal fails; B's succeeds; a release by A changes nothing.
    assert_lease_lost(
        a.renew(s.session_id, t0 + 12_000, TTL).await,
        "another node",
    );
    a.release(s.session_id).await.unwrap();
    let renewed = b.renew(s.session_id, t0 + 12_000, TTL).await.unwrap();
    assert_eq!((renewed.fence, renewed.expires_ms), (2, t0 + 22_000));
    b.append_message(message(&s, "b again")).await.unwrap();

    // B releases; A acquires again under a new fence, never an old one.
    b.release(s.session_id).await.unwrap();
    let Acquired::Granted { lease, from } =
        a.acquire(s.session_id, t0 + 13_000, TTL).await.unwrap()
    else {
        panic!("a released lease is free")
    };
    assert_eq!((lease.fence, from.as_deref()), (3, Some("b")));
    a.append_message(message(&s, "a owns it again"))
        .await
        .unwrap();
    // B gave it up: it holds nothing for it any more.
    assert_lease_lost(
        b.append_message(message(&s, "stale b")).await,
        "holds no lease",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_lease_keeper_gives_up_a_session_another_node_took_over() {
    let url = troupe_test_postgres::server().fresh_database();
    let a: Arc<dyn SessionLeases> = Arc::new(node(&url, "a").await);
    let b = node(&url, "b").await;
    let (lost_tx, mut lost) = tokio::sync::mpsc::unbounded_channel();
    // A ttl of an hour: the keeper's own timer does not fire during the test; the test sends
    // its ticks.
    let ttl = Duration::from_secs(3600);
    let (keeper, _join) = ractor::Actor::spawn(
        None,
        LeaseKeeper,
        LeaseKeeperArgs {
            leases: a,
            ttl,
            clock: troupe_actors::clock::Clock::new(),
            lost: lost_tx,
        },
    )
    .await
    .unwrap();
    let (s1, s2) = (SessionId::new(), SessionId::new());
    for s in [s1, s2] {
        let got = ractor::call!(keeper, |reply| LeaseKeeperMsg::Acquire {
            session_id: s,
            reply
        })
        .unwrap()
        .unwrap();
        assert!(matches!(got, Acquired::Granted { .. }), "{got:?}");
    }
    // A renewal round keeps both.
    keeper.cast(LeaseKeeperMsg::Tick).unwrap();
    let held = ractor::call!(keeper, |reply| LeaseKeeperMsg::Held { reply }).unwrap();
    assert_eq!(held.len(), 2);

    // B takes s1 over as if A's lease had run out (A paused past its expiry).
    let later = troupe_actors::clock::unix_now_ms() + 2 * 3_600_000;
    let taken = b.acquire(s1, later, ttl).await.unwrap();
    assert!(
        matches!(&taken, Acquired::Granted { from: Some(f), .. } if f == "a"),
        "{taken:?}"
    );

    // A's next renewal round finds it lost: the keeper reports it and keeps only s2.
    keeper.cast(LeaseKeeperMsg::Tick).unwrap();
    let gone = tokio::time::timeout(Duration::from_secs(30), lost.recv())
        .await
        .expect("the keeper reports the lost session")
        .unwrap();
    assert_eq!(gone, s1);
    let held = ractor::call!(keeper, |reply| LeaseKeeperMsg::Held { reply }).unwrap();
    assert_eq!(held.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![s2]);
    keeper.stop(None);
}

/// A release of a lease that runs after the node acquired the same session again (the host
/// stopped, then a request activated it at once) leaves the newer lease held and unexpired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_leaves_the_newer_lease_of_the_same_node_alone() {
    let url = troupe_test_postgres::server().fresh_database();
    let a = node(&url, "a").await;
    let s = session(SessionId::new());
    let t0 = troupe_actors::clock::unix_now_ms();
    let Acquired::Granted { lease: old, .. } = a.acquire(s.session_id, t0, TTL).await.unwrap()
    else {
        panic!("a free session is granted")
    };
    a.create_session(s.clone()).await.unwrap();
    a.put_conversation(conversation(&s)).await.unwrap();
    let Acquired::Granted { lease: new, .. } =
        a.acquire(s.session_id, t0 + 1_000, TTL).await.unwrap()
    else {
        panic!("its own session is granted again")
    };
    assert!(new.fence > old.fence, "{new:?} after {old:?}");
    // The release of the old lease comes late.
    a.release_fence(s.session_id, old.fence).await.unwrap();
    assert!(a.holds(s.session_id, t0 + 2_000), "the newer lease is held");
    a.append_message(message(&s, "still a's")).await.unwrap();
    let renewed = a.renew(s.session_id, t0 + 3_000, TTL).await.unwrap();
    assert_eq!(renewed.fence, new.fence);
    // Released by its own fence, it is gone.
    a.release_fence(s.session_id, new.fence).await.unwrap();
    assert!(!a.holds(s.session_id, t0 + 4_000));
}
