//! What a rollout recorded of one task, read for a replay ([`Recording::of_task`]): the
//! model's answer at each step, each tool call's result, each dispatch's answer, and the
//! task's events and end. Pure: records in, a recording (or the reason there is none) out.
//!
//! How the records are read, in `seq` order:
//! - a step runs from its `step_started` to the next one (or the task's end); its answer is
//!   its `assistant_chunk`s, its `assistant_message` and the `tool_call_started` calls made
//!   after its `step_finished` (a retried call counts once), or the `error` that came before
//!   any `step_finished` (the model's, or the prompt's budget);
//! - the supervisor's routing step (a `route_decided` of source `model` in the step) answered
//!   with a `route` call, rebuilt from that decision and what it led to (the reply, the
//!   question, the dispatch's input);
//! - a tool call's result is what its `tool_call_finished` says, or the `error` right before
//!   it (a refusal, a denial, a failure), one per attempt;
//! - a dispatch's answer is its `dispatch_result` (text, or the error it failed with), or
//!   the hub's `policy_rejected` refusal.

use crate::agents::AgentOutput;
use crate::agents::route::{DISPATCH_TOOL, ROUTE_TOOL};
use crate::ports::{ModelResponse, ToolFailure};
use crate::rollout::{RecordLevel, RolloutRecord};
use serde::Serialize;
use std::collections::BTreeSet;
use troupe_proto::agent::{PolicyReason, RouteDecision, RouteSource};
use troupe_proto::{
    AgentError, ConversationId, EventKind, EventName, Json, TaskId, TaskStatus, ToolCall,
    ToolOutput,
};

/// Everything a replay of one task plays back and compares with.
#[derive(Debug, Clone, PartialEq)]
pub struct Recording {
    pub task_id: TaskId,
    pub conversation_id: ConversationId,
    /// The user's message.
    pub input: String,
    /// The model's answer at each step, in order.
    pub steps: Vec<RecordedStep>,
    /// Each tool call attempt's result, in order.
    pub tool_results: Vec<RecordedToolResult>,
    /// Each dispatch's answer, in order.
    pub dispatches: Vec<Result<AgentOutput, AgentError>>,
    /// The built-ins the task reached (called, and not refused as unknown): offered again.
    pub builtins: ReachedBuiltins,
    /// The external (MCP) tools the task reached, by qualified name: offered again.
    pub external_tools: BTreeSet<String>,
    /// Who routed the message, when a supervisor did (its `route_decided`).
    pub routed_by: Option<RouteSource>,
    /// How the task ended.
    pub end: RecordedEnd,
    /// The task's events, in order.
    pub events: Vec<EventKind>,
    /// `seq` of the task's first record: the conversation's records before it are what its
    /// history was.
    pub first_seq: u64,
}

/// The model's answer at one step.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedStep {
    /// The streamed pieces, in order.
    pub chunks: Vec<String>,
    pub answer: Result<ModelResponse, AgentError>,
}

/// One attempt of one tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedToolResult {
    pub call: ToolCall,
    pub result: Result<ToolOutput, ToolFailure>,
}

/// Which built-ins a replay offers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReachedBuiltins {
    pub shell: bool,
    pub plan: bool,
    pub apply_patch: bool,
}

/// A task's end as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedEnd {
    pub status: TaskStatus,
    pub error: Option<AgentError>,
    /// Steps it made.
    pub steps: u32,
}

/// Why a task cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    pub reason: RefusalReason,
    /// What is missing, for a person.
    pub message: String,
}

/// The kind of a [`Refusal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    /// No rollout of the data directory holds the task.
    NotFound,
    /// Its records keep no content (storage policy `headers_only` or `none`, or `ttl`
    /// content that expired): nothing to play back.
    ContentNotKept,
    /// It has no recorded end (aborted by a crash, or still running).
    NoEnd,
    /// It is not a user's message (a compaction).
    NotAMessage,
    /// An agent's output guardrail judged its answers: what the model wrote was never
    /// recorded (only what passed), so the judgement cannot be made again.
    Guardrailed,
}

impl Refusal {
    pub fn not_found(task_id: TaskId, searched: &str) -> Self {
        Self {
            reason: RefusalReason::NotFound,
            message: format!("no rollout in {searched} holds task {task_id}"),
        }
    }
}

impl Recording {
    /// The recording of `task_id` among `records` (a conversation's, in `seq` order).
    pub fn of_task(task_id: TaskId, records: &[RolloutRecord]) -> Result<Self, Refusal> {
        let own: Vec<&RolloutRecord> = records
            .iter()
            .filter(|r| r.task_id == Some(task_id))
            .collect();
        let Some(first) = own.first() else {
            return Err(Refusal {
                reason: RefusalReason::NotFound,
                message: format!("the records read hold nothing of task {task_id}"),
            });
        };
        let (first_seq, conversation_id) = (first.seq, first.conversation_id);
        if let Some(refusal) = content_refusal(task_id, &own) {
            return Err(refusal);
        }
        let events: Vec<EventKind> = own.iter().filter_map(|r| r.event.clone()).collect();
        let mut reader = Reader::default();
        for event in &events {
            reader.read(event);
        }
        let conversation_id = conversation_id.ok_or_else(|| Refusal {
            reason: RefusalReason::NotFound,
            message: format!("task {task_id} is recorded outside any conversation"),
        })?;
        if reader.compaction {
            return Err(Refusal {
                reason: RefusalReason::NotAMessage,
                message: format!(
                    "task {task_id} is a compaction of its conversation's history; only the tasks of users' messages are replayed"
                ),
            });
        }
        if reader.guardrail_failed {
            return Err(Refusal {
                reason: RefusalReason::Guardrailed,
                message: format!(
                    "task {task_id} ran under an agent's output guardrail that refused answers; what the model wrote is not recorded (only what passed), so the guardrail's judgement cannot be replayed"
                ),
            });
        }
        let Some(end) = reader.end.take() else {
            let why = if reader.aborted {
                "it was aborted (a crash, or a close that timed out, interrupted it)"
            } else {
                "it was still running when the record was read, or its end was lost"
            };
            return Err(Refusal {
                reason: RefusalReason::NoEnd,
                message: format!(
                    "task {task_id} has no recorded end: {why}; a replay compares with the end it recorded"
                ),
            });
        };
        let Some(input) = reader.input.take() else {
            return Err(Refusal {
                reason: RefusalReason::NotFound,
                message: format!("the record of task {task_id} does not hold its start"),
            });
        };
        Ok(Self {
            task_id,
            conversation_id,
            input,
            steps: reader.steps.into_iter().map(StepReader::finish).collect(),
            tool_results: reader.tool_results,
            dispatches: reader.dispatches,
            builtins: reader.builtins,
            external_tools: reader.external_tools,
            routed_by: reader.routed_by,
            end,
            events,
            first_seq,
        })
    }
}

/// The refusal of a task whose records are not all whole: it names what they left out.
fn content_refusal(task_id: TaskId, own: &[&RolloutRecord]) -> Option<Refusal> {
    let short: Vec<&&RolloutRecord> = own
        .iter()
        .filter(|r| r.level != RecordLevel::Full)
        .collect();
    if short.is_empty() {
        return None;
    }
    let minimal = short.iter().any(|r| r.level == RecordLevel::Minimal);
    let count = |kind: EventName| own.iter().filter(|r| r.kind == kind).count() as u64;
    let finished = own.iter().find(|r| r.kind == EventName::TaskFinished);
    let steps = finished
        .and_then(|r| r.meta.steps)
        .map_or(0, u64::from)
        .max(count(EventName::StepStarted));
    let calls = finished
        .and_then(|r| r.meta.tool_calls)
        .map_or(0, u64::from)
        .max(count(EventName::ToolCallFinished));
    let dispatches = count(EventName::DispatchResult);
    let mut missing = vec!["the task's input".to_owned()];
    if minimal {
        // Steps and calls left no record at all: nothing tells how many there were.
        missing.push("the model's answers".to_owned());
        missing.push("the tool results".to_owned());
    } else if steps > 0 {
        missing.push(format!(
            "the model's answers ({steps} {})",
            plural(steps, "step")
        ));
    }
    if calls > 0 && !minimal {
        missing.push(format!(
            "the tool results ({calls} {})",
            plural(calls, "call")
        ));
    }
    if dispatches > 0 {
        missing.push(format!(
            "the agents' answers ({dispatches} {})",
            plural(dispatches, "dispatch")
        ));
    }
    let kept = if minimal {
        "its conversation's storage policy (`none`) kept only the task's start, end and errors"
            .to_owned()
    } else {
        format!(
            "{} of its {} records keep headers only (storage policy `headers_only`, or `ttl` content that expired)",
            short.len(),
            own.len()
        )
    };
    Some(Refusal {
        reason: RefusalReason::ContentNotKept,
        message: format!(
            "task {task_id} cannot be replayed: {kept}; missing: {}",
            missing.join(", ")
        ),
    })
}

fn plural(n: u64, word: &str) -> String {
    match (n, word) {
        (1, w) => w.to_owned(),
        (_, "dispatch") => "dispatches".to_owned(),
        (_, w) => format!("{w}s"),
    }
}

/// The failure a recorded error stands for: the refusal of an unknown tool is told apart by
/// being exactly that refusal (it is not retried), everything else failed.
pub fn failure_of(name: &str, error: AgentError) -> ToolFailure {
    let unknown = ToolFailure::unknown_tool(name);
    if error == unknown.error {
        unknown
    } else {
        ToolFailure::from(error)
    }
}

/// A route decision as the recording shows it, and what it led to.
#[derive(Debug, Clone, PartialEq)]
struct RouteRead {
    decision: RouteDecision,
    agent_id: Option<String>,
    module: Option<String>,
    confidence: f64,
    reason: String,
    input: Option<String>,
    reply: Option<String>,
    question: Option<String>,
}

impl RouteRead {
    /// The `route` call that makes the same decision.
    fn call(&self) -> ToolCall {
        let mut args = serde_json::Map::new();
        args.insert("decision".into(), self.decision.as_str().into());
        let mut put = |key: &str, value: &Option<String>| {
            if let Some(v) = value {
                args.insert(key.into(), v.clone().into());
            }
        };
        put("agent_id", &self.agent_id);
        put("module", &self.module);
        put("input", &self.input);
        put("reply", &self.reply);
        put("question", &self.question);
        args.insert("reason".into(), self.reason.clone().into());
        args.insert("confidence".into(), self.confidence.into());
        ToolCall {
            call_id: ROUTE_TOOL.to_owned(),
            name: ROUTE_TOOL.to_owned(),
            arguments: Json(serde_json::Value::Object(args)),
        }
    }
}

/// One step while it is read.
#[derive(Debug, Default)]
struct StepReader {
    chunks: Vec<String>,
    finished: bool,
    usage: Option<troupe_proto::Usage>,
    error: Option<AgentError>,
    text: Option<String>,
    calls: Vec<ToolCall>,
    route: Option<RouteRead>,
}

impl StepReader {
    fn finish(self) -> RecordedStep {
        let answer = match (self.finished, self.error, self.route) {
            (false, Some(error), _) => Err(error),
            (false, None, _) => Err(AgentError::interrupted(
                "the recording ends inside this step",
            )),
            (true, _, Some(route)) => Ok(ModelResponse {
                tool_calls: vec![route.call()],
                usage: self.usage,
                ..ModelResponse::default()
            }),
            (true, _, None) => Ok(ModelResponse {
                text: self.text.unwrap_or_default(),
                tool_calls: self.calls,
                usage: self.usage,
                ..ModelResponse::default()
            }),
        };
        RecordedStep {
            chunks: self.chunks,
            answer,
        }
    }
}

/// The task's events, read in order.
#[derive(Debug, Default)]
struct Reader {
    input: Option<String>,
    compaction: bool,
    aborted: bool,
    /// An output guardrail found answers that did not match.
    guardrail_failed: bool,
    end: Option<RecordedEnd>,
    steps: Vec<StepReader>,
    /// The call attempt running: its call and the error it failed with so far.
    call: Option<(ToolCall, Option<AgentError>)>,
    tool_results: Vec<RecordedToolResult>,
    dispatches: Vec<Result<AgentOutput, AgentError>>,
    builtins: ReachedBuiltins,
    external_tools: BTreeSet<String>,
    routed_by: Option<RouteSource>,
    /// The route decided last, to which the reply, question or dispatch input belong.
    route: Option<RouteRead>,
    /// No step started since that decision: what follows is its answer.
    route_open: bool,
}

impl Reader {
    fn read(&mut self, event: &EventKind) {
        match event {
            EventKind::TaskStarted { input } => self.input = Some(input.clone()),
            EventKind::CompactionStarted {} => self.compaction = true,
            EventKind::TaskAborted { .. } => self.aborted = true,
            EventKind::GuardrailFailed { .. } => self.guardrail_failed = true,
            EventKind::TaskFinished {
                status,
                error,
                stats,
                ..
            } => {
                self.abandon_call();
                self.end = Some(RecordedEnd {
                    status: *status,
                    error: error.clone(),
                    steps: stats.steps,
                });
            }
            EventKind::StepStarted { .. } => {
                self.abandon_call();
                self.route_open = false;
                self.steps.push(StepReader::default());
            }
            EventKind::AssistantChunk { delta } => {
                if let Some(step) = self.open_step() {
                    step.chunks.push(delta.clone());
                }
            }
            EventKind::StepFinished { usage, .. } => {
                if let Some(step) = self.open_step() {
                    step.finished = true;
                    step.usage = *usage;
                }
            }
            EventKind::Error { error } => {
                if let Some((_, failed)) = &mut self.call {
                    *failed = Some(error.clone());
                } else if let Some(step) = self.open_step() {
                    step.error = Some(error.clone());
                }
            }
            EventKind::AssistantMessage { text } => self.assistant_message(text),
            EventKind::RouteDecided {
                decision,
                agent_id,
                module,
                confidence,
                source,
                reason,
            } => {
                self.routed_by.get_or_insert(*source);
                self.route_open = true;
                let route = RouteRead {
                    decision: *decision,
                    agent_id: agent_id.clone(),
                    module: module.clone(),
                    confidence: *confidence,
                    reason: reason.clone(),
                    input: None,
                    reply: None,
                    question: None,
                };
                self.route = Some(route.clone());
                if *source == RouteSource::Model
                    && let Some(step) = self.steps.last_mut()
                    && step.finished
                {
                    step.route = Some(route);
                }
            }
            EventKind::AskHuman { question } => {
                self.fill_route(|r| {
                    if r.decision == RouteDecision::AskHuman && r.question.is_none() {
                        r.question = Some(question.clone());
                    }
                });
            }
            EventKind::DispatchSent { input, .. } => {
                self.fill_route(|r| {
                    if r.decision == RouteDecision::DispatchAgent && r.input.is_none() {
                        r.input = Some(input.clone());
                    }
                });
            }
            EventKind::ToolCallStarted { call, .. } => self.call_started(call),
            EventKind::ToolCallFinished {
                call_id,
                name,
                output,
                is_error,
                ..
            } => self.call_finished(call_id, name, output, *is_error),
            EventKind::PolicyRejected {
                reason,
                chain,
                message,
                tool: None,
                ..
            } if *reason != PolicyReason::UnknownModule => {
                // The hub's refusal of a dispatch (an unknown module is the task's own, and
                // a refused tool call, the task's or an external agent's, names its tool).
                self.dispatches.push(Err(AgentError::PolicyRejected {
                    reason: *reason,
                    chain: chain.0.clone(),
                    message: message.clone(),
                }));
            }
            EventKind::DispatchResult { text, error, .. } => {
                self.dispatches.push(match error {
                    Some(error) => Err(error.clone()),
                    None => Ok(AgentOutput {
                        text: text.clone(),
                        usage: None,
                    }),
                });
            }
            _ => {}
        }
    }

    /// The step whose model call has not answered yet.
    fn open_step(&mut self) -> Option<&mut StepReader> {
        self.steps
            .last_mut()
            .filter(|s| !s.finished && s.error.is_none())
    }

    fn fill_route(&mut self, fill: impl Fn(&mut RouteRead)) {
        if !self.route_open {
            return;
        }
        if let Some(route) = &mut self.route {
            fill(route);
            if let Some(step) = self.steps.last_mut()
                && let Some(step_route) = &mut step.route
            {
                fill(step_route);
            }
        }
    }

    fn assistant_message(&mut self, text: &str) {
        // Right after a route decision, the text is its answer (a reply, a question, a
        // rejection, the agent's answer); a direct reply without text goes on with the turn,
        // whose steps speak for themselves.
        if self.route_open {
            let text = text.to_owned();
            self.fill_route(move |r| {
                // A module's answer is played back in place of a dispatch (a replay
                // delivers nothing to modules).
                let answered = matches!(
                    r.decision,
                    RouteDecision::DirectReply | RouteDecision::DispatchModule
                );
                if answered && r.reply.is_none() {
                    r.reply = Some(text.clone());
                }
            });
            return;
        }
        if let Some(step) = self.steps.last_mut()
            && step.finished
            && step.route.is_none()
            && step.text.is_none()
            && step.calls.is_empty()
        {
            step.text = Some(text.to_owned());
        }
    }

    fn call_started(&mut self, call: &ToolCall) {
        self.abandon_call();
        if let Some(step) = self.steps.last_mut()
            && step.finished
            && step.route.is_none()
            // Another attempt of the call just made (a retry) is not another call.
            && step.calls.last() != Some(call)
        {
            step.calls.push(call.clone());
        }
        self.call = Some((call.clone(), None));
    }

    fn call_finished(&mut self, call_id: &str, name: &str, output: &str, is_error: bool) {
        let Some((call, failed)) = self.call.take_if(|(c, _)| c.call_id == call_id) else {
            return;
        };
        let result = match failed {
            Some(error) => Err(failure_of(name, error)),
            None => Ok(ToolOutput {
                call_id: call_id.to_owned(),
                output: output.to_owned(),
                is_error,
            }),
        };
        let refused =
            matches!(&result, Err(f) if f.kind == crate::ports::ToolFailureKind::UnknownTool);
        if !refused {
            self.reach(name);
        }
        self.tool_results.push(RecordedToolResult { call, result });
    }

    /// A call attempt whose end the recording does not hold: its tool was called, and is
    /// offered again (its result will be missing).
    fn abandon_call(&mut self) {
        if let Some((call, _)) = self.call.take() {
            self.reach(&call.name);
        }
    }

    /// The task reached `name`: a replay offers it.
    fn reach(&mut self, name: &str) {
        match name {
            crate::tools::SHELL => self.builtins.shell = true,
            crate::tools::UPDATE_PLAN => self.builtins.plan = true,
            crate::tools::APPLY_PATCH => self.builtins.apply_patch = true,
            DISPATCH_TOOL | ROUTE_TOOL => {}
            other if crate::tools::is_external(other) => {
                self.external_tools.insert(other.to_owned());
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::ToolFailureKind;
    use crate::rollout::record_for;
    use serde_json::json;
    use troupe_proto::agent::{DispatchStatus, ExecutionChain, ProviderKind};
    use troupe_proto::{DispatchId, EventEnvelope, SessionId, StoragePolicy, TaskStats, Usage};

    struct Run {
        conversation: ConversationId,
        task: TaskId,
        events: Vec<EventKind>,
    }

    impl Run {
        fn new(events: Vec<EventKind>) -> Self {
            Self {
                conversation: ConversationId::new(),
                task: TaskId::new(),
                events,
            }
        }

        /// The records a conversation of `policy` keeps of the run (seq from 10).
        fn records(&self, policy: StoragePolicy) -> Vec<RolloutRecord> {
            let session = SessionId::new();
            self.events
                .iter()
                .enumerate()
                .filter_map(|(i, event)| {
                    record_for(
                        policy,
                        &EventEnvelope {
                            seq: 10 + i as u64,
                            ts_ms: 1_000 + i as u64,
                            session_id: session,
                            conversation_id: Some(self.conversation),
                            task_id: Some(self.task),
                            sub_id: None,
                            trace_id: None,
                            span_id: None,
                            event: event.clone(),
                        },
                    )
                })
                .collect()
        }

        fn recording(&self) -> Recording {
            Recording::of_task(self.task, &self.records(StoragePolicy::Full)).unwrap()
        }
    }

    fn call(id: &str, name: &str, args: serde_json::Value) -> ToolCall {
        ToolCall {
            call_id: id.into(),
            name: name.into(),
            arguments: Json(args),
        }
    }

    fn started(input: &str) -> EventKind {
        EventKind::TaskStarted {
            input: input.into(),
        }
    }

    fn step(step: u32) -> EventKind {
        EventKind::StepStarted { turn: 3, step }
    }

    fn stepped(step: u32, usage: Option<Usage>) -> EventKind {
        EventKind::StepFinished {
            turn: 3,
            step,
            estimated_prompt_tokens: 99,
            usage,
            estimated_completion_tokens: None,
        }
    }

    fn said(text: &str) -> EventKind {
        EventKind::AssistantMessage { text: text.into() }
    }

    fn calls(call: &ToolCall) -> EventKind {
        EventKind::ToolCallStarted {
            call: call.clone(),
            agent_id: None,
        }
    }

    fn answered(call: &ToolCall, output: &str, is_error: bool) -> EventKind {
        EventKind::ToolCallFinished {
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            output: output.into(),
            is_error,
            duration_ms: 7,
            agent_id: None,
        }
    }

    fn failed(error: AgentError) -> EventKind {
        EventKind::Error { error }
    }

    fn finished(
        status: TaskStatus,
        text: &str,
        steps: u32,
        error: Option<AgentError>,
    ) -> EventKind {
        EventKind::TaskFinished {
            status,
            text: text.into(),
            stats: TaskStats {
                steps,
                ..TaskStats::default()
            },
            error,
        }
    }

    fn usage(n: u64) -> Usage {
        Usage {
            input_tokens: n,
            output_tokens: 1,
            ..Usage::default()
        }
    }

    #[test]
    fn a_task_with_tool_calls_is_read_step_by_step() {
        let shell = call("c1", "shell", json!({"command": ["touch", "x"]}));
        let plan = call("c2", "update_plan", json!({"plan": []}));
        let run = Run::new(vec![
            started("make x"),
            step(1),
            EventKind::AssistantChunk {
                delta: "Let".into(),
            },
            EventKind::AssistantChunk {
                delta: " me".into(),
            },
            stepped(1, Some(usage(5))),
            said("Let me"),
            calls(&shell),
            answered(&shell, "exit code 0\n", false),
            calls(&plan),
            EventKind::PlanUpdated {
                explanation: None,
                plan: vec![],
            },
            answered(&plan, "plan updated", false),
            step(2),
            stepped(2, None),
            said("done"),
            finished(TaskStatus::Ok, "done", 2, None),
        ]);
        let r = run.recording();
        assert_eq!(r.input, "make x");
        assert_eq!(r.conversation_id, run.conversation);
        assert_eq!(r.first_seq, 10);
        assert_eq!(r.steps.len(), 2);
        assert_eq!(r.steps[0].chunks, ["Let", " me"]);
        let first = r.steps[0].answer.as_ref().unwrap();
        assert_eq!(first.text, "Let me");
        assert_eq!(first.tool_calls, [shell.clone(), plan.clone()]);
        assert_eq!(first.usage, Some(usage(5)));
        let second = r.steps[1].answer.as_ref().unwrap();
        assert_eq!((second.text.as_str(), second.tool_calls.len()), ("done", 0));
        assert_eq!(r.tool_results.len(), 2);
        assert_eq!(r.tool_results[0].call, shell);
        assert_eq!(
            r.tool_results[0].result.as_ref().unwrap().output,
            "exit code 0\n"
        );
        assert_eq!(
            r.builtins,
            ReachedBuiltins {
                shell: true,
                plan: true,
                apply_patch: false
            }
        );
        assert!(r.external_tools.is_empty());
        assert_eq!(r.routed_by, None);
        assert_eq!(r.end.status, TaskStatus::Ok);
        assert_eq!(r.events.len(), 15);
    }

    #[test]
    fn a_failed_model_step_answers_with_its_error() {
        let down = AgentError::ModelError {
            message: "503 from the provider".into(),
            retryable: true,
        };
        let run = Run::new(vec![
            started("hi"),
            step(1),
            EventKind::AssistantChunk {
                delta: "par".into(),
            },
            failed(down.clone()),
            finished(TaskStatus::Error, "", 1, Some(down.clone())),
        ]);
        let r = run.recording();
        assert_eq!(r.steps.len(), 1);
        assert_eq!(r.steps[0].chunks, ["par"]);
        assert_eq!(r.steps[0].answer, Err(down.clone()));
        assert_eq!(r.end.error, Some(down));
    }

    #[test]
    fn retries_are_attempts_of_one_call_and_an_unknown_tool_stays_unknown() {
        let flaky = call("c1", "srv__flaky", json!({}));
        let gone = call("c2", "srv__gone", json!({}));
        let broken = AgentError::McpError {
            server: "srv".into(),
            message: "reset".into(),
        };
        let unknown = ToolFailure::unknown_tool("srv__gone");
        let run = Run::new(vec![
            started("go"),
            step(1),
            stepped(1, None),
            calls(&flaky),
            failed(broken.clone()),
            answered(&flaky, &broken.to_string(), true),
            calls(&flaky),
            answered(&flaky, "ok", false),
            calls(&gone),
            failed(unknown.error.clone()),
            answered(&gone, &unknown.error.to_string(), true),
            step(2),
            stepped(2, None),
            said("done"),
            finished(TaskStatus::Ok, "done", 2, None),
        ]);
        let r = run.recording();
        let first = r.steps[0].answer.as_ref().unwrap();
        assert_eq!(first.tool_calls, [flaky.clone(), gone.clone()]);
        assert_eq!(r.tool_results.len(), 3);
        assert_eq!(r.tool_results[0].result, Err(ToolFailure::from(broken)));
        assert_eq!(r.tool_results[1].result.as_ref().unwrap().output, "ok");
        let refused = r.tool_results[2].result.as_ref().unwrap_err();
        assert_eq!(refused.kind, ToolFailureKind::UnknownTool);
        assert!(!refused.retryable());
        // Offered again: what was reached; a tool refused as unknown was not offered.
        assert_eq!(r.external_tools.iter().collect::<Vec<_>>(), ["srv__flaky"]);
    }

    #[test]
    fn a_call_whose_result_is_missing_is_offered_again_and_the_next_step_keeps_its_error() {
        let shell = call("c1", "shell", json!({"command": ["ls"]}));
        let down = AgentError::ModelError {
            message: "down".into(),
            retryable: false,
        };
        let r = Run::new(vec![
            started("go"),
            step(1),
            stepped(1, None),
            calls(&shell),
            step(2),
            failed(down.clone()),
            finished(TaskStatus::Error, "", 2, Some(down.clone())),
        ])
        .recording();
        assert!(
            r.builtins.shell,
            "called, so offered; its result will be missing"
        );
        assert!(r.tool_results.is_empty());
        assert_eq!(r.steps[1].answer, Err(down));
    }

    #[test]
    fn a_supervisors_routing_step_is_answered_with_the_route_it_decided() {
        let chain = ExecutionChain::start("supervisor").then("coder");
        let dispatch_id = DispatchId::new();
        let run = Run::new(vec![
            started("fix the build"),
            step(1),
            stepped(1, None),
            EventKind::RouteDecided {
                decision: RouteDecision::DispatchAgent,
                agent_id: Some("coder".into()),
                module: None,
                confidence: 0.75,
                source: RouteSource::Model,
                reason: "code work".into(),
            },
            EventKind::DispatchSent {
                dispatch_id,
                agent_id: "coder".into(),
                provider: ProviderKind::Model,
                provider_session_id: None,
                chain: chain.clone(),
                lease_ttl_ms: 1000,
                input: "fix the build, please".into(),
            },
            EventKind::DispatchResult {
                dispatch_id,
                agent_id: "coder".into(),
                provider_session_id: Some("p".into()),
                status: DispatchStatus::Ok,
                text: "fixed".into(),
                error: None,
                duration_ms: 3,
                validated: false,
            },
            said("fixed"),
            finished(TaskStatus::Ok, "fixed", 1, None),
        ]);
        let r = run.recording();
        assert_eq!(r.routed_by, Some(RouteSource::Model));
        let answer = r.steps[0].answer.as_ref().unwrap();
        assert_eq!(answer.tool_calls.len(), 1);
        let route = crate::agents::route::parse_route(&answer.tool_calls[0].arguments.0).unwrap();
        assert_eq!(route.decision, RouteDecision::DispatchAgent);
        assert_eq!(route.agent_id.as_deref(), Some("coder"));
        assert_eq!(route.input.as_deref(), Some("fix the build, please"));
        assert_eq!(
            (route.confidence, route.reason.as_str()),
            (0.75, "code work")
        );
        assert_eq!(
            r.dispatches,
            [Ok(AgentOutput {
                text: "fixed".into(),
                usage: None
            })]
        );
    }

    #[test]
    fn a_module_dispatch_decision_carries_the_modules_answer() {
        let recording = Run::new(vec![
            started("order it"),
            step(1),
            stepped(1, None),
            EventKind::RouteDecided {
                decision: RouteDecision::DispatchModule,
                agent_id: None,
                module: Some("orders".into()),
                confidence: 1.0,
                source: RouteSource::Model,
                reason: String::new(),
            },
            said("order 17 placed"),
            finished(TaskStatus::Ok, "order 17 placed", 1, None),
        ])
        .recording();
        let answer = recording.steps[0].answer.as_ref().unwrap();
        let route = crate::agents::route::parse_route(&answer.tool_calls[0].arguments.0).unwrap();
        assert_eq!(route.decision, RouteDecision::DispatchModule);
        assert_eq!(route.reply.as_deref(), Some("order 17 placed"));
    }

    #[test]
    fn a_direct_reply_carries_its_text_and_one_without_goes_on_with_the_turn() {
        let decided = |source| EventKind::RouteDecided {
            decision: RouteDecision::DirectReply,
            agent_id: None,
            module: None,
            confidence: 1.0,
            source,
            reason: String::new(),
        };
        let replied = Run::new(vec![
            started("hi"),
            step(1),
            stepped(1, None),
            decided(RouteSource::Model),
            said("hello there"),
            finished(TaskStatus::Ok, "hello there", 1, None),
        ])
        .recording();
        let answer = replied.steps[0].answer.as_ref().unwrap();
        let route = crate::agents::route::parse_route(&answer.tool_calls[0].arguments.0).unwrap();
        assert_eq!(route.reply.as_deref(), Some("hello there"));

        let went_on = Run::new(vec![
            started("hi"),
            step(1),
            stepped(1, None),
            decided(RouteSource::Model),
            step(2),
            stepped(2, None),
            said("from the turn"),
            finished(TaskStatus::Ok, "from the turn", 2, None),
        ])
        .recording();
        let routing = went_on.steps[0].answer.as_ref().unwrap();
        let route = crate::agents::route::parse_route(&routing.tool_calls[0].arguments.0).unwrap();
        assert_eq!(route.reply, None);
        assert_eq!(
            went_on.steps[1].answer.as_ref().unwrap().text,
            "from the turn"
        );
    }

    #[test]
    fn the_hubs_refusal_is_a_dispatchs_answer_and_an_unknown_module_or_a_refused_tool_is_not() {
        let chain = ExecutionChain::start("supervisor").then("a");
        let rejected = |reason| EventKind::PolicyRejected {
            agent_id: "a".into(),
            chain: chain.clone(),
            reason,
            message: "no".into(),
            tool: None,
        };
        // A refused tool call (the task's own, or an ACP sub-agent's) answers no dispatch.
        let refused_tool = EventKind::PolicyRejected {
            agent_id: "a".into(),
            chain: chain.clone(),
            reason: PolicyReason::ToolDenied,
            message: "tool `shell` is denied".into(),
            tool: Some("shell".into()),
        };
        let r = Run::new(vec![
            started("x"),
            refused_tool,
            rejected(PolicyReason::Cycle),
            rejected(PolicyReason::UnknownModule),
            finished(TaskStatus::Error, "", 0, None),
        ])
        .recording();
        assert_eq!(
            r.dispatches,
            [Err(AgentError::PolicyRejected {
                reason: PolicyReason::Cycle,
                chain: chain.0.clone(),
                message: "no".into(),
            })]
        );
    }

    fn a_run_with_a_call() -> Run {
        let shell = call("c1", "shell", json!({"command": ["ls"]}));
        Run::new(vec![
            started("list"),
            step(1),
            stepped(1, None),
            calls(&shell),
            answered(&shell, "a b", false),
            step(2),
            stepped(2, None),
            said("two files"),
            finished(TaskStatus::Ok, "two files", 2, None),
        ])
    }

    #[test]
    fn records_without_content_are_refused_naming_what_is_missing() {
        let run = a_run_with_a_call();
        let headers =
            Recording::of_task(run.task, &run.records(StoragePolicy::HeadersOnly)).unwrap_err();
        assert_eq!(headers.reason, RefusalReason::ContentNotKept);
        assert!(
            headers.message.contains("headers only"),
            "{}",
            headers.message
        );
        assert!(
            headers
                .message
                .contains("missing: the task's input, the model's answers (2 steps), the tool results (1 call)"),
            "{}",
            headers.message
        );
        let none = Recording::of_task(run.task, &run.records(StoragePolicy::None)).unwrap_err();
        assert_eq!(none.reason, RefusalReason::ContentNotKept);
        assert!(none.message.contains("(`none`)"), "{}", none.message);
        assert!(
            none.message
                .contains("missing: the task's input, the model's answers, the tool results"),
            "{}",
            none.message
        );
        // Ttl content that was still due is whole.
        assert!(
            Recording::of_task(run.task, &run.records(StoragePolicy::Ttl { secs: 60 })).is_ok()
        );
    }

    #[test]
    fn a_task_without_an_end_or_that_is_no_message_is_refused() {
        let mut run = a_run_with_a_call();
        run.events.pop();
        run.events.push(EventKind::TaskAborted { waited_ms: 0 });
        let aborted = Recording::of_task(run.task, &run.records(StoragePolicy::Full)).unwrap_err();
        assert_eq!(aborted.reason, RefusalReason::NoEnd);
        assert!(aborted.message.contains("aborted"), "{}", aborted.message);

        let compaction = Run::new(vec![
            EventKind::CompactionStarted {},
            step(1),
            stepped(1, None),
            said("summary"),
            finished(TaskStatus::Ok, "summary", 1, None),
        ]);
        let refused = Recording::of_task(compaction.task, &compaction.records(StoragePolicy::Full))
            .unwrap_err();
        assert_eq!(refused.reason, RefusalReason::NotAMessage);

        let other = TaskId::new();
        let missing = Recording::of_task(other, &run.records(StoragePolicy::Full)).unwrap_err();
        assert_eq!(missing.reason, RefusalReason::NotFound);

        // An agent's output guardrail refused its answers: the model's text was never
        // recorded, so its judgement cannot be made again.
        let mut guarded = a_run_with_a_call();
        let end = guarded.events.pop().unwrap();
        guarded.events.push(EventKind::GuardrailFailed {
            agent_id: Some("profiler".into()),
            attempts: 3,
            problems: vec!["/age: type".into()],
            status: troupe_proto::GuardrailStatus::Exhausted,
            action: troupe_proto::agent::GuardrailAction::Reject,
        });
        guarded.events.push(end);
        let refused =
            Recording::of_task(guarded.task, &guarded.records(StoragePolicy::Full)).unwrap_err();
        assert_eq!(refused.reason, RefusalReason::Guardrailed);
        assert!(refused.message.contains("guardrail"), "{}", refused.message);
    }
}
