//! The TTL sweep: which lines of a file are due and what replaces them, the session's `ttl`
//! index, and the sweep of one session directory under its lock.

use super::*;

/// Removes temporary files an interrupted sweep left behind (under the session's lock).
pub(super) fn remove_stale_sweep_files(dir: &Path) -> io::Result<()> {
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

/// What a TTL sweep makes of a file.
#[derive(Debug, PartialEq)]
pub(super) struct SweepOutcome {
    /// The new content (valid only if something changed).
    pub(super) bytes: Vec<u8>,
    pub(super) downgraded: u64,
    /// Unreadable lines left out of the new content (they may hold content).
    pub(super) dropped: u64,
    /// The highest `seq` among the dropped lines whose number is readable.
    pub(super) dropped_seq: Option<u64>,
    /// The earliest expiry of the `Full` lines left.
    pub(super) next_due: Option<u64>,
}

impl SweepOutcome {
    /// Only a file with due content is rewritten: a sink that never wrote Ttl content does
    /// not take the lock, so its files must never be replaced under it.
    pub(super) fn changed(&self) -> bool {
        self.downgraded > 0
    }
}

/// Downgrades every `Full` line due at `now_ms`; other lines are kept byte for byte, except
/// those whose expiry is inferred from the conversation's policy, which get it written.
pub(super) fn sweep_lines(input: &[u8], now_ms: u64) -> SweepOutcome {
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
pub(super) fn expiry(record: &RolloutRecord, opened_ttl: Option<u64>) -> Option<u64> {
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
pub(super) struct TtlIndex {
    /// Earliest expiry held; `0`: unknown; `u64::MAX`: nothing.
    pub(super) due_ms: u64,
    /// Sweeps that replaced files of the session.
    pub(super) generation: u64,
}

impl TtlIndex {
    /// Nothing known: the next sweep reads every file.
    pub(super) const UNKNOWN: Self = Self {
        due_ms: 0,
        generation: 0,
    };
    /// Fixed width, so each write replaces the whole index.
    pub(super) const LEN: usize = 2 * HIGH_WATER_WIDTH + 2;

    pub(super) fn encode(self) -> String {
        format!(
            "{:0w$} {:0w$}\n",
            self.due_ms,
            self.generation,
            w = HIGH_WATER_WIDTH
        )
    }

    /// `None` for an empty or torn index.
    pub(super) fn decode(bytes: &[u8]) -> Option<Self> {
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

pub(super) fn open_ttl_file(path: &Path) -> io::Result<File> {
    private_file_options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// The index in an open `ttl` file (unknown when empty or unreadable).
pub(super) fn read_index(mut file: &File) -> io::Result<TtlIndex> {
    let mut bytes = Vec::with_capacity(TtlIndex::LEN);
    file.seek(SeekFrom::Start(0))?;
    file.take(u64::try_from(TtlIndex::LEN * 2).unwrap_or(u64::MAX))
        .read_to_end(&mut bytes)?;
    Ok(TtlIndex::decode(&bytes).unwrap_or(TtlIndex::UNKNOWN))
}

pub(super) fn write_index(mut file: &File, index: TtlIndex) -> io::Result<()> {
    file.seek(SeekFrom::Start(0))?;
    file.write_all(index.encode().as_bytes())
}

/// What sweeping one session did.
pub(super) struct SessionSweep {
    pub(super) downgraded: u64,
    /// The first failure; the session's index then says unknown, so the next sweep retries.
    pub(super) error: Option<io::Error>,
}

/// Sweeps one session directory at `now_ms` (see the module doc), waiting at most `lock_wait`
/// for a sink's batch. Blocking.
pub(super) fn sweep_session(dir: &Path, now_ms: u64, lock_wait: Duration) -> SessionSweep {
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
