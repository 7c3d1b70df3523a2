//! Resumable event streams and restore after a restart (P1, P4, S10): a client that comes
//! back with the last `seq` it saw gets everything after it that storage keeps, once and in
//! order, also from a new process on the same data; conversations come back with their
//! history, and a task that a crash interrupted is recorded as aborted, not run again.

use futures::StreamExt;
use std::path::Path;
use std::sync::Arc;
use troupe_actors::history::LocalSummarizer;
use troupe_actors::ports::ModelClient;
use troupe_actors::rollout::stream::EventStream;
use troupe_actors::rollout::{RecordLevel, RolloutRecord};
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::{
    ConversationId, EventKind, HistoryItem, OpenConversation, SessionId, StoragePolicy,
};
use troupe_proto::{EventName, WarningCode};
use troupe_runtime::{ScriptedModel, ScriptedReply};
use troupe_tests::RecordingModel;

async fn start(
    dir: &Path,
    session_id: SessionId,
    root_id: Option<ConversationId>,
    model: Arc<dyn ModelClient>,
) -> (SessionHandle, tokio::task::JoinHandle<()>) {
    let config = SessionConfig {
        data_dir: dir.to_path_buf(),
        root_id,
        subscriber_capacity: 4,
        ..SessionConfig::default()
    };
    let ports = SessionPorts {
        model,
        mcp: None,
        mcp_connector: None,
        exec: None,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: None,
        agents: None,
    };
    SessionHandle::start(session_id, config, ports)
        .await
        .unwrap()
}

fn open(policy: StoragePolicy) -> OpenConversation {
    OpenConversation {
        storage_policy: policy,
        ..OpenConversation::default()
    }
}

async fn stored(session: &SessionHandle) -> Vec<RolloutRecord> {
    session.events_after(0, usize::MAX).await.unwrap()
}

/// Takes items until one at or past `until`.
async fn take_until(stream: &mut EventStream, until: u64) -> Vec<RolloutRecord> {
    let mut got = Vec::new();
    while got.last().is_none_or(|r: &RolloutRecord| r.seq < until) {
        got.push(stream.next().await.unwrap().unwrap());
    }
    got
}

fn seqs(records: &[RolloutRecord]) -> Vec<u64> {
    records.iter().map(|r| r.seq).collect()
}

#[tokio::test]
async fn a_stream_from_any_point_yields_every_kept_event_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (session, _join) = start(
        dir.path(),
        SessionId::new(),
        None,
        Arc::new(ScriptedModel::default()),
    )
    .await;
    // Open before anything happens: sees all of it, live, with a buffer of 4 (it lags).
    let mut live = session.events(0).await.unwrap();
    let full = session.open(open(StoragePolicy::Full)).await.unwrap();
    let headers = session
        .open(open(StoragePolicy::HeadersOnly))
        .await
        .unwrap();
    let none = session.open(open(StoragePolicy::None)).await.unwrap();
    for round in 0..3 {
        for c in [full, headers, none] {
            session.message(c, format!("round {round}")).await.unwrap();
        }
    }
    session.flush().await.unwrap();
    let all = stored(&session).await;
    let last = all.last().unwrap().seq;
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
    // Policy None kept no content and no chunk.
    for r in all.iter().filter(|r| r.conversation_id == Some(none)) {
        assert_eq!(r.level, RecordLevel::Minimal, "{r:?}");
    }

    let seen = take_until(&mut live, last).await;
    assert!(
        seen.windows(2).all(|w| w[0].seq < w[1].seq),
        "{:?}",
        seqs(&seen)
    );
    let seen_seqs = seqs(&seen);
    for r in &all {
        assert!(
            seen_seqs.binary_search(&r.seq).is_ok(),
            "stored {} not streamed",
            r.seq
        );
    }

    // Resuming after any point yields exactly what storage kept after it.
    let mut resumed = Vec::new();
    for after in [0, 1, last / 3, last / 2, last - 1] {
        let mut stream = session.events(after).await.unwrap();
        let expected: Vec<RolloutRecord> = all.iter().filter(|r| r.seq > after).cloned().collect();
        assert_eq!(
            take_until(&mut stream, last).await,
            expected,
            "resumed after {after}"
        );
        resumed.push(stream);
    }
    // Then live events follow, without a gap.
    let reply = session.message(full, "after the resume").await.unwrap();
    session.flush().await.unwrap();
    let next = stored(&session).await;
    let newest = next.last().unwrap().seq;
    let stored_after: Vec<u64> = next.iter().map(|r| r.seq).filter(|s| *s > last).collect();
    for stream in &mut resumed {
        let more = take_until(stream, newest).await;
        assert_eq!(seqs(&more), stored_after, "every new event here is stored");
        assert!(more.iter().any(|r| r.task_id == Some(reply.task_id)
            && matches!(r.event, Some(EventKind::TaskFinished { .. }))));
    }
    session.shutdown().await.unwrap();
    // The session is over: so are the streams (a stream that lagged behind the last events
    // says it could not catch up).
    resumed.push(live);
    for mut stream in resumed {
        while let Some(item) = stream.next().await {
            if item.is_err() {
                assert!(stream.next().await.is_none(), "an error is the last item");
                break;
            }
        }
    }
}

#[tokio::test]
async fn a_restarted_session_restores_its_conversations_and_aborts_interrupted_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let session_id = SessionId::new();
    let first = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::default(),
        ScriptedReply::hang(false),
    ]));
    let (session, join) = start(dir.path(), session_id, None, first).await;
    let root = session.root().await.unwrap();
    let c = session.open(open(StoragePolicy::Full)).await.unwrap();
    session.message(c, "remember the lighthouse").await.unwrap();
    let s = session.clone();
    let hung = tokio::spawn(async move { s.message(c, "this one hangs").await });
    let task = loop {
        if let Some(t) = session.tasks(Some(c)).await.unwrap().into_iter().next() {
            break t.task_id;
        }
        tokio::task::yield_now().await;
    };
    session.flush().await.unwrap();
    let seen_before = stored(&session).await;
    let last_before = seen_before.last().unwrap().seq;
    // The process dies: no close, no shutdown.
    session.actor().kill();
    join.await.unwrap();
    assert!(hung.await.unwrap().is_err());

    let model = Arc::new(RecordingModel::new(vec![]));
    let (session, _join) = start(dir.path(), session_id, Some(root), model.clone()).await;
    assert_eq!(session.root().await.unwrap(), root, "the root keeps its id");
    let mut resumed = session.events(last_before).await.unwrap();
    session.restore(c, open(StoragePolicy::Full)).await.unwrap();
    session.restore(c, open(StoragePolicy::Full)).await.unwrap();
    assert_eq!(session.list().await.unwrap(), vec![root, c]);
    session.flush().await.unwrap();

    let all = stored(&session).await;
    assert!(
        all.windows(2).all(|w| w[0].seq < w[1].seq),
        "no number reused"
    );
    assert_eq!(
        &all[..seen_before.len()],
        &seen_before[..],
        "the old record is intact"
    );
    let of_task = |kind: EventName| {
        all.iter()
            .filter(|r| r.task_id == Some(task) && r.kind == kind)
            .collect::<Vec<_>>()
    };
    assert_eq!(of_task(EventName::TaskStarted).len(), 1, "not run again");
    let aborted = of_task(EventName::TaskAborted);
    assert_eq!(aborted.len(), 1);
    assert!(aborted[0].seq > last_before);
    assert!(of_task(EventName::Warning).iter().any(|r| matches!(
        &r.event,
        Some(EventKind::Warning { code, message }) if *code == WarningCode::TaskInterrupted && message.contains("interrupted by a restart")
    )));
    let restarted: Vec<&RolloutRecord> = all
        .iter()
        .filter(|r| r.kind == EventName::ConversationRestarted)
        .collect();
    assert_eq!(
        restarted
            .iter()
            .map(|r| r.conversation_id)
            .collect::<Vec<_>>(),
        vec![Some(root), Some(c)]
    );

    // The client that saw up to `last_before` gets everything after it, once.
    let got = take_until(&mut resumed, all.last().unwrap().seq).await;
    assert_eq!(
        seqs(&got),
        all.iter()
            .map(|r| r.seq)
            .filter(|s| *s > last_before)
            .collect::<Vec<_>>()
    );

    // The history came back.
    session.message(c, "and now?").await.unwrap();
    let prompt = model.sent().pop().unwrap().prompt;
    assert_eq!(
        &prompt[..2],
        &[
            HistoryItem::user("remember the lighthouse"),
            HistoryItem::assistant("You said: remember the lighthouse"),
        ]
    );
    assert_eq!(prompt.last(), Some(&HistoryItem::user("and now?")));
    session.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_stream_follows_a_restarted_rollout() {
    let dir = tempfile::tempdir().unwrap();
    let (session, _join) = start(
        dir.path(),
        SessionId::new(),
        None,
        Arc::new(ScriptedModel::default()),
    )
    .await;
    let c = session.open(open(StoragePolicy::Full)).await.unwrap();
    let mut stream = session.events(0).await.unwrap();
    session.message(c, "before").await.unwrap();
    session.flush().await.unwrap();
    let before = stored(&session).await.last().unwrap().seq;
    let seen = take_until(&mut stream, before).await;

    // The Session restarts a Rollout that stops under it.
    let old = session.services().await.unwrap().rollout;
    old.kill();
    while session.services().await.unwrap().rollout.get_id() == old.get_id() {
        tokio::task::yield_now().await;
    }
    // Conversations learn the new reference from the Session; a message makes sure.
    let c_actor = session.conversation_actor(c).await.unwrap().unwrap();
    let _ = ractor::call!(c_actor, |reply| {
        troupe_actors::conversation::ConversationMsg::Stats { reply }
    })
    .unwrap();
    session.message(c, "after").await.unwrap();
    session.flush().await.unwrap();
    let all = stored(&session).await;
    let after = take_until(&mut stream, all.last().unwrap().seq).await;
    let streamed: Vec<u64> = seqs(&seen).into_iter().chain(seqs(&after)).collect();
    assert!(streamed.windows(2).all(|w| w[0] < w[1]), "{streamed:?}");
    for r in &all {
        assert!(streamed.contains(&r.seq), "stored {} not streamed", r.seq);
    }
    assert!(
        after.iter().any(
            |r| matches!(&r.event, Some(EventKind::TaskStarted { input }) if input == "after")
        )
    );
    // The new Rollout knows the conversation's policy: its content is kept as before.
    assert!(
        all.iter().any(
            |r| matches!(&r.event, Some(EventKind::TaskStarted { input }) if input == "after")
        )
    );
    session.shutdown().await.unwrap();
}

/// T1: the reply names its turn (from 1 per conversation, a compaction is a turn too) and its
/// step count; after a restore that follows a compaction, the next turn continues the
/// numbering: no turn number is given twice, under a policy that keeps content or only
/// headers.
#[tokio::test]
async fn turn_numbers_stay_unique_across_a_compaction_and_a_restore() {
    for policy in [StoragePolicy::Full, StoragePolicy::HeadersOnly] {
        let dir = tempfile::tempdir().unwrap();
        let session_id = SessionId::new();
        let (session, _join) = start(
            dir.path(),
            session_id,
            None,
            Arc::new(ScriptedModel::default()),
        )
        .await;
        let root = session.root().await.unwrap();
        let c = session.open(open(policy)).await.unwrap();
        let mut turns = Vec::new();
        for text in ["one", "two"] {
            let reply = session.message(c, text).await.unwrap();
            assert_eq!(reply.stats.steps, 1, "{reply:?}");
            turns.push(reply.stats.turn);
        }
        turns.push(session.compact(c).await.unwrap().stats.turn);
        turns.push(session.message(c, "three").await.unwrap().stats.turn);
        assert_eq!(turns, [1, 2, 3, 4], "{policy:?}");
        session.shutdown().await.unwrap();

        let (session, _join) = start(
            dir.path(),
            session_id,
            Some(root),
            Arc::new(ScriptedModel::default()),
        )
        .await;
        session.restore(c, open(policy)).await.unwrap();
        let reply = session.message(c, "after the restore").await.unwrap();
        turns.push(reply.stats.turn);
        assert_eq!(turns, [1, 2, 3, 4, 5], "{policy:?}");
        session.flush().await.unwrap();
        // The record agrees: every step names a turn no other task has.
        let mut step_turns = std::collections::BTreeMap::new();
        for r in stored(&session).await {
            if let Some(EventKind::StepStarted { turn, .. }) = r.event {
                let task = step_turns.entry(turn).or_insert(r.task_id);
                assert_eq!(*task, r.task_id, "turn {turn} given twice ({policy:?})");
            }
        }
        session.shutdown().await.unwrap();
    }
}
