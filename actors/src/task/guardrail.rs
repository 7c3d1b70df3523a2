//! An agent's output guardrail inside its task (A8): every answer without tool calls is
//! checked ([`judge`]); an invalid one is asked for again with the errors (the exchange stays
//! out of history and out of every event), at most `maxRetries` times; then the task fails
//! with `guardrail_failed` or asks a human ([`exhausted`]); so does a task that runs out of
//! steps before a valid answer ([`out_of_steps`]). While a schema applies, nothing
//! the model writes reaches anyone before it is validated: its chunks are held back (see
//! `ChunkEvents`) and only the validated, masked JSON is the answer.

use super::*;
use crate::governance::guardrail::{Checked, OutputGuard, retry_request};
use crate::governance::metrics as gmetrics;
use std::borrow::Cow;
use troupe_proto::GuardrailStatus;
use troupe_proto::agent::GuardrailAction;

/// A task's guardrail and where it stands.
pub(super) struct Guarded {
    guard: OutputGuard,
    agent_id: Option<String>,
    /// Answers checked so far.
    attempts: u32,
    /// The last invalid answer and the request to correct it: in the next prompt only.
    pub(super) retry: Vec<HistoryItem>,
    /// What was wrong with the last invalid answer, as it may be told (`/age: type`).
    problems: Vec<String>,
}

/// How a guardrail ended without a valid answer.
pub(super) struct Exhausted {
    agent_id: Option<String>,
    attempts: u32,
    problems: Vec<String>,
    status: GuardrailStatus,
    action: GuardrailAction,
}

/// What became of an answer.
pub(super) enum Judged {
    /// Valid: the masked JSON, as text.
    Answer(String),
    /// Invalid, and the model is asked again.
    Retry,
    Exhausted(Exhausted),
}

/// The task's guardrail: its agent's `output`, compiled once per task.
pub(super) fn guard_of(
    agents: Option<&super::agents::Agents>,
) -> Result<Option<Guarded>, AgentError> {
    let Some(own) = agents.and_then(|a| a.view.own.as_ref()) else {
        return Ok(None);
    };
    let Some(spec) = &own.output else {
        return Ok(None);
    };
    let guard = OutputGuard::compile(spec).map_err(|e| {
        AgentError::invalid(format!("agent `{}`: field `output.schema`: {e}", own.id))
    })?;
    Ok(Some(Guarded {
        guard,
        agent_id: Some(own.id.clone()),
        attempts: 0,
        retry: Vec::new(),
        problems: Vec::new(),
    }))
}

/// The prompt's items: history, and a pending retry exchange.
pub(super) fn prompt<'a>(
    items: &'a [HistoryItem],
    guarded: Option<&Guarded>,
) -> Cow<'a, [HistoryItem]> {
    match guarded {
        Some(g) if !g.retry.is_empty() => {
            Cow::Owned(items.iter().chain(&g.retry).cloned().collect())
        }
        _ => Cow::Borrowed(items),
    }
}

/// Checks one answer.
pub(super) fn judge(ctx: &TaskContext, g: &mut Guarded, text: &str) -> Judged {
    g.attempts += 1;
    let span = tracing::info_span!(
        "troupe.guardrail",
        attempt = g.attempts,
        outcome = tracing::field::Empty,
        conversation_id = %ctx.conversation_id,
        task_id = %ctx.task_id,
    );
    let _entered = span.enter();
    let started = Instant::now();
    let checked = g.guard.check(text);
    gmetrics::guardrail_checked(matches!(checked, Checked::Valid(_)), started.elapsed());
    match checked {
        Checked::Valid(value) => {
            span.record("outcome", "valid");
            g.retry.clear();
            Judged::Answer(value.to_string())
        }
        Checked::Invalid(problems) => {
            span.record("outcome", "invalid");
            let public: Vec<String> = problems.iter().map(|p| p.public()).collect();
            tracing::info!(attempt = g.attempts, problems = %public.join("; "), "answer does not match its schema");
            if g.attempts > g.guard.max_retries {
                return Judged::Exhausted(Exhausted {
                    agent_id: g.agent_id.clone(),
                    attempts: g.attempts,
                    problems: public,
                    status: GuardrailStatus::Exhausted,
                    action: g.guard.on_failure,
                });
            }
            g.problems.clone_from(&public);
            gmetrics::guardrail_retried();
            ctx.emit(EventKind::Warning {
                code: WarningCode::GuardrailRetry,
                message: format!(
                    "answer {} does not match the output schema ({}); asking again",
                    g.attempts,
                    public.join("; ")
                ),
            });
            g.retry = vec![
                HistoryItem::assistant(text.to_owned()),
                HistoryItem::user(retry_request(&problems, g.guard.schema())),
            ];
            Judged::Retry
        }
    }
}

/// The task ran out of steps without a valid answer (an invalid one was to be asked for
/// again, or the model kept calling tools): it ends as when the retries are spent, never
/// with an empty answer. The problems are the last invalid answer's, then `/: max_steps`.
pub(super) fn out_of_steps(g: &Guarded) -> Exhausted {
    let mut problems = g.problems.clone();
    problems.push("/: max_steps".to_owned());
    Exhausted {
        agent_id: g.agent_id.clone(),
        attempts: g.attempts,
        problems,
        status: GuardrailStatus::MaxSteps,
        action: g.guard.on_failure,
    }
}

/// The retries are spent (or the steps): `guardrail_failed`, then the task fails or asks a
/// human.
pub(super) fn exhausted(
    ctx: &TaskContext,
    mut loop_state: LoopState,
    end: Exhausted,
) -> TaskOutcome {
    gmetrics::guardrail_failed(end.action);
    ctx.emit(EventKind::GuardrailFailed {
        agent_id: end.agent_id.clone(),
        attempts: end.attempts,
        problems: end.problems.clone(),
        status: end.status,
        action: end.action,
    });
    match end.action {
        GuardrailAction::Reject => {
            let error = AgentError::GuardrailFailed {
                attempts: end.attempts,
                problems: end.problems,
            };
            ctx.emit(EventKind::Error {
                error: error.clone(),
            });
            loop_state.end(TaskStatus::Error, Some(error))
        }
        GuardrailAction::AskHuman => {
            let who = end
                .agent_id
                .map_or_else(|| "The agent".to_owned(), |a| format!("Agent `{a}`"));
            let question = match end.status {
                GuardrailStatus::Exhausted => format!(
                    "{who} could not give an answer that matches its output schema in {} attempts ({}). How should it go on?",
                    end.attempts,
                    end.problems.join("; ")
                ),
                GuardrailStatus::MaxSteps => format!(
                    "{who} ran out of steps before an answer that matches its output schema ({}). How should it go on?",
                    end.problems.join("; ")
                ),
            };
            ctx.emit(EventKind::AskHuman {
                question: question.clone(),
            });
            ctx.emit(EventKind::AssistantMessage {
                text: question.clone(),
            });
            loop_state
                .items
                .push(HistoryItem::assistant(question.clone()));
            loop_state.last_text = question;
            loop_state.end(TaskStatus::Ok, None)
        }
    }
}
