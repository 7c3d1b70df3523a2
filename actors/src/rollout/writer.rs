//! The rollout writers: a small pool of threads shared by every session of the process. Each
//! session's Rollout attaches its [`RolloutSink`] to one of them ([`WriterHandle`]); that
//! writer group-commits what the actor hands it and publishes each event to live subscribers
//! once the commit that covers it has returned. A session costs no thread: the pool has
//! [`pool_threads`] threads whatever the number of sessions, and a session is attached to one
//! of them (round robin) from its Rollout's start to its stop.
//!
//! Loop of a pool thread: block for one command, take what else is queued (up to
//! [`MAX_BATCH`], across the sessions it serves), then for each session of the batch, in the
//! order its commands came: append every record, commit once (`sync` when its part of the
//! batch holds a sync point or a flush, with the highest `seq` assigned so far as the
//! high-water mark), publish its events in order and answer its barriers. A session's
//! commands are never reordered, since one actor sends them all to one thread. An event whose
//! append failed, or whose commit failed, is not published (counted as withheld): a
//! subscriber only ever sees what storage keeps, and numbers storage has accounted for.
//! Errors are logged, counted by [`SinkError::op`] and reported to the next flush. A sink that
//! panics takes only its own session's writer down (its handle then reports the writer gone);
//! the thread goes on serving the others.

use super::metrics;
use super::storage::{RolloutSink, SinkError};
use super::{RolloutRecord, is_sync_point};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tokio::sync::broadcast;
use troupe_proto::{AgentError, ConversationId, EventEnvelope, SessionId};

/// Commands the writer takes into one group commit at most.
pub(super) const MAX_BATCH: usize = 1024;

pub(super) type AckSender = crossbeam_channel::Sender<Result<(), AgentError>>;
pub(super) type AckReceiver = crossbeam_channel::Receiver<Result<(), AgentError>>;

/// Blocks until the writer answers a flush or a barrier.
pub(super) fn wait_ack(ack: &AckReceiver) -> Result<(), AgentError> {
    ack.recv().unwrap_or_else(|_| {
        Err(AgentError::internal(
            "rollout writer stopped before answering",
        ))
    })
}

/// What the actor asks of its writer thread.
// `Event` is nearly every command; boxing it would only add an allocation per event.
#[allow(clippy::large_enum_variant)]
pub(super) enum WriterCmd {
    /// Record (if the policy kept anything) and, once committed, publish.
    Event {
        record: Option<RolloutRecord>,
        env: Arc<EventEnvelope>,
        /// When it was numbered, for the publish delay.
        stamped: Instant,
    },
    /// Commit with fsync, then ack with the first error since the previous flush.
    Flush { ack: AckSender },
    /// Commit (no fsync), then ack: everything handed over before is committed and published.
    Barrier { ack: AckSender },
    /// The conversation is over: release what the sink holds for it.
    Forget { conversation_id: ConversationId },
    /// Test only: die at once, as a killed process would, committing and publishing nothing
    /// more.
    #[cfg(test)]
    Crash,
}

/// The actor's end of its writer: the pool thread its session is attached to.
pub(super) struct WriterHandle {
    /// Its key in the pool thread.
    key: u64,
    /// `None` once detached.
    tx: Option<crossbeam_channel::Sender<PoolCmd>>,
    /// Cleared by the pool thread when this writer is gone (its sink panicked, or a test
    /// crashed it): commands then go nowhere, and [`send`](Self::send) says so.
    alive: Arc<AtomicBool>,
}

impl WriterHandle {
    /// Attaches a session's sink to a pool thread. `high_water`: the last `seq` storage knows
    /// of. Fails only when the pool cannot start a thread the first time it is used.
    pub(super) fn spawn(
        sink: Box<dyn RolloutSink>,
        session_id: SessionId,
        events: broadcast::Sender<Arc<EventEnvelope>>,
        high_water: u64,
    ) -> std::io::Result<Self> {
        let pool = pool()?;
        let key = pool.next_key.fetch_add(1, Ordering::Relaxed);
        let tx = pool.shard(key).clone();
        let alive = Arc::new(AtomicBool::new(true));
        let writer = Writer {
            sink,
            session_id,
            events,
            high_water,
            error: None,
            alive: alive.clone(),
        };
        tx.send(PoolCmd::Attach {
            key,
            writer: Box::new(writer),
        })
        .map_err(|_| std::io::Error::other("rollout writer pool stopped"))?;
        metrics::writer_attached();
        Ok(Self {
            key,
            tx: Some(tx),
            alive,
        })
    }

    /// Hands a command over; `false` when this session's writer is gone.
    pub(super) fn send(&self, cmd: WriterCmd) -> bool {
        self.alive.load(Ordering::Acquire)
            && self
                .tx
                .as_ref()
                .is_some_and(|tx| tx.send(PoolCmd::Session { key: self.key, cmd }).is_ok())
    }

    /// Detaches: the writer commits what it holds, fsyncs and releases its sink; returns once
    /// it has.
    pub(super) async fn shutdown(mut self, session_id: SessionId) {
        let Some(done) = self.detach() else {
            return;
        };
        match tokio::task::spawn_blocking(move || done.recv()).await {
            Ok(Ok(())) => tracing::debug!(%session_id, "rollout writer stopped"),
            Ok(Err(_)) => tracing::debug!(%session_id, "rollout writer was already gone"),
            Err(e) => {
                tracing::error!(%session_id, error = %e, "waiting for the rollout writer failed")
            }
        }
    }

    /// Asks the pool thread to detach this writer; the receiver hears when it has.
    fn detach(&mut self) -> Option<crossbeam_channel::Receiver<()>> {
        let tx = self.tx.take()?;
        let (done, rx) = crossbeam_channel::bounded(1);
        tx.send(PoolCmd::Detach {
            key: self.key,
            done,
        })
        .ok()?;
        Some(rx)
    }
}

impl Drop for WriterHandle {
    /// Without a shutdown (the actor was killed, or panicked): the writer still commits what
    /// it was handed, and this waits for it, blocking, so that a Rollout restarted on the same
    /// session reads `last_seq` only after every number this one handed out is accounted
    /// for. The wait is bounded by the work already queued on its pool thread; it never needs
    /// the async runtime.
    fn drop(&mut self) {
        if let Some(done) = self.detach() {
            let _ = done.recv();
        }
    }
}

/// Threads of the writer pool: one per core, at least 2 and at most 8 (a writer spends most
/// of its time in write and fsync calls, so a few threads keep several disks' queues busy).
pub fn pool_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, std::num::NonZeroUsize::get)
        .clamp(2, 8)
}

/// What a pool thread is asked.
// `Session` is nearly every command (see [`WriterCmd`]).
#[allow(clippy::large_enum_variant)]
enum PoolCmd {
    /// Serve a session's writer from now on.
    Attach { key: u64, writer: Box<Writer> },
    /// A command of the session attached under `key`.
    Session { key: u64, cmd: WriterCmd },
    /// Commit what the writer holds, fsync, release it, then say so.
    Detach {
        key: u64,
        done: crossbeam_channel::Sender<()>,
    },
}

/// The process's writer threads, started on first use and kept for the process's life.
struct WriterPool {
    shards: Vec<crossbeam_channel::Sender<PoolCmd>>,
    next_key: AtomicU64,
}

impl WriterPool {
    fn start(threads: usize) -> std::io::Result<Self> {
        let mut shards = Vec::with_capacity(threads);
        for index in 0..threads {
            let (tx, rx) = crossbeam_channel::unbounded();
            std::thread::Builder::new()
                .name(format!("rollout-writer-{index}"))
                .spawn(move || {
                    let span = tracing::info_span!("rollout_writer", thread = index);
                    let _entered = span.enter();
                    PoolThread::default().run(&rx);
                })?;
            shards.push(tx);
        }
        metrics::pool_threads(threads);
        Ok(Self {
            shards,
            next_key: AtomicU64::new(0),
        })
    }

    /// The thread serving `key`: round robin over the pool.
    fn shard(&self, key: u64) -> &crossbeam_channel::Sender<PoolCmd> {
        let index = usize::try_from(key % self.shards.len() as u64).unwrap_or(0);
        &self.shards[index]
    }
}

fn pool() -> std::io::Result<&'static WriterPool> {
    static POOL: OnceLock<WriterPool> = OnceLock::new();
    if let Some(pool) = POOL.get() {
        return Ok(pool);
    }
    let started = WriterPool::start(pool_threads())?;
    // Two first users may race: the loser's threads see their channels close and end.
    Ok(POOL.get_or_init(|| started))
}

/// One pool thread: the writers attached to it.
#[derive(Default)]
struct PoolThread {
    writers: HashMap<u64, Box<Writer>>,
}

impl PoolThread {
    /// Group commit loop: block for one command, take what else is queued, then serve each
    /// session's part of the batch in turn.
    fn run(&mut self, rx: &crossbeam_channel::Receiver<PoolCmd>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Ok(first) = rx.recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(cmd) => batch.push(cmd),
                    Err(_) => break,
                }
            }
            metrics::batch(batch.len());
            self.process(&mut batch);
        }
        // The pool is gone (the process ends): make everything durable.
        for (_, writer) in self.writers.drain() {
            (*writer).close();
        }
    }

    /// Serves one batch: each session's commands, in their order, as one group commit per
    /// session; attaches and detaches take effect where they stand in that order.
    fn process(&mut self, batch: &mut Vec<PoolCmd>) {
        // Per session, the commands not yet served, in arrival order (sessions in the order
        // they first appear).
        let mut parts: Vec<(u64, Vec<WriterCmd>)> = Vec::new();
        for cmd in batch.drain(..) {
            match cmd {
                PoolCmd::Session { key, cmd } => match parts.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, cmds)) => cmds.push(cmd),
                    None => parts.push((key, vec![cmd])),
                },
                PoolCmd::Attach { key, writer } => {
                    self.writers.insert(key, writer);
                }
                PoolCmd::Detach { key, done } => {
                    if let Some(at) = parts.iter().position(|(k, _)| *k == key) {
                        let (_, cmds) = parts.swap_remove(at);
                        self.serve(key, cmds);
                    }
                    if let Some(writer) = self.writers.remove(&key) {
                        (*writer).close();
                        metrics::writer_detached();
                    }
                    let _ = done.send(());
                }
            }
        }
        for (key, cmds) in parts {
            self.serve(key, cmds);
        }
    }

    /// One session's part of a batch. A panic in its sink ends that writer only.
    fn serve(&mut self, key: u64, cmds: Vec<WriterCmd>) {
        let Some(writer) = self.writers.get_mut(&key) else {
            // Gone (crashed or panicked): its commands and their acks are dropped, and the
            // acks' receivers hear that the writer stopped.
            return;
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            writer.process(cmds.into_iter())
        }));
        let crashed = match outcome {
            Ok(Next::Continue) => return,
            #[cfg(test)]
            Ok(Next::Crashed) => true,
            Err(_) => {
                tracing::error!(
                    session_id = %writer.session_id,
                    "rollout writer panicked; its session's writer is gone"
                );
                metrics::write_error("panic");
                false
            }
        };
        if let Some(writer) = self.writers.remove(&key) {
            writer.alive.store(false, Ordering::Release);
            metrics::writer_detached();
            if crashed {
                // Nothing buffered may reach storage: the sink is abandoned, not dropped (its
                // destructors would flush). Subscribers still see the channel close.
                let Writer { sink, .. } = *writer;
                sink.abandon();
            }
        }
    }
}

/// The writer thread's state.
struct Writer {
    sink: Box<dyn RolloutSink>,
    session_id: SessionId,
    /// Live subscribers; the actor keeps the sender that subscribes them.
    events: broadcast::Sender<Arc<EventEnvelope>>,
    /// The highest `seq` handed over so far (recorded or not).
    high_water: u64,
    /// The first error since the last flush ack, reported to the next flush.
    error: Option<String>,
    /// Shared with the handle: cleared when this writer is gone.
    alive: Arc<AtomicBool>,
}

/// An event of the batch being committed.
struct Pending {
    env: Arc<EventEnvelope>,
    stamped: Instant,
    /// Its record (if any) was appended.
    appended: bool,
}

/// Whether the writer goes on after a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Continue,
    #[cfg(test)]
    Crashed,
}

impl Writer {
    /// Detached (or the process ends): make everything handed over durable, then release
    /// the sink.
    fn close(mut self) {
        if let Err(e) = self.commit(true) {
            self.fail(&e);
        }
        if let Some(error) = self.error.take() {
            tracing::error!(session_id = %self.session_id, %error, "rollout writer stopped after a write error");
        }
    }

    fn process(&mut self, batch: impl Iterator<Item = WriterCmd>) -> Next {
        let mut sync = false;
        let mut flushes = Vec::new();
        let mut barriers = Vec::new();
        let mut pending = Vec::new();
        for cmd in batch {
            match cmd {
                WriterCmd::Event {
                    record,
                    env,
                    stamped,
                } => {
                    self.high_water = self.high_water.max(env.seq);
                    let appended = match record {
                        None => true,
                        Some(record) => {
                            sync |= is_sync_point(record.kind);
                            match self.sink.append(record.conversation_id, &record) {
                                Ok(()) => {
                                    metrics::record_written(record.level);
                                    true
                                }
                                Err(e) => {
                                    self.fail(&e);
                                    false
                                }
                            }
                        }
                    };
                    pending.push(Pending {
                        env,
                        stamped,
                        appended,
                    });
                }
                WriterCmd::Flush { ack } => {
                    sync = true;
                    flushes.push(ack);
                }
                WriterCmd::Barrier { ack } => barriers.push(ack),
                WriterCmd::Forget { conversation_id } => {
                    if let Err(e) = self.sink.forget(conversation_id) {
                        self.fail(&e);
                    }
                }
                #[cfg(test)]
                WriterCmd::Crash => return Next::Crashed,
            }
        }
        let committed = match self.commit(sync) {
            Ok(()) => true,
            Err(e) => {
                self.fail(&e);
                false
            }
        };
        self.publish(pending, committed);
        if !flushes.is_empty() {
            let result = match self.error.take() {
                None => Ok(()),
                Some(error) => Err(AgentError::internal(format!(
                    "rollout write failed: {error}"
                ))),
            };
            for ack in flushes {
                let _ = ack.send(result.clone());
            }
        }
        for ack in barriers {
            let _ = ack.send(Ok(()));
        }
        Next::Continue
    }

    /// Commits what was appended, timed (the flush latency, whatever the storage).
    fn commit(&mut self, sync: bool) -> Result<(), SinkError> {
        let started = Instant::now();
        let result = self.sink.commit(sync, self.high_water);
        metrics::flushed(sync, started.elapsed());
        result
    }

    /// Publishes the batch's events that storage accounts for, in `seq` order.
    fn publish(&self, pending: Vec<Pending>, committed: bool) {
        for p in pending {
            let kind = p.env.event.name();
            if committed && p.appended {
                metrics::published(p.stamped.elapsed());
                // No receiver is not an error: nobody is watching live.
                let _ = self.events.send(p.env);
            } else {
                metrics::event_withheld(kind);
                tracing::warn!(
                    session_id = %self.session_id,
                    seq = p.env.seq,
                    %kind,
                    "event withheld: its record was not committed"
                );
            }
        }
    }

    /// Logs and counts an error, and keeps the first one for the next flush.
    fn fail(&mut self, error: &SinkError) {
        tracing::error!(session_id = %self.session_id, op = error.op, error = %error.message, "rollout storage failed");
        metrics::write_error(error.op);
        if self.error.is_none() {
            self.error = Some(error.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::EventKind;

    /// A sink that fails what it is told to, and remembers what it was asked.
    struct ScriptedSink {
        fail_append_seq: Option<u64>,
        panic_append_seq: Option<u64>,
        fail_commit: bool,
        log: crossbeam_channel::Sender<String>,
    }

    impl RolloutSink for ScriptedSink {
        fn append(
            &mut self,
            _conversation_id: Option<ConversationId>,
            record: &RolloutRecord,
        ) -> Result<(), SinkError> {
            let _ = self.log.send(format!("append {}", record.seq));
            assert_ne!(self.panic_append_seq, Some(record.seq), "sink bug");
            if self.fail_append_seq == Some(record.seq) {
                return Err(SinkError::new("write", "disk on fire"));
            }
            Ok(())
        }
        fn commit(&mut self, sync: bool, high_water: u64) -> Result<(), SinkError> {
            let _ = self.log.send(format!("commit {sync} {high_water}"));
            if self.fail_commit {
                return Err(SinkError::new("sync", "no space"));
            }
            Ok(())
        }
        fn forget(&mut self, _: ConversationId) -> Result<(), SinkError> {
            Ok(())
        }
    }

    fn event(seq: u64, kind: EventKind, recorded: bool) -> WriterCmd {
        let env = Arc::new(EventEnvelope {
            seq,
            ts_ms: seq,
            session_id: SessionId::new(),
            conversation_id: None,
            task_id: None,
            sub_id: None,
            trace_id: None,
            span_id: None,
            event: kind,
        });
        let record = recorded
            .then(|| super::super::record_for(troupe_proto::StoragePolicy::Full, &env))
            .flatten();
        WriterCmd::Event {
            record,
            env,
            stamped: Instant::now(),
        }
    }

    fn writer(sink: ScriptedSink) -> (Writer, broadcast::Receiver<Arc<EventEnvelope>>) {
        let (events, rx) = broadcast::channel(64);
        (
            Writer {
                sink: Box::new(sink),
                session_id: SessionId::new(),
                events,
                high_water: 10,
                error: None,
                alive: Arc::new(AtomicBool::new(true)),
            },
            rx,
        )
    }

    fn chunk() -> EventKind {
        EventKind::AssistantChunk { delta: "x".into() }
    }

    #[test]
    fn one_commit_per_batch_then_publish_in_order() {
        let (log, log_rx) = crossbeam_channel::unbounded();
        let (mut w, mut rx) = writer(ScriptedSink {
            fail_append_seq: None,
            panic_append_seq: None,
            fail_commit: false,
            log,
        });
        let (ack, ack_rx) = crossbeam_channel::bounded(1);
        let batch = vec![
            event(11, chunk(), true),
            event(12, chunk(), false),
            event(13, EventKind::TaskAborted { waited_ms: 0 }, true),
            WriterCmd::Barrier { ack },
            event(14, chunk(), false),
        ];
        assert_eq!(w.process(batch.into_iter()), Next::Continue);
        let calls: Vec<String> = log_rx.try_iter().collect();
        assert_eq!(
            calls,
            vec!["append 11", "append 13", "commit true 14"],
            "a sync point makes the commit sync; unrecorded numbers count for the high water"
        );
        let seqs: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, vec![11, 12, 13, 14]);
        assert_eq!(ack_rx.try_recv().unwrap(), Ok(()));
    }

    #[test]
    fn a_failed_append_withholds_that_event_and_fails_the_next_flush() {
        let (log, _log_rx) = crossbeam_channel::unbounded();
        let (mut w, mut rx) = writer(ScriptedSink {
            fail_append_seq: Some(12),
            panic_append_seq: None,
            fail_commit: false,
            log,
        });
        let (ack, ack_rx) = crossbeam_channel::bounded(1);
        let batch = vec![
            event(11, chunk(), true),
            event(12, chunk(), true),
            event(13, chunk(), false),
            WriterCmd::Flush { ack },
        ];
        w.process(batch.into_iter());
        let seqs: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, vec![11, 13]);
        assert!(matches!(
            ack_rx.try_recv().unwrap(),
            Err(AgentError::Internal { .. })
        ));
        // Reported once.
        let (ack, ack_rx) = crossbeam_channel::bounded(1);
        w.process(vec![WriterCmd::Flush { ack }].into_iter());
        assert_eq!(ack_rx.try_recv().unwrap(), Ok(()));
    }

    #[test]
    fn a_failed_commit_withholds_the_whole_batch() {
        let (log, _log_rx) = crossbeam_channel::unbounded();
        let (mut w, mut rx) = writer(ScriptedSink {
            fail_append_seq: None,
            panic_append_seq: None,
            fail_commit: true,
            log,
        });
        w.process(vec![event(11, chunk(), true), event(12, chunk(), false)].into_iter());
        assert!(rx.try_recv().is_err(), "nothing published");
        assert!(w.error.as_deref().is_some_and(|e| e.starts_with("sync:")));
    }

    fn sink(log: crossbeam_channel::Sender<String>, panic_at: Option<u64>) -> ScriptedSink {
        ScriptedSink {
            fail_append_seq: None,
            panic_append_seq: panic_at,
            fail_commit: false,
            log,
        }
    }

    fn attach(
        key: u64,
        sink: ScriptedSink,
    ) -> (
        PoolCmd,
        broadcast::Receiver<Arc<EventEnvelope>>,
        Arc<AtomicBool>,
    ) {
        let (w, rx) = writer(sink);
        let alive = w.alive.clone();
        (
            PoolCmd::Attach {
                key,
                writer: Box::new(w),
            },
            rx,
            alive,
        )
    }

    fn on(key: u64, cmd: WriterCmd) -> PoolCmd {
        PoolCmd::Session { key, cmd }
    }

    fn seqs(rx: &mut broadcast::Receiver<Arc<EventEnvelope>>) -> Vec<u64> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e.seq)
            .collect()
    }

    #[test]
    fn one_thread_commits_each_session_of_a_batch_once_and_keeps_each_sessions_order() {
        let (log_a, log_a_rx) = crossbeam_channel::unbounded();
        let (log_b, log_b_rx) = crossbeam_channel::unbounded();
        let (attach_a, mut rx_a, _) = attach(1, sink(log_a, None));
        let (attach_b, mut rx_b, _) = attach(2, sink(log_b, None));
        let mut thread = PoolThread::default();
        let mut batch = vec![
            attach_a,
            attach_b,
            on(1, event(11, chunk(), true)),
            on(2, event(11, chunk(), true)),
            on(1, event(12, chunk(), true)),
            on(2, event(12, chunk(), false)),
            on(1, event(13, chunk(), true)),
        ];
        thread.process(&mut batch);
        assert_eq!(seqs(&mut rx_a), vec![11, 12, 13]);
        assert_eq!(seqs(&mut rx_b), vec![11, 12]);
        let a: Vec<String> = log_a_rx.try_iter().collect();
        let b: Vec<String> = log_b_rx.try_iter().collect();
        assert_eq!(
            a,
            vec!["append 11", "append 12", "append 13", "commit false 13"]
        );
        assert_eq!(b, vec!["append 11", "commit false 12"]);
    }

    #[test]
    fn a_detach_serves_what_came_before_it_and_nothing_after() {
        let (log, log_rx) = crossbeam_channel::unbounded();
        let (attach_a, mut rx, alive) = attach(7, sink(log, None));
        let (done, done_rx) = crossbeam_channel::bounded(1);
        let mut thread = PoolThread::default();
        let mut batch = vec![
            attach_a,
            on(7, event(11, chunk(), true)),
            PoolCmd::Detach { key: 7, done },
            on(7, event(12, chunk(), true)),
        ];
        thread.process(&mut batch);
        assert_eq!(seqs(&mut rx), vec![11]);
        let calls: Vec<String> = log_rx.try_iter().collect();
        assert_eq!(
            calls,
            vec!["append 11", "commit false 11", "commit true 11"],
            "served, then closed with an fsync"
        );
        assert_eq!(done_rx.try_recv(), Ok(()));
        assert!(thread.writers.is_empty());
        assert!(alive.load(Ordering::Acquire), "detached, not failed");
    }

    #[test]
    fn a_panicking_sink_takes_down_only_its_own_sessions_writer() {
        let (log_a, _log_a_rx) = crossbeam_channel::unbounded();
        let (log_b, _log_b_rx) = crossbeam_channel::unbounded();
        let (attach_a, _rx_a, alive_a) = attach(1, sink(log_a, Some(12)));
        let (attach_b, mut rx_b, alive_b) = attach(2, sink(log_b, None));
        let mut thread = PoolThread::default();
        let mut batch = vec![
            attach_a,
            attach_b,
            on(1, event(11, chunk(), true)),
            on(1, event(12, chunk(), true)),
            on(2, event(11, chunk(), true)),
        ];
        thread.process(&mut batch);
        assert!(
            !alive_a.load(Ordering::Acquire),
            "its handle hears it is gone"
        );
        assert!(alive_b.load(Ordering::Acquire));
        let (ack, ack_rx) = crossbeam_channel::bounded(1);
        let mut batch = vec![
            on(1, WriterCmd::Flush { ack }),
            on(2, event(12, chunk(), true)),
        ];
        thread.process(&mut batch);
        assert!(
            wait_ack(&ack_rx).is_err(),
            "a flush of the gone writer answers that it stopped"
        );
        assert_eq!(seqs(&mut rx_b), vec![11, 12]);
    }

    #[test]
    fn many_sessions_share_the_pools_threads() {
        let sessions: Vec<WriterHandle> = (0..300)
            .map(|_| {
                let (log, _) = crossbeam_channel::unbounded();
                let (events, _) = broadcast::channel(4);
                WriterHandle::spawn(Box::new(sink(log, None)), SessionId::new(), events, 0).unwrap()
            })
            .collect();
        for handle in &sessions {
            let (ack, ack_rx) = crossbeam_channel::bounded(1);
            assert!(handle.send(WriterCmd::Barrier { ack }));
            assert_eq!(wait_ack(&ack_rx), Ok(()));
        }
        // Every pool thread has served a session by now, so each has its name.
        let writer_threads = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("rollout-writer"))
            .count();
        assert_eq!(writer_threads, pool_threads());
        drop(sessions);
    }
}
