//! The Rollout's writer thread: it owns the session's [`RolloutSink`], group-commits what the
//! actor hands it, and publishes each event to live subscribers once the commit that covers it
//! has returned.
//!
//! Loop: block for one command, take what else is queued (up to [`MAX_BATCH`]), append every
//! record of the batch, commit once (`sync` when the batch holds a sync point or a flush, with
//! the highest `seq` assigned so far as the high-water mark), then publish the batch's events
//! in order and answer its barriers. An event whose append failed, or whose batch failed to
//! commit, is not published (counted as withheld): a subscriber only ever sees what storage
//! keeps, and numbers storage has accounted for. Errors are logged, counted by
//! [`SinkError::op`] and reported to the next flush; the writer never panics.

use super::metrics;
use super::storage::{RolloutSink, SinkError};
use super::{RolloutRecord, is_sync_point};
use std::sync::Arc;
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

/// The actor's end of the writer thread.
pub(super) struct WriterHandle {
    /// `None` once closed.
    tx: Option<crossbeam_channel::Sender<WriterCmd>>,
    /// `None` once joined.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WriterHandle {
    /// Starts the thread. `high_water`: the last `seq` storage knows of.
    pub(super) fn spawn(
        sink: Box<dyn RolloutSink>,
        session_id: SessionId,
        events: broadcast::Sender<Arc<EventEnvelope>>,
        high_water: u64,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("rollout-writer".to_owned())
            .spawn(move || {
                let span = tracing::info_span!("rollout_writer", %session_id);
                let _entered = span.enter();
                Writer {
                    sink,
                    events,
                    high_water,
                    error: None,
                }
                .run(&rx);
            })?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Hands a command over; `false` when the writer thread is gone.
    pub(super) fn send(&self, cmd: WriterCmd) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.send(cmd).is_ok())
    }

    /// Closes the channel (the writer then commits what it holds, fsyncs and exits) and joins.
    pub(super) async fn shutdown(mut self, session_id: SessionId) {
        self.tx = None;
        let Some(thread) = self.thread.take() else {
            return;
        };
        match tokio::task::spawn_blocking(move || thread.join()).await {
            Ok(Ok(())) => tracing::debug!(%session_id, "rollout writer stopped"),
            Ok(Err(_)) => tracing::error!(%session_id, "rollout writer thread panicked"),
            Err(e) => tracing::error!(%session_id, error = %e, "joining the rollout writer failed"),
        }
    }
}

impl Drop for WriterHandle {
    /// Without a shutdown (the actor was killed, or panicked): the writer still commits what
    /// it was handed, and this waits for it, blocking, so that a Rollout restarted on the same
    /// session reads `last_seq` only after every number this one handed out is accounted
    /// for. The wait is bounded by the work already queued; it never needs the async runtime.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("rollout writer thread panicked");
        }
    }
}

/// The writer thread's state.
struct Writer {
    sink: Box<dyn RolloutSink>,
    /// Live subscribers; the actor keeps the sender that subscribes them.
    events: broadcast::Sender<Arc<EventEnvelope>>,
    /// The highest `seq` handed over so far (recorded or not).
    high_water: u64,
    /// The first error since the last flush ack, reported to the next flush.
    error: Option<String>,
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
    /// Group commit loop: block for one command, take what else is queued, commit, publish.
    fn run(mut self, rx: &crossbeam_channel::Receiver<WriterCmd>) {
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
            match self.process(batch.drain(..)) {
                Next::Continue => {}
                #[cfg(test)]
                Next::Crashed => {
                    // Nothing buffered may reach storage: the sink is abandoned, not dropped
                    // (its destructors would flush). Subscribers still see the channel close.
                    self.sink.abandon();
                    return;
                }
            }
        }
        // The actor is gone: make everything it handed over durable, then close.
        if let Err(e) = self.commit(true) {
            self.fail(&e);
        }
        if let Some(error) = self.error.take() {
            tracing::error!(%error, "rollout writer stopped after a write error");
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
                    seq = p.env.seq,
                    %kind,
                    "event withheld: its record was not committed"
                );
            }
        }
    }

    /// Logs and counts an error, and keeps the first one for the next flush.
    fn fail(&mut self, error: &SinkError) {
        tracing::error!(op = error.op, error = %error.message, "rollout storage failed");
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
                events,
                high_water: 10,
                error: None,
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
            fail_commit: true,
            log,
        });
        w.process(vec![event(11, chunk(), true), event(12, chunk(), false)].into_iter());
        assert!(rx.try_recv().is_err(), "nothing published");
        assert!(w.error.as_deref().is_some_and(|e| e.starts_with("sync:")));
    }
}
