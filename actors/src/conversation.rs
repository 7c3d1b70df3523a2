//! Conversation: one isolated conversation of a session (S1, S5).
//!
//! It owns its history (a bounded `HistoryStore`), its context (instructions, allowlist, tool
//! preferences), its queue of waiting messages and at most one running task.
//!
//! ```text
//! Message ──► idle? ── yes ─► start task (runner = tokio task, aborted with this actor)
//!               └─ no ──► queue (bounded; full → Overloaded)
//! runner ──► TaskFinished ─► append items to history, emit task_finished, reply, next in queue
//! Close ──► running? ── no ─► release, emit conversation_closed, reply, stop
//!             └─ yes ─► cancel; TaskFinished → closed | CancelTimedOut → abort → force_aborted
//! cancel (close, `CancelAll`, the TaskRegistry) ─► CancelSeen ─► timer (close timeout)
//!             └─ TaskFinished first → timer dropped | CancelTimedOut → abort → task_aborted
//! ```
//!
//! A task whose cancellation is asked, whoever asks, gets the close timeout to end; one that
//! ignores it (a tool or a model stream that never returns) is aborted then: its slot is
//! released, its caller answered `Cancelled`, a `cancel_ignored` warning and a `task_aborted`
//! event are recorded, and the next queued message starts. A cancelled or aborted task's
//! pending approvals are withdrawn (`ApprovalMsg::TaskCancelled`).
//!
//! Its MCP view follows its allowlist and its session's pool: a `SetContext` that changes the
//! allowlist opens a new view first (checked by the pool as at open; refused → the error, and
//! the old view and context stay), and a new pool (the old one failed) gets a new view. A
//! running task keeps the allowlist it started with until it ends; after a pool restart it
//! opens its own view on the new pool at its next MCP call (see `task`).
//!
//! The scheduler slot of its task is asked for by the conversation, which is the slot's
//! holder (the Scheduler monitors it). The runner awaits the scheduler's answer and reports it
//! (`SlotAnswered`) before it acts on it; it runs at once only if that scheduler is still the
//! session's, and otherwise waits for the conversation's verdict (see `task::first_answer`).
//!
//! When the Session has replaced a service actor in the session's directory it sends
//! `ServicesChanged` (no payload: the conversation reads the directory and compares
//! generations with the ones it dealt with last). That message comes after every answer the
//! runner acted on (the runner reports before it reads the directory), so the conversation
//! knows then whether its task waits or holds a slot, and re-declares what the new actor must
//! know:
//! - a new Scheduler: the held grant (`Reinstate`), a request asked again (`Acquire`; the old
//!   scheduler's answer no longer counts), or `Recovered` when it has no task: the new
//!   scheduler grants nothing until every conversation has answered ([`rejoin`]);
//! - a new TaskRegistry: its running task, with its start time and state (`Reinstate`);
//! - a new McpPool: a new view (above).
//!
//! A new Rollout already knows its storage policy (the Session starts it with the policies)
//! and a new ApprovalStore is found by the task when it asks (see `approval_store`). The slot
//! is given back with `Release` to the current scheduler when the task ends.
//!
//! Children: none (the runner is a task, not an actor). Its parent, the Session, restarts it
//! from its rollout when it fails; a failure drops the runner (aborting it), the Scheduler
//! frees the slots of a holder that stopped, and its callers see their reply port close. A
//! runner that panics ends its task with an `Internal` error.
//!
//! Restore (`restore`: after a failure, or after a restart of the process): `pre_start` reads
//! the conversation's window of records (`ReadRestoreWindow`: from its newest
//! `history_checkpoint` on, or all of them without one), rebuilds the history, turn count and
//! statistics from them (`restore_from_records`), emits
//! `conversation_restarted`, and for every task that started and never ended a
//! `task_interrupted` warning and a `task_aborted` record: nothing looks as if it were still
//! running, and nothing is run again. A conversation with no record yet opens as new.
//!
//! Checkpoints (S6): after every trim, compaction or new summary of its history the
//! conversation records a `history_checkpoint`: the summary, the task whose records hold the
//! oldest kept item (`window::KeptTasks`) and how many of its items were trimmed, its turn
//! count and statistics. A restore then reads that checkpoint and the records from that task
//! on, so its cost follows the history's bounds, not the length of the conversation.

use crate::approval_store::ApprovalMsg;
use crate::clock::Clock;
use crate::context::{ConversationContext, narrow};
use crate::directory::{Directory, Generations};
use crate::events::{EventDraft, EventSink, sub_id};
use crate::history::{HistoryLimits, HistoryStore, Summarizer};
use crate::ports::{CommandRunner, McpView, ModelClient, TokenCounter};
use crate::rollout::{RolloutMsg, RolloutRecord};
use crate::scheduler::SchedulerMsg;
use crate::task::{SlotWait, TaskContext, TaskLimits, TaskOutcome};
use crate::task_registry::TaskRegistryMsg;
use futures::FutureExt;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use troupe_proto::{
    AgentError, ApprovalPolicy, CloseOutcome, Closed, ConversationId, ConversationStats, EventKind,
    EventName, MessageReply, OpenConversation, SandboxPolicy, SessionId, SetContext, TaskId,
    TaskState, TaskStats, TaskStatus, WarningCode,
};

mod close;
mod decide;
pub mod metrics;
mod passivation;
pub mod summary;
mod tasks;
mod window;

pub use decide::{
    MessageAdmission, ModelChoice, ReclaimPlan, Rejoin, SlotAnswer, SlotState, YieldPlan,
    abort_timer_needed, admit, choose_model, clamp_message, idle_timer_needed, interrupted_tasks,
    is_idle, passivation_allowed, passivation_due, reclaim_plan, registry_state, rejoin,
    releases_at_end, slot_answer, yield_plan,
};

/// The one-turn system prompt of a compaction (C3); never stored.
pub const COMPACT_INSTRUCTIONS: &str = "You are compacting a conversation. Write a summary of \
everything above that a capable assistant needs to continue the work: the user's goals and \
preferences, decisions made, facts and file names learned, tool results that still matter, and \
what remains to be done. Be complete but brief; plain prose and short lists; no preamble.";

/// The user message of a compaction task.
pub const COMPACT_REQUEST: &str = "Summarize the conversation so far for your own later use.";

/// Session-wide settings every conversation follows.
#[derive(Debug, Clone)]
pub struct ConversationSettings {
    pub history: HistoryLimits,
    /// Who writes the summary of trimmed history (S6).
    pub summary: crate::history::SummaryMode,
    /// How long `close` waits for a cancelled task before aborting it (S5).
    pub close_timeout: Duration,
    /// Messages that may wait behind the running task; one more is `Overloaded`.
    pub max_queued_messages: usize,
    pub task: TaskLimits,
    /// The session's policies; a conversation may only narrow them (C2).
    pub approval_policy: ApprovalPolicy,
    pub sandbox_policy: SandboxPolicy,
    /// Whether the shell built-in is offered (a command runner is configured).
    pub shell_tool: bool,
    /// The workspace: where commands run by default, and what `workspace-write` commands
    /// and `apply_patch` may change. Empty: the process's working directory.
    pub workspace_roots: Vec<std::path::PathBuf>,
    /// Record prompts, completions and tool input/output on the tasks' spans (opt-in: they
    /// may hold secrets).
    pub record_content: bool,
    /// Names of the session's configured MCP servers: what an allowlist may name when no MCP
    /// pool runs to check it (C5).
    pub mcp_servers: Vec<String>,
    /// How long a conversation stays idle before it offers to be passivated (stopped, kept
    /// only in the store, reactivated by its next request); `None`: never.
    pub passivate_after: Option<Duration>,
    /// `[tools]`: the global and role layers of every task's tool policy (A5).
    pub tool_policy: Arc<troupe_proto::governance::ToolPolicyConfig>,
    /// The process's authorization tokens (`None`: a tool that needs one is refused).
    pub token_book: Option<ActorRef<crate::token_book::TokenBookMsg>>,
    /// `[capabilities]`: the capability registry (A6) and its context budget.
    pub capabilities: Arc<troupe_proto::capability::CapabilityCatalog>,
    pub capability_budget: troupe_proto::capability::CapabilityBudget,
    /// What a running `troupe serve` reloads (A7: `[tools]`, the capabilities directory, on
    /// a change or SIGHUP); when set, it stands for `tool_policy`, `capabilities` and
    /// `capability_budget`, and each task takes what is in force when it starts.
    pub live: Option<tokio::sync::watch::Receiver<Arc<Reloadable>>>,
    /// The process's modules (A10): what `dispatch_module` reaches (`None`: no modules).
    pub modules: Option<Arc<dyn crate::modules::ModulePort>>,
}

/// The settings a running service may change: a task takes them once, when it starts, and
/// keeps them to its end.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reloadable {
    pub tool_policy: Arc<troupe_proto::governance::ToolPolicyConfig>,
    pub capabilities: Arc<troupe_proto::capability::CapabilityCatalog>,
    pub capability_budget: troupe_proto::capability::CapabilityBudget,
    /// What the service's last reading of its configuration file said: a file that did not
    /// load, changes that need a restart. Each session reports them as `config_rejected`.
    pub rejected: Vec<troupe_proto::agent::AgentLoadError>,
}

impl ConversationSettings {
    /// The reloadable settings in force now: the live ones when the service reloads them,
    /// else the session's.
    pub fn reloadable(&self) -> Arc<Reloadable> {
        match &self.live {
            Some(live) => live.borrow().clone(),
            None => Arc::new(Reloadable {
                tool_policy: self.tool_policy.clone(),
                capabilities: self.capabilities.clone(),
                capability_budget: self.capability_budget,
                rejected: Vec::new(),
            }),
        }
    }
}

impl Default for ConversationSettings {
    fn default() -> Self {
        Self {
            history: HistoryLimits::default(),
            summary: crate::history::SummaryMode::Local,
            close_timeout: Duration::from_secs(5),
            max_queued_messages: 16,
            task: TaskLimits::default(),
            approval_policy: ApprovalPolicy::Always,
            sandbox_policy: SandboxPolicy::ReadOnly,
            shell_tool: false,
            workspace_roots: Vec::new(),
            record_content: false,
            mcp_servers: Vec::new(),
            passivate_after: None,
            tool_policy: Arc::default(),
            token_book: None,
            capabilities: Arc::default(),
            capability_budget: troupe_proto::capability::CapabilityBudget::default(),
            live: None,
            modules: None,
        }
    }
}

/// What a conversation calls: the session's actors and ports. Cheap to clone.
#[derive(Clone)]
pub struct Services {
    pub session_id: SessionId,
    /// The session's service actors (and MCP port), read at each use.
    pub directory: Directory,
    /// Events to the session's current Rollout.
    pub events: EventSink,
    /// The session's clock: stamps each task's start.
    pub clock: Clock,
    pub model: Arc<dyn ModelClient>,
    pub exec: Option<Arc<dyn CommandRunner>>,
    /// Run tool calls and dispatches, or play them back (replay).
    pub effects: crate::ports::Effects,
    pub summarizer: Arc<dyn Summarizer>,
    pub tokens: Arc<dyn TokenCounter>,
    pub settings: Arc<ConversationSettings>,
}

/// Start-up arguments.
pub struct ConversationArgs {
    pub conversation_id: ConversationId,
    pub params: OpenConversation,
    pub services: Services,
    /// Rebuild history from the rollout (a restart after a failure, or of the process). A
    /// conversation with no record yet is opened as new.
    pub restore: bool,
    /// Why it is restored (ignored unless `restore`).
    pub restore_cause: RestoreCause,
    /// Its own model client (an in-process agent's endpoint); `None`: the session's, asking
    /// for the model its parameters name.
    pub model: Option<Arc<dyn ModelClient>>,
}

/// Why a conversation is rebuilt from its rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestoreCause {
    /// Its actor failed and the Session restarted it.
    #[default]
    Failure,
    /// The process restarted (`SessionHandle::restore`, `SessionConfig::root_id`).
    Restart,
    /// It was passivated while idle, and a request for it came.
    Reactivation,
}

impl RestoreCause {
    /// The `conversation_restarted` reason.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Failure => "the conversation actor failed",
            Self::Restart => "restored after a restart",
            Self::Reactivation => "reactivated after passivation",
        }
    }

    /// What happened to a task that was running.
    pub const fn interrupted(self) -> &'static str {
        match self {
            Self::Failure => "interrupted by the conversation's failure",
            Self::Restart => "interrupted by a restart",
            Self::Reactivation => "interrupted before its passivation",
        }
    }
}

/// Where a task's final reply goes.
pub enum Answer {
    /// A caller waiting on its port.
    Port(RpcReplyPort<Result<MessageReply, AgentError>>),
    /// The agent hub that sent the dispatch straight here (see `agents::direct`).
    Hub(crate::agents::direct::HubAnswer),
}

impl Answer {
    /// Answers; `false` if nobody hears it any more.
    pub fn send(self, reply: Result<MessageReply, AgentError>) -> bool {
        match self {
            Self::Port(port) => port.send(reply).is_ok(),
            Self::Hub(hub) => hub.send(reply),
        }
    }
}

impl From<RpcReplyPort<Result<MessageReply, AgentError>>> for Answer {
    fn from(port: RpcReplyPort<Result<MessageReply, AgentError>>) -> Self {
        Self::Port(port)
    }
}

/// The Conversation's mailbox.
pub enum ConversationMsg {
    /// Runs one task for a user message (or, with `origin`, a dispatch to the agent this
    /// conversation is); answered with the final reply.
    Message {
        text: String,
        request: crate::task::TaskRequest,
        reply: Answer,
    },
    /// A dispatch the agent hub sends straight to the agent this conversation is: runs as a
    /// `Message` with its origin, and its end goes to the hub (see `agents::direct`).
    Dispatch(crate::agents::direct::DirectDispatch),
    /// Replaces the history by a summary the model writes under a one-turn override (C3);
    /// runs as a task, after any running one.
    Compact {
        reply: RpcReplyPort<Result<MessageReply, AgentError>>,
    },
    /// An in-process agent's definition as it is now (A7): its instructions and its model
    /// (its own client, else the session's under `model`/`provider`) for its next tasks; a
    /// running task keeps its own.
    Redefine {
        base_instructions: Option<String>,
        provider: Option<String>,
        model_name: Option<String>,
        model: Option<Arc<dyn ModelClient>>,
    },
    /// Changes the context without reordering history (C6).
    SetContext {
        update: SetContext,
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    /// Closes the conversation (idempotent; every caller is answered).
    Close { reply: RpcReplyPort<Closed> },
    /// Cancels the running task and every queued message (each answered `Cancelled`);
    /// answers how many were cancelled. The conversation stays open.
    CancelAll { reply: RpcReplyPort<usize> },
    /// The running task's cancellation token fired (whoever fired it): its abort timer starts.
    CancelSeen { task_id: TaskId },
    /// The model wrote (or failed to write) the summary of generation `generation`.
    SummaryWritten {
        generation: u64,
        result: Result<String, summary::SummaryFailure>,
    },
    /// The runner of `task_id` ended.
    TaskFinished {
        task_id: TaskId,
        outcome: Box<TaskOutcome>,
    },
    /// Timer: `task_id` was cancelled a close timeout ago and has not ended.
    CancelTimedOut { task_id: TaskId },
    /// The scheduler `scheduler` answered the slot request of `task_id` (`None`: it stopped
    /// before answering).
    SlotAnswered {
        task_id: TaskId,
        scheduler: ActorId,
        answer: Option<Result<(), AgentError>>,
    },
    /// The runner of `task_id` waits for a human: give its slot back to the scheduler.
    YieldSlot { task_id: TaskId },
    /// The runner of `task_id` was answered: ask for its slot again; `granted` hears the
    /// scheduler's verdict.
    ReclaimSlot {
        task_id: TaskId,
        granted: oneshot::Sender<Result<(), AgentError>>,
    },
    /// The Session replaced a service actor in the directory: re-declare to the new actors
    /// what they must know.
    ServicesChanged,
    /// Observation.
    Stats {
        reply: RpcReplyPort<ConversationStats>,
    },
    /// Timer: the conversation became idle at activity `epoch`, `passivate_after` ago.
    IdleTimedOut { epoch: u64 },
    /// The Session asks whether it may passivate this conversation: `Stopped` with its
    /// statistics when it is idle, and it then stops; `Busy` when work came first, and it
    /// stays.
    Passivate {
        reply: RpcReplyPort<PassivateAnswer>,
    },
    /// Fault injection: panics inside `handle`, to exercise supervision (restart from the
    /// rollout) in tests and drills.
    InjectPanic,
}

/// A conversation's answer to the Session's `Passivate`.
#[derive(Debug, Clone, PartialEq)]
pub enum PassivateAnswer {
    /// It was idle and stops; its statistics as they stand (the Session answers statistics
    /// reads from them while it is passivated, without reactivating it).
    Stopped(Box<ConversationStats>),
    /// Work came first: it stays.
    Busy,
}

/// What a task is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TaskKind {
    /// Answers a user message; its items enter history.
    Message,
    /// Summarises the history; the summary replaces it, its own items are dropped.
    Compact,
}

/// A task in flight.
struct Running {
    task_id: TaskId,
    kind: TaskKind,
    /// The task's span: its start and end events carry the same trace as its steps.
    span: tracing::Span,
    reply: Option<Answer>,
    cancel: CancellationToken,
    abort: AbortHandle,
    /// Unix ms of its start (session clock), declared again to a new TaskRegistry.
    started_at_ms: u64,
    /// A compaction's: the age of the content it summarizes (see `TaskContext`).
    content_since_ms: Option<u64>,
    /// Where the task stands with the scheduler; `None` once it was refused a slot.
    slot: Option<SlotState>,
    /// Passes the grant (or the refusal) on to the runner.
    granted: Option<oneshot::Sender<Result<(), AgentError>>>,
    /// The task's wait for a slot: a request asked again is sent in it too.
    wait: tracing::Span,
}

/// A message waiting for the running task to end.
struct Queued {
    kind: TaskKind,
    text: String,
    request: crate::task::TaskRequest,
    reply: Answer,
    /// The sender's span, which the task's root span links to when it starts.
    caller: tracing::Span,
}

/// The Conversation's state.
pub struct ConversationState {
    id: ConversationId,
    services: Services,
    /// The generations of the session's services this conversation last dealt with.
    seen: Generations,
    context: ConversationContext,
    history: HistoryStore,
    view: Option<Arc<dyn McpView>>,
    /// The MCP port generation `view` was opened on.
    view_generation: u64,
    running: Option<Running>,
    queue: VecDeque<Queued>,
    /// `Some` once close began: the callers to answer when it completes.
    closing: Option<Vec<RpcReplyPort<Closed>>>,
    /// The abort timer of a cancelled task; aborted once that task ends (or close completes),
    /// so the timer does not keep this actor's cell alive for the rest of its period.
    abort_timer: Option<AbortHandle>,
    /// Its storage policy: its tasks' dispatches carry it (an in-process agent that keeps
    /// more is refused them).
    storage_policy: troupe_proto::StoragePolicy,
    stats: ConversationStats,
    /// This conversation's model: the session's, or the one its open request named (S1).
    model: Arc<dyn ModelClient>,
    /// How its prompts are counted: the session's counter, or its own model's when it
    /// has one and the session's counter follows the model ([`tokens_for`]).
    tokens: Arc<dyn TokenCounter>,
    /// The model summary being written (`SummaryMode::Model`), aborted when a newer trim
    /// supersedes it or the conversation stops.
    summary_task: Option<AbortHandle>,
    /// Turns started so far (T1 numbers them from 1).
    turns: u32,
    /// Which tasks' items the history keeps: where a checkpoint says a restore starts (S6).
    kept: window::KeptTasks,
    /// When the oldest content folded into the summary was written (unix ms; 0 when not
    /// known): the summary's records are due no later than that content's under `Ttl`.
    summary_since_ms: Option<u64>,
    /// This conversation's policies: the session's, narrowed by the open request (C2).
    approval_policy: ApprovalPolicy,
    sandbox_policy: SandboxPolicy,
    /// Passivation: counts the requests handled, so an idle timer armed before the latest one
    /// is known to be stale; and the timer armed (its epoch, to abort it when re-armed).
    activity: u64,
    idle_timer: Option<(u64, AbortHandle)>,
    /// Whether this conversation may be passivated at all (`passivate_after` set and its
    /// storage policy keeps everything a restore needs).
    passivate_after: Option<Duration>,
}

impl Drop for ConversationState {
    fn drop(&mut self) {
        // A failed or stopped conversation must not leave its runner behind.
        if let Some(r) = &self.running {
            r.abort.abort();
        }
        if let Some(timer) = &self.abort_timer {
            timer.abort();
        }
        if let Some(task) = &self.summary_task {
            task.abort();
        }
        if let Some((_, timer)) = &self.idle_timer {
            timer.abort();
        }
        LIVE.fetch_sub(1, Ordering::Relaxed);
        metrics::live(LIVE.load(Ordering::Relaxed));
    }
}

/// Conversation states alive in this process (a gauge for leak tests and dashboards).
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Conversation states alive in this process.
pub fn live_conversations() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The Conversation actor.
pub struct Conversation;

#[ractor::async_trait]
impl Actor for Conversation {
    type Msg = ConversationMsg;
    type State = ConversationState;
    type Arguments = ConversationArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: ConversationArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let services = args.services;
        let settings = services.settings.clone();
        let seen = services.directory.generations();
        let (context, warnings) =
            ConversationContext::from_open(&args.params, settings.shell_tool)?;
        let own_model = args.model.is_some();
        let model = match args.model {
            Some(own) => own,
            None => model_for(
                &services.model,
                args.params.provider.as_deref(),
                args.params.model.as_deref(),
            )?,
        };
        let tokens = tokens_for(&services, &model);
        let mcp = services.directory.mcp();
        let allowlist = context.mcp_tool_allowlist.as_deref();
        let view = match &mcp.port {
            // A restored conversation's allowlist was accepted when it was set: a server or
            // tool gone since is not seen, never a reason to lose the conversation.
            Some(port) if args.restore => {
                Some(port.reopen_view(args.conversation_id, allowlist).await?)
            }
            Some(port) => Some(port.open_view(args.conversation_id, allowlist).await?),
            // No pool to ask (none configured, or none running now): the configuration
            // decides which servers a new allowlist may name (C5).
            None => {
                if let Some(list) = allowlist
                    && !args.restore
                {
                    crate::context::check_allowlist_servers(list, &settings.mcp_servers)?;
                }
                None
            }
        };
        let _ = services
            .directory
            .rollout()
            .cast(RolloutMsg::ConversationRegistered {
                conversation_id: args.conversation_id,
                policy: args.params.storage_policy,
            });
        let mut history =
            HistoryStore::new(settings.history, services.summarizer.clone()).keep_trimmed(
                matches!(settings.summary, crate::history::SummaryMode::Model { .. }),
            );
        let records = if args.restore {
            ractor::call!(services.directory.rollout(), |reply| {
                RolloutMsg::ReadRestoreWindow {
                    conversation_id: args.conversation_id,
                    reply,
                }
            })??
        } else {
            Vec::new()
        };
        let mut restored_turns = 0;
        let mut stats = ConversationStats::default();
        let mut kept = window::KeptTasks::default();
        let mut summary_since_ms = None;
        if records.is_empty() {
            services.events.emit(EventDraft::conversation(
                args.conversation_id,
                EventKind::ConversationOpened {
                    storage_policy: args.params.storage_policy,
                    base_instructions: args.params.base_instructions.clone(),
                    user_instructions: args.params.user_instructions.clone(),
                },
            ));
        } else {
            let rebuilt = crate::context::restore_from_records(&records);
            restored_turns = rebuilt.turns;
            stats = rebuilt.stats;
            if let Some((text, replaced)) = &rebuilt.summary {
                history.set_summary(text, *replaced);
            }
            kept = window::KeptTasks::from_owners(&rebuilt.owners, rebuilt.skipped);
            kept.started_at(&rebuilt.task_started_ms);
            summary_since_ms = crate::context::summary_since(
                rebuilt.summary.is_some(),
                rebuilt.summary_expires_ms,
                args.params.storage_policy,
            );
            let oldest = kept.oldest_started_ms();
            let restored = (rebuilt.items.len() + usize::from(rebuilt.summary.is_some())) as u64;
            history.append(rebuilt.items);
            // What a restore trims is summarized locally.
            if !history.take_trimmed().is_empty() {
                summary_since_ms = window::since_with(summary_since_ms, oldest);
            }
            kept.keep(window::held_items(&history));
            let cause = args.restore_cause;
            tracing::info!(conversation_id = %args.conversation_id, ?cause, restored, "conversation restored from its rollout");
            services.events.emit(EventDraft::conversation(
                args.conversation_id,
                EventKind::ConversationRestarted {
                    reason: cause.reason().into(),
                    restored_items: restored,
                },
            ));
            // Nothing may look as if it were still running, and nothing runs twice.
            for task_id in interrupted_tasks(&records) {
                tracing::warn!(conversation_id = %args.conversation_id, %task_id, "{}", cause.interrupted());
                services.events.emit(EventDraft::task(
                    args.conversation_id,
                    task_id,
                    EventKind::Warning {
                        code: WarningCode::TaskInterrupted,
                        message: format!(
                            "task {task_id} was {}; it is not run again",
                            cause.interrupted()
                        ),
                    },
                ));
                services.events.emit(EventDraft::task(
                    args.conversation_id,
                    task_id,
                    EventKind::TaskAborted { waited_ms: 0 },
                ));
                // An aborted task counts as a cancelled one, as a restore reads it back.
                crate::context::add_aborted_task(&mut stats);
            }
        }
        for message in warnings {
            services.events.emit(EventDraft::conversation(
                args.conversation_id,
                EventKind::Warning {
                    code: WarningCode::DeprecatedToolName,
                    message,
                },
            ));
        }
        warn_unavailable_tools(&services, args.conversation_id, &context.prefs);
        let (approval_policy, approval_clamped) =
            narrow(settings.approval_policy, args.params.approval_policy);
        let (sandbox_policy, sandbox_clamped) =
            narrow(settings.sandbox_policy, args.params.sandbox_policy);
        if approval_clamped || sandbox_clamped {
            let message = clamp_message(
                &args.params,
                (approval_clamped, approval_policy),
                (sandbox_clamped, sandbox_policy),
            );
            if approval_clamped {
                metrics::policy_clamped("approval");
            }
            if sandbox_clamped {
                metrics::policy_clamped("sandbox");
            }
            tracing::warn!(
                conversation_id = %args.conversation_id,
                approval = ?approval_policy,
                sandbox = ?sandbox_policy,
                "{message}"
            );
            services.events.emit(EventDraft::conversation(
                args.conversation_id,
                EventKind::Warning {
                    code: WarningCode::PolicyClamped,
                    message,
                },
            ));
        }
        LIVE.fetch_add(1, Ordering::Relaxed);
        metrics::live(LIVE.load(Ordering::Relaxed));
        Ok(ConversationState {
            id: args.conversation_id,
            services,
            seen,
            context,
            history,
            view,
            view_generation: mcp.generation,
            running: None,
            queue: VecDeque::new(),
            closing: None,
            abort_timer: None,
            storage_policy: args.params.storage_policy,
            stats: ConversationStats {
                conversation_id: Some(args.conversation_id),
                ..stats
            },
            tokens,
            model,
            summary_task: None,
            turns: restored_turns,
            kept,
            summary_since_ms,
            approval_policy,
            sandbox_policy,
            activity: 0,
            idle_timer: None,
            passivate_after: passivation_allowed(
                settings.passivate_after,
                args.params.storage_policy,
                own_model,
            ),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.arm_idle_timer(&myself);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ConversationMsg::IdleTimedOut { epoch } => {
                if passivation_due(state.is_idle(), epoch, state.activity) {
                    state.idle_timer = None;
                    state.offer_passivation(&myself);
                }
                return Ok(());
            }
            ConversationMsg::Passivate { reply } => {
                let idle = state.is_idle();
                let _ = reply.send(if idle {
                    PassivateAnswer::Stopped(Box::new(state.stats_now()))
                } else {
                    PassivateAnswer::Busy
                });
                if idle {
                    tracing::debug!(conversation_id = %state.id, "conversation passivated");
                    myself.stop(Some("passivated".into()));
                } else {
                    state.arm_idle_timer(&myself);
                }
                return Ok(());
            }
            // A read: it neither counts as activity nor moves the idle timer (a console that
            // polls statistics must not keep an idle conversation from passivating).
            ConversationMsg::Stats { reply } => {
                let _ = reply.send(state.stats_now());
                return Ok(());
            }
            _ => state.activity += 1,
        }
        match msg {
            ConversationMsg::IdleTimedOut { .. }
            | ConversationMsg::Passivate { .. }
            | ConversationMsg::Stats { .. } => {}
            ConversationMsg::Message {
                text,
                request,
                reply,
            } => {
                state.on_message(&myself, TaskKind::Message, text, request, reply);
            }
            ConversationMsg::Dispatch(dispatch) => {
                if let Some(parts) = dispatch.take() {
                    let request = crate::task::TaskRequest {
                        origin: Some(parts.origin),
                        options: crate::governance::RequestGovernance::default(),
                        stored: None,
                    };
                    let reply = Answer::Hub(parts.answer);
                    state.on_message(&myself, TaskKind::Message, parts.text, request, reply);
                }
            }
            ConversationMsg::Compact { reply } => {
                let text = COMPACT_REQUEST.into();
                state.on_message(
                    &myself,
                    TaskKind::Compact,
                    text,
                    crate::task::TaskRequest::default(),
                    reply.into(),
                );
            }
            ConversationMsg::SetContext { update, reply } => {
                let _ = reply.send(state.on_set_context(&update).await);
            }
            ConversationMsg::Redefine {
                base_instructions,
                provider,
                model_name,
                model,
            } => state.on_redefine(base_instructions, provider, model_name, model),
            ConversationMsg::Close { reply } => state.on_close(&myself, reply),
            ConversationMsg::CancelAll { reply } => {
                let _ = reply.send(state.on_cancel_all());
            }
            ConversationMsg::CancelSeen { task_id } => state.arm_abort_timer(&myself, task_id),
            ConversationMsg::SummaryWritten { generation, result } => {
                state.on_summary_written(generation, result);
            }
            ConversationMsg::TaskFinished { task_id, outcome } => {
                state.on_task_finished(&myself, task_id, *outcome);
            }
            ConversationMsg::CancelTimedOut { task_id } => {
                state.on_cancel_timed_out(&myself, task_id)
            }
            ConversationMsg::SlotAnswered {
                task_id,
                scheduler,
                answer,
            } => state.on_slot_answered(task_id, scheduler, answer),
            ConversationMsg::YieldSlot { task_id } => state.on_yield_slot(task_id),
            ConversationMsg::ReclaimSlot { task_id, granted } => {
                state.on_reclaim_slot(&myself, task_id, granted);
            }
            ConversationMsg::ServicesChanged => state.on_services_changed(&myself).await,
            ConversationMsg::InjectPanic => panic!("injected fault in conversation {}", state.id),
        }
        state.arm_idle_timer(&myself);
        Ok(())
    }
}

/// The model client a conversation uses: the session's, or the session's client asking for
/// the model the request names (see [`choose_model`]).
fn model_for(
    session: &Arc<dyn ModelClient>,
    provider: Option<&str>,
    model: Option<&str>,
) -> Result<Arc<dyn ModelClient>, AgentError> {
    let info = session.info();
    match choose_model(&info, provider, model)? {
        ModelChoice::Session => Ok(session.clone()),
        ModelChoice::Named(name) => {
            let client = session.with_model(&name).ok_or_else(|| {
                AgentError::invalid(format!(
                    "the `{}` model client serves only `{}`; it cannot ask for `{name}`",
                    info.provider, info.model
                ))
            })?;
            metrics::own_model();
            tracing::info!(provider = %info.provider, model = %name, "conversation model chosen");
            Ok(client)
        }
    }
}

/// The counter of a conversation's prompts: the session's for the session's model, else the
/// conversation's model's own when the session's counter follows the model.
fn tokens_for(services: &Services, model: &Arc<dyn ModelClient>) -> Arc<dyn TokenCounter> {
    if Arc::ptr_eq(model, &services.model) {
        return services.tokens.clone();
    }
    services
        .tokens
        .of_model(&model.info().model)
        .unwrap_or_else(|| services.tokens.clone())
}

/// What a task's end reports when its runner panicked.
fn runner_panicked() -> TaskOutcome {
    TaskOutcome {
        status: TaskStatus::Error,
        text: String::new(),
        stats: TaskStats::default(),
        error: Some(AgentError::internal("the task runner failed")),
        items: Vec::new(),
        item_times_ms: Vec::new(),
    }
}

impl ConversationState {
    fn on_message(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        kind: TaskKind,
        text: String,
        request: crate::task::TaskRequest,
        reply: Answer,
    ) {
        let max = self.services.settings.max_queued_messages;
        // With ractor's span propagation, the current span in `handle` is the sender's.
        let caller = tracing::Span::current();
        match admit(
            self.closing.is_some(),
            self.running.is_some(),
            self.queue.len(),
            max,
        ) {
            MessageAdmission::StartNow => {
                self.start_task(myself, kind, text, request, reply, &caller);
            }
            MessageAdmission::Enqueue => self.queue.push_back(Queued {
                kind,
                text,
                request,
                reply,
                caller,
            }),
            MessageAdmission::RejectClosing => {
                let _ = reply.send(Err(AgentError::not_found("conversation", self.id)));
            }
            MessageAdmission::RejectFull => {
                let _ = reply.send(Err(AgentError::Overloaded {
                    resource: "conversation message queue".into(),
                    limit: u32::try_from(max).unwrap_or(u32::MAX),
                }));
            }
        }
    }

    fn on_redefine(
        &mut self,
        base_instructions: Option<String>,
        provider: Option<String>,
        model_name: Option<String>,
        model: Option<Arc<dyn ModelClient>>,
    ) {
        self.context.base_instructions = base_instructions;
        let chosen = match model {
            Some(own) => Ok(own),
            None => model_for(
                &self.services.model,
                provider.as_deref(),
                model_name.as_deref(),
            ),
        };
        match chosen {
            Ok(model) => {
                self.tokens = tokens_for(&self.services, &model);
                self.model = model;
            }
            Err(error) => {
                tracing::warn!(conversation_id = %self.id, %error, "agent's new model refused");
                self.services.events.emit(EventDraft::conversation(
                    self.id,
                    EventKind::Warning {
                        code: WarningCode::ConfigRejected,
                        message: format!("the agent's model stays as it was: {error}"),
                    },
                ));
            }
        }
    }

    async fn on_set_context(&mut self, update: &SetContext) -> Result<(), AgentError> {
        let mut next = self.context.clone();
        let warnings = next.apply(update)?;
        // Checked before anything changes; the running task keeps the model it started with.
        // `null` puts the session's model back.
        let model = match &update.model {
            Some(Some(name)) => Some(model_for(&self.services.model, None, Some(name))?),
            Some(None) => Some(self.services.model.clone()),
            None => None,
        };
        let mcp = self.services.directory.mcp();
        let new_allowlist = next.mcp_tool_allowlist != self.context.mcp_tool_allowlist;
        if mcp.port.is_none()
            && new_allowlist
            && let Some(list) = &next.mcp_tool_allowlist
        {
            crate::context::check_allowlist_servers(list, &self.services.settings.mcp_servers)?;
        }
        if (new_allowlist || update.refresh_mcp)
            && let Some(port) = &mcp.port
        {
            // The new view first: if the pool refuses a new allowlist, nothing changes (one
            // accepted before is opened again as it is: a refresh never fails on it).
            let allowlist = next.mcp_tool_allowlist.as_deref();
            let view = if new_allowlist {
                port.open_view(self.id, allowlist).await
            } else {
                port.reopen_view(self.id, allowlist).await
            };
            let view = view.inspect_err(|error| {
                tracing::info!(conversation_id = %self.id, %error, "new MCP allowlist refused");
            })?;
            if update.refresh_mcp {
                // The pool lists its servers' tools again and restarts those waiting to.
                view.refresh().await;
            }
            tracing::info!(conversation_id = %self.id, new_allowlist, refresh = update.refresh_mcp, "MCP view reopened");
            // The old view is released once a running task that holds it is done with it.
            self.view = Some(view);
            self.view_generation = mcp.generation;
        }
        if next.prefs != self.context.prefs {
            warn_unavailable_tools(&self.services, self.id, &next.prefs);
        }
        self.context = next;
        if let Some(model) = model {
            self.tokens = tokens_for(&self.services, &model);
            self.model = model;
        }
        for message in warnings {
            self.services.events.emit(EventDraft::conversation(
                self.id,
                EventKind::Warning {
                    code: WarningCode::DeprecatedToolName,
                    message,
                },
            ));
        }
        Ok(())
    }

    /// A new MCP pool (the old one failed) gets a new view; none at all, a warning.
    async fn reopen_view(&mut self) {
        let mcp = self.services.directory.mcp();
        self.view_generation = mcp.generation;
        if self.closing.is_some() {
            return;
        }
        let opened = match &mcp.port {
            Some(port) => {
                port.reopen_view(self.id, self.context.mcp_tool_allowlist.as_deref())
                    .await
            }
            None => Err(AgentError::internal(
                "the session's MCP pool could not start again",
            )),
        };
        match opened {
            Ok(view) => {
                tracing::info!(conversation_id = %self.id, "MCP view reopened on a new pool");
                crate::mcp_pool::metrics::view_reopened(
                    crate::mcp_pool::metrics::ReopenedBy::Conversation,
                );
                self.view = Some(view);
            }
            Err(error) => {
                tracing::warn!(conversation_id = %self.id, %error, "MCP view could not be reopened");
                self.view = None;
                self.services.events.emit(EventDraft::conversation(
                    self.id,
                    EventKind::Warning {
                        code: WarningCode::McpViewUnavailable,
                        message: format!("the MCP tools could not be reopened: {error}"),
                    },
                ));
            }
        }
    }
}

/// Tells the conversation which built-in tools it asked for cannot run here and are not
/// offered (C1: web search has no runner).
fn warn_unavailable_tools(
    services: &Services,
    conversation_id: ConversationId,
    prefs: &crate::tools::ToolPrefs,
) {
    for tool in crate::tools::unavailable_builtins(prefs) {
        services.events.emit(EventDraft::conversation(
            conversation_id,
            EventKind::Warning {
                code: WarningCode::ToolUnavailable,
                message: format!(
                    "`{tool}` was asked for but this session has no way to run it: it is not offered to the model"
                ),
            },
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, task_id: TaskId, kind: EventName) -> RolloutRecord {
        RolloutRecord {
            seq,
            ts_ms: seq,
            conversation_id: None,
            task_id: Some(task_id),
            kind,
            level: crate::rollout::RecordLevel::Minimal,
            event: None,
            meta: crate::rollout::RecordMeta::default(),
        }
    }

    #[test]
    fn interrupted_tasks_are_those_that_never_ended() {
        let (done, aborted, running, compacting) =
            (TaskId::new(), TaskId::new(), TaskId::new(), TaskId::new());
        let records = vec![
            record(1, done, EventName::TaskStarted),
            record(2, done, EventName::TaskFinished),
            record(3, aborted, EventName::TaskStarted),
            record(4, running, EventName::TaskStarted),
            record(5, running, EventName::StepStarted),
            record(6, aborted, EventName::TaskAborted),
            record(7, compacting, EventName::CompactionStarted),
        ];
        assert_eq!(interrupted_tasks(&records), vec![running, compacting]);
        assert!(interrupted_tasks(&[]).is_empty());
    }

    #[test]
    fn clamp_message_names_what_was_asked_and_what_is_used() {
        let params = OpenConversation {
            approval_policy: Some(ApprovalPolicy::Never),
            sandbox_policy: Some(SandboxPolicy::FullAccess),
            ..OpenConversation::default()
        };
        let both = clamp_message(
            &params,
            (true, ApprovalPolicy::Always),
            (true, SandboxPolicy::ReadOnly),
        );
        assert!(both.contains("approval policy Never") && both.contains("using Always"));
        assert!(both.contains("sandbox policy FullAccess") && both.contains("using ReadOnly"));
        let one = clamp_message(
            &params,
            (false, ApprovalPolicy::Never),
            (true, SandboxPolicy::WorkspaceWrite),
        );
        assert!(!one.contains("approval") && one.contains("using WorkspaceWrite"));
    }

    #[test]
    fn a_new_scheduler_hears_exactly_what_it_does_not_know() {
        let (old, new) = (ActorId::Local(1), ActorId::Local(2));
        assert_eq!(rejoin(None, new), Rejoin::Recovered);
        assert_eq!(rejoin(Some(SlotState::Yielded), new), Rejoin::Recovered);
        assert_eq!(rejoin(Some(SlotState::Held(old)), new), Rejoin::Reinstate);
        assert_eq!(rejoin(Some(SlotState::Asked(old)), new), Rejoin::AskAgain);
        // Already dealt with the new one (asked after it was published, or told twice).
        assert_eq!(rejoin(Some(SlotState::Held(new)), new), Rejoin::Nothing);
        assert_eq!(rejoin(Some(SlotState::Asked(new)), new), Rejoin::Nothing);
    }

    #[test]
    fn only_the_scheduler_asked_last_decides_the_slot() {
        let (old, new) = (ActorId::Local(1), ActorId::Local(2));
        let asked = Some(SlotState::Asked(new));
        assert_eq!(slot_answer(asked, new, Some(Ok(()))), SlotAnswer::Granted);
        let full = AgentError::Overloaded {
            resource: "scheduler queue".into(),
            limit: 1,
        };
        assert_eq!(
            slot_answer(asked, new, Some(Err(full.clone()))),
            SlotAnswer::Refused(full)
        );
        assert_eq!(slot_answer(asked, new, None), SlotAnswer::Lost);
        // A grant of the scheduler that was replaced meanwhile does not count.
        assert_eq!(slot_answer(asked, old, Some(Ok(()))), SlotAnswer::Stale);
        assert_eq!(
            slot_answer(Some(SlotState::Held(new)), new, Some(Ok(()))),
            SlotAnswer::Stale
        );
        assert_eq!(slot_answer(None, new, Some(Ok(()))), SlotAnswer::Stale);
    }

    #[test]
    fn a_reinstated_task_is_declared_as_it_stands() {
        let at = ActorId::Local(1);
        assert_eq!(registry_state(false, None), TaskState::Queued);
        assert_eq!(
            registry_state(false, Some(SlotState::Asked(at))),
            TaskState::Queued
        );
        assert_eq!(
            registry_state(false, Some(SlotState::Held(at))),
            TaskState::Running
        );
        assert_eq!(
            registry_state(true, Some(SlotState::Held(at))),
            TaskState::Cancelling
        );
    }

    #[test]
    fn a_task_gives_back_only_a_slot_it_holds_and_asks_again_only_without_one() {
        let at = ActorId::Local(1);
        assert_eq!(yield_plan(Some(SlotState::Held(at))), YieldPlan::Release);
        for slot in [None, Some(SlotState::Asked(at)), Some(SlotState::Yielded)] {
            assert_eq!(yield_plan(slot), YieldPlan::Nothing, "{slot:?}");
        }
        assert_eq!(reclaim_plan(Some(SlotState::Yielded)), ReclaimPlan::Ask);
        assert_eq!(
            reclaim_plan(Some(SlotState::Held(at))),
            ReclaimPlan::AlreadyHeld
        );
        assert_eq!(
            reclaim_plan(Some(SlotState::Asked(at))),
            ReclaimPlan::Pending
        );
        // While it waits without a slot it still counts as running, and a grant that comes
        // for it then is stale.
        assert_eq!(
            registry_state(false, Some(SlotState::Yielded)),
            TaskState::Running
        );
        assert_eq!(
            slot_answer(Some(SlotState::Yielded), at, Some(Ok(()))),
            SlotAnswer::Stale
        );
    }

    #[test]
    fn a_task_on_a_lent_slot_asks_gives_back_and_releases_nothing() {
        let at = ActorId::Local(1);
        let lent = Some(SlotState::Lent);
        assert_eq!(yield_plan(lent), YieldPlan::Nothing);
        assert_eq!(reclaim_plan(lent), ReclaimPlan::AlreadyHeld);
        assert!(!releases_at_end(lent));
        for slot in [None, Some(SlotState::Held(at)), Some(SlotState::Yielded)] {
            assert!(releases_at_end(slot), "{slot:?}");
        }
        // It runs; a new scheduler hears it holds nothing there; no grant is for it.
        assert_eq!(registry_state(false, lent), TaskState::Running);
        assert_eq!(registry_state(true, lent), TaskState::Cancelling);
        assert_eq!(rejoin(lent, at), Rejoin::Recovered);
        assert_eq!(slot_answer(lent, at, Some(Ok(()))), SlotAnswer::Stale);
    }

    #[test]
    fn a_cancelled_task_gets_one_abort_timer_while_it_runs() {
        assert!(abort_timer_needed(true, false));
        assert!(
            !abort_timer_needed(true, true),
            "close and the token both ask"
        );
        assert!(!abort_timer_needed(false, false), "the task already ended");
    }

    #[test]
    fn a_conversation_may_name_a_model_of_its_sessions_provider_only() {
        let session = crate::ports::ModelInfo {
            provider: "openai-chat".into(),
            model: "gpt-4o".into(),
            family: "gpt-4o".into(),
        };
        assert_eq!(choose_model(&session, None, None), Ok(ModelChoice::Session));
        assert_eq!(
            choose_model(&session, Some("openai-chat"), Some("gpt-4o")),
            Ok(ModelChoice::Session)
        );
        assert_eq!(
            choose_model(&session, None, Some("gpt-4.1")),
            Ok(ModelChoice::Named("gpt-4.1".into()))
        );
        let unknown = choose_model(&session, Some("anthropic"), Some("x"));
        assert!(
            matches!(&unknown, Err(AgentError::InvalidInput { message }) if message.contains("unknown provider `anthropic`")),
            "{unknown:?}"
        );
        for bad in ["", "  ", "a\nb"] {
            assert!(choose_model(&session, None, Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn admission() {
        assert_eq!(admit(false, false, 0, 2), MessageAdmission::StartNow);
        assert_eq!(admit(false, true, 1, 2), MessageAdmission::Enqueue);
        assert_eq!(admit(false, true, 2, 2), MessageAdmission::RejectFull);
        assert_eq!(admit(true, false, 0, 2), MessageAdmission::RejectClosing);
    }
}

// A message of actors on this process only (see `local_message!`).
crate::local_message!(ConversationMsg);
