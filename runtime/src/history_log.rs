//! The JSONL history of a session (T4): `<dir>/<session_id>.jsonl`, one JSON object a line,
//! written from the session's rollout: its gap-free stream of records
//! ([`HistoryFeed::of_session`]), never from the lossy live feed alone.
//!
//! # Line format
//! Every line has exactly these keys, in this order:
//! `{"ts", "session_id", "turn", "step", "type", "content", "role", "meta"}`.
//! `ts` is RFC 3339 UTC with milliseconds (the event's time); `turn` counts the session's
//! tasks from 1 in the order they started (0 on lines outside a turn); `step` is the task's
//! step (0 outside a step); `meta` is an object whose keys depend on `type`.
//!
//! | type | from | role | content | meta |
//! |---|---|---|---|---|
//! | `session_start` | [`HistoryLog::start`] | system | "" | pid, version, caller's extras (`troupe chat`: mode, model, provider, temperature, tools, approval and sandbox policies, tokenizer, cwd; never a secret) |
//! | `turn_start` | `TaskStarted` | user | the input | |
//! | `assistant_chunk` | `AssistantChunk` | assistant | the delta | |
//! | `assistant` | `AssistantMessage` | assistant | the text | tokens of the step |
//! | `action` | `ToolCallStarted` | assistant | arguments (JSON text) | tool, call_id, agent_id, event (`tool_call`) |
//! | `observation` | `ToolCallFinished` | tool | output | tool, call_id, is_error, duration_ms, agent_id, event (`tool_result` or `tool_error`) |
//! | `final` | `TaskFinished` (non-empty text) | assistant | the text | |
//! | `turn_end` | `TaskFinished`, `TaskAborted` | system | status | status, steps, tool_calls, duration_ms, error, tokens (+ `steps`) |
//! | `error` | `Error` | system | the message | kind |
//! | `approval` | `ApprovalRequested/Resolved` | system | command / denial reason | approval_id, decision, reason, ttl_secs |
//! | `warning` | `Warning`, a record the log could not read | system | the message | code (`gap`: the log could not read on) |
//! | `session_end` | [`HistoryLogHandle::finish`], or the channel closing | system | "" | turns, unfinished, tokens |
//!
//! `approval` and `warning` (and `error`) go beyond the types T4 lists. Every line of a turn
//! carries `meta.conversation_id` and `meta.task_id`, because the turns of all the session's
//! conversations interleave in one file. Events that are not listed (conversation open and
//! close, step start, history trims) write nothing.
//!
//! # Tokens (T5)
//! `StepFinished` gives a step's local prompt estimate and the provider's usage. They go into
//! the step's `assistant` line as `meta.tokens` (the line waits for them until the task's next
//! event), into `turn_end` as `meta.tokens.steps: [{step, ...}]` next to the turn's totals
//! (the task's own statistics), and the session's totals into `session_end`. When the provider
//! reported no usage for a step, the step's local completion count (`StepFinished`'s
//! `estimated_completion_tokens`) goes into `estimated_completion`; `source` (provider, local,
//! mixed) says which steps the provider's numbers cover ([`Tokens`]).
//!
//! # Storage policy (S10)
//! This file is a second copy on disk, so it obeys each conversation's [`StoragePolicy`]:
//! `Full` writes everything; `HeadersOnly` writes lines with empty content (and `meta.chars`,
//! the stripped content's size in bytes) and no chunks; `None` writes only `turn_start`,
//! `turn_end` and `error` lines, with no content and errors by kind. `Ttl` is written as
//! `HeadersOnly`: nothing sweeps this file later. The policy is learnt from
//! `ConversationOpened` events; a conversation opened before the log subscribed (the root one)
//! must be named in [`HistoryLogOptions::policies`], otherwise it gets
//! [`HistoryLogOptions::unknown_policy`] (`None` by default, as in the rollout).
//! Session-level events are written as `HeadersOnly`.
//!
//! # Writing
//! [`HistoryLog`] is the pure mapping from events to lines. [`HistoryLog::start`] writes the
//! `session_start` line, then spawns one tokio task that owns the [`HistoryFeed`] and the file:
//! it appends through a buffer (`tokio::fs`, so writes run on the blocking pool) and flushes
//! after every `turn_end`, after a warning and after a second of silence.
//!
//! The feed is the session's record stream in `seq` order: stored records, then live events.
//! When the log falls behind the live events (a burst of chunks, a slow disk), the stream
//! reads what it missed back from storage instead of skipping it, so no line is dropped under
//! load. When the stream ends before the log is finished (its session ended while it was
//! behind), [`HistoryLogHandle::finish`] reads the rest from the storage given with
//! [`HistoryFeed::with_storage`]; without one, or if that read fails, a `gap` warning says
//! after which `seq` lines may be missing. Call `finish` once the session has ended (or accept
//! that events not yet committed are left out): it writes what the stream already holds, then
//! what storage holds beyond it, then `session_end`, and flushes; dropping the handle does the
//! same unawaited. An I/O error ends the task; `finish` returns it. Reopening an existing file
//! appends to it and continues its turn numbers.
//!
//! A record read back from storage is what its conversation's policy kept: the whole event
//! (`Full`, `Ttl`) gives the same lines as the live event; headers give the same line types
//! with the sizes the headers keep and the call ids of `action` and `observation` lines (empty
//! in records written before the headers kept them), but no warning code in records written
//! before headers kept it (`unknown`), no prompt estimates, and no `approval` lines (the
//! headers keep no approval id).
//!
//! The XML export of the older format is in [`xml`].

mod line;
mod writer;
pub mod xml;

pub use line::{
    ErrorMeta, HistoryLine, LineMeta, LineRole, LineType, StepTokens, TokenMeta, Tokens,
    UsageSource, source_of,
};
pub use writer::{HistoryFeed, HistoryLogHandle, HistorySummary};
pub use xml::{export_xml, export_xml_from_lines};

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, UNIX_EPOCH};
use troupe_actors::rollout::{RecordLevel, RolloutRecord};
use troupe_proto::{
    AgentError, ApprovalDecision, ConversationId, ErrorKind, EventEnvelope, EventKind, EventName,
    Json, SessionId, StoragePolicy, TaskId, TaskStats, TaskStatus, ToolCall, WarningCode,
};

/// What the log needs to know besides the events.
#[derive(Debug, Clone)]
pub struct HistoryLogOptions {
    /// Policies of conversations opened before the log subscribed (the root conversation).
    pub policies: HashMap<ConversationId, StoragePolicy>,
    /// Policy of a conversation the log neither saw open nor was told about.
    pub unknown_policy: StoragePolicy,
    /// Added to the `session_start` meta (e.g. `mode`, `model`, `tokenizer`).
    pub session_meta: BTreeMap<String, serde_json::Value>,
}

impl Default for HistoryLogOptions {
    fn default() -> Self {
        Self {
            policies: HashMap::new(),
            // Content that no policy allowed never reaches disk.
            unknown_policy: StoragePolicy::None,
            session_meta: BTreeMap::new(),
        }
    }
}

impl HistoryLogOptions {
    /// Names the policy of a conversation that is already open.
    pub fn with_policy(mut self, conversation_id: ConversationId, policy: StoragePolicy) -> Self {
        self.policies.insert(conversation_id, policy);
        self
    }

    /// Adds a `session_start` meta entry.
    pub fn with_session_meta(
        mut self,
        key: impl Into<String>,
        value: impl Into<serde_json::Value>,
    ) -> Self {
        self.session_meta.insert(key.into(), value.into());
        self
    }
}

/// How much of a conversation's content may reach the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Full,
    Headers,
    Minimal,
}

impl Level {
    const fn of(policy: StoragePolicy) -> Self {
        match policy {
            StoragePolicy::Full => Self::Full,
            StoragePolicy::HeadersOnly | StoragePolicy::Ttl { .. } => Self::Headers,
            StoragePolicy::None => Self::Minimal,
        }
    }
}

/// A turn in progress: one task.
#[derive(Debug)]
struct Turn {
    index: u32,
    conversation_id: Option<ConversationId>,
    task_id: TaskId,
    /// The step of the task's latest `StepStarted`.
    step: u32,
    tool_calls: u32,
    /// `StepFinished` records, in arrival order.
    steps: Vec<StepTokens>,
    /// An `assistant` line waiting for its step's tokens.
    held: Option<HistoryLine>,
}

impl Turn {
    fn new(index: u32, conversation_id: Option<ConversationId>, task_id: TaskId) -> Self {
        Self {
            index,
            conversation_id,
            task_id,
            step: 0,
            tool_calls: 0,
            steps: Vec::new(),
            held: None,
        }
    }

    fn step_tokens(&self, step: u32) -> Option<Tokens> {
        self.steps.iter().find(|s| s.step == step).map(|s| s.tokens)
    }

    fn meta(&self) -> LineMeta {
        LineMeta {
            conversation_id: self.conversation_id,
            task_id: Some(self.task_id),
            ..LineMeta::default()
        }
    }

    fn release(&mut self, out: &mut Vec<HistoryLine>) {
        out.extend(self.held.take());
    }
}

/// The pure mapping from a session's events to history lines (no I/O).
#[derive(Debug)]
pub struct HistoryLog {
    session_id: SessionId,
    policies: HashMap<ConversationId, StoragePolicy>,
    unknown_policy: StoragePolicy,
    session_meta: BTreeMap<String, serde_json::Value>,
    /// The last turn number given out (in this file, across runs).
    last_turn: u32,
    /// Turns started in this run.
    turns_started: u32,
    open: HashMap<TaskId, Turn>,
    /// Totals of the turns ended in this run.
    totals: Tokens,
    /// The stored size of the content of the event being mapped, when that event stands in
    /// for stored headers (its own content is empty).
    size: Option<u64>,
}

impl HistoryLog {
    /// A log whose first turn will be `last_turn + 1`.
    pub fn new(session_id: SessionId, options: HistoryLogOptions, last_turn: u32) -> Self {
        Self {
            session_id,
            policies: options.policies,
            unknown_policy: options.unknown_policy,
            session_meta: options.session_meta,
            last_turn,
            turns_started: 0,
            open: HashMap::new(),
            totals: Tokens::default(),
            size: None,
        }
    }

    /// The `session_start` line.
    pub fn session_start(&self, now_ms: u64) -> HistoryLine {
        let meta = LineMeta {
            pid: Some(std::process::id()),
            version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            extra: self.session_meta.clone(),
            ..LineMeta::default()
        };
        self.session_line(now_ms, LineType::SessionStart, String::new(), meta)
    }

    /// Lines for a log that cannot read on: lines held for tokens that may now never come,
    /// then a `gap` warning saying why.
    pub fn on_gap(&mut self, message: &str, now_ms: u64, out: &mut Vec<HistoryLine>) {
        self.release_all(out);
        let meta = LineMeta {
            code: Some("gap".into()),
            ..LineMeta::default()
        };
        out.push(self.session_line(now_ms, LineType::Warning, message.to_owned(), meta));
    }

    /// The lines of one record of the session's stream: a live event, or a stored record as
    /// its policy kept it (headers give content-free lines with the stored sizes).
    pub fn on_record(&mut self, record: &RolloutRecord, out: &mut Vec<HistoryLine>) {
        let (event, size) = match &record.event {
            Some(event) => (event.clone(), None),
            None => {
                if let (EventName::ConversationOpened, Some(c)) =
                    (record.kind, record.conversation_id)
                {
                    // The policy that kept only these headers.
                    let policy = match record.level {
                        RecordLevel::Minimal => StoragePolicy::None,
                        RecordLevel::Full | RecordLevel::Headers => StoragePolicy::HeadersOnly,
                    };
                    self.policies.insert(c, policy);
                    return;
                }
                match stand_in(record) {
                    Some(event) => (event, record.meta.chars),
                    None => return,
                }
            }
        };
        let env = EventEnvelope {
            seq: record.seq,
            ts_ms: record.ts_ms,
            session_id: self.session_id,
            conversation_id: record.conversation_id,
            task_id: record.task_id,
            sub_id: None,
            trace_id: None,
            span_id: None,
            event,
        };
        self.size = size;
        self.on_event(&env, out);
        self.size = None;
    }

    /// The closing lines: anything held, then `session_end`.
    pub fn session_end(&mut self, now_ms: u64, out: &mut Vec<HistoryLine>) {
        self.release_all(out);
        let unfinished = u32::try_from(self.open.len()).unwrap_or(u32::MAX);
        let meta = LineMeta {
            turns: Some(self.turns_started),
            unfinished: (unfinished > 0).then_some(unfinished),
            tokens: Some(TokenMeta {
                totals: self.totals,
                steps: Vec::new(),
            }),
            ..LineMeta::default()
        };
        out.push(self.session_line(now_ms, LineType::SessionEnd, String::new(), meta));
    }

    /// Turns started in this run.
    pub const fn turns_started(&self) -> u32 {
        self.turns_started
    }

    /// Totals of the turns ended in this run.
    pub const fn totals(&self) -> Tokens {
        self.totals
    }

    /// The lines of one event, appended to `out` (often none, sometimes several).
    pub fn on_event(&mut self, env: &EventEnvelope, out: &mut Vec<HistoryLine>) {
        match (&env.event, env.conversation_id) {
            (EventKind::ConversationOpened { storage_policy, .. }, Some(c)) => {
                self.policies.insert(c, *storage_policy);
                return;
            }
            (EventKind::ConversationClosed { .. }, Some(c)) => {
                self.policies.remove(&c);
                return;
            }
            _ => {}
        }
        let level = self.level(env.conversation_id);
        let size = self.size;
        let ts = format_ts(env.ts_ms);
        match env.task_id {
            None => self.loose_event(env, level, &ts, out),
            Some(task_id) => match &env.event {
                EventKind::TaskStarted { input } => {
                    self.turn_started(task_id, env.conversation_id, input, level, &ts, out);
                }
                EventKind::TaskFinished {
                    status,
                    text,
                    stats,
                    error,
                } => {
                    let mut turn = self.take_turn(task_id, env.conversation_id);
                    turn.release(out);
                    // Stored headers keep the text's size only (with the error's, if any).
                    let has_text =
                        !text.is_empty() || (error.is_none() && size.is_some_and(|n| n > 0));
                    if has_text && level != Level::Minimal {
                        let mut meta = turn.meta();
                        let content = keep(level, size, text, &mut meta);
                        let line = HistoryLine {
                            ts: ts.clone(),
                            session_id: self.session_id,
                            turn: turn.index,
                            step: turn.step,
                            kind: LineType::Final,
                            content,
                            role: LineRole::Assistant,
                            meta,
                        };
                        out.push(line);
                    }
                    let meta = LineMeta {
                        status: Some(*status),
                        steps: Some(stats.steps),
                        tool_calls: Some(stats.tool_calls),
                        duration_ms: Some(stats.duration_ms),
                        error: error.as_ref().map(|e| error_meta(level, e)),
                        trace_id: (!stats.trace_id.is_empty()).then(|| stats.trace_id.clone()),
                        ..turn.meta()
                    };
                    self.end_turn(turn, Tokens::of_task(stats), *status, meta, &ts, out);
                }
                EventKind::TaskAborted { waited_ms } => {
                    let mut turn = self.take_turn(task_id, env.conversation_id);
                    turn.release(out);
                    let mut totals = Tokens::default();
                    for s in &turn.steps {
                        totals.add(&s.tokens);
                    }
                    let meta = LineMeta {
                        status: Some(TaskStatus::Cancelled),
                        steps: Some(turn.step),
                        tool_calls: Some(turn.tool_calls),
                        error: Some(ErrorMeta {
                            kind: ErrorKind::Cancelled,
                            message: (level == Level::Full)
                                .then(|| "aborted after the close timeout".to_owned()),
                        }),
                        aborted: Some(true),
                        waited_ms: Some(*waited_ms),
                        ..turn.meta()
                    };
                    self.end_turn(turn, totals, TaskStatus::Cancelled, meta, &ts, out);
                }
                _ => self.step_event(task_id, env, level, &ts, out),
            },
        }
    }

    fn turn_started(
        &mut self,
        task_id: TaskId,
        conversation_id: Option<ConversationId>,
        input: &str,
        level: Level,
        ts: &str,
        out: &mut Vec<HistoryLine>,
    ) {
        if self.open.contains_key(&task_id) {
            // A repeated start says nothing new.
            return;
        }
        let size = self.size;
        let session_id = self.session_id;
        let turn = self.turn_mut(task_id, conversation_id);
        let mut meta = turn.meta();
        let content = match level {
            Level::Minimal => String::new(),
            _ => keep(level, size, input, &mut meta),
        };
        out.push(HistoryLine {
            ts: ts.to_owned(),
            session_id,
            turn: turn.index,
            step: 0,
            kind: LineType::TurnStart,
            content,
            role: LineRole::User,
            meta,
        });
    }

    /// Events inside a task's steps.
    fn step_event(
        &mut self,
        task_id: TaskId,
        env: &EventEnvelope,
        level: Level,
        ts: &str,
        out: &mut Vec<HistoryLine>,
    ) {
        let session_id = self.session_id;
        let size = self.size;
        let turn = self.turn_mut(task_id, env.conversation_id);
        if let EventKind::StepFinished {
            step,
            estimated_prompt_tokens,
            usage,
            estimated_completion_tokens,
            ..
        } = &env.event
        {
            let tokens = Tokens::new(
                *estimated_prompt_tokens,
                usage.as_ref(),
                *estimated_completion_tokens,
            );
            match turn.steps.iter_mut().find(|s| s.step == *step) {
                Some(s) => s.tokens = tokens,
                None => turn.steps.push(StepTokens {
                    step: *step,
                    tokens,
                }),
            }
            if let Some(held) = turn.held.as_mut().filter(|h| h.step == *step) {
                held.meta.tokens = Some(TokenMeta {
                    totals: tokens,
                    steps: Vec::new(),
                });
            }
            turn.release(out);
            return;
        }
        // Any other event of the task means the step's tokens are not coming before it.
        turn.release(out);
        let mut meta = turn.meta();
        let (kind, role, content) = match &env.event {
            EventKind::StepStarted { step, .. } => {
                turn.step = *step;
                return;
            }
            EventKind::AssistantChunk { delta } if level == Level::Full => {
                (LineType::AssistantChunk, LineRole::Assistant, delta.clone())
            }
            EventKind::AssistantMessage { text } if level != Level::Minimal => {
                let content = keep(level, size, text, &mut meta);
                meta.tokens = turn.step_tokens(turn.step).map(|totals| TokenMeta {
                    totals,
                    steps: Vec::new(),
                });
                let wait = meta.tokens.is_none();
                let line = HistoryLine {
                    ts: ts.to_owned(),
                    session_id,
                    turn: turn.index,
                    step: turn.step,
                    kind: LineType::Assistant,
                    content,
                    role: LineRole::Assistant,
                    meta,
                };
                if wait {
                    turn.held = Some(line);
                } else {
                    out.push(line);
                }
                return;
            }
            EventKind::ToolCallStarted { call, agent_id } => {
                turn.tool_calls += 1;
                if level == Level::Minimal {
                    return;
                }
                meta.tool = Some(call.name.clone());
                meta.call_id = Some(call.call_id.clone());
                meta.agent_id.clone_from(agent_id);
                meta.extra.insert("event".into(), "tool_call".into());
                let content = keep(level, size, &call.arguments.0.to_string(), &mut meta);
                (LineType::Action, LineRole::Assistant, content)
            }
            EventKind::ToolCallFinished {
                call_id,
                name,
                output,
                is_error,
                duration_ms,
                agent_id,
            } if level != Level::Minimal => {
                meta.tool = Some(name.clone());
                meta.call_id = Some(call_id.clone());
                meta.is_error = Some(*is_error);
                meta.duration_ms = Some(*duration_ms);
                meta.agent_id.clone_from(agent_id);
                let seed_name = if *is_error {
                    "tool_error"
                } else {
                    "tool_result"
                };
                meta.extra.insert("event".into(), seed_name.into());
                let content = keep(level, size, output, &mut meta);
                (LineType::Observation, LineRole::Tool, content)
            }
            event => match loose_line(event, level, size, &mut meta) {
                Some(parts) => parts,
                None => return,
            },
        };
        out.push(HistoryLine {
            ts: ts.to_owned(),
            session_id,
            turn: turn.index,
            step: turn.step,
            kind,
            content,
            role,
            meta,
        });
    }

    /// Events outside any task: of a conversation, or of the session.
    fn loose_event(&self, env: &EventEnvelope, level: Level, ts: &str, out: &mut Vec<HistoryLine>) {
        let mut meta = LineMeta {
            conversation_id: env.conversation_id,
            ..LineMeta::default()
        };
        if let Some((kind, role, content)) = loose_line(&env.event, level, self.size, &mut meta) {
            out.push(HistoryLine {
                ts: ts.to_owned(),
                session_id: self.session_id,
                turn: 0,
                step: 0,
                kind,
                content,
                role,
                meta,
            });
        }
    }

    fn level(&self, conversation_id: Option<ConversationId>) -> Level {
        match conversation_id {
            None => Level::Headers,
            Some(c) => Level::of(
                self.policies
                    .get(&c)
                    .copied()
                    .unwrap_or(self.unknown_policy),
            ),
        }
    }

    /// The turn of `task_id`; one is opened (without a `turn_start` line) for a task whose
    /// start the log missed.
    fn turn_mut(&mut self, task_id: TaskId, conversation_id: Option<ConversationId>) -> &mut Turn {
        let last_turn = &mut self.last_turn;
        let started = &mut self.turns_started;
        self.open.entry(task_id).or_insert_with(|| {
            *last_turn += 1;
            *started += 1;
            Turn::new(*last_turn, conversation_id, task_id)
        })
    }

    fn take_turn(&mut self, task_id: TaskId, conversation_id: Option<ConversationId>) -> Turn {
        match self.open.remove(&task_id) {
            Some(turn) => turn,
            None => {
                self.last_turn += 1;
                self.turns_started += 1;
                Turn::new(self.last_turn, conversation_id, task_id)
            }
        }
    }

    /// The `turn_end` line of a turn taken out of `open`.
    fn end_turn(
        &mut self,
        turn: Turn,
        totals: Tokens,
        status: TaskStatus,
        meta: LineMeta,
        ts: &str,
        out: &mut Vec<HistoryLine>,
    ) {
        self.totals.add(&totals);
        out.push(HistoryLine {
            ts: ts.to_owned(),
            session_id: self.session_id,
            turn: turn.index,
            step: 0,
            kind: LineType::TurnEnd,
            content: status.as_str().to_owned(),
            role: LineRole::System,
            meta: LineMeta {
                tokens: Some(TokenMeta {
                    totals,
                    steps: turn.steps,
                }),
                ..meta
            },
        });
    }

    fn release_all(&mut self, out: &mut Vec<HistoryLine>) {
        let mut turns: Vec<&mut Turn> = self.open.values_mut().collect();
        turns.sort_by_key(|t| t.index);
        for turn in turns {
            turn.release(out);
        }
    }

    fn session_line(
        &self,
        now_ms: u64,
        kind: LineType,
        content: String,
        meta: LineMeta,
    ) -> HistoryLine {
        HistoryLine {
            ts: format_ts(now_ms),
            session_id: self.session_id,
            turn: 0,
            step: 0,
            kind,
            content,
            role: LineRole::System,
            meta,
        }
    }
}

/// The content of a line as the level allows: all of it, or nothing and its size. `size`: the
/// stored size of the content that `text` stands in for (empty, rebuilt from headers).
fn keep(level: Level, size: Option<u64>, text: &str, meta: &mut LineMeta) -> String {
    if level == Level::Full {
        text.to_owned()
    } else {
        meta.chars = Some(size.unwrap_or_else(|| u64::try_from(text.len()).unwrap_or(u64::MAX)));
        String::new()
    }
}

fn error_meta(level: Level, error: &AgentError) -> ErrorMeta {
    ErrorMeta {
        kind: error.kind(),
        message: (level == Level::Full).then(|| error.to_string()),
    }
}

/// A content-free event built from a stored record's headers, so that it maps to the lines
/// the live event would have given at the same level; `None` for kinds whose lines need more
/// than the headers keep (approvals) or that write no line.
fn stand_in(record: &RolloutRecord) -> Option<EventKind> {
    let meta = &record.meta;
    let error = meta.error_kind.map(error_of_kind);
    Some(match record.kind {
        EventName::TaskStarted => EventKind::TaskStarted {
            input: String::new(),
        },
        EventName::TaskFinished => EventKind::TaskFinished {
            status: meta.status?,
            text: String::new(),
            stats: TaskStats {
                usage: meta.usage.unwrap_or_default(),
                steps: meta.steps.unwrap_or_default(),
                tool_calls: meta.tool_calls.unwrap_or_default(),
                duration_ms: meta.duration_ms.unwrap_or_default(),
                ..TaskStats::default()
            },
            error,
        },
        EventName::TaskAborted => EventKind::TaskAborted {
            waited_ms: meta.duration_ms.unwrap_or_default(),
        },
        EventName::StepStarted => EventKind::StepStarted {
            turn: 0,
            step: meta.steps?,
        },
        EventName::StepFinished => EventKind::StepFinished {
            turn: 0,
            step: meta.steps?,
            estimated_prompt_tokens: 0,
            usage: meta.usage,
            estimated_completion_tokens: None,
        },
        EventName::AssistantMessage => EventKind::AssistantMessage {
            text: String::new(),
        },
        EventName::ToolCallStarted => EventKind::ToolCallStarted {
            call: ToolCall {
                call_id: meta.call_id.clone().unwrap_or_default(),
                name: meta.tool.clone()?,
                arguments: Json(serde_json::Value::Null),
            },
            agent_id: meta.agent_id.clone(),
        },
        EventName::ToolCallFinished => EventKind::ToolCallFinished {
            call_id: meta.call_id.clone().unwrap_or_default(),
            name: meta.tool.clone()?,
            output: String::new(),
            is_error: meta.is_error.unwrap_or_default(),
            duration_ms: meta.duration_ms.unwrap_or_default(),
            agent_id: meta.agent_id.clone(),
        },
        EventName::Warning => EventKind::Warning {
            code: meta.code.unwrap_or(WarningCode::Unknown),
            message: String::new(),
        },
        EventName::Error => EventKind::Error { error: error? },
        EventName::RouteDecided => {
            let route = meta.route?;
            EventKind::RouteDecided {
                decision: route.decision,
                agent_id: meta.agent_id.clone(),
                module: None,
                confidence: route.confidence,
                source: route.source,
                reason: String::new(),
            }
        }
        EventName::DispatchSent => EventKind::DispatchSent {
            dispatch_id: meta.dispatch_id?,
            agent_id: meta.agent_id.clone()?,
            provider: meta.provider?,
            provider_session_id: meta.provider_session_id.clone(),
            chain: troupe_proto::agent::ExecutionChain::default(),
            lease_ttl_ms: 0,
            input: String::new(),
        },
        EventName::DispatchResult => EventKind::DispatchResult {
            dispatch_id: meta.dispatch_id?,
            agent_id: meta.agent_id.clone()?,
            provider_session_id: meta.provider_session_id.clone(),
            status: meta.dispatch?,
            text: String::new(),
            error,
            duration_ms: meta.duration_ms.unwrap_or_default(),
            validated: false,
        },
        EventName::AskHuman => EventKind::AskHuman {
            question: String::new(),
        },
        _ => return None,
    })
}

/// An error of `kind` with no detail (what headers keep of one).
fn error_of_kind(kind: ErrorKind) -> AgentError {
    let none = String::new;
    match kind {
        ErrorKind::Cancelled => AgentError::Cancelled { reason: none() },
        ErrorKind::Timeout => AgentError::Timeout {
            what: none(),
            after_ms: 0,
        },
        ErrorKind::ApprovalDenied => AgentError::ApprovalDenied {
            command: Vec::new(),
            reason: none(),
        },
        ErrorKind::SandboxError => AgentError::SandboxError { message: none() },
        ErrorKind::McpError => AgentError::McpError {
            server: none(),
            message: none(),
        },
        ErrorKind::ToolConflict => AgentError::ToolConflict {
            name: none(),
            detail: none(),
        },
        ErrorKind::StoragePolicyViolation => AgentError::StoragePolicyViolation { message: none() },
        ErrorKind::Overloaded => AgentError::Overloaded {
            resource: none(),
            limit: 0,
        },
        ErrorKind::NotFound => AgentError::NotFound {
            what: none(),
            id: none(),
        },
        ErrorKind::InvalidInput => AgentError::InvalidInput { message: none() },
        ErrorKind::ModelError => AgentError::ModelError {
            message: none(),
            retryable: false,
        },
        ErrorKind::ToolError => AgentError::ToolError {
            name: none(),
            message: none(),
        },
        ErrorKind::Internal => AgentError::Internal { message: none() },
        ErrorKind::Interrupted => AgentError::Interrupted { reason: none() },
        ErrorKind::PolicyRejected => AgentError::PolicyRejected {
            reason: troupe_proto::agent::PolicyReason::Cycle,
            chain: Vec::new(),
            message: none(),
        },
        ErrorKind::GuardrailFailed => AgentError::GuardrailFailed {
            attempts: 0,
            problems: Vec::new(),
        },
    }
}

/// The line (type, role, content) of an event that may appear inside or outside a turn;
/// `None` for events that write nothing at this level.
fn loose_line(
    event: &EventKind,
    level: Level,
    size: Option<u64>,
    meta: &mut LineMeta,
) -> Option<(LineType, LineRole, String)> {
    match event {
        EventKind::Error { error } => {
            meta.kind = Some(error.kind());
            let content = match level {
                Level::Minimal => String::new(),
                _ => keep(level, size, &error.to_string(), meta),
            };
            Some((LineType::Error, LineRole::System, content))
        }
        _ if level == Level::Minimal => None,
        EventKind::ApprovalRequested {
            approval_id,
            command,
            reason,
            ..
        } => {
            meta.approval_id = Some(*approval_id);
            meta.decision = Some("pending".into());
            let content = keep(level, size, &command.join(" "), meta);
            meta.reason = (level == Level::Full).then(|| reason.clone());
            Some((LineType::Approval, LineRole::System, content))
        }
        EventKind::ApprovalResolved {
            approval_id,
            decision,
        } => {
            meta.approval_id = Some(*approval_id);
            let (name, ttl_secs, reason) = decision_parts(decision);
            meta.decision = Some(name.into());
            meta.ttl_secs = ttl_secs;
            let content = match reason {
                Some(reason) => keep(level, size, reason, meta),
                None => String::new(),
            };
            Some((LineType::Approval, LineRole::System, content))
        }
        EventKind::Warning { code, message } => {
            meta.code = Some(code.as_str().to_owned());
            let content = keep(level, size, message, meta);
            Some((LineType::Warning, LineRole::System, content))
        }
        event => agent_line(event, level, size, meta),
    }
}

/// The line of an agent event (seed 003 §9.1 names its type); `None` for other events.
fn agent_line(
    event: &EventKind,
    level: Level,
    size: Option<u64>,
    meta: &mut LineMeta,
) -> Option<(LineType, LineRole, String)> {
    let system = |kind, content| Some((kind, LineRole::System, content));
    match event {
        EventKind::SessionCreated {
            agent_id,
            provider,
            provider_session_id,
            dispatch_id,
        }
        | EventKind::SessionResumed {
            agent_id,
            provider,
            provider_session_id,
            dispatch_id,
        } => {
            meta.agent_id = Some(agent_id.clone());
            meta.provider = Some(provider.as_str().to_owned());
            meta.provider_session_id = Some(provider_session_id.clone());
            meta.dispatch_id = dispatch_id.map(|d| d.to_string());
            let kind = if matches!(event, EventKind::SessionCreated { .. }) {
                LineType::SessionCreated
            } else {
                LineType::SessionResumed
            };
            system(kind, provider_session_id.clone())
        }
        EventKind::SessionBound {
            agent_id,
            provider,
            provider_session_id,
            replaced,
            dispatch_id,
        } => {
            meta.agent_id = Some(agent_id.clone());
            meta.provider = Some(provider.as_str().to_owned());
            meta.provider_session_id = Some(provider_session_id.clone());
            meta.dispatch_id = dispatch_id.map(|d| d.to_string());
            if let Some(old) = replaced {
                meta.extra.insert("replaced".into(), serde_json::json!(old));
            }
            system(LineType::SessionBound, provider_session_id.clone())
        }
        EventKind::RouteDecided {
            decision,
            agent_id,
            module,
            confidence,
            source,
            reason,
        } => {
            meta.decision = Some(decision.as_str().to_owned());
            meta.agent_id.clone_from(agent_id);
            meta.confidence = Some(*confidence);
            meta.source = Some(source.as_str().to_owned());
            if let Some(module) = module {
                meta.extra
                    .insert("module".into(), serde_json::json!(module));
            }
            system(LineType::RouteDecided, keep(level, size, reason, meta))
        }
        EventKind::DispatchSent {
            dispatch_id,
            agent_id,
            provider,
            provider_session_id,
            chain,
            lease_ttl_ms,
            input,
        } => {
            meta.agent_id = Some(agent_id.clone());
            meta.provider = Some(provider.as_str().to_owned());
            meta.provider_session_id.clone_from(provider_session_id);
            meta.dispatch_id = Some(dispatch_id.to_string());
            meta.chain = Some(chain.0.clone());
            meta.extra
                .insert("lease_ttl_ms".into(), serde_json::json!(lease_ttl_ms));
            system(LineType::DispatchSent, keep(level, size, input, meta))
        }
        EventKind::DispatchResult {
            dispatch_id,
            agent_id,
            provider_session_id,
            status,
            text,
            error,
            duration_ms,
            ..
        } => {
            meta.agent_id = Some(agent_id.clone());
            meta.provider_session_id.clone_from(provider_session_id);
            meta.dispatch_id = Some(dispatch_id.to_string());
            meta.outcome = Some(status.as_str().to_owned());
            meta.duration_ms = Some(*duration_ms);
            meta.error = error.as_ref().map(|e| ErrorMeta {
                kind: e.kind(),
                message: (level == Level::Full).then(|| e.to_string()),
            });
            let content = keep(level, size, text, meta);
            Some((LineType::DispatchResult, LineRole::Assistant, content))
        }
        EventKind::PolicyRejected {
            agent_id,
            chain,
            reason,
            message,
            tool,
        } => {
            meta.agent_id = Some(agent_id.clone());
            meta.tool.clone_from(tool);
            meta.chain = Some(chain.0.clone());
            meta.code = Some(reason.as_str().to_owned());
            system(LineType::PolicyRejected, keep(level, size, message, meta))
        }
        EventKind::AskHuman { question } => {
            let content = keep(level, size, question, meta);
            Some((LineType::AskHuman, LineRole::Assistant, content))
        }
        EventKind::GuardrailFailed {
            agent_id,
            attempts,
            problems,
            status,
            action,
        } => {
            meta.agent_id.clone_from(agent_id);
            meta.outcome = serde_json::to_value(status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned));
            meta.extra
                .insert("attempts".into(), serde_json::json!(attempts));
            meta.extra
                .insert("action".into(), serde_json::json!(action));
            // Paths and keywords, never the answer's values: kept under every policy.
            system(LineType::GuardrailFailed, problems.join("; "))
        }
        _ => None,
    }
}

/// Name, ttl and denial reason of an approval answer.
fn decision_parts(decision: &ApprovalDecision) -> (&'static str, Option<u64>, Option<&str>) {
    match decision {
        ApprovalDecision::ApproveOnce => ("approve_once", None, None),
        ApprovalDecision::ApproveForConversation { ttl_secs } => {
            ("approve_for_conversation", *ttl_secs, None)
        }
        ApprovalDecision::ApproveForSession { ttl_secs } => {
            ("approve_for_session", *ttl_secs, None)
        }
        ApprovalDecision::Deny { reason } => ("deny", None, reason.as_deref()),
        ApprovalDecision::TimedOut => ("timed_out", None, None),
        // The content is the user's answer to a server, not a reason: it stays out.
        ApprovalDecision::ApproveWithContent { .. } => ("approve_with_content", None, None),
    }
}

/// RFC 3339, UTC, milliseconds: `2026-01-02T03:04:05.678Z`.
pub fn format_ts(unix_ms: u64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(unix_ms);
    humantime::format_rfc3339_millis(at).to_string()
}

#[cfg(test)]
mod tests;
