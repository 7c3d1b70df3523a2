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
//! (the least recently used is closed, fsynced first if it holds unsynced lines). A sweep
//! rewrites a file through a temporary file, fsync, rename and directory fsync, so a crash
//! leaves either the old or the new file; a temporary file left behind is removed when the
//! next sink opens. A line torn by a crash is skipped on read, and the next append starts on a
//! line of its own; its `seq` still counts for [`RolloutStorage::last_seq`] when it is
//! complete, since the event may have been published.
//!
//! Readers read the files directly: a commit makes the lines visible, but a reader may also see
//! lines of a batch not yet committed (the Rollout bounds its reads by what it knows is
//! committed).

use super::metrics::{self, WriteOp};
use super::storage::{RolloutSink, RolloutStorage, SinkError};
use super::{RecordLevel, RolloutRecord, downgrade};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;
use troupe_proto::{AgentError, ConversationId, SessionId};

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
        remove_stale_sweep_files(&dir)
            .map_err(|e| AgentError::internal(format!("opening {}: {e}", dir.display())))?;
        Ok(Box::new(FileSink::new(dir)))
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

/// Removes temporary files an interrupted sweep left behind. Blocking.
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
    /// Unreadable lines left out (they may hold content).
    dropped: u64,
    /// `ts_ms` of the oldest `Full` line left.
    oldest_full: Option<u64>,
}

impl SweepOutcome {
    fn changed(&self) -> bool {
        self.downgraded > 0 || self.dropped > 0
    }
}

/// Downgrades every `Full` line older than `cutoff_ms`; other lines are kept byte for byte.
fn sweep_lines(input: &[u8], cutoff_ms: u64) -> SweepOutcome {
    let mut out = SweepOutcome {
        bytes: Vec::with_capacity(input.len()),
        downgraded: 0,
        dropped: 0,
        oldest_full: None,
    };
    for line in input.split(|b| *b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<RolloutRecord>(line) {
            Ok(record) if record.level == RecordLevel::Full && record.ts_ms < cutoff_ms => {
                match serde_json::to_vec(&downgrade(record)) {
                    Ok(bytes) => {
                        out.bytes.extend_from_slice(&bytes);
                        out.bytes.push(b'\n');
                        out.downgraded += 1;
                    }
                    Err(_) => out.dropped += 1,
                }
            }
            Ok(record) => {
                if record.level == RecordLevel::Full {
                    out.oldest_full = Some(
                        out.oldest_full
                            .map_or(record.ts_ms, |t| t.min(record.ts_ms)),
                    );
                }
                out.bytes.extend_from_slice(line);
                out.bytes.push(b'\n');
            }
            Err(_) => out.dropped += 1,
        }
    }
    out
}

/// Whether a file may hold `Full` lines older than `cutoff_ms`. `known`: `None` when the sink
/// has not looked at the file yet, else the oldest `Full` line's time (if any).
fn needs_sweep(known: Option<Option<u64>>, cutoff_ms: u64) -> bool {
    match known {
        None => true,
        Some(None) => false,
        Some(Some(oldest)) => oldest < cutoff_ms,
    }
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
    /// Per conversation file, the oldest `Full` line's time (`None`: none); absent when unknown.
    full_since: HashMap<ConversationId, Option<u64>>,
    /// The highest `seq` appended by this sink: no high-water write is needed up to it.
    max_appended: u64,
    high_water: HighWater,
    /// The first failure since the last commit that no `append` reported (lines of earlier
    /// appends lost while closing a file): the next commit fails with it.
    pending_error: Option<SinkError>,
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
        if let (Target::Conversation(id), RecordLevel::Full) = (target, record.level)
            && let Some(known @ None) = self.full_since.get_mut(&id)
        {
            *known = Some(record.ts_ms);
        }
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
        if high_water > self.max_appended.max(self.high_water.written)
            && let Err(e) = self.write_high_water(high_water)
        {
            first.get_or_insert(SinkError::new(WriteOp::HighWater.as_str(), e));
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
        first.map_or(Ok(()), Err)
    }

    fn sweep(&mut self, conversation_id: ConversationId, cutoff_ms: u64) -> Result<(), SinkError> {
        if !needs_sweep(self.full_since.get(&conversation_id).copied(), cutoff_ms) {
            return Ok(());
        }
        let target = Target::Conversation(conversation_id);
        let path = target.path(&self.dir);
        // The cached handle points at the file being replaced; its lines are durable before it
        // goes, so a failed rewrite leaves a complete old file.
        self.close(target)?;
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.full_since.insert(conversation_id, None);
                return Ok(());
            }
            Err(e) => return Err(sweep_error(&path, &e)),
        };
        let outcome = sweep_lines(&bytes, cutoff_ms);
        if outcome.changed() {
            if let Err(e) = replace_file(&self.dir, &path, &outcome.bytes) {
                self.full_since.remove(&conversation_id);
                return Err(sweep_error(&path, &e));
            }
            metrics::ttl_downgraded(outcome.downgraded);
            if outcome.dropped > 0 {
                metrics::unreadable_lines(outcome.dropped);
            }
            tracing::debug!(
                %conversation_id, downgraded = outcome.downgraded, dropped = outcome.dropped,
                "ttl sweep rewrote a conversation record"
            );
        }
        self.full_since.insert(conversation_id, outcome.oldest_full);
        Ok(())
    }

    fn forget(&mut self, conversation_id: ConversationId) -> Result<(), SinkError> {
        self.full_since.remove(&conversation_id);
        self.tainted.remove(&Target::Conversation(conversation_id));
        self.close(Target::Conversation(conversation_id))
    }
}

fn sweep_error(path: &Path, e: &io::Error) -> SinkError {
    SinkError::new(WriteOp::Sweep.as_str(), format!("{}: {e}", path.display()))
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
        Self {
            dir,
            dir_created: false,
            dir_dirty: false,
            open: HashMap::new(),
            tick: 0,
            unsynced: HashSet::new(),
            tainted: HashSet::new(),
            full_since: HashMap::new(),
            max_appended: 0,
            high_water: HighWater::default(),
            pending_error: None,
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
            if let Target::Conversation(id) = target {
                self.full_since.insert(id, None);
            }
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
    use troupe_proto::EventKind;

    fn full_record(seq: u64, ts_ms: u64, text: &str) -> RolloutRecord {
        RolloutRecord {
            seq,
            ts_ms,
            conversation_id: Some(ConversationId::new()),
            task_id: None,
            kind: "assistant_message".into(),
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

    #[test]
    fn sweep_downgrades_only_old_full_lines() {
        let mut file = Vec::new();
        file.extend(full_line(1, 100, "old"));
        file.extend(full_line(2, 200, "new"));
        file.extend(b"{\"seq\":3,\"ts_ms\":10,\"kind\":\"torn");
        let out = sweep_lines(&file, 150);
        assert_eq!(
            (out.downgraded, out.dropped, out.oldest_full),
            (1, 1, Some(200))
        );
        let records: Vec<RolloutRecord> = out
            .bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(
            records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(records[0].level, RecordLevel::Headers);
        assert_eq!(records[1].level, RecordLevel::Full);
        assert!(!contains(&out.bytes, "old"));
        assert!(
            !sweep_lines(&out.bytes, 150).changed(),
            "sweeping twice changes nothing"
        );
    }

    #[test]
    fn needs_sweep_only_when_content_may_be_old() {
        assert!(needs_sweep(None, 0));
        assert!(!needs_sweep(Some(None), u64::MAX));
        assert!(needs_sweep(Some(Some(5)), 6));
        assert!(!needs_sweep(Some(Some(6)), 6));
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
    fn opening_a_sink_removes_stale_sweep_files_and_last_seq_ignores_them() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = FileRolloutStorage::new(tmp.path());
        let session = SessionId::new();
        let dir = storage.session_dir(session);
        fs::create_dir_all(&dir).unwrap();
        let mut stale = full_line(99, 1, "stale");
        stale.extend(b"garbage");
        fs::write(dir.join("d.jsonl.tmp"), &stale).unwrap();
        assert_eq!(storage.last_seq(session).unwrap(), 0);
        let _sink = storage.open_sink(session).unwrap();
        assert!(!dir.join("d.jsonl.tmp").exists());
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
        /// Whatever the mix of lines and the cutoff, a sweep keeps every record in order and
        /// leaves no Full line older than the cutoff.
        #[test]
        fn sweep_keeps_order_and_drops_old_content(
            lines in proptest::collection::vec((0u64..1000, any::<bool>()), 0..40),
            cutoff in 0u64..1200,
        ) {
            let mut file = Vec::new();
            for (i, (ts, full)) in lines.iter().enumerate() {
                let record = full_record(i as u64 + 1, *ts, "content");
                let record = if *full { record } else { downgrade(record) };
                file.extend(serde_json::to_vec(&record).unwrap());
                file.push(b'\n');
            }
            let out = sweep_lines(&file, cutoff);
            let bytes = if out.changed() { out.bytes.clone() } else { file.clone() };
            let records: Vec<RolloutRecord> = bytes
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice(l).unwrap())
                .collect();
            prop_assert_eq!(records.len(), lines.len());
            for (i, r) in records.iter().enumerate() {
                prop_assert_eq!(r.seq, i as u64 + 1);
                prop_assert!(r.level != RecordLevel::Full || r.ts_ms >= cutoff);
            }
            let expected_oldest = records.iter().filter(|r| r.level == RecordLevel::Full).map(|r| r.ts_ms).min();
            prop_assert_eq!(out.oldest_full, expected_oldest);
        }
    }
}
