//! [`FileSink`]: one session's appends, buffered per file, committed (and fsynced at sync
//! points) in batches, with at most [`MAX_OPEN_FILES`] files open and the `ttl` lock held
//! for a batch once the session holds Ttl content.

use super::*;

/// A record file of the session's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Target {
    Session,
    Conversation(ConversationId),
}

impl Target {
    pub(super) fn of(conversation_id: Option<ConversationId>) -> Self {
        conversation_id.map_or(Self::Session, Self::Conversation)
    }

    pub(super) fn path(self, dir: &Path) -> PathBuf {
        match self {
            Self::Session => dir.join(SESSION_FILE),
            Self::Conversation(id) => dir.join(format!("{id}.jsonl")),
        }
    }
}

/// An open rollout file.
pub(super) struct OpenFile {
    pub(super) out: BufWriter<File>,
    /// For least-recently-used eviction.
    pub(super) last_used: u64,
}

/// The high-water file, opened on first use.
#[derive(Default)]
pub(super) struct HighWater {
    pub(super) file: Option<File>,
    /// The value last written to it.
    pub(super) written: u64,
    /// Written since the last fsync.
    pub(super) unsynced: bool,
}

/// The writing side of one session's directory; lives on the Rollout's writer thread.
pub struct FileSink {
    pub(super) dir: PathBuf,
    pub(super) dir_created: bool,
    /// A file was created since the directory was last fsynced.
    pub(super) dir_dirty: bool,
    pub(super) open: HashMap<Target, OpenFile>,
    pub(super) tick: u64,
    /// Open files holding lines not yet fsynced. Always a subset of `open`: a file is fsynced
    /// before it is closed.
    pub(super) unsynced: HashSet<Target>,
    /// Files whose last write failed: the next write starts with a newline so that a torn
    /// line stays on a line of its own.
    pub(super) tainted: HashSet<Target>,
    /// The highest `seq` appended by this sink: no high-water write is needed up to it.
    pub(super) max_appended: u64,
    pub(super) high_water: HighWater,
    /// The first failure since the last commit that no `append` reported (lines of earlier
    /// appends lost while closing a file): the next commit fails with it.
    pub(super) pending_error: Option<SinkError>,
    /// The session's Ttl lock and index. Dropping it releases the lock after the files above
    /// are closed.
    pub(super) ttl: TtlLock,
    /// The session's writer lease (`writer.lock`), held for the sink's life: a sink of the same
    /// session (a restarted Rollout whose predecessor was killed, or another process) opens
    /// only once this one has committed and closed everything. Last: released after the rest.
    pub(super) lease: Option<File>,
}

/// The sink's side of the session's `ttl` file.
#[derive(Default)]
pub(super) struct TtlLock {
    /// Opened at the first Ttl append (or found at open).
    pub(super) file: Option<File>,
    /// The session holds Ttl content, so a sweep may replace its files or raise its
    /// high-water mark: every append, and a commit that moves the mark, takes the lock.
    pub(super) active: bool,
    /// Held from the first Ttl append of a batch to the end of its commit.
    pub(super) locked: bool,
    /// The index as last read or written under the lock.
    pub(super) index: Option<TtlIndex>,
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

pub(super) fn timed_sync(file: &File) -> io::Result<()> {
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
    pub(super) fn note_expiry(&mut self, expires_ms: u64) -> io::Result<()> {
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
    pub(super) fn lock_ttl(&mut self) -> io::Result<()> {
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

    pub(super) fn unlock_ttl(&mut self) {
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

    pub(super) fn ensure_dir(&mut self) -> io::Result<()> {
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

    pub(super) fn ensure_open(&mut self, target: Target) -> Result<(), (WriteOp, io::Error)> {
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
    pub(super) fn close(&mut self, target: Target) -> Result<(), SinkError> {
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
    pub(super) fn write_high_water(&mut self, value: u64) -> io::Result<()> {
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

    pub(super) fn error(
        &self,
        op: WriteOp,
        target: Target,
        e: &dyn std::fmt::Display,
    ) -> SinkError {
        SinkError::new(
            op.as_str(),
            format!("{}: {e}", target.path(&self.dir).display()),
        )
    }

    /// A write to `target` failed: its handle is dropped with its buffer (a retry could tear a
    /// line twice), and the next write to it starts on a new line.
    pub(super) fn failed(
        &mut self,
        op: WriteOp,
        target: Target,
        e: &dyn std::fmt::Display,
    ) -> SinkError {
        if let Some(file) = self.open.remove(&target) {
            let _ = file.out.into_parts();
        }
        self.unsynced.remove(&target);
        self.tainted.insert(target);
        self.error(op, target, e)
    }

    pub(super) fn failed_closed(
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
