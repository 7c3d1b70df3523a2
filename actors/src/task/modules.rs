//! A task's dispatches to modules (A10): the `dispatch_module` tool and the supervisor's
//! `dispatch_module` decision, both checked against the task's tool policy (once, under the
//! stricter of `dispatch_module` and the module's name `module__<id>`, see
//! [`crate::modules::governed_name`]) before anything is delivered.

use super::*;
use crate::modules::{self as port, ModuleDispatch, ModuleDispatchError};

/// The `dispatch_module` tool, when the session has modules that take dispatches (a
/// compaction, which has no place among agents, gets none).
pub(super) fn dispatch_tool(ctx: &TaskContext) -> Option<ToolSpec> {
    ctx.agents.as_ref()?;
    let targets = ctx.modules.as_ref()?.targets();
    (!targets.is_empty()).then(|| port::dispatch_module_tool(&targets))
}

/// A `dispatch_module` call (its arguments read: `module`, `payload`; the policy had its
/// word): the module's answer is the observation.
pub(super) async fn dispatch_call(
    ctx: &TaskContext,
    call: &ToolCall,
    module: &str,
    payload: serde_json::Value,
) -> Result<ToolOutput, ToolFailure> {
    // A replay delivers nothing: the recorded observation stands for the module's answer.
    if let Effects::Recorded(playback) = &ctx.effects {
        return playback.tool_result(call);
    }
    let answer = dispatch(ctx, module, payload).await?;
    Ok(ToolOutput {
        call_id: call.call_id.clone(),
        output: port::observation(&answer, ctx.limits.exec_output_cap),
        is_error: false,
    })
}

/// Delivers `payload` to `module` and waits for its answer (the module's timeout bounds the
/// wait; cancelling the task ends it at once).
pub(super) async fn dispatch(
    ctx: &TaskContext,
    module: &str,
    payload: serde_json::Value,
) -> Result<serde_json::Value, AgentError> {
    let Some(modules) = &ctx.modules else {
        return Err(ModuleDispatchError::Unknown(format!(
            "no module `{module}`: this session has no module registry"
        ))
        .into_agent_error());
    };
    let request = ModuleDispatch {
        module: module.to_owned(),
        payload,
        conversation_id: ctx.conversation_id,
        task_id: ctx.task_id,
    };
    tokio::select! {
        answer = modules.dispatch(request) => answer.map_err(ModuleDispatchError::into_agent_error),
        () = ctx.cancel.cancelled() => Err(AgentError::Cancelled {
            reason: "cancelled while a module worked".into(),
        }),
    }
}

/// Whether the session has a module of that id that takes dispatches.
pub(super) fn knows(ctx: &TaskContext, module: &str) -> bool {
    ctx.modules
        .as_ref()
        .is_some_and(|m| m.targets().iter().any(|t| t.id == module))
}
