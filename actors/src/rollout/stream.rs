//! Resumable event streams (P3, P4): every stored record after a resume point, then live
//! events, in strictly increasing `seq`, nothing twice and nothing lost that storage keeps.
//!
//! How: subscribe first, then read the backlog from storage in pages, then take the live
//! receiver, skipping every `seq` at or before the last one yielded. Nothing falls between the
//! two because the Rollout publishes an event only after the commit that covers it: whatever
//! was published before the subscription is readable by then, and whatever was published after
//! is in the receiver. A page read is bounded by what the Rollout knows is committed, so it
//! never yields a record that a later, smaller `seq` would have to precede. A receiver that
//! lags refills from storage the same way; one that closes because the Rollout was restarted
//! subscribes to the new one and refills.
//!
//! What a resuming client gets from storage is what the policy kept (headers only under
//! `HeadersOnly`, start and end only under `None`); what a live client gets is the event
//! itself. Numbers that were neither recorded nor seen live (a lagging subscriber's unrecorded
//! chunks) are the only gaps.

use super::metrics;
use super::{RolloutMsg, RolloutRecord};
use futures::stream::{BoxStream, Stream, StreamExt};
use ractor::ActorRef;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use troupe_proto::{AgentError, EventEnvelope};

/// Records read from storage per page.
pub const RESUME_PAGE: usize = 256;

/// A session's events after a resume point: stored records first, then live events, in
/// strictly increasing `seq`. It ends when the session ends; an error is its last item (resume
/// from the last `seq` received). Polling it after its end is fine: it stays ended.
pub struct EventStream {
    inner: BoxStream<'static, Result<RolloutRecord, AgentError>>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream").finish_non_exhaustive()
    }
}

impl Stream for EventStream {
    type Item = Result<RolloutRecord, AgentError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

impl EventStream {
    /// Subscribes (before returning: every event published afterwards is in the stream), then
    /// yields what storage holds after `after_seq` and the live events.
    pub(crate) async fn open<S: EventSource>(
        mut source: S,
        after_seq: u64,
        page: usize,
    ) -> Result<Self, AgentError> {
        let rx = source.subscribe().await?;
        let resume = Resume {
            source,
            rx,
            cursor: Cursor::after(after_seq),
            page: page.max(1),
            backlog: VecDeque::new(),
            phase: Phase::Backlog,
        };
        let inner = futures::stream::unfold(resume, |mut resume| async move {
            let item = resume.next().await?;
            Some((item, resume))
        })
        .fuse()
        .boxed();
        Ok(Self { inner })
    }

    /// A stream over one Rollout actor; it ends when that actor stops.
    pub async fn from_rollout(
        rollout: ActorRef<RolloutMsg>,
        after_seq: u64,
    ) -> Result<Self, AgentError> {
        Self::open(rollout, after_seq, RESUME_PAGE).await
    }
}

/// Where a stream reads: a Rollout, or whichever Rollout a session runs at the moment.
#[async_trait::async_trait]
pub(crate) trait EventSource: Send + 'static {
    async fn subscribe(&mut self) -> Result<broadcast::Receiver<Arc<EventEnvelope>>, AgentError>;
    /// Up to `limit` committed records after `after_seq`, in `seq` order.
    async fn read_after(
        &mut self,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RolloutRecord>, AgentError>;
    /// The live receiver closed or a read failed: `true` when another Rollout took over
    /// (subscribe again), `false` when the events are over (or the Rollout is still there).
    async fn reconnect(&mut self) -> Result<bool, AgentError>;
}

fn gone(e: impl std::fmt::Display) -> AgentError {
    AgentError::internal(format!("rollout unavailable: {e}"))
}

#[async_trait::async_trait]
impl EventSource for ActorRef<RolloutMsg> {
    async fn subscribe(&mut self) -> Result<broadcast::Receiver<Arc<EventEnvelope>>, AgentError> {
        ractor::call!(self, |reply| RolloutMsg::Subscribe { reply }).map_err(gone)
    }

    async fn read_after(
        &mut self,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RolloutRecord>, AgentError> {
        ractor::call!(self, |reply| RolloutMsg::ReadAfter {
            after_seq,
            limit,
            reply
        })
        .map_err(gone)?
    }

    async fn reconnect(&mut self) -> Result<bool, AgentError> {
        Ok(false)
    }
}

/// The position of a stream: the last `seq` it yielded. The whole no-duplicate rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    last: u64,
}

impl Cursor {
    pub fn after(seq: u64) -> Self {
        Self { last: seq }
    }

    pub fn last(self) -> u64 {
        self.last
    }

    /// Whether `seq` comes next; if so it becomes the position.
    pub fn admit(&mut self, seq: u64) -> bool {
        if seq > self.last {
            self.last = seq;
            true
        } else {
            false
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading pages from storage until a short one.
    Backlog,
    /// Taking the live receiver.
    Live,
    Done,
}

struct Resume<S> {
    source: S,
    rx: broadcast::Receiver<Arc<EventEnvelope>>,
    cursor: Cursor,
    page: usize,
    backlog: VecDeque<RolloutRecord>,
    phase: Phase,
}

impl<S: EventSource> Resume<S> {
    async fn next(&mut self) -> Option<Result<RolloutRecord, AgentError>> {
        loop {
            while let Some(record) = self.backlog.pop_front() {
                if self.cursor.admit(record.seq) {
                    return Some(Ok(record));
                }
            }
            match self.phase {
                Phase::Done => return None,
                Phase::Backlog => match self.source.read_after(self.cursor.last(), self.page).await
                {
                    Ok(page) => {
                        // A short page holds everything committed: the receiver has the rest.
                        if page.len() < self.page {
                            self.phase = Phase::Live;
                        }
                        self.backlog.extend(page);
                    }
                    // The Rollout may have been replaced meanwhile: follow it, or give up.
                    Err(e) => match self.source.reconnect().await {
                        Ok(true) => match self.source.subscribe().await {
                            Ok(rx) => self.rx = rx,
                            Err(e) => return self.fail(e),
                        },
                        Ok(false) | Err(_) => return self.fail(e),
                    },
                },
                Phase::Live => match self.rx.recv().await {
                    Ok(env) => {
                        if self.cursor.admit(env.seq) {
                            return Some(Ok(RolloutRecord::live(&env)));
                        }
                    }
                    Err(RecvError::Lagged(missed)) => {
                        metrics::subscriber_lagged(missed);
                        tracing::debug!(
                            missed,
                            after = self.cursor.last(),
                            "event stream lagged: refilling from storage"
                        );
                        self.phase = Phase::Backlog;
                    }
                    Err(RecvError::Closed) => match self.source.reconnect().await {
                        Ok(true) => match self.source.subscribe().await {
                            Ok(rx) => {
                                self.rx = rx;
                                self.phase = Phase::Backlog;
                            }
                            Err(e) => return self.fail(e),
                        },
                        Ok(false) => {
                            self.phase = Phase::Done;
                            return None;
                        }
                        Err(e) => return self.fail(e),
                    },
                },
            }
        }
    }

    fn fail(&mut self, e: AgentError) -> Option<Result<RolloutRecord, AgentError>> {
        self.phase = Phase::Done;
        Some(Err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{FileRolloutStorage, Rollout, RolloutArgs, record_for};
    use super::*;
    use crate::clock::Clock;
    use crate::event_draft::EventDraft;
    use proptest::prelude::*;
    use ractor::Actor;
    use troupe_proto::{ConversationId, EventKind, SessionId, StoragePolicy};

    #[test]
    fn the_cursor_admits_only_what_comes_after() {
        let mut c = Cursor::after(5);
        assert!(!c.admit(5));
        assert!(!c.admit(3));
        assert!(c.admit(7));
        assert!(
            !c.admit(6),
            "a smaller number after a larger one is a duplicate"
        );
        assert!(c.admit(8));
        assert_eq!(c.last(), 8);
    }

    /// Where an emitted event goes: three conversations and the session level.
    const PLACES: [(Option<usize>, StoragePolicy); 4] = [
        (Some(0), StoragePolicy::Full),
        (Some(1), StoragePolicy::HeadersOnly),
        (Some(2), StoragePolicy::None),
        (None, StoragePolicy::HeadersOnly),
    ];

    #[derive(Debug, Clone)]
    enum Op {
        /// `count` events at `place`; `started`: task_started (kept by every policy) rather
        /// than a chunk (not kept by policy None).
        Emit {
            place: usize,
            started: bool,
            count: u8,
        },
        /// Takes up to `n` items from every open stream.
        Pull { n: u8 },
        /// Opens a stream `back` numbers before the last one assigned (0: from the start).
        Open { back: u8, from_start: bool },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..PLACES.len(), any::<bool>(), 1u8..12).prop_map(|(place, started, count)| Op::Emit { place, started, count }),
            3 => (1u8..20).prop_map(|n| Op::Pull { n }),
            1 => (0u8..30, any::<bool>()).prop_map(|(back, from_start)| Op::Open { back, from_start }),
        ]
    }

    /// What was emitted with a given seq.
    #[derive(Debug, Clone)]
    struct Emitted {
        conversation_id: Option<ConversationId>,
        policy: StoragePolicy,
        event: EventKind,
    }

    impl Emitted {
        fn recorded(&self) -> bool {
            record_for(self.policy, &self.envelope(0, 0)).is_some()
        }

        fn envelope(&self, seq: u64, ts_ms: u64) -> EventEnvelope {
            EventEnvelope {
                seq,
                ts_ms,
                session_id: SessionId::new(),
                conversation_id: self.conversation_id,
                task_id: None,
                sub_id: None,
                trace_id: None,
                span_id: None,
                event: self.event.clone(),
            }
        }
    }

    struct Open {
        after: u64,
        stream: EventStream,
        got: Vec<RolloutRecord>,
    }

    impl Open {
        fn last(&self) -> u64 {
            self.got.last().map_or(self.after, |r| r.seq)
        }

        /// Takes up to `n` items, never waiting for one that may not come: only while a
        /// recorded event lies beyond the position.
        async fn pull(&mut self, n: usize, emitted: &[Emitted]) {
            for _ in 0..n {
                let last = usize::try_from(self.last()).unwrap_or(usize::MAX);
                if !emitted.iter().skip(last).any(Emitted::recorded) {
                    return;
                }
                match self.stream.next().await {
                    Some(Ok(record)) => self.got.push(record),
                    other => panic!("stream ended: {other:?}"),
                }
            }
        }

        fn check(&self, emitted: &[Emitted]) -> Result<(), TestCaseError> {
            let seqs: Vec<u64> = self.got.iter().map(|r| r.seq).collect();
            prop_assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "not strictly increasing: {:?}",
                seqs
            );
            prop_assert!(seqs.first().is_none_or(|s| *s > self.after));
            for record in &self.got {
                let e = &emitted[usize::try_from(record.seq - 1).unwrap()];
                let env = e.envelope(record.seq, record.ts_ms);
                let live = RolloutRecord::live(&env);
                let stored = record_for(e.policy, &env);
                prop_assert!(
                    *record == live || Some(record) == stored.as_ref(),
                    "seq {}: {:?} is neither the live event nor its stored record",
                    record.seq,
                    record
                );
            }
            // No gap: every recorded number between the resume point and the position.
            for (index, e) in emitted.iter().enumerate() {
                let seq = index as u64 + 1;
                if seq > self.after && seq <= self.last() && e.recorded() {
                    prop_assert!(
                        seqs.binary_search(&seq).is_ok(),
                        "recorded seq {} missing after {}: {:?}",
                        seq,
                        self.after,
                        seqs
                    );
                }
            }
            Ok(())
        }
    }

    async fn run(ops: Vec<Op>, capacity: usize) -> Result<(), TestCaseError> {
        let tmp = tempfile::tempdir().unwrap();
        let (rollout, _) = Actor::spawn(
            None,
            Rollout,
            RolloutArgs {
                session_id: SessionId::new(),
                storage: Arc::new(FileRolloutStorage::new(tmp.path())),
                clock: Clock::new(),
                subscriber_capacity: capacity,
                policies: Vec::new(),
            },
        )
        .await
        .unwrap();
        let conversations = [
            ConversationId::new(),
            ConversationId::new(),
            ConversationId::new(),
        ];
        for (place, policy) in PLACES {
            if let Some(i) = place {
                rollout
                    .cast(RolloutMsg::ConversationRegistered {
                        conversation_id: conversations[i],
                        policy,
                    })
                    .unwrap();
            }
        }
        let mut emitted: Vec<Emitted> = Vec::new();
        let mut streams: Vec<Open> = Vec::new();
        // One stream from the start, open before anything happens.
        streams.push(Open {
            after: 0,
            stream: EventStream::from_rollout(rollout.clone(), 0).await.unwrap(),
            got: Vec::new(),
        });
        for op in ops {
            match op {
                Op::Emit {
                    place,
                    started,
                    count,
                } => {
                    let (conversation, policy) = PLACES[place];
                    for i in 0..count {
                        let event = if started {
                            EventKind::TaskStarted {
                                input: format!("input {}", emitted.len()),
                            }
                        } else {
                            EventKind::AssistantChunk {
                                delta: format!("chunk {} {i}", emitted.len()),
                            }
                        };
                        let conversation_id = conversation.map(|c| conversations[c]);
                        let draft = match conversation_id {
                            Some(c) => EventDraft::conversation(c, event.clone()),
                            None => EventDraft::session(event.clone()),
                        };
                        rollout.cast(RolloutMsg::Emit { draft }).unwrap();
                        emitted.push(Emitted {
                            conversation_id,
                            policy,
                            event,
                        });
                    }
                }
                Op::Pull { n } => {
                    for s in &mut streams {
                        s.pull(usize::from(n), &emitted).await;
                    }
                }
                Op::Open { back, from_start } => {
                    let after = if from_start {
                        0
                    } else {
                        (emitted.len() as u64).saturating_sub(u64::from(back))
                    };
                    let stream = EventStream::from_rollout(rollout.clone(), after)
                        .await
                        .unwrap();
                    streams.push(Open {
                        after,
                        stream,
                        got: Vec::new(),
                    });
                }
            }
        }
        // Everything recorded reaches every stream.
        for s in &mut streams {
            s.pull(usize::MAX, &emitted).await;
            s.check(&emitted)?;
            let last_recorded = emitted
                .iter()
                .rposition(Emitted::recorded)
                .map_or(0, |i| i as u64 + 1);
            prop_assert!(s.last() >= last_recorded.max(s.after));
        }
        rollout.drain_and_wait(None).await.unwrap();
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
        /// P4/P6: whatever the interleaving of emits, pulls, lag (a tiny subscriber buffer) and
        /// resume points, each stream yields strictly increasing numbers, every recorded event
        /// after its resume point, each as the live event or as storage kept it.
        #[test]
        fn resume_never_loses_or_repeats(ops in proptest::collection::vec(op(), 1..40), capacity in 1usize..6) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(run(ops, capacity))?;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_ends_when_its_rollout_stops() {
        let tmp = tempfile::tempdir().unwrap();
        let (rollout, _) = Actor::spawn(
            None,
            Rollout,
            RolloutArgs {
                session_id: SessionId::new(),
                storage: Arc::new(FileRolloutStorage::new(tmp.path())),
                clock: Clock::new(),
                subscriber_capacity: 8,
                policies: Vec::new(),
            },
        )
        .await
        .unwrap();
        let mut stream = EventStream::from_rollout(rollout.clone(), 0).await.unwrap();
        rollout
            .cast(RolloutMsg::Emit {
                draft: EventDraft::session(EventKind::TaskAborted { waited_ms: 0 }),
            })
            .unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap().seq, 1);
        rollout.drain_and_wait(None).await.unwrap();
        assert!(stream.next().await.is_none());
    }
}
