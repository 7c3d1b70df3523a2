//! No self-lock (A4): a cycle and a chain deeper than the limit are refused before they run,
//! naming the chain; an expired lease is reclaimed and its child cancelled; with a single
//! scheduler slot for the whole session a parent that waits for its child does not lock
//! itself; and a child that ended, however it ended, holds no slot.

use super::{Team, agent_kinds, model_agent, settings};
use serde_json::json;
use std::time::Duration;
use troupe_actors::agents::RouterMode;
use troupe_actors::scheduler::{SchedulerMsg, SchedulerSnapshot};
use troupe_proto::agent::{DispatchStatus, PolicyReason};
use troupe_proto::{ErrorKind, EventKind, TaskStatus, WarningCode};
use troupe_runtime::ScriptedReply;

fn dispatch(agent_id: &str, input: &str) -> ScriptedReply {
    ScriptedReply::tool(
        "dispatch_agent",
        json!({"agent_id": agent_id, "input": input}),
    )
}

fn one_slot(config: &mut troupe_actors::SessionConfig) {
    config.scheduler.limit = 1;
}

async fn scheduler(team: &Team) -> SchedulerSnapshot {
    let services = team.session.services().await.unwrap();
    ractor::call!(services.scheduler, |reply| SchedulerMsg::Snapshot { reply }).unwrap()
}

fn rejections(events: &[EventKind]) -> Vec<(PolicyReason, Vec<String>, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::PolicyRejected {
                reason,
                chain,
                message,
                ..
            } => Some((*reason, chain.0.clone(), message.clone())),
            _ => None,
        })
        .collect()
}

/// The first task of `conversation` (its running one).
async fn first_task(
    team: &Team,
    conversation: troupe_proto::ConversationId,
) -> troupe_proto::TaskId {
    team.session
        .tasks(Some(conversation))
        .await
        .unwrap()
        .remove(0)
        .task_id
}

/// The running task of an agent (a conversation other than `root`), once the model has been
/// called `calls` times in all.
async fn agents_task_at_its_model(
    team: &Team,
    root: troupe_proto::ConversationId,
    calls: usize,
) -> troupe_proto::TaskInfo {
    loop {
        let tasks = team.session.tasks(None).await.unwrap();
        if let Some(child) = tasks.iter().find(|t| t.conversation_id != root)
            && team.model.sent().len() == calls
        {
            return child.clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (2 s at most) until no task of the session runs, then sees none does and that the
/// scheduler holds and queues nothing; `child` names the agent's task in the failure.
async fn nothing_runs_or_waits(team: &Team, child: troupe_proto::TaskId) {
    for _ in 0..200 {
        if team.session.tasks(None).await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        team.session.tasks(None).await.unwrap().is_empty(),
        "the agent's task {child} still runs"
    );
    let snapshot = scheduler(team).await;
    assert!(
        snapshot.running.is_empty() && snapshot.waiting.is_empty(),
        "{snapshot:?}"
    );
}

fn results(events: &[EventKind]) -> Vec<(String, DispatchStatus)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::DispatchResult {
                agent_id, status, ..
            } => Some((agent_id.clone(), *status)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_cycle_is_refused_before_it_runs_naming_the_chain() {
    // a may dispatch to b and b to a: a → b → a would never end.
    let team = Team::start(
        vec![model_agent("a", "A", &["b"]), model_agent("b", "B", &["a"])],
        vec![
            dispatch("b", "ask a"),
            dispatch("a", "back to a"),
            ScriptedReply::text("b gave up"),
            ScriptedReply::text("a done"),
        ],
    )
    .await;
    let reply = team.send("/hub a go").await;
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "a done")
    );
    let events = team.events().await;
    let rejected = rejections(&events);
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    let (reason, chain, message) = &rejected[0];
    assert_eq!(*reason, PolicyReason::Cycle);
    assert_eq!(chain, &["supervisor", "a", "b", "a"]);
    assert!(
        message.contains("supervisor → a → b") && message.contains("cycle"),
        "{message}"
    );
    // Only a and b ran; the refused dispatch left nothing in flight.
    assert_eq!(
        results(&events),
        [
            ("b".to_owned(), DispatchStatus::Ok),
            ("a".to_owned(), DispatchStatus::Ok)
        ]
    );
    assert_eq!(
        agent_kinds(&events)
            .iter()
            .filter(|k| **k == "dispatch_sent")
            .count(),
        2
    );
    // b's model saw the refusal as its tool call's observation, and went on.
    let sent = team.model.sent();
    assert_eq!(sent.len(), 4, "no model call for the refused dispatch");
    let observation = format!("{:?}", sent[2].prompt);
    assert!(
        observation.contains("already in the execution chain"),
        "{observation}"
    );
    assert!(scheduler(&team).await.running.is_empty());
}

#[tokio::test]
async fn a_chain_deeper_than_the_limit_is_refused() {
    // a → b → c → d → e: the dispatch to e would be the fifth, over the default limit of 4.
    let team = Team::start(
        vec![
            model_agent("a", "A", &["b"]),
            model_agent("b", "B", &["c"]),
            model_agent("c", "C", &["d"]),
            model_agent("d", "D", &["e"]),
            model_agent("e", "E", &[]),
        ],
        vec![
            dispatch("b", "to b"),
            dispatch("c", "to c"),
            dispatch("d", "to d"),
            dispatch("e", "to e"),
            ScriptedReply::text("d alone"),
            ScriptedReply::text("c done"),
            ScriptedReply::text("b done"),
            ScriptedReply::text("a done"),
        ],
    )
    .await;
    let reply = team.send("/hub a go deep").await;
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "a done")
    );
    let events = team.events().await;
    let rejected = rejections(&events);
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    let (reason, chain, message) = &rejected[0];
    assert_eq!(*reason, PolicyReason::Depth);
    assert_eq!(chain, &["supervisor", "a", "b", "c", "d", "e"]);
    assert!(
        message.contains("5 deep") && message.contains("limit of 4"),
        "{message}"
    );
    let depths: Vec<usize> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::DispatchSent { chain, .. } => Some(chain.depth()),
            _ => None,
        })
        .collect();
    assert_eq!(depths, [1, 2, 3, 4], "e never ran");
    assert!(
        results(&events)
            .iter()
            .all(|(_, s)| *s == DispatchStatus::Ok)
    );
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_is_reclaimed_and_its_child_cancelled() {
    let mut s = settings(RouterMode::Rules);
    s.lease_ttl = Duration::from_secs(20);
    let team = Team::start_with(
        vec![model_agent("slow", "S", &[])],
        // The first dispatch's model call never ends by itself; the second answers.
        vec![ScriptedReply::hang(true), ScriptedReply::text("quick")],
        s,
        one_slot,
    )
    .await;
    let started = tokio::time::Instant::now();
    let reply = team.send("/hub slow take your time").await;
    // Answered when the lease expired, not when the agent ended (it never would have).
    assert_eq!(started.elapsed(), Duration::from_secs(20));
    assert_eq!(reply.status, TaskStatus::Error);
    let error = reply.error.unwrap();
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
    assert!(error.to_string().contains("slow"), "{error}");

    // The child's task is cancelled: its conversation reports it, and its slot is free.
    let child_cancelled = |events: &[EventKind]| {
        events.iter().any(|e| {
            matches!(
                e,
                EventKind::TaskFinished {
                    status: TaskStatus::Cancelled,
                    ..
                }
            )
        })
    };
    let mut events = team.events().await;
    for _ in 0..100 {
        if child_cancelled(&events) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        events = team.events().await;
    }
    assert!(child_cancelled(&events), "{:?}", agent_kinds(&events));
    assert_eq!(results(&events), [("slow".into(), DispatchStatus::Expired)]);
    let warning = events
        .iter()
        .find_map(|e| match e {
            EventKind::Warning {
                code: WarningCode::LeaseExpired,
                message,
            } => Some(message.clone()),
            _ => None,
        })
        .expect("a lease_expired warning");
    assert!(
        warning.contains("`slow`") && warning.contains("20000 ms"),
        "{warning}"
    );
    let snapshot = scheduler(&team).await;
    assert!(
        snapshot.running.is_empty() && snapshot.waiting.is_empty(),
        "{snapshot:?}"
    );

    // The lease is reclaimed: the agent takes the next dispatch at once.
    let again = team.send("/hub slow now quickly").await;
    assert_eq!(
        (again.status, again.text.as_str()),
        (TaskStatus::Ok, "quick")
    );
    assert_eq!(
        results(&team.events().await),
        [
            ("slow".into(), DispatchStatus::Expired),
            ("slow".into(), DispatchStatus::Ok)
        ]
    );
}

/// A dispatch sent straight to the agent's conversation (the binding's second) is answered
/// by whoever ends it first: here the hub, when the lease expires; the agent's task, cancelled
/// then, ends without a second `dispatch_result`, and the next dispatch is its own.
#[tokio::test(start_paused = true)]
async fn an_expired_lease_of_a_direct_dispatch_is_answered_once() {
    let mut s = settings(RouterMode::Rules);
    s.lease_ttl = Duration::from_secs(20);
    let team = Team::start_with(
        vec![model_agent("slow", "S", &[])],
        vec![
            ScriptedReply::text("bound"),
            ScriptedReply::hang(true),
            ScriptedReply::text("quick"),
        ],
        s,
        one_slot,
    )
    .await;
    assert_eq!(team.send("/hub slow bind").await.text, "bound");
    // The hub looks the agent's conversation up after the first dispatch (off its mailbox).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = tokio::time::Instant::now();
    let reply = team.send("/hub slow take your time").await;
    assert_eq!(started.elapsed(), Duration::from_secs(20));
    assert_eq!(reply.error.map(|e| e.kind()), Some(ErrorKind::Timeout));
    let cancelled_children = |events: &[EventKind]| {
        events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    EventKind::TaskFinished {
                        status: TaskStatus::Cancelled,
                        ..
                    }
                )
            })
            .count()
    };
    let mut events = team.events().await;
    for _ in 0..100 {
        if cancelled_children(&events) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        events = team.events().await;
    }
    assert_eq!(cancelled_children(&events), 1, "{:?}", agent_kinds(&events));
    let again = team.send("/hub slow now quickly").await;
    assert_eq!(
        (again.status, again.text.as_str()),
        (TaskStatus::Ok, "quick")
    );
    assert_eq!(
        results(&team.events().await),
        [
            ("slow".into(), DispatchStatus::Ok),
            ("slow".into(), DispatchStatus::Expired),
            ("slow".into(), DispatchStatus::Ok)
        ]
    );
}

/// How children are scheduled: a dispatcher lends its slot to its in-process child's task
/// for the dispatch and goes on with it once the child has answered; the child's task asks
/// for none. With one slot for the whole session (every conversation, every agent), a
/// supervisor that routes with its model, a lead that delegates and its worker all run in
/// turn, on the root task's one grant.
#[tokio::test(start_paused = true)]
async fn with_a_single_slot_a_parent_waiting_for_its_child_does_not_lock_the_session() {
    let team = Team::start_with(
        vec![
            model_agent("lead", "L", &["worker"]),
            model_agent("worker", "W", &[]),
        ],
        vec![
            ScriptedReply::tool(
                "route",
                json!({"decision": "dispatch_agent", "agent_id": "lead", "confidence": 0.9}),
            ),
            dispatch("worker", "do the part"),
            ScriptedReply::text("part done").delayed(Duration::from_secs(1)),
            ScriptedReply::text("all done"),
        ],
        settings(RouterMode::Model),
        one_slot,
    )
    .await;
    assert_eq!(scheduler(&team).await.limit, 1);
    // While the worker answers (its reply takes a second), the scheduler holds one grant,
    // the root task's, lent down the chain; nothing waits for a slot.
    let (reply, during) = tokio::join!(team.send("build it"), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        scheduler(&team).await
    });
    assert_eq!(
        (reply.status, reply.text.as_str()),
        (TaskStatus::Ok, "all done")
    );
    assert_eq!(during.running, [reply.task_id], "{during:?}");
    assert!(during.waiting.is_empty(), "{during:?}");
    let events = team.events().await;
    assert_eq!(
        results(&events),
        [
            ("worker".into(), DispatchStatus::Ok),
            ("lead".into(), DispatchStatus::Ok)
        ]
    );
    // Three tasks ran (root, lead, worker), each model call alone.
    let finished = events
        .iter()
        .filter(|e| matches!(e, EventKind::TaskFinished { .. }))
        .count();
    assert_eq!(finished, 3);
    assert_eq!(team.model.sent().len(), 4);
    let snapshot = scheduler(&team).await;
    assert!(
        snapshot.running.is_empty() && snapshot.waiting.is_empty(),
        "{snapshot:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_or_cancelled_child_keeps_no_slot() {
    let team = Team::start_with(
        vec![model_agent("worker", "W", &[])],
        vec![
            ScriptedReply::error("the model broke"),
            ScriptedReply::hang(true),
        ],
        settings(RouterMode::Rules),
        one_slot,
    )
    .await;
    // A child that fails: the dispatcher hears why, and no slot stays held.
    let failed = team.send("/hub worker try").await;
    assert_eq!(failed.status, TaskStatus::Error);
    assert!(
        failed
            .error
            .as_ref()
            .unwrap()
            .to_string()
            .contains("the model broke"),
        "{:?}",
        failed.error
    );
    let snapshot = scheduler(&team).await;
    assert!(snapshot.running.is_empty(), "{snapshot:?}");

    // A child cancelled with its dispatcher: both end, no slot stays held.
    let root = team.session.root().await.unwrap();
    let session = team.session.clone();
    let running =
        tokio::spawn(async move { session.message(root, "/hub worker wait forever").await });
    let child = agents_task_at_its_model(&team, root, 2).await;
    let parent = first_task(&team, root).await;
    team.session.cancel_task(parent).await.unwrap();
    let cancelled = running.await.unwrap().unwrap();
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    nothing_runs_or_waits(&team, child.task_id).await;
    let events = team.events().await;
    assert_eq!(
        results(&events),
        [
            ("worker".into(), DispatchStatus::Error),
            ("worker".into(), DispatchStatus::Cancelled)
        ]
    );
    // The session goes on with its single slot: the same agent answers the next dispatch.
    let next = team.send("/hub worker hello again").await;
    assert_eq!(
        (next.status, next.text.as_str()),
        (TaskStatus::Ok, "You said: hello again")
    );
}

/// A hub that stops without its `post_stop` (killed here, as when it fails) takes its
/// dispatches with it: the dispatcher hears at once, the agent's task is cancelled (not left
/// running on the slot its dispatcher lent it), and the hub the Session starts in its place
/// takes the next dispatch.
#[tokio::test]
async fn a_hub_that_fails_leaves_no_agent_task_running() {
    let team = Team::start_with(
        vec![model_agent("slow", "S", &[])],
        vec![ScriptedReply::hang(true), ScriptedReply::text("quick")],
        settings(RouterMode::Rules),
        one_slot,
    )
    .await;
    let root = team.session.root().await.unwrap();
    let session = team.session.clone();
    let running =
        tokio::spawn(async move { session.message(root, "/hub slow take your time").await });
    let child = agents_task_at_its_model(&team, root, 1).await;
    let hub = team.session.services().await.unwrap().agents.unwrap();
    hub.kill();
    let reply = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the dispatcher hears at once")
        .unwrap()
        .unwrap();
    assert_eq!(
        reply.error.as_ref().map(troupe_proto::AgentError::kind),
        Some(ErrorKind::Interrupted),
        "{reply:?}"
    );
    nothing_runs_or_waits(&team, child.task_id).await;
    let next = team.send("/hub slow now quickly").await;
    assert_eq!((next.status, next.text.as_str()), (TaskStatus::Ok, "quick"));
}

/// A dispatch queued behind another task of its agent's conversation ends `cancelled` as soon
/// as its dispatcher is cancelled (its lease and wait released then), not when the task ahead
/// of it ends or its lease expires.
#[tokio::test]
async fn a_queued_dispatch_ends_as_soon_as_its_dispatcher_is_cancelled() {
    let team = Team::start_with(
        vec![model_agent("worker", "W", &[])],
        vec![ScriptedReply::text("bound"), ScriptedReply::hang(true)],
        settings(RouterMode::Rules),
        |config| config.scheduler.limit = 4,
    )
    .await;
    assert_eq!(team.send("/hub worker bind").await.text, "bound");
    // The agent's conversation is busy with a task that does not end.
    let root = team.session.root().await.unwrap();
    let session = team.session.clone();
    let busy = tokio::spawn(async move { session.message(root, "/hub worker hang").await });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while team.model.sent().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never got busy"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Another conversation's dispatch to it waits behind that task.
    let other = team
        .session
        .open(troupe_proto::OpenConversation::default())
        .await
        .unwrap();
    let session = team.session.clone();
    let queued = tokio::spawn(async move { session.message(other, "/hub worker later").await });
    let sent = |events: &[EventKind]| {
        events
            .iter()
            .filter(|e| matches!(e, EventKind::DispatchSent { .. }))
            .count()
    };
    while sent(&team.events().await) < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the third dispatch was never sent"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let dispatcher = first_task(&team, other).await;
    team.session.cancel_task(dispatcher).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(20), queued)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply.status, TaskStatus::Cancelled);
    // Its dispatch ended with it, while the agent is still busy with the first.
    let ended = loop {
        let r = results(&team.events().await);
        if r.len() == 2 {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cancelled dispatch never ended: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        ended,
        [
            ("worker".into(), DispatchStatus::Ok),
            ("worker".into(), DispatchStatus::Cancelled)
        ]
    );
    assert!(!busy.is_finished(), "the first dispatch still runs");
    let first = first_task(&team, root).await;
    team.session.cancel_task(first).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(20), busy).await;
}

/// A team with one in-process agent, `coder`, that answers "opened by the second" (leases of
/// a minute), its hub, and a request to `coder` made as the hub would take it from the root
/// conversation's task, under `cancel`.
async fn coder_and_its_hub() -> (
    Team,
    ractor::ActorRef<troupe_actors::agents::hub::AgentHubMsg>,
    impl Fn(&str, tokio_util::sync::CancellationToken) -> troupe_actors::agents::hub::DispatchRequest,
) {
    let mut s = settings(RouterMode::Rules);
    s.lease_ttl = Duration::from_secs(60);
    let team = Team::start_with(
        vec![model_agent("coder", "C", &[])],
        vec![ScriptedReply::text("opened by the second")],
        s,
        |_| {},
    )
    .await;
    let hub = team.session.services().await.unwrap().agents.unwrap();
    let root = team.session.root().await.unwrap();
    let request = move |input: &str, cancel| troupe_actors::agents::hub::DispatchRequest {
        agent_id: "coder".into(),
        input: input.into(),
        chain: troupe_proto::agent::ExecutionChain::start("user"),
        by_human: true,
        parent: troupe_actors::agents::DispatchParent {
            conversation_id: root,
            task_id: troupe_proto::TaskId::new(),
        },
        parent_dispatch: None,
        cancel,
        span: tracing::Span::none(),
        governance: Default::default(),
        slot: troupe_actors::task::SlotLease::kept(),
        tool_config: Default::default(),
        token_book: None,
        storage_policy: troupe_proto::StoragePolicy::Full,
    };
    (team, hub, request)
}

/// A first dispatch to an agent that is cancelled before its work began (its dispatcher's
/// token already cancelled when the hub takes it) still reports that it will not open the
/// agent's binding: the next dispatch opens it and is answered, instead of waiting for the
/// first to bind until its lease expires.
#[tokio::test(start_paused = true)]
async fn a_first_dispatch_cancelled_before_it_ran_leaves_the_binding_to_the_next() {
    use troupe_actors::agents::hub::AgentHubMsg;
    let (team, hub, request) = coder_and_its_hub().await;
    let cancel = tokio_util::sync::CancellationToken::new();
    cancel.cancel();
    let first = ractor::call!(hub, |reply| AgentHubMsg::Dispatch {
        request: request("never runs", cancel),
        reply,
    })
    .unwrap();
    let error = first.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Cancelled, "{error}");

    let started = tokio::time::Instant::now();
    let reply = team.send("/hub coder now").await;
    assert_eq!(reply.status, TaskStatus::Ok, "{reply:?}");
    assert_eq!(reply.text, "opened by the second");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "answered at once, not when the lease expired"
    );
}

/// Two dispatches to an agent whose binding is not open yet: the first, to open it, is
/// cancelled before it ran; the second, waiting for that open, is handed it and answered,
/// instead of ending `cancelled` with the first.
#[tokio::test(start_paused = true)]
async fn a_dispatch_waiting_for_an_opener_that_stopped_opens_the_binding_itself() {
    use troupe_actors::agents::hub::AgentHubMsg;
    let (team, hub, request) = coder_and_its_hub().await;
    let cancelled = tokio_util::sync::CancellationToken::new();
    cancelled.cancel();
    // Both are in the hub's mailbox before it takes the first: the second waits for the
    // first's open.
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let (second_tx, second_rx) = tokio::sync::oneshot::channel();
    hub.cast(AgentHubMsg::Dispatch {
        request: request("never runs", cancelled),
        reply: first_tx.into(),
    })
    .unwrap();
    hub.cast(AgentHubMsg::Dispatch {
        request: request("runs", tokio_util::sync::CancellationToken::new()),
        reply: second_tx.into(),
    })
    .unwrap();
    let first = first_rx.await.unwrap();
    assert_eq!(first.unwrap_err().kind(), ErrorKind::Cancelled);
    let started = tokio::time::Instant::now();
    let second = second_rx
        .await
        .unwrap()
        .expect("the second dispatch is answered");
    assert_eq!(second.text, "opened by the second");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "not by its lease"
    );
    let bindings = team.session.agents().await.unwrap();
    let coder = bindings.iter().find(|a| a.id == "coder").unwrap();
    assert_eq!(coder.bindings.len(), 1, "{coder:?}");
}

/// The dispatching task's conversation fails (a panic) while its in-process agent works: the
/// agent's task is cancelled with it, and its dispatch ends `cancelled`, instead of running on
/// the slot its dispatcher lent it, which the scheduler gives out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_task_ends_when_its_dispatchers_conversation_fails() {
    let team = Team::start_with(
        vec![model_agent("worker", "W", &[])],
        vec![ScriptedReply {
            hang: true,
            ..ScriptedReply::default()
        }],
        settings(RouterMode::Rules),
        one_slot,
    )
    .await;
    let root = team.session.root().await.unwrap();
    let session = team.session.clone();
    let _waiting = tokio::spawn(async move { session.message(root, "/hub worker go").await });
    let t0 = std::time::Instant::now();
    let worker_task = loop {
        let tasks = team.session.tasks(None).await.unwrap();
        if let Some(t) = tasks.iter().find(|t| t.conversation_id != root) {
            break t.task_id;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the worker never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    team.session
        .conversation_actor(root)
        .await
        .unwrap()
        .unwrap()
        .cast(troupe_actors::conversation::ConversationMsg::InjectPanic)
        .unwrap();
    loop {
        let tasks = team.session.tasks(None).await.unwrap();
        if !tasks.iter().any(|t| t.task_id == worker_task) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the worker's task still runs: {tasks:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let events = team.events().await;
    assert_eq!(
        results(&events),
        [("worker".into(), DispatchStatus::Cancelled)]
    );
}

/// An in-process agent runs its commands under approval and sandbox policies no wider than
/// its dispatcher's (C2): a conversation that narrowed the session's to `always` and
/// `read-only` does not get its agent's commands run unasked, nor writing (the agent's
/// conversation had the session's `never` and `full-access`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_runs_commands_under_its_dispatchers_narrower_policies() {
    fn narrowed(approval: troupe_proto::ApprovalPolicy) -> fn(&mut troupe_actors::SessionConfig) {
        fn always(c: &mut troupe_actors::SessionConfig) {
            base(c, troupe_proto::ApprovalPolicy::Always);
        }
        fn never(c: &mut troupe_actors::SessionConfig) {
            base(c, troupe_proto::ApprovalPolicy::Never);
        }
        fn base(c: &mut troupe_actors::SessionConfig, approval: troupe_proto::ApprovalPolicy) {
            c.conversation.shell_tool = true;
            c.conversation.approval_policy = troupe_proto::ApprovalPolicy::Never;
            c.conversation.sandbox_policy = troupe_proto::SandboxPolicy::FullAccess;
            c.approval_timeout = Duration::from_millis(300);
            c.root.approval_policy = Some(approval);
            c.root.sandbox_policy = Some(troupe_proto::SandboxPolicy::ReadOnly);
        }
        match approval {
            troupe_proto::ApprovalPolicy::Always => always,
            _ => never,
        }
    }
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("written");
    let write = ScriptedReply::tool(
        "shell",
        json!({"command": ["sh", "-c", format!("echo ran > {}", target.display())]}),
    );
    let extras = || super::Extras {
        token_book: None,
        exec: true,
        ..Default::default()
    };
    let coder = || vec![model_agent("coder", "You run commands.", &[])];

    // `always` from the dispatcher: the agent's command waits for a human, none comes.
    let team = Team::start_extra(
        coder(),
        vec![write.clone(), ScriptedReply::text("asked")],
        narrowed(troupe_proto::ApprovalPolicy::Always),
        extras(),
    )
    .await;
    assert_eq!(team.send("/hub coder write it").await.text, "asked");
    let events = team.events().await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, EventKind::ApprovalRequested { .. })),
        "{:?}",
        agent_kinds(&events)
    );
    assert!(!target.exists(), "nobody approved it");

    // `never` and `read-only` from the dispatcher: it runs unasked, inside the sandbox.
    let team = Team::start_extra(
        coder(),
        vec![write, ScriptedReply::text("tried")],
        narrowed(troupe_proto::ApprovalPolicy::Never),
        extras(),
    )
    .await;
    assert_eq!(team.send("/hub coder write it").await.text, "tried");
    let events = team.events().await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, EventKind::ApprovalRequested { .. })),
        "{:?}",
        agent_kinds(&events)
    );
    assert!(
        !target.exists(),
        "the read-only sandbox kept it from writing"
    );
}
