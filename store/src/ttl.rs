//! The Ttl sweeper (S10): keeps the promise of `StoragePolicy::Ttl` on disk.
//!
//! Content written under a Ttl policy is stored with its expiry: the store's messages
//! (`expires_ms`) and conversations' instructions (due their ttl after the conversation
//! opened; see [`Store::sweep_due`]) and the rollout's records
//! ([`RolloutStorage::sweep_due`]). A sweep asks each storage to drop what is due at the time it
//! runs. The plan is what is stored, not what some session remembers, so a sweep needs no
//! session, conversation or Rollout in memory: it covers open and closed conversations,
//! sessions of processes that have exited, and everything written before a restart.
//!
//! - [`TtlSweeper::sweep`]: one sweep of every storage now (the rollout's, which blocks, on
//!   the blocking pool). A failure is logged and counted; what was due stays due, so the next
//!   sweep tries again.
//! - [`TtlSweeper::spawn`]: a task that sweeps every `interval` (the first one an interval
//!   after it starts) until its token is cancelled. It holds storages only, no actor.
//!
//! `troupe serve` sweeps once at start-up, before it serves, then every `ttl_sweep_interval`;
//! `troupe chat` sweeps before its session starts and every interval while it runs.
//! Metrics are in [`metrics`].

pub mod metrics;

use crate::Store;
use metrics::{Outcome, SweptStore};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use troupe_actors::clock::Clock;
use troupe_actors::rollout::storage::RolloutStorage;
use troupe_proto::AgentError;

/// Sweeps the storages of one process.
#[derive(Clone)]
pub struct TtlSweeper {
    /// The service's store; `None` where there is none (`troupe chat`).
    store: Option<Arc<dyn Store>>,
    /// Every session's rollout, the one the sessions write to.
    rollout: Arc<dyn RolloutStorage>,
    /// Follows tokio's clock, so that paused-time tests see expiries come.
    clock: Clock,
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepSummary {
    /// Messages that lost their content, and conversations that lost their instructions.
    pub messages: u64,
    /// Rollout records downgraded to headers.
    pub records: u64,
    /// A storage (or part of one) could not be swept; the next sweep tries again.
    pub failed: bool,
}

impl TtlSweeper {
    /// A sweeper of `rollout` and, if given, `store`. Anchors its clock now (call it inside
    /// the runtime whose clock tests may pause).
    pub fn new(store: Option<Arc<dyn Store>>, rollout: Arc<dyn RolloutStorage>) -> Self {
        metrics::describe();
        metrics::start_at_zero();
        Self {
            store,
            rollout,
            clock: Clock::new(),
        }
    }

    /// Sweeps everything due now, the store first, then the rollout.
    pub async fn sweep(&self) -> SweepSummary {
        let now_ms = self.clock.now_ms();
        let span = tracing::info_span!(
            "ttl.sweep",
            now_ms,
            messages = tracing::field::Empty,
            records = tracing::field::Empty
        );
        let summary = self.sweep_at(now_ms).instrument(span.clone()).await;
        span.record("messages", summary.messages);
        span.record("records", summary.records);
        if summary.messages + summary.records > 0 {
            span.in_scope(|| {
                tracing::info!(
                    messages = summary.messages,
                    records = summary.records,
                    "ttl sweep dropped due content"
                );
            });
        }
        summary
    }

    async fn sweep_at(&self, now_ms: u64) -> SweepSummary {
        let mut summary = SweepSummary::default();
        if let Some(store) = &self.store {
            let started = Instant::now();
            match store.sweep_due(now_ms).await {
                Ok(n) => {
                    summary.messages = n;
                    metrics::swept(SweptStore::Messages, Outcome::Ok, n, started.elapsed());
                }
                Err(e) => {
                    summary.failed = true;
                    failed(SweptStore::Messages, &e, started);
                }
            }
        }
        let started = Instant::now();
        let rollout = self.rollout.clone();
        let result = tokio::task::spawn_blocking(move || rollout.sweep_due(now_ms))
            .await
            .map_err(|e| AgentError::internal(format!("ttl sweep task: {e}")))
            .and_then(|r| r);
        match result {
            Ok(report) => {
                summary.records = report.downgraded;
                let outcome = if report.failures == 0 {
                    Outcome::Ok
                } else {
                    // Each part was logged as it failed.
                    summary.failed = true;
                    tracing::warn!(
                        failures = report.failures,
                        "ttl sweep left parts of the rollout for the next sweep"
                    );
                    Outcome::Error
                };
                metrics::swept(
                    SweptStore::Rollout,
                    outcome,
                    report.downgraded,
                    started.elapsed(),
                );
            }
            Err(e) => {
                summary.failed = true;
                failed(SweptStore::Rollout, &e, started);
            }
        }
        summary
    }

    /// Sweeps every `interval` until `stop` is cancelled; the first sweep comes one interval
    /// after the call (sweep once at start with [`TtlSweeper::sweep`]). `None` for a zero
    /// interval: no periodic sweep.
    pub fn spawn(self, interval: Duration, stop: CancellationToken) -> Option<JoinHandle<()>> {
        if interval.is_zero() {
            return None;
        }
        // Counted from now, not from the task's first poll.
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        // A sweep that overran its interval is followed by a full interval, not a burst.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Some(tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = ticks.tick() => {
                        self.sweep().await;
                    }
                }
            }
            tracing::debug!("ttl sweeper stopped");
        }))
    }
}

/// Records and logs a failed sweep of `store`.
fn failed(store: SweptStore, error: &AgentError, started: Instant) {
    metrics::swept(store, Outcome::Error, 0, started.elapsed());
    tracing::warn!(store = store.as_str(), %error, "ttl sweep failed; the next sweep tries again");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_PAGE_BYTES;
    use crate::memory::MemoryStore;
    use troupe_actors::rollout::FileRolloutStorage;
    use troupe_actors::rollout::conformance::ttl;
    use troupe_actors::rollout::storage::SweepReport;
    use troupe_proto::store::{ConversationRecord, ConversationState, NewMessage, SessionRecord};
    use troupe_proto::{ConversationId, OpenConversation, Role, SessionId, StoragePolicy};

    /// A store and a rollout, each holding one Ttl item due `ttl_secs` after `clock`'s now,
    /// written and left: no session runs.
    struct Stored {
        store: Arc<MemoryStore>,
        rollout: Arc<FileRolloutStorage>,
        session_id: SessionId,
        _dir: tempfile::TempDir,
    }

    async fn stored(clock: Clock, ttl_secs: u64) -> Stored {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let session_id = SessionId::new();
        let conversation_id = ConversationId::new();
        store
            .create_session(SessionRecord {
                session_id,
                project_id: None,
                title: None,
                created_ms: 1,
                root_conversation_id: conversation_id,
                settings: troupe_proto::Json::empty_object(),
                status: troupe_proto::store::SessionStatus::Active,
                updated_ms: 0,
            })
            .await
            .unwrap();
        store
            .put_conversation(ConversationRecord {
                conversation_id,
                session_id,
                params: OpenConversation {
                    storage_policy: StoragePolicy::Ttl { secs: ttl_secs },
                    ..OpenConversation::default()
                },
                is_root: true,
                state: ConversationState::Closed,
                created_ms: 1,
                closed_ms: Some(2),
            })
            .await
            .unwrap();
        let now = clock.now_ms();
        store
            .append_message(NewMessage {
                session_id,
                conversation_id,
                task_id: None,
                role: Role::User,
                content: Some("secret".into()),
                chars: 6,
                created_ms: now,
                status: None,
                kind: troupe_proto::store::MessageKind::Text,
                metadata: None,
            })
            .await
            .unwrap();
        let rollout = Arc::new(FileRolloutStorage::new(dir.path()));
        let mut sink = rollout.open_sink(session_id).unwrap();
        let record = ttl(
            1,
            now,
            now + ttl_secs * 1000,
            Some(conversation_id),
            "secret",
        );
        sink.append(Some(conversation_id), &record).unwrap();
        sink.commit(true, 1).unwrap();
        Stored {
            store,
            rollout,
            session_id,
            _dir: dir,
        }
    }

    impl Stored {
        fn sweeper(&self, clock: Clock) -> TtlSweeper {
            let mut sweeper = TtlSweeper::new(Some(self.store.clone()), self.rollout.clone());
            sweeper.clock = clock;
            sweeper
        }

        async fn message_content(&self) -> Option<String> {
            let page = self
                .store
                .messages(self.session_id, 1, MAX_PAGE_BYTES, None)
                .await
                .unwrap();
            page.messages[0].content.clone()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_drops_what_is_due_from_both_storages_with_no_session_running() {
        let clock = Clock::new();
        let s = stored(clock, 10).await;
        let sweeper = s.sweeper(clock);
        let nothing = SweepSummary::default();
        assert_eq!(sweeper.sweep().await, nothing);
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert_eq!(sweeper.sweep().await, nothing, "not due yet");
        assert_eq!(s.message_content().await.as_deref(), Some("secret"));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            sweeper.sweep().await,
            SweepSummary {
                messages: 1,
                records: 1,
                failed: false
            }
        );
        assert_eq!(s.message_content().await, None);
        assert_eq!(sweeper.sweep().await, nothing, "idempotent");
    }

    #[tokio::test(start_paused = true)]
    async fn the_periodic_sweep_comes_every_interval_until_stopped() {
        let clock = Clock::new();
        let s = stored(clock, 30).await;
        let stop = CancellationToken::new();
        let task = s
            .sweeper(clock)
            .spawn(Duration::from_secs(60), stop.clone())
            .unwrap();
        // Due at 30 s, swept by the sweep at 60 s.
        tokio::time::advance(Duration::from_secs(59)).await;
        tokio::task::yield_now().await;
        assert_eq!(s.message_content().await.as_deref(), Some("secret"));
        tokio::time::advance(Duration::from_secs(1)).await;
        // The sweep's rollout half runs on the blocking pool: wait for it, boundedly.
        let swept = || {
            s.rollout
                .read_after(s.session_id, 0, 10)
                .unwrap()
                .iter()
                .all(|r| r.event.is_none())
        };
        for _ in 0..1_000 {
            if swept() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(swept(), "the rollout record is headers");
        assert_eq!(s.message_content().await, None);
        stop.cancel();
        task.await.unwrap();
        assert!(
            s.sweeper(clock)
                .spawn(Duration::ZERO, CancellationToken::new())
                .is_none(),
            "a zero interval: no periodic sweep"
        );
    }

    /// A rollout whose sweeps fail while `failing` is set.
    struct Failing {
        inner: FileRolloutStorage,
        failing: std::sync::atomic::AtomicBool,
    }

    impl RolloutStorage for Failing {
        fn open_sink(
            &self,
            session_id: SessionId,
        ) -> Result<Box<dyn troupe_actors::rollout::storage::RolloutSink>, AgentError> {
            self.inner.open_sink(session_id)
        }
        fn last_seq(&self, session_id: SessionId) -> Result<u64, AgentError> {
            self.inner.last_seq(session_id)
        }
        fn read_conversation(
            &self,
            session_id: SessionId,
            conversation_id: ConversationId,
        ) -> Result<Vec<troupe_actors::rollout::RolloutRecord>, AgentError> {
            self.inner.read_conversation(session_id, conversation_id)
        }
        fn read_after(
            &self,
            session_id: SessionId,
            after_seq: u64,
            limit: usize,
        ) -> Result<Vec<troupe_actors::rollout::RolloutRecord>, AgentError> {
            self.inner.read_after(session_id, after_seq, limit)
        }
        fn sweep_due(&self, now_ms: u64) -> Result<SweepReport, AgentError> {
            if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(AgentError::internal("disk on fire"));
            }
            self.inner.sweep_due(now_ms)
        }
    }

    #[test]
    fn sweeps_are_counted_by_store_and_outcome_and_a_failed_one_is_retried() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        ::metrics::with_local_recorder(&recorder, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let clock = Clock::new();
                let s = stored(clock, 1).await;
                let failing = Arc::new(Failing {
                    inner: FileRolloutStorage::new(s._dir.path()),
                    failing: std::sync::atomic::AtomicBool::new(true),
                });
                let mut sweeper = TtlSweeper::new(Some(s.store.clone()), failing.clone());
                sweeper.clock = clock;
                tokio::time::advance(Duration::from_secs(1)).await;
                let first = sweeper.sweep().await;
                assert_eq!((first.messages, first.records, first.failed), (1, 0, true));
                failing
                    .failing
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                let second = sweeper.sweep().await;
                assert_eq!(
                    (second.messages, second.records, second.failed),
                    (0, 1, false),
                    "what was due stays due"
                );
            });
        });
        let mut counted: Vec<(String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| {
                let name = key.key().name();
                if name != metrics::SWEEPS && name != metrics::DOWNGRADED {
                    return None;
                }
                let labels: Vec<String> = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                let DebugValue::Counter(n) = value else {
                    return None;
                };
                Some((format!("{name}{{{}}}", labels.join(",")), n))
            })
            .collect();
        counted.sort();
        let d = metrics::DOWNGRADED;
        let s = metrics::SWEEPS;
        assert_eq!(
            counted,
            vec![
                (format!("{d}{{store=messages}}"), 1),
                (format!("{d}{{store=rollout}}"), 1),
                (format!("{s}{{store=messages,outcome=error}}"), 0),
                (format!("{s}{{store=messages,outcome=ok}}"), 2),
                (format!("{s}{{store=rollout,outcome=error}}"), 1),
                (format!("{s}{{store=rollout,outcome=ok}}"), 1),
            ]
        );
    }
}
