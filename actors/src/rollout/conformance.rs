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
use troupe_proto::{ConversationId, EventKind, EventName, SessionId, TaskId};

/// Opens (or reopens) the storage under test.
pub type Open<'a> = &'a dyn Fn() -> Arc<dyn RolloutStorage>;

/// Runs every check.
pub fn run_all(open: Open<'_>) {
    append_commit_and_read_conversation(open);
    read_after_orders_and_pages(open);
    high_water_keeps_numbers_across_reopen(open);
    sweep_due_downgrades_what_is_due_everywhere(open);
    sweep_due_leaves_open_sinks_whole(open);
    forget_keeps_the_record(open);
    a_reopened_sink_appends_after_the_old_records(open);
    sessions_are_isolated(open);
    one_sink_per_session_at_a_time(open);
    a_restore_window_starts_at_the_newest_checkpoint(open);
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
        kind: EventName::AssistantMessage,
        level: RecordLevel::Full,
        event: Some(EventKind::AssistantMessage { text: text.into() }),
        meta: RecordMeta {
            chars: Some(text.len() as u64),
            ..RecordMeta::default()
        },
    }
}

/// A `Full` record written under a `Ttl` policy: due at `expires_ms`.
pub fn ttl(
    seq: u64,
    ts_ms: u64,
    expires_ms: u64,
    conversation_id: Option<ConversationId>,
    text: &str,
) -> RolloutRecord {
    let mut record = full(seq, ts_ms, conversation_id, text);
    record.meta.expires_ms = Some(expires_ms);
    record
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

/// `sweep_due` downgrades every `Full` record due at `now_ms` in every session (one whose sink
/// is gone, as after a process exit, and one whose sink is still open), keeps order, numbering,
/// headers and everything not due, is durable, and is idempotent.
pub fn sweep_due_downgrades_what_is_due_everywhere(open: Open<'_>) {
    let storage = open();
    let (live, gone) = (SessionId::new(), SessionId::new());
    let (a, b, c) = (
        ConversationId::new(),
        ConversationId::new(),
        ConversationId::new(),
    );
    let mut sink = ok(storage.open_sink(live), "open_sink");
    let records = vec![
        ttl(1, 100, 150, Some(a), "due at 150"),
        full(2, 100, Some(b), "full, never due"),
        headers(3, 100, Some(a)),
        ttl(4, 200, 300, Some(a), "due at 300"),
        headers(5, 100, None),
        ttl(6, 100, 200, Some(a), "due at 200, exactly"),
    ];
    for r in &records {
        append(sink.as_mut(), r);
    }
    ok(sink.commit(true, 6), "commit");
    let gone_records = vec![
        ttl(1, 10, 20, Some(c), "closed and due"),
        headers(2, 30, Some(c)),
    ];
    {
        // A closed conversation of a session whose process has exited.
        let mut closed = ok(storage.open_sink(gone), "open_sink");
        for r in &gone_records {
            append(closed.as_mut(), r);
        }
        ok(closed.commit(true, 2), "commit");
    }
    let report = ok(storage.sweep_due(199), "sweep at 199");
    assert_eq!(report.downgraded, 2, "{report:?}");
    assert_eq!(report.failures, 0, "{report:?}");
    assert_eq!(
        ok(storage.read_conversation(gone, c), "read closed"),
        vec![downgrade(gone_records[0].clone()), gone_records[1].clone()],
        "a closed conversation of an ended session is swept"
    );
    let after = ok(storage.read_conversation(live, a), "read a");
    assert_eq!(
        after,
        vec![
            downgrade(records[0].clone()),
            records[2].clone(),
            records[3].clone(),
            records[5].clone(),
        ],
        "due records downgraded, the rest kept as written"
    );
    assert_eq!(after[0].meta.chars, records[0].meta.chars, "headers stay");
    assert_eq!(after[0].meta.expires_ms, None);
    assert_eq!(
        ok(storage.read_conversation(live, b), "read b"),
        vec![records[1].clone()],
        "Full content without an expiry is never swept"
    );
    assert_eq!(
        ok(storage.sweep_due(199), "sweep again").downgraded,
        0,
        "idempotent"
    );
    assert_eq!(ok(storage.read_conversation(live, a), "read a"), after);
    // An expiry equal to the sweep time is due.
    assert_eq!(ok(storage.sweep_due(200), "sweep at 200").downgraded, 1);
    let reopened = open();
    assert_eq!(
        seqs(&ok(reopened.read_after(live, 0, 100), "read_after")),
        vec![1, 2, 3, 4, 5, 6],
        "numbering kept"
    );
    assert_eq!(ok(reopened.last_seq(live), "last_seq"), 6);
    let a_now = ok(reopened.read_conversation(live, a), "reread");
    assert!(
        a_now[0].event.is_none() && a_now[3].event.is_none(),
        "durable"
    );
    assert!(a_now[2].event.is_some(), "not yet due");
    assert_eq!(ok(reopened.sweep_due(300), "sweep at 300").downgraded, 1);
    assert!(
        ok(open().read_conversation(live, a), "reread")
            .iter()
            .all(|r| r.event.is_none()),
        "everything due by 300 is headers"
    );
    drop(sink);
}

/// A sink that stays open across sweeps loses nothing: what it appends after a sweep lands
/// after the swept records, its new Ttl content is swept when due in turn, and sweeping a
/// storage with nothing due changes nothing.
pub fn sweep_due_leaves_open_sinks_whole(open: Open<'_>) {
    let storage = open();
    let session = SessionId::new();
    let id = ConversationId::new();
    let conversation = Some(id);
    let mut sink = ok(storage.open_sink(session), "open_sink");
    append(sink.as_mut(), &ttl(1, 1, 10, conversation, "one"));
    append(sink.as_mut(), &ttl(2, 2, 20, conversation, "two"));
    ok(sink.commit(false, 2), "commit");
    assert_eq!(ok(storage.sweep_due(10), "sweep").downgraded, 1);
    for seq in 3..=5 {
        append(
            sink.as_mut(),
            &ttl(seq, seq, 100 + seq, conversation, &format!("after {seq}")),
        );
        ok(sink.commit(seq == 5, seq), "commit");
        assert_eq!(
            ok(storage.sweep_due(20 + seq), "sweep").downgraded,
            u64::from(seq == 3),
            "seq 2 goes at the first of these sweeps"
        );
    }
    let records = ok(storage.read_conversation(session, id), "read");
    assert_eq!(seqs(&records), vec![1, 2, 3, 4, 5], "nothing lost");
    let full: Vec<u64> = records
        .iter()
        .filter(|r| r.level == RecordLevel::Full)
        .map(|r| r.seq)
        .collect();
    assert_eq!(full, vec![3, 4, 5]);
    assert_eq!(ok(storage.sweep_due(1_000), "sweep all").downgraded, 3);
    append(sink.as_mut(), &full_record_after_sweep(6, conversation));
    ok(sink.commit(true, 6), "commit");
    assert_eq!(
        seqs(&ok(open().read_conversation(session, id), "read")),
        vec![1, 2, 3, 4, 5, 6]
    );
    assert_eq!(
        ok(storage.sweep_due(u64::MAX), "sweep").downgraded,
        0,
        "nothing left to sweep"
    );
}

fn full_record_after_sweep(seq: u64, conversation_id: Option<ConversationId>) -> RolloutRecord {
    full(seq, seq, conversation_id, "after every sweep")
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

/// A session has one open sink at a time: a second one (a Rollout restarted while its killed
/// predecessor's writer still commits) opens once the first is dropped or abandoned, so it
/// never reads `last_seq` under a writer. Other sessions are not held up.
pub fn one_sink_per_session_at_a_time(open: Open<'_>) {
    use std::time::Duration;
    let storage = open();
    let session = SessionId::new();
    let first = ok(storage.open_sink(session), "open_sink");
    let other = ok(
        storage.open_sink(SessionId::new()),
        "another session's sink",
    );
    let (opened_tx, opened) = std::sync::mpsc::channel();
    let waiting = {
        let storage = storage.clone();
        std::thread::spawn(move || {
            let sink = storage.open_sink(session);
            let _ = opened_tx.send(());
            sink.map(|s| s.abandon())
        })
    };
    assert!(
        opened.recv_timeout(Duration::from_millis(200)).is_err(),
        "a second sink of the session opened while the first was open"
    );
    drop(first);
    assert!(
        opened.recv_timeout(Duration::from_secs(10)).is_ok(),
        "the second sink did not open once the first was dropped"
    );
    let joined = waiting.join().unwrap_or_else(|_| panic!("waiter panicked"));
    ok(joined, "second open_sink");
    // The second one was abandoned, as by a crash: its lease is free again.
    let third = ok(
        storage.open_sink(session),
        "open_sink after an abandoned sink",
    );
    drop(third);
    drop(other);
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

/// A record of `task` in `conversation_id`: its start, or a step's message.
fn task_record(
    seq: u64,
    conversation_id: ConversationId,
    task: TaskId,
    start: bool,
) -> RolloutRecord {
    let (kind, event) = if start {
        (
            EventName::TaskStarted,
            EventKind::TaskStarted {
                input: format!("input {seq}"),
            },
        )
    } else {
        (
            EventName::AssistantMessage,
            EventKind::AssistantMessage {
                text: format!("reply {seq}"),
            },
        )
    };
    RolloutRecord {
        task_id: Some(task),
        kind,
        event: Some(event),
        ..full(seq, seq, Some(conversation_id), "")
    }
}

/// A `history_checkpoint` of `conversation_id` naming `from_task`.
fn checkpoint(
    seq: u64,
    conversation_id: ConversationId,
    from_task: Option<TaskId>,
) -> RolloutRecord {
    RolloutRecord {
        task_id: None,
        kind: EventName::HistoryCheckpoint,
        event: Some(EventKind::HistoryCheckpoint {
            summary: Some(format!("summary {seq}")),
            replaced_items: seq,
            from_task,
            skip_items: 1,
            turns: 2,
            stats: troupe_proto::ConversationStats::default(),
        }),
        ..full(seq, seq, Some(conversation_id), "")
    }
}

/// `read_conversation_window` (S6): from the start of the task the conversation's newest
/// checkpoint names (other conversations' records left out), from that checkpoint when it
/// names none, everything without one; a checkpoint reduced to headers (its summary swept)
/// still says where. The same as the whole record cut at [`super::window_start`].
pub fn a_restore_window_starts_at_the_newest_checkpoint(open: Open<'_>) {
    let storage = open();
    let session = SessionId::new();
    let (a, b, c, d) = (
        ConversationId::new(),
        ConversationId::new(),
        ConversationId::new(),
        ConversationId::new(),
    );
    let (t1, t2, t3, u1) = (TaskId::new(), TaskId::new(), TaskId::new(), TaskId::new());
    let written = vec![
        task_record(1, a, t1, true),
        task_record(2, a, t1, false),
        checkpoint(3, a, Some(t1)),
        task_record(4, b, u1, true),
        task_record(5, a, t2, true),
        task_record(6, a, t2, false),
        task_record(7, b, u1, false),
        checkpoint(8, a, Some(t2)),
        checkpoint(9, b, None),
        task_record(10, a, t3, true),
        task_record(11, b, u1, false),
        task_record(12, c, u1, true),
        downgrade(checkpoint(13, c, None)),
        // A checkpoint that names a task none of whose records is there: everything.
        checkpoint(14, d, Some(t1)),
    ];
    let mut sink = ok(storage.open_sink(session), "open_sink");
    for record in &written {
        append(sink.as_mut(), record);
    }
    ok(sink.commit(false, 14), "commit");
    let window = |conversation| {
        seqs(&ok(
            storage.read_conversation_window(session, conversation),
            "read_conversation_window",
        ))
    };
    assert_eq!(
        window(a),
        vec![5, 6, 8, 10],
        "from the newest checkpoint's task"
    );
    assert_eq!(
        window(b),
        vec![9, 11],
        "from a checkpoint that names no task"
    );
    assert_eq!(window(c), vec![13], "a checkpoint without its summary");
    assert_eq!(window(d), vec![14], "the named task's start is missing");
    assert!(window(ConversationId::new()).is_empty());
    for conversation in [a, b, c, d] {
        let whole = ok(storage.read_conversation(session, conversation), "read");
        let start = super::window_start(&whole);
        assert_eq!(
            ok(
                storage.read_conversation_window(session, conversation),
                "window"
            ),
            whole[start..].to_vec(),
            "the same as window_start"
        );
    }
}
