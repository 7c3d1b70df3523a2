//! The JSONL history under load (T4): written from the rollout's gap-free stream, it holds
//! every event of a burst that overruns the live feed, in order, with nothing skipped.

use futures::future::join_all;
use std::sync::Arc;
use tokio::sync::broadcast::error::TryRecvError;
use troupe_actors::history::LocalSummarizer;
use troupe_actors::rollout::FileRolloutStorage;
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::{OpenConversation, SessionId, StoragePolicy};
use troupe_runtime::history_log::{HistoryFeed, HistoryLine, HistoryLog, LineType};
use troupe_runtime::{ScriptedModel, ScriptedReply};

/// Conversations streaming at once.
const CONVERSATIONS: usize = 4;
/// Characters of each reply, streamed two at a time: 1500 chunks a conversation.
const REPLY_CHARS: usize = 3000;
/// Live events a subscriber may fall behind by: far fewer than one reply's chunks.
const CAPACITY: usize = 2;

fn reply_text(n: usize) -> String {
    (0..REPLY_CHARS)
        .map(|i| char::from(b'a' + u8::try_from((i + n) % 26).unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_keeps_every_event_of_a_burst_that_overruns_the_live_feed() {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn RolloutStorage> =
        Arc::new(FileRolloutStorage::new(dir.path().join("rollout")));
    let replies = (0..CONVERSATIONS)
        .map(|n| ScriptedReply::text(reply_text(n)).chunked(2))
        .collect();
    let ports = SessionPorts {
        model: Arc::new(ScriptedModel::new(replies)),
        mcp: None,
        mcp_connector: None,
        exec: None,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: Some(storage.clone()),
        agents: None,
    };
    let config = SessionConfig {
        data_dir: dir.path().to_path_buf(),
        subscriber_capacity: CAPACITY,
        ..SessionConfig::default()
    };
    let session_id = SessionId::new();
    let (session, join) = SessionHandle::start(session_id, config, ports)
        .await
        .unwrap();
    let feed = HistoryFeed::of_session(&session, 0)
        .await
        .unwrap()
        .with_storage(storage);
    let log = HistoryLog::start(&dir.path().join("history"), session_id, feed)
        .await
        .unwrap();
    // A live subscriber that reads nothing: proof that the burst overran the live feed.
    let mut idle = session.subscribe().await.unwrap();

    let mut conversations = Vec::new();
    for _ in 0..CONVERSATIONS {
        let params = OpenConversation {
            storage_policy: StoragePolicy::Full,
            ..OpenConversation::default()
        };
        conversations.push(session.open(params).await.unwrap());
    }
    let replies = join_all(conversations.iter().map(|c| session.message(*c, "stream"))).await;
    let mut texts = Vec::new();
    for reply in replies {
        texts.push(reply.unwrap().text);
    }
    // Every event of the burst published (the Rollout publishes what it has written; a
    // reply can come back before its task's last events are out).
    session.flush().await.unwrap();
    let first = idle.try_recv();
    assert!(
        matches!(first, Err(TryRecvError::Lagged(_))),
        "the live feed must have been overrun for this test to mean anything: {first:?}"
    );
    session.shutdown().await.unwrap();
    join.await.unwrap();
    let summary = log.finish().await.unwrap();

    let lines: Vec<HistoryLine> = std::fs::read_to_string(&summary.path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines.iter().all(|l| l.kind != LineType::Warning),
        "no gap: {:?}",
        lines.iter().find(|l| l.kind == LineType::Warning)
    );
    assert_eq!(lines.first().unwrap().kind, LineType::SessionStart);
    assert_eq!(lines.last().unwrap().kind, LineType::SessionEnd);
    assert_eq!(summary.turns, u32::try_from(CONVERSATIONS).unwrap());
    for (c, text) in conversations.iter().zip(&texts) {
        let mine: Vec<&HistoryLine> = lines
            .iter()
            .filter(|l| l.meta.conversation_id == Some(*c))
            .collect();
        let chunks: Vec<&str> = mine
            .iter()
            .filter(|l| l.kind == LineType::AssistantChunk)
            .map(|l| l.content.as_str())
            .collect();
        assert_eq!(chunks.len(), REPLY_CHARS / 2, "every chunk of {c}");
        assert_eq!(chunks.concat(), *text, "in order");
        let kinds: Vec<LineType> = mine
            .iter()
            .map(|l| l.kind)
            .filter(|k| *k != LineType::AssistantChunk)
            .collect();
        assert_eq!(
            kinds,
            [
                LineType::TurnStart,
                LineType::Assistant,
                LineType::Final,
                LineType::TurnEnd
            ],
            "{c}"
        );
    }
}
