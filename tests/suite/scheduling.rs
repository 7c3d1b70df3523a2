//! Single-flight (S3) end to end: N conversations × M messages at once never run two model
//! calls together (or more than the configured limit), each conversation is served in the
//! order its messages arrived, and no slot stays held after cancellations and panics.

use proptest::prelude::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use troupe_actors::conversation::ConversationMsg;
use troupe_actors::scheduler::SchedulerMsg;
use troupe_actors::session::SessionMsg;
use troupe_proto::{AgentError, EventKind, MessageReply, OpenConversation};
use troupe_tests::{ProbeModel, start_with_model};

#[derive(Debug, Clone)]
struct Case {
    conversations: usize,
    messages: usize,
    limit: usize,
    cancels: Vec<usize>,
    panic_conversation: Option<usize>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..5,
        1usize..5,
        prop_oneof![Just(1usize), Just(1), Just(2)],
    )
        .prop_flat_map(|(n, m, limit)| {
            (
                Just(n),
                Just(m),
                Just(limit),
                proptest::collection::vec(0usize..100, 0..3),
                proptest::option::of(0..n),
            )
        })
        .prop_map(
            |(conversations, messages, limit, cancels, panic_conversation)| Case {
                conversations,
                messages,
                limit,
                cancels,
                panic_conversation,
            },
        )
}

async fn run_case(case: Case) {
    let model = Arc::new(ProbeModel::new(Duration::from_millis(50)));
    let limit = case.limit;
    let (session, _dir, join) = start_with_model(
        model.clone(),
        |c| {
            c.scheduler.limit = limit;
            c.conversation.max_queued_messages = 64;
        },
        None,
    )
    .await;
    let mut events = session.subscribe().await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..case.conversations {
        ids.push(session.open(OpenConversation::default()).await.unwrap());
    }
    // Cast every message in a fixed order from this one task, so the arrival order is known.
    let mut pending = Vec::new();
    for m in 0..case.messages {
        for (ci, &c) in ids.iter().enumerate() {
            let (tx, rx) = ractor::concurrency::oneshot::<Result<MessageReply, AgentError>>();
            session
                .actor()
                .cast(SessionMsg::Message {
                    conversation_id: c,
                    text: format!("c{ci}-m{m}"),
                    options: Default::default(),
                    stored: None,
                    reply: tx.into(),
                })
                .unwrap();
            pending.push((ci, m, rx));
        }
    }
    // Faults while the work runs.
    for pick in &case.cancels {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let tasks = session.tasks(None).await.unwrap();
        if !tasks.is_empty() {
            let _ = session.cancel_task(tasks[pick % tasks.len()].task_id).await;
        }
    }
    if let Some(ci) = case.panic_conversation
        && let Some(actor) = session.conversation_actor(ids[ci]).await.unwrap()
    {
        let _ = actor.cast(ConversationMsg::InjectPanic);
    }
    for (ci, _m, rx) in pending {
        match rx.await {
            Ok(Ok(_)) | Ok(Err(AgentError::Cancelled { .. })) => {}
            // The panicked conversation drops its callers' reply ports.
            Err(_) if Some(ci) == case.panic_conversation => {}
            other => panic!("unexpected reply for c{ci}: {other:?}"),
        }
    }
    let max = model.max_seen.load(Ordering::SeqCst);
    assert!(
        max <= limit,
        "{max} model calls ran at once with limit {limit}"
    );
    // No slot stays held.
    let s = session.services().await.unwrap();
    let snap = ractor::call!(s.scheduler, |reply| SchedulerMsg::Snapshot { reply }).unwrap();
    assert!(
        snap.running.is_empty() && snap.waiting.is_empty(),
        "{snap:?}"
    );
    // FIFO within each conversation: tasks started in arrival order.
    let mut started: Vec<Vec<usize>> = vec![Vec::new(); case.conversations];
    // Events are published once committed: a flush is the barrier.
    session.flush().await.unwrap();
    while let Ok(e) = events.try_recv() {
        if let EventKind::TaskStarted { input } = &e.event {
            let (c, m) = input.trim_start_matches('c').split_once("-m").unwrap();
            started[c.parse::<usize>().unwrap()].push(m.parse().unwrap());
        }
    }
    for (ci, order) in started.iter().enumerate() {
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(order, &sorted, "conversation {ci} out of order");
    }
    // The session still serves every conversation.
    let after = session.open(OpenConversation::default()).await.unwrap();
    session.message(after, "still alive").await.unwrap();
    session.shutdown().await.unwrap();
    let _ = join.await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn single_flight_fifo_and_no_leaked_slots(c in case()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(run_case(c));
    }
}
