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
//!             └─ yes ─► cancel; TaskFinished → closed | CloseTimedOut → abort → force_aborted
//! ```
//!
//! Its MCP view follows its allowlist and its session's pool: a `SetContext` that changes the
//! allowlist opens a new view first (checked by the pool as at open; refused → the error, and
//! the old view and context stay), and `ServicesChanged` with a new pool (the old one failed)
//! reopens the view there. A running task keeps the view it started with until it ends.
//!
//! Children: none (the runner is a task, not an actor). Its parent, the Session, restarts it
//! from its rollout when it fails; a failure drops the runner (aborting it), which gives the
//! scheduler slot back, and its callers see their reply port close.
//!
//! Restore (`restore`: after a failure, or after a restart of the process): `pre_start` reads
//! the conversation's records, rebuilds the history from them (`history_from_records`), emits
//! `conversation_restarted`, and for every task that started and never ended a
//! `task_interrupted` warning and a `task_aborted` record: nothing looks as if it were still
//! running, and nothing is run again. A conversation with no record yet opens as new.

use crate::approval_store::ApprovalMsg;
use crate::context::{ConversationContext, history_from_records, narrow};
use crate::events::{EventDraft, EventSink, sub_id};
use crate::history::{HistoryLimits, HistoryStore, Summarizer};
use crate::ports::{CommandRunner, McpPort, McpView, ModelClient, TokenCounter};
use crate::rollout::{RolloutMsg, RolloutRecord};
use crate::scheduler::SchedulerMsg;
use crate::task::{TaskContext, TaskLimits, TaskOutcome};
use crate::task_registry::TaskRegistryMsg;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use troupe_proto::{
    AgentError, ApprovalPolicy, CloseOutcome, Closed, ConversationId, ConversationStats, EventKind,
    MessageReply, OpenConversation, SandboxPolicy, SessionId, SetContext, StoragePolicy, TaskId,
    TaskStats, TaskStatus,
};

pub mod metrics;

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
}

impl Default for ConversationSettings {
    fn default() -> Self {
        Self {
            history: HistoryLimits::default(),
            close_timeout: Duration::from_secs(5),
            max_queued_messages: 16,
            task: TaskLimits::default(),
            approval_policy: ApprovalPolicy::Always,
            sandbox_policy: SandboxPolicy::ReadOnly,
            shell_tool: false,
            workspace_roots: Vec::new(),
            record_content: false,
        }
    }
}

/// What a conversation calls: the session's actors and ports. Cheap to clone.
#[derive(Clone)]
pub struct Services {
    pub session_id: SessionId,
    pub events: EventSink,
    pub scheduler: ActorRef<SchedulerMsg>,
    pub registry: ActorRef<TaskRegistryMsg>,
    pub approvals: ActorRef<ApprovalMsg>,
    pub model: Arc<dyn ModelClient>,
    pub mcp: Option<Arc<dyn McpPort>>,
    pub exec: Option<Arc<dyn CommandRunner>>,
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
}

/// Why a conversation is rebuilt from its rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestoreCause {
    /// Its actor failed and the Session restarted it.
    #[default]
    Failure,
    /// The process restarted (`SessionHandle::restore`, `SessionConfig::root_id`).
    Restart,
}

impl RestoreCause {
    /// The `conversation_restarted` reason.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Failure => "the conversation actor failed",
            Self::Restart => "restored after a restart",
        }
    }

    /// What happened to a task that was running.
    pub const fn interrupted(self) -> &'static str {
        match self {
            Self::Failure => "interrupted by the conversation's failure",
            Self::Restart => "interrupted by a restart",
        }
    }
}

/// The Conversation's mailbox.
pub enum ConversationMsg {
    /// Runs one task for a user message; answered with the final reply.
    Message {
        text: String,
        reply: RpcReplyPort<Result<MessageReply, AgentError>>,
    },
    /// Replaces the history by a summary the model writes under a one-turn override (C3);
    /// runs as a task, after any running one.
    Compact {
        reply: RpcReplyPort<Result<MessageReply, AgentError>>,
    },
    /// Changes the context without reordering history (C6).
    SetContext {
        update: SetContext,
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    /// Closes the conversation (idempotent; every caller is answered).
    Close { reply: RpcReplyPort<Closed> },
    /// The runner of `task_id` ended.
    TaskFinished {
        task_id: TaskId,
        outcome: Box<TaskOutcome>,
    },
    /// Timer: the close timeout of `task_id` ran out.
    CloseTimedOut { task_id: TaskId },
    /// The session restarted a service actor: use these references from now on.
    ServicesChanged { services: Box<Services> },
    /// Observation.
    Stats {
        reply: RpcReplyPort<ConversationStats>,
    },
    /// Fault injection: panics inside `handle`, to exercise supervision (restart from the
    /// rollout) in tests and drills.
    InjectPanic,
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
    reply: Option<RpcReplyPort<Result<MessageReply, AgentError>>>,
    cancel: CancellationToken,
    abort: AbortHandle,
}

/// A message waiting for the running task to end.
struct Queued {
    kind: TaskKind,
    text: String,
    reply: RpcReplyPort<Result<MessageReply, AgentError>>,
    /// The sender's span, which the task's root span links to when it starts.
    caller: tracing::Span,
}

/// The Conversation's state.
pub struct ConversationState {
    id: ConversationId,
    services: Services,
    context: ConversationContext,
    history: HistoryStore,
    view: Option<Arc<dyn McpView>>,
    running: Option<Running>,
    queue: VecDeque<Queued>,
    /// `Some` once close began: the callers to answer when it completes.
    closing: Option<Vec<RpcReplyPort<Closed>>>,
    /// The close timeout; aborted once close completes, so the timer does not keep this
    /// actor's cell alive for the rest of its period.
    close_timer: Option<AbortHandle>,
    stats: ConversationStats,
    /// Turns started so far (T1 numbers them from 1).
    turns: u32,
    /// This conversation's policies: the session's, narrowed by the open request (C2).
    approval_policy: ApprovalPolicy,
    sandbox_policy: SandboxPolicy,
    /// What the rollout keeps of this conversation; declared again to a restarted Rollout.
    storage_policy: StoragePolicy,
}

impl Drop for ConversationState {
    fn drop(&mut self) {
        // A failed or stopped conversation must not leave its runner behind.
        if let Some(r) = &self.running {
            r.abort.abort();
        }
        if let Some(timer) = &self.close_timer {
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
        let (context, warnings) =
            ConversationContext::from_open(&args.params, settings.shell_tool)?;
        let view = match &services.mcp {
            Some(port) => Some(
                port.open_view(args.conversation_id, context.mcp_tool_allowlist.as_deref())
                    .await?,
            ),
            None => None,
        };
        let _ = services
            .events
            .rollout()
            .cast(RolloutMsg::ConversationRegistered {
                conversation_id: args.conversation_id,
                policy: args.params.storage_policy,
            });
        let mut history = HistoryStore::new(settings.history, services.summarizer.clone());
        let records = if args.restore {
            ractor::call!(services.events.rollout(), |reply| {
                RolloutMsg::ReadConversation {
                    conversation_id: args.conversation_id,
                    reply,
                }
            })??
        } else {
            Vec::new()
        };
        let mut restored_turns = 0;
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
            let items = history_from_records(&records);
            restored_turns =
                u32::try_from(records.iter().filter(|r| r.kind == "task_started").count())
                    .unwrap_or(u32::MAX);
            let restored = items.len() as u64;
            history.append(items);
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
                        code: "task_interrupted".into(),
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
            }
        }
        for message in warnings {
            services.events.emit(EventDraft::conversation(
                args.conversation_id,
                EventKind::Warning {
                    code: "deprecated_tool_name".into(),
                    message,
                },
            ));
        }
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
                    code: "policy_clamped".into(),
                    message,
                },
            ));
        }
        LIVE.fetch_add(1, Ordering::Relaxed);
        metrics::live(LIVE.load(Ordering::Relaxed));
        Ok(ConversationState {
            id: args.conversation_id,
            services,
            context,
            history,
            view,
            running: None,
            queue: VecDeque::new(),
            closing: None,
            close_timer: None,
            stats: ConversationStats {
                conversation_id: Some(args.conversation_id),
                ..ConversationStats::default()
            },
            turns: restored_turns,
            approval_policy,
            sandbox_policy,
            storage_policy: args.params.storage_policy,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ConversationMsg::Message { text, reply } => {
                state.on_message(&myself, TaskKind::Message, text, reply);
            }
            ConversationMsg::Compact { reply } => {
                state.on_message(&myself, TaskKind::Compact, COMPACT_REQUEST.into(), reply);
            }
            ConversationMsg::SetContext { update, reply } => {
                let _ = reply.send(state.on_set_context(&update).await);
            }
            ConversationMsg::Close { reply } => state.on_close(&myself, reply),
            ConversationMsg::TaskFinished { task_id, outcome } => {
                state.on_task_finished(&myself, task_id, *outcome);
            }
            ConversationMsg::CloseTimedOut { task_id } => {
                state.on_close_timed_out(&myself, task_id)
            }
            ConversationMsg::ServicesChanged { services } => {
                state.on_services_changed(*services).await;
            }
            ConversationMsg::Stats { reply } => {
                let mut stats = state.stats.clone();
                stats.history_items = state.history.len() as u64;
                let _ = reply.send(stats);
            }
            ConversationMsg::InjectPanic => panic!("injected fault in conversation {}", state.id),
        }
        Ok(())
    }
}

/// Tasks of a record that started and never ended (no `task_finished` or `task_aborted`), in
/// the order they started.
pub fn interrupted_tasks(records: &[RolloutRecord]) -> Vec<TaskId> {
    let mut started = Vec::new();
    let mut ended = std::collections::HashSet::new();
    for r in records {
        let Some(task_id) = r.task_id else { continue };
        match r.kind.as_str() {
            "task_started" | "compaction_started" if !started.contains(&task_id) => {
                started.push(task_id);
            }
            "task_finished" | "task_aborted" => {
                ended.insert(task_id);
            }
            _ => {}
        }
    }
    started.retain(|t| !ended.contains(t));
    started
}

/// What to do with a new message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    StartNow,
    Enqueue,
    RejectClosing,
    RejectFull,
}

/// The `policy_clamped` warning (C2): what was asked, what the conversation got.
pub fn clamp_message(
    params: &OpenConversation,
    (approval_clamped, approval): (bool, ApprovalPolicy),
    (sandbox_clamped, sandbox): (bool, SandboxPolicy),
) -> String {
    let mut parts = Vec::new();
    if let (true, Some(asked)) = (approval_clamped, params.approval_policy) {
        parts.push(format!(
            "approval policy {asked:?} is wider than the session's; using {approval:?}"
        ));
    }
    if let (true, Some(asked)) = (sandbox_clamped, params.sandbox_policy) {
        parts.push(format!(
            "sandbox policy {asked:?} is wider than the session's; using {sandbox:?}"
        ));
    }
    format!(
        "a conversation may only narrow the session's policies: {}",
        parts.join("; ")
    )
}

/// Pure admission decision for a message.
pub fn admit(closing: bool, running: bool, queued: usize, max_queued: usize) -> Admission {
    match (closing, running) {
        (true, _) => Admission::RejectClosing,
        (false, false) => Admission::StartNow,
        (false, true) if queued < max_queued => Admission::Enqueue,
        (false, true) => Admission::RejectFull,
    }
}

impl ConversationState {
    /// A restarted Rollout knows no policy: without this, the conversation's events would be
    /// recorded as policy `None`.
    fn on_message(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        kind: TaskKind,
        text: String,
        reply: RpcReplyPort<Result<MessageReply, AgentError>>,
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
            Admission::StartNow => self.start_task(myself, kind, text, reply, &caller),
            Admission::Enqueue => self.queue.push_back(Queued {
                kind,
                text,
                reply,
                caller,
            }),
            Admission::RejectClosing => {
                let _ = reply.send(Err(AgentError::not_found("conversation", self.id)));
            }
            Admission::RejectFull => {
                let _ = reply.send(Err(AgentError::Overloaded {
                    resource: "conversation message queue".into(),
                    limit: u32::try_from(max).unwrap_or(u32::MAX),
                }));
            }
        }
    }

    fn start_task(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        kind: TaskKind,
        text: String,
        reply: RpcReplyPort<Result<MessageReply, AgentError>>,
        caller: &tracing::Span,
    ) {
        let task_id = TaskId::new();
        let cancel = CancellationToken::new();
        let settings = &self.services.settings;
        let _ = self.services.registry.cast(TaskRegistryMsg::Register {
            task_id,
            conversation_id: self.id,
            sub_id: sub_id(self.id, task_id),
            cancel: cancel.clone(),
        });
        let info = self.services.model.info();
        let span = crate::task::spans::invoke_agent(
            crate::task::spans::TaskSpanInfo {
                session_id: self.services.session_id,
                conversation_id: self.id,
                task_id,
                turn: self.turns + 1,
                kind: match kind {
                    TaskKind::Message => "message",
                    TaskKind::Compact => "compact",
                },
                provider: &info.provider,
                model: &info.model,
            },
            caller,
        );
        metrics::task_started(match kind {
            TaskKind::Message => "message",
            TaskKind::Compact => "compact",
        });
        let started = match kind {
            TaskKind::Message => EventKind::TaskStarted {
                input: text.clone(),
            },
            TaskKind::Compact => EventKind::CompactionStarted {},
        };
        span.in_scope(|| {
            self.services
                .events
                .emit(EventDraft::task(self.id, task_id, started));
        });
        let compact = kind == TaskKind::Compact;
        self.turns += 1;
        let ctx = TaskContext {
            conversation_id: self.id,
            task_id,
            turn: self.turns,
            tokens: self.services.tokens.clone(),
            input: text,
            history: self.history.snapshot(),
            pinned: self.context.pinned(),
            // A compaction only writes: no tools.
            builtins: if compact {
                Vec::new()
            } else {
                crate::tools::builtin_tools(&self.context.prefs)
            },
            base_instructions: self.context.base_instructions.clone(),
            turn_override: compact.then(|| COMPACT_INSTRUCTIONS.to_owned()),
            model: self.services.model.clone(),
            mcp: if compact { None } else { self.view.clone() },
            exec: self.services.exec.clone(),
            approvals: self.services.approvals.clone(),
            scheduler: self.services.scheduler.clone(),
            registry: self.services.registry.clone(),
            events: self.services.events.clone(),
            cancel: cancel.clone(),
            holder: myself.get_cell(),
            limits: settings.task,
            approval_policy: self.approval_policy,
            sandbox_policy: self.sandbox_policy,
            workspace_roots: settings.workspace_roots.clone(),
            record_content: settings.record_content,
        };
        let me = myself.clone();
        let task_span = span.clone();
        let join = tokio::spawn(async move {
            let outcome = crate::task::run(ctx, task_span).await;
            let _ = me.cast(ConversationMsg::TaskFinished {
                task_id,
                outcome: Box::new(outcome),
            });
        });
        self.running = Some(Running {
            task_id,
            kind,
            span,
            reply: Some(reply),
            cancel,
            abort: join.abort_handle(),
        });
    }

    fn on_task_finished(
        &mut self,
        myself: &ActorRef<ConversationMsg>,
        task_id: TaskId,
        outcome: TaskOutcome,
    ) {
        let Some(mut running) = self.running.take_if(|r| r.task_id == task_id) else {
            return; // a late report of an aborted task
        };
        match running.kind {
            TaskKind::Message => {
                if let Some(report) = self.history.append(outcome.items.iter().cloned()) {
                    self.services.events.emit(EventDraft::conversation(
                        self.id,
                        EventKind::HistoryTrimmed {
                            removed_items: report.removed_items,
                            summary: report.summary,
                        },
                    ));
                }
            }
            TaskKind::Compact if outcome.status == TaskStatus::Ok && !outcome.text.is_empty() => {
                let report = self.history.compact(outcome.text.clone());
                running.span.in_scope(|| {
                    self.services.events.emit(EventDraft::task(
                        self.id,
                        task_id,
                        EventKind::Compacted {
                            summary: report.summary,
                            replaced_items: report.removed_items,
                        },
                    ));
                });
            }
            // A failed compaction leaves the history as it was.
            TaskKind::Compact => {}
        }
        self.record_stats(&outcome.stats, outcome.status);
        running.span.in_scope(|| {
            self.services.events.emit(EventDraft::task(
                self.id,
                task_id,
                EventKind::TaskFinished {
                    status: outcome.status,
                    text: outcome.text.clone(),
                    stats: outcome.stats.clone(),
                    error: outcome.error.clone(),
                },
            ));
        });
        let _ = self
            .services
            .registry
            .cast(TaskRegistryMsg::Deregister { task_id });
        if let Some(reply) = running.reply.take() {
            let _ = reply.send(Ok(MessageReply {
                conversation_id: self.id,
                task_id,
                status: outcome.status,
                text: outcome.text,
                stats: outcome.stats,
                error: outcome.error,
            }));
        }
        if self.closing.is_some() {
            self.finish_close(myself, CloseOutcome::Closed);
        } else if let Some(next) = self.queue.pop_front() {
            self.start_task(myself, next.kind, next.text, next.reply, &next.caller);
        }
    }

    fn record_stats(&mut self, stats: &TaskStats, status: TaskStatus) {
        self.stats.tasks += 1;
        match status {
            TaskStatus::Error => self.stats.tasks_failed += 1,
            TaskStatus::Cancelled => self.stats.tasks_cancelled += 1,
            TaskStatus::Ok | TaskStatus::MaxSteps => {}
        }
        self.stats.usage.add(&stats.usage);
        self.stats.tool_calls += u64::from(stats.tool_calls);
        metrics::task_finished(status, stats);
    }

    async fn on_set_context(&mut self, update: &SetContext) -> Result<(), AgentError> {
        let mut next = self.context.clone();
        let warnings = next.apply(update)?;
        if next.mcp_tool_allowlist != self.context.mcp_tool_allowlist
            && let Some(port) = &self.services.mcp
        {
            // The new view first: if the pool refuses the allowlist, nothing changes.
            let view = port
                .open_view(self.id, next.mcp_tool_allowlist.as_deref())
                .await
                .inspect_err(|error| {
                    tracing::info!(conversation_id = %self.id, %error, "new MCP allowlist refused");
                })?;
            tracing::info!(conversation_id = %self.id, "MCP view reopened for a new allowlist");
            // The old view is released once a running task that holds it is done with it.
            self.view = Some(view);
        }
        self.context = next;
        for message in warnings {
            self.services.events.emit(EventDraft::conversation(
                self.id,
                EventKind::Warning {
                    code: "deprecated_tool_name".into(),
                    message,
                },
            ));
        }
        Ok(())
    }

    /// New service references; a new MCP pool (the old one failed) gets a new view.
    async fn on_services_changed(&mut self, services: Services) {
        // A restarted Rollout knows no conversation: tell it this one's
        // storage policy before any of its records reach it.
        let _ = services
            .events
            .rollout()
            .cast(RolloutMsg::ConversationRegistered {
                conversation_id: self.id,
                policy: self.storage_policy,
            });
        let new_pool = match (&self.services.mcp, &services.mcp) {
            (Some(old), Some(new)) => !Arc::ptr_eq(old, new),
            (None, Some(_)) => true,
            _ => false,
        };
        self.services = services;
        let Some(port) = self.services.mcp.clone().filter(|_| new_pool) else {
            return;
        };
        if self.closing.is_some() {
            return;
        }
        match port
            .open_view(self.id, self.context.mcp_tool_allowlist.as_deref())
            .await
        {
            Ok(view) => {
                tracing::info!(conversation_id = %self.id, "MCP view reopened on a new pool");
                self.view = Some(view);
            }
            Err(error) => {
                tracing::warn!(conversation_id = %self.id, %error, "MCP view could not be reopened");
                self.services.events.emit(EventDraft::conversation(
                    self.id,
                    EventKind::Warning {
                        code: "mcp_view_unavailable".into(),
                        message: format!("the MCP tools could not be reopened: {error}"),
                    },
                ));
            }
        }
    }

    fn on_close(&mut self, myself: &ActorRef<ConversationMsg>, reply: RpcReplyPort<Closed>) {
        if let Some(waiters) = &mut self.closing {
            waiters.push(reply);
            return;
        }
        self.closing = Some(vec![reply]);
        for q in self.queue.drain(..) {
            let _ = q
                .reply
                .send(Err(AgentError::cancelled("conversation closed")));
        }
        match &self.running {
            None => self.finish_close(myself, CloseOutcome::Closed),
            Some(r) => {
                r.cancel.cancel();
                let task_id = r.task_id;
                let timer = myself.send_after(self.services.settings.close_timeout, move || {
                    ConversationMsg::CloseTimedOut { task_id }
                });
                self.close_timer = Some(timer.abort_handle());
            }
        }
    }

    fn on_close_timed_out(&mut self, myself: &ActorRef<ConversationMsg>, task_id: TaskId) {
        let Some(mut running) = self.running.take_if(|r| r.task_id == task_id) else {
            return; // the task ended in time
        };
        running.abort.abort();
        let waited = self.services.settings.close_timeout;
        tracing::warn!(conversation_id = %self.id, task_id = %task_id, "task ignored cancellation; aborted");
        metrics::force_aborted();
        running.span.in_scope(|| {
            self.services.events.emit(EventDraft::task(
                self.id,
                task_id,
                EventKind::TaskAborted {
                    waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                },
            ));
        });
        self.stats.tasks += 1;
        self.stats.tasks_cancelled += 1;
        // The aborted runner drops its slot guard; release here too so the slot is free by
        // the time close answers.
        let _ = self
            .services
            .scheduler
            .cast(SchedulerMsg::Release { task_id });
        let _ = self
            .services
            .registry
            .cast(TaskRegistryMsg::Deregister { task_id });
        if let Some(reply) = running.reply.take() {
            let _ = reply.send(Err(AgentError::cancelled(
                "aborted: the task ignored cancellation past the close timeout",
            )));
        }
        self.finish_close(myself, CloseOutcome::ForceAborted);
    }

    fn finish_close(&mut self, myself: &ActorRef<ConversationMsg>, outcome: CloseOutcome) {
        if let Some(timer) = self.close_timer.take() {
            timer.abort();
        }
        if let Some(view) = self.view.take() {
            tokio::spawn(async move { view.release().await });
        }
        let _ = self
            .services
            .approvals
            .cast(ApprovalMsg::ConversationClosed {
                conversation_id: self.id,
            });
        let _ = self
            .services
            .registry
            .cast(TaskRegistryMsg::ConversationGone {
                conversation_id: self.id,
            });
        self.services.events.emit(EventDraft::conversation(
            self.id,
            EventKind::ConversationClosed { outcome },
        ));
        for reply in self.closing.take().unwrap_or_default() {
            let _ = reply.send(Closed {
                conversation_id: self.id,
                outcome,
            });
        }
        // Stay "closing" so late messages are refused until the actor is gone.
        self.closing = Some(Vec::new());
        myself.stop(Some("closed".into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, task_id: TaskId, kind: &str) -> RolloutRecord {
        RolloutRecord {
            seq,
            ts_ms: seq,
            conversation_id: None,
            task_id: Some(task_id),
            kind: kind.into(),
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
            record(1, done, "task_started"),
            record(2, done, "task_finished"),
            record(3, aborted, "task_started"),
            record(4, running, "task_started"),
            record(5, running, "step_started"),
            record(6, aborted, "task_aborted"),
            record(7, compacting, "compaction_started"),
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
    fn admission() {
        assert_eq!(admit(false, false, 0, 2), Admission::StartNow);
        assert_eq!(admit(false, true, 1, 2), Admission::Enqueue);
        assert_eq!(admit(false, true, 2, 2), Admission::RejectFull);
        assert_eq!(admit(true, false, 0, 2), Admission::RejectClosing);
    }
}
