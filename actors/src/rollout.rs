//! Rollout: the session's event sequencer and its durable, policy-aware record (S10, S11).
//!
//! One Rollout per session. Every event of the session passes through it: it assigns the
//! per-session `seq` (from 1, strictly increasing) and `ts_ms`, hands what the conversation's
//! [`StoragePolicy`] allows to its writer thread, and only then publishes the whole envelope to
//! live subscribers. A subscriber that falls behind loses live events (`Lagged`), never records.
//!
//! # Mailbox
//! - `ConversationRegistered { conversation_id, policy }`: remembers the policy. Events of a
//!   conversation that was never registered are recorded as policy `None` (and warned about
//!   once): content never reaches disk unless a policy allowed it.
//! - `Emit { draft }`: numbers, records, publishes. Never waits for the disk.
//! - `Flush { reply }`: answered once everything emitted before it is written and fsynced, or
//!   `Internal` if the writer hit an I/O error since the previous flush.
//! - `ReadConversation { conversation_id, reply }`: a flush, then the file read back (oldest
//!   first; an unreadable line, such as a torn last write, is skipped and logged; a missing file
//!   is an empty record).
//! - `Subscribe { reply }`: a new broadcast receiver of `Arc<EventEnvelope>`.
//! - `SweepTtl`: timer (`ttl_sweep_interval`; zero disables it): downgrades `Ttl` content older
//!   than its ttl to headers.
//! - `LastSeq { reply }`: the last `seq` assigned.
//!
//! Replies that wait for the disk are sent from a blocking-pool task, so the mailbox never
//! waits for I/O. (Tokio also does not auto-advance paused time while a blocking task runs, so
//! paused-time tests see no time jumps while the disk works.)
//!
//! # Files
//! `dir` (created lazily) holds `<conversation_id>.jsonl` per conversation and `session.jsonl`
//! for session-level events; one JSON [`RolloutRecord`] per line, in `seq` order. What a line
//! keeps is decided by [`record_for`]: `Full`/`Ttl` keep the event, `HeadersOnly` keeps
//! [`RecordMeta`] only, `None` keeps task start/end/abort, errors and conversation open/close
//! with status and error kind only. Session-level events are kept as headers.
//!
//! # Durability
//! All file I/O happens on one dedicated writer thread fed by a channel. It takes one command,
//! drains what is already queued (up to 1024) and group-commits: lines are appended through
//! buffers and written to the OS at the end of every batch; files are fsynced (`sync_data`,
//! plus the directory when a file was created) only when the batch holds a sync point: a
//! `task_finished`, `task_aborted` or `conversation_closed` record, or a `Flush`. Flush acks go
//! out after that fsync. At most 64 files are kept open (least recently used is closed, and
//! fsynced first if it holds unsynced lines). A TTL sweep rewrites a file through a temporary
//! file, fsync, rename and directory fsync, so a crash leaves either the old or the new file.
//! A write error is logged, counted and reported to the next `Flush`; the writer never panics.
//!
//! # Supervision
//! The Session supervises the Rollout; it has no children besides its writer thread. Stopping
//! it (`post_stop`) closes the writer's channel and joins the thread, which first writes and
//! fsyncs everything it was handed: stop with `drain_and_wait` so that events still queued in
//! the mailbox are handed over too. If the writer is gone, `Emit` fails the actor; the Session
//! restarts it on the same directory, and `pre_start` continues `seq` from the highest `seq`
//! found there (read from the tail of each file). Events that policy `None` did not record
//! after the last recorded one leave no trace, so their numbers can be reused after a restart.
//! If the actor is killed instead, dropping its state still closes the channel and the writer
//! drains on its own, unjoined.

pub mod metrics;
pub mod storage;

use crate::clock::Clock;
use crate::events::EventDraft;
use metrics::WriteOp;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::broadcast;
use troupe_proto::{
    AgentError, ApprovalSubject, ConversationId, ErrorKind, EventEnvelope, EventKind, SessionId,
    StoragePolicy, TaskId, TaskStatus, Usage,
};

/// File of the session-level events.
pub const SESSION_FILE: &str = "session.jsonl";
/// Commands the writer takes into one group commit at most.
const MAX_BATCH: usize = 1024;
/// Files the writer keeps open at most.
const MAX_OPEN_FILES: usize = 64;
/// First read when looking for the last `seq` of a file (doubled until a line start is found).
const TAIL_CHUNK: usize = 64 * 1024;

/// Start-up arguments.
pub struct RolloutArgs {
    pub session_id: SessionId,
    /// This session's directory: `<data>/rollout/<session_id>/`.
    pub dir: PathBuf,
    pub clock: Clock,
    /// How often Ttl conversations are swept.
    pub ttl_sweep_interval: Duration,
    /// Live events buffered per subscriber before it lags.
    pub subscriber_capacity: usize,
}

/// The actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rollout;

/// The Rollout's state: sequencing and policies (the pure core) plus its I/O handles.
pub struct RolloutState {
    core: RolloutCore,
    session_id: SessionId,
    clock: Clock,
    /// Where ReadConversation looks; the writer has its own copy.
    dir: PathBuf,
    /// `None` once stopped.
    writer: Option<WriterHandle>,
    /// Kept so that subscribers can join at any time; sending with none is fine.
    events: broadcast::Sender<Arc<EventEnvelope>>,
    ttl_sweep_interval: Duration,
    sweep_timer: Option<tokio::task::JoinHandle<()>>,
}

/// The Rollout's mailbox.
// `Emit` is nearly every message, so boxing it would only add an allocation per event.
#[allow(clippy::large_enum_variant)]
pub enum RolloutMsg {
    /// Declares a conversation's storage policy; must precede its first event.
    ConversationRegistered {
        conversation_id: ConversationId,
        policy: StoragePolicy,
    },
    /// Numbers one event, hands what its policy allows to the writer, then publishes it.
    Emit { draft: EventDraft },
    /// Durability barrier: answered once everything emitted before it is written and fsynced.
    Flush {
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    /// Reads a conversation's record back (after an implicit flush), oldest first.
    ReadConversation {
        conversation_id: ConversationId,
        reply: RpcReplyPort<Result<Vec<RolloutRecord>, AgentError>>,
    },
    /// A receiver of live events; a slow one lags, the record does not.
    Subscribe {
        reply: RpcReplyPort<broadcast::Receiver<Arc<EventEnvelope>>>,
    },
    /// Timer: downgrades Ttl content older than its ttl to headers.
    SweepTtl,
    /// Observation: the last sequence number assigned.
    LastSeq { reply: RpcReplyPort<u64> },
}

/// How much of an event a record keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordLevel {
    /// The whole event, content included.
    Full,
    /// Metadata only.
    Headers,
    /// Start, end, error: kind and status only.
    Minimal,
}

impl RecordLevel {
    /// The snake_case name, as serialised (a metric label).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Headers => "headers",
            Self::Minimal => "minimal",
        }
    }
}

/// Content-free facts about an event, kept at every level that keeps the event at all.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RecordMeta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<TaskStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind>,
    /// Size of the event's content in bytes: what was left out below `Full`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chars: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// One line of a conversation's rollout file (`<conversation_id>.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub seq: u64,
    pub ts_ms: u64,
    pub conversation_id: Option<ConversationId>,
    pub task_id: Option<TaskId>,
    /// `EventKind::name()` of the event.
    pub kind: String,
    pub level: RecordLevel,
    /// The event itself, only at `RecordLevel::Full`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<EventKind>,
    pub meta: RecordMeta,
}

#[ractor::async_trait]
impl Actor for Rollout {
    type Msg = RolloutMsg;
    type State = RolloutState;
    type Arguments = RolloutArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: RolloutArgs,
    ) -> Result<RolloutState, ActorProcessingErr> {
        let dir = args.dir.clone();
        // Continue the numbering of a previous incarnation (a restart after a failure).
        let last_seq = tokio::task::spawn_blocking(move || max_seq_in_dir(&dir))
            .await
            .map_err(|e| AgentError::internal(format!("rollout seq scan: {e}")))?
            .map_err(|e| {
                AgentError::internal(format!("rollout seq scan of {}: {e}", args.dir.display()))
            })?;
        let writer = WriterHandle::spawn(args.dir.clone(), args.session_id)
            .map_err(|e| AgentError::internal(format!("rollout writer thread: {e}")))?;
        let (events, _) = broadcast::channel(args.subscriber_capacity.max(1));
        tracing::info!(session_id = %args.session_id, last_seq, dir = %args.dir.display(), "rollout started");
        Ok(RolloutState {
            core: RolloutCore::new(last_seq),
            session_id: args.session_id,
            clock: args.clock,
            dir: args.dir,
            writer: Some(writer),
            events,
            ttl_sweep_interval: args.ttl_sweep_interval,
            sweep_timer: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut RolloutState,
    ) -> Result<(), ActorProcessingErr> {
        if !state.ttl_sweep_interval.is_zero() {
            state.sweep_timer =
                Some(myself.send_interval(state.ttl_sweep_interval, || RolloutMsg::SweepTtl));
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut RolloutState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(timer) = state.sweep_timer.take() {
            timer.abort();
        }
        if let Some(writer) = state.writer.take() {
            writer.shutdown(state.session_id).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: RolloutMsg,
        state: &mut RolloutState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RolloutMsg::ConversationRegistered {
                conversation_id,
                policy,
            } => state.register(conversation_id, policy),
            RolloutMsg::Emit { draft } => state.emit(draft)?,
            RolloutMsg::Flush { reply } => state.flush(reply),
            RolloutMsg::ReadConversation {
                conversation_id,
                reply,
            } => state.read_conversation(conversation_id, reply),
            RolloutMsg::Subscribe { reply } => {
                let _ = reply.send(state.events.subscribe());
            }
            RolloutMsg::SweepTtl => state.sweep_ttl()?,
            RolloutMsg::LastSeq { reply } => {
                let _ = reply.send(state.core.last_seq());
            }
        }
        Ok(())
    }
}

impl RolloutState {
    fn register(&mut self, conversation_id: ConversationId, policy: StoragePolicy) {
        match self.core.register(conversation_id, policy) {
            Some(previous) if previous != policy => tracing::info!(
                %conversation_id, ?previous, ?policy, "conversation storage policy changed"
            ),
            _ => tracing::debug!(%conversation_id, ?policy, "conversation registered"),
        }
    }

    /// Numbers the event, hands its record to the writer, then publishes it. Failing to reach
    /// the writer fails the actor: recording is its whole job.
    fn emit(&mut self, draft: EventDraft) -> Result<(), AgentError> {
        let env = self.core.stamp(self.session_id, draft, self.clock.now_ms());
        let kind = env.event.name();
        metrics::event_emitted(kind);
        let placement = self.core.placement(env.conversation_id);
        if let Placement::Unregistered(conversation_id) = placement {
            metrics::unregistered_event();
            if self.core.first_unregistered(conversation_id) {
                tracing::warn!(
                    %conversation_id, kind,
                    "event of an unregistered conversation: recorded as storage policy none"
                );
            }
        }
        match record_for(placement.policy(), &env) {
            Some(record) => self.send(WriterCmd::Append {
                target: placement.target(),
                record,
            })?,
            None => metrics::event_unrecorded(kind),
        }
        // A closed conversation's state goes, so a long-lived session does not grow with
        // every conversation it ever had.
        if let (EventKind::ConversationClosed { .. }, Some(conversation_id)) =
            (&env.event, env.conversation_id)
            && self.core.closed(conversation_id, env.ts_ms)
        {
            self.send(WriterCmd::Forget { conversation_id })?;
        }
        tracing::trace!(seq = env.seq, kind, "event emitted");
        // No receiver is not an error: nobody is watching live.
        let _ = self.events.send(Arc::new(env));
        Ok(())
    }

    fn flush(&self, reply: RpcReplyPort<Result<(), AgentError>>) {
        match self.request_flush() {
            Ok(ack) => {
                tokio::task::spawn_blocking(move || {
                    let _ = reply.send(wait_ack(&ack));
                });
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    fn read_conversation(
        &self,
        conversation_id: ConversationId,
        reply: RpcReplyPort<Result<Vec<RolloutRecord>, AgentError>>,
    ) {
        match self.request_flush() {
            Ok(ack) => {
                let path = conversation_path(&self.dir, conversation_id);
                tokio::task::spawn_blocking(move || {
                    let _ = reply.send(wait_ack(&ack).and_then(|()| read_records(&path)));
                });
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    fn sweep_ttl(&mut self) -> Result<(), AgentError> {
        let plan = self.core.sweep_plan(self.clock.now_ms());
        if plan.is_empty() {
            return Ok(());
        }
        tracing::debug!(conversations = plan.len(), "ttl sweep");
        let done = self.core.expired_closed(self.clock.now_ms());
        self.send(WriterCmd::Sweep { plan })?;
        for conversation_id in done {
            self.core.forget(conversation_id);
            self.send(WriterCmd::Forget { conversation_id })?;
        }
        Ok(())
    }

    fn request_flush(&self) -> Result<AckReceiver, AgentError> {
        let (ack, rx) = crossbeam_channel::bounded(1);
        self.send(WriterCmd::Flush { ack })?;
        Ok(rx)
    }

    fn send(&self, cmd: WriterCmd) -> Result<(), AgentError> {
        let writer = self
            .writer
            .as_ref()
            .ok_or_else(|| AgentError::internal("rollout writer stopped"))?;
        writer.tx.send(cmd).map_err(|_| {
            tracing::error!(session_id = %self.session_id, "rollout writer thread is gone");
            AgentError::internal("rollout writer thread is gone")
        })
    }
}

/// Sequencing and policy decisions, free of I/O.
#[derive(Debug, Default)]
struct RolloutCore {
    last_seq: u64,
    policies: HashMap<ConversationId, StoragePolicy>,
    /// Unregistered conversations already warned about (one warning each).
    warned: HashSet<ConversationId>,
    /// Closed Ttl conversations and when they closed: kept until a sweep has passed over
    /// every line they wrote, then forgotten like any closed conversation.
    closed_ttl: HashMap<ConversationId, u64>,
}

/// Where an event's record goes, and under which policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// No conversation: `session.jsonl`, headers only.
    Session,
    Registered(ConversationId, StoragePolicy),
    /// Never registered: treated as policy `None`, the strictest.
    Unregistered(ConversationId),
}

impl Placement {
    fn policy(self) -> StoragePolicy {
        match self {
            Self::Session => StoragePolicy::HeadersOnly,
            Self::Registered(_, policy) => policy,
            Self::Unregistered(_) => StoragePolicy::None,
        }
    }

    fn target(self) -> Target {
        match self {
            Self::Session => Target::Session,
            Self::Registered(id, _) | Self::Unregistered(id) => Target::Conversation(id),
        }
    }
}

impl RolloutCore {
    fn new(last_seq: u64) -> Self {
        Self {
            last_seq,
            ..Self::default()
        }
    }

    fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Returns the policy it replaces, if any.
    fn register(
        &mut self,
        conversation_id: ConversationId,
        policy: StoragePolicy,
    ) -> Option<StoragePolicy> {
        self.warned.remove(&conversation_id);
        self.policies.insert(conversation_id, policy)
    }

    /// Turns a draft into the next envelope of the session.
    fn stamp(&mut self, session_id: SessionId, draft: EventDraft, ts_ms: u64) -> EventEnvelope {
        self.last_seq += 1;
        EventEnvelope {
            seq: self.last_seq,
            ts_ms,
            session_id,
            conversation_id: draft.conversation_id,
            task_id: draft.task_id,
            sub_id: draft.sub_id,
            trace_id: draft.trace_id,
            span_id: draft.span_id,
            event: draft.event,
        }
    }

    fn placement(&self, conversation_id: Option<ConversationId>) -> Placement {
        match conversation_id {
            None => Placement::Session,
            Some(id) => match self.policies.get(&id) {
                Some(policy) => Placement::Registered(id, *policy),
                None => Placement::Unregistered(id),
            },
        }
    }

    /// True the first time an unregistered conversation shows up.
    fn first_unregistered(&mut self, conversation_id: ConversationId) -> bool {
        self.warned.insert(conversation_id)
    }

    /// Each Ttl conversation with the time before which its content must go. The writer skips
    /// files it knows hold nothing that old.
    /// A conversation closed at `now_ms`. Returns true when it can be forgotten at once (its
    /// policy needs no sweep); a Ttl conversation waits for its last sweep.
    fn closed(&mut self, conversation_id: ConversationId, now_ms: u64) -> bool {
        match self.policies.get(&conversation_id) {
            Some(StoragePolicy::Ttl { .. }) => {
                self.closed_ttl.insert(conversation_id, now_ms);
                false
            }
            _ => {
                self.forget(conversation_id);
                true
            }
        }
    }

    fn forget(&mut self, conversation_id: ConversationId) {
        self.policies.remove(&conversation_id);
        self.warned.remove(&conversation_id);
        self.closed_ttl.remove(&conversation_id);
    }

    /// Closed Ttl conversations whose every line is older than its ttl at `now_ms`: the
    /// sweep planned now is their last one.
    fn expired_closed(&self, now_ms: u64) -> Vec<ConversationId> {
        let mut done: Vec<ConversationId> = self
            .closed_ttl
            .iter()
            .filter(|(id, closed_at)| match self.policies.get(id) {
                Some(StoragePolicy::Ttl { secs }) => **closed_at < ttl_cutoff_ms(now_ms, *secs),
                _ => true,
            })
            .map(|(id, _)| *id)
            .collect();
        done.sort_unstable();
        done
    }

    fn sweep_plan(&self, now_ms: u64) -> Vec<(ConversationId, u64)> {
        let mut plan: Vec<(ConversationId, u64)> = self
            .policies
            .iter()
            .filter_map(|(id, policy)| match policy {
                StoragePolicy::Ttl { secs } => Some((*id, ttl_cutoff_ms(now_ms, *secs))),
                _ => None,
            })
            .collect();
        plan.sort_unstable_by_key(|(id, _)| *id);
        plan
    }
}

/// Records with `ts_ms` below this are older than the ttl.
fn ttl_cutoff_ms(now_ms: u64, ttl_secs: u64) -> u64 {
    now_ms.saturating_sub(ttl_secs.saturating_mul(1000))
}

/// Kinds that policy `None` keeps.
const MINIMAL_KINDS: [&str; 6] = [
    "task_started",
    "task_finished",
    "task_aborted",
    "error",
    "conversation_opened",
    "conversation_closed",
];

/// What `policy` lets the rollout keep of `env`; `None` when it keeps nothing.
pub fn record_for(policy: StoragePolicy, env: &EventEnvelope) -> Option<RolloutRecord> {
    let kind = env.event.name();
    let (level, event, meta) = match policy {
        StoragePolicy::Full | StoragePolicy::Ttl { .. } => (
            RecordLevel::Full,
            Some(env.event.clone()),
            headers_meta(&env.event),
        ),
        StoragePolicy::HeadersOnly => (RecordLevel::Headers, None, headers_meta(&env.event)),
        StoragePolicy::None => {
            if !MINIMAL_KINDS.contains(&kind) {
                return None;
            }
            (RecordLevel::Minimal, None, minimal_meta(&env.event))
        }
    };
    Some(RolloutRecord {
        seq: env.seq,
        ts_ms: env.ts_ms,
        conversation_id: env.conversation_id,
        task_id: env.task_id,
        kind: kind.to_owned(),
        level,
        event,
        meta,
    })
}

/// A `Full` record reduced to its headers (what the TTL sweep does); others are unchanged.
pub fn downgrade(record: RolloutRecord) -> RolloutRecord {
    match record.level {
        RecordLevel::Full => RolloutRecord {
            level: RecordLevel::Headers,
            event: None,
            ..record
        },
        RecordLevel::Headers | RecordLevel::Minimal => record,
    }
}

/// Whether a record makes the writer fsync the batch it is in.
pub fn is_sync_point(kind: &str) -> bool {
    matches!(
        kind,
        "task_finished" | "task_aborted" | "conversation_closed"
    )
}

/// Content-free facts of an event. `chars` counts the bytes of every content field (text,
/// input, instructions, arguments, outputs, summaries, reasons, error details).
fn headers_meta(event: &EventKind) -> RecordMeta {
    let len = |s: &str| u64::try_from(s.len()).unwrap_or(u64::MAX);
    let error_len = |e: &AgentError| len(&e.to_string());
    match event {
        EventKind::ConversationOpened {
            base_instructions,
            user_instructions,
            ..
        } => RecordMeta {
            chars: Some(
                base_instructions.as_deref().map_or(0, len)
                    + user_instructions.as_deref().map_or(0, len),
            ),
            ..RecordMeta::default()
        },
        EventKind::ConversationRestarted { reason, .. } => RecordMeta {
            chars: Some(len(reason)),
            ..RecordMeta::default()
        },
        EventKind::TaskStarted { input } => RecordMeta {
            chars: Some(len(input)),
            ..RecordMeta::default()
        },
        EventKind::TaskFinished {
            status,
            text,
            stats,
            error,
        } => RecordMeta {
            status: Some(*status),
            error_kind: error.as_ref().map(AgentError::kind),
            chars: Some(len(text) + error.as_ref().map_or(0, error_len)),
            usage: Some(stats.usage),
            steps: Some(stats.steps),
            tool_calls: Some(stats.tool_calls),
            duration_ms: Some(stats.duration_ms),
            ..RecordMeta::default()
        },
        EventKind::TaskAborted { waited_ms } => RecordMeta {
            duration_ms: Some(*waited_ms),
            ..RecordMeta::default()
        },
        EventKind::StepStarted { step, .. } => RecordMeta {
            steps: Some(*step),
            ..RecordMeta::default()
        },
        EventKind::StepFinished { step, usage, .. } => RecordMeta {
            steps: Some(*step),
            usage: *usage,
            ..RecordMeta::default()
        },
        EventKind::AssistantChunk { delta: text } | EventKind::AssistantMessage { text } => {
            RecordMeta {
                chars: Some(len(text)),
                ..RecordMeta::default()
            }
        }
        EventKind::ToolCallStarted { call } => RecordMeta {
            tool: Some(call.name.clone()),
            chars: Some(serde_json::to_string(&call.arguments).map_or(0, |s| len(&s))),
            ..RecordMeta::default()
        },
        EventKind::ToolCallFinished {
            name,
            output,
            is_error,
            duration_ms,
            ..
        } => RecordMeta {
            tool: Some(name.clone()),
            is_error: Some(*is_error),
            chars: Some(len(output)),
            duration_ms: Some(*duration_ms),
            ..RecordMeta::default()
        },
        EventKind::ApprovalRequested {
            command,
            reason,
            subject,
            ..
        } => {
            let asked = match subject {
                ApprovalSubject::Command => 0,
                ApprovalSubject::McpElicitation {
                    message, schema, ..
                } => len(message) + len(&schema.0.to_string()),
                ApprovalSubject::McpSampling { request, .. } => len(&request.0.to_string()),
            };
            RecordMeta {
                chars: Some(command.iter().map(|a| len(a)).sum::<u64>() + len(reason) + asked),
                ..RecordMeta::default()
            }
        }
        EventKind::ApprovalResolved { decision, .. } => RecordMeta {
            chars: match decision {
                troupe_proto::ApprovalDecision::Deny { reason } => {
                    Some(reason.as_deref().map_or(0, len))
                }
                troupe_proto::ApprovalDecision::ApproveWithContent { content } => {
                    Some(len(&content.0.to_string()))
                }
                _ => None,
            },
            ..RecordMeta::default()
        },
        EventKind::ToolProgress { message, .. } => RecordMeta {
            chars: Some(message.as_deref().map_or(0, len)),
            ..RecordMeta::default()
        },
        EventKind::HistoryTrimmed { summary, .. } | EventKind::Compacted { summary, .. } => {
            RecordMeta {
                chars: Some(len(summary)),
                ..RecordMeta::default()
            }
        }
        EventKind::Warning { message, .. } => RecordMeta {
            chars: Some(len(message)),
            ..RecordMeta::default()
        },
        EventKind::Error { error } => RecordMeta {
            error_kind: Some(error.kind()),
            chars: Some(error_len(error)),
            ..RecordMeta::default()
        },
        EventKind::PlanUpdated { explanation, plan } => RecordMeta {
            tool: Some("update_plan".into()),
            chars: Some(
                explanation.as_deref().map_or(0, len)
                    + plan.iter().map(|p| len(&p.step)).sum::<u64>(),
            ),
            ..RecordMeta::default()
        },
        // A kind this build does not know: keep nothing of it but its name.
        _ => RecordMeta::default(),
    }
}

/// Status and error kind only: what policy `None` keeps of the kinds it keeps.
fn minimal_meta(event: &EventKind) -> RecordMeta {
    match event {
        EventKind::TaskFinished { status, error, .. } => RecordMeta {
            status: Some(*status),
            error_kind: error.as_ref().map(AgentError::kind),
            ..RecordMeta::default()
        },
        EventKind::Error { error } => RecordMeta {
            error_kind: Some(error.kind()),
            ..RecordMeta::default()
        },
        _ => RecordMeta::default(),
    }
}

/// A conversation's rollout file.
pub fn conversation_path(dir: &Path, conversation_id: ConversationId) -> PathBuf {
    Target::Conversation(conversation_id).path(dir)
}

/// Reads a rollout file, oldest first. Unreadable lines (a torn last write) are skipped and
/// logged; a missing file is an empty record. Blocking: call it off the async threads.
pub fn read_records(path: &Path) -> Result<Vec<RolloutRecord>, AgentError> {
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
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<RolloutRecord>(line) {
            Ok(record) => records.push(record),
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

/// The highest `seq` recorded in `dir` (0 if none), removing temporary files that an
/// interrupted sweep left behind. Blocking.
fn max_seq_in_dir(dir: &Path) -> io::Result<u64> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut max = 0;
    for entry in entries {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".jsonl.tmp") {
            if let Err(e) = fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove stale sweep file");
            }
        } else if name.ends_with(".jsonl") {
            max = max.max(last_seq_in_file(&path)?);
        }
    }
    Ok(max)
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

/// The `seq` of the last line of `tail` that starts there. The first piece counts as a line
/// start only at the start of the file. A torn line still counts when its `seq` is complete:
/// that event may have been published, so its number must not be handed out again.
fn last_seq_in_tail(tail: &[u8], at_file_start: bool) -> Option<u64> {
    #[derive(Deserialize)]
    struct SeqOnly {
        seq: u64,
    }
    // `seq` is the first field of a serialised record; content inside strings is escaped, so
    // this prefix only ever matches at the start of a record.
    const PREFIX: &[u8] = b"{\"seq\":";
    let pieces = tail.split(|b| *b == b'\n').count();
    for (index, line) in tail.rsplit(|b| *b == b'\n').enumerate() {
        let is_first_piece = index + 1 == pieces;
        if is_first_piece && !at_file_start {
            break;
        }
        if let Some(rest) = line.strip_prefix(PREFIX) {
            let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
            if digits > 0 && rest.get(digits) == Some(&b',') {
                let seq = std::str::from_utf8(&rest[..digits])
                    .ok()
                    .and_then(|s| s.parse().ok());
                if seq.is_some() {
                    return seq;
                }
            }
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

/// Whether a file may hold `Full` lines older than `cutoff_ms`. `known`: `None` when the writer
/// has not looked at the file yet, else the oldest `Full` line's time (if any).
fn needs_sweep(known: Option<Option<u64>>, cutoff_ms: u64) -> bool {
    match known {
        None => true,
        Some(None) => false,
        Some(Some(oldest)) => oldest < cutoff_ms,
    }
}

/// A file of the session's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Target {
    Session,
    Conversation(ConversationId),
}

impl Target {
    fn path(self, dir: &Path) -> PathBuf {
        match self {
            Self::Session => dir.join(SESSION_FILE),
            Self::Conversation(id) => dir.join(format!("{id}.jsonl")),
        }
    }
}

type AckSender = crossbeam_channel::Sender<Result<(), AgentError>>;
type AckReceiver = crossbeam_channel::Receiver<Result<(), AgentError>>;

/// Blocks until the writer answers a flush.
fn wait_ack(ack: &AckReceiver) -> Result<(), AgentError> {
    ack.recv().unwrap_or_else(|_| {
        Err(AgentError::internal(
            "rollout writer stopped before the flush",
        ))
    })
}

/// What the actor asks of its writer thread.
// `Append` is nearly every command; boxing it would only add an allocation per record.
#[allow(clippy::large_enum_variant)]
enum WriterCmd {
    Append {
        target: Target,
        record: RolloutRecord,
    },
    /// Fsync everything written so far, then ack.
    Flush { ack: AckSender },
    /// Downgrade each conversation's `Full` lines older than its cutoff.
    Sweep { plan: Vec<(ConversationId, u64)> },
    /// The conversation is over: close its file (durably) and drop what the writer knows.
    Forget { conversation_id: ConversationId },
}

/// The actor's end of the writer thread.
struct WriterHandle {
    tx: crossbeam_channel::Sender<WriterCmd>,
    thread: std::thread::JoinHandle<()>,
}

impl WriterHandle {
    fn spawn(dir: PathBuf, session_id: SessionId) -> io::Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("rollout-writer".to_owned())
            .spawn(move || {
                let span = tracing::info_span!("rollout_writer", %session_id);
                let _entered = span.enter();
                Writer::new(dir).run(&rx);
            })?;
        Ok(Self { tx, thread })
    }

    /// Closes the channel (the writer then commits what it holds, fsyncs and exits) and joins.
    async fn shutdown(self, session_id: SessionId) {
        let Self { tx, thread } = self;
        drop(tx);
        match tokio::task::spawn_blocking(move || thread.join()).await {
            Ok(Ok(())) => tracing::debug!(%session_id, "rollout writer stopped"),
            Ok(Err(_)) => tracing::error!(%session_id, "rollout writer thread panicked"),
            Err(e) => tracing::error!(%session_id, error = %e, "joining the rollout writer failed"),
        }
    }
}

/// An open rollout file.
struct OpenFile {
    out: BufWriter<File>,
    /// For least-recently-used eviction.
    last_used: u64,
}

/// The writer thread's state. It owns every file of the directory.
struct Writer {
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
    /// The first error since the last flush ack, reported to the next flush.
    error: Option<String>,
}

impl Writer {
    fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            dir_created: false,
            dir_dirty: false,
            open: HashMap::new(),
            tick: 0,
            unsynced: HashSet::new(),
            tainted: HashSet::new(),
            full_since: HashMap::new(),
            error: None,
        }
    }

    /// Group commit loop: block for one command, take what else is queued, commit.
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
            self.process(batch.drain(..));
        }
        // The actor is gone: make everything it handed over durable, then close.
        self.commit(true);
        let targets: Vec<Target> = self.open.keys().copied().collect();
        for target in targets {
            self.close(target);
        }
        if let Some(error) = self.error.take() {
            tracing::error!(%error, "rollout writer stopped after a write error");
        }
    }

    fn process(&mut self, batch: impl Iterator<Item = WriterCmd>) {
        let mut sync = false;
        let mut acks = Vec::new();
        for cmd in batch {
            match cmd {
                WriterCmd::Append { target, record } => {
                    sync |= is_sync_point(&record.kind);
                    self.append(target, &record);
                }
                WriterCmd::Flush { ack } => {
                    sync = true;
                    acks.push(ack);
                }
                WriterCmd::Sweep { plan } => {
                    for (conversation_id, cutoff_ms) in plan {
                        self.sweep(conversation_id, cutoff_ms);
                    }
                }
                WriterCmd::Forget { conversation_id } => {
                    self.close(Target::Conversation(conversation_id));
                    self.full_since.remove(&conversation_id);
                }
            }
        }
        self.commit(sync);
        if !acks.is_empty() {
            let result = match self.error.take() {
                None => Ok(()),
                Some(error) => Err(AgentError::internal(format!(
                    "rollout write failed: {error}"
                ))),
            };
            for ack in acks {
                let _ = ack.send(result.clone());
            }
        }
    }

    fn append(&mut self, target: Target, record: &RolloutRecord) {
        let mut line = match serde_json::to_vec(record) {
            Ok(line) => line,
            Err(e) => return self.fail(WriteOp::Encode, None, &e),
        };
        line.push(b'\n');
        if let Err((op, e)) = self.ensure_open(target) {
            return self.fail(op, Some(target), &e);
        }
        self.tick += 1;
        let Some(file) = self.open.get_mut(&target) else {
            return;
        };
        file.last_used = self.tick;
        if let Err(e) = file.out.write_all(&line) {
            return self.fail(WriteOp::Append, Some(target), &e);
        }
        self.unsynced.insert(target);
        metrics::record_written(record.level, line.len());
        if let (Target::Conversation(id), RecordLevel::Full) = (target, record.level)
            && let Some(known @ None) = self.full_since.get_mut(&id)
        {
            *known = Some(record.ts_ms);
        }
    }

    /// Writes buffered lines to the OS; with `sync`, fsyncs every file holding unsynced lines
    /// (and the directory if a file was created).
    fn commit(&mut self, sync: bool) {
        let mut failed = Vec::new();
        for (target, file) in &mut self.open {
            if !file.out.buffer().is_empty()
                && let Err(e) = file.out.flush()
            {
                failed.push((*target, e));
            }
        }
        for (target, e) in failed {
            self.fail(WriteOp::Flush, Some(target), &e);
        }
        if !sync {
            return;
        }
        let targets: Vec<Target> = self.unsynced.drain().collect();
        for target in targets {
            if let Some(file) = self.open.get(&target) {
                let started = Instant::now();
                match file.out.get_ref().sync_data() {
                    Ok(()) => metrics::fsynced(started.elapsed()),
                    Err(e) => self.fail(WriteOp::Sync, Some(target), &e),
                }
            }
        }
        if self.dir_dirty {
            match sync_dir(&self.dir) {
                Ok(()) => self.dir_dirty = false,
                Err(e) => self.fail(WriteOp::Sync, None, &e),
            }
        }
    }

    fn ensure_open(&mut self, target: Target) -> Result<(), (WriteOp, io::Error)> {
        if self.open.contains_key(&target) {
            return Ok(());
        }
        if !self.dir_created {
            create_private_dir(&self.dir).map_err(|e| (WriteOp::CreateDir, e))?;
            // The directory's own entry must survive a crash too.
            if let Some(parent) = self.dir.parent() {
                let _ = sync_dir(parent);
            }
            self.dir_created = true;
        }
        if self.open.len() >= MAX_OPEN_FILES
            && let Some(lru) = self
                .open
                .iter()
                .min_by_key(|(_, f)| f.last_used)
                .map(|(t, _)| *t)
        {
            self.close(lru);
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
    fn close(&mut self, target: Target) {
        let Some(mut file) = self.open.remove(&target) else {
            return;
        };
        if let Err(e) = file.out.flush() {
            self.unsynced.remove(&target);
            return self.fail(WriteOp::Flush, Some(target), &e);
        }
        if self.unsynced.remove(&target) {
            let started = Instant::now();
            match file.out.get_ref().sync_data() {
                Ok(()) => metrics::fsynced(started.elapsed()),
                Err(e) => self.fail(WriteOp::Sync, Some(target), &e),
            }
        }
    }

    fn sweep(&mut self, conversation_id: ConversationId, cutoff_ms: u64) {
        if !needs_sweep(self.full_since.get(&conversation_id).copied(), cutoff_ms) {
            return;
        }
        let target = Target::Conversation(conversation_id);
        if let Some(file) = self.open.get_mut(&target)
            && let Err(e) = file.out.flush()
        {
            return self.fail(WriteOp::Flush, Some(target), &e);
        }
        let path = target.path(&self.dir);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.full_since.insert(conversation_id, None);
                return;
            }
            Err(e) => return self.fail(WriteOp::Sweep, None, &e),
        };
        let outcome = sweep_lines(&bytes, cutoff_ms);
        if outcome.changed() {
            // The cached handle points at the file being replaced; its lines are durable
            // before it goes, so a failed rewrite leaves a complete old file.
            self.close(target);
            if let Err(e) = replace_file(&self.dir, &path, &outcome.bytes) {
                self.full_since.remove(&conversation_id);
                return self.fail(WriteOp::Sweep, None, &e);
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
    }

    /// Logs and counts an error, keeps it for the next flush, and forgets the file's handle
    /// (its buffer is discarded, not retried: a retry could tear a line twice).
    fn fail(&mut self, op: WriteOp, target: Option<Target>, error: &dyn std::fmt::Display) {
        let file = target.map(|t| t.path(&self.dir).display().to_string());
        tracing::error!(op = op.as_str(), file, %error, "rollout write failed");
        metrics::write_error(op);
        if self.error.is_none() {
            self.error = Some(format!("{}: {error}", op.as_str()));
        }
        if let Some(target) = target {
            if let Some(file) = self.open.remove(&target) {
                let _ = file.out.into_parts();
            }
            self.unsynced.remove(&target);
            self.tainted.insert(target);
        }
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
    use super::*;
    use proptest::prelude::*;
    use ractor::call;
    use tokio::sync::broadcast::error::TryRecvError;
    use troupe_proto::{ApprovalDecision, ApprovalId, CloseOutcome, Json, TaskStats, ToolCall};

    const CANARY: &str = "CANARY-7f3a";

    /// Every content field carries `CANARY:<field>`.
    fn field(name: &str) -> String {
        format!("{CANARY}:{name}")
    }

    /// One event of every kind, content fields marked.
    fn every_kind() -> Vec<EventKind> {
        vec![
            EventKind::ConversationOpened {
                storage_policy: StoragePolicy::Full,
                base_instructions: Some(field("base")),
                user_instructions: Some(field("user")),
            },
            EventKind::ConversationRestarted {
                reason: field("restart"),
                restored_items: 3,
            },
            EventKind::TaskStarted {
                input: field("input"),
            },
            EventKind::TaskFinished {
                status: TaskStatus::Error,
                text: field("text"),
                stats: TaskStats {
                    usage: Usage {
                        input_tokens: 10,
                        output_tokens: 5,
                        ..Usage::default()
                    },
                    steps: 2,
                    tool_calls: 1,
                    duration_ms: 40,
                    ..TaskStats::default()
                },
                error: Some(AgentError::ToolError {
                    name: "shell".into(),
                    message: field("task_error"),
                }),
            },
            EventKind::TaskAborted { waited_ms: 5000 },
            EventKind::StepStarted { turn: 1, step: 2 },
            EventKind::AssistantChunk {
                delta: field("chunk"),
            },
            EventKind::AssistantMessage {
                text: field("assistant"),
            },
            EventKind::ToolCallStarted {
                call: ToolCall {
                    call_id: "call-1".into(),
                    name: "shell".into(),
                    arguments: Json(serde_json::json!({ "cmd": field("args") })),
                },
            },
            EventKind::ToolCallFinished {
                call_id: "call-1".into(),
                name: "shell".into(),
                output: field("output"),
                is_error: true,
                duration_ms: 12,
            },
            EventKind::ApprovalRequested {
                approval_id: ApprovalId::new(),
                command: vec!["rm".into(), field("command")],
                reason: field("approval_reason"),
                subject: ApprovalSubject::Command,
            },
            EventKind::ApprovalRequested {
                approval_id: ApprovalId::new(),
                command: vec!["mcp".into(), "everything".into(), "elicitation".into()],
                reason: field("elicitation"),
                subject: ApprovalSubject::McpElicitation {
                    server: "everything".into(),
                    message: field("elicitation"),
                    schema: Json(serde_json::json!({ "title": field("schema") })),
                },
            },
            EventKind::ApprovalResolved {
                approval_id: ApprovalId::new(),
                decision: ApprovalDecision::ApproveWithContent {
                    content: Json(serde_json::json!({ "name": field("elicited") })),
                },
            },
            EventKind::ToolProgress {
                call_id: "call-1".into(),
                progress: 2.0,
                total: Some(5.0),
                message: Some(field("progress")),
            },
            EventKind::McpServerReady {
                server: "everything".into(),
                tools: 13,
            },
            EventKind::ApprovalResolved {
                approval_id: ApprovalId::new(),
                decision: ApprovalDecision::Deny {
                    reason: Some(field("deny")),
                },
            },
            EventKind::HistoryTrimmed {
                removed_items: 4,
                summary: field("summary"),
            },
            EventKind::Warning {
                code: "clamped".into(),
                message: field("warning"),
            },
            EventKind::Error {
                error: AgentError::ModelError {
                    message: field("error"),
                    retryable: false,
                },
            },
            EventKind::StepFinished {
                turn: 1,
                step: 2,
                estimated_prompt_tokens: 40,
                usage: Some(Usage {
                    input_tokens: 38,
                    output_tokens: 5,
                    ..Usage::default()
                }),
            },
            EventKind::PlanUpdated {
                explanation: Some(field("plan_why")),
                plan: vec![troupe_proto::PlanStep {
                    step: field("plan_step"),
                    status: troupe_proto::PlanStepStatus::InProgress,
                }],
            },
            // Last: closing a conversation ends its record.
            EventKind::ConversationClosed {
                outcome: CloseOutcome::Closed,
            },
        ]
    }

    const CONTENT_FIELDS: [&str; 21] = [
        "base",
        "user",
        "restart",
        "input",
        "text",
        "task_error",
        "chunk",
        "assistant",
        "args",
        "output",
        "command",
        "approval_reason",
        "deny",
        "summary",
        "warning",
        "plan_why",
        "plan_step",
        "elicitation",
        "schema",
        "elicited",
        "progress",
    ];

    const ALL_POLICIES: [StoragePolicy; 4] = [
        StoragePolicy::Full,
        StoragePolicy::HeadersOnly,
        StoragePolicy::None,
        StoragePolicy::Ttl { secs: 3600 },
    ];

    fn envelope(seq: u64, event: EventKind) -> EventEnvelope {
        let conversation_id = ConversationId::new();
        let task_id = TaskId::new();
        EventEnvelope {
            seq,
            ts_ms: 1_000 + seq,
            session_id: SessionId::new(),
            conversation_id: Some(conversation_id),
            task_id: Some(task_id),
            sub_id: Some(crate::events::sub_id(conversation_id, task_id)),
            trace_id: None,
            span_id: None,
            event,
        }
    }

    fn contains(haystack: &[u8], needle: &str) -> bool {
        haystack
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    }

    #[test]
    fn samples_cover_every_kind() {
        let names: HashSet<&str> = every_kind().iter().map(EventKind::name).collect();
        assert_eq!(names.len(), 20, "one sample per EventKind variant");
        for kind in MINIMAL_KINDS {
            assert!(names.contains(kind));
        }
    }

    #[test]
    fn record_for_every_kind_under_every_policy() {
        for (i, event) in every_kind().into_iter().enumerate() {
            let env = envelope(i as u64 + 1, event);
            let kind = env.event.name();
            for policy in ALL_POLICIES {
                let record = record_for(policy, &env);
                let line = record
                    .as_ref()
                    .map(|r| serde_json::to_string(r).unwrap())
                    .unwrap_or_default();
                match policy {
                    StoragePolicy::Full | StoragePolicy::Ttl { .. } => {
                        let r = record.unwrap();
                        assert_eq!(r.level, RecordLevel::Full);
                        assert_eq!(r.event.as_ref(), Some(&env.event));
                        assert_eq!(r.meta, headers_meta(&env.event), "{kind}");
                    }
                    StoragePolicy::HeadersOnly => {
                        let r = record.unwrap();
                        assert_eq!(r.level, RecordLevel::Headers);
                        assert_eq!(r.event, None);
                        assert!(!contains(line.as_bytes(), CANARY), "{kind}: {line}");
                    }
                    StoragePolicy::None => {
                        assert_eq!(record.is_some(), MINIMAL_KINDS.contains(&kind), "{kind}");
                        if let Some(r) = record {
                            assert_eq!(r.level, RecordLevel::Minimal);
                            assert_eq!(r.event, None);
                            assert_eq!(
                                r.meta,
                                RecordMeta {
                                    status: r.meta.status,
                                    error_kind: r.meta.error_kind,
                                    ..RecordMeta::default()
                                },
                                "{kind}: only status and error kind"
                            );
                            assert!(!contains(line.as_bytes(), CANARY), "{kind}: {line}");
                        }
                    }
                }
                if let Some(r) = record_for(policy, &env) {
                    assert_eq!(r.seq, env.seq);
                    assert_eq!(r.ts_ms, env.ts_ms);
                    assert_eq!(r.conversation_id, env.conversation_id);
                    assert_eq!(r.task_id, env.task_id);
                    assert_eq!(r.kind, kind);
                    let back: RolloutRecord = serde_json::from_str(&line).unwrap();
                    assert_eq!(back, r);
                }
            }
        }
    }

    #[test]
    fn full_lines_hold_every_content_field() {
        let lines: String = every_kind()
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                serde_json::to_string(&record_for(StoragePolicy::Full, &envelope(i as u64, e)))
                    .unwrap()
            })
            .collect();
        for name in CONTENT_FIELDS {
            assert!(lines.contains(&field(name)), "{name}");
        }
    }

    #[test]
    fn downgrade_is_headers_only_and_idempotent() {
        for (i, event) in every_kind().into_iter().enumerate() {
            let env = envelope(i as u64, event);
            let full = record_for(StoragePolicy::Full, &env).unwrap();
            let headers = record_for(StoragePolicy::HeadersOnly, &env).unwrap();
            let once = downgrade(full);
            assert_eq!(once, headers);
            assert_eq!(downgrade(once.clone()), once);
            if let Some(minimal) = record_for(StoragePolicy::None, &env) {
                assert_eq!(downgrade(minimal.clone()), minimal);
            }
        }
    }

    #[test]
    fn headers_keep_the_facts() {
        let kinds = every_kind();
        let meta = |name: &str| headers_meta(kinds.iter().find(|k| k.name() == name).unwrap());
        let finished = meta("task_finished");
        assert_eq!(finished.status, Some(TaskStatus::Error));
        assert_eq!(finished.error_kind, Some(ErrorKind::ToolError));
        assert_eq!(finished.usage.unwrap().input_tokens, 10);
        assert_eq!((finished.steps, finished.tool_calls), (Some(2), Some(1)));
        assert_eq!(finished.duration_ms, Some(40));
        let tool = meta("tool_call_finished");
        assert_eq!(tool.tool.as_deref(), Some("shell"));
        assert_eq!(tool.is_error, Some(true));
        assert_eq!(tool.chars, Some(field("output").len() as u64));
        assert_eq!(meta("tool_call_started").tool.as_deref(), Some("shell"));
        assert_eq!(
            meta("task_started").chars,
            Some(field("input").len() as u64)
        );
        assert_eq!(meta("error").error_kind, Some(ErrorKind::ModelError));
        assert_eq!(
            meta("tool_progress").chars,
            Some(field("progress").len() as u64)
        );
        assert_eq!(meta("mcp_server_ready"), RecordMeta::default());
        assert_eq!(meta("conversation_closed"), RecordMeta::default());
    }

    #[test]
    fn headers_line_snapshot() {
        let env = EventEnvelope {
            seq: 7,
            ts_ms: 1_700_000_000_000,
            session_id: "0190a000-0000-7000-8000-000000000001".parse().unwrap(),
            conversation_id: Some("0190a000-0000-7000-8000-000000000002".parse().unwrap()),
            task_id: Some("0190a000-0000-7000-8000-000000000003".parse().unwrap()),
            sub_id: None,
            trace_id: None,
            span_id: None,
            event: EventKind::ToolCallFinished {
                call_id: "call-1".into(),
                name: "shell".into(),
                output: "secret output".into(),
                is_error: false,
                duration_ms: 12,
            },
        };
        let line =
            serde_json::to_string(&record_for(StoragePolicy::HeadersOnly, &env).unwrap()).unwrap();
        insta::assert_snapshot!(line, @r#"{"seq":7,"ts_ms":1700000000000,"conversation_id":"0190a000-0000-7000-8000-000000000002","task_id":"0190a000-0000-7000-8000-000000000003","kind":"tool_call_finished","level":"headers","meta":{"tool":"shell","is_error":false,"chars":13,"duration_ms":12}}"#);
    }

    #[test]
    fn sync_points() {
        for kind in every_kind() {
            let expected = matches!(
                kind.name(),
                "task_finished" | "task_aborted" | "conversation_closed"
            );
            assert_eq!(is_sync_point(kind.name()), expected);
        }
    }

    #[test]
    fn core_numbers_and_places_events() {
        let session = SessionId::new();
        let mut core = RolloutCore::new(41);
        let (full, ttl, unknown) = (
            ConversationId::new(),
            ConversationId::new(),
            ConversationId::new(),
        );
        assert_eq!(core.register(full, StoragePolicy::Full), None);
        core.register(ttl, StoragePolicy::Ttl { secs: 10 });
        let a = core.stamp(
            session,
            EventDraft::conversation(full, EventKind::TaskAborted { waited_ms: 1 }),
            5,
        );
        let b = core.stamp(
            session,
            EventDraft::session(EventKind::TaskAborted { waited_ms: 1 }),
            5,
        );
        assert_eq!((a.seq, b.seq, core.last_seq()), (42, 43, 43));
        assert_eq!(a.session_id, session);
        assert_eq!(core.placement(None), Placement::Session);
        assert_eq!(Placement::Session.policy(), StoragePolicy::HeadersOnly);
        assert_eq!(
            core.placement(Some(full)),
            Placement::Registered(full, StoragePolicy::Full)
        );
        let p = core.placement(Some(unknown));
        assert_eq!(p, Placement::Unregistered(unknown));
        assert_eq!(p.policy(), StoragePolicy::None);
        assert!(core.first_unregistered(unknown));
        assert!(!core.first_unregistered(unknown));
        assert_eq!(core.sweep_plan(60_000), vec![(ttl, 50_000)]);
        assert_eq!(core.sweep_plan(3_000), vec![(ttl, 0)]);
    }

    fn full_line(seq: u64, ts_ms: u64, text: &str) -> Vec<u8> {
        let mut env = envelope(seq, EventKind::AssistantMessage { text: text.into() });
        env.ts_ms = ts_ms;
        let mut line = serde_json::to_vec(&record_for(StoragePolicy::Full, &env).unwrap()).unwrap();
        line.push(b'\n');
        line
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
        fs::write(dir.path().join("d.jsonl.tmp"), b"left over").unwrap();
        assert_eq!(max_seq_in_dir(dir.path()).unwrap(), 0);
        assert!(!dir.path().join("d.jsonl.tmp").exists());
        assert_eq!(max_seq_in_dir(&dir.path().join("missing")).unwrap(), 0);
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
                let line = full_line(i as u64 + 1, *ts, "content");
                if *full {
                    file.extend(line);
                } else {
                    let r: RolloutRecord = serde_json::from_slice(&line).unwrap();
                    file.extend(serde_json::to_vec(&downgrade(r)).unwrap());
                    file.push(b'\n');
                }
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

    fn args(dir: &Path, clock: Clock, capacity: usize) -> RolloutArgs {
        RolloutArgs {
            session_id: SessionId::new(),
            dir: dir.to_path_buf(),
            clock,
            ttl_sweep_interval: Duration::from_secs(60),
            subscriber_capacity: capacity,
        }
    }

    async fn start(args: RolloutArgs) -> ActorRef<RolloutMsg> {
        Actor::spawn(None, Rollout, args).await.unwrap().0
    }

    async fn flush(rollout: &ActorRef<RolloutMsg>) {
        call!(rollout, |reply| RolloutMsg::Flush { reply })
            .unwrap()
            .unwrap();
    }

    async fn last_seq(rollout: &ActorRef<RolloutMsg>) -> u64 {
        call!(rollout, |reply| RolloutMsg::LastSeq { reply }).unwrap()
    }

    async fn read(rollout: &ActorRef<RolloutMsg>, id: ConversationId) -> Vec<RolloutRecord> {
        call!(rollout, |reply| RolloutMsg::ReadConversation {
            conversation_id: id,
            reply
        })
        .unwrap()
        .unwrap()
    }

    fn register(rollout: &ActorRef<RolloutMsg>, id: ConversationId, policy: StoragePolicy) {
        rollout
            .cast(RolloutMsg::ConversationRegistered {
                conversation_id: id,
                policy,
            })
            .unwrap();
    }

    fn emit(rollout: &ActorRef<RolloutMsg>, draft: EventDraft) {
        rollout.cast(RolloutMsg::Emit { draft }).unwrap();
    }

    /// Every byte under `dir`, recursively.
    fn disk_bytes(dir: &Path) -> Vec<u8> {
        let mut out = Vec::new();
        let Ok(entries) = fs::read_dir(dir) else {
            return out;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.extend(disk_bytes(&path));
            } else {
                out.extend(fs::read(&path).unwrap());
            }
        }
        out
    }

    fn line_count(path: &Path) -> usize {
        fs::read(path)
            .map(|b| b.split(|c| *c == b'\n').filter(|l| !l.is_empty()).count())
            .unwrap_or(0)
    }

    /// Emits one event of every kind in `conversation_id`'s task, plus a session-level one.
    fn emit_every_kind(rollout: &ActorRef<RolloutMsg>, conversation_id: ConversationId) {
        let task_id = TaskId::new();
        for event in every_kind() {
            emit(rollout, EventDraft::task(conversation_id, task_id, event));
        }
        emit(
            rollout,
            EventDraft::session(EventKind::Warning {
                code: "session".into(),
                message: field("session_warning"),
            }),
        );
    }

    #[tokio::test]
    async fn canaries_reach_disk_exactly_as_each_policy_allows() {
        for policy in ALL_POLICIES {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("rollout");
            let rollout = start(args(&dir, Clock::new(), 64)).await;
            let conversation = ConversationId::new();
            register(&rollout, conversation, policy);
            emit_every_kind(&rollout, conversation);
            flush(&rollout).await;

            let bytes = disk_bytes(&dir);
            let conv_file = conversation_path(&dir, conversation);
            let session_file = dir.join(SESSION_FILE);
            assert!(
                !contains(&fs::read(&session_file).unwrap(), CANARY),
                "session-level events keep no content"
            );
            assert_eq!(line_count(&session_file), 1);
            let records = read(&rollout, conversation).await;
            match policy {
                StoragePolicy::Full | StoragePolicy::Ttl { .. } => {
                    for name in CONTENT_FIELDS {
                        assert!(contains(&bytes, &field(name)), "{policy:?}: {name} on disk");
                    }
                    assert_eq!(records.len(), 22);
                    assert!(records.iter().all(|r| r.level == RecordLevel::Full));
                }
                StoragePolicy::HeadersOnly => {
                    assert!(!contains(&bytes, CANARY), "{policy:?}: no content on disk");
                    assert_eq!(records.len(), 22);
                    assert!(records.iter().all(|r| r.level == RecordLevel::Headers));
                }
                StoragePolicy::None => {
                    assert!(!contains(&bytes, CANARY), "{policy:?}: no content on disk");
                    let kinds: Vec<&str> = records.iter().map(|r| r.kind.as_str()).collect();
                    assert_eq!(
                        kinds,
                        vec![
                            "conversation_opened",
                            "task_started",
                            "task_finished",
                            "task_aborted",
                            "error",
                            "conversation_closed"
                        ]
                    );
                    assert!(records.iter().all(|r| r.level == RecordLevel::Minimal));
                }
            }
            assert_eq!(line_count(&conv_file), records.len());
            rollout.drain_and_wait(None).await.unwrap();
        }
    }

    #[tokio::test]
    async fn unregistered_conversations_are_recorded_as_policy_none() {
        let tmp = tempfile::tempdir().unwrap();
        let rollout = start(args(tmp.path(), Clock::new(), 64)).await;
        let conversation = ConversationId::new();
        emit_every_kind(&rollout, conversation);
        flush(&rollout).await;
        assert!(!contains(&disk_bytes(tmp.path()), CANARY));
        let records = read(&rollout, conversation).await;
        assert_eq!(records.len(), MINIMAL_KINDS.len());
        assert!(records.iter().all(|r| r.level == RecordLevel::Minimal));
    }

    #[tokio::test]
    async fn seq_is_strictly_increasing_and_gap_free() {
        let tmp = tempfile::tempdir().unwrap();
        let rollout = start(args(tmp.path(), Clock::new(), 1024)).await;
        let mut rx = call!(rollout, |reply| RolloutMsg::Subscribe { reply }).unwrap();
        let conversations = [
            (ConversationId::new(), StoragePolicy::Full),
            (ConversationId::new(), StoragePolicy::HeadersOnly),
            (ConversationId::new(), StoragePolicy::None),
        ];
        for (id, policy) in conversations {
            register(&rollout, id, policy);
        }
        for i in 0..300 {
            let event = EventKind::AssistantChunk {
                delta: format!("chunk {i}"),
            };
            let draft = match i % 4 {
                3 => EventDraft::session(event),
                n => EventDraft::conversation(conversations[n].0, event),
            };
            emit(&rollout, draft);
        }
        assert_eq!(last_seq(&rollout).await, 300);
        let mut last_ts = 0;
        for expected in 1..=300 {
            let env = rx.recv().await.unwrap();
            assert_eq!(env.seq, expected);
            assert!(env.ts_ms >= last_ts);
            last_ts = env.ts_ms;
        }
        flush(&rollout).await;
        let mut on_disk: Vec<u64> = Vec::new();
        for path in [
            conversation_path(tmp.path(), conversations[0].0),
            conversation_path(tmp.path(), conversations[1].0),
            tmp.path().join(SESSION_FILE),
        ] {
            let seqs: Vec<u64> = read_records(&path).unwrap().iter().map(|r| r.seq).collect();
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "in order within a file"
            );
            on_disk.extend(seqs);
        }
        on_disk.sort_unstable();
        // Policy None keeps no chunks; everything else is on disk once.
        let expected: Vec<u64> = (1..=300u64).filter(|s| (s - 1) % 4 != 2).collect();
        assert_eq!(on_disk, expected);
    }

    #[tokio::test]
    async fn a_subscriber_that_never_reads_loses_nothing_on_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let capacity = 4;
        let rollout = start(args(tmp.path(), Clock::new(), capacity)).await;
        let mut rx = call!(rollout, |reply| RolloutMsg::Subscribe { reply }).unwrap();
        let conversation = ConversationId::new();
        register(&rollout, conversation, StoragePolicy::Full);
        let n = 10 * capacity;
        for i in 0..n {
            emit(
                &rollout,
                EventDraft::conversation(
                    conversation,
                    EventKind::AssistantChunk {
                        delta: format!("{i}"),
                    },
                ),
            );
        }
        flush(&rollout).await;
        assert_eq!(line_count(&conversation_path(tmp.path(), conversation)), n);
        assert_eq!(
            rx.try_recv().unwrap_err(),
            TryRecvError::Lagged((n - capacity) as u64)
        );
        assert_eq!(rx.try_recv().unwrap().seq, (n - capacity + 1) as u64);
    }

    #[tokio::test]
    async fn flush_after_n_emits_leaves_n_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let rollout = start(args(tmp.path(), Clock::new(), 16)).await;
        let conversation = ConversationId::new();
        register(&rollout, conversation, StoragePolicy::HeadersOnly);
        for _ in 0..2500 {
            emit(
                &rollout,
                EventDraft::conversation(conversation, EventKind::StepStarted { turn: 1, step: 1 }),
            );
        }
        flush(&rollout).await;
        assert_eq!(
            line_count(&conversation_path(tmp.path(), conversation)),
            2500
        );
    }

    #[tokio::test]
    async fn read_conversation_round_trips_full_records() {
        let tmp = tempfile::tempdir().unwrap();
        let rollout = start(args(tmp.path(), Clock::new(), 64)).await;
        let mut rx = call!(rollout, |reply| RolloutMsg::Subscribe { reply }).unwrap();
        let conversation = ConversationId::new();
        register(&rollout, conversation, StoragePolicy::Full);
        emit_every_kind(&rollout, conversation);
        let records = read(&rollout, conversation).await;
        let mut expected = Vec::new();
        while let Ok(env) = rx.try_recv() {
            if env.conversation_id == Some(conversation) {
                expected.push(record_for(StoragePolicy::Full, &env).unwrap());
            }
        }
        assert_eq!(expected.len(), 22);
        assert_eq!(records, expected);
        assert_eq!(read(&rollout, ConversationId::new()).await, vec![]);
    }

    #[tokio::test]
    async fn a_torn_last_line_is_skipped_on_read_and_its_seq_not_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let conversation = ConversationId::new();
        let mut bytes = full_line(1, 1, "a");
        bytes.extend(full_line(2, 2, "b"));
        bytes.extend(b"{\"seq\":3,\"ts_ms\":3,\"conversation_id\":nu");
        fs::write(conversation_path(tmp.path(), conversation), bytes).unwrap();
        let rollout = start(args(tmp.path(), Clock::new(), 64)).await;
        register(&rollout, conversation, StoragePolicy::Full);
        assert_eq!(last_seq(&rollout).await, 3);
        let records = read(&rollout, conversation).await;
        assert_eq!(
            records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![1, 2]
        );
        // The next record starts on a line of its own instead of being glued to the torn one.
        emit(
            &rollout,
            EventDraft::conversation(conversation, EventKind::TaskAborted { waited_ms: 1 }),
        );
        let records = read(&rollout, conversation).await;
        assert_eq!(
            records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![1, 2, 4]
        );
    }

    #[tokio::test]
    async fn a_restart_on_the_same_dir_continues_seq() {
        let tmp = tempfile::tempdir().unwrap();
        let conversation = ConversationId::new();
        let rollout = start(args(tmp.path(), Clock::new(), 64)).await;
        register(&rollout, conversation, StoragePolicy::Full);
        for _ in 0..5 {
            emit(
                &rollout,
                EventDraft::conversation(
                    conversation,
                    EventKind::AssistantMessage { text: "hi".into() },
                ),
            );
        }
        // No flush: stopping must make everything handed over durable.
        rollout.drain_and_wait(None).await.unwrap();
        assert_eq!(line_count(&conversation_path(tmp.path(), conversation)), 5);

        let rollout = start(args(tmp.path(), Clock::new(), 64)).await;
        assert_eq!(last_seq(&rollout).await, 5);
        let mut rx = call!(rollout, |reply| RolloutMsg::Subscribe { reply }).unwrap();
        register(&rollout, conversation, StoragePolicy::Full);
        emit(
            &rollout,
            EventDraft::session(EventKind::TaskAborted { waited_ms: 0 }),
        );
        assert_eq!(rx.recv().await.unwrap().seq, 6);
        let seqs: Vec<u64> = read(&rollout, conversation)
            .await
            .iter()
            .map(|r| r.seq)
            .collect();
        assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
    }

    #[tokio::test]
    async fn a_write_error_fails_the_flush_not_the_actor() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("rollout");
        let rollout = start(args(&dir, Clock::new(), 64)).await;
        // The directory cannot be created: a file is in the way.
        fs::write(&dir, b"not a directory").unwrap();
        emit(
            &rollout,
            EventDraft::session(EventKind::TaskAborted { waited_ms: 0 }),
        );
        let result = call!(rollout, |reply| RolloutMsg::Flush { reply }).unwrap();
        assert!(
            matches!(result, Err(AgentError::Internal { .. })),
            "{result:?}"
        );
        // Reported once; the actor carries on.
        assert_eq!(last_seq(&rollout).await, 1);
        flush(&rollout).await;
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn files_are_private_to_the_owner() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("rollout");
        let rollout = start(args(&dir, Clock::new(), 64)).await;
        emit(
            &rollout,
            EventDraft::session(EventKind::TaskAborted { waited_ms: 0 }),
        );
        flush(&rollout).await;
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(SESSION_FILE)), 0o600);
    }

    #[tokio::test]
    async fn more_conversations_than_open_files() {
        let tmp = tempfile::tempdir().unwrap();
        let rollout = start(args(tmp.path(), Clock::new(), 64)).await;
        let conversations: Vec<ConversationId> = (0..MAX_OPEN_FILES * 3)
            .map(|_| ConversationId::new())
            .collect();
        for id in &conversations {
            register(&rollout, *id, StoragePolicy::Full);
        }
        for round in 0..3 {
            for id in &conversations {
                emit(
                    &rollout,
                    EventDraft::conversation(
                        *id,
                        EventKind::AssistantMessage {
                            text: format!("{round}"),
                        },
                    ),
                );
            }
            flush(&rollout).await;
        }
        for id in &conversations {
            assert_eq!(line_count(&conversation_path(tmp.path(), *id)), 3);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ttl_content_is_downgraded_after_the_ttl() {
        let tmp = tempfile::tempdir().unwrap();
        let rollout = start(args(tmp.path(), Clock::new(), 64)).await;
        let (ttl, full) = (ConversationId::new(), ConversationId::new());
        register(&rollout, ttl, StoragePolicy::Ttl { secs: 600 });
        register(&rollout, full, StoragePolicy::Full);
        for id in [ttl, full] {
            emit(
                &rollout,
                EventDraft::conversation(
                    id,
                    EventKind::TaskStarted {
                        input: "OLD-CANARY".into(),
                    },
                ),
            );
        }
        flush(&rollout).await;
        let ttl_file = conversation_path(tmp.path(), ttl);
        let full_file = conversation_path(tmp.path(), full);
        assert!(contains(&fs::read(&ttl_file).unwrap(), "OLD-CANARY"));

        // Not yet: a sweep before the ttl keeps the content.
        tokio::time::advance(Duration::from_secs(300)).await;
        rollout.cast(RolloutMsg::SweepTtl).unwrap();
        flush(&rollout).await;
        assert!(contains(&fs::read(&ttl_file).unwrap(), "OLD-CANARY"));

        tokio::time::advance(Duration::from_secs(301)).await;
        emit(
            &rollout,
            EventDraft::conversation(
                ttl,
                EventKind::TaskStarted {
                    input: "NEW-CANARY".into(),
                },
            ),
        );
        rollout.cast(RolloutMsg::SweepTtl).unwrap();
        flush(&rollout).await;

        assert!(
            !contains(&fs::read(&ttl_file).unwrap(), "OLD-CANARY"),
            "old ttl content is gone"
        );
        assert!(
            contains(&fs::read(&ttl_file).unwrap(), "NEW-CANARY"),
            "recent ttl content stays"
        );
        assert!(
            contains(&fs::read(&full_file).unwrap(), "OLD-CANARY"),
            "full content stays"
        );
        let records = read(&rollout, ttl).await;
        assert_eq!(
            records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert_eq!(records[0].level, RecordLevel::Headers);
        assert_eq!(records[0].meta.chars, Some("OLD-CANARY".len() as u64));
        assert_eq!(records[1].level, RecordLevel::Full);
        assert!(
            fs::read_dir(tmp.path()).unwrap().all(|e| !e
                .unwrap()
                .path()
                .to_string_lossy()
                .ends_with(".tmp"))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweep_timer_runs_on_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        let rollout = start(args(tmp.path(), Clock::new(), 64)).await;
        let ttl = ConversationId::new();
        register(&rollout, ttl, StoragePolicy::Ttl { secs: 600 });
        emit(
            &rollout,
            EventDraft::conversation(
                ttl,
                EventKind::AssistantMessage {
                    text: "OLD-CANARY".into(),
                },
            ),
        );
        flush(&rollout).await;
        assert!(contains(&disk_bytes(tmp.path()), "OLD-CANARY"));
        tokio::time::advance(Duration::from_secs(601 + 60)).await;
        // The timer's SweepTtl is queued by now; a barrier through the mailbox and the writer.
        last_seq(&rollout).await;
        flush(&rollout).await;
        assert!(!contains(&disk_bytes(tmp.path()), "OLD-CANARY"));
    }

    #[test]
    fn closed_conversations_are_forgotten_when_no_sweep_needs_them() {
        let mut core = RolloutCore::new(0);
        let full = ConversationId::new();
        let ttl = ConversationId::new();
        core.register(full, StoragePolicy::Full);
        core.register(ttl, StoragePolicy::Ttl { secs: 60 });
        assert!(
            core.closed(full, 1_000),
            "a Full conversation is forgotten at close"
        );
        assert!(!core.policies.contains_key(&full));
        assert!(
            !core.closed(ttl, 1_000),
            "a Ttl conversation waits for its last sweep"
        );
        assert!(
            core.expired_closed(61_000).is_empty(),
            "its lines are not all past the ttl yet"
        );
        assert_eq!(core.sweep_plan(61_000).len(), 1);
        assert_eq!(core.expired_closed(61_001), vec![ttl]);
        core.forget(ttl);
        assert!(core.sweep_plan(61_001).is_empty());
        assert!(core.closed_ttl.is_empty() && core.policies.is_empty());
    }
}
