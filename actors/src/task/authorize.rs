//! Authorization tokens at a tool call (A5): a tool a layer lists as `authorizationRequired`
//! runs only when a token presented with the task's message (or its dispatcher's) covers it;
//! one use is counted by the process's [`TokenBook`](crate::token_book) before it runs.

use super::*;
use crate::governance::tokens::{refusal_message, shell_command_line};
use crate::token_book::{ConsumeRequest, consume};
use troupe_proto::governance::{PolicyLayer, TokenRefusal};

/// Consumes one use of a presented token that covers `call`; `Err` says why none did.
pub(super) async fn authorize(
    ctx: &TaskContext,
    gov: &TaskGovernance,
    call: &ToolCall,
    layer: PolicyLayer,
) -> Result<(), String> {
    let command = shell_command_line(call);
    let refused =
        |refusal: TokenRefusal| refusal_message(&call.name, layer, refusal, command.as_deref());
    if gov.authorization.is_empty() {
        return Err(refused(TokenRefusal::Missing));
    }
    // A replay counts no use: the recorded call ran (its result is played back) or was
    // refused (its refusal is played back).
    if let Effects::Recorded(playback) = &ctx.effects {
        return playback
            .authorized(call)
            .map_err(|_| refused(TokenRefusal::Unavailable));
    }
    let Some(book) = &ctx.token_book else {
        return Err(refused(TokenRefusal::Unavailable));
    };
    let request = ConsumeRequest {
        digests: gov.authorization.clone(),
        agent: super::govern::agent_of(ctx).map(str::to_owned),
        tool: call.name.clone(),
        command: command.clone(),
        arguments: call.arguments.0.clone(),
    };
    match consume(book, request).await {
        Ok(consumed) => {
            tracing::info!(
                token_id = %consumed.token_id,
                uses = consumed.uses,
                max_uses = consumed.max_uses,
                "tool call authorized"
            );
            Ok(())
        }
        Err(refusal) => Err(refused(refusal)),
    }
}
