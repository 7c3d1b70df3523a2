//! One model step of a turn: the prompt fitted to its token budget, the streamed call, and its
//! chunks forwarded as `assistant_chunk` events.

use super::*;

/// Forwards streamed text as `assistant_chunk` events.
pub(super) struct ChunkEvents<'a> {
    pub(super) ctx: &'a TaskContext,
    /// An output guardrail holds the text back until it is validated (A8).
    pub(super) hold: bool,
}

impl DeltaSink for ChunkEvents<'_> {
    fn text_delta(&mut self, delta: &str) {
        if self.hold {
            return;
        }
        self.ctx.events.emit(
            EventDraft::task(
                self.ctx.conversation_id,
                self.ctx.task_id,
                EventKind::AssistantChunk {
                    delta: delta.to_owned(),
                },
            )
            .carrying_content_since(self.ctx.content_since_ms),
        );
    }
}

pub(super) async fn model_step(
    ctx: &TaskContext,
    model: &Arc<dyn ModelClient>,
    prepared: &Prepared,
    items: &[HistoryItem],
    step: u32,
) -> Result<(crate::ports::ModelResponse, u64), AgentError> {
    let full = ctx.history.view(ctx.pinned.as_ref(), &[], items);
    // A compaction exists to make the history smaller: over the budget it summarizes what
    // fits (the oldest items left out), whatever the policy, rather than being rejected for
    // the very size it is there to shrink.
    let policy = if ctx.turn_override.is_some() {
        troupe_proto::OverBudget::Trim
    } else {
        ctx.limits.over_budget
    };
    let fitted = fit_budget(
        full,
        ctx.tokens.as_ref(),
        prepared.fixed_tokens,
        ctx.limits.max_prompt_tokens,
        policy,
    )?;
    if fitted.prompt.skipped() > 0 {
        ctx.emit(EventKind::Warning {
            code: WarningCode::PromptTrimmed,
            message: format!(
                "left out the {} oldest history items to fit max-prompt-tokens ({} -> {} tokens)",
                fitted.prompt.skipped(),
                fitted.before,
                fitted.estimate
            ),
        });
    }
    if let Some(warn) = ctx.limits.warn_prompt_tokens
        && fitted.estimate > warn
    {
        ctx.emit(EventKind::Warning {
            code: WarningCode::PromptTokensWarning,
            message: format!(
                "prompt is {} tokens ({}), above warn-prompt-tokens {warn}",
                fitted.estimate,
                ctx.tokens.encoding()
            ),
        });
    }
    let request = ModelRequest {
        conversation_id: ctx.conversation_id,
        task_id: ctx.task_id,
        instructions: &prepared.instructions,
        prompt: fitted.prompt,
        tools: &prepared.tools.specs,
        prompt_cache_key: &prepared.cache_key,
    };
    let info = model.info();
    let span = spans::chat(
        ctx.conversation_id,
        ctx.task_id,
        &info.provider,
        &info.model,
        step,
        fitted.estimate,
    );
    // Under an output guardrail (A8) the step's messages are not recorded: its prompt may
    // hold an invalid answer and the request to correct it, its output is not validated
    // (nor masked) yet, and neither is in any stored record.
    let messages = ctx.record_content && !prepared.hold_output;
    if ctx.record_content {
        span.record(
            "gen_ai.system_instructions",
            spans::system_instructions(request.instructions),
        );
    }
    if messages {
        span.record(
            "gen_ai.input.messages",
            spans::input_messages(request.prompt.iter()),
        );
    }
    let mut sink = ChunkEvents {
        ctx,
        hold: prepared.hold_output,
    };
    let response = model
        .step(request, &mut sink, &ctx.cancel)
        .instrument(span.clone())
        .await
        .inspect_err(|e| spans::record_error(&span, e))?;
    spans::record_response(&span, &response);
    if messages {
        span.record("gen_ai.output.messages", spans::output_messages(&response));
    }
    Ok((response, fitted.estimate))
}

/// Tokens of the parts of a prompt that do not change between steps: the instructions and
/// the tool descriptions (name, description and parameter schema of each tool).
pub fn fixed_prompt_tokens(
    counter: &dyn TokenCounter,
    instructions: &str,
    tools: &crate::tools::OfferedTools,
) -> u64 {
    let tools: usize = tools
        .specs
        .iter()
        .zip(tools.schemas.iter())
        .map(|(t, schema)| {
            counter.count(&t.name) + counter.count(&t.description) + counter.count(schema)
        })
        .sum();
    as_u64(counter.count(instructions) + tools)
}

/// A prompt that fits the budget.
#[derive(Clone, Copy)]
pub struct Fitted<'a> {
    pub prompt: crate::history::PromptView<'a>,
    /// Estimate of what is sent.
    pub estimate: u64,
    /// Estimate before trimming.
    pub before: u64,
}

/// Applies `max-prompt-tokens` (T5): under it, the prompt as is; over it, an error
/// (`Reject`) or the prompt without its oldest history items (`Trim`; an error if even the
/// untouchable parts are over).
pub fn fit_budget<'a>(
    prompt: crate::history::PromptView<'a>,
    counter: &dyn TokenCounter,
    fixed: u64,
    max: Option<u64>,
    policy: OverBudget,
) -> Result<Fitted<'a>, AgentError> {
    let before = fixed + as_u64(prompt.iter().map(|i| counter.count_item(i)).sum());
    let Some(max) = max.filter(|m| before > *m) else {
        return Ok(Fitted {
            prompt,
            estimate: before,
            before,
        });
    };
    let over = |estimate: u64| AgentError::InvalidInput {
        message: format!(
            "prompt of {estimate} tokens ({}) is over max-prompt-tokens {max}",
            counter.encoding()
        ),
    };
    if policy == OverBudget::Reject {
        return Err(over(before));
    }
    // Drop the oldest droppable items until the rest fits.
    let mut estimate = before;
    let mut dropped = 0;
    for item in prompt.droppable_items() {
        if estimate <= max {
            break;
        }
        estimate -= as_u64(counter.count_item(item));
        dropped += 1;
    }
    if estimate > max {
        return Err(over(estimate));
    }
    Ok(Fitted {
        prompt: prompt.without_oldest(dropped),
        estimate,
        before,
    })
}

pub(super) fn as_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
