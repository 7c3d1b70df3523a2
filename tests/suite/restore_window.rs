//! Restoring a long conversation reads its window, not its whole record (S6): the history it
//! rebuilds is the one the conversation held (summary and kept items), its turn numbers go
//! on, and the records read are bounded by the history's limits, whatever the length of the
//! conversation. A rollout written without checkpoints (by an older troupe) still restores,
//! from its whole record. Real SQLite; the in-memory storage of `--ephemeral` too.

use std::sync::Arc;
use troupe_actors::history::{HistoryLimits, HistoryStore, LocalSummarizer};
use troupe_actors::rollout::RolloutRecord;
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_actors::{SessionConfig, SessionHandle, SessionPorts};
use troupe_proto::{
    ConversationId, EventKind, HistoryItem, OpenConversation, SessionId, StoragePolicy,
};
use troupe_store::{MemoryRolloutStorage, SqliteRolloutStorage};
use troupe_tests::{RecordingModel, SentRequest};

/// Turns of the long conversation.
const TURNS: usize = 2000;

fn limits() -> HistoryLimits {
    HistoryLimits {
        max_items: 16,
        max_tokens: 100_000,
        segment_items: 4,
    }
}

/// The storage under test, and how many records it has read so far.
#[derive(Clone)]
enum Storage {
    Sqlite(SqliteRolloutStorage),
    Memory(MemoryRolloutStorage),
}

impl Storage {
    fn port(&self) -> Arc<dyn RolloutStorage> {
        match self {
            Self::Sqlite(s) => Arc::new(s.clone()),
            Self::Memory(s) => Arc::new(s.clone()),
        }
    }

    fn records_read(&self) -> u64 {
        match self {
            Self::Sqlite(s) => s.records_read(),
            Self::Memory(s) => s.records_read(),
        }
    }
}

async fn start(
    dir: &std::path::Path,
    storage: Arc<dyn RolloutStorage>,
    session_id: SessionId,
    model: Arc<RecordingModel>,
) -> (SessionHandle, tokio::task::JoinHandle<()>) {
    let mut config = SessionConfig {
        data_dir: dir.to_path_buf(),
        ..SessionConfig::default()
    };
    config.conversation.history = limits();
    let ports = SessionPorts {
        model,
        mcp: None,
        mcp_connector: None,
        exec: None,
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens: Arc::new(troupe_actors::ports::ApproxTokens),
        rollout_storage: Some(storage),
        agents: None,
    };
    SessionHandle::start(session_id, config, ports)
        .await
        .unwrap()
}

fn full() -> OpenConversation {
    OpenConversation {
        storage_policy: StoragePolicy::Full,
        ..OpenConversation::default()
    }
}

fn last_prompt(model: &RecordingModel) -> Vec<HistoryItem> {
    let sent: Vec<SentRequest> = model.sent();
    sent.last().unwrap().prompt.clone()
}

/// What the conversation's history holds after its turns, rebuilt by a history of the same
/// limits fed the same items (each turn: the user's input, the reply).
struct Mirror(HistoryStore);

impl Mirror {
    fn new() -> Self {
        Self(HistoryStore::new(
            limits(),
            Arc::new(LocalSummarizer::default()),
        ))
    }

    /// The prompt of the next turn: the history, then `input`.
    fn prompt(&self, input: &str) -> Vec<HistoryItem> {
        let mut items: Vec<HistoryItem> = self.0.snapshot().iter().cloned().collect();
        items.push(HistoryItem::user(input));
        items
    }
}

/// Runs the long conversation; returns it, the mirror of its history and its records.
async fn long_conversation(
    dir: &std::path::Path,
    storage: &Storage,
    session_id: SessionId,
) -> (ConversationId, Mirror) {
    let model = Arc::new(RecordingModel::new(Vec::new()));
    let (session, join) = start(dir, storage.port(), session_id, model.clone()).await;
    let c = session.open(full()).await.unwrap();
    let mut mirror = Mirror::new();
    for i in 1..=TURNS {
        let input = format!("turn {i}");
        let expected = mirror.prompt(&input);
        let reply = session.message(c, &input).await.unwrap();
        assert_eq!(reply.stats.turn, u32::try_from(i).unwrap());
        if i == TURNS {
            assert_eq!(
                last_prompt(&model),
                expected,
                "the mirror follows the history"
            );
        }
        mirror
            .0
            .append([HistoryItem::user(input), HistoryItem::assistant(reply.text)]);
    }
    session.shutdown().await.unwrap();
    join.await.unwrap();
    (c, mirror)
}

/// Restores `c` in a new incarnation of the session and sends one more turn: its prompt, its
/// turn number, and the records read by the start and the restore.
async fn restore_and_ask(
    dir: &std::path::Path,
    storage: &Storage,
    session_id: SessionId,
    c: ConversationId,
) -> (Vec<HistoryItem>, u32, u64) {
    let model = Arc::new(RecordingModel::new(Vec::new()));
    let before = storage.records_read();
    let (session, join) = start(dir, storage.port(), session_id, model.clone()).await;
    session.restore(c, full()).await.unwrap();
    let read = storage.records_read() - before;
    let reply = session.message(c, "after the restart").await.unwrap();
    session.shutdown().await.unwrap();
    join.await.unwrap();
    (last_prompt(&model), reply.stats.turn, read)
}

fn storages(dir: &std::path::Path) -> Vec<Storage> {
    vec![
        Storage::Sqlite(SqliteRolloutStorage::open(dir.join("rollout.db")).unwrap()),
        Storage::Memory(MemoryRolloutStorage::new()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restoring_a_long_conversation_reads_its_window_and_rebuilds_its_history() {
    let dir = tempfile::tempdir().unwrap();
    for storage in storages(dir.path()) {
        let session_id = SessionId::new();
        let (c, mirror) = long_conversation(dir.path(), &storage, session_id).await;
        let (prompt, turn, read) = restore_and_ask(dir.path(), &storage, session_id, c).await;

        // The summary and the kept items, as the conversation held them.
        assert!(
            matches!(prompt.first(), Some(HistoryItem::Summary { .. })),
            "{:?}",
            prompt.first()
        );
        assert_eq!(prompt, mirror.prompt("after the restart"));
        assert_eq!(
            turn,
            u32::try_from(TURNS + 1).unwrap(),
            "turn numbers go on"
        );

        // Bounded by the window: at most the records of the turns whose items are kept (a
        // turn leaves ten records at most), and the root conversation's few.
        let whole = storage
            .port()
            .read_conversation(session_id, c)
            .unwrap()
            .len() as u64;
        let window_turns = limits().max_items as u64 / 2 + 2;
        assert!(
            read <= window_turns * 10 + 10,
            "read {read} records to restore a conversation of {whole}"
        );
        assert!(whole > 10 * read, "read {read} of {whole}");
        eprintln!("restore read {read} records of a conversation of {whole}");
    }
}

/// A rollout without checkpoints, as troupe wrote before it had them: the same records with
/// every `history_checkpoint` left out.
fn without_checkpoints(records: Vec<RolloutRecord>) -> Vec<RolloutRecord> {
    records
        .into_iter()
        .filter(|r| !matches!(r.event, Some(EventKind::HistoryCheckpoint { .. })))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_without_checkpoints_restores_from_its_whole_record() {
    let dir = tempfile::tempdir().unwrap();
    let written = Storage::Memory(MemoryRolloutStorage::new());
    let session_id = SessionId::new();
    let (c, mirror) = long_conversation(dir.path(), &written, session_id).await;
    let records = written
        .port()
        .read_after(session_id, 0, usize::MAX)
        .unwrap();
    let old = without_checkpoints(records.clone());
    assert!(
        old.len() < records.len(),
        "the conversation wrote checkpoints"
    );

    std::fs::create_dir_all(dir.path().join("old")).unwrap();
    for storage in storages(&dir.path().join("old")) {
        let port = storage.port();
        let mut sink = port.open_sink(session_id).unwrap();
        for r in &old {
            sink.append(r.conversation_id, r).unwrap();
        }
        sink.commit(true, records.last().unwrap().seq).unwrap();
        drop(sink);

        let (prompt, turn, read) = restore_and_ask(dir.path(), &storage, session_id, c).await;
        let whole = old.iter().filter(|r| r.conversation_id == Some(c)).count() as u64;
        assert!(read >= whole, "the whole record is read: {read} of {whole}");
        assert_eq!(
            turn,
            u32::try_from(TURNS + 1).unwrap(),
            "turn numbers go on"
        );
        // The kept items are the conversation's, behind a summary of the rest (written again
        // from the whole record, so its text may differ).
        let expected = mirror.prompt("after the restart");
        assert!(matches!(prompt.first(), Some(HistoryItem::Summary { .. })));
        assert_eq!(prompt.len(), expected.len(), "{prompt:#?}");
        assert_eq!(prompt[1..], expected[1..]);
    }
}
