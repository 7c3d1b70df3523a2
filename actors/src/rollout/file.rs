//! The JSONL directory storage of the rollout: the default, used by `troupe chat`.
//!
//! Layout under the root: `<root>/<session_id>/` (created lazily, mode 0700) holds
//! `<conversation_id>.jsonl` per conversation and `session.jsonl` for session-level records,
//! one JSON [`RolloutRecord`] per line in `seq` order (files 0600), and `high_water`: the
//! highest `seq` assigned when it was above every recorded one (numbers of events the policy
//! did not record), one fixed-width decimal overwritten in place.
//!
//! The sink ([`FileSink`]) appends through buffers, written to the OS at every commit; a commit
//! with `sync` fsyncs every file holding unsynced lines (`sync_data`), the high-water file and
//! the directory when a file was created. At most [`MAX_OPEN_FILES`] files are open at once
//! (the least recently used is closed, fsynced first if it holds unsynced lines). A line torn
//! by a crash is skipped on read, and the next append starts on a line of its own; its `seq`
//! still counts for [`RolloutStorage::last_seq`] when it is complete, since the event may have
//! been published.
//!
//! # Ttl
//! A session that ever held Ttl content has a `ttl` file (0600): the lock that keeps a sweep and
//! a sink of any process apart (`flock`), and the session's index, `<due> <generation>`: the
//! earliest expiry of the content it holds (`0`: unknown, the next sweep reads every file;
//! `u64::MAX`: none) and how many times a sweep replaced its files. Once its session holds Ttl
//! content, a sink takes the lock from the first append of a batch to the end of that batch's
//! commit, lowers (and fsyncs) the due time before the line it covers reaches a file, and after
//! a sweep replaced files reopens them. A sink whose session never held Ttl content never
//! takes it: a sweep only replaces files that hold due content. [`RolloutStorage::sweep_due`] goes through every session directory, skips those whose
//! index says nothing is due (read without the lock), and under the lock rewrites each file
//! holding due `Full` lines: every other line byte for byte, due ones as headers, unreadable
//! ones (torn; they may hold content) left out, their `seq` kept in the high-water mark. A
//! rewrite goes through a temporary file, fsync, rename over the old file and directory fsync,
//! so a crash leaves either the old or the new file, and the old bytes are no longer in any
//! file of the directory; a temporary file a crash left is removed by the next sweep of that
//! session. Lines written before expiries were recorded (no `expires_ms`) count from their
//! conversation's `conversation_opened` policy, which cannot change.
//!
//! Readers read the files directly: a commit makes the lines visible, but a reader may also see
//! lines of a batch not yet committed (the Rollout bounds its reads by what it knows is
//! committed).

use super::metrics::{self, WriteOp};
use super::storage::{RolloutSink, RolloutStorage, SinkError, SweepReport};
use super::{RecordLevel, RolloutRecord, downgrade, ttl_expiry_ms};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use troupe_proto::{AgentError, ConversationId, EventKind, SessionId, StoragePolicy};

mod read;
mod sink;
mod sweep;

use read::*;
pub use read::{conversation_path, read_records};
pub use sink::FileSink;
use sink::*;
use sweep::*;

/// File of the session-level records.
pub const SESSION_FILE: &str = "session.jsonl";
/// File of the high-water mark.
pub const HIGH_WATER_FILE: &str = "high_water";
/// Files a sink keeps open at most.
pub const MAX_OPEN_FILES: usize = 64;
/// First read when looking for the last `seq` of a file (doubled until a line start is found).
const TAIL_CHUNK: usize = 64 * 1024;
/// Width of the high-water number: every `u64` fits, so each write replaces the whole value.
const HIGH_WATER_WIDTH: usize = 20;
/// The session's Ttl lock and index (see the module doc).
pub const TTL_FILE: &str = "ttl";
/// How long a sink waits for a sweep of its session to finish before its write fails.
const SINK_LOCK_WAIT: Duration = Duration::from_secs(30);
/// How long a sweep waits for a sink's batch before leaving the session to the next sweep.
const SWEEP_LOCK_WAIT: Duration = Duration::from_secs(5);

/// The rollout as a directory of JSONL files per session.
#[derive(Debug, Clone)]
pub struct FileRolloutStorage {
    root: PathBuf,
}

impl FileRolloutStorage {
    /// Storage under `root` (usually `<data_dir>/rollout`); nothing is created until written.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of one session's files.
    pub fn session_dir(&self, session_id: SessionId) -> PathBuf {
        self.root.join(session_id.to_string())
    }
}

/// Counts records read back (`troupe_rollout_records_read_total{storage="files"}`, registered
/// with the other storages' series).
fn count_read(read: &'static str, n: usize) {
    ::metrics::counter!("troupe_rollout_records_read_total", "storage" => "files", "read" => read)
        .increment(n as u64);
}

impl RolloutStorage for FileRolloutStorage {
    fn open_sink(&self, session_id: SessionId) -> Result<Box<dyn RolloutSink>, AgentError> {
        let dir = self.session_dir(session_id);
        let lease = take_writer_lease(&dir, WRITER_LEASE_WAIT).map_err(|e| {
            AgentError::internal(format!(
                "the rollout of session {session_id} is still written by another sink: {e}"
            ))
        })?;
        let mut sink = FileSink::new(dir);
        sink.lease = Some(lease);
        Ok(Box::new(sink))
    }

    fn last_seq(&self, session_id: SessionId) -> Result<u64, AgentError> {
        let dir = self.session_dir(session_id);
        let recorded = max_seq_in_dir(&dir);
        let high_water = read_high_water(&dir.join(HIGH_WATER_FILE));
        match (recorded, high_water) {
            (Ok(recorded), Ok(high_water)) => Ok(recorded.max(high_water)),
            (Err(e), _) | (_, Err(e)) => Err(AgentError::internal(format!(
                "reading the last seq under {}: {e}",
                dir.display()
            ))),
        }
    }

    fn read_conversation(
        &self,
        session_id: SessionId,
        conversation_id: ConversationId,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let records = read_records(&conversation_path(
            &self.session_dir(session_id),
            conversation_id,
        ))?;
        // A window is read from the whole file too: every read is a conversation's.
        count_read("conversation", records.len());
        Ok(records)
    }

    fn read_after(
        &self,
        session_id: SessionId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        let dir = self.session_dir(session_id);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let io_error =
            |e: io::Error| AgentError::internal(format!("reading {}: {e}", dir.display()));
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry.map_err(io_error)?.path();
            if !is_record_file(&path) {
                continue;
            }
            // Most files of a long session end before the resume point: a tail read skips them.
            match last_seq_in_file(&path) {
                Ok(last) if last <= after_seq => continue,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error(e)),
            }
            out.extend(read_records_after(&path, after_seq, limit)?);
        }
        out.sort_unstable_by_key(|r| r.seq);
        out.truncate(limit);
        count_read("after", out.len());
        Ok(out)
    }

    fn sweep_due(&self, now_ms: u64) -> Result<SweepReport, AgentError> {
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(SweepReport::default()),
            Err(e) => {
                return Err(AgentError::internal(format!(
                    "ttl sweep: reading {}: {e}",
                    self.root.display()
                )));
            }
        };
        let mut report = SweepReport::default();
        for entry in entries {
            let dir = match entry {
                Ok(entry) => entry.path(),
                Err(e) => {
                    tracing::warn!(root = %self.root.display(), error = %e, "ttl sweep: unreadable entry");
                    report.failures += 1;
                    continue;
                }
            };
            if !dir.is_dir() {
                continue;
            }
            let swept = sweep_session(&dir, now_ms, SWEEP_LOCK_WAIT);
            report.downgraded += swept.downgraded;
            if let Some(e) = swept.error {
                tracing::warn!(dir = %dir.display(), error = %e, "ttl sweep of a session failed; the next sweep tries again");
                report.failures += 1;
            }
        }
        Ok(report)
    }
}

/// The file of a session's writer lease (see [`FileSink`]).
pub const WRITER_LOCK_FILE: &str = "writer.lock";
/// How long a new sink waits for its predecessor's lease: a killed Rollout's writer commits
/// what it holds and closes before its state is gone.
pub const WRITER_LEASE_WAIT: Duration = Duration::from_secs(10);

/// Creates the session's directory and takes its writer lease, waiting at most `wait`.
fn take_writer_lease(dir: &Path, wait: Duration) -> io::Result<File> {
    create_private_dir(dir)?;
    let file = private_file_options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(WRITER_LOCK_FILE))?;
    lock_within(&file, wait)?;
    Ok(file)
}

/// Takes the exclusive lock on `file`, waiting at most `wait`. Polls: `flock` has no timeout.
fn lock_within(file: &File, wait: Duration) -> io::Result<()> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < wait => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("lock still held after {wait:?}"),
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// Raises the session's high-water mark to `seq` if its records and mark say less.
fn raise_high_water(dir: &Path, seq: u64) -> io::Result<()> {
    let path = dir.join(HIGH_WATER_FILE);
    if seq <= read_high_water(&path)?.max(max_seq_in_dir(dir)?) {
        return Ok(());
    }
    let mut file = private_file_options()
        .create(true)
        .write(true)
        .truncate(false)
        .open(&path)?;
    file.write_all(format!("{seq:0width$}\n", width = HIGH_WATER_WIDTH).as_bytes())?;
    file.sync_data()
}

/// Replaces `path` with `bytes` atomically: temporary file, fsync, rename, directory fsync.
fn replace_file(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("jsonl.tmp");
    let result = (|| {
        let mut file = private_file_options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Rollouts hold conversation content: only the owner may read them.
fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

fn private_file_options() -> OpenOptions {
    let mut options = OpenOptions::new();
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
}

/// Whether a non-empty file lacks its final newline.
fn ends_mid_line(path: &Path) -> io::Result<bool> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(false);
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    Ok(last[0] != b'\n')
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::super::{RecordMeta, conformance};
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;
    use troupe_proto::{EventKind, EventName};

    fn full_record(seq: u64, ts_ms: u64, text: &str) -> RolloutRecord {
        RolloutRecord {
            seq,
            ts_ms,
            conversation_id: Some(ConversationId::new()),
            task_id: None,
            kind: EventName::AssistantMessage,
            level: RecordLevel::Full,
            event: Some(EventKind::AssistantMessage { text: text.into() }),
            meta: RecordMeta::default(),
        }
    }

    fn full_line(seq: u64, ts_ms: u64, text: &str) -> Vec<u8> {
        let mut line = serde_json::to_vec(&full_record(seq, ts_ms, text)).unwrap();
        line.push(b'\n');
        line
    }

    fn contains(haystack: &[u8], needle: &str) -> bool {
        haystack
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    }

    #[test]
    fn reads_are_counted_as_the_other_storages_count_them() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let tmp = tempfile::tempdir().unwrap();
        let storage = FileRolloutStorage::new(tmp.path().to_path_buf());
        let session = SessionId::new();
        let dir = storage.session_dir(session);
        std::fs::create_dir_all(&dir).unwrap();
        let conversation = ConversationId::new();
        let mut bytes = Vec::new();
        for seq in 1..=3 {
            let mut record = full_record(seq, seq, "x");
            record.conversation_id = Some(conversation);
            bytes.extend(serde_json::to_vec(&record).unwrap());
            bytes.push(b'\n');
        }
        std::fs::write(conversation_path(&dir, conversation), bytes).unwrap();
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        ::metrics::with_local_recorder(&recorder, || {
            assert_eq!(
                storage
                    .read_conversation(session, conversation)
                    .unwrap()
                    .len(),
                3
            );
            assert_eq!(storage.read_after(session, 1, 10).unwrap().len(), 2);
        });
        let mut counted: Vec<(String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == "troupe_rollout_records_read_total")
            .map(|(key, _, _, value)| {
                let labels: Vec<String> =
                    key.key().labels().map(|l| l.value().to_owned()).collect();
                let DebugValue::Counter(n) = value else {
                    panic!("not a counter")
                };
                (labels.join(","), n)
            })
            .collect();
        counted.sort();
        assert_eq!(
            counted,
            [
                ("files,after".to_owned(), 2),
                ("files,conversation".to_owned(), 3)
            ]
        );
    }

    #[test]
    fn conformance_suite() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        conformance::run_all(&|| Arc::new(FileRolloutStorage::new(root.clone())));
    }

    fn ttl_line(seq: u64, ts_ms: u64, expires_ms: u64, text: &str) -> Vec<u8> {
        let mut record = full_record(seq, ts_ms, text);
        record.meta.expires_ms = Some(expires_ms);
        let mut line = serde_json::to_vec(&record).unwrap();
        line.push(b'\n');
        line
    }

    fn records_of(bytes: &[u8]) -> Vec<RolloutRecord> {
        bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    #[test]
    fn sweep_downgrades_only_due_full_lines() {
        let mut file = Vec::new();
        file.extend(ttl_line(1, 100, 150, "due"));
        file.extend(ttl_line(2, 200, 250, "later"));
        file.extend(full_line(3, 10, "full, no expiry"));
        file.extend(b"{\"seq\":4,\"ts_ms\":10,\"kind\":\"torn");
        let out = sweep_lines(&file, 150);
        assert_eq!(
            (out.downgraded, out.dropped, out.dropped_seq, out.next_due),
            (1, 1, Some(4), Some(250))
        );
        let records = records_of(&out.bytes);
        assert_eq!(
            records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(records[0].level, RecordLevel::Headers);
        assert_eq!(records[1].level, RecordLevel::Full);
        assert_eq!(records[2].level, RecordLevel::Full);
        assert!(!contains(&out.bytes, "due\""));
        assert!(
            !sweep_lines(&out.bytes, 150).changed(),
            "sweeping twice changes nothing"
        );
        assert!(
            !sweep_lines(&full_line(1, 1, "x"), u64::MAX).changed(),
            "a file without due lines is never rewritten (even with a torn line)"
        );
    }

    #[test]
    fn lines_written_before_expiries_count_from_the_opened_policy() {
        let conversation = ConversationId::new();
        let line = |seq: u64, ts_ms: u64, event: EventKind| {
            let mut line = serde_json::to_vec(&RolloutRecord {
                seq,
                ts_ms,
                conversation_id: Some(conversation),
                task_id: None,
                kind: event.name(),
                level: RecordLevel::Full,
                event: Some(event),
                meta: RecordMeta::default(),
            })
            .unwrap();
            line.push(b'\n');
            line
        };
        let mut file = line(
            1,
            1_000,
            EventKind::ConversationOpened {
                storage_policy: StoragePolicy::Ttl { secs: 10 },
                base_instructions: None,
                user_instructions: Some("legacy instructions".into()),
            },
        );
        file.extend(line(
            2,
            5_000,
            EventKind::AssistantMessage {
                text: "legacy text".into(),
            },
        ));
        let out = sweep_lines(&file, 11_000);
        assert_eq!((out.downgraded, out.next_due), (1, Some(15_000)));
        let out = sweep_lines(&out.bytes, 15_000);
        assert_eq!(out.downgraded, 1);
        assert!(!contains(&out.bytes, "legacy"));
        // Under another policy, nothing without an expiry is due.
        let full = full_line(3, 1, "full");
        assert!(!sweep_lines(&full, u64::MAX).changed());
    }

    #[test]
    fn the_ttl_index_round_trips_and_a_torn_one_is_unknown() {
        let index = TtlIndex {
            due_ms: 1_700_000_000_000,
            generation: 3,
        };
        assert_eq!(index.encode().len(), TtlIndex::LEN);
        assert_eq!(TtlIndex::decode(index.encode().as_bytes()), Some(index));
        let none = TtlIndex {
            due_ms: u64::MAX,
            generation: u64::MAX,
        };
        assert_eq!(none.encode().len(), TtlIndex::LEN);
        assert_eq!(TtlIndex::decode(none.encode().as_bytes()), Some(none));
        assert_eq!(TtlIndex::decode(&index.encode().as_bytes()[..30]), None);
        assert_eq!(TtlIndex::decode(b""), None);
    }

    /// Every byte of every file under `dir`.
    fn tree_bytes(dir: &Path) -> Vec<u8> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.extend(tree_bytes(&path));
            } else {
                out.extend(fs::read(&path).unwrap());
            }
        }
        out
    }

    #[test]
    fn a_sweep_leaves_no_byte_of_due_content_in_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = FileRolloutStorage::new(tmp.path());
        let session = SessionId::new();
        let conversation = ConversationId::new();
        let mut sink = storage.open_sink(session).unwrap();
        let mut record = full_record(1, 1, "CANARY-DUE-31");
        record.conversation_id = Some(conversation);
        record.meta.expires_ms = Some(5);
        record.meta.chars = Some(13);
        sink.append(Some(conversation), &record).unwrap();
        let mut later = full_record(2, 2, "CANARY-LATER-32");
        later.conversation_id = Some(conversation);
        later.meta.expires_ms = Some(50);
        sink.append(Some(conversation), &later).unwrap();
        sink.commit(true, 2).unwrap();
        assert!(contains(&tree_bytes(tmp.path()), "CANARY-DUE-31"));
        let report = storage.sweep_due(5).unwrap();
        assert_eq!(
            report,
            SweepReport {
                downgraded: 1,
                failures: 0
            }
        );
        let disk = tree_bytes(tmp.path());
        assert!(!contains(&disk, "CANARY-DUE-31"), "due content is gone");
        assert!(
            contains(&disk, "CANARY-LATER-32"),
            "content not yet due stays"
        );
        let records = storage.read_conversation(session, conversation).unwrap();
        assert_eq!(records[0].meta.chars, Some(13), "the header stays");
        // The index says when the next sweep has work.
        let index = read_index(&File::open(storage.session_dir(session).join(TTL_FILE)).unwrap());
        assert_eq!(
            index.unwrap(),
            TtlIndex {
                due_ms: 50,
                generation: 1
            }
        );
        drop(sink);
    }

    #[test]
    fn a_sweep_removes_stale_sweep_files_and_last_seq_ignores_them() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = FileRolloutStorage::new(tmp.path());
        let session = SessionId::new();
        let dir = storage.session_dir(session);
        fs::create_dir_all(&dir).unwrap();
        let mut stale = full_line(99, 1, "stale");
        stale.extend(b"garbage");
        fs::write(dir.join("d.jsonl.tmp"), &stale).unwrap();
        assert_eq!(storage.last_seq(session).unwrap(), 0);
        // No index yet: the session is read in full once, and its temporary file goes.
        assert_eq!(storage.sweep_due(1).unwrap(), SweepReport::default());
        assert!(!dir.join("d.jsonl.tmp").exists());
        let index = read_index(&File::open(dir.join(TTL_FILE)).unwrap()).unwrap();
        assert_eq!(index.due_ms, u64::MAX, "nothing is ever due here");
    }

    #[test]
    fn a_torn_line_left_out_by_a_sweep_keeps_its_number() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = FileRolloutStorage::new(tmp.path());
        let session = SessionId::new();
        let dir = storage.session_dir(session);
        fs::create_dir_all(&dir).unwrap();
        let mut file = ttl_line(1, 1, 2, "due");
        file.extend(b"{\"seq\":7,\"ts_ms\":3,\"torn");
        fs::write(dir.join("c.jsonl"), &file).unwrap();
        assert_eq!(storage.last_seq(session).unwrap(), 7);
        assert_eq!(storage.sweep_due(2).unwrap().downgraded, 1);
        assert_eq!(storage.read_after(session, 0, 10).unwrap().len(), 1);
        assert_eq!(storage.last_seq(session).unwrap(), 7, "7 is never reused");
    }

    #[test]
    fn a_session_whose_lock_is_held_is_left_to_the_next_sweep() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("s");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("c.jsonl"), ttl_line(1, 1, 2, "due")).unwrap();
        let holder = open_ttl_file(&dir.join(TTL_FILE)).unwrap();
        holder.lock().unwrap();
        let swept = sweep_session(&dir, 10, Duration::from_millis(20));
        assert_eq!(swept.downgraded, 0);
        assert_eq!(swept.error.unwrap().kind(), io::ErrorKind::TimedOut);
        holder.unlock().unwrap();
        let swept = sweep_session(&dir, 10, Duration::from_millis(20));
        assert_eq!((swept.downgraded, swept.error.is_none()), (1, true));
    }

    #[test]
    fn a_sink_reopens_files_a_sweep_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = FileRolloutStorage::new(tmp.path());
        let session = SessionId::new();
        let conversation = ConversationId::new();
        let mut sink = storage.open_sink(session).unwrap();
        let ttl = |seq: u64, expires_ms: u64| {
            let mut r = full_record(seq, seq, &format!("text {seq}"));
            r.conversation_id = Some(conversation);
            r.meta.expires_ms = Some(expires_ms);
            r
        };
        sink.append(Some(conversation), &ttl(1, 5)).unwrap();
        sink.commit(false, 1).unwrap();
        assert_eq!(storage.sweep_due(5).unwrap().downgraded, 1);
        // The sink's handle points at the replaced file; its next line must reach the new one.
        sink.append(Some(conversation), &ttl(2, 50)).unwrap();
        sink.commit(false, 2).unwrap();
        let records = storage.read_conversation(session, conversation).unwrap();
        assert_eq!(
            records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(records[0].level, RecordLevel::Headers);
        assert_eq!(records[1].level, RecordLevel::Full);
    }

    #[test]
    fn line_seq_reads_the_prefix_only() {
        assert_eq!(line_seq(b"{\"seq\":42,\"ts_ms\":1"), Some(42));
        assert_eq!(line_seq(b"{\"seq\":42"), None, "the number may be cut");
        assert_eq!(line_seq(b"{\"ts_ms\":1,\"seq\":42,"), None);
        assert_eq!(line_seq(b""), None);
    }

    #[test]
    fn last_seq_survives_torn_and_long_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        let mut bytes = full_line(1, 1, "a");
        bytes.extend(full_line(2, 2, &"x".repeat(3 * TAIL_CHUNK)));
        fs::write(&path, &bytes).unwrap();
        assert_eq!(last_seq_in_file(&path).unwrap(), 2);
        // A torn line whose seq is complete still counts; a truncated seq does not.
        bytes.extend(b"{\"seq\":3,\"ts_ms\":1");
        fs::write(&path, &bytes).unwrap();
        assert_eq!(last_seq_in_file(&path).unwrap(), 3);
        bytes.extend(b"\n{\"seq\":4");
        fs::write(&path, &bytes).unwrap();
        assert_eq!(last_seq_in_file(&path).unwrap(), 3);
        fs::write(&path, b"").unwrap();
        assert_eq!(last_seq_in_file(&path).unwrap(), 0);
        assert_eq!(max_seq_in_dir(&dir.path().join("missing")).unwrap(), 0);
    }

    #[test]
    fn the_high_water_mark_is_written_only_above_the_records() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = FileRolloutStorage::new(tmp.path());
        let session = SessionId::new();
        let hw = storage.session_dir(session).join(HIGH_WATER_FILE);
        let mut sink = storage.open_sink(session).unwrap();
        let record = full_record(5, 1, "a");
        sink.append(record.conversation_id, &record).unwrap();
        sink.commit(false, 5).unwrap();
        assert!(!hw.exists(), "the records already say 5");
        sink.commit(true, 9).unwrap();
        assert_eq!(fs::read_to_string(&hw).unwrap().len(), HIGH_WATER_WIDTH + 1);
        assert_eq!(storage.last_seq(session).unwrap(), 9);
        sink.commit(false, 12).unwrap();
        assert_eq!(read_high_water(&hw).unwrap(), 12);
        assert_eq!(storage.last_seq(session).unwrap(), 12);
        fs::write(&hw, b"not a number").unwrap();
        assert_eq!(
            storage.last_seq(session).unwrap(),
            5,
            "unreadable: records only"
        );
    }

    #[test]
    fn read_after_skips_files_that_end_before_the_resume_point() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = FileRolloutStorage::new(tmp.path());
        let session = SessionId::new();
        let dir = storage.session_dir(session);
        fs::create_dir_all(&dir).unwrap();
        // An old file with a line that does not parse at all: it is never read past its tail.
        let mut old = full_line(1, 1, "a");
        old.extend(b"{\"seq\":2,\"broken\n");
        old.extend(full_line(3, 3, "c"));
        fs::write(dir.join("old.jsonl"), &old).unwrap();
        let mut new = full_line(4, 4, "d");
        new.extend(full_line(6, 6, "f"));
        fs::write(dir.join("new.jsonl"), &new).unwrap();
        fs::write(dir.join(SESSION_FILE), full_line(5, 5, "e")).unwrap();
        let seqs = |after, limit| -> Vec<u64> {
            storage
                .read_after(session, after, limit)
                .unwrap()
                .iter()
                .map(|r| r.seq)
                .collect()
        };
        assert_eq!(seqs(3, 10), vec![4, 5, 6]);
        assert_eq!(seqs(0, 10), vec![1, 3, 4, 5, 6]);
        assert_eq!(seqs(0, 2), vec![1, 3]);
        assert_eq!(seqs(4, 1), vec![5]);
        assert_eq!(seqs(6, 10), Vec::<u64>::new());
    }

    proptest! {
        /// Whatever the mix of lines and the sweep time, a sweep keeps every record in order,
        /// leaves no due Full line, and says when the next one comes due.
        #[test]
        fn sweep_keeps_order_and_drops_due_content(
            lines in proptest::collection::vec((0u64..1000, 0u8..3), 0..40),
            now in 0u64..1200,
        ) {
            let mut file = Vec::new();
            for (i, (expires, shape)) in lines.iter().enumerate() {
                let mut record = full_record(i as u64 + 1, 1, "content");
                match shape {
                    0 => record.meta.expires_ms = Some(*expires),
                    1 => record = downgrade(record),
                    _ => {}
                }
                file.extend(serde_json::to_vec(&record).unwrap());
                file.push(b'\n');
            }
            let out = sweep_lines(&file, now);
            let bytes = if out.changed() { out.bytes.clone() } else { file.clone() };
            let records = records_of(&bytes);
            prop_assert_eq!(records.len(), lines.len());
            for (i, r) in records.iter().enumerate() {
                prop_assert_eq!(r.seq, i as u64 + 1);
                prop_assert!(!crate::rollout::is_due(r, now));
            }
            let expected_next = records
                .iter()
                .filter(|r| r.level == RecordLevel::Full)
                .filter_map(|r| r.meta.expires_ms)
                .min();
            prop_assert_eq!(out.next_due, expected_next);
        }
    }
}
