//! What the rollout stores of an event: [`RolloutRecord`] at its [`RecordLevel`], built from
//! the event under the conversation's storage policy ([`record_for`]), its content-free
//! facts ([`RecordMeta`]), the TTL expiry and its downgrade to headers, and the kinds that
//! make the writer fsync.

use super::*;

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
    /// A task's MCP calls and their total latency (S11), so that statistics rebuilt from a
    /// task's end kept as headers (or swept to them) still count them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_calls: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_latency_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Ttl: when this record's content is due to go (unix ms). Only on `Full` records written
    /// under a `Ttl` policy; [`downgrade`] clears it with the content.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    /// The tool call a tool call's start or end is about (the model's id for it, never
    /// content): a restore counts a retried call once, as the history does, whatever expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The agent an agent event is about (an id, never content).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The provider session it is bound to, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_session_id: Option<String>,
    /// A route decision, without its reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteHeader>,
    /// How a dispatch ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dispatch: Option<troupe_proto::agent::DispatchStatus>,
    /// The dispatch a dispatch event is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dispatch_id: Option<troupe_proto::DispatchId>,
    /// The kind of provider of a dispatch's agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<troupe_proto::agent::ProviderKind>,
    /// A warning's code: a bounded name, never content (absent in older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<troupe_proto::WarningCode>,
    /// The W3C trace id of a task's span, on its end (an id, never content; absent in older
    /// records), so that a task read back without its content still links to its trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// What the headers keep of a route decision: everything but the supervisor's reason.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RouteHeader {
    pub decision: troupe_proto::agent::RouteDecision,
    pub source: troupe_proto::agent::RouteSource,
    pub confidence: f64,
}

/// One record of the rollout: a line of a conversation's rollout file, a row of a store, an
/// item of an event stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub seq: u64,
    pub ts_ms: u64,
    pub conversation_id: Option<ConversationId>,
    pub task_id: Option<TaskId>,
    /// `EventKind::name()` of the event (`Unknown`: a kind this build does not know).
    pub kind: EventName,
    pub level: RecordLevel,
    /// The event itself, only at `RecordLevel::Full`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<EventKind>,
    pub meta: RecordMeta,
}

impl RolloutRecord {
    /// A live event as a record: level `Full` with the event, whatever the conversation's
    /// policy keeps (a live subscriber sees the event itself; storage keeps what the policy
    /// allows).
    pub fn live(env: &EventEnvelope) -> Self {
        Self {
            seq: env.seq,
            ts_ms: env.ts_ms,
            conversation_id: env.conversation_id,
            task_id: env.task_id,
            kind: env.event.name(),
            level: RecordLevel::Full,
            event: Some(env.event.clone()),
            meta: headers_meta(&env.event),
        }
    }
}

/// When content written at `ts_ms` under `Ttl { secs }` is due to go (saturating: a ttl past
/// the end of time never comes due).
pub fn ttl_expiry_ms(ts_ms: u64, ttl_secs: u64) -> u64 {
    ts_ms.saturating_add(ttl_secs.saturating_mul(1000))
}

/// Whether a sweep at `now_ms` must downgrade `record`: a `Full` record whose expiry has come.
pub fn is_due(record: &RolloutRecord, now_ms: u64) -> bool {
    record.level == RecordLevel::Full && record.meta.expires_ms.is_some_and(|e| e <= now_ms)
}

/// Kinds that policy `None` keeps.
pub(super) const MINIMAL_KINDS: [EventName; 7] = [
    EventName::TaskStarted,
    EventName::TaskFinished,
    EventName::TaskAborted,
    EventName::Error,
    EventName::ConversationOpened,
    EventName::ConversationClosed,
    EventName::MessageUpdated,
];

/// Events that carry no content at all (ids, a status): every policy keeps them whole, so a
/// resuming stream replays them as they were published.
pub(super) fn content_free(event: &EventKind) -> bool {
    matches!(
        event,
        EventKind::MessageUpdated { .. }
            | EventKind::SessionCreated { .. }
            | EventKind::SessionBound { .. }
            | EventKind::SessionResumed { .. }
            | EventKind::GuardrailFailed { .. }
    )
}

/// What `policy` lets the rollout keep of `env`; `None` when it keeps nothing.
pub fn record_for(policy: StoragePolicy, env: &EventEnvelope) -> Option<RolloutRecord> {
    let kind = env.event.name();
    let (level, event, meta) = match policy {
        StoragePolicy::Full => (
            RecordLevel::Full,
            Some(env.event.clone()),
            headers_meta(&env.event),
        ),
        StoragePolicy::Ttl { secs } => (
            RecordLevel::Full,
            Some(env.event.clone()),
            RecordMeta {
                expires_ms: Some(ttl_expiry_ms(env.ts_ms, secs)),
                ..headers_meta(&env.event)
            },
        ),
        StoragePolicy::HeadersOnly => (
            RecordLevel::Headers,
            headers_event(env.event.clone()),
            headers_meta(&env.event),
        ),
        StoragePolicy::None => {
            if !MINIMAL_KINDS.contains(&kind) {
                return None;
            }
            (
                RecordLevel::Minimal,
                headers_event(env.event.clone()),
                minimal_meta(&env.event),
            )
        }
    };
    Some(RolloutRecord {
        seq: env.seq,
        ts_ms: env.ts_ms,
        conversation_id: env.conversation_id,
        task_id: env.task_id,
        kind,
        level,
        event,
        meta,
    })
}

/// Under a `Ttl` policy, makes `record` due no later than content written at `since_ms` is
/// (a history summary carries excerpts of older messages: it must not keep them on disk
/// longer than their own records do). Other policies keep no expiry.
pub fn cap_expiry(record: &mut RolloutRecord, policy: StoragePolicy, since_ms: Option<u64>) {
    let (StoragePolicy::Ttl { secs }, Some(since)) = (policy, since_ms) else {
        return;
    };
    if let Some(expires) = record.meta.expires_ms.as_mut() {
        *expires = (*expires).min(ttl_expiry_ms(since, secs));
    }
}

/// What a record reduced to its headers keeps of its event: a content-free event whole, a
/// history checkpoint without its summary (where a restore starts, its turns and statistics
/// are no content, and without them a restore would bring back items the summary had
/// replaced), a refusal without its message (which may quote a tool call an agent described:
/// its agent, chain, reason and tool name stay), nothing of any other.
pub(super) fn headers_event(event: EventKind) -> Option<EventKind> {
    match event {
        EventKind::PolicyRejected {
            agent_id,
            chain,
            reason,
            tool,
            ..
        } => Some(EventKind::PolicyRejected {
            message: format!("refused: {}", reason.as_str()),
            agent_id,
            chain,
            reason,
            tool,
        }),
        EventKind::HistoryCheckpoint {
            replaced_items,
            from_task,
            skip_items,
            turns,
            stats,
            ..
        } => Some(EventKind::HistoryCheckpoint {
            summary: None,
            replaced_items,
            from_task,
            skip_items,
            turns,
            stats,
        }),
        event if content_free(&event) => Some(event),
        _ => None,
    }
}

/// A `Full` record reduced to its headers (what the TTL sweep does); others are unchanged.
pub fn downgrade(record: RolloutRecord) -> RolloutRecord {
    match record.level {
        RecordLevel::Full => RolloutRecord {
            level: RecordLevel::Headers,
            event: record.event.and_then(headers_event),
            meta: RecordMeta {
                expires_ms: None,
                ..record.meta
            },
            ..record
        },
        RecordLevel::Headers | RecordLevel::Minimal => record,
    }
}

/// Where a restore's window starts in a conversation's records, oldest first (S6): at the
/// first record of the task the newest `history_checkpoint` (that kept its event) names, or
/// at that checkpoint when it names no task; 0 (everything) without one, or when the named
/// task's start is not among the records.
pub fn window_start(records: &[RolloutRecord]) -> usize {
    let checkpoint = records
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, r)| match &r.event {
            Some(EventKind::HistoryCheckpoint { from_task, .. }) => Some((i, *from_task)),
            _ => None,
        });
    match checkpoint {
        None => 0,
        Some((at, None)) => at,
        Some((at, Some(task))) => records[..at]
            .iter()
            .rposition(|r| r.task_id == Some(task) && r.kind == EventName::TaskStarted)
            .unwrap_or(0),
    }
}

/// Whether a record makes the writer fsync the batch it is in.
pub fn is_sync_point(kind: EventName) -> bool {
    matches!(
        kind,
        EventName::TaskFinished | EventName::TaskAborted | EventName::ConversationClosed
    )
}

/// A task's trace id as its end's headers keep it: 32 hex digits, nothing else (the field is
/// an id; whatever else it might hold is not kept).
fn trace_id(stats: &troupe_proto::TaskStats) -> Option<String> {
    let id = stats.trace_id.as_str();
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
}

/// Content-free facts of an event. `chars` counts the bytes of every content field (text,
/// input, instructions, arguments, outputs, summaries, reasons, error details).
pub(super) fn headers_meta(event: &EventKind) -> RecordMeta {
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
            mcp_calls: Some(stats.mcp_calls),
            mcp_latency_ms: Some(stats.mcp_latency_ms),
            duration_ms: Some(stats.duration_ms),
            trace_id: trace_id(stats),
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
        EventKind::ToolCallStarted { call, agent_id } => RecordMeta {
            tool: Some(call.name.clone()),
            call_id: Some(call.call_id.clone()),
            agent_id: agent_id.clone(),
            chars: Some(serde_json::to_string(&call.arguments).map_or(0, |s| len(&s))),
            ..RecordMeta::default()
        },
        EventKind::ToolCallFinished {
            call_id,
            name,
            output,
            is_error,
            duration_ms,
            agent_id,
        } => RecordMeta {
            tool: Some(name.clone()),
            call_id: Some(call_id.clone()),
            agent_id: agent_id.clone(),
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
                ApprovalSubject::Command
                | ApprovalSubject::CommandWithoutSandbox
                | ApprovalSubject::Patch => 0,
                ApprovalSubject::McpElicitation {
                    message, schema, ..
                } => len(message) + len(&schema.0.to_string()),
                ApprovalSubject::McpSampling { request, .. } => len(&request.0.to_string()),
                ApprovalSubject::AgentQuestion { question, .. } => len(question),
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
        EventKind::HistoryCheckpoint { summary, .. } => RecordMeta {
            chars: Some(summary.as_deref().map_or(0, len)),
            ..RecordMeta::default()
        },
        EventKind::Warning { code, message } => RecordMeta {
            chars: Some(len(message)),
            code: Some(*code),
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
        EventKind::SessionCreated {
            agent_id,
            provider_session_id,
            ..
        }
        | EventKind::SessionBound {
            agent_id,
            provider_session_id,
            ..
        }
        | EventKind::SessionResumed {
            agent_id,
            provider_session_id,
            ..
        } => RecordMeta {
            agent_id: Some(agent_id.clone()),
            provider_session_id: Some(provider_session_id.clone()),
            ..RecordMeta::default()
        },
        EventKind::RouteDecided {
            decision,
            agent_id,
            reason,
            confidence,
            source,
            ..
        } => RecordMeta {
            agent_id: agent_id.clone(),
            route: Some(RouteHeader {
                decision: *decision,
                source: *source,
                confidence: *confidence,
            }),
            chars: Some(len(reason)),
            ..RecordMeta::default()
        },
        EventKind::DispatchSent {
            dispatch_id,
            agent_id,
            provider,
            provider_session_id,
            input,
            ..
        } => RecordMeta {
            dispatch_id: Some(*dispatch_id),
            provider: Some(*provider),
            agent_id: Some(agent_id.clone()),
            provider_session_id: provider_session_id.clone(),
            chars: Some(len(input)),
            ..RecordMeta::default()
        },
        EventKind::DispatchResult {
            dispatch_id,
            agent_id,
            provider_session_id,
            status,
            text,
            error,
            duration_ms,
            ..
        } => RecordMeta {
            dispatch_id: Some(*dispatch_id),
            agent_id: Some(agent_id.clone()),
            provider_session_id: provider_session_id.clone(),
            dispatch: Some(*status),
            error_kind: error.as_ref().map(AgentError::kind),
            chars: Some(len(text) + error.as_ref().map_or(0, error_len)),
            duration_ms: Some(*duration_ms),
            ..RecordMeta::default()
        },
        EventKind::PolicyRejected {
            agent_id,
            message,
            tool,
            ..
        } => RecordMeta {
            agent_id: Some(agent_id.clone()),
            tool: tool.clone(),
            chars: Some(len(message)),
            ..RecordMeta::default()
        },
        EventKind::AskHuman { question } => RecordMeta {
            chars: Some(len(question)),
            ..RecordMeta::default()
        },
        EventKind::AgentUpdate {
            agent_id,
            provider_session_id,
            text,
            data,
            ..
        } => RecordMeta {
            agent_id: Some(agent_id.clone()),
            provider_session_id: Some(provider_session_id.clone()),
            chars: Some(len(text) + data.as_ref().map_or(0, |d| len(&d.0.to_string()))),
            ..RecordMeta::default()
        },
        // A kind this build does not know: keep nothing of it but its name.
        _ => RecordMeta::default(),
    }
}

/// Status and error kind (and a task end's trace id) only: what policy `None` keeps of the kinds
/// it keeps.
pub(super) fn minimal_meta(event: &EventKind) -> RecordMeta {
    match event {
        EventKind::TaskFinished {
            status,
            error,
            stats,
            ..
        } => RecordMeta {
            status: Some(*status),
            error_kind: error.as_ref().map(AgentError::kind),
            trace_id: trace_id(stats),
            ..RecordMeta::default()
        },
        EventKind::Error { error } => RecordMeta {
            error_kind: Some(error.kind()),
            ..RecordMeta::default()
        },
        _ => RecordMeta::default(),
    }
}
