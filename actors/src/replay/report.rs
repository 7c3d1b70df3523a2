//! What a replay reports: the outcome, both ends (status and error class), what was played
//! back, and the first differences; as JSON (`--json`) and for a person ([`ReplayReport::human`]).

use super::compare::{Comparison, Difference};
use super::recording::Refusal;
use serde::Serialize;
use std::fmt::Write as _;
use troupe_proto::{AgentError, ConversationId, ErrorKind, SessionId, TaskId, TaskStatus};

/// How a replay came out (a bounded metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayOutcome {
    /// The same events and the same end, error class included.
    Identical,
    /// Something came out otherwise (see the differences).
    Differs,
    /// The task cannot be replayed (see the refusal).
    Refused,
}

impl ReplayOutcome {
    pub const ALL: [Self; 3] = [Self::Identical, Self::Differs, Self::Refused];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Identical => "identical",
            Self::Differs => "differs",
            Self::Refused => "refused",
        }
    }
}

/// How one run of the task ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunEnd {
    pub task_id: TaskId,
    pub status: TaskStatus,
    /// The class of its error (`None`: it ended without one).
    pub error_kind: Option<ErrorKind>,
    pub error: Option<AgentError>,
}

impl RunEnd {
    pub fn new(task_id: TaskId, status: TaskStatus, error: Option<AgentError>) -> Self {
        Self {
            task_id,
            status,
            error_kind: error.as_ref().map(AgentError::kind),
            error,
        }
    }

    fn line(&self) -> String {
        match self.error_kind {
            Some(kind) => format!("{} ({})", self.status.as_str(), kind.as_str()),
            None => self.status.as_str().to_owned(),
        }
    }
}

/// What a replay played back in place of running it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PlayedBack {
    pub model_answers: usize,
    pub tool_results: usize,
    pub dispatch_answers: usize,
}

/// The report of one replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    pub task_id: TaskId,
    pub outcome: ReplayOutcome,
    /// Why it could not be replayed (outcome `refused`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Refusal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<ConversationId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<RunEnd>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<RunEnd>,
    /// Both runs ended with the same status and the same error class.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_end: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub played_back: Option<PlayedBack>,
    /// The events compared, and how they differ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<Comparison>,
}

impl ReplayReport {
    /// The report of a task that cannot be replayed.
    pub fn refused(task_id: TaskId, refusal: Refusal) -> Self {
        Self {
            task_id,
            outcome: ReplayOutcome::Refused,
            refusal: Some(refusal),
            session_id: None,
            conversation_id: None,
            recorded: None,
            replayed: None,
            same_end: None,
            played_back: None,
            events: None,
        }
    }

    /// The report for a person, a few lines.
    pub fn human(&self) -> String {
        let mut out = String::new();
        let _ = write!(
            out,
            "replay of task {}: {}",
            self.task_id,
            self.outcome.as_str()
        );
        if let Some(refusal) = &self.refusal {
            let _ = writeln!(out, "\n  {}", refusal.message);
            return out;
        }
        if let Some(events) = &self.events
            && events.difference_count > 0
        {
            let _ = write!(
                out,
                " ({} {})",
                events.difference_count,
                if events.difference_count == 1 {
                    "difference"
                } else {
                    "differences"
                }
            );
        }
        out.push('\n');
        if let (Some(recorded), Some(replayed)) = (&self.recorded, &self.replayed) {
            let verdict = if self.same_end == Some(true) {
                if recorded.error_kind.is_some() {
                    "same end, same error class"
                } else {
                    "same end"
                }
            } else if recorded.error_kind != replayed.error_kind {
                "the error class differs"
            } else {
                "the status differs"
            };
            let _ = writeln!(
                out,
                "  recorded: {}   replayed: {}   {verdict}",
                recorded.line(),
                replayed.line()
            );
        }
        if let Some(events) = &self.events {
            let _ = writeln!(
                out,
                "  events: {} compared (replay: {}), {} played back, {} not compared",
                events.recorded, events.replayed, events.played_back, events.not_compared
            );
        }
        if let Some(p) = &self.played_back {
            let _ = writeln!(
                out,
                "  played back: {} model answers, {} tool results, {} dispatch answers",
                p.model_answers, p.tool_results, p.dispatch_answers
            );
        }
        if let Some(events) = &self.events {
            for d in &events.differences {
                out.push_str(&difference_lines(d));
            }
            let more = events.difference_count - events.differences.len();
            if more > 0 {
                let _ = writeln!(out, "  ... and {more} more");
            }
        }
        out
    }
}

/// Longest event text shown in a difference.
const SHOWN_CHARS: usize = 200;

fn difference_lines(d: &Difference) -> String {
    // Both sides of one kind: only the fields that differ, so that the change shows.
    let (recorded, replayed) = match (&d.recorded, &d.replayed) {
        (Some(a), Some(b)) if a.kind == b.kind => match (&a.fields, &b.fields) {
            (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                let differing =
                    |from: &serde_json::Map<String, serde_json::Value>,
                     other: &serde_json::Map<String, serde_json::Value>| {
                        let kept: serde_json::Map<String, serde_json::Value> = from
                            .iter()
                            .filter(|(k, v)| other.get(*k) != Some(*v))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        format!("{} {}", a.kind, serde_json::Value::Object(kept))
                    };
                (Some(differing(x, y)), Some(differing(y, x)))
            }
            _ => (Some(a.line()), Some(b.line())),
        },
        (a, b) => (
            a.as_ref().map(super::compare::ComparedEvent::line),
            b.as_ref().map(super::compare::ComparedEvent::line),
        ),
    };
    let show = |at: Option<usize>, line: Option<String>| match line {
        Some(line) => {
            let cut: String = line.chars().take(SHOWN_CHARS).collect();
            let more = if cut.len() < line.len() { " ..." } else { "" };
            format!("#{} {cut}{more}", at.unwrap_or(0))
        }
        None => "(none)".to_owned(),
    };
    format!(
        "  - recorded {}\n    replayed {}\n",
        show(d.recorded_at, recorded),
        show(d.replayed_at, replayed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::compare::compare;
    use troupe_proto::EventKind;

    fn finished(text: &str, error: Option<AgentError>) -> EventKind {
        EventKind::TaskFinished {
            status: if error.is_some() {
                TaskStatus::Error
            } else {
                TaskStatus::Ok
            },
            text: text.into(),
            stats: Default::default(),
            error,
        }
    }

    #[test]
    fn a_person_reads_the_outcome_both_ends_and_what_changed() {
        let (recorded, replayed) = (
            [finished("Three files.", None)],
            [finished(
                "Two files.",
                Some(AgentError::ToolError {
                    name: "shell".into(),
                    message: "boom".into(),
                }),
            )],
        );
        let task = TaskId::new();
        let report = ReplayReport {
            task_id: task,
            outcome: ReplayOutcome::Differs,
            refusal: None,
            session_id: None,
            conversation_id: None,
            recorded: Some(RunEnd::new(task, TaskStatus::Ok, None)),
            replayed: Some(RunEnd::new(
                TaskId::new(),
                TaskStatus::Error,
                Some(AgentError::internal("x")),
            )),
            same_end: Some(false),
            played_back: Some(PlayedBack {
                model_answers: 2,
                tool_results: 1,
                dispatch_answers: 0,
            }),
            events: Some(compare(&recorded, &replayed)),
        };
        let text = report.human();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            format!("replay of task {task}: differs (1 difference)")
        );
        assert_eq!(
            lines[1],
            "  recorded: ok   replayed: error (internal)   the error class differs"
        );
        assert_eq!(
            lines[2],
            "  events: 1 compared (replay: 1), 0 played back, 0 not compared"
        );
        assert_eq!(
            lines[4],
            r#"  - recorded #1 task_finished {"status":"ok","text":"Three files.","error":null}"#
        );
        assert!(
            lines[5].starts_with(r#"    replayed #1 task_finished {"status":"error","text":"Two files.","error":{"tool_error""#),
            "{}",
            lines[5]
        );
        let refused = ReplayReport::refused(task, crate::replay::Refusal::not_found(task, "data"));
        assert_eq!(
            refused.human(),
            format!("replay of task {task}: refused\n  no rollout in data holds task {task}\n")
        );
    }
}
