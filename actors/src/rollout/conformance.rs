//! What every [`RolloutStorage`] must do, as checks any implementation's tests can run:
//!
//! ```ignore
//! #[test]
//! fn rollout_storage_conformance() {
//!     let db = tempfile::tempdir().unwrap();
//!     let path = db.path().join("troupe.db");
//!     troupe_actors::rollout::conformance::run_all(&|| Arc::new(MyStorage::open(&path).unwrap()));
//! }
//! ```
//!
//! `open` must return a new instance over the same backing store each time it is called (a
//! reopen, as after a restart of the process). Each check uses sessions of its own, so they
//! can share one store. A failed check panics with what went wrong.

use super::storage::{RolloutSink, RolloutStorage};
use super::{RecordLevel, RecordMeta, RolloutRecord, downgrade};
use std::sync::Arc;
use troupe_proto::{ConversationId, EventKind, SessionId, TaskId};

/// Opens (or reopens) the storage under test.
pub type Open<'a> = &'a dyn Fn() -> Arc<dyn RolloutStorage>;

/// Runs every check.
pub fn run_all(open: Open<'_>) {
    append_commit_and_read_conversation(open);
    read_after_orders_and_pages(open);
    high_water_keeps_numbers_across_reopen(open);
    sweep_downgrades_old_full_records(open);
    forget_keeps_the_record(open);
    a_reopened_sink_appends_after_the_old_records(open);
    sessions_are_isolated(open);
}

fn ok<T, E: std::fmt::Display>(result: Result<T, E>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(e) => panic!("{what}: {e}"),
    }
}

/// A `Full` record carrying `text`.
pub fn full(
    seq: u64,
    ts_ms: u64,
    conversation_id: Option<ConversationId>,
    text: &str,
) -> RolloutRecord {
    RolloutRecord {
        seq,
        ts_ms,
        conversation_id,
        task_id: Some(TaskId::new()),
        kind: "assistant_message".into(),
        level: RecordLevel::Full,
        event: Some(EventKind::AssistantMessage { text: text.into() }),
        meta: RecordMeta {
            chars: Some(text.len() as u64),
            ..RecordMeta::default()
        },
    }
}

/// A `Headers` record.
pub fn headers(seq: u64, ts_ms: u64, conversation_id: Option<ConversationId>) -> RolloutRecord {
    downgrade(full(seq, ts_ms, conversation_id, "headers"))
}

fn append(sink: &mut dyn RolloutSink, record: &RolloutRecord) {
    ok(sink.append(record.conversation_id, record), "append");
}

fn seqs(records: &[RolloutRecord]) -> Vec<u64> {
    records.iter().map(|r| r.seq).collect()
}

/// Committed records read back as written, per conversation and in `seq` order; session-level
/// records belong to no conversation; an unknown conversation reads empty.
pub fn append_commit_and_read_conversation(open: Open<'_>) {
    let storage = open();
    let session = SessionId::new();
    let (a, b) = (ConversationId::new(), ConversationId::new());
    let mut sink = ok(storage.open_sink(session), "open_sink");
    let written = vec![
        full(1, 10, Some(a), "one"),
        full(2, 11, Some(b), "two"),
        headers(3, 12, None),
        headers(4, 13, Some(a)),
        full(5, 14, Some(a), "five \"quoted\"\nnewline ünïcödé"),
    ];
    for record in &written {
        append(sink.as_mut(), record);
    }
    ok(sink.commit(false, 5), "commit");
    let read_a = ok(storage.read_conversation(session, a), "read_conversation");
    let expected_a: Vec<RolloutRecord> = written
        .iter()
        .filter(|r| r.conversation_id == Some(a))
        .cloned()
        .collect();
    assert_eq!(read_a, expected_a, "conversation a reads back exactly");
    assert_eq!(
        seqs(&ok(storage.read_conversation(session, b), "read b")),
        vec![2]
    );
    assert!(
        ok(
            storage.read_conversation(session, ConversationId::new()),
            "read unknown"
        )
        .is_empty(),
        "an unknown conversation is empty"
    );
    // Visible to another instance too (another reader after the commit).
    let again = open();
    assert_eq!(
        ok(again.read_conversation(session, a), "reread"),
        expected_a
    );
    assert_eq!(ok(again.last_seq(session), "last_seq"), 5);
}

/// `read_after` merges every conversation and the session level in `seq` order, honours
/// `after_seq` and `limit`, and pages through everything exactly once.
pub fn read_after_orders_and_pages(open: Open<'_>) {
    let storage = open();
    let session = SessionId::new();
    let conversations = [
        ConversationId::new(),
        ConversationId::new(),
        ConversationId::new(),
    ];
    let mut sink = ok(storage.open_sink(session), "open_sink");
    let mut expected = Vec::new();
    // Gaps in the numbering: unrecorded events.
    for seq in (1..=120u64).filter(|s| s % 7 != 0) {
        let conversation = match seq % 4 {
            0 => None,
            n => Some(conversations[usize::try_from(n).unwrap_or(0) - 1]),
        };
        let record = if seq % 3 == 0 {
            headers(seq, seq, conversation)
        } else {
            full(seq, seq, conversation, &format!("text {seq}"))
        };
        append(sink.as_mut(), &record);
        expected.push(record);
        if seq % 25 == 0 {
            ok(sink.commit(seq % 50 == 0, seq), "commit");
        }
    }
    ok(sink.commit(true, 120), "commit");
    let all = ok(storage.read_after(session, 0, 1000), "read_after");
    assert_eq!(all, expected, "everything, in seq order");
    assert!(ok(storage.read_after(session, 0, 0), "limit 0").is_empty());
    assert!(ok(storage.read_after(session, 120, 10), "after the end").is_empty());
    assert_eq!(
        seqs(&ok(storage.read_after(session, 13, 3), "after 13")),
        vec![15, 16, 17],
        "strictly after, skipping unrecorded numbers"
    );
    for page_size in [1usize, 7, 50] {
        let mut after = 0;
        let mut paged = Vec::new();
        loop {
            let page = ok(storage.read_after(session, after, page_size), "page");
            assert!(
                page.len() <= page_size,
                "a page holds at most limit records"
            );
            let Some(last) = page.last() else { break };
            after = last.seq;
            let short = page.len() < page_size;
            paged.extend(page);
            if short {
                break;
            }
        }
        assert_eq!(paged, expected, "pages of {page_size} walk everything once");
    }
}

/// Numbers of unrecorded events survive a reopen through the high-water mark; a lower mark
/// never lowers `last_seq`.
pub fn high_water_keeps_numbers_across_reopen(open: Open<'_>) {
    let storage = open();
    let session = SessionId::new();
    assert_eq!(
        ok(storage.last_seq(session), "last_seq of a new session"),
        0
    );
    let conversation = Some(ConversationId::new());
    let mut sink = ok(storage.open_sink(session), "open_sink");
    append(sink.as_mut(), &full(3, 1, conversation, "three"));
    ok(sink.commit(false, 3), "commit");
    assert_eq!(ok(storage.last_seq(session), "last_seq"), 3);
    // Events 4..=9 were not recorded.
    ok(sink.commit(false, 9), "commit high water");
    assert_eq!(
        ok(storage.last_seq(session), "last_seq"),
        9,
        "the high water counts"
    );
    drop(sink);
    let reopened = open();
    assert_eq!(ok(reopened.last_seq(session), "after reopen"), 9);
    let mut sink = ok(reopened.open_sink(session), "reopen sink");
    append(sink.as_mut(), &full(10, 2, conversation, "ten"));
    ok(sink.commit(true, 10), "commit");
    assert_eq!(ok(reopened.last_seq(session), "last_seq"), 10);
    append(sink.as_mut(), &full(11, 3, conversation, "eleven"));
    ok(sink.commit(true, 11), "commit");
    // Only a record, no newer mark: the records say more than the old mark.
    assert_eq!(ok(open().last_seq(session), "after reopen"), 11);
}

/// A sweep downgrades the conversation's `Full` records older than the cutoff, keeps order,
/// numbering and everything else, and is idempotent.
pub fn sweep_downgrades_old_full_records(open: Open<'_>) {
    let storage = open();
    let session = SessionId::new();
    let (swept, other) = (ConversationId::new(), ConversationId::new());
    let mut sink = ok(storage.open_sink(session), "open_sink");
    let records = vec![
        full(1, 100, Some(swept), "old"),
        full(2, 100, Some(other), "other old"),
        headers(3, 100, Some(swept)),
        full(4, 200, Some(swept), "new"),
        full(5, 100, None, "session"),
    ];
    for r in &records {
        append(sink.as_mut(), r);
    }
    ok(sink.commit(true, 5), "commit");
    ok(sink.sweep(swept, 150), "sweep");
    ok(sink.commit(true, 5), "commit");
    let after = ok(storage.read_conversation(session, swept), "read");
    assert_eq!(
        after,
        vec![
            downgrade(records[0].clone()),
            records[2].clone(),
            records[3].clone()
        ],
        "old Full downgraded, the rest kept"
    );
    assert_eq!(
        ok(storage.read_conversation(session, other), "read other"),
        vec![records[1].clone()],
        "other conversations untouched"
    );
    ok(sink.sweep(swept, 150), "sweep twice");
    ok(sink.commit(true, 5), "commit");
    assert_eq!(ok(storage.read_conversation(session, swept), "read"), after);
    // Appends after a sweep land after the swept records.
    append(sink.as_mut(), &full(6, 300, Some(swept), "later"));
    ok(sink.commit(false, 6), "commit");
    assert_eq!(
        seqs(&ok(storage.read_conversation(session, swept), "read")),
        vec![1, 3, 4, 6]
    );
    assert_eq!(
        seqs(&ok(storage.read_after(session, 0, 100), "read_after")),
        vec![1, 2, 3, 4, 5, 6]
    );
    let reopened = open();
    assert!(
        ok(reopened.read_conversation(session, swept), "reread")[0]
            .event
            .is_none(),
        "the downgrade is durable"
    );
}

/// `forget` releases what the sink holds; the records stay readable, and a later append to
/// the same conversation still works.
pub fn forget_keeps_the_record(open: Open<'_>) {
    let storage = open();
    let session = SessionId::new();
    let conversation = ConversationId::new();
    let mut sink = ok(storage.open_sink(session), "open_sink");
    append(sink.as_mut(), &full(1, 1, Some(conversation), "one"));
    ok(sink.forget(conversation), "forget");
    ok(sink.commit(true, 1), "commit");
    assert_eq!(
        seqs(&ok(
            storage.read_conversation(session, conversation),
            "read"
        )),
        vec![1]
    );
    append(sink.as_mut(), &full(2, 2, Some(conversation), "two"));
    ok(sink.commit(true, 2), "commit");
    assert_eq!(
        seqs(&ok(open().read_conversation(session, conversation), "read")),
        vec![1, 2]
    );
}

/// A new sink (a restarted Rollout) appends after what the old one committed.
pub fn a_reopened_sink_appends_after_the_old_records(open: Open<'_>) {
    let session = SessionId::new();
    let id = ConversationId::new();
    let conversation = Some(id);
    {
        let storage = open();
        let mut sink = ok(storage.open_sink(session), "open_sink");
        append(sink.as_mut(), &full(1, 1, conversation, "one"));
        append(sink.as_mut(), &headers(2, 2, None));
        ok(sink.commit(false, 2), "commit");
    }
    let storage = open();
    assert_eq!(ok(storage.last_seq(session), "last_seq"), 2);
    let mut sink = ok(storage.open_sink(session), "reopen sink");
    append(sink.as_mut(), &full(3, 3, conversation, "three"));
    append(sink.as_mut(), &headers(4, 4, None));
    ok(sink.commit(true, 4), "commit");
    assert_eq!(
        seqs(&ok(storage.read_after(session, 0, 100), "read_after")),
        vec![1, 2, 3, 4]
    );
    let records = ok(storage.read_conversation(session, id), "read");
    assert_eq!(seqs(&records), vec![1, 3]);
}

/// Nothing of one session shows in another.
pub fn sessions_are_isolated(open: Open<'_>) {
    let storage = open();
    let (s1, s2) = (SessionId::new(), SessionId::new());
    let conversation = ConversationId::new();
    let mut one = ok(storage.open_sink(s1), "open_sink");
    let mut two = ok(storage.open_sink(s2), "open_sink");
    append(one.as_mut(), &full(1, 1, Some(conversation), "one"));
    ok(one.commit(false, 7), "commit");
    append(two.as_mut(), &headers(1, 1, None));
    ok(two.commit(false, 1), "commit");
    assert_eq!(ok(storage.last_seq(s1), "last_seq"), 7);
    assert_eq!(ok(storage.last_seq(s2), "last_seq"), 1);
    assert!(ok(storage.read_conversation(s2, conversation), "read").is_empty());
    assert_eq!(
        seqs(&ok(storage.read_after(s2, 0, 10), "read_after")),
        vec![1]
    );
    assert!(ok(storage.read_after(SessionId::new(), 0, 10), "unknown").is_empty());
}
