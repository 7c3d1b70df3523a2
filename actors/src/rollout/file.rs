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
        read_records(&conversation_path(
            &self.session_dir(session_id),
            conversation_id,
        ))
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

/// A conversation's rollout file.
pub fn conversation_path(dir: &Path, conversation_id: ConversationId) -> PathBuf {
    Target::Conversation(conversation_id).path(dir)
}

/// Reads a rollout file, oldest first. Unreadable lines (a torn last write) are skipped and
/// logged; a missing file is an empty record. Blocking: call it off the async threads.
pub fn read_records(path: &Path) -> Result<Vec<RolloutRecord>, AgentError> {
    read_records_after(path, 0, usize::MAX)
}

/// Up to `limit` records of a file with `seq > after_seq`, oldest first. Lines at or before
/// the resume point are recognised by their `seq` prefix and not parsed.
fn read_records_after(
    path: &Path,
    after_seq: u64,
    limit: usize,
) -> Result<Vec<RolloutRecord>, AgentError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(AgentError::internal(format!(
                "reading {}: {e}",
                path.display()
            )));
        }
    };
    let mut records = Vec::new();
    let mut unreadable = 0;
    for (index, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if records.len() >= limit {
            break;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if after_seq > 0 && line_seq(line).is_some_and(|seq| seq <= after_seq) {
            continue;
        }
        match serde_json::from_slice::<RolloutRecord>(line) {
            Ok(record) if record.seq > after_seq => records.push(record),
            Ok(_) => {}
            Err(e) => {
                unreadable += 1;
                tracing::warn!(path = %path.display(), line = index + 1, error = %e, "skipping unreadable rollout line");
            }
        }
    }
    if unreadable > 0 {
        metrics::unreadable_lines(unreadable);
    }
    Ok(records)
}

fn is_record_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".jsonl"))
}

/// Removes temporary files an interrupted sweep left behind (under the session's lock).
fn remove_stale_sweep_files(dir: &Path) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".jsonl.tmp")
            && let Err(e) = fs::remove_file(&path)
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove stale sweep file");
        }
    }
    Ok(())
}

/// The highest `seq` recorded in `dir` (0 if none). Blocking.
fn max_seq_in_dir(dir: &Path) -> io::Result<u64> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut max = 0;
    for entry in entries {
        let path = entry?.path();
        if is_record_file(&path) {
            match last_seq_in_file(&path) {
                Ok(seq) => max = max.max(seq),
                // Removed by a concurrent sweep's rename: the new file is listed too.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(max)
}

/// The high-water mark (0 when there is none, or it is unreadable). Blocking.
fn read_high_water(path: &Path) -> io::Result<u64> {
    match fs::read(path) {
        Ok(bytes) => {
            let value = std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            if value.is_none() && !bytes.is_empty() {
                tracing::warn!(path = %path.display(), "unreadable rollout high-water mark");
            }
            Ok(value.unwrap_or(0))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// The `seq` of a file's last line, reading backwards from its end in growing chunks.
fn last_seq_in_file(path: &Path) -> io::Result<u64> {
    let mut file = File::open(path)?;
    let mut start = file.metadata()?.len();
    let mut tail: Vec<u8> = Vec::new();
    while start > 0 {
        let want = TAIL_CHUNK.max(tail.len());
        let from = start.saturating_sub(u64::try_from(want).unwrap_or(u64::MAX));
        let mut chunk = vec![0; usize::try_from(start - from).unwrap_or(0)];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&tail);
        tail = chunk;
        start = from;
        if let Some(seq) = last_seq_in_tail(&tail, start == 0) {
            return Ok(seq);
        }
    }
    Ok(0)
}

/// The `seq` a line starts with, read from its prefix: `seq` is the first field of a
/// serialised record, and content inside strings is escaped, so the prefix only ever matches
/// at the start of a record. A torn line whose `seq` is complete still has one.
fn line_seq(line: &[u8]) -> Option<u64> {
    const PREFIX: &[u8] = b"{\"seq\":";
    let rest = line.strip_prefix(PREFIX)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || rest.get(digits) != Some(&b',') {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// The `seq` of the last line of `tail` that starts there. The first piece counts as a line
/// start only at the start of the file. A torn line still counts when its `seq` is complete:
/// that event may have been published, so its number must not be handed out again.
fn last_seq_in_tail(tail: &[u8], at_file_start: bool) -> Option<u64> {
    #[derive(Deserialize)]
    struct SeqOnly {
        seq: u64,
    }
    let pieces = tail.split(|b| *b == b'\n').count();
    for (index, line) in tail.rsplit(|b| *b == b'\n').enumerate() {
        let is_first_piece = index + 1 == pieces;
        if is_first_piece && !at_file_start {
            break;
        }
        if let Some(seq) = line_seq(line) {
            return Some(seq);
        }
        if let Ok(record) = serde_json::from_slice::<SeqOnly>(line) {
            return Some(record.seq);
        }
    }
    None
}

/// What a TTL sweep makes of a file.
#[derive(Debug, PartialEq)]
struct SweepOutcome {
    /// The new content (valid only if something changed).
    bytes: Vec<u8>,
    downgraded: u64,
    /// Unreadable lines left out of the new content (they may hold content).
    dropped: u64,
    /// The highest `seq` among the dropped lines whose number is readable.
    dropped_seq: Option<u64>,
    /// The earliest expiry of the `Full` lines left.
    next_due: Option<u64>,
}

impl SweepOutcome {
    /// Only a file with due content is rewritten: a sink that never wrote Ttl content does
    /// not take the lock, so its files must never be replaced under it.
    fn changed(&self) -> bool {
        self.downgraded > 0
    }
}

/// Downgrades every `Full` line due at `now_ms`; other lines are kept byte for byte, except
/// those whose expiry is inferred from the conversation's policy, which get it written.
fn sweep_lines(input: &[u8], now_ms: u64) -> SweepOutcome {
    let mut out = SweepOutcome {
        bytes: Vec::with_capacity(input.len()),
        downgraded: 0,
        dropped: 0,
        dropped_seq: None,
        next_due: None,
    };
    // The conversation's ttl, for lines written before records carried their expiry.
    let mut opened_ttl = None;
    for line in input.split(|b| *b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let record = match serde_json::from_slice::<RolloutRecord>(line) {
            Ok(record) => record,
            Err(_) => {
                out.dropped += 1;
                out.dropped_seq = out.dropped_seq.max(line_seq(line));
                continue;
            }
        };
        if let (
            RecordLevel::Full,
            Some(EventKind::ConversationOpened {
                storage_policy: StoragePolicy::Ttl { secs },
                ..
            }),
        ) = (record.level, &record.event)
        {
            opened_ttl = Some(*secs);
        }
        match expiry(&record, opened_ttl) {
            Some(due) if due <= now_ms => match serde_json::to_vec(&downgrade(record)) {
                Ok(bytes) => {
                    out.bytes.extend_from_slice(&bytes);
                    out.bytes.push(b'\n');
                    out.downgraded += 1;
                }
                Err(_) => out.dropped += 1,
            },
            later => {
                if let Some(due) = later {
                    out.next_due = Some(out.next_due.map_or(due, |d| d.min(due)));
                }
                // A line whose expiry was inferred gets it written down: once the
                // conversation_opened line is downgraded, nothing else says it.
                let inferred = later.filter(|_| record.meta.expires_ms.is_none());
                match inferred.map(|due| {
                    let mut record = record;
                    record.meta.expires_ms = Some(due);
                    serde_json::to_vec(&record)
                }) {
                    Some(Ok(bytes)) => out.bytes.extend_from_slice(&bytes),
                    _ => out.bytes.extend_from_slice(line),
                }
                out.bytes.push(b'\n');
            }
        }
    }
    out
}

/// When a record's content is due: its recorded expiry, or for a `Full` line written before
/// expiries were recorded, its time plus the ttl its conversation was opened with.
fn expiry(record: &RolloutRecord, opened_ttl: Option<u64>) -> Option<u64> {
    if record.level != RecordLevel::Full {
        return None;
    }
    record
        .meta
        .expires_ms
        .or_else(|| opened_ttl.map(|secs| ttl_expiry_ms(record.ts_ms, secs)))
}

/// A session's Ttl index: the content it holds comes due at `due_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TtlIndex {
    /// Earliest expiry held; `0`: unknown; `u64::MAX`: nothing.
    due_ms: u64,
    /// Sweeps that replaced files of the session.
    generation: u64,
}

impl TtlIndex {
    /// Nothing known: the next sweep reads every file.
    const UNKNOWN: Self = Self {
        due_ms: 0,
        generation: 0,
    };
    /// Fixed width, so each write replaces the whole index.
    const LEN: usize = 2 * HIGH_WATER_WIDTH + 2;

    fn encode(self) -> String {
        format!(
            "{:0w$} {:0w$}\n",
            self.due_ms,
            self.generation,
            w = HIGH_WATER_WIDTH
        )
    }

    /// `None` for an empty or torn index.
    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != Self::LEN || bytes.last() != Some(&b'\n') {
            return None;
        }
        let text = std::str::from_utf8(bytes).ok()?;
        let mut words = text.split_whitespace();
        let index = Self {
            due_ms: words.next()?.parse().ok()?,
            generation: words.next()?.parse().ok()?,
        };
        words.next().is_none().then_some(index)
    }
}

fn open_ttl_file(path: &Path) -> io::Result<File> {
    private_file_options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// The index in an open `ttl` file (unknown when empty or unreadable).
fn read_index(mut file: &File) -> io::Result<TtlIndex> {
    let mut bytes = Vec::with_capacity(TtlIndex::LEN);
    file.seek(SeekFrom::Start(0))?;
    file.take(u64::try_from(TtlIndex::LEN * 2).unwrap_or(u64::MAX))
        .read_to_end(&mut bytes)?;
    Ok(TtlIndex::decode(&bytes).unwrap_or(TtlIndex::UNKNOWN))
}

fn write_index(mut file: &File, index: TtlIndex) -> io::Result<()> {
    file.seek(SeekFrom::Start(0))?;
    file.write_all(index.encode().as_bytes())
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

/// What sweeping one session did.
struct SessionSweep {
    downgraded: u64,
    /// The first failure; the session's index then says unknown, so the next sweep retries.
    error: Option<io::Error>,
}

/// Sweeps one session directory at `now_ms` (see the module doc), waiting at most `lock_wait`
/// for a sink's batch. Blocking.
fn sweep_session(dir: &Path, now_ms: u64, lock_wait: Duration) -> SessionSweep {
    let mut swept = SessionSweep {
        downgraded: 0,
        error: None,
    };
    let path = dir.join(TTL_FILE);
    // A look without the lock: most sessions have nothing due. A sink only lowers the due
    // time, so a stale read at worst defers a sweep to the next one.
    if let Ok(file) = File::open(&path)
        && let Ok(index) = read_index(&file)
        && index.due_ms > now_ms
    {
        return swept;
    }
    let file = match open_ttl_file(&path).and_then(|f| lock_within(&f, lock_wait).map(|()| f)) {
        Ok(file) => file,
        Err(e) => {
            swept.error = Some(e);
            return swept;
        }
    };
    let index = match read_index(&file) {
        Ok(index) if index.due_ms > now_ms => return swept,
        Ok(index) => index,
        Err(e) => {
            swept.error = Some(e);
            return swept;
        }
    };
    let mut next_due = u64::MAX;
    let mut replaced = false;
    let mut dropped_seq = None;
    let fail = |e: io::Error, error: &mut Option<io::Error>| {
        error.get_or_insert(e);
    };
    if let Err(e) = remove_stale_sweep_files(dir) {
        fail(e, &mut swept.error);
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            swept.error = Some(e);
            return swept;
        }
    };
    for entry in entries {
        let file_path = match entry {
            Ok(entry) => entry.path(),
            Err(e) => {
                fail(e, &mut swept.error);
                continue;
            }
        };
        if !is_record_file(&file_path) {
            continue;
        }
        let bytes = match fs::read(&file_path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                fail(e, &mut swept.error);
                continue;
            }
        };
        let outcome = sweep_lines(&bytes, now_ms);
        if outcome.changed() {
            if let Err(e) = replace_file(dir, &file_path, &outcome.bytes) {
                fail(
                    io::Error::new(e.kind(), format!("{}: {e}", file_path.display())),
                    &mut swept.error,
                );
                continue;
            }
            replaced = true;
            swept.downgraded += outcome.downgraded;
            dropped_seq = dropped_seq.max(outcome.dropped_seq);
            if outcome.dropped > 0 {
                metrics::unreadable_lines(outcome.dropped);
            }
            tracing::debug!(
                file = %file_path.display(), downgraded = outcome.downgraded,
                dropped = outcome.dropped, "ttl sweep rewrote a rollout file"
            );
        }
        next_due = next_due.min(outcome.next_due.unwrap_or(u64::MAX));
    }
    // A torn line's number may have been published: it must not be handed out again.
    if let Some(seq) = dropped_seq
        && let Err(e) = raise_high_water(dir, seq)
    {
        fail(e, &mut swept.error);
    }
    let index = TtlIndex {
        due_ms: if swept.error.is_some() { 0 } else { next_due },
        generation: index.generation + u64::from(replaced),
    };
    if let Err(e) = write_index(&file, index) {
        fail(e, &mut swept.error);
    }
    swept
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

/// A record file of the session's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Target {
    Session,
    Conversation(ConversationId),
}

impl Target {
    fn of(conversation_id: Option<ConversationId>) -> Self {
        conversation_id.map_or(Self::Session, Self::Conversation)
    }

    fn path(self, dir: &Path) -> PathBuf {
        match self {
            Self::Session => dir.join(SESSION_FILE),
            Self::Conversation(id) => dir.join(format!("{id}.jsonl")),
        }
    }
}

/// An open rollout file.
struct OpenFile {
    out: BufWriter<File>,
    /// For least-recently-used eviction.
    last_used: u64,
}

/// The high-water file, opened on first use.
#[derive(Default)]
struct HighWater {
    file: Option<File>,
    /// The value last written to it.
    written: u64,
    /// Written since the last fsync.
    unsynced: bool,
}

/// The writing side of one session's directory; lives on the Rollout's writer thread.
pub struct FileSink {
    dir: PathBuf,
    dir_created: bool,
    /// A file was created since the directory was last fsynced.
    dir_dirty: bool,
    open: HashMap<Target, OpenFile>,
    tick: u64,
    /// Open files holding lines not yet fsynced. Always a subset of `open`: a file is fsynced
    /// before it is closed.
    unsynced: HashSet<Target>,
    /// Files whose last write failed: the next write starts with a newline so that a torn
    /// line stays on a line of its own.
    tainted: HashSet<Target>,
    /// The highest `seq` appended by this sink: no high-water write is needed up to it.
    max_appended: u64,
    high_water: HighWater,
    /// The first failure since the last commit that no `append` reported (lines of earlier
    /// appends lost while closing a file): the next commit fails with it.
    pending_error: Option<SinkError>,
    /// The session's Ttl lock and index. Dropping it releases the lock after the files above
    /// are closed.
    ttl: TtlLock,
    /// The session's writer lease (`writer.lock`), held for the sink's life: a sink of the same
    /// session (a restarted Rollout whose predecessor was killed, or another process) opens
    /// only once this one has committed and closed everything. Last: released after the rest.
    lease: Option<File>,
}

/// The sink's side of the session's `ttl` file.
#[derive(Default)]
struct TtlLock {
    /// Opened at the first Ttl append (or found at open).
    file: Option<File>,
    /// The session holds Ttl content, so a sweep may replace its files or raise its
    /// high-water mark: every append, and a commit that moves the mark, takes the lock.
    active: bool,
    /// Held from the first Ttl append of a batch to the end of its commit.
    locked: bool,
    /// The index as last read or written under the lock.
    index: Option<TtlIndex>,
}

impl std::fmt::Debug for FileSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSink")
            .field("dir", &self.dir)
            .field("open", &self.open.len())
            .finish_non_exhaustive()
    }
}

impl RolloutSink for FileSink {
    fn append(
        &mut self,
        conversation_id: Option<ConversationId>,
        record: &RolloutRecord,
    ) -> Result<(), SinkError> {
        let target = Target::of(conversation_id);
        let mut line =
            serde_json::to_vec(record).map_err(|e| SinkError::new(WriteOp::Encode.as_str(), e))?;
        line.push(b'\n');
        if record.level == RecordLevel::Full
            && let Some(expires_ms) = record.meta.expires_ms
        {
            self.note_expiry(expires_ms)
                .map_err(|e| self.error(WriteOp::Ttl, target, &e))?;
        } else if self.ttl.active {
            // A sweep may have replaced this file since the last batch.
            self.lock_ttl()
                .map_err(|e| self.error(WriteOp::Ttl, target, &e))?;
        }
        self.ensure_open(target)
            .map_err(|(op, e)| self.failed(op, target, &e))?;
        self.tick += 1;
        let Some(file) = self.open.get_mut(&target) else {
            return Err(SinkError::new(WriteOp::Open.as_str(), "file not open"));
        };
        file.last_used = self.tick;
        if let Err(e) = file.out.write_all(&line) {
            return Err(self.failed(WriteOp::Append, target, &e));
        }
        self.unsynced.insert(target);
        self.max_appended = self.max_appended.max(record.seq);
        metrics::bytes_written(line.len());
        Ok(())
    }

    fn commit(&mut self, sync: bool, high_water: u64) -> Result<(), SinkError> {
        let mut first = self.pending_error.take();
        let mut failed = Vec::new();
        for (target, file) in &mut self.open {
            if !file.out.buffer().is_empty()
                && let Err(e) = file.out.flush()
            {
                failed.push((*target, e));
            }
        }
        for (target, e) in failed {
            let error = self.failed(WriteOp::Flush, target, &e);
            first.get_or_insert(error);
        }
        if high_water > self.max_appended.max(self.high_water.written) {
            // A sweep may raise the mark of a session with Ttl content: not at the same time.
            if self.ttl.active
                && let Err(e) = self.lock_ttl()
            {
                first.get_or_insert(SinkError::new(WriteOp::Ttl.as_str(), e));
            }
            if let Err(e) = self.write_high_water(high_water) {
                first.get_or_insert(SinkError::new(WriteOp::HighWater.as_str(), e));
            }
        }
        if sync {
            let targets: Vec<Target> = self.unsynced.drain().collect();
            for target in targets {
                if let Some(file) = self.open.get(&target)
                    && let Err(e) = timed_sync(file.out.get_ref())
                {
                    let error = self.failed(WriteOp::Sync, target, &e);
                    first.get_or_insert(error);
                }
            }
            if self.high_water.unsynced
                && let Some(file) = &self.high_water.file
            {
                match timed_sync(file) {
                    Ok(()) => self.high_water.unsynced = false,
                    Err(e) => {
                        first.get_or_insert(SinkError::new(WriteOp::Sync.as_str(), e));
                    }
                }
            }
            if self.dir_dirty {
                match sync_dir(&self.dir) {
                    Ok(()) => self.dir_dirty = false,
                    Err(e) => {
                        first.get_or_insert(SinkError::new(
                            WriteOp::Sync.as_str(),
                            format!("{}: {e}", self.dir.display()),
                        ));
                    }
                }
            }
        }
        self.unlock_ttl();
        first.map_or(Ok(()), Err)
    }

    fn forget(&mut self, conversation_id: ConversationId) -> Result<(), SinkError> {
        self.tainted.remove(&Target::Conversation(conversation_id));
        self.close(Target::Conversation(conversation_id))
    }

    fn abandon(mut self: Box<Self>) {
        drop(self.lease.take());
        std::mem::forget(self);
    }
}

fn timed_sync(file: &File) -> io::Result<()> {
    let started = Instant::now();
    file.sync_data()?;
    metrics::fsynced(started.elapsed());
    Ok(())
}

impl FileSink {
    /// A sink over one session's directory (created on the first append).
    pub fn new(dir: PathBuf) -> Self {
        let ttl = TtlLock {
            active: dir.join(TTL_FILE).exists(),
            ..TtlLock::default()
        };
        Self {
            dir,
            dir_created: false,
            dir_dirty: false,
            open: HashMap::new(),
            tick: 0,
            unsynced: HashSet::new(),
            tainted: HashSet::new(),
            max_appended: 0,
            high_water: HighWater::default(),
            pending_error: None,
            ttl,
            lease: None,
        }
    }

    /// A Ttl record expiring at `expires_ms` is about to be appended: hold the session's lock
    /// for the rest of the batch, and lower the index's due time (durably, before the line
    /// reaches the file) if the record comes due sooner.
    fn note_expiry(&mut self, expires_ms: u64) -> io::Result<()> {
        self.lock_ttl()?;
        let Some(index) = self.ttl.index else {
            return Err(io::Error::other("ttl index not read"));
        };
        if expires_ms < index.due_ms {
            let lowered = TtlIndex {
                due_ms: expires_ms,
                ..index
            };
            if let Some(file) = &self.ttl.file {
                write_index(file, lowered)?;
                timed_sync(file)?;
            }
            self.ttl.index = Some(lowered);
        }
        Ok(())
    }

    /// Takes the session's Ttl lock (until the commit ends) and reads the index. If a sweep
    /// replaced files since this sink last held it, the open handles point at replaced files
    /// (their lines are all in the new ones): they are closed and reopened on demand.
    fn lock_ttl(&mut self) -> io::Result<()> {
        if self.ttl.locked {
            return Ok(());
        }
        self.ensure_dir()?;
        if self.ttl.file.is_none() {
            let path = self.dir.join(TTL_FILE);
            let existed = path.try_exists().unwrap_or(true);
            self.ttl.file = Some(open_ttl_file(&path)?);
            self.dir_dirty |= !existed;
        }
        let Some(file) = &self.ttl.file else {
            return Err(io::Error::other("ttl file not open"));
        };
        lock_within(file, SINK_LOCK_WAIT)?;
        self.ttl.locked = true;
        self.ttl.active = true;
        let index = match read_index(file) {
            Ok(index) => index,
            Err(e) => {
                self.unlock_ttl();
                return Err(e);
            }
        };
        let swept = self
            .ttl
            .index
            .is_some_and(|seen| seen.generation != index.generation);
        self.ttl.index = Some(index);
        if swept {
            let targets: Vec<Target> = self.open.keys().copied().collect();
            for target in targets {
                if let Err(e) = self.close(target) {
                    self.pending_error.get_or_insert(e);
                }
            }
        }
        Ok(())
    }

    fn unlock_ttl(&mut self) {
        if !self.ttl.locked {
            return;
        }
        self.ttl.locked = false;
        if let Some(file) = &self.ttl.file
            && let Err(e) = file.unlock()
        {
            // Closing the file is the only way left to let sweeps in.
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot release the ttl lock; closing it");
            self.ttl.file = None;
        }
    }

    fn ensure_dir(&mut self) -> io::Result<()> {
        if !self.dir_created {
            create_private_dir(&self.dir)?;
            // The directory's own entry must survive a crash too.
            if let Some(parent) = self.dir.parent() {
                let _ = sync_dir(parent);
            }
            self.dir_created = true;
        }
        Ok(())
    }

    fn ensure_open(&mut self, target: Target) -> Result<(), (WriteOp, io::Error)> {
        if self.open.contains_key(&target) {
            return Ok(());
        }
        self.ensure_dir().map_err(|e| (WriteOp::CreateDir, e))?;
        if self.open.len() >= MAX_OPEN_FILES
            && let Some(lru) = self
                .open
                .iter()
                .min_by_key(|(_, f)| f.last_used)
                .map(|(t, _)| *t)
            && let Err(e) = self.close(lru)
        {
            // Lines of earlier appends are lost: the commit must not report success.
            self.pending_error.get_or_insert(e);
        }
        let path = target.path(&self.dir);
        let existed = path.try_exists().unwrap_or(true);
        // A crash can leave a torn last line; appending to it would spoil the next record too.
        if existed && ends_mid_line(&path).map_err(|e| (WriteOp::Open, e))? {
            self.tainted.insert(target);
        }
        let file = private_file_options()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| (WriteOp::Open, e))?;
        if !existed {
            self.dir_dirty = true;
        }
        let mut out = BufWriter::with_capacity(16 * 1024, file);
        if self.tainted.remove(&target) {
            out.write_all(b"\n").map_err(|e| (WriteOp::Append, e))?;
        }
        self.open.insert(
            target,
            OpenFile {
                out,
                last_used: self.tick,
            },
        );
        Ok(())
    }

    /// Flushes, fsyncs if needed, and closes one file.
    fn close(&mut self, target: Target) -> Result<(), SinkError> {
        let Some(mut file) = self.open.remove(&target) else {
            return Ok(());
        };
        if let Err(e) = file.out.flush() {
            self.unsynced.remove(&target);
            return Err(self.failed_closed(WriteOp::Flush, target, file, &e));
        }
        if self.unsynced.remove(&target)
            && let Err(e) = timed_sync(file.out.get_ref())
        {
            self.tainted.insert(target);
            return Err(self.error(WriteOp::Sync, target, &e));
        }
        Ok(())
    }

    /// Overwrites the high-water value in place (one fixed-width write: never half a number).
    fn write_high_water(&mut self, value: u64) -> io::Result<()> {
        self.ensure_dir()?;
        if self.high_water.file.is_none() {
            let path = self.dir.join(HIGH_WATER_FILE);
            let existed = path.try_exists().unwrap_or(true);
            let file = private_file_options()
                .create(true)
                .write(true)
                .truncate(false)
                .open(&path)?;
            self.dir_dirty |= !existed;
            self.high_water.file = Some(file);
        }
        let text = format!("{value:0width$}\n", width = HIGH_WATER_WIDTH);
        if let Some(file) = &mut self.high_water.file {
            file.seek(SeekFrom::Start(0))?;
            file.write_all(text.as_bytes())?;
        }
        self.high_water.written = value;
        self.high_water.unsynced = true;
        Ok(())
    }

    fn error(&self, op: WriteOp, target: Target, e: &dyn std::fmt::Display) -> SinkError {
        SinkError::new(
            op.as_str(),
            format!("{}: {e}", target.path(&self.dir).display()),
        )
    }

    /// A write to `target` failed: its handle is dropped with its buffer (a retry could tear a
    /// line twice), and the next write to it starts on a new line.
    fn failed(&mut self, op: WriteOp, target: Target, e: &dyn std::fmt::Display) -> SinkError {
        if let Some(file) = self.open.remove(&target) {
            let _ = file.out.into_parts();
        }
        self.unsynced.remove(&target);
        self.tainted.insert(target);
        self.error(op, target, e)
    }

    fn failed_closed(
        &mut self,
        op: WriteOp,
        target: Target,
        file: OpenFile,
        e: &dyn std::fmt::Display,
    ) -> SinkError {
        let _ = file.out.into_parts();
        self.tainted.insert(target);
        self.error(op, target, e)
    }
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
