//! How a replay's events are compared with the recorded ones. Pure.
//!
//! Each event is either compared, by its kind and the fields that say what happened
//! ([`treatment`]: ids, times, durations and the local token estimates are left out), or
//! played back (it came from an effect the replay does not run: an approval, an MCP server's
//! progress, an agent's dispatch and binding), or not compared (a warning about the session
//! around the task: its prompt budget, its MCP servers). The compared events of both runs are
//! diffed as sequences (Myers), so one event more or less shows as one difference.

use serde::Serialize;
use serde_json::{Value, json};
use troupe_proto::agent::PolicyReason;
use troupe_proto::{EventKind, WarningCode};

/// What a comparison does with one event.
#[derive(Debug, Clone, PartialEq)]
pub enum Treatment {
    /// Compared by this kind and these fields.
    Compared(ComparedEvent),
    /// Produced by an effect that a replay plays back instead of running: not produced again.
    PlayedBack,
    /// Depends on the session around the task, not on the task's recorded answers.
    NotCompared,
}

/// An event as it is compared: its kind and what it says, without ids, times or durations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComparedEvent {
    pub kind: &'static str,
    pub fields: Value,
}

impl ComparedEvent {
    fn new(event: &EventKind, fields: Value) -> Self {
        Self {
            kind: event.name().as_str(),
            fields,
        }
    }

    /// One line: the kind, then the fields as JSON.
    pub fn line(&self) -> String {
        format!("{} {}", self.kind, self.fields)
    }
}

/// How `event` is compared (see the module doc).
pub fn treatment(event: &EventKind) -> Treatment {
    use EventKind as E;
    let compared = |fields: Value| Treatment::Compared(ComparedEvent::new(event, fields));
    match event {
        E::TaskStarted { input } => compared(json!({ "input": input })),
        E::TaskFinished {
            status,
            text,
            stats,
            error,
        } => compared(json!({
            "status": status,
            "text": text,
            "error": error,
            "turn": stats.turn,
            "steps": stats.steps,
            "tool_calls": stats.tool_calls,
            "usage": stats.usage,
            "steps_with_usage": stats.steps_with_usage,
            "mcp_calls": stats.mcp_calls,
        })),
        E::TaskAborted { .. } => compared(json!({})),
        E::StepStarted { turn, step } => compared(json!({ "turn": turn, "step": step })),
        E::StepFinished {
            turn, step, usage, ..
        } => compared(json!({ "turn": turn, "step": step, "usage": usage })),
        E::AssistantChunk { delta } => compared(json!({ "delta": delta })),
        E::AssistantMessage { text } => compared(json!({ "text": text })),
        E::ToolCallStarted { call, agent_id } => match agent_id {
            Some(agent_id) => compared(json!({ "call": call, "agent_id": agent_id })),
            None => compared(json!({ "call": call })),
        },
        E::ToolCallFinished {
            call_id,
            name,
            output,
            is_error,
            ..
        } => compared(json!({
            "call_id": call_id,
            "name": name,
            "output": output,
            "is_error": is_error,
        })),
        E::Error { error } => compared(json!({ "error": error })),
        E::PlanUpdated { explanation, plan } => {
            compared(json!({ "explanation": explanation, "plan": plan }))
        }
        E::CompactionStarted {} => compared(json!({})),
        E::Compacted {
            summary,
            replaced_items,
        } => compared(json!({ "summary": summary, "replaced_items": replaced_items })),
        E::RouteDecided {
            decision,
            agent_id,
            module,
            confidence,
            source,
            reason,
        } => compared(json!({
            "decision": decision,
            "agent_id": agent_id,
            "module": module,
            "confidence": confidence,
            "source": source,
            "reason": reason,
        })),
        // The task refuses a module and a tool its policy denies itself; the hub refuses
        // dispatches (played back).
        E::PolicyRejected {
            agent_id,
            chain,
            reason: reason @ (PolicyReason::UnknownModule | PolicyReason::ToolDenied),
            message,
            tool,
        } => compared(json!({
            "agent_id": agent_id,
            "chain": chain,
            "reason": reason,
            "message": message,
            "tool": tool,
        })),
        E::AskHuman { question } => compared(json!({ "question": question })),
        E::PolicyRejected { .. }
        | E::ApprovalRequested { .. }
        | E::ApprovalResolved { .. }
        | E::ToolProgress { .. }
        | E::DispatchSent { .. }
        | E::DispatchResult { .. }
        | E::SessionCreated { .. }
        | E::SessionBound { .. }
        | E::SessionResumed { .. }
        | E::AgentUpdate { .. } => Treatment::PlayedBack,
        E::Warning { code, .. } => match code {
            WarningCode::BindingReplaced
            | WarningCode::LeaseExpired
            | WarningCode::UngovernedToolCall => Treatment::PlayedBack,
            _ => Treatment::NotCompared,
        },
        E::ConversationOpened { .. }
        | E::ConversationClosed { .. }
        | E::ConversationRestarted { .. }
        | E::HistoryTrimmed { .. }
        | E::McpServerReady { .. }
        | E::MessageUpdated { .. }
        | E::HistoryCheckpoint { .. } => Treatment::NotCompared,
        // A kind this comparison does not know yet is compared whole: a difference points at
        // it rather than hiding it.
        other => compared(serde_json::to_value(other).unwrap_or(Value::Null)),
    }
}

/// The outcome of comparing two runs' events.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Compared events of the recording and of the replay.
    pub recorded: usize,
    pub replayed: usize,
    /// Events of the recording that came from effects a replay plays back.
    pub played_back: usize,
    /// Events of the recording that were not compared.
    pub not_compared: usize,
    /// The first differences, in order (at most [`MAX_DIFFERENCES`]).
    pub differences: Vec<Difference>,
    /// How many differences there are in all.
    pub difference_count: usize,
}

/// Differences listed at most.
pub const MAX_DIFFERENCES: usize = 10;

/// One difference: an event of one run that the other has not at that place (or has
/// otherwise). Positions count compared events, from 1.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    pub recorded_at: Option<usize>,
    pub replayed_at: Option<usize>,
    pub recorded: Option<ComparedEvent>,
    pub replayed: Option<ComparedEvent>,
}

/// Compares the recorded events with the replayed ones.
pub fn compare(recorded: &[EventKind], replayed: &[EventKind]) -> Comparison {
    let mut played_back = 0;
    let mut not_compared = 0;
    let mut old = Vec::new();
    for event in recorded {
        match treatment(event) {
            Treatment::Compared(c) => old.push(c),
            Treatment::PlayedBack => played_back += 1,
            Treatment::NotCompared => not_compared += 1,
        }
    }
    let new: Vec<ComparedEvent> = replayed
        .iter()
        .filter_map(|e| match treatment(e) {
            Treatment::Compared(c) => Some(c),
            _ => None,
        })
        .collect();
    let (old_lines, new_lines): (Vec<String>, Vec<String>) = (
        old.iter().map(ComparedEvent::line).collect(),
        new.iter().map(ComparedEvent::line).collect(),
    );
    let mut differences = Vec::new();
    let mut push = |o: Option<usize>, n: Option<usize>| {
        differences.push(Difference {
            recorded_at: o.map(|i| i + 1),
            replayed_at: n.map(|i| i + 1),
            recorded: o.and_then(|i| old.get(i).cloned()),
            replayed: n.and_then(|i| new.get(i).cloned()),
        });
    };
    for op in similar::capture_diff_slices(similar::Algorithm::Myers, &old_lines, &new_lines) {
        match op {
            similar::DiffOp::Equal { .. } => {}
            similar::DiffOp::Delete {
                old_index, old_len, ..
            } => (old_index..old_index + old_len).for_each(|i| push(Some(i), None)),
            similar::DiffOp::Insert {
                new_index, new_len, ..
            } => (new_index..new_index + new_len).for_each(|i| push(None, Some(i))),
            similar::DiffOp::Replace {
                old_index,
                old_len,
                new_index,
                new_len,
            } => {
                for k in 0..old_len.max(new_len) {
                    push(
                        (k < old_len).then_some(old_index + k),
                        (k < new_len).then_some(new_index + k),
                    );
                }
            }
        }
    }
    let difference_count = differences.len();
    differences.truncate(MAX_DIFFERENCES);
    Comparison {
        recorded: old.len(),
        replayed: new.len(),
        played_back,
        not_compared,
        differences,
        difference_count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::agent::{ExecutionChain, PolicyReason};
    use troupe_proto::{AgentError, ApprovalId, ApprovalSubject, TaskStats, TaskStatus, ToolCall};

    fn finished(duration_ms: u64, trace: &str, error: Option<AgentError>) -> EventKind {
        EventKind::TaskFinished {
            status: if error.is_some() {
                TaskStatus::Error
            } else {
                TaskStatus::Ok
            },
            text: "done".into(),
            stats: TaskStats {
                steps: 2,
                tool_calls: 1,
                duration_ms,
                trace_id: trace.into(),
                estimated_prompt_tokens: duration_ms * 3,
                ..TaskStats::default()
            },
            error,
        }
    }

    fn tool_done(duration_ms: u64, output: &str) -> EventKind {
        EventKind::ToolCallFinished {
            call_id: "c1".into(),
            name: "shell".into(),
            output: output.into(),
            is_error: false,
            duration_ms,
            agent_id: None,
        }
    }

    fn step_done(estimate: u64) -> EventKind {
        EventKind::StepFinished {
            turn: 1,
            step: 1,
            estimated_prompt_tokens: estimate,
            usage: None,
            estimated_completion_tokens: Some(estimate),
        }
    }

    fn approval() -> EventKind {
        EventKind::ApprovalRequested {
            approval_id: ApprovalId::new(),
            command: vec!["ls".into()],
            reason: "r".into(),
            subject: ApprovalSubject::Command,
        }
    }

    #[test]
    fn ids_times_durations_estimates_and_played_back_effects_are_not_differences() {
        let recorded = [
            EventKind::TaskStarted { input: "x".into() },
            step_done(120),
            approval(),
            tool_done(35, "ok"),
            EventKind::Warning {
                code: WarningCode::PromptTokensWarning,
                message: "big".into(),
            },
            finished(900, "aaaa", None),
        ];
        let replayed = [
            EventKind::TaskStarted { input: "x".into() },
            step_done(80),
            tool_done(0, "ok"),
            finished(3, "bbbb", None),
        ];
        let c = compare(&recorded, &replayed);
        assert_eq!(c.difference_count, 0, "{:?}", c.differences);
        assert_eq!((c.recorded, c.replayed), (4, 4));
        assert_eq!((c.played_back, c.not_compared), (1, 1));
    }

    #[test]
    fn a_missing_event_is_one_difference_and_a_changed_one_shows_both_sides() {
        let recorded = [
            EventKind::TaskStarted { input: "x".into() },
            tool_done(1, "first"),
            tool_done(1, "second"),
            finished(1, "t", None),
        ];
        let dropped = [
            EventKind::TaskStarted { input: "x".into() },
            tool_done(1, "first"),
            finished(1, "t", None),
        ];
        let c = compare(&recorded, &dropped);
        assert_eq!(c.difference_count, 1);
        let d = &c.differences[0];
        assert_eq!((d.recorded_at, d.replayed_at), (Some(3), None));
        assert_eq!(d.recorded.as_ref().unwrap().kind, "tool_call_finished");
        assert!(d.replayed.is_none());

        let failed = AgentError::ToolError {
            name: "shell".into(),
            message: "boom".into(),
        };
        let changed = [
            EventKind::TaskStarted { input: "x".into() },
            tool_done(1, "first"),
            tool_done(1, "second"),
            finished(1, "t", Some(failed)),
        ];
        let c = compare(&recorded, &changed);
        assert_eq!(c.difference_count, 1);
        let d = &c.differences[0];
        assert_eq!((d.recorded_at, d.replayed_at), (Some(4), Some(4)));
        assert!(d.replayed.as_ref().unwrap().line().contains("tool_error"));
    }

    #[test]
    fn differences_are_listed_up_to_the_bound_and_all_counted() {
        let recorded: Vec<EventKind> = (0..15)
            .map(|i| EventKind::AssistantChunk {
                delta: format!("{i}"),
            })
            .collect();
        let c = compare(&recorded, &[]);
        assert_eq!(c.difference_count, 15);
        assert_eq!(c.differences.len(), MAX_DIFFERENCES);
    }

    #[test]
    fn effects_are_played_back_and_the_tasks_own_decisions_compared() {
        let chain = ExecutionChain::start("s");
        let rejected = |reason| EventKind::PolicyRejected {
            agent_id: "a".into(),
            chain: chain.clone(),
            reason,
            message: "m".into(),
            tool: None,
        };
        assert_eq!(
            treatment(&rejected(PolicyReason::Depth)),
            Treatment::PlayedBack
        );
        assert!(matches!(
            treatment(&rejected(PolicyReason::UnknownModule)),
            Treatment::Compared(_)
        ));
        assert_eq!(treatment(&approval()), Treatment::PlayedBack);
        for (code, expected) in [
            (WarningCode::LeaseExpired, Treatment::PlayedBack),
            (WarningCode::BindingReplaced, Treatment::PlayedBack),
            (WarningCode::UngovernedToolCall, Treatment::PlayedBack),
            (WarningCode::PromptTrimmed, Treatment::NotCompared),
            (WarningCode::McpToolsUnavailable, Treatment::NotCompared),
        ] {
            let w = EventKind::Warning {
                code,
                message: String::new(),
            };
            assert_eq!(treatment(&w), expected, "{code:?}");
        }
        let call = EventKind::ToolCallStarted {
            call: ToolCall {
                call_id: "c".into(),
                name: "shell".into(),
                arguments: troupe_proto::Json(serde_json::json!({"command": ["ls"]})),
            },
            agent_id: None,
        };
        let Treatment::Compared(c) = treatment(&call) else {
            panic!("a call is compared")
        };
        assert_eq!(
            c.line(),
            r#"tool_call_started {"call":{"call_id":"c","name":"shell","arguments":{"command":["ls"]}}}"#
        );
    }
}
