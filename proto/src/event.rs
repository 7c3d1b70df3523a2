//! The event envelope (S11): every event carries its session, conversation and task, the
//! legacy `sub_id` for older consumers, and the trace/span ids that tie it to OpenTelemetry.
//! `seq` is assigned by the session's rollout, strictly increasing per session, so a client
//! can resume a stream after the last `seq` it saw.

use crate::agent::{
    AgentUpdateKind, DispatchStatus, ExecutionChain, PolicyReason, ProviderKind, RouteDecision,
    RouteSource,
};
use crate::api::{CloseOutcome, ConversationStats};
use crate::approval::{ApprovalDecision, ApprovalSubject};
use crate::error::AgentError;
use crate::ids::{ApprovalId, ConversationId, DispatchId, SessionId, TaskId};
use crate::item::Usage;
use crate::names::{EventName, WarningCode};
use crate::policy::StoragePolicy;
use crate::store::MessageStatus;
use crate::task::{TaskStats, TaskStatus};
use crate::tool::{PlanStep, ToolCall};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One event, as published to subscribers and (policy permitting) recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventEnvelope {
    /// Per-session sequence number, from 1.
    pub seq: u64,
    /// Unix milliseconds.
    pub ts_ms: u64,
    pub session_id: SessionId,
    pub conversation_id: Option<ConversationId>,
    pub task_id: Option<TaskId>,
    /// Legacy correlation id (`<conversation>/<task>`), kept for older consumers.
    pub sub_id: Option<String>,
    /// W3C trace id (32 hex digits) of the span that produced the event.
    pub trace_id: Option<String>,
    /// W3C span id (16 hex digits).
    pub span_id: Option<String>,
    pub event: EventKind,
}

/// What happened. Content-bearing fields are the ones a storage policy may strip.
///
/// In JSON (and other human-readable formats) an event kind is adjacently tagged:
/// `{"kind": "task_started", "payload": {"input": "..."}}`. In binary formats it is externally
/// tagged (variant index, then fields), because bincode cannot read an adjacent tag; see
/// `wire` below.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EventKind {
    /// A conversation was opened (or reopened from the store).
    ConversationOpened {
        storage_policy: StoragePolicy,
        base_instructions: Option<String>,
        user_instructions: Option<String>,
    },
    /// A conversation was closed; `outcome` tells whether a task had to be force-aborted.
    ConversationClosed { outcome: CloseOutcome },
    /// A conversation actor failed and was restarted from its rollout.
    ConversationRestarted { reason: String, restored_items: u64 },
    /// A task started for a user message.
    TaskStarted { input: String },
    /// A task ended. `text` is the final reply.
    TaskFinished {
        status: TaskStatus,
        text: String,
        stats: TaskStats,
        error: Option<AgentError>,
    },
    /// A task ignored cancellation past the close timeout and was aborted.
    TaskAborted { waited_ms: u64 },
    /// A step (one model call) started.
    StepStarted { turn: u32, step: u32 },
    /// Streamed assistant text.
    AssistantChunk { delta: String },
    /// A complete assistant message of one step.
    AssistantMessage { text: String },
    /// The model called a tool (the seed's `tool_call`); `agent_id`: the agent whose task
    /// called it (`None`: the session's own conversation).
    ToolCallStarted {
        call: ToolCall,
        agent_id: Option<String>,
    },
    /// A tool call ended (its output, or the observation that stands for it): the seed's
    /// `tool_result`, or `tool_error` when `is_error`.
    ToolCallFinished {
        call_id: String,
        name: String,
        output: String,
        is_error: bool,
        duration_ms: u64,
        agent_id: Option<String>,
    },
    /// A command (or an MCP server's request, see `subject`) waits for a human.
    ApprovalRequested {
        approval_id: ApprovalId,
        command: Vec<String>,
        reason: String,
        /// What is asked; `command` unless an MCP server asks (elicitation, sampling).
        subject: ApprovalSubject,
    },
    /// A pending approval was answered (or timed out into a denial).
    ApprovalResolved {
        approval_id: ApprovalId,
        decision: ApprovalDecision,
    },
    /// Older history was trimmed and replaced by a summary (S6).
    HistoryTrimmed { removed_items: u64, summary: String },
    /// Something worth a human's attention that did not fail the task.
    Warning { code: WarningCode, message: String },
    /// A failure, with its kind and detail.
    Error { error: AgentError },
    /// A step ended: the local estimate of its prompt and the provider's usage (T5).
    StepFinished {
        turn: u32,
        step: u32,
        estimated_prompt_tokens: u64,
        usage: Option<Usage>,
        /// The local count of the step's completion (its text and tool calls), made only when
        /// the provider reported no usage (`usage` is `None`). Absent in older records.
        estimated_completion_tokens: Option<u64>,
    },
    /// A compaction task started: the model summarises the history under a one-turn
    /// override (C3). Its items never enter history.
    CompactionStarted {},
    /// The history was replaced by the compaction's summary.
    Compacted {
        summary: String,
        replaced_items: u64,
    },
    /// The model recorded its plan with the `update_plan` built-in: the whole plan, in order.
    PlanUpdated {
        explanation: Option<String>,
        plan: Vec<PlanStep>,
    },
    /// An MCP server reported progress (`notifications/progress`) on a running tool call.
    ToolProgress {
        call_id: String,
        progress: f64,
        total: Option<f64>,
        message: Option<String>,
    },
    /// An MCP server of the session connected and listed its tools (`tools` offered).
    McpServerReady { server: String, tools: u32 },
    /// A stored user message changed status (the service's durable queue): it started, or
    /// reached its outcome (with its task and, when it has one, its reply's message id).
    MessageUpdated {
        message_id: u64,
        status: MessageStatus,
        task_id: Option<TaskId>,
        reply_message_id: Option<u64>,
    },
    /// Where a restore of the conversation may start (S6), written after each trim,
    /// compaction or new summary of its history: the summary in front of the kept items, the
    /// task whose records hold the oldest kept item (`None`: no item is kept) and how many of
    /// that task's items were trimmed, and the conversation's turns and statistics so far (the
    /// records after this one add to them). A restore reads the newest checkpoint and the
    /// records from `from_task`'s first one on, not the whole record.
    HistoryCheckpoint {
        summary: Option<String>,
        /// Items the summary stands for.
        replaced_items: u64,
        from_task: Option<TaskId>,
        skip_items: u64,
        turns: u32,
        stats: ConversationStats,
    },
    /// A provider session was opened for an agent (A1), for the dispatch `dispatch_id`.
    SessionCreated {
        agent_id: String,
        provider: ProviderKind,
        provider_session_id: String,
        dispatch_id: Option<DispatchId>,
    },
    /// An agent of this session is bound to a provider session: the next dispatches resume
    /// it. `replaced`: the provider session of the binding it replaces, which could not be
    /// resumed (a `binding_replaced` warning says why).
    SessionBound {
        agent_id: String,
        provider: ProviderKind,
        provider_session_id: String,
        replaced: Option<String>,
        dispatch_id: Option<DispatchId>,
    },
    /// An agent's bound provider session was taken up again (the first dispatch of a run to
    /// a binding made before).
    SessionResumed {
        agent_id: String,
        provider: ProviderKind,
        provider_session_id: String,
        dispatch_id: Option<DispatchId>,
    },
    /// The supervisor decided what to do with an input (A3); `agent_id` for
    /// `dispatch_agent`, `module` for `dispatch_module`; `reason` is the supervisor's own.
    RouteDecided {
        decision: RouteDecision,
        agent_id: Option<String>,
        module: Option<String>,
        confidence: f64,
        source: RouteSource,
        reason: String,
    },
    /// A dispatch to an agent left, holding its lease (`lease_ttl_ms`); `chain` ends with the
    /// agent; `provider_session_id` is its binding when it has one already.
    DispatchSent {
        dispatch_id: DispatchId,
        agent_id: String,
        provider: ProviderKind,
        provider_session_id: Option<String>,
        chain: ExecutionChain,
        lease_ttl_ms: u64,
        input: String,
    },
    /// A dispatch ended: answered (`text`), failed, cancelled, or its lease expired (the
    /// child was cancelled and the lease reclaimed).
    DispatchResult {
        dispatch_id: DispatchId,
        agent_id: String,
        provider_session_id: Option<String>,
        status: DispatchStatus,
        text: String,
        error: Option<AgentError>,
        duration_ms: u64,
        /// `text` is the JSON an output schema of the agent validated (A8): a data answer,
        /// whatever its keys (never read as a reply form, such as A2A's `{"a2a": ...}`).
        validated: bool,
    },
    /// A dispatch was refused before it ran (A4): `chain` is the one it would have extended.
    /// Or a tool call was refused by tool governance (A5): `tool` names it, `agent_id` is the
    /// agent that called it (empty: the session's own conversation), `chain` the caller's.
    PolicyRejected {
        agent_id: String,
        chain: ExecutionChain,
        reason: PolicyReason,
        message: String,
        tool: Option<String>,
    },
    /// The supervisor asks the human a question (A3 `ask_human`); the next message answers.
    AskHuman { question: String },
    /// Progress of an external agent during a dispatch (an ACP session update, an A2A
    /// status): `text` what it says, `data` the provider's own payload.
    AgentUpdate {
        dispatch_id: DispatchId,
        agent_id: String,
        provider_session_id: String,
        update: AgentUpdateKind,
        text: String,
        data: Option<crate::json::Json>,
    },
    /// An agent's answers did not match its output schema (A8) after `attempts` tries, the
    /// model asked again each time with the errors: `status` is `exhausted`, `action` what
    /// the task did instead (failed, or asked a human). `problems` name paths and keywords,
    /// never the answer's values.
    GuardrailFailed {
        agent_id: Option<String>,
        attempts: u32,
        problems: Vec<String>,
        status: GuardrailStatus,
        action: crate::agent::GuardrailAction,
    },
}

/// How an output guardrail ended without a valid answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardrailStatus {
    /// Every retry was spent.
    Exhausted,
    /// The task ran out of steps (`max_steps`) before a valid answer: an invalid one was
    /// still to be asked for again, or the model was still calling tools.
    MaxSteps,
}

impl EventKind {
    /// The kind's name (metric label, rollout header).
    pub const fn name(&self) -> EventName {
        match self {
            Self::ConversationOpened { .. } => EventName::ConversationOpened,
            Self::ConversationClosed { .. } => EventName::ConversationClosed,
            Self::ConversationRestarted { .. } => EventName::ConversationRestarted,
            Self::TaskStarted { .. } => EventName::TaskStarted,
            Self::TaskFinished { .. } => EventName::TaskFinished,
            Self::TaskAborted { .. } => EventName::TaskAborted,
            Self::StepStarted { .. } => EventName::StepStarted,
            Self::AssistantChunk { .. } => EventName::AssistantChunk,
            Self::AssistantMessage { .. } => EventName::AssistantMessage,
            Self::ToolCallStarted { .. } => EventName::ToolCallStarted,
            Self::ToolCallFinished { .. } => EventName::ToolCallFinished,
            Self::ApprovalRequested { .. } => EventName::ApprovalRequested,
            Self::ApprovalResolved { .. } => EventName::ApprovalResolved,
            Self::HistoryTrimmed { .. } => EventName::HistoryTrimmed,
            Self::Warning { .. } => EventName::Warning,
            Self::Error { .. } => EventName::Error,
            Self::StepFinished { .. } => EventName::StepFinished,
            Self::CompactionStarted { .. } => EventName::CompactionStarted,
            Self::Compacted { .. } => EventName::Compacted,
            Self::PlanUpdated { .. } => EventName::PlanUpdated,
            Self::ToolProgress { .. } => EventName::ToolProgress,
            Self::McpServerReady { .. } => EventName::McpServerReady,
            Self::MessageUpdated { .. } => EventName::MessageUpdated,
            Self::HistoryCheckpoint { .. } => EventName::HistoryCheckpoint,
            Self::SessionCreated { .. } => EventName::SessionCreated,
            Self::SessionBound { .. } => EventName::SessionBound,
            Self::SessionResumed { .. } => EventName::SessionResumed,
            Self::RouteDecided { .. } => EventName::RouteDecided,
            Self::DispatchSent { .. } => EventName::DispatchSent,
            Self::DispatchResult { .. } => EventName::DispatchResult,
            Self::PolicyRejected { .. } => EventName::PolicyRejected,
            Self::AskHuman { .. } => EventName::AskHuman,
            Self::AgentUpdate { .. } => EventName::AgentUpdate,
            Self::GuardrailFailed { .. } => EventName::GuardrailFailed,
        }
    }
}

impl Serialize for EventKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            wire::Adjacent::serialize(self, s)
        } else {
            wire::External::serialize(self, s)
        }
    }
}

impl<'de> Deserialize<'de> for EventKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            wire::Adjacent::deserialize(d)
        } else {
            wire::External::deserialize(d)
        }
    }
}

/// The two serde shapes of [`EventKind`], derived from one mirror of its variants.
///
/// An adjacently tagged enum reads its tag with `deserialize_identifier`, which bincode does not
/// implement; the externally tagged form reads a variant index instead. `remote = "EventKind"`
/// makes the compiler check every mirror against the real enum, so a variant added there and
/// forgotten here does not build. The variant order is the binary format: append new variants.
mod wire {
    use super::*;

    macro_rules! mirror {
        ($(#[$attr:meta])* $name:ident) => {
            #[derive(Serialize, Deserialize)]
            #[serde(remote = "EventKind", rename_all = "snake_case")]
            $(#[$attr])*
            pub(super) enum $name {
                ConversationOpened {
                    storage_policy: StoragePolicy,
                    base_instructions: Option<String>,
                    user_instructions: Option<String>,
                },
                ConversationClosed { outcome: CloseOutcome },
                ConversationRestarted { reason: String, restored_items: u64 },
                TaskStarted { input: String },
                TaskFinished {
                    status: TaskStatus,
                    text: String,
                    stats: TaskStats,
                    error: Option<AgentError>,
                },
                TaskAborted { waited_ms: u64 },
                StepStarted { turn: u32, step: u32 },
                AssistantChunk { delta: String },
                AssistantMessage { text: String },
                ToolCallStarted {
                    call: ToolCall,
                    // Absent in records written before tool governance.
                    #[serde(default)]
                    agent_id: Option<String>,
                },
                ToolCallFinished {
                    call_id: String,
                    name: String,
                    output: String,
                    is_error: bool,
                    duration_ms: u64,
                    #[serde(default)]
                    agent_id: Option<String>,
                },
                ApprovalRequested {
                    approval_id: ApprovalId,
                    command: Vec<String>,
                    reason: String,
                    // Absent in records written before MCP requests were approvable.
                    #[serde(default)]
                    subject: ApprovalSubject,
                },
                ApprovalResolved {
                    approval_id: ApprovalId,
                    decision: ApprovalDecision,
                },
                HistoryTrimmed { removed_items: u64, summary: String },
                Warning { code: WarningCode, message: String },
                Error { error: AgentError },
                StepFinished {
                    turn: u32,
                    step: u32,
                    estimated_prompt_tokens: u64,
                    usage: Option<Usage>,
                    #[serde(default)]
                    estimated_completion_tokens: Option<u64>,
                },
                CompactionStarted {},
                Compacted { summary: String, replaced_items: u64 },
                PlanUpdated {
                    explanation: Option<String>,
                    plan: Vec<PlanStep>,
                },
                ToolProgress {
                    call_id: String,
                    progress: f64,
                    total: Option<f64>,
                    message: Option<String>,
                },
                McpServerReady { server: String, tools: u32 },
                MessageUpdated {
                    message_id: u64,
                    status: MessageStatus,
                    task_id: Option<TaskId>,
                    reply_message_id: Option<u64>,
                },
                HistoryCheckpoint {
                    summary: Option<String>,
                    replaced_items: u64,
                    from_task: Option<TaskId>,
                    skip_items: u64,
                    turns: u32,
                    stats: ConversationStats,
                },
            SessionCreated {
                agent_id: String,
                provider: ProviderKind,
                provider_session_id: String,
                dispatch_id: Option<DispatchId>,
            },
            SessionBound {
                agent_id: String,
                provider: ProviderKind,
                provider_session_id: String,
                replaced: Option<String>,
                dispatch_id: Option<DispatchId>,
            },
            SessionResumed {
                agent_id: String,
                provider: ProviderKind,
                provider_session_id: String,
                dispatch_id: Option<DispatchId>,
            },
            RouteDecided {
                decision: RouteDecision,
                agent_id: Option<String>,
                module: Option<String>,
                confidence: f64,
                source: RouteSource,
                reason: String,
            },
            DispatchSent {
                dispatch_id: DispatchId,
                agent_id: String,
                provider: ProviderKind,
                provider_session_id: Option<String>,
                chain: ExecutionChain,
                lease_ttl_ms: u64,
                input: String,
            },
            DispatchResult {
                dispatch_id: DispatchId,
                agent_id: String,
                provider_session_id: Option<String>,
                status: DispatchStatus,
                text: String,
                error: Option<AgentError>,
                duration_ms: u64,
                // Absent in records written before the output guardrail said so.
                #[serde(default)]
                validated: bool,
            },
            PolicyRejected {
                agent_id: String,
                chain: ExecutionChain,
                reason: PolicyReason,
                message: String,
                #[serde(default)]
                tool: Option<String>,
            },
            AskHuman { question: String },
            AgentUpdate {
                dispatch_id: DispatchId,
                agent_id: String,
                provider_session_id: String,
                update: AgentUpdateKind,
                text: String,
                data: Option<crate::json::Json>,
            },
            GuardrailFailed {
                agent_id: Option<String>,
                attempts: u32,
                problems: Vec<String>,
                status: GuardrailStatus,
                action: crate::agent::GuardrailAction,
            },
            }
        };
    }

    mirror!(
        #[serde(tag = "kind", content = "payload")]
        Adjacent
    );
    mirror!(External);
}
