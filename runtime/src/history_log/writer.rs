//! Writing the history: the task that owns the session's record stream and the file, and its
//! handle.
//!
//! The task reads a [`HistoryFeed`]: the session's gap-free stream of records
//! ([`SessionHandle::events`]), which refills from storage when it falls behind the live
//! events instead of skipping them. It appends through a buffer over `tokio::fs` (writes run on
//! the blocking pool, never on a runtime thread) and flushes after every `turn_end`, warning
//! and `session_end`, and after [`IDLE_FLUSH`] without events, so a `tail -f` sees a long
//! step's lines too.

use super::{HistoryLine, HistoryLog, HistoryLogOptions, LineType, Tokens};
use futures::FutureExt;
use futures::stream::{BoxStream, Stream, StreamExt};
use serde::Deserialize;
use std::io::{BufRead, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::Instrument;
use troupe_actors::SessionHandle;
use troupe_actors::rollout::RolloutRecord;
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_proto::{AgentError, SessionId};

/// How long buffered lines may wait for a flush when no event arrives.
const IDLE_FLUSH: Duration = Duration::from_secs(1);

/// Records read from storage at once when the log catches up at its end.
const CATCH_UP_PAGE: usize = 256;

/// What the log reads: the session's records in `seq` order, and where to read the rest from
/// when that stream ends before the log does.
pub struct HistoryFeed {
    records: BoxStream<'static, Result<RolloutRecord, AgentError>>,
    /// Read after the stream ended (with the session, or with an error) when the log is
    /// finished: a stream that fell behind as its session ended could not refill itself.
    storage: Option<Arc<dyn RolloutStorage>>,
}

impl std::fmt::Debug for HistoryFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryFeed")
            .field("storage", &self.storage.is_some())
            .finish_non_exhaustive()
    }
}

impl HistoryFeed {
    /// Any stream of records in strictly increasing `seq` (tests, embedders).
    pub fn new(
        records: impl Stream<Item = Result<RolloutRecord, AgentError>> + Send + 'static,
    ) -> Self {
        Self {
            records: records.boxed(),
            storage: None,
        }
    }

    /// The session's events with `seq > after_seq` ([`SessionHandle::events`]): what storage
    /// kept, then the live events; nothing skipped when the log falls behind.
    pub async fn of_session(session: &SessionHandle, after_seq: u64) -> Result<Self, AgentError> {
        Ok(Self::new(session.events(after_seq).await?))
    }

    /// Where the session's rollout is stored: what the stream did not deliver before it ended
    /// is read from there when the log is finished.
    pub fn with_storage(mut self, storage: Arc<dyn RolloutStorage>) -> Self {
        self.storage = Some(storage);
        self
    }
}

/// What a finished log wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistorySummary {
    pub path: PathBuf,
    /// Lines written in this run, `session_start` and `session_end` included.
    pub lines: u64,
    /// Turns started in this run.
    pub turns: u32,
    /// Totals of the turns that ended in this run.
    pub tokens: Tokens,
}

impl HistoryLog {
    /// Starts the log of `session_id` in `dir/<session_id>.jsonl` with default options.
    pub async fn start(
        dir: &Path,
        session_id: SessionId,
        feed: HistoryFeed,
    ) -> Result<HistoryLogHandle, AgentError> {
        Self::start_with(dir, session_id, feed, HistoryLogOptions::default()).await
    }

    /// Starts the log: creates `dir`, opens the file for appending, writes `session_start`,
    /// and spawns the task that writes the records of `feed`.
    pub async fn start_with(
        dir: &Path,
        session_id: SessionId,
        feed: HistoryFeed,
        options: HistoryLogOptions,
    ) -> Result<HistoryLogHandle, AgentError> {
        let path = dir.join(format!("{session_id}.jsonl"));
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| io_error("create", dir, &e))?;
        let scan_path = path.clone();
        let existing = tokio::task::spawn_blocking(move || scan_existing(&scan_path))
            .await
            .map_err(|e| AgentError::internal(format!("history log scan: {e}")))?
            .map_err(|e| io_error("read", &path, &e))?;
        let mut open = tokio::fs::OpenOptions::new();
        // The conversation's content: the user's alone, as its rollout files are.
        #[cfg(unix)]
        open.mode(0o600);
        let file = open
            .create(true)
            .append(true)
            .open(&path)
            .await
            .map_err(|e| io_error("open", &path, &e))?;
        let mut writer = Writer {
            out: BufWriter::new(file),
            path: path.clone(),
            lines: 0,
            dirty: false,
        };
        if existing.torn_tail {
            // A crash cut the last line short: end it so the next line stands alone.
            writer.raw(b"\n").await?;
        }
        let mut log = Self::new(session_id, options, existing.last_turn);
        writer.line(&log.session_start(now_ms())).await?;
        writer.flush().await?;
        tracing::info!(%session_id, path = %path.display(), "history log started");

        let (stop, stopped) = oneshot::channel();
        let span = tracing::info_span!("history_log", %session_id);
        let join = tokio::spawn(
            async move {
                let result = run(&mut log, &mut writer, feed, session_id, stopped).await;
                if let Err(e) = &result {
                    tracing::error!(error = %e, "history log stopped");
                }
                result.map(|()| HistorySummary {
                    path: writer.path,
                    lines: writer.lines,
                    turns: log.turns_started,
                    tokens: log.totals,
                })
            }
            .instrument(span),
        );
        Ok(HistoryLogHandle {
            path,
            stop: Some(stop),
            join,
        })
    }
}

/// The running log: stop it with [`finish`](Self::finish).
#[derive(Debug)]
pub struct HistoryLogHandle {
    path: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    join: JoinHandle<Result<HistorySummary, AgentError>>,
}

impl HistoryLogHandle {
    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes what is already queued, then `session_end`, flushes, and returns what was
    /// written (or the I/O error that stopped the log).
    pub async fn finish(mut self) -> Result<HistorySummary, AgentError> {
        if let Some(stop) = self.stop.take() {
            // Gone already: the channel closed and the task is ending on its own.
            let _ = stop.send(());
        }
        match (&mut self.join).await {
            Ok(result) => result,
            Err(e) => Err(AgentError::internal(format!("history log task: {e}"))),
        }
    }
}

/// The writing side: a buffered append-only file.
struct Writer {
    out: BufWriter<tokio::fs::File>,
    path: PathBuf,
    lines: u64,
    /// Bytes in the buffer since the last flush.
    dirty: bool,
}

impl Writer {
    async fn line(&mut self, line: &HistoryLine) -> Result<(), AgentError> {
        let mut bytes = serde_json::to_vec(line)
            .map_err(|e| AgentError::internal(format!("history line: {e}")))?;
        bytes.push(b'\n');
        self.raw(&bytes).await?;
        self.lines += 1;
        Ok(())
    }

    async fn raw(&mut self, bytes: &[u8]) -> Result<(), AgentError> {
        self.dirty = true;
        self.out
            .write_all(bytes)
            .await
            .map_err(|e| io_error("write", &self.path, &e))
    }

    async fn flush(&mut self) -> Result<(), AgentError> {
        self.dirty = false;
        self.out
            .flush()
            .await
            .map_err(|e| io_error("flush", &self.path, &e))
    }

    /// Writes `lines` (emptying it), flushing after a turn's end or a warning.
    async fn lines(&mut self, lines: &mut Vec<HistoryLine>) -> Result<(), AgentError> {
        let mut flush = false;
        for line in lines.drain(..) {
            self.line(&line).await?;
            flush |= matches!(
                line.kind,
                LineType::TurnEnd | LineType::Warning | LineType::SessionEnd
            );
        }
        if flush {
            self.flush().await?;
        }
        Ok(())
    }
}

/// The log's task: records until stopped (or the stream ends and the log is stopped), then
/// what storage holds beyond the last one, then `session_end`.
async fn run(
    log: &mut HistoryLog,
    writer: &mut Writer,
    feed: HistoryFeed,
    session_id: SessionId,
    mut stop: oneshot::Receiver<()>,
) -> Result<(), AgentError> {
    let HistoryFeed {
        mut records,
        storage,
    } = feed;
    let mut lines = Vec::new();
    // The last `seq` written: where a catch-up from storage starts.
    let mut last = 0;
    let mut ended = false;
    let mut failure: Option<AgentError> = None;
    loop {
        let dirty = writer.dirty;
        tokio::select! {
            biased;
            // A dropped handle stops the log too.
            _ = &mut stop => break,
            received = records.next(), if !ended => match received {
                Some(Ok(record)) => {
                    if record.seq > last {
                        last = record.seq;
                        log.on_record(&record, &mut lines);
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, after = last, "history log stream failed");
                    failure = Some(e);
                    ended = true;
                }
                None => ended = true,
            },
            () = tokio::time::sleep(IDLE_FLUSH), if dirty => writer.flush().await?,
        }
        writer.lines(&mut lines).await?;
    }
    // What the stream already holds belongs in the file.
    while !ended {
        match records.next().now_or_never() {
            Some(Some(Ok(record))) => {
                if record.seq > last {
                    last = record.seq;
                    log.on_record(&record, &mut lines);
                }
            }
            Some(Some(Err(e))) => {
                failure = Some(e);
                ended = true;
            }
            Some(None) => ended = true,
            None => break,
        }
        writer.lines(&mut lines).await?;
    }
    // The stream may have ended behind the record (it lagged as its session ended): the rest
    // is in storage.
    if let Some(storage) = storage {
        failure = None;
        loop {
            let storage = storage.clone();
            let page = tokio::task::spawn_blocking(move || {
                storage.read_after(session_id, last, CATCH_UP_PAGE)
            })
            .await
            .map_err(|e| AgentError::internal(format!("history log catch-up: {e}")))?;
            let page = match page {
                Ok(page) => page,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            let full = page.len() == CATCH_UP_PAGE;
            for record in page {
                if record.seq > last {
                    last = record.seq;
                    log.on_record(&record, &mut lines);
                }
            }
            writer.lines(&mut lines).await?;
            if !full {
                break;
            }
        }
    }
    if let Some(e) = failure {
        tracing::warn!(error = %e, after = last, "history log may miss the events after this seq");
        let message = format!("history log could not read the events after seq {last}: {e}");
        log.on_gap(&message, now_ms(), &mut lines);
    }
    log.session_end(now_ms(), &mut lines);
    writer.lines(&mut lines).await?;
    writer.flush().await?;
    tracing::info!(
        lines = writer.lines,
        last_seq = last,
        "history log finished"
    );
    Ok(())
}

/// What an existing file tells a reopened log.
#[derive(Debug, Default)]
struct Existing {
    last_turn: u32,
    /// The file does not end with a newline (a write was cut short).
    torn_tail: bool,
}

/// Reads an existing history file for its last turn number. Unreadable lines (a torn write)
/// are skipped; a missing file is empty.
fn scan_existing(path: &Path) -> std::io::Result<Existing> {
    #[derive(Deserialize)]
    struct TurnOnly {
        turn: u32,
    }
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Existing::default()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(Existing::default());
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    file.seek(SeekFrom::Start(0))?;
    let mut existing = Existing {
        last_turn: 0,
        torn_tail: last[0] != b'\n',
    };
    for line in std::io::BufReader::new(file).lines() {
        if let Ok(t) = serde_json::from_str::<TurnOnly>(&line?) {
            existing.last_turn = existing.last_turn.max(t.turn);
        }
    }
    Ok(existing)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn io_error(op: &str, path: &Path, e: &std::io::Error) -> AgentError {
    AgentError::internal(format!("history log: {op} {}: {e}", path.display()))
}
