//! The task runner: one user message → one Turn of Steps (T1). It runs as a tokio task owned
//! by its Conversation (aborted with it), starts once the scheduler grants the slot its
//! conversation asked for (see [`first_answer`]), and reports its outcome back as a
//! `TaskFinished` message (after which the conversation gives the slot back). Decisions (what a tool call needs, when the loop
//! ends, what to do with the MCP view) are pure functions below.
//!
//! It reads the session's services from the directory when it uses them, so that it outlives
//! their restarts: events go to the current Rollout, an approval is asked of the current
//! ApprovalStore (and asked again of the next one if the store fails while it waits), and an
//! MCP call made after a pool restart goes through a view the task opens on the new pool,
//! with the allowlist it started with. A call in flight when its pool fails ends with the
//! pool's error (the connection is closed with the pool).
//!
//! Built-in tools: `shell` runs through the session's `CommandRunner` under the
//! conversation's sandbox policy, after approval; `update_plan` records the plan as a
//! `plan_updated` event; `apply_patch` edits files inside the workspace when the sandbox lets
//! it write, after approval (the same policies as a command's writes).

mod agents;
mod authorize;
mod builtins;
mod capability;
mod govern;
mod guardrail;
pub mod metrics;
pub mod spans;

pub use agents::TaskAgents;

use crate::apply_patch::{self, Patch, PatchError};
use crate::approval_store::{Ask, Granted, ask_until_answered};
use crate::directory::Directory;
use crate::events::{EventDraft, EventSink};
use crate::governance::{RequestGovernance, TaskGovernance};
use crate::history::HistorySnapshot;
use crate::ports::{
    CommandRunner, DeltaSink, Effects, ExecRequest, McpView, ModelClient, ModelRequest,
    ModelResponse, TokenCounter, ToolCallContext, ToolFailure,
};
use ractor::ActorId;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use troupe_proto::governance::ToolPolicyConfig;
use troupe_proto::{
    AgentError, ApprovalPolicy, ApprovalSubject, ConversationId, EventKind, HistoryItem,
    OverBudget, SandboxPolicy, TaskId, TaskStats, TaskStatus, ToolCall, ToolErrorPolicy,
    ToolOutput, ToolSpec, WarningCode,
};

mod mcp_view;
mod modules;
mod step;
mod tool_call;

use mcp_view::*;
pub use mcp_view::{ViewStep, view_step};
use step::*;
pub use step::{Fitted, fit_budget, fixed_prompt_tokens};
use tool_call::*;
pub use tool_call::{ShellArgs, ToolRoute, command_timeout, render_exec, route_tool, shell_args};

/// Everything a task needs, taken from its conversation when it starts; the session's
/// services it reads from the directory at each use.
pub struct TaskContext {
    pub conversation_id: ConversationId,
    pub task_id: TaskId,
    /// Index of this turn in its conversation, from 1 (T1).
    pub turn: u32,
    /// Estimates every prompt before it is sent (T5).
    pub tokens: Arc<dyn TokenCounter>,
    pub input: String,
    pub history: HistorySnapshot,
    /// The user instructions, always first in the prompt (C4).
    pub pinned: Option<HistoryItem>,
    /// Built-in tools of the conversation, in their fixed order.
    pub builtins: crate::tools::OfferedTools,
    pub base_instructions: Option<String>,
    /// A one-turn system prompt (compaction); never stored (C3).
    pub turn_override: Option<String>,
    /// A compaction's: when the oldest content of the history it summarizes was written. Its
    /// answer carries that content, so its events are due no later than it under `Ttl`.
    pub content_since_ms: Option<u64>,
    pub model: Arc<dyn ModelClient>,
    /// The conversation's MCP view when the task started (`None`: no MCP tools).
    pub mcp: Option<Arc<dyn McpView>>,
    /// The MCP port generation `mcp` was opened on.
    pub mcp_generation: u64,
    /// The allowlist of `mcp`, for a view opened on a new pool.
    pub mcp_allowlist: Option<Vec<String>>,
    pub exec: Option<Arc<dyn CommandRunner>>,
    /// Whether tool calls and dispatches run, or are played back from a recording (replay).
    pub effects: Effects,
    /// The session's services, read at each use.
    pub services: Directory,
    pub events: EventSink,
    pub cancel: CancellationToken,
    pub limits: TaskLimits,
    pub approval_policy: ApprovalPolicy,
    pub sandbox_policy: SandboxPolicy,
    /// The workspace: where commands run by default and what `workspace-write` commands and
    /// `apply_patch` may change. Empty: the process's working directory.
    pub workspace_roots: Vec<PathBuf>,
    /// Record prompts, completions and tool input/output on the task's spans (opt-in).
    pub record_content: bool,
    /// Its conversation's storage policy (what its dispatches may have kept of them).
    pub storage_policy: troupe_proto::StoragePolicy,
    /// Gives the task's scheduler slot back while it waits for a human or an external agent
    /// (an in-process agent's task runs on it instead).
    pub slot: SlotLease,
    /// Its place among the session's agents (`None`: it neither routes nor dispatches, as a
    /// compaction).
    pub agents: Option<TaskAgents>,
    /// `[tools]`: the global and role layers of its tool policy (A5).
    pub tool_policy: Arc<ToolPolicyConfig>,
    /// The capability registry (A6) as it was when the task started, and its budget.
    pub capabilities: Arc<troupe_proto::capability::CapabilityCatalog>,
    pub capability_budget: troupe_proto::capability::CapabilityBudget,
    /// What its message asked of tool governance: the request layer, the tokens presented.
    pub options: RequestGovernance,
    /// Set when the task starts before its message is stored ([`StoredGate`]).
    pub stored: Option<StoredGate>,
    /// Where a tool call that needs a token asks for one use.
    pub token_book: Option<ractor::ActorRef<crate::token_book::TokenBookMsg>>,
    /// The process's modules: what `dispatch_module` and the supervisor's
    /// `dispatch_module` decision reach (`None`: no modules).
    pub modules: Option<Arc<dyn crate::modules::ModulePort>>,
}

/// What a message brings to its task besides its text: its dispatch when an agent's
/// conversation runs it, the sender's options (tool policy layer, tokens), and, for a message
/// whose task starts while its row is being stored, the gate it waits at.
#[derive(Debug, Clone, Default)]
pub struct TaskRequest {
    pub origin: Option<crate::agents::DispatchOrigin>,
    pub options: RequestGovernance,
    pub stored: Option<StoredGate>,
}

/// The gate of a task started while its message is being stored (the service's durable
/// queue starts it beside the write): the task may take its slot and ask its model meanwhile,
/// but it waits here before it acts on an answer or routes anywhere (no tool, no dispatch, no
/// history). A message that could not be stored (or whose writer went away) cancels its task,
/// wherever it is, and ends it here.
#[derive(Debug, Clone)]
pub struct StoredGate(tokio::sync::watch::Receiver<Option<bool>>);

/// The writer's side of a [`StoredGate`]: tells the task whether its message was stored.
#[derive(Debug)]
pub struct StoredSignal(tokio::sync::watch::Sender<Option<bool>>);

impl StoredGate {
    pub fn new() -> (StoredSignal, Self) {
        let (tx, rx) = tokio::sync::watch::channel(None);
        (StoredSignal(tx), Self(rx))
    }

    /// Whether the message was stored, once that is known.
    pub async fn stored(&self) -> bool {
        let mut rx = self.0.clone();
        matches!(
            rx.wait_for(Option::is_some).await.as_deref(),
            Ok(Some(true))
        )
    }
}

impl StoredSignal {
    pub fn stored(self, stored: bool) {
        let _ = self.0.send(Some(stored));
    }
}

/// The task's scheduler slot while it waits for a human: a task waiting for an approval
/// computes nothing, so it gives its slot back for the wait (another conversation's task may
/// run meanwhile) and asks for it again once answered, queueing like a new task. Both go
/// through the conversation, which holds the slot and keeps track of it across scheduler
/// restarts.
#[derive(Clone)]
pub struct SlotLease {
    give_back: Arc<dyn Fn() + Send + Sync>,
    ask_again: Arc<dyn Fn(SlotGrant) + Send + Sync>,
    /// Given back and not confirmed back yet (a wait whose reclaim was interrupted leaves it
    /// set, and the task asks again: [`SlotLease::is_out`]).
    out: Arc<AtomicBool>,
}

/// How long a wait for a human keeps the slot: an answer that comes sooner (a decision the
/// approval store remembers) costs no trip back through the scheduler's queue.
pub const HUMAN_GRACE: Duration = Duration::from_millis(50);

/// Where the verdict on a slot asked for again goes.
pub type SlotGrant = oneshot::Sender<Result<(), AgentError>>;

impl std::fmt::Debug for SlotLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotLease")
            .field("out", &self.out.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl SlotLease {
    /// `give_back` releases the slot; `ask_again` asks for it and answers through the sender
    /// when granted (or refused; at once when the slot was never given back).
    pub fn new(
        give_back: impl Fn() + Send + Sync + 'static,
        ask_again: impl Fn(SlotGrant) + Send + Sync + 'static,
    ) -> Self {
        Self {
            give_back: Arc::new(give_back),
            ask_again: Arc::new(ask_again),
            out: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A slot that is never given back (a task run outside a scheduler).
    pub fn kept() -> Self {
        Self::new(
            || {},
            |granted| {
                let _ = granted.send(Ok(()));
            },
        )
    }

    /// Gives the slot back for a wait.
    pub fn give_back(&self) {
        self.out.store(true, Ordering::SeqCst);
        (self.give_back)();
    }

    /// Asks for the slot again and waits for it; `Cancelled` if the task is cancelled first,
    /// the scheduler's refusal (overloaded) as it is.
    pub async fn take_back(&self, cancel: &CancellationToken) -> Result<(), AgentError> {
        let (granted, verdict) = oneshot::channel();
        (self.ask_again)(granted);
        let verdict = tokio::select! {
            biased;
            () = cancel.cancelled() => Err(AgentError::cancelled("cancelled while waiting for its slot back")),
            v = verdict => v.unwrap_or_else(|_| Err(AgentError::internal("the conversation stopped before the slot came back"))),
        };
        if verdict.is_ok() {
            self.out.store(false, Ordering::SeqCst);
        }
        verdict
    }

    /// Waits for `answer`, a human's: if it has not come within [`HUMAN_GRACE`] (a remembered
    /// decision answers at once), the slot goes back for the rest of the wait and is asked
    /// for again once answered. `why` names the wait in the `Cancelled` error a cancel ends it
    /// with.
    pub async fn wait_for_human<T>(
        &self,
        cancel: &CancellationToken,
        why: &'static str,
        answer: impl std::future::Future<Output = T>,
    ) -> Result<T, AgentError> {
        tokio::pin!(answer);
        tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(AgentError::cancelled(why)),
            r = &mut answer => return Ok(r),
            () = tokio::time::sleep(HUMAN_GRACE) => {}
        }
        self.give_back();
        let r = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(AgentError::cancelled(why)),
            r = &mut answer => r,
        };
        self.take_back(cancel).await?;
        Ok(r)
    }

    /// Waits for `answer`, an agent's. Whoever runs the dispatch decides what becomes of the
    /// slot meanwhile (see `agents::hub`, Scheduling): an in-process agent's task runs on it
    /// (lent: the dispatcher computes nothing while its agent works, and a slot of the
    /// agent's own would lock a session with a single slot), an external agent computes
    /// elsewhere and the slot goes back ([`give_back`](Self::give_back)) for the wait. A slot
    /// given back is asked for again once answered; a cancel ends the wait without it.
    pub async fn wait_for_child<T>(
        &self,
        cancel: &CancellationToken,
        why: &'static str,
        answer: impl std::future::Future<Output = T>,
    ) -> Result<T, AgentError> {
        let r = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(AgentError::cancelled(why)),
            r = answer => r,
        };
        if self.is_out() {
            self.take_back(cancel).await?;
        }
        Ok(r)
    }

    /// Whether the slot was given back and not confirmed back since: after work that may
    /// give it back on the task's behalf (an MCP call whose server asked a human, and whose
    /// wait for the slot was interrupted), the task asks again before going on.
    pub fn is_out(&self) -> bool {
        self.out.load(Ordering::SeqCst)
    }
}

impl TaskContext {
    /// Emits an event of this task (stamped with the current span).
    fn emit(&self, event: EventKind) {
        self.events.emit(
            EventDraft::task(self.conversation_id, self.task_id, event)
                .carrying_content_since(self.content_since_ms),
        );
    }
}

/// Bounds of one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    /// Steps (model calls) before the turn ends with `max_steps` (T2).
    pub max_steps: u32,
    /// Timeout of a shell command whose call names none.
    pub exec_timeout: Duration,
    /// The longest a command may run, whatever timeout its call asks for.
    pub exec_timeout_max: Duration,
    /// Bytes of command output kept.
    pub exec_output_cap: usize,
    /// Largest prompt sent, by the local estimate (T5); `None` = no bound.
    pub max_prompt_tokens: Option<u64>,
    /// A prompt above this is sent with a warning event.
    pub warn_prompt_tokens: Option<u64>,
    pub over_budget: OverBudget,
    /// What a failed tool call does to the turn (T6).
    pub tool_errors: ToolErrorPolicy,
}

impl Default for TaskLimits {
    fn default() -> Self {
        Self {
            max_steps: 100,
            exec_timeout: Duration::from_secs(60),
            exec_timeout_max: Duration::from_secs(600),
            exec_output_cap: 64 * 1024,
            max_prompt_tokens: None,
            warn_prompt_tokens: None,
            over_budget: OverBudget::Reject,
            tool_errors: ToolErrorPolicy::Skip,
        }
    }
}

/// What a task produced.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskOutcome {
    pub status: TaskStatus,
    pub text: String,
    pub stats: TaskStats,
    pub error: Option<AgentError>,
    /// New history items, in order: the user message, then what the model and tools said.
    pub items: Vec<HistoryItem>,
    /// When each of `items` happened (Unix ms, one per item): a tool call when it started,
    /// its output when it ended, so that content kept under `ttl` expires from then.
    pub item_times_ms: Vec<u64>,
}

/// A scheduler's answer to `Acquire`; `None` when it stopped before answering.
pub type SchedulerAnswer = Option<Result<(), AgentError>>;

/// How a task learns it may run: the answer of the scheduler its conversation (the slot's
/// holder) asked, or, when that did not settle it, the conversation's verdict.
pub struct SlotWait {
    /// The answer of the scheduler first asked (closed: it stopped before answering).
    pub first: oneshot::Receiver<Result<(), AgentError>>,
    /// The scheduler first asked.
    pub asked_of: ActorId,
    /// Tells the conversation the first answer (`SlotAnswered`); called before the runner
    /// acts on it.
    pub report: Box<dyn FnOnce(SchedulerAnswer) + Send>,
    /// The conversation's verdict, after the scheduler was replaced or asked again.
    pub verdict: oneshot::Receiver<Result<(), AgentError>>,
    /// `spans::scheduler_wait`, a child of the task's root span.
    pub span: tracing::Span,
}

/// What a runner does with the first scheduler's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum FirstAnswer {
    /// Granted by the session's current scheduler: run.
    Run,
    /// Refused by the session's current scheduler: end with this error.
    End(AgentError),
    /// That scheduler stopped or was replaced: the conversation decides (it asks the next).
    AskConversation,
}

/// `asked_of` answered `answer` (`None`: it stopped first); `current` is the session's
/// scheduler now, read after the answer was reported to the conversation.
pub fn first_answer(
    asked_of: ActorId,
    current: ActorId,
    answer: Option<&Result<(), AgentError>>,
) -> FirstAnswer {
    match answer {
        Some(_) if asked_of != current => FirstAnswer::AskConversation,
        Some(Ok(())) => FirstAnswer::Run,
        Some(Err(error)) => FirstAnswer::End(error.clone()),
        None => FirstAnswer::AskConversation,
    }
}

/// Runs the task to its end inside `span`, its root span (`spans::invoke_agent`), on which
/// it records the outcome: status, total usage, `error.type`. Never panics on bad model
/// output; every failure becomes an outcome with status `error` or `cancelled`.
pub async fn run(ctx: TaskContext, slot: SlotWait, span: tracing::Span) -> TaskOutcome {
    let started = Instant::now();
    let trace_id = spans::span_ids(&span)
        .map(|(trace, _)| trace)
        .unwrap_or_else(|| fallback_trace_id(ctx.task_id));
    let mut outcome = run_inner(&ctx, slot).instrument(span.clone()).await;
    outcome.stats.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    outcome.stats.trace_id = trace_id;
    span.record("troupe.task.status", outcome.status.as_str());
    spans::record_usage(&span, &outcome.stats.usage);
    if let Some(error) = &outcome.error {
        spans::record_error(&span, error);
    }
    outcome
}

/// A trace id derived from the task id when no OpenTelemetry layer is installed, so stats
/// and events still correlate.
fn fallback_trace_id(task_id: TaskId) -> String {
    task_id.as_uuid().simple().to_string()
}

/// What a task resolves once, before its first step.
struct Prepared {
    tools: crate::tools::OfferedTools,
    instructions: String,
    cache_key: String,
    /// Tokens of the instructions and tool descriptions.
    fixed_tokens: u64,
    /// An output guardrail applies: no raw text goes out (streamed or whole).
    hold_output: bool,
}

/// The merged tool list (S8; conflicts become warnings), the turn's instructions (C3) and
/// the prompt cache key (C7).
async fn prepare(
    ctx: &TaskContext,
    mcp: &mut TaskMcp,
    agents: Option<&agents::Agents>,
    gov: &TaskGovernance,
) -> Prepared {
    let listed = if mcp.offered {
        Some(match mcp.view(ctx).await {
            Ok(view) => view.list_tools().await,
            Err(error) => Err(error),
        })
    } else {
        None
    };
    let external = match listed {
        Some(listed) => match listed {
            Ok(tools) => tools,
            Err(error) => {
                ctx.events.emit(EventDraft::task(
                    ctx.conversation_id,
                    ctx.task_id,
                    EventKind::Warning {
                        code: WarningCode::McpToolsUnavailable,
                        message: error.to_string(),
                    },
                ));
                Vec::new()
            }
        },
        None => Vec::new(),
    };
    let mut more: Vec<ToolSpec> = modules::dispatch_tool(ctx).into_iter().collect();
    // The capability registry (A6): its tools when the policy leaves a capability to use
    // (a compaction, which has no tools, has none).
    let capabilities = crate::capabilities::visible(&ctx.capabilities, &gov.policy);
    if !capabilities.is_empty() && ctx.turn_override.is_none() {
        more.extend(crate::capabilities::tool_specs());
    }
    // The agents' dispatch tool first, as its view built it (its schema's text with it).
    let extra = match agents.and_then(agents::Agents::dispatch_tool) {
        Some(dispatch) if more.is_empty() => dispatch,
        Some(dispatch) => dispatch.with(more),
        None => crate::tools::OfferedTools::new(more),
    };
    let (mut tools, conflicts) = crate::tools::offered_tools(&ctx.builtins, extra, external);
    // A tool the policy denies is not offered: the model cannot call what it cannot see
    // (and a call it makes up anyway is refused at the call).
    if !gov.policy.is_open() {
        let (offered, withheld) = crate::governance::offered(tools.specs.to_vec(), &gov.policy);
        if !withheld.is_empty() {
            tracing::debug!(?withheld, "tools withheld by the tool policy");
            tools = crate::tools::OfferedTools::new(offered);
        }
    }
    for conflict in conflicts {
        tracing::warn!(error = %conflict, "tool conflict");
        ctx.events.emit(EventDraft::task(
            ctx.conversation_id,
            ctx.task_id,
            EventKind::Warning {
                code: WarningCode::ToolConflict,
                message: conflict.to_string(),
            },
        ));
    }
    let has_apply_patch = tools.specs.iter().any(|t| t.name == "apply_patch");
    // An agent's instructions are its file's as the hub has it now (A7).
    let base = agents
        .and_then(|a| a.view.own.as_ref())
        .and_then(|own| own.instructions.as_deref())
        .or(ctx.base_instructions.as_deref());
    let mut instructions =
        crate::context::choose_instructions(ctx.turn_override.as_deref(), base, has_apply_patch);
    // One line per capability, within its budget; the rest on demand (capability_inspect).
    if tools
        .specs
        .iter()
        .any(|t| crate::capabilities::is_capability_tool(&t.name))
        && let Some(summary) = crate::capabilities::summary(
            &capabilities,
            ctx.capability_budget.prompt_tokens,
            &|text: &str| ctx.tokens.count(text),
        )
    {
        if summary.lines().last().is_some_and(|l| l.starts_with('+')) {
            crate::capabilities::metrics::summary_truncated();
        }
        instructions.push_str("\n\n");
        instructions.push_str(&summary);
    }
    let cache_key =
        crate::context::prompt_cache_key(&instructions, &tools.specs, &ctx.model.info().family);
    let fixed_tokens = fixed_prompt_tokens(ctx.tokens.as_ref(), &instructions, &tools);
    Prepared {
        tools,
        instructions,
        cache_key,
        fixed_tokens,
        hold_output: false,
    }
}

async fn run_inner(ctx: &TaskContext, slot: SlotWait) -> TaskOutcome {
    let clock = crate::clock::Clock::new();
    let mut loop_state = LoopState {
        items: vec![HistoryItem::user(ctx.input.clone())],
        item_times_ms: vec![clock.now_ms()],
        clock,
        stats: TaskStats {
            turn: ctx.turn,
            ..TaskStats::default()
        },
        last_text: String::new(),
        granted_at: None,
        routed: false,
    };

    // Wait for a slot, unless cancelled first.
    let SlotWait {
        first,
        asked_of,
        report,
        verdict,
        span: wait,
    } = slot;
    let granted = async {
        let answer = first.await.ok();
        // Reported before the directory is read: a replacement published after this read is
        // announced to the conversation after the report (see `conversation`).
        report(answer.clone());
        let current = ctx.services.scheduler().get_id();
        match first_answer(asked_of, current, answer.as_ref()) {
            FirstAnswer::Run => Ok(()),
            FirstAnswer::End(error) => Err(error),
            FirstAnswer::AskConversation => verdict.await.unwrap_or_else(|_| {
                Err(AgentError::internal(
                    "the conversation stopped before the task got a slot",
                ))
            }),
        }
    };
    let granted = tokio::select! {
        biased;
        () = ctx.cancel.cancelled() => Err(AgentError::cancelled("cancelled while queued")),
        r = granted.instrument(wait.clone()) => r,
    };
    if let Err(e) = granted {
        spans::record_error(&wait, &e);
        return loop_state.end(status_of(&e), Some(e));
    }
    loop_state.granted_at = Some(Instant::now());
    drop(wait);

    let turn = spans::turn(ctx.conversation_id, ctx.task_id, ctx.turn);
    let outcome = async {
        let agents = agents::agents_of(ctx);
        let gov = govern::governance_of(ctx, agents.as_ref());
        // `/hub` goes to an agent; without any, it is refused rather than sent to the model
        // as text.
        if agents.is_none()
            && ctx.turn_override.is_none()
            && crate::agents::route::hub_command(&ctx.input).is_some()
        {
            let e = AgentError::invalid(
                "no agents are defined in this session: `/hub <agent_id> <text>` sends text to \
                 one (define agents in the agents directory, `[agents] dir`)",
            );
            ctx.emit(EventKind::Error { error: e.clone() });
            return loop_state.end(status_of(&e), Some(e));
        }
        if let Some(agents) = &agents
            && let Some(routed) = agents::route_input(ctx, agents, &gov, &mut loop_state).await
        {
            return match routed {
                Ok(()) => loop_state.end(TaskStatus::Ok, None),
                Err(e) => {
                    ctx.emit(EventKind::Error { error: e.clone() });
                    loop_state.end(status_of(&e), Some(e))
                }
            };
        }
        run_turn(ctx, loop_state, agents.as_ref(), &gov).await
    }
    .instrument(turn.clone())
    .await;
    turn.record("troupe.turn.steps", outcome.stats.steps);
    turn.record("troupe.turn.tool_calls", outcome.stats.tool_calls);
    outcome
}

/// Waits at the task's [`StoredGate`], if it has one (its message is being stored): `Err` when
/// the message could not be stored (or the task was cancelled meanwhile). Passed before a
/// task acts on a model's answer or routes anywhere, so that nothing of a message that was
/// never stored is run or kept.
async fn stored_gate(ctx: &TaskContext) -> Result<(), AgentError> {
    let Some(gate) = &ctx.stored else {
        return Ok(());
    };
    tokio::select! {
        biased;
        () = ctx.cancel.cancelled() => Err(AgentError::cancelled(
            "cancelled before its message was stored",
        )),
        stored = gate.stored() => {
            if stored {
                Ok(())
            } else {
                Err(AgentError::internal(
                    "its message could not be stored: its turn went no further",
                ))
            }
        }
    }
}

/// The steps of a turn, once the task holds its slot (after its routing step, if any).
async fn run_turn(
    ctx: &TaskContext,
    mut loop_state: LoopState,
    agents: Option<&agents::Agents>,
    gov: &Arc<TaskGovernance>,
) -> TaskOutcome {
    let mut mcp = TaskMcp::new(ctx);
    let mut prepared = prepare(ctx, &mut mcp, agents, gov).await;
    let mut guarded = match guardrail::guard_of(agents) {
        Ok(guarded) => guarded,
        Err(e) => {
            ctx.emit(EventKind::Error { error: e.clone() });
            return loop_state.end(TaskStatus::Error, Some(e));
        }
    };
    prepared.hold_output = guarded.is_some();

    let first = loop_state.stats.steps + 1;
    for step in first..=ctx.limits.max_steps {
        if ctx.cancel.is_cancelled() {
            return loop_state.end(
                TaskStatus::Cancelled,
                Some(AgentError::cancelled("cancelled")),
            );
        }
        loop_state.stats.steps = step;
        ctx.emit(EventKind::StepStarted {
            turn: ctx.turn,
            step,
        });
        let prompt = guardrail::prompt(&loop_state.items, guarded.as_ref());
        let response = match model_step(ctx, &ctx.model, &prepared, &prompt, step).await {
            Ok((response, estimate)) => {
                loop_state.stats.estimated_prompt_tokens += estimate;
                let completion = completion_tokens(ctx.tokens.as_ref(), &response);
                match response.usage {
                    Some(usage) => {
                        loop_state.stats.usage.add(&usage);
                        loop_state.stats.steps_with_usage += 1;
                    }
                    None => {
                        loop_state.stats.estimated_completion_tokens +=
                            completion.unwrap_or_default();
                    }
                }
                ctx.emit(EventKind::StepFinished {
                    turn: ctx.turn,
                    step,
                    estimated_prompt_tokens: estimate,
                    usage: response.usage,
                    estimated_completion_tokens: completion,
                });
                response
            }
            Err(e) => {
                ctx.emit(EventKind::Error { error: e.clone() });
                // A step that failed is not counted: `steps` are the model calls that
                // answered, so its token source is what those answers said (at the first
                // step, nothing was answered: see `LoopState::end`).
                loop_state.stats.steps = step - 1;
                return loop_state.end(status_of(&e), Some(e));
            }
        };
        // Nothing is acted on before the message is stored: the model may have been asked
        // meanwhile, but no tool runs and no history is kept for a message that never was.
        if let Err(e) = stored_gate(ctx).await {
            return loop_state.end_unstored(e);
        }
        // Under an output guardrail, nothing the model wrote goes out or into history until
        // it is validated.
        if !response.text.is_empty() && guarded.is_none() {
            ctx.emit(EventKind::AssistantMessage {
                text: response.text.clone(),
            });
            loop_state.push(HistoryItem::assistant(response.text.clone()));
            loop_state.last_text = response.text.clone();
        }
        if response.tool_calls.is_empty() {
            let Some(g) = guarded.as_mut() else {
                return loop_state.end(TaskStatus::Ok, None);
            };
            match guardrail::judge(ctx, g, &response.text) {
                guardrail::Judged::Answer(text) => {
                    ctx.emit(EventKind::AssistantMessage { text: text.clone() });
                    loop_state.push(HistoryItem::assistant(text.clone()));
                    loop_state.last_text = text;
                    return loop_state.end(TaskStatus::Ok, None);
                }
                guardrail::Judged::Retry => continue,
                guardrail::Judged::Exhausted(end) => {
                    return guardrail::exhausted(ctx, loop_state, end);
                }
            }
        }
        if let Some(g) = guarded.as_mut() {
            // The model answered the retry with tool calls: they carry the conversation on.
            g.retry.clear();
        }
        for call in response.tool_calls {
            if ctx.cancel.is_cancelled() {
                return loop_state.end(
                    TaskStatus::Cancelled,
                    Some(AgentError::cancelled("cancelled")),
                );
            }
            loop_state.stats.tool_calls += 1;
            let mcp_call = is_mcp_tool(&call.name, &prepared.tools.specs);
            let call_started = Instant::now();
            let called_at_ms = loop_state.clock.now_ms();
            let mut attempt = 0;
            let (output, error) = loop {
                let (output, error) =
                    run_tool(ctx, &mut mcp, agents, gov, &prepared.tools.specs, &call).await;
                match (&error, ctx.limits.tool_errors) {
                    (Some(e), ToolErrorPolicy::Retry { attempts })
                        if attempt < attempts && e.retryable() =>
                    {
                        attempt += 1;
                        tracing::info!(tool = %call.name, attempt, "retrying failed tool call");
                    }
                    _ => break (output, error),
                }
            };
            if mcp_call {
                loop_state.stats.mcp_calls += 1;
                loop_state.stats.mcp_latency_ms += millis(call_started.elapsed());
            }
            loop_state.push_at(HistoryItem::ToolCall(call), called_at_ms);
            loop_state.push(HistoryItem::ToolOutput(output));
            if let (Some(e), ToolErrorPolicy::Terminate) = (error, ctx.limits.tool_errors) {
                // A call that failed because the task was cancelled (waiting for approval,
                // say) ends it cancelled, not failed.
                return loop_state.end(status_of(&e.error), Some(e.error));
            }
        }
    }
    // Under an output guardrail, running out of steps is having no valid answer: never an
    // empty one that a dispatcher would take for it.
    match &guarded {
        Some(g) => guardrail::exhausted(ctx, loop_state, guardrail::out_of_steps(g)),
        None => loop_state.end(TaskStatus::MaxSteps, None),
    }
}

struct LoopState {
    items: Vec<HistoryItem>,
    /// When each of `items` happened (see [`TaskOutcome::item_times_ms`]).
    item_times_ms: Vec<u64>,
    clock: crate::clock::Clock,
    stats: TaskStats,
    last_text: String,
    /// When the scheduler granted the slot: the turn's start (`None` while queued).
    granted_at: Option<Instant>,
    /// The supervisor answered it (a dispatch, a reply, a question): its exchange enters
    /// history even without a model step of the turn.
    routed: bool,
}

impl LoopState {
    /// Adds an item that happens now.
    fn push(&mut self, item: HistoryItem) {
        let at = self.clock.now_ms();
        self.push_at(item, at);
    }

    fn push_at(&mut self, item: HistoryItem, at_ms: u64) {
        self.items.push(item);
        self.item_times_ms.push(at_ms);
    }

    /// The end of a task whose message could not be stored ([`stored_gate`]): it keeps no
    /// history, like a task that never got a model call.
    fn end_unstored(mut self, error: AgentError) -> TaskOutcome {
        self.items.clear();
        self.item_times_ms.clear();
        self.end(status_of(&error), Some(error))
    }

    fn end(mut self, status: TaskStatus, error: Option<AgentError>) -> TaskOutcome {
        if let Some(granted_at) = self.granted_at {
            metrics::turn_finished(status, granted_at.elapsed());
        }
        // A task that never got a model call leaves no history: its message was not
        // processed (cancelled while queued, or its prompt was over budget — which would
        // otherwise make every later turn fail too). The rollout rebuild does the same.
        if self.stats.steps == 0 && !self.routed {
            self.items.clear();
            self.item_times_ms.clear();
        }
        TaskOutcome {
            status,
            text: self.last_text,
            stats: self.stats,
            error,
            items: self.items,
            item_times_ms: self.item_times_ms,
        }
    }
}

/// Whether a call goes to an MCP server (S11): an offered tool that is neither a built-in
/// nor one of troupe's own (the capability registry's, `dispatch_module`).
pub fn is_mcp_tool(name: &str, offered: &[ToolSpec]) -> bool {
    offered.iter().any(|t| t.name == name)
        && crate::tools::is_external(name)
        && !crate::capabilities::is_capability_tool(name)
        && name != crate::modules::DISPATCH_MODULE_TOOL
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The local count of a step's completion (T5) when its provider reported no usage: the
/// tokens of its text and of each tool call as the prompt would frame it. `None` when the
/// provider reported usage (its numbers are the ones that count).
pub fn completion_tokens(tokens: &dyn TokenCounter, response: &ModelResponse) -> Option<u64> {
    if response.usage.is_some() {
        return None;
    }
    let text = if response.text.is_empty() {
        0
    } else {
        tokens.count(&response.text)
    };
    let calls: usize = response
        .tool_calls
        .iter()
        .map(|c| tokens.count(&c.name) + tokens.count(&c.arguments.0.to_string()))
        .sum();
    Some(u64::try_from(text + calls).unwrap_or(u64::MAX))
}

/// The status a failure ends a task with.
pub fn status_of(error: &AgentError) -> TaskStatus {
    match error {
        AgentError::Cancelled { .. } => TaskStatus::Cancelled,
        _ => TaskStatus::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::ToolFailureKind;
    use std::sync::atomic::AtomicUsize;
    use troupe_proto::Json;

    /// A lease counting what it is asked to do; its slot comes back at once.
    fn counting_lease() -> (SlotLease, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (gave, asked) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (g, a) = (gave.clone(), asked.clone());
        let lease = SlotLease::new(
            move || {
                g.fetch_add(1, Ordering::SeqCst);
            },
            move |granted| {
                a.fetch_add(1, Ordering::SeqCst);
                let _ = granted.send(Ok(()));
            },
        );
        (lease, gave, asked)
    }

    #[tokio::test(start_paused = true)]
    async fn a_quick_answer_keeps_the_slot_and_a_slow_one_gives_it_back_for_the_wait() {
        let cancel = CancellationToken::new();
        let (lease, gave, asked) = counting_lease();
        let quick = lease
            .wait_for_human(&cancel, "x", async {
                tokio::time::sleep(HUMAN_GRACE / 2).await;
                1
            })
            .await;
        assert_eq!(quick.unwrap(), 1);
        assert_eq!(
            (gave.load(Ordering::SeqCst), asked.load(Ordering::SeqCst)),
            (0, 0)
        );
        let slow = lease
            .wait_for_human(&cancel, "x", async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                2
            })
            .await;
        assert_eq!(slow.unwrap(), 2);
        assert_eq!(
            (gave.load(Ordering::SeqCst), asked.load(Ordering::SeqCst)),
            (1, 1)
        );
        assert!(!lease.is_out(), "back once granted");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancel_during_the_wait_ends_it_without_asking_for_the_slot() {
        let cancel = CancellationToken::new();
        let (lease, gave, asked) = counting_lease();
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            c.cancel();
        });
        let r = lease
            .wait_for_human(
                &cancel,
                "cancelled while waiting",
                std::future::pending::<()>(),
            )
            .await;
        assert_eq!(r.unwrap_err().kind(), troupe_proto::ErrorKind::Cancelled);
        assert_eq!(
            (gave.load(Ordering::SeqCst), asked.load(Ordering::SeqCst)),
            (1, 0)
        );
        assert!(lease.is_out(), "still out: the task ends without it");
    }

    #[test]
    fn retry_follows_the_failure_kind_not_its_text() {
        // A tool that is not there is refused again, whatever its name.
        assert!(!ToolFailure::unknown_tool("gone__tool").retryable());
        // A tool that ran and failed may do better next time, even when its output reads
        // like a refusal.
        let failed = ToolFailure::from(AgentError::ToolError {
            name: "flaky".into(),
            message: "unknown tool `flaky` (said the tool)".into(),
        });
        assert_eq!(failed.kind, ToolFailureKind::Failed);
        assert!(failed.retryable());
        assert!(
            ToolFailure::from(AgentError::McpError {
                server: "s".into(),
                message: "connection reset".into(),
            })
            .retryable()
        );
        // Refusals and denials will not change.
        for error in [
            AgentError::ApprovalDenied {
                command: vec!["rm".into()],
                reason: "no".into(),
            },
            AgentError::SandboxError {
                message: "read-only".into(),
            },
            AgentError::InvalidInput {
                message: "bad patch".into(),
            },
            AgentError::cancelled("closed"),
        ] {
            assert!(!ToolFailure::from(error.clone()).retryable(), "{error:?}");
        }
    }

    fn spec(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: Json::empty_object(),
        }
    }

    fn call(name: &str, args: serde_json::Value) -> ToolCall {
        ToolCall {
            call_id: "c1".into(),
            name: name.into(),
            arguments: Json(args),
        }
    }

    #[test]
    fn completions_are_counted_locally_only_without_provider_usage() {
        let tokens = crate::ports::ApproxTokens;
        let mut response = ModelResponse {
            text: "the answer is forty-two".into(),
            tool_calls: vec![call("shell", serde_json::json!({"command": ["ls"]}))],
            ..ModelResponse::default()
        };
        let local = completion_tokens(&tokens, &response).unwrap();
        let expected = tokens.count("the answer is forty-two")
            + tokens.count("shell")
            + tokens.count(r#"{"command":["ls"]}"#);
        assert_eq!(local, expected as u64);
        assert!(local > 0);
        response.usage = Some(troupe_proto::Usage::default());
        assert_eq!(completion_tokens(&tokens, &response), None);
    }

    /// C1: the model is offered only what can run. Every built-in offered with every
    /// preference on routes to its runner for a well-formed call; none is refused as unknown
    /// or unavailable.
    #[test]
    fn every_offered_builtin_routes_to_a_runner() {
        let all = crate::tools::ToolPrefs {
            shell: true,
            plan: true,
            apply_patch: true,
            web_search: true,
        };
        let tools = crate::tools::builtin_tools(&all);
        assert!(!tools.is_empty());
        for spec in &tools {
            let args = match spec.name.as_str() {
                crate::tools::SHELL => serde_json::json!({"command": ["true"]}),
                crate::tools::UPDATE_PLAN => serde_json::json!({"plan": []}),
                crate::tools::APPLY_PATCH => serde_json::json!({
                    "input": "*** Begin Patch\n*** Delete File: a.txt\n*** End Patch\n"
                }),
                other => panic!("a built-in with no runner is offered: {other}"),
            };
            let route = route_tool(
                &call(&spec.name, args),
                &tools,
                ApprovalPolicy::Never,
                false,
            );
            assert!(
                !matches!(route, ToolRoute::Refuse(_)),
                "{}: {route:?}",
                spec.name
            );
        }
    }

    #[test]
    fn only_what_reaches_outside_the_task_is_played_back_in_a_replay() {
        let tools = [
            spec("shell"),
            spec("update_plan"),
            spec("apply_patch"),
            spec("srv__echo"),
        ];
        let route = |name: &str, args| {
            route_tool(&call(name, args), &tools, ApprovalPolicy::Never, true).has_effects()
        };
        assert!(route(
            "shell",
            serde_json::json!({"command": ["touch", "x"]})
        ));
        assert!(route(
            "apply_patch",
            serde_json::json!({"input": "*** Begin Patch\n*** Delete File: a.txt\n*** End Patch\n"})
        ));
        assert!(route("srv__echo", serde_json::json!({})));
        assert!(!route("update_plan", serde_json::json!({"plan": []})));
        assert!(
            !route("nope", serde_json::json!({})),
            "a refusal runs nothing"
        );
        assert!(
            !route("shell", serde_json::json!({})),
            "nor does a malformed call"
        );
    }

    #[test]
    fn only_offered_external_tools_count_as_mcp_calls() {
        let offered = [
            spec("shell"),
            spec("srv__echo"),
            spec("capability_inspect"),
            spec("capability_run"),
            spec("dispatch_module"),
        ];
        assert!(is_mcp_tool("srv__echo", &offered));
        assert!(!is_mcp_tool("shell", &offered));
        for own in ["capability_inspect", "capability_run", "dispatch_module"] {
            assert!(!is_mcp_tool(own, &offered), "{own} is troupe's own");
        }
        assert!(
            !is_mcp_tool("srv__other", &offered),
            "not offered: refused, never sent"
        );
    }

    #[test]
    fn unknown_tool_is_refused() {
        let r = route_tool(
            &call("nope", serde_json::json!({})),
            &[spec("shell")],
            ApprovalPolicy::Always,
            true,
        );
        assert!(matches!(r, ToolRoute::Refuse(ref f) if *f == ToolFailure::unknown_tool("nope")));
    }

    #[test]
    fn shell_asks_first_only_under_always() {
        let tools = [spec("shell")];
        let c = call("shell", serde_json::json!({"command": ["echo", "hi"]}));
        let shell = |needs_approval| ToolRoute::Shell {
            args: ShellArgs {
                argv: vec!["echo".into(), "hi".into()],
                workdir: None,
                timeout: None,
            },
            needs_approval,
        };
        // on-failure runs it sandboxed first; the sandbox's refusal is what asks.
        assert_eq!(
            route_tool(&c, &tools, ApprovalPolicy::OnFailure, false),
            shell(false)
        );
        assert_eq!(
            route_tool(&c, &tools, ApprovalPolicy::Always, false),
            shell(true)
        );
        assert_eq!(
            route_tool(&c, &tools, ApprovalPolicy::Never, false),
            shell(false)
        );
    }

    #[test]
    fn only_a_refused_access_under_a_confining_sandbox_is_the_sandboxs_failure() {
        use crate::ports::ExecOutput;
        let failed = |code: Option<i32>, stderr: &str| ExecOutput {
            exit_code: code,
            stderr: stderr.into(),
            ..ExecOutput::default()
        };
        let denied = failed(Some(1), "sh: 1: cannot create /x: Permission denied\n");
        assert_eq!(
            sandbox_failure(&denied, SandboxPolicy::ReadOnly),
            Some("Permission denied")
        );
        assert_eq!(
            sandbox_failure(&denied, SandboxPolicy::WorkspaceWrite),
            Some("Permission denied")
        );
        assert_eq!(
            sandbox_failure(
                &failed(Some(2), "rm: Operation not permitted"),
                SandboxPolicy::ReadOnly
            ),
            Some("Operation not permitted")
        );
        assert_eq!(
            sandbox_failure(
                &failed(
                    Some(1),
                    "ln: failed to create hard link 'w/p' => '/etc/passwd': Invalid cross-device link"
                ),
                SandboxPolicy::WorkspaceWrite
            ),
            Some("Invalid cross-device link")
        );
        // Not confined, not refused, or not a plain failure: the command's own business.
        assert_eq!(sandbox_failure(&denied, SandboxPolicy::FullAccess), None);
        assert_eq!(
            sandbox_failure(&failed(Some(1), "no such file"), SandboxPolicy::ReadOnly),
            None
        );
        assert_eq!(
            sandbox_failure(
                &failed(Some(0), "Permission denied"),
                SandboxPolicy::ReadOnly
            ),
            None
        );
        assert_eq!(
            sandbox_failure(&failed(None, "Permission denied"), SandboxPolicy::ReadOnly),
            None
        );
        let timed_out = ExecOutput {
            timed_out: true,
            ..denied.clone()
        };
        assert_eq!(sandbox_failure(&timed_out, SandboxPolicy::ReadOnly), None);
    }

    #[test]
    fn malformed_shell_args_are_refused() {
        let tools = [spec("shell")];
        for (args, says) in [
            (serde_json::json!({}), "needs `command`"),
            (serde_json::json!(["ls"]), "must be an object"),
            (serde_json::json!({"command": []}), "non-empty array"),
            (serde_json::json!({"command": [1]}), "non-empty array"),
            (serde_json::json!({"command": "ls -l"}), "array of strings"),
            // A NUL could spell the approval key of another kind of request.
            (
                serde_json::json!({"command": ["\0unsandboxed", "make"]}),
                "NUL",
            ),
            (
                serde_json::json!({"command": ["\0cwd", "/", "rm", "-rf", "x"]}),
                "NUL",
            ),
            (
                serde_json::json!({"command": ["ls"], "workdir": "a\0b"}),
                "NUL",
            ),
            // Held to the schema: nothing ill-typed or unknown is ignored.
            (
                serde_json::json!({"command": ["ls"], "workdir": 7}),
                "`workdir` must be a string",
            ),
            (
                serde_json::json!({"command": ["ls"], "timeout_ms": "5000"}),
                "`timeout_ms`",
            ),
            (
                serde_json::json!({"command": ["ls"], "timeout_ms": 1.5}),
                "`timeout_ms`",
            ),
            (
                serde_json::json!({"command": ["ls"], "timeout_ms": -1}),
                "`timeout_ms`",
            ),
            (
                serde_json::json!({"command": ["ls"], "timeout_ms": 0}),
                "`timeout_ms`",
            ),
            (
                serde_json::json!({"command": ["ls"], "cwd": "/"}),
                "unknown argument `cwd`",
            ),
        ] {
            let route = route_tool(
                &call("shell", args.clone()),
                &tools,
                ApprovalPolicy::Always,
                false,
            );
            let ToolRoute::Refuse(failure) = route else {
                panic!("{args} was not refused: {route:?}");
            };
            assert_eq!(
                failure.error.kind(),
                troupe_proto::ErrorKind::InvalidInput,
                "{args}"
            );
            assert!(
                failure.error.to_string().contains(says),
                "{args}: {}",
                failure.error
            );
        }
        assert_eq!(
            shell_args(&serde_json::json!({
                "command": ["make"], "workdir": "sub", "timeout_ms": 1500
            }))
            .unwrap(),
            ShellArgs {
                argv: vec!["make".into()],
                workdir: Some("sub".into()),
                timeout: Some(Duration::from_millis(1500)),
            }
        );
    }

    #[test]
    fn a_command_timeout_defaults_to_the_sessions_and_is_held_to_its_maximum() {
        let limits = TaskLimits {
            exec_timeout: Duration::from_secs(60),
            exec_timeout_max: Duration::from_secs(600),
            ..TaskLimits::default()
        };
        assert_eq!(command_timeout(None, &limits), Duration::from_secs(60));
        assert_eq!(
            command_timeout(Some(Duration::from_secs(5)), &limits),
            Duration::from_secs(5)
        );
        assert_eq!(
            command_timeout(Some(Duration::from_secs(3600)), &limits),
            Duration::from_secs(600)
        );
        assert_eq!(
            command_timeout(Some(Duration::from_millis(u64::MAX)), &limits),
            Duration::from_secs(600)
        );
    }

    /// What can be checked before a call runs is checked when it is routed, before any
    /// authorization token is used for it.
    #[test]
    fn calls_of_the_wrong_shape_are_refused_when_routed() {
        let tools = [
            spec("update_plan"),
            spec("srv__echo"),
            spec("dispatch_agent"),
            spec("dispatch_module"),
        ];
        let route =
            |name: &str, args| route_tool(&call(name, args), &tools, ApprovalPolicy::Never, true);
        for (name, args) in [
            ("srv__echo", serde_json::json!([1])),
            ("srv__echo", serde_json::json!("text")),
            ("update_plan", serde_json::json!({"plan": "do it"})),
            ("dispatch_agent", serde_json::json!({"agent_id": "coder"})),
            ("dispatch_module", serde_json::json!({"payload": 1})),
        ] {
            assert!(
                matches!(route(name, args.clone()), ToolRoute::Refuse(_)),
                "{name} {args}"
            );
        }
        assert_eq!(
            route("srv__echo", serde_json::json!({})),
            ToolRoute::External
        );
        assert_eq!(
            route("srv__echo", serde_json::Value::Null),
            ToolRoute::External
        );
        assert_eq!(
            route(
                "dispatch_agent",
                serde_json::json!({"agent_id": "coder", "input": "hi"})
            ),
            ToolRoute::DispatchAgent {
                agent_id: "coder".into(),
                input: "hi".into()
            }
        );
        assert_eq!(
            route(
                "dispatch_module",
                serde_json::json!({"module": "notify", "payload": 1})
            ),
            ToolRoute::DispatchModule {
                module: "notify".into(),
                payload: serde_json::json!(1)
            }
        );
        assert!(matches!(
            route("update_plan", serde_json::json!({"plan": []})),
            ToolRoute::Plan(_)
        ));
    }

    #[test]
    fn apply_patch_is_parsed_when_routed() {
        let tools = [spec("apply_patch")];
        let input = "*** Begin Patch\n*** Delete File: a.txt\n*** End Patch\n";
        let c = call("apply_patch", serde_json::json!({ "input": input }));
        match route_tool(&c, &tools, ApprovalPolicy::OnFailure, false) {
            ToolRoute::ApplyPatch {
                patch,
                needs_approval,
            } => {
                assert!(needs_approval);
                assert_eq!(
                    apply_patch::approval_command(&patch),
                    ["apply_patch", "delete a.txt"]
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            route_tool(&c, &tools, ApprovalPolicy::Never, false),
            ToolRoute::ApplyPatch {
                needs_approval: false,
                ..
            }
        ));
        for args in [
            serde_json::json!({}),
            serde_json::json!({"input": "not a patch"}),
        ] {
            assert!(matches!(
                route_tool(
                    &call("apply_patch", args),
                    &tools,
                    ApprovalPolicy::Always,
                    false
                ),
                ToolRoute::Refuse(ToolFailure {
                    error: AgentError::InvalidInput { .. },
                    kind: ToolFailureKind::Failed,
                })
            ));
        }
        // Not offered (the conversation did not ask for it): unknown.
        assert!(matches!(
            route_tool(&c, &[spec("shell")], ApprovalPolicy::Always, false),
            ToolRoute::Refuse(ToolFailure {
                error: AgentError::ToolError { .. },
                kind: ToolFailureKind::UnknownTool,
            })
        ));
    }

    #[test]
    fn patch_errors_map_to_refusals_and_tool_errors() {
        assert!(matches!(
            patch_error(PatchError::OutsideWorkspace("x".into())),
            AgentError::SandboxError { .. }
        ));
        assert!(matches!(
            patch_error(PatchError::Apply("x".into())),
            AgentError::ToolError { .. }
        ));
        assert!(matches!(
            patch_error(PatchError::Parse {
                line: 1,
                message: "x".into()
            }),
            AgentError::InvalidInput { .. }
        ));
    }

    #[test]
    fn a_runner_acts_only_on_the_answer_of_the_current_scheduler() {
        let (asked, other) = (ActorId::Local(1), ActorId::Local(2));
        let full = AgentError::Overloaded {
            resource: "scheduler queue".into(),
            limit: 1,
        };
        assert_eq!(first_answer(asked, asked, Some(&Ok(()))), FirstAnswer::Run);
        assert_eq!(
            first_answer(asked, asked, Some(&Err(full.clone()))),
            FirstAnswer::End(full.clone())
        );
        // Replaced meanwhile: the grant of the old one does not count by itself.
        assert_eq!(
            first_answer(asked, other, Some(&Ok(()))),
            FirstAnswer::AskConversation
        );
        assert_eq!(
            first_answer(asked, other, Some(&Err(full))),
            FirstAnswer::AskConversation
        );
        assert_eq!(
            first_answer(asked, asked, None),
            FirstAnswer::AskConversation
        );
    }

    #[test]
    fn a_view_follows_the_pool() {
        assert_eq!(view_step(0, 0, Some(false)), ViewStep::Use);
        assert_eq!(view_step(0, 1, Some(true)), ViewStep::Reopen);
        assert_eq!(view_step(0, 1, Some(false)), ViewStep::Reopen);
        assert_eq!(view_step(1, 1, Some(true)), ViewStep::AwaitPool);
        assert_eq!(view_step(1, 1, None), ViewStep::Unavailable);
        assert_eq!(view_step(1, 2, None), ViewStep::Reopen);
    }

    #[test]
    fn external_tools_need_a_view() {
        let tools = [spec("srv__echo")];
        let c = call("srv__echo", serde_json::json!({}));
        assert_eq!(
            route_tool(&c, &tools, ApprovalPolicy::Always, true),
            ToolRoute::External
        );
        assert!(matches!(
            route_tool(&c, &tools, ApprovalPolicy::Always, false),
            ToolRoute::Refuse(_)
        ));
    }
}
