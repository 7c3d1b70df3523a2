//! A task among agents (A3, A4): routing a user's message before the turn, and dispatching
//! to an agent (the route's dispatch, a `dispatch_agent` call), with the slot lent to an
//! in-process agent's task or given back for the wait.
//!
//! Routing, once the task holds its slot: `/hub <agent> <text>` dispatches straight to the
//! agent; otherwise the supervisor decides, by one model step offered only the `route` tool
//! (`[agents] router = "model"`) or by the rules. `route_decided` says what was decided. A
//! direct reply without text goes on with the conversation's turn (with its tools, and
//! `dispatch_agent` among them); everything else ends the task with its answer: the agent's
//! reply, the reply text, the question asked (`ask_human`), the reason of a rejection, or the
//! error (a refused dispatch, an unknown module).

use super::*;
use crate::agents::hub::{AgentHubMsg, AgentView, DispatchRequest, HubRef, Router};
use crate::agents::route::{self, DISPATCH_TOOL, Route, hub_command, parse_route, rules_route};
use crate::agents::{AgentOutput, DispatchOrigin, DispatchParent, RouterMode};
use ractor::ActorRef;
use troupe_proto::agent::{PolicyReason, RouteDecision, RouteSource};

/// What a task carries about agents from its conversation.
#[derive(Debug, Clone, Default)]
pub struct TaskAgents {
    /// Its dispatch, when it is an agent's task (`None`: a user's message, which is routed).
    pub origin: Option<DispatchOrigin>,
}

/// The session's agents as this task sees them.
pub(super) struct Agents {
    hub: ActorRef<AgentHubMsg>,
    pub(super) view: AgentView,
    origin: Option<DispatchOrigin>,
}

impl Agents {
    /// The `dispatch_agent` tool, when the task has agents in sight (built with its view).
    pub(super) fn dispatch_tool(&self) -> Option<crate::tools::OfferedTools> {
        self.view.dispatch_tool.clone()
    }
}

/// The agents of the task's session, when it has a hub (read once, at the task's start,
/// from what the session published with its hub: no message to the hub).
pub(super) fn agents_of(ctx: &TaskContext) -> Option<Agents> {
    let wanted = ctx.agents.as_ref()?;
    let HubRef { actor: hub, views } = ctx.services.hub()?;
    let origin = wanted.origin.clone();
    let view = views.view(origin.as_ref().map(|o| &o.chain));
    Some(Agents { hub, view, origin })
}

/// Tells the hub, when dropped armed, that the task no longer waits for its dispatches.
struct StopsWaiting {
    hub: Option<ActorRef<AgentHubMsg>>,
    parent: DispatchParent,
}

impl Drop for StopsWaiting {
    fn drop(&mut self) {
        if let Some(hub) = self.hub.take() {
            let _ = hub.cast(AgentHubMsg::DispatcherCancelled {
                parent: self.parent,
            });
        }
    }
}

/// Dispatches `input` to `agent_id` and waits for its answer, the slot lent to the agent's
/// task or given back meanwhile (the hub decides, see `agents::hub`).
pub(super) async fn dispatch(
    ctx: &TaskContext,
    agents: &Agents,
    gov: &Arc<TaskGovernance>,
    agent_id: &str,
    input: &str,
    by_human: bool,
) -> Result<AgentOutput, AgentError> {
    // A replay: the hub is not asked, no agent runs; the recorded answer stands for both.
    if let Effects::Recorded(playback) = &ctx.effects {
        return playback.dispatch_result(agent_id);
    }
    let (reply, answer) = oneshot::channel();
    let request = DispatchRequest {
        agent_id: agent_id.to_owned(),
        input: input.to_owned(),
        chain: agents.view.chain.clone(),
        by_human,
        parent: DispatchParent {
            conversation_id: ctx.conversation_id,
            task_id: ctx.task_id,
        },
        parent_dispatch: agents.origin.as_ref().map(|o| o.dispatch_id),
        cancel: ctx.cancel.clone(),
        span: tracing::Span::current(),
        governance: gov.clone(),
        slot: ctx.slot.clone(),
        tool_config: ctx.tool_policy.clone(),
        token_book: ctx.token_book.clone(),
        storage_policy: ctx.storage_policy,
    };
    agents
        .hub
        .cast(AgentHubMsg::Dispatch {
            request,
            reply: reply.into(),
        })
        .map_err(|e| AgentError::internal(format!("agent hub unavailable: {e}")))?;
    // However this task stops waiting (cancelled, or its future dropped because its
    // conversation failed), its dispatches end now (leases and waits released, their agents'
    // tasks cancelled), not when their agents' tasks get to end.
    let mut waiting = StopsWaiting {
        hub: Some(agents.hub.clone()),
        parent: DispatchParent {
            conversation_id: ctx.conversation_id,
            task_id: ctx.task_id,
        },
    };
    let answered = ctx
        .slot
        .wait_for_child(&ctx.cancel, "cancelled while an agent worked", answer)
        .instrument(spans::scheduler_wait(ctx.conversation_id, ctx.task_id))
        .await?;
    waiting.hub = None;
    answered.unwrap_or_else(|_| {
        Err(AgentError::interrupted(
            "the agent hub stopped before the agent answered",
        ))
    })
}

/// A `dispatch_agent` call (its arguments read: `agent_id`, `input`): the agent's answer is
/// the observation.
pub(super) async fn dispatch_call(
    ctx: &TaskContext,
    agents: Option<&Agents>,
    gov: &Arc<TaskGovernance>,
    call: &ToolCall,
    agent_id: &str,
    input: &str,
) -> Result<ToolOutput, ToolFailure> {
    let Some(agents) = agents else {
        return Err(ToolFailure::unknown_tool(&call.name));
    };
    let output = dispatch(ctx, agents, gov, agent_id, input, false).await?;
    Ok(ToolOutput {
        call_id: call.call_id.clone(),
        output: output.text,
        is_error: false,
    })
}

/// Routes a user's message: `None` when the conversation's turn answers it (a direct reply
/// without text), else the task's outcome.
pub(super) async fn route_input(
    ctx: &TaskContext,
    agents: &Agents,
    gov: &Arc<TaskGovernance>,
    loop_state: &mut LoopState,
) -> Option<Result<(), AgentError>> {
    let router = agents.view.router.as_ref()?;
    let route = match hub_command(&ctx.input) {
        Some(Ok((agent, text))) => Route::dispatch(&agent, &text, 1.0, RouteSource::Hub)
            .because(format!("/hub names `{agent}`")),
        Some(Err(usage)) => return Some(Err(AgentError::invalid(usage))),
        None => match router.mode {
            RouterMode::Rules => rules_route(&ctx.input, &router.agents),
            RouterMode::Model => match model_route(ctx, router, loop_state).await {
                Ok(route) => route,
                Err(error) => return Some(Err(error)),
            },
        },
    };
    crate::agents::metrics::routed(route.decision, route.source);
    tracing::info!(decision = route.decision.as_str(), agent_id = ?route.agent_id, confidence = route.confidence, source = route.source.as_str(), "route decided");
    ctx.emit(EventKind::RouteDecided {
        decision: route.decision,
        agent_id: route.agent_id.clone(),
        module: route.module.clone(),
        confidence: route.confidence,
        source: route.source,
        reason: route.reason.clone(),
    });
    // Nothing is routed before the message is stored (an unstored one leaves no history:
    // `routed` stays unset).
    if let Err(e) = super::stored_gate(ctx).await {
        return Some(Err(e));
    }
    loop_state.routed = true;
    let answer = |loop_state: &mut LoopState, text: String| {
        ctx.emit(EventKind::AssistantMessage { text: text.clone() });
        loop_state.push(HistoryItem::assistant(text.clone()));
        loop_state.last_text = text;
        Some(Ok(()))
    };
    match route.decision {
        RouteDecision::DirectReply => match route.reply {
            Some(text) => answer(loop_state, text),
            None => {
                loop_state.routed = false;
                None
            }
        },
        RouteDecision::DispatchAgent => {
            let agent = route.agent_id.unwrap_or_default();
            let input = route.input.unwrap_or_else(|| ctx.input.clone());
            // A `/hub` a program sent (an A2A peer, a module) is no person's choice.
            let by_human = route.source == RouteSource::Hub && !ctx.options.peer;
            // The supervisor's dispatch (its model's or its rules') is the `dispatch_agent`
            // tool, governed as the tool would be (policy layers, authorization); a human's
            // `/hub` is the user's own choice.
            if !by_human {
                let as_tool = ToolCall {
                    call_id: "route".to_owned(),
                    name: DISPATCH_TOOL.to_owned(),
                    arguments: troupe_proto::Json(
                        serde_json::json!({"agent_id": agent, "input": input}),
                    ),
                };
                let chain = Some(&agents.view.chain);
                if let Err(refused) = super::govern::check_call(ctx, gov, chain, &as_tool).await {
                    return Some(Err(refused.error));
                }
            }
            match dispatch(ctx, agents, gov, &agent, &input, by_human).await {
                Ok(output) => answer(loop_state, output.text),
                Err(error) => Some(Err(error)),
            }
        }
        RouteDecision::DispatchModule => {
            let module = route.module.unwrap_or_default();
            let chain = Some(&agents.view.chain);
            let input = route.input.unwrap_or_else(|| ctx.input.clone());
            // A replay delivers nothing: the module's recorded answer (or failure) stands for
            // it, after the same governance as live, so that a policy that now denies the
            // module shows in the report.
            if let Effects::Recorded(playback) = &ctx.effects {
                let failure = route
                    .reply
                    .is_none()
                    .then(|| playback.module_route_failure())
                    .flatten();
                let unknown = match &failure {
                    Some(AgentError::PolicyRejected {
                        reason: PolicyReason::UnknownModule,
                        message,
                        ..
                    }) => Some(message.clone()),
                    _ => None,
                };
                if unknown.is_none()
                    && let Err(refused) =
                        govern_module_route(ctx, gov, chain, &module, &input).await
                {
                    return Some(Err(refused));
                }
                return match (route.reply, failure, unknown) {
                    (Some(text), ..) => answer(loop_state, text),
                    (None, _, Some(message)) => {
                        Some(Err(unknown_module(ctx, agents, module, message)))
                    }
                    (None, Some(error), None) => Some(Err(error)),
                    (None, None, None) => Some(Err(AgentError::NotFound {
                        what: "recorded answer of the module dispatch".into(),
                        id: module,
                    })),
                };
            }
            if super::modules::knows(ctx, &module) {
                if let Err(refused) = govern_module_route(ctx, gov, chain, &module, &input).await {
                    return Some(Err(refused));
                }
                let payload = serde_json::Value::String(input);
                return match super::modules::dispatch(ctx, &module, payload).await {
                    Ok(value) => answer(
                        loop_state,
                        crate::modules::observation(&value, ctx.limits.exec_output_cap),
                    ),
                    Err(error) => Some(Err(error)),
                };
            }
            let message = match &ctx.modules {
                Some(_) => format!("no module `{module}` takes dispatches"),
                None => format!("no module `{module}`: this session has no module registry"),
            };
            Some(Err(unknown_module(ctx, agents, module, message)))
        }
        RouteDecision::AskHuman => {
            let question = route.question.unwrap_or_default();
            ctx.emit(EventKind::AskHuman {
                question: question.clone(),
            });
            answer(loop_state, question)
        }
        RouteDecision::Reject => {
            let text = if route.reason.is_empty() {
                "The request was rejected.".to_owned()
            } else {
                route.reason
            };
            answer(loop_state, text)
        }
    }
}

/// The supervisor's route to `module`, governed as a model's call of the `dispatch_module`
/// tool would be (once, under the stricter of that name and the module's own).
async fn govern_module_route(
    ctx: &TaskContext,
    gov: &Arc<TaskGovernance>,
    chain: Option<&troupe_proto::agent::ExecutionChain>,
    module: &str,
    input: &str,
) -> Result<(), AgentError> {
    let as_tool = ToolCall {
        call_id: "route".to_owned(),
        name: crate::modules::DISPATCH_MODULE_TOOL.to_owned(),
        arguments: troupe_proto::Json(serde_json::json!({"module": module, "payload": input})),
    };
    super::govern::check_call(ctx, gov, chain, &as_tool)
        .await
        .map_err(|refused| refused.error)
}

/// A route to a module nobody takes: its `policy_rejected` event, and the refusal.
fn unknown_module(
    ctx: &TaskContext,
    agents: &Agents,
    module: String,
    message: String,
) -> AgentError {
    ctx.emit(EventKind::PolicyRejected {
        agent_id: module,
        chain: agents.view.chain.clone(),
        reason: PolicyReason::UnknownModule,
        message: message.clone(),
        tool: None,
    });
    crate::agents::metrics::rejected(PolicyReason::UnknownModule);
    AgentError::PolicyRejected {
        reason: PolicyReason::UnknownModule,
        chain: agents.view.chain.0.clone(),
        message,
    }
}

/// The supervisor's routing step: one model call offered only `route`. A call is the
/// decision; an answer without one is a direct reply of its text.
async fn model_route(
    ctx: &TaskContext,
    router: &Router,
    loop_state: &mut LoopState,
) -> Result<Route, AgentError> {
    let tools = crate::tools::OfferedTools::new(vec![route::route_tool(&router.agents)]);
    let model = router.model.clone().unwrap_or_else(|| ctx.model.clone());
    let prepared = Prepared {
        cache_key: crate::context::prompt_cache_key(
            &router.instructions,
            &tools.specs,
            &model.info().family,
        ),
        fixed_tokens: fixed_prompt_tokens(ctx.tokens.as_ref(), &router.instructions, &tools),
        instructions: router.instructions.clone(),
        tools,
        hold_output: false,
    };
    let step = loop_state.stats.steps + 1;
    loop_state.stats.steps = step;
    ctx.emit(EventKind::StepStarted {
        turn: ctx.turn,
        step,
    });
    let (response, estimate) = model_step(ctx, &model, &prepared, &loop_state.items, step)
        .await
        .inspect_err(|_| {
            // Not answered: not counted (see `run_turn`), so a message whose routing call
            // failed leaves nothing in the history.
            loop_state.stats.steps = step - 1;
        })?;
    loop_state.stats.estimated_prompt_tokens += estimate;
    let completion = completion_tokens(ctx.tokens.as_ref(), &response);
    match response.usage {
        Some(usage) => {
            loop_state.stats.usage.add(&usage);
            loop_state.stats.steps_with_usage += 1;
        }
        None => loop_state.stats.estimated_completion_tokens += completion.unwrap_or_default(),
    }
    ctx.emit(EventKind::StepFinished {
        turn: ctx.turn,
        step,
        estimated_prompt_tokens: estimate,
        usage: response.usage,
        estimated_completion_tokens: completion,
    });
    match response
        .tool_calls
        .iter()
        .find(|c| c.name == route::ROUTE_TOOL)
    {
        Some(call) => parse_route(&call.arguments.0).map_err(|message| AgentError::ModelError {
            message: format!("the supervisor's route call is malformed: {message}"),
            retryable: false,
        }),
        None if !response.text.trim().is_empty() => {
            Ok(Route::direct(Some(response.text), 1.0, RouteSource::Model)
                .because("the supervisor answered without routing"))
        }
        None => Err(AgentError::ModelError {
            message: "the supervisor neither routed nor answered".into(),
            retryable: false,
        }),
    }
}
