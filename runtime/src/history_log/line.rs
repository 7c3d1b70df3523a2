//! The line format of the JSONL history: the eight keys, the `meta` object and the token
//! counts. Field order is key order on disk.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use troupe_proto::{
    ApprovalId, ConversationId, ErrorKind, SessionId, TaskId, TaskStats, TaskStatus, Usage,
};

/// The `type` of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineType {
    SessionStart,
    TurnStart,
    AssistantChunk,
    Assistant,
    Action,
    Observation,
    Final,
    TurnEnd,
    Error,
    Approval,
    Warning,
    SessionEnd,
    /// Agents (seed 003 §9.1): a provider session opened, bound, resumed.
    SessionCreated,
    SessionBound,
    SessionResumed,
    /// The supervisor's decision about an input.
    RouteDecided,
    /// A dispatch to an agent left / ended.
    DispatchSent,
    DispatchResult,
    /// A dispatch refused before it ran.
    PolicyRejected,
    /// The supervisor asked the human.
    AskHuman,
    /// An agent's answers did not match its output schema (A8).
    GuardrailFailed,
}

/// The `role` of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineRole {
    System,
    User,
    Assistant,
    Tool,
}

/// One line of the history. Field order is the key order on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryLine {
    /// RFC 3339 UTC with milliseconds.
    pub ts: String,
    pub session_id: SessionId,
    /// From 1 per session; 0 outside a turn.
    pub turn: u32,
    /// From 1 per turn; 0 outside a step.
    pub step: u32,
    #[serde(rename = "type")]
    pub kind: LineType,
    pub content: String,
    pub role: LineRole,
    pub meta: LineMeta,
}

/// `meta` of a line. Absent fields are not written; the declared order is the key order.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LineMeta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<ConversationId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<TaskId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Warning code (`gap` for a lagging receiver).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Events a lagging receiver lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<ApprovalId>,
    /// `pending`, or the answer's name (`approve_once`, `deny`, `timed_out`...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    /// Why an approval is asked (content: kept under `Full` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Kind of an `error` line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<TaskStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorMeta>,
    /// The task ignored cancellation and was aborted after `waited_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aborted: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Bytes of content the storage policy kept off the line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chars: Option<u64>,
    /// Turns started in this run (on `session_end`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns: Option<u32>,
    /// Turns that never ended in this run (on `session_end`, when some did not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unfinished: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenMeta>,
    /// The agent of an agent line (an id, never content).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The provider session the agent is bound to, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_session_id: Option<String>,
    /// `model`, `acp` or `a2a`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dispatch_id: Option<String>,
    /// The execution chain, outermost first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain: Option<Vec<String>>,
    /// A route decision's confidence, 0 to 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    /// Who decided a route: `model`, `rules` or `hub`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// How a dispatch ended: `ok`, `error`, `cancelled`, `expired`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// The caller's `session_start` extras (mode, model, tokenizer...), and unknown keys
    /// when reading.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// The failure that ended a turn. `message` is content (kept under `Full` only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorMeta {
    pub kind: ErrorKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Token counts of a step, a turn or a session (T5). Two sources, in separate fields:
/// `estimated_*` are troupe's own counts (the local tokenizer), `input` to `total` are what
/// the provider reported. `source` says which steps the provider numbers cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Tokens {
    /// Local estimate of the prompt(s), before the model call.
    pub estimated_prompt: u64,
    /// Local count of the completions the provider reported no usage for (0 when it always
    /// did).
    #[serde(default)]
    pub estimated_completion: u64,
    /// Provider usage (0 when the provider reported none).
    pub input: u64,
    pub output: u64,
    pub cached: u64,
    pub reasoning: u64,
    /// `input + output`.
    pub total: u64,
    /// Where the usage numbers come from; absent when no step ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<UsageSource>,
}

/// Which steps the provider's usage covers (T5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageSource {
    /// Every step's usage came from the provider; `estimated_completion` is 0.
    Provider,
    /// The provider reported none: `input` to `total` are 0, and the completions were counted
    /// locally into `estimated_completion`.
    Local,
    /// Some steps had provider usage, others were counted locally.
    Mixed,
}

impl UsageSource {
    /// The source of two counts added together.
    pub fn combine(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (None, x) | (x, None) => x,
            (Some(a), Some(b)) if a == b => Some(a),
            _ => Some(Self::Mixed),
        }
    }
}

impl Tokens {
    /// A step's counts: its prompt estimate, the provider's usage if any, otherwise the
    /// local count of its completion.
    pub fn new(
        estimated_prompt: u64,
        usage: Option<&Usage>,
        estimated_completion: Option<u64>,
    ) -> Self {
        let source = Some(if usage.is_some() {
            UsageSource::Provider
        } else {
            UsageSource::Local
        });
        let usage = usage.copied().unwrap_or_default();
        Self {
            estimated_prompt,
            estimated_completion: estimated_completion.unwrap_or_default(),
            input: usage.input_tokens,
            output: usage.output_tokens,
            cached: usage.cached_tokens,
            reasoning: usage.reasoning_tokens,
            total: usage.total(),
            source,
        }
    }

    /// A task's counts, from its own statistics.
    pub fn of_task(stats: &TaskStats) -> Self {
        let usage = &stats.usage;
        Self {
            estimated_prompt: stats.estimated_prompt_tokens,
            estimated_completion: stats.estimated_completion_tokens,
            input: usage.input_tokens,
            output: usage.output_tokens,
            cached: usage.cached_tokens,
            reasoning: usage.reasoning_tokens,
            total: usage.total(),
            source: source_of(stats.steps, stats.steps_with_usage),
        }
    }

    /// Adds `other` to these counts.
    pub fn add(&mut self, other: &Tokens) {
        self.estimated_prompt += other.estimated_prompt;
        self.estimated_completion += other.estimated_completion;
        self.input += other.input;
        self.output += other.output;
        self.cached += other.cached;
        self.reasoning += other.reasoning;
        self.total += other.total;
        self.source = UsageSource::combine(self.source, other.source);
    }
}

/// The source of a turn's usage: `steps` model calls, `with_usage` of them reported by the
/// provider.
pub fn source_of(steps: u32, with_usage: u32) -> Option<UsageSource> {
    match (steps, with_usage) {
        (0, _) => None,
        (s, w) if w >= s => Some(UsageSource::Provider),
        (_, 0) => Some(UsageSource::Local),
        _ => Some(UsageSource::Mixed),
    }
}

/// The tokens of one step, as listed on `turn_end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepTokens {
    pub step: u32,
    #[serde(flatten)]
    pub tokens: Tokens,
}

/// `meta.tokens`: counts, and on `turn_end` the steps they come from.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TokenMeta {
    #[serde(flatten)]
    pub totals: Tokens,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepTokens>,
}
