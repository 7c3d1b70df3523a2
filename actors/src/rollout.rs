//! Rollout: the session's event sequencer and its durable, policy-aware record (S10, S11, P4).
//!
//! One Rollout per session. Every event of the session passes through it: it assigns the
//! per-session `seq` (from 1, strictly increasing, never reused, also across restarts) and
//! `ts_ms`, hands what the conversation's [`StoragePolicy`] allows to its writer thread, and
//! the writer publishes the whole envelope to live subscribers once the batch that recorded it
//! is committed. So everything a subscriber saw that the policy keeps is readable from storage,
//! even after a crash, and every number it saw is accounted for by storage's high-water mark. A
//! subscriber that falls behind loses live events (`Lagged`), never records;
//! [`stream::EventStream`] (`SessionHandle::events`) refills from storage and resumes after
//! any `seq` without gaps or duplicates.
//!
//! # Mailbox
//! - `ConversationRegistered { conversation_id, policy }`: remembers the policy. Events of a
//!   conversation that was never registered are recorded as policy `None` (and warned about
//!   once): content never reaches storage unless a policy allowed it.
//! - `Emit { draft }`: numbers, hands the record (if any) and the envelope to the writer.
//!   Never waits for storage.
//! - `Flush { reply }`: answered once everything emitted before it is committed as a sync point
//!   (fsynced where the storage fsyncs them, see [`storage::RolloutSink::commit`]) and
//!   published, or `Internal` if the writer hit a storage error since the previous flush.
//! - `ReadConversation { conversation_id, reply }`: a flush, then the conversation's records
//!   (oldest first; an unreadable line, such as a torn last write, is skipped and logged).
//! - `ReadRestoreWindow { conversation_id, reply }`: as `ReadConversation`, but only what a
//!   restore needs: the records from the newest `history_checkpoint`'s window on
//!   ([`window_start`]), or all of them without one (S6).
//! - `ReadAfter { after_seq, limit, reply }`: up to `limit` of the session's records with
//!   `seq > after_seq`, in order, once everything emitted before is committed (no fsync), and
//!   bounded by the last `seq` assigned then: a page never holds a record beyond what is
//!   committed, so a resuming stream cannot skip one.
//! - `Subscribe { reply }`: a new broadcast receiver of `Arc<EventEnvelope>`.
//! - `LastSeq { reply }`: the last `seq` assigned.
//!
//! Replies that wait for storage are sent from a blocking-pool task, so the mailbox never
//! waits for I/O. (Tokio also does not auto-advance paused time while a blocking task runs, so
//! paused-time tests see no time jumps while the disk works.)
//!
//! # Storage
//! Behind the [`storage::RolloutStorage`] port: [`FileRolloutStorage`] (JSONL files,
//! `<root>/<session_id>/<conversation_id>.jsonl` and `session.jsonl`, the default) or SQLite in
//! `troupe-runtime`. What a record keeps is decided here, by [`record_for`], before anything
//! reaches a storage: `Full`/`Ttl` keep the event, `HeadersOnly` keeps [`RecordMeta`] only,
//! `None` keeps task start/end/abort, errors and conversation open/close with status and
//! error kind only. Session-level events are kept as headers.
//!
//! # Ttl
//! A `Ttl { secs }` record is written `Full` with its expiry in [`RecordMeta::expires_ms`]
//! (`ts_ms` + the ttl): the promise is kept on disk with the content, not in this actor's
//! memory. [`storage::RolloutStorage::sweep_due`] downgrades every due record to headers
//! ([`downgrade`]) from what is stored, whether or not a Rollout is running for its session:
//! after a restart, for closed conversations and for sessions of processes that have exited.
//! Who calls it and when is the embedder's choice (`troupe serve` runs a periodic sweeper,
//! `troupe chat` sweeps at start and while it runs); this actor never sweeps.
//!
//! # Durability
//! All writes happen on one dedicated writer thread fed by a channel (`rollout/writer.rs`). It
//! takes one command, drains what is already queued (up to 1024) and group-commits: one
//! [`storage::RolloutSink::commit`] per batch, asking for a sync (an fsync, where the storage
//! promises power-loss durability) only when the batch holds a sync point (a `task_finished`,
//! `task_aborted` or `conversation_closed` record, or a `Flush`),
//! and with the highest `seq` assigned so far as the high-water mark, so that numbers of events
//! the policy did not record are not handed out again after a restart. Then it publishes the
//! batch's events and answers its flushes. An event whose record failed to append or commit is
//! not published (`troupe_rollout_events_withheld_total`); the error is logged, counted and
//! reported to the next `Flush`; the writer never panics.
//!
//! # Supervision
//! The Session supervises the Rollout; it has no children besides its writer thread. Stopping
//! it (`post_stop`) closes the writer's channel and joins the thread, which first commits with
//! fsync everything it was handed: stop with `drain_and_wait` so that events still queued in
//! the mailbox are handed over too. If the writer is gone, `Emit` fails the actor; the Session
//! starts a new one on the same storage, and `pre_start` continues `seq` after storage's
//! `last_seq` (the highest recorded `seq` or high-water mark). If the actor is killed or
//! panics instead (`InjectPanic` does so on demand, for tests and drills), dropping its state
//! closes the channel, the writer commits what it holds, and the drop waits for it
//! (blocking). A session has one open sink at a time (the storage's writer lease:
//! `writer.lock` for JSONL files, an in-process lease for SQLite), and `pre_start` opens its
//! sink before it reads `last_seq`, so the next incarnation (restarted by the Session, or with
//! the whole session by its host) waits until the old writer closed and never reads
//! `last_seq` while the old one still writes.
//! The new Rollout starts with the storage policy of every open conversation
//! (`RolloutArgs::policies`), so a running task's events keep their policy, and it receives
//! the events emitted while no Rollout ran before any later one (see `EventSink::emit`). What
//! the old one had accepted but not handed to its writer (its mailbox, the event it was
//! handling) is lost; it was never recorded and the new Rollout numbers on from the last
//! number storage accounts for, so `seq` has no gap. Live subscribers of the old
//! Rollout see their channel close (`EventStream` reconnects to the new one). If the process
//! dies, what was committed stays; what was not was never published, and its numbers may be
//! handed out again.

#[doc(hidden)]
pub mod conformance;
pub mod file;
pub mod metrics;
mod record;
pub mod storage;
pub mod stream;
mod writer;

use crate::clock::Clock;
use crate::event_draft::EventDraft;
pub use file::{FileRolloutStorage, SESSION_FILE, conversation_path, read_records};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;
use storage::RolloutStorage;
use tokio::sync::broadcast;
use troupe_proto::{
    AgentError, ApprovalSubject, ConversationId, ErrorKind, EventEnvelope, EventKind, EventName,
    SessionId, StoragePolicy, TaskId, TaskStatus, Usage,
};
use writer::{AckReceiver, WriterCmd, WriterHandle, wait_ack};

pub use record::{
    RecordLevel, RecordMeta, RolloutRecord, RouteHeader, downgrade, is_due, is_sync_point,
    record_for, ttl_expiry_ms, window_start,
};

/// Start-up arguments.
pub struct RolloutArgs {
    pub session_id: SessionId,
    /// Where the session's record lives (and is read back from).
    pub storage: Arc<dyn RolloutStorage>,
    pub clock: Clock,
    /// Live events buffered per subscriber before it lags.
    pub subscriber_capacity: usize,
    /// Storage policies known before the first message: those of the session's conversations
    /// when this Rollout replaces one that stopped (the new one must not record a running
    /// task's events as policy `None`).
    pub policies: Vec<(ConversationId, StoragePolicy)>,
}

/// The actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rollout;

/// The Rollout's state: sequencing and policies (the pure core) plus its I/O handles.
pub struct RolloutState {
    core: RolloutCore,
    session_id: SessionId,
    clock: Clock,
    /// Where reads go; the writer holds the session's sink.
    storage: Arc<dyn RolloutStorage>,
    /// `None` once stopped.
    writer: Option<WriterHandle>,
    /// Kept so that subscribers can join at any time; the writer publishes through a clone.
    events: broadcast::Sender<Arc<EventEnvelope>>,
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
    /// Numbers one event and hands it to the writer, which records what its policy allows and
    /// publishes it once committed.
    Emit { draft: EventDraft },
    /// Durability barrier: answered once everything emitted before it is committed, fsynced
    /// and published.
    Flush {
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    /// Reads a conversation's record back (after an implicit flush), oldest first.
    ReadConversation {
        conversation_id: ConversationId,
        reply: RpcReplyPort<Result<Vec<RolloutRecord>, AgentError>>,
    },
    /// Reads what a restore of the conversation needs (after an implicit flush): its records
    /// from its newest checkpoint's window on, or all of them without one (S6).
    ReadRestoreWindow {
        conversation_id: ConversationId,
        reply: RpcReplyPort<Result<Vec<RolloutRecord>, AgentError>>,
    },
    /// Up to `limit` of the session's committed records with `seq > after_seq`, in `seq` order
    /// (one page of a resume).
    ReadAfter {
        after_seq: u64,
        limit: usize,
        reply: RpcReplyPort<Result<Vec<RolloutRecord>, AgentError>>,
    },
    /// A receiver of live events; a slow one lags, the record does not.
    Subscribe {
        reply: RpcReplyPort<broadcast::Receiver<Arc<EventEnvelope>>>,
    },
    /// Observation: the last sequence number assigned.
    LastSeq { reply: RpcReplyPort<u64> },
    /// Fault injection: panics inside `handle`, to exercise the Session's restart of the
    /// Rollout in tests and drills.
    InjectPanic,
    /// Test only: the writer thread dies as in a killed process (nothing more is committed or
    /// published).
    #[cfg(test)]
    CrashWriter,
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
        let session_id = args.session_id;
        let storage = args.storage.clone();
        // Continue the numbering of a previous incarnation (a restart after a failure, or of
        // the process): numbers are never handed out twice.
        let (sink, last_seq) = tokio::task::spawn_blocking(move || {
            let sink = storage.open_sink(session_id)?;
            let last_seq = storage.last_seq(session_id)?;
            Ok::<_, AgentError>((sink, last_seq))
        })
        .await
        .map_err(|e| AgentError::internal(format!("opening the rollout: {e}")))??;
        let (events, _) = broadcast::channel(args.subscriber_capacity.max(1));
        let writer = WriterHandle::spawn(sink, session_id, events.clone(), last_seq)
            .map_err(|e| AgentError::internal(format!("rollout writer thread: {e}")))?;
        tracing::info!(%session_id, last_seq, policies = args.policies.len(), "rollout started");
        let mut core = RolloutCore::new(last_seq);
        for (conversation_id, policy) in args.policies {
            core.register(conversation_id, policy);
        }
        Ok(RolloutState {
            core,
            session_id,
            clock: args.clock,
            storage: args.storage,
            writer: Some(writer),
            events,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut RolloutState,
    ) -> Result<(), ActorProcessingErr> {
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
            } => state.read_conversation(conversation_id, false, reply),
            RolloutMsg::ReadRestoreWindow {
                conversation_id,
                reply,
            } => state.read_conversation(conversation_id, true, reply),
            RolloutMsg::ReadAfter {
                after_seq,
                limit,
                reply,
            } => state.read_after(after_seq, limit, reply),
            RolloutMsg::Subscribe { reply } => {
                let _ = reply.send(state.events.subscribe());
            }
            RolloutMsg::LastSeq { reply } => {
                let _ = reply.send(state.core.last_seq());
            }
            RolloutMsg::InjectPanic => {
                panic!("injected fault in the rollout of {}", state.session_id)
            }
            #[cfg(test)]
            RolloutMsg::CrashWriter => {
                state.send(WriterCmd::Crash)?;
                if let Some(writer) = state.writer.take() {
                    writer.shutdown(state.session_id).await;
                }
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

    /// Numbers the event and hands it to the writer, which records and then publishes it.
    /// Failing to reach the writer fails the actor: recording is its whole job.
    fn emit(&mut self, draft: EventDraft) -> Result<(), AgentError> {
        let since = draft.content_since_ms;
        let env = self.core.stamp(self.session_id, draft, self.clock.now_ms());
        let stamped = Instant::now();
        let kind = env.event.name();
        metrics::event_emitted(kind);
        let placement = self.core.placement(env.conversation_id);
        if let Placement::Unregistered(conversation_id) = placement {
            metrics::unregistered_event();
            if self.core.first_unregistered(conversation_id) {
                tracing::warn!(
                    %conversation_id, %kind,
                    "event of an unregistered conversation: recorded as storage policy none"
                );
            }
        }
        let mut record = record_for(placement.policy(), &env);
        if let Some(r) = record.as_mut() {
            record::cap_expiry(r, placement.policy(), since);
        }
        if record.is_none() {
            metrics::event_unrecorded(kind);
        }
        // A closed conversation's state goes, so a long-lived session does not grow with
        // every conversation it ever had. Its Ttl content needs nothing of it: the expiry is
        // in the records.
        let forget = match (&env.event, env.conversation_id) {
            (EventKind::ConversationClosed { .. }, Some(conversation_id)) => {
                self.core.forget(conversation_id);
                Some(conversation_id)
            }
            _ => None,
        };
        tracing::trace!(seq = env.seq, %kind, "event emitted");
        self.send(WriterCmd::Event {
            record,
            env: Arc::new(env),
            stamped,
        })?;
        if let Some(conversation_id) = forget {
            self.send(WriterCmd::Forget { conversation_id })?;
        }
        Ok(())
    }

    fn flush(&self, reply: RpcReplyPort<Result<(), AgentError>>) {
        match self.request(|ack| WriterCmd::Flush { ack }) {
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

    /// The conversation's records, all of them or (`window`) what a restore needs.
    fn read_conversation(
        &self,
        conversation_id: ConversationId,
        window: bool,
        reply: RpcReplyPort<Result<Vec<RolloutRecord>, AgentError>>,
    ) {
        match self.request(|ack| WriterCmd::Flush { ack }) {
            Ok(ack) => {
                let storage = self.storage.clone();
                let session_id = self.session_id;
                tokio::task::spawn_blocking(move || {
                    let _ = reply.send(wait_ack(&ack).and_then(|()| {
                        if window {
                            storage.read_conversation_window(session_id, conversation_id)
                        } else {
                            storage.read_conversation(session_id, conversation_id)
                        }
                    }));
                });
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    fn read_after(
        &self,
        after_seq: u64,
        limit: usize,
        reply: RpcReplyPort<Result<Vec<RolloutRecord>, AgentError>>,
    ) {
        // Everything up to here is committed once the barrier is answered; anything later may
        // be half-visible in storage and is left to the live receiver.
        let bound = self.core.last_seq();
        match self.request(|ack| WriterCmd::Barrier { ack }) {
            Ok(ack) => {
                let storage = self.storage.clone();
                let session_id = self.session_id;
                tokio::task::spawn_blocking(move || {
                    let page = wait_ack(&ack)
                        .and_then(|()| storage.read_after(session_id, after_seq, limit))
                        .map(|records| committed_page(records, bound));
                    let _ = reply.send(page);
                });
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    fn request(
        &self,
        cmd: impl FnOnce(writer::AckSender) -> WriterCmd,
    ) -> Result<AckReceiver, AgentError> {
        let (ack, rx) = crossbeam_channel::bounded(1);
        self.send(cmd(ack))?;
        Ok(rx)
    }

    fn send(&self, cmd: WriterCmd) -> Result<(), AgentError> {
        let writer = self
            .writer
            .as_ref()
            .ok_or_else(|| AgentError::internal("rollout writer stopped"))?;
        if writer.send(cmd) {
            Ok(())
        } else {
            tracing::error!(session_id = %self.session_id, "rollout writer thread is gone");
            Err(AgentError::internal("rollout writer thread is gone"))
        }
    }
}

/// The records of a page that are known to be committed: those up to `bound`, the last `seq`
/// assigned when the read was asked for. Storage returns a page's records in `seq` order, so
/// this keeps a prefix, and a page shortened by it still ends the backlog correctly.
fn committed_page(mut records: Vec<RolloutRecord>, bound: u64) -> Vec<RolloutRecord> {
    records.retain(|r| r.seq <= bound);
    records
}

/// Sequencing and policy decisions, free of I/O.
#[derive(Debug, Default)]
struct RolloutCore {
    last_seq: u64,
    policies: HashMap<ConversationId, StoragePolicy>,
    /// Unregistered conversations already warned about (one warning each).
    warned: HashSet<ConversationId>,
}

/// Where an event's record goes, and under which policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// No conversation: session-level, headers only.
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

    /// The conversation closed: nothing of it is needed any more.
    fn forget(&mut self, conversation_id: ConversationId) {
        self.policies.remove(&conversation_id);
        self.warned.remove(&conversation_id);
    }
}

#[cfg(test)]
mod tests {
    use super::record::*;
    use super::*;
    use ractor::call;
    use std::fs;
    use std::path::{Path, PathBuf};
    use std::time::Duration;
    use tokio::sync::broadcast::error::TryRecvError;
    use troupe_proto::{
        ApprovalDecision, ApprovalId, CloseOutcome, Json, TaskStats, ToolCall, WarningCode,
    };

    const CANARY: &str = "CANARY-7f3a";

    /// Every content field carries `CANARY:<field>`.
    fn field(name: &str) -> String {
        format!("{CANARY}:{name}")
    }

    /// The trace id of [`every_kind`]'s task end.
    const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

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
                    trace_id: TRACE_ID.into(),
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
                agent_id: None,
            },
            EventKind::ToolCallFinished {
                call_id: "call-1".into(),
                name: "shell".into(),
                output: field("output"),
                is_error: true,
                duration_ms: 12,
                agent_id: None,
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
            EventKind::MessageUpdated {
                message_id: 7,
                status: troupe_proto::store::MessageStatus::Completed,
                task_id: Some(TaskId::new()),
                reply_message_id: Some(8),
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
                code: WarningCode::PolicyClamped,
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
                estimated_completion_tokens: None,
            },
            EventKind::PlanUpdated {
                explanation: Some(field("plan_why")),
                plan: vec![troupe_proto::PlanStep {
                    step: field("plan_step"),
                    status: troupe_proto::PlanStepStatus::InProgress,
                }],
            },
            EventKind::CompactionStarted {},
            EventKind::Compacted {
                summary: field("compacted"),
                replaced_items: 4,
            },
            EventKind::HistoryCheckpoint {
                summary: Some(field("checkpoint")),
                replaced_items: 4,
                from_task: None,
                skip_items: 0,
                turns: 2,
                stats: troupe_proto::ConversationStats::default(),
            },
            EventKind::SessionCreated {
                agent_id: "coder".into(),
                provider: troupe_proto::agent::ProviderKind::Acp,
                provider_session_id: "ps-1".into(),
                dispatch_id: None,
            },
            EventKind::SessionBound {
                agent_id: "coder".into(),
                provider: troupe_proto::agent::ProviderKind::Acp,
                provider_session_id: "ps-1".into(),
                replaced: None,
                dispatch_id: None,
            },
            EventKind::SessionResumed {
                agent_id: "coder".into(),
                provider: troupe_proto::agent::ProviderKind::Acp,
                provider_session_id: "ps-1".into(),
                dispatch_id: None,
            },
            EventKind::RouteDecided {
                decision: troupe_proto::agent::RouteDecision::DispatchAgent,
                agent_id: Some("coder".into()),
                module: None,
                confidence: 0.9,
                source: troupe_proto::agent::RouteSource::Model,
                reason: field("route_reason"),
            },
            EventKind::DispatchSent {
                dispatch_id: troupe_proto::ids::DispatchId::new(),
                agent_id: "coder".into(),
                provider: troupe_proto::agent::ProviderKind::Model,
                provider_session_id: None,
                chain: troupe_proto::agent::ExecutionChain(vec!["coder".into()]),
                lease_ttl_ms: 1000,
                input: field("dispatch_input"),
            },
            EventKind::DispatchResult {
                dispatch_id: troupe_proto::ids::DispatchId::new(),
                agent_id: "coder".into(),
                provider_session_id: None,
                status: troupe_proto::agent::DispatchStatus::Error,
                text: field("dispatch_text"),
                error: Some(AgentError::internal(field("dispatch_error"))),
                duration_ms: 5,
                validated: false,
            },
            EventKind::PolicyRejected {
                agent_id: "coder".into(),
                chain: troupe_proto::agent::ExecutionChain(vec!["coder".into()]),
                reason: troupe_proto::agent::PolicyReason::ToolDenied,
                message: field("rejected"),
                tool: Some("acp__execute".into()),
            },
            EventKind::AskHuman {
                question: field("question"),
            },
            EventKind::AgentUpdate {
                dispatch_id: troupe_proto::ids::DispatchId::new(),
                agent_id: "coder".into(),
                provider_session_id: "ps-1".into(),
                update: troupe_proto::agent::AgentUpdateKind::MessageChunk,
                text: field("agent_update"),
                data: Some(Json(serde_json::json!({ "said": field("agent_data") }))),
            },
            EventKind::GuardrailFailed {
                agent_id: Some("coder".into()),
                attempts: 3,
                problems: vec!["/age: type".into()],
                status: troupe_proto::GuardrailStatus::Exhausted,
                action: troupe_proto::agent::GuardrailAction::Reject,
            },
            // Last: closing a conversation ends its record.
            EventKind::ConversationClosed {
                outcome: CloseOutcome::Closed,
            },
        ]
    }

    const CONTENT_FIELDS: [&str; 31] = [
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
        "compacted",
        "checkpoint",
        "route_reason",
        "dispatch_input",
        "dispatch_text",
        "dispatch_error",
        "rejected",
        "question",
        "agent_update",
        "agent_data",
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
            sub_id: Some(crate::event_draft::sub_id(conversation_id, task_id)),
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
        let names: HashSet<EventName> = every_kind().iter().map(EventKind::name).collect();
        assert_eq!(
            names.len(),
            EventName::ALL.len(),
            "one sample per EventKind variant"
        );
        for kind in MINIMAL_KINDS {
            assert!(names.contains(&kind));
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
                    StoragePolicy::Full => {
                        let r = record.unwrap();
                        assert_eq!(r.level, RecordLevel::Full);
                        assert_eq!(r.event.as_ref(), Some(&env.event));
                        assert_eq!(r.meta, headers_meta(&env.event), "{kind}");
                    }
                    StoragePolicy::Ttl { secs } => {
                        let r = record.unwrap();
                        assert_eq!(r.level, RecordLevel::Full);
                        assert_eq!(r.event.as_ref(), Some(&env.event));
                        let expected = RecordMeta {
                            expires_ms: Some(env.ts_ms + secs * 1000),
                            ..headers_meta(&env.event)
                        };
                        assert_eq!(r.meta, expected, "{kind}: headers and the expiry");
                    }
                    StoragePolicy::HeadersOnly => {
                        let r = record.unwrap();
                        assert_eq!(r.level, RecordLevel::Headers);
                        let kept = headers_event(env.event.clone());
                        assert_eq!(r.event, kept, "{kind}");
                        assert!(!contains(line.as_bytes(), CANARY), "{kind}: {line}");
                    }
                    StoragePolicy::None => {
                        assert_eq!(record.is_some(), MINIMAL_KINDS.contains(&kind), "{kind}");
                        if let Some(r) = record {
                            assert_eq!(r.level, RecordLevel::Minimal);
                            let kept = headers_event(env.event.clone());
                            assert_eq!(r.event, kept, "{kind}");
                            assert_eq!(
                                r.meta,
                                RecordMeta {
                                    status: r.meta.status,
                                    error_kind: r.meta.error_kind,
                                    trace_id: r.meta.trace_id.clone(),
                                    ..RecordMeta::default()
                                },
                                "{kind}: only status, error kind and trace id"
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
    fn a_swept_task_end_still_counts_its_mcp_calls() {
        let event = EventKind::TaskFinished {
            status: TaskStatus::Ok,
            text: "secret".into(),
            stats: troupe_proto::TaskStats {
                tool_calls: 3,
                mcp_calls: 2,
                mcp_latency_ms: 40,
                ..troupe_proto::TaskStats::default()
            },
            error: None,
        };
        let kept = record_for(StoragePolicy::Ttl { secs: 60 }, &envelope(1, event)).unwrap();
        let swept = downgrade(kept);
        assert!(!serde_json::to_string(&swept).unwrap().contains("secret"));
        let stats = crate::context::stats_from_records(&[swept]);
        assert_eq!((stats.tasks, stats.tool_calls, stats.mcp_calls), (1, 3, 2));
        assert_eq!(stats.mcp_latency_ms_total, 40);
    }

    #[test]
    fn headers_keep_the_facts() {
        let kinds = every_kind();
        let meta = |name: EventName| headers_meta(kinds.iter().find(|k| k.name() == name).unwrap());
        let finished = meta(EventName::TaskFinished);
        assert_eq!(finished.status, Some(TaskStatus::Error));
        assert_eq!(finished.error_kind, Some(ErrorKind::ToolError));
        assert_eq!(finished.usage.unwrap().input_tokens, 10);
        assert_eq!((finished.steps, finished.tool_calls), (Some(2), Some(1)));
        assert_eq!(finished.duration_ms, Some(40));
        // A trace id is no content: a task read back without its content still links to its
        // trace, under every policy that keeps its end. Only an id is kept.
        assert_eq!(finished.trace_id.as_deref(), Some(TRACE_ID));
        let end = kinds
            .iter()
            .find(|k| k.name() == EventName::TaskFinished)
            .unwrap();
        let minimal = record_for(StoragePolicy::None, &envelope(1, end.clone())).unwrap();
        assert_eq!(minimal.meta.trace_id.as_deref(), Some(TRACE_ID));
        for not_an_id in [String::new(), field("trace"), format!("{TRACE_ID}0")] {
            let odd = EventKind::TaskFinished {
                status: TaskStatus::Ok,
                text: String::new(),
                stats: TaskStats {
                    trace_id: not_an_id.clone(),
                    ..TaskStats::default()
                },
                error: None,
            };
            assert_eq!(headers_meta(&odd).trace_id, None, "{not_an_id}");
        }
        let tool = meta(EventName::ToolCallFinished);
        assert_eq!(tool.tool.as_deref(), Some("shell"));
        assert_eq!(tool.is_error, Some(true));
        assert_eq!(tool.chars, Some(field("output").len() as u64));
        assert_eq!(
            meta(EventName::ToolCallStarted).tool.as_deref(),
            Some("shell")
        );
        assert_eq!(
            meta(EventName::TaskStarted).chars,
            Some(field("input").len() as u64)
        );
        assert_eq!(
            meta(EventName::Error).error_kind,
            Some(ErrorKind::ModelError)
        );
        assert_eq!(
            meta(EventName::ToolProgress).chars,
            Some(field("progress").len() as u64)
        );
        assert_eq!(meta(EventName::McpServerReady), RecordMeta::default());
        assert_eq!(meta(EventName::ConversationClosed), RecordMeta::default());
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
                agent_id: None,
            },
        };
        let line =
            serde_json::to_string(&record_for(StoragePolicy::HeadersOnly, &env).unwrap()).unwrap();
        insta::assert_snapshot!(line, @r#"{"seq":7,"ts_ms":1700000000000,"conversation_id":"0190a000-0000-7000-8000-000000000002","task_id":"0190a000-0000-7000-8000-000000000003","kind":"tool_call_finished","level":"headers","meta":{"tool":"shell","is_error":false,"chars":13,"duration_ms":12,"call_id":"call-1"}}"#);
    }

    #[test]
    fn sync_points() {
        for kind in every_kind() {
            let expected = matches!(
                kind.name(),
                EventName::TaskFinished | EventName::TaskAborted | EventName::ConversationClosed
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
        assert_eq!(
            core.placement(Some(ttl)).policy(),
            StoragePolicy::Ttl { secs: 10 }
        );
    }

    #[test]
    fn ttl_expiry_and_due() {
        assert_eq!(ttl_expiry_ms(1_000, 2), 3_000);
        assert_eq!(ttl_expiry_ms(u64::MAX - 1, 2), u64::MAX, "saturates");
        assert_eq!(ttl_expiry_ms(5, u64::MAX), u64::MAX);
        let env = envelope(1, EventKind::TaskStarted { input: "x".into() });
        let ttl = record_for(StoragePolicy::Ttl { secs: 1 }, &env).unwrap();
        let due_at = env.ts_ms + 1_000;
        assert_eq!(ttl.meta.expires_ms, Some(due_at));
        assert!(!is_due(&ttl, due_at - 1));
        assert!(is_due(&ttl, due_at), "due at its expiry");
        assert!(!is_due(&downgrade(ttl), u64::MAX), "headers are never due");
        let full = record_for(StoragePolicy::Full, &env).unwrap();
        assert!(!is_due(&full, u64::MAX), "Full content never expires");
    }

    #[test]
    fn a_summary_is_due_no_later_than_the_content_it_carries_under_ttl() {
        let mut env = envelope(
            1,
            EventKind::HistoryTrimmed {
                removed_items: 2,
                summary: "user: the canary".into(),
            },
        );
        env.ts_ms = 10_000;
        let policy = StoragePolicy::Ttl { secs: 5 };
        let mut ttl = record_for(policy, &env).unwrap();
        record::cap_expiry(&mut ttl, policy, Some(7_000));
        assert_eq!(
            ttl.meta.expires_ms,
            Some(12_000),
            "the carried content's due time"
        );
        // Content newer than the record itself changes nothing; nor does an unknown time.
        let mut newer = record_for(policy, &env).unwrap();
        record::cap_expiry(&mut newer, policy, Some(11_000));
        assert_eq!(newer.meta.expires_ms, Some(15_000));
        let mut unknown = record_for(policy, &env).unwrap();
        record::cap_expiry(&mut unknown, policy, None);
        assert_eq!(unknown.meta.expires_ms, Some(15_000));
        // Without ttl there is no expiry to cap.
        let mut full = record_for(StoragePolicy::Full, &env).unwrap();
        record::cap_expiry(&mut full, StoragePolicy::Full, Some(0));
        assert_eq!(full.meta.expires_ms, None);
    }

    #[test]
    fn a_swept_checkpoint_keeps_where_a_restore_starts_without_its_summary() {
        let task = troupe_proto::TaskId::new();
        let env = envelope(
            1,
            EventKind::HistoryCheckpoint {
                summary: Some("user: the canary".into()),
                replaced_items: 4,
                from_task: Some(task),
                skip_items: 1,
                turns: 3,
                stats: troupe_proto::ConversationStats::default(),
            },
        );
        let swept = downgrade(record_for(StoragePolicy::Ttl { secs: 1 }, &env).unwrap());
        assert_eq!(swept.level, RecordLevel::Headers);
        assert_eq!(
            swept.event,
            Some(EventKind::HistoryCheckpoint {
                summary: None,
                replaced_items: 4,
                from_task: Some(task),
                skip_items: 1,
                turns: 3,
                stats: troupe_proto::ConversationStats::default(),
            })
        );
        assert!(!serde_json::to_string(&swept).unwrap().contains("canary"));
        // Other content still goes whole.
        let text = envelope(
            2,
            EventKind::AssistantMessage {
                text: "canary".into(),
            },
        );
        let swept = downgrade(record_for(StoragePolicy::Ttl { secs: 1 }, &text).unwrap());
        assert_eq!(swept.event, None);
    }

    fn full_line(seq: u64, ts_ms: u64, text: &str) -> Vec<u8> {
        let mut env = envelope(seq, EventKind::AssistantMessage { text: text.into() });
        env.ts_ms = ts_ms;
        let mut line = serde_json::to_vec(&record_for(StoragePolicy::Full, &env).unwrap()).unwrap();
        line.push(b'\n');
        line
    }

    /// Arguments of a new session's Rollout on file storage under `root`, and the session's
    /// directory.
    fn args(root: &Path, clock: Clock, capacity: usize) -> (RolloutArgs, PathBuf) {
        args_for(root, SessionId::new(), clock, capacity)
    }

    fn args_for(
        root: &Path,
        session_id: SessionId,
        clock: Clock,
        capacity: usize,
    ) -> (RolloutArgs, PathBuf) {
        let storage = FileRolloutStorage::new(root);
        let dir = storage.session_dir(session_id);
        let args = RolloutArgs {
            session_id,
            storage: Arc::new(storage),
            clock,
            subscriber_capacity: capacity,
            policies: Vec::new(),
        };
        (args, dir)
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
                code: WarningCode::McpServerFailed,
                message: field("session_warning"),
            }),
        );
    }

    #[tokio::test]
    async fn canaries_reach_disk_exactly_as_each_policy_allows() {
        for policy in ALL_POLICIES {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().join("rollout");
            let (rollout_args, dir) = args(&root, Clock::new(), 64);
            let rollout = start(rollout_args).await;
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
                    assert_eq!(records.len(), every_kind().len());
                    assert!(records.iter().all(|r| r.level == RecordLevel::Full));
                }
                StoragePolicy::HeadersOnly => {
                    assert!(!contains(&bytes, CANARY), "{policy:?}: no content on disk");
                    assert_eq!(records.len(), every_kind().len());
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
                            "message_updated",
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
        let (rollout_args, _) = args(tmp.path(), Clock::new(), 64);
        let rollout = start(rollout_args).await;
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
        let (rollout_args, dir) = args(tmp.path(), Clock::new(), 1024);
        let rollout = start(rollout_args).await;
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
            conversation_path(&dir, conversations[0].0),
            conversation_path(&dir, conversations[1].0),
            dir.join(SESSION_FILE),
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
        let (rollout_args, dir) = args(tmp.path(), Clock::new(), capacity);
        let rollout = start(rollout_args).await;
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
        assert_eq!(line_count(&conversation_path(&dir, conversation)), n);
        assert_eq!(
            rx.try_recv().unwrap_err(),
            TryRecvError::Lagged((n - capacity) as u64)
        );
        assert_eq!(rx.try_recv().unwrap().seq, (n - capacity + 1) as u64);
    }

    #[tokio::test]
    async fn flush_after_n_emits_leaves_n_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let (rollout_args, dir) = args(tmp.path(), Clock::new(), 16);
        let rollout = start(rollout_args).await;
        let conversation = ConversationId::new();
        register(&rollout, conversation, StoragePolicy::HeadersOnly);
        for _ in 0..2500 {
            emit(
                &rollout,
                EventDraft::conversation(conversation, EventKind::StepStarted { turn: 1, step: 1 }),
            );
        }
        flush(&rollout).await;
        assert_eq!(line_count(&conversation_path(&dir, conversation)), 2500);
    }

    #[tokio::test]
    async fn read_conversation_round_trips_full_records() {
        let tmp = tempfile::tempdir().unwrap();
        let (rollout_args, _) = args(tmp.path(), Clock::new(), 64);
        let rollout = start(rollout_args).await;
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
        assert_eq!(expected.len(), every_kind().len());
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
        let (rollout_args, dir) = args(tmp.path(), Clock::new(), 64);
        fs::create_dir_all(&dir).unwrap();
        fs::write(conversation_path(&dir, conversation), bytes).unwrap();
        let rollout = start(rollout_args).await;
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
        let (rollout_args, dir) = args(tmp.path(), Clock::new(), 64);
        let session_id = rollout_args.session_id;
        let rollout = start(rollout_args).await;
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
        assert_eq!(line_count(&conversation_path(&dir, conversation)), 5);

        let (rollout_args, _) = args_for(tmp.path(), session_id, Clock::new(), 64);
        let rollout = start(rollout_args).await;
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
        let (rollout_args, dir) = args(tmp.path(), Clock::new(), 64);
        let session_id = rollout_args.session_id;
        let rollout = start(rollout_args).await;
        let mut rx = call!(rollout, |reply| RolloutMsg::Subscribe { reply }).unwrap();
        // The directory cannot be written: a file is in its place.
        fs::remove_dir_all(&dir).unwrap();
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
        // Nobody saw what storage does not have.
        assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
        // The actor carries on; once the obstacle is gone, the error is not reported again and
        // the lost event's number is accounted for.
        assert_eq!(last_seq(&rollout).await, 1);
        fs::remove_file(&dir).unwrap();
        flush(&rollout).await;
        assert_eq!(
            FileRolloutStorage::new(tmp.path())
                .last_seq(session_id)
                .unwrap(),
            1
        );
        emit(
            &rollout,
            EventDraft::session(EventKind::TaskAborted { waited_ms: 0 }),
        );
        assert_eq!(rx.recv().await.unwrap().seq, 2);
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn files_are_private_to_the_owner() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("rollout");
        let (rollout_args, dir) = args(&root, Clock::new(), 64);
        let rollout = start(rollout_args).await;
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
        let (rollout_args, dir) = args(tmp.path(), Clock::new(), 64);
        let rollout = start(rollout_args).await;
        let conversations: Vec<ConversationId> = (0..file::MAX_OPEN_FILES * 3)
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
            assert_eq!(line_count(&conversation_path(&dir, *id)), 3);
        }
    }

    /// Sweeps the storage at the clock's time, as the embedder's sweeper does.
    fn sweep(storage: &FileRolloutStorage, clock: Clock) -> u64 {
        let report = storage.sweep_due(clock.now_ms()).unwrap();
        assert_eq!(report.failures, 0);
        report.downgraded
    }

    /// Ttl content is kept until its expiry, then a sweep planned from what is on disk
    /// downgrades it: while the Rollout runs, for a closed conversation, and after the Rollout
    /// is gone. The Rollout itself never sweeps.
    #[tokio::test(start_paused = true)]
    async fn ttl_content_is_downgraded_from_what_is_stored() {
        let tmp = tempfile::tempdir().unwrap();
        let clock = Clock::new();
        let (rollout_args, dir) = args(tmp.path(), clock, 64);
        let storage = FileRolloutStorage::new(tmp.path());
        let rollout = start(rollout_args).await;
        let (ttl, full, closed) = (
            ConversationId::new(),
            ConversationId::new(),
            ConversationId::new(),
        );
        register(&rollout, ttl, StoragePolicy::Ttl { secs: 600 });
        register(&rollout, full, StoragePolicy::Full);
        register(&rollout, closed, StoragePolicy::Ttl { secs: 60 });
        for id in [ttl, full, closed] {
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
        emit(
            &rollout,
            EventDraft::conversation(
                closed,
                EventKind::ConversationClosed {
                    outcome: CloseOutcome::Closed,
                },
            ),
        );
        flush(&rollout).await;
        let ttl_file = conversation_path(&dir, ttl);
        let full_file = conversation_path(&dir, full);
        let closed_file = conversation_path(&dir, closed);
        assert!(contains(&fs::read(&ttl_file).unwrap(), "OLD-CANARY"));

        // Not yet due: a sweep keeps the content.
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(sweep(&storage, clock), 0);
        assert!(contains(&fs::read(&closed_file).unwrap(), "OLD-CANARY"));

        // The closed conversation's ttl has passed (its start and its close record); the
        // Rollout forgot it at the close.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(sweep(&storage, clock), 2);
        assert!(!contains(&fs::read(&closed_file).unwrap(), "OLD-CANARY"));
        assert!(contains(&fs::read(&ttl_file).unwrap(), "OLD-CANARY"));

        tokio::time::advance(Duration::from_secs(540)).await;
        emit(
            &rollout,
            EventDraft::conversation(
                ttl,
                EventKind::TaskStarted {
                    input: "NEW-CANARY".into(),
                },
            ),
        );
        flush(&rollout).await;
        assert_eq!(sweep(&storage, clock), 1);
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
        // The Rollout goes on writing to the swept file.
        emit(
            &rollout,
            EventDraft::conversation(
                ttl,
                EventKind::AssistantMessage {
                    text: "LATER".into(),
                },
            ),
        );
        let records = read(&rollout, ttl).await;
        assert_eq!(
            records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![1, 5, 6]
        );
        assert_eq!(records[0].level, RecordLevel::Headers);
        assert_eq!(records[0].meta.chars, Some("OLD-CANARY".len() as u64));
        assert_eq!(records[1].level, RecordLevel::Full);
        assert_eq!(records[2].level, RecordLevel::Full);

        // With the Rollout gone (the process exited), the rest still comes due.
        rollout.drain_and_wait(None).await.unwrap();
        tokio::time::advance(Duration::from_secs(600)).await;
        assert_eq!(sweep(&storage, clock), 2);
        let disk = disk_bytes(&dir);
        assert!(!contains(&disk, "NEW-CANARY"), "no ttl content left");
        assert!(!contains(&disk, "LATER"));
        assert!(!contains(&fs::read(&ttl_file).unwrap(), "OLD-CANARY"));
        assert!(!contains(&fs::read(&closed_file).unwrap(), "OLD-CANARY"));
        assert!(contains(&fs::read(&full_file).unwrap(), "OLD-CANARY"));
        assert!(
            fs::read_dir(&dir).unwrap().all(|e| !e
                .unwrap()
                .path()
                .to_string_lossy()
                .ends_with(".tmp"))
        );
    }

    #[test]
    fn closed_conversations_are_forgotten_whatever_their_policy() {
        let mut core = RolloutCore::new(0);
        let full = ConversationId::new();
        let ttl = ConversationId::new();
        core.register(full, StoragePolicy::Full);
        core.register(ttl, StoragePolicy::Ttl { secs: 60 });
        core.forget(full);
        core.forget(ttl);
        assert!(core.policies.is_empty() && core.warned.is_empty());
    }

    #[test]
    fn a_page_keeps_only_what_is_known_committed() {
        let page: Vec<RolloutRecord> = [1, 2, 5, 7]
            .into_iter()
            .map(|seq| {
                record_for(
                    StoragePolicy::Full,
                    &envelope(seq, EventKind::TaskAborted { waited_ms: 0 }),
                )
                .unwrap()
            })
            .collect();
        let seqs = |records: Vec<RolloutRecord>| records.iter().map(|r| r.seq).collect::<Vec<_>>();
        assert_eq!(seqs(committed_page(page.clone(), 5)), vec![1, 2, 5]);
        assert_eq!(seqs(committed_page(page.clone(), 0)), Vec::<u64>::new());
        assert_eq!(seqs(committed_page(page, 9)), vec![1, 2, 5, 7]);
    }

    #[test]
    fn a_live_record_is_the_whole_event() {
        for (i, event) in every_kind().into_iter().enumerate() {
            let env = envelope(i as u64 + 1, event);
            assert_eq!(
                RolloutRecord::live(&env),
                record_for(StoragePolicy::Full, &env).unwrap(),
                "a live record is what policy Full keeps"
            );
        }
    }

    /// File storage whose commits each wait for a permit and report their high-water mark:
    /// to watch publication wait for the commit.
    struct Gated {
        inner: FileRolloutStorage,
        permits: crossbeam_channel::Receiver<()>,
        commits: crossbeam_channel::Sender<u64>,
    }

    struct GatedSink {
        inner: Box<dyn storage::RolloutSink>,
        permits: crossbeam_channel::Receiver<()>,
        commits: crossbeam_channel::Sender<u64>,
    }

    impl RolloutStorage for Gated {
        fn open_sink(
            &self,
            session_id: SessionId,
        ) -> Result<Box<dyn storage::RolloutSink>, AgentError> {
            Ok(Box::new(GatedSink {
                inner: self.inner.open_sink(session_id)?,
                permits: self.permits.clone(),
                commits: self.commits.clone(),
            }))
        }
        fn last_seq(&self, session_id: SessionId) -> Result<u64, AgentError> {
            self.inner.last_seq(session_id)
        }
        fn read_conversation(
            &self,
            session_id: SessionId,
            conversation_id: ConversationId,
        ) -> Result<Vec<RolloutRecord>, AgentError> {
            self.inner.read_conversation(session_id, conversation_id)
        }
        fn read_after(
            &self,
            session_id: SessionId,
            after_seq: u64,
            limit: usize,
        ) -> Result<Vec<RolloutRecord>, AgentError> {
            self.inner.read_after(session_id, after_seq, limit)
        }
        fn sweep_due(&self, now_ms: u64) -> Result<storage::SweepReport, AgentError> {
            self.inner.sweep_due(now_ms)
        }
    }

    impl storage::RolloutSink for GatedSink {
        fn append(
            &mut self,
            conversation_id: Option<ConversationId>,
            record: &RolloutRecord,
        ) -> Result<(), storage::SinkError> {
            self.inner.append(conversation_id, record)
        }
        fn commit(&mut self, sync: bool, high_water: u64) -> Result<(), storage::SinkError> {
            let _ = self.permits.recv();
            self.inner.commit(sync, high_water)?;
            let _ = self.commits.send(high_water);
            Ok(())
        }
        fn forget(&mut self, conversation_id: ConversationId) -> Result<(), storage::SinkError> {
            self.inner.forget(conversation_id)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn live_events_wait_for_the_commit_that_covers_them() {
        let tmp = tempfile::tempdir().unwrap();
        let (permit, permits) = crossbeam_channel::unbounded();
        let (commits, committed) = crossbeam_channel::unbounded();
        let session_id = SessionId::new();
        let rollout = start(RolloutArgs {
            session_id,
            storage: Arc::new(Gated {
                inner: FileRolloutStorage::new(tmp.path()),
                permits,
                commits,
            }),
            clock: Clock::new(),
            subscriber_capacity: 64,
            policies: Vec::new(),
        })
        .await;
        let mut rx = call!(rollout, |reply| RolloutMsg::Subscribe { reply }).unwrap();
        let (full, none) = (ConversationId::new(), ConversationId::new());
        register(&rollout, full, StoragePolicy::Full);
        register(&rollout, none, StoragePolicy::None);
        let chunk = || EventKind::AssistantChunk { delta: "x".into() };
        emit(&rollout, EventDraft::conversation(full, chunk()));
        emit(&rollout, EventDraft::conversation(none, chunk()));
        // A mailbox barrier: both are with the writer, which waits in its first commit.
        assert_eq!(last_seq(&rollout).await, 2);
        assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
        assert!(committed.is_empty());
        for _ in 0..16 {
            permit.send(()).unwrap();
        }
        let mut high_water = 0;
        for expected in 1..=2 {
            let env = rx.recv().await.unwrap();
            assert_eq!(env.seq, expected);
            high_water = high_water.max(committed.try_iter().max().unwrap_or(0));
            assert!(
                high_water >= env.seq,
                "seq {} published before a commit covered it ({high_water})",
                env.seq
            );
        }
        // The recorded one is in storage; the unrecorded one's number is accounted for.
        let storage = FileRolloutStorage::new(tmp.path());
        let stored = storage.read_after(session_id, 0, 10).unwrap();
        assert_eq!(stored.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1]);
        assert_eq!(storage.last_seq(session_id).unwrap(), 2);
        rollout.drain_and_wait(None).await.unwrap();
    }

    async fn read_after(
        rollout: &ActorRef<RolloutMsg>,
        after_seq: u64,
        limit: usize,
    ) -> Vec<RolloutRecord> {
        call!(rollout, |reply| RolloutMsg::ReadAfter {
            after_seq,
            limit,
            reply
        })
        .unwrap()
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn read_after_pages_through_every_conversation_in_seq_order() {
        let tmp = tempfile::tempdir().unwrap();
        let (rollout_args, _) = args(tmp.path(), Clock::new(), 64);
        let rollout = start(rollout_args).await;
        let conversations = [
            (ConversationId::new(), StoragePolicy::Full),
            (ConversationId::new(), StoragePolicy::HeadersOnly),
            (ConversationId::new(), StoragePolicy::None),
        ];
        for (id, policy) in conversations {
            register(&rollout, id, policy);
        }
        let mut expected = Vec::new();
        for i in 0..100u64 {
            let event = EventKind::AssistantChunk {
                delta: format!("chunk {i}"),
            };
            let draft = match i % 4 {
                3 => EventDraft::session(event),
                n => EventDraft::conversation(conversations[n as usize].0, event),
            };
            emit(&rollout, draft);
            // Policy None keeps no chunks.
            if i % 4 != 2 {
                expected.push(i + 1);
            }
        }
        // No flush: a read waits for what was emitted before it to be committed.
        let mut paged = Vec::new();
        let mut after = 0;
        loop {
            let page = read_after(&rollout, after, 7).await;
            let short = page.len() < 7;
            if let Some(last) = page.last() {
                after = last.seq;
            }
            paged.extend(page.iter().map(|r| r.seq));
            if short {
                break;
            }
        }
        assert_eq!(paged, expected);
        let first = read_after(&rollout, 0, 1).await;
        assert_eq!(first[0].level, RecordLevel::Full);
        assert_eq!(
            read_after(&rollout, 1, 1).await[0].level,
            RecordLevel::Headers
        );
        assert!(read_after(&rollout, 100, 10).await.is_empty());
        rollout.drain_and_wait(None).await.unwrap();
    }

    /// The storage keeps `env` under `policy` when the rollout records anything of it.
    fn policy_of(
        policies: &HashMap<Option<ConversationId>, StoragePolicy>,
        env: &EventEnvelope,
    ) -> StoragePolicy {
        policies[&env.conversation_id]
    }

    #[tokio::test(start_paused = true)]
    async fn a_crashed_writer_loses_nothing_a_subscriber_saw_and_reuses_no_seq() {
        let tmp = tempfile::tempdir().unwrap();
        let (rollout_args, _) = args(tmp.path(), Clock::new(), 1 << 14);
        let session_id = rollout_args.session_id;
        let rollout = start(rollout_args).await;
        let mut rx = call!(rollout, |reply| RolloutMsg::Subscribe { reply }).unwrap();
        let (full, headers, none) = (
            ConversationId::new(),
            ConversationId::new(),
            ConversationId::new(),
        );
        let policies: HashMap<Option<ConversationId>, StoragePolicy> = [
            (Some(full), StoragePolicy::Full),
            (Some(headers), StoragePolicy::HeadersOnly),
            (Some(none), StoragePolicy::None),
            (None, StoragePolicy::HeadersOnly),
        ]
        .into();
        for (id, policy) in &policies {
            if let Some(id) = id {
                register(&rollout, *id, *policy);
            }
        }
        let task = TaskId::new();
        for i in 0..2000u64 {
            let event = match i % 3 {
                0 => EventKind::AssistantChunk {
                    delta: format!("{i} {}", "x".repeat(200)),
                },
                1 => EventKind::TaskStarted {
                    input: format!("{i}"),
                },
                _ => EventKind::StepStarted { turn: 1, step: 1 },
            };
            let draft = match i % 4 {
                0 => EventDraft::task(full, task, event),
                1 => EventDraft::task(headers, task, event),
                2 => EventDraft::task(none, task, event),
                _ => EventDraft::session(event),
            };
            // After the crash the actor fails at its next event; later casts go nowhere.
            let _ = rollout.cast(RolloutMsg::Emit { draft });
            if i == 1200 {
                let _ = rollout.cast(RolloutMsg::CrashWriter);
            }
        }
        let mut seen = Vec::new();
        while let Ok(env) = rx.recv().await {
            seen.push(env);
        }
        let max_seen = seen.last().map_or(0, |e| e.seq);
        assert!(seen.windows(2).all(|w| w[0].seq < w[1].seq));
        assert!(
            max_seen <= 1201,
            "nothing emitted after the crash was published"
        );

        // A new incarnation on the same storage.
        let (rollout_args, _) = args_for(tmp.path(), session_id, Clock::new(), 64);
        let storage = rollout_args.storage.clone();
        let rollout = start(rollout_args).await;
        let last = last_seq(&rollout).await;
        assert!(
            last >= max_seen,
            "last_seq {last} below a seen seq {max_seen}"
        );
        let stored: HashMap<u64, RolloutRecord> = storage
            .read_after(session_id, 0, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|r| (r.seq, r))
            .collect();
        let mut kept = 0;
        for env in &seen {
            if let Some(expected) = record_for(policy_of(&policies, env), env) {
                assert_eq!(
                    stored.get(&env.seq),
                    Some(&expected),
                    "seq {} seen but not stored",
                    env.seq
                );
                kept += 1;
            }
        }
        assert!(kept > 0);
        let mut rx = call!(rollout, |reply| RolloutMsg::Subscribe { reply }).unwrap();
        emit(
            &rollout,
            EventDraft::session(EventKind::TaskAborted { waited_ms: 0 }),
        );
        assert_eq!(rx.recv().await.unwrap().seq, last + 1);
        rollout.drain_and_wait(None).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_killed_rollout_is_drained_before_the_next_one_reads_last_seq() {
        let tmp = tempfile::tempdir().unwrap();
        let (rollout_args, dir) = args(tmp.path(), Clock::new(), 64);
        let session_id = rollout_args.session_id;
        let (rollout, join) = Actor::spawn(None, Rollout, rollout_args).await.unwrap();
        let none = ConversationId::new();
        register(&rollout, none, StoragePolicy::None);
        for _ in 0..500 {
            emit(
                &rollout,
                EventDraft::conversation(none, EventKind::AssistantChunk { delta: "x".into() }),
            );
        }
        // A barrier: all 500 are with the writer.
        assert_eq!(last_seq(&rollout).await, 500);
        rollout.kill();
        join.await.unwrap();
        // Nothing of them was recorded; their numbers are still accounted for.
        assert!(!conversation_path(&dir, none).exists());
        let (rollout_args, _) = args_for(tmp.path(), session_id, Clock::new(), 64);
        let rollout = start(rollout_args).await;
        assert_eq!(last_seq(&rollout).await, 500);
        rollout.drain_and_wait(None).await.unwrap();
    }
}

// A message of actors on this process only (see `local_message!`).
crate::local_message!(RolloutMsg);
