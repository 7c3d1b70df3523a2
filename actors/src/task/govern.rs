//! A task's tool governance (A5): its policy and tokens, computed once before its first
//! step ([`governance_of`]), and the check every tool call passes before it runs
//! ([`check_call`]).

use super::*;
use crate::governance::{self, AgentLayer, ToolVerdict, metrics::Decision};
use troupe_proto::agent::{ExecutionChain, PolicyReason};

/// The task's policy: the session's `[tools]` (global, and its agent's role), its agent's
/// file as the hub has it now, its message's request layer, intersected with what its
/// dispatcher had; and the tokens its message presented, with its dispatcher's.
pub(super) fn governance_of(
    ctx: &TaskContext,
    agents: Option<&super::agents::Agents>,
) -> Arc<TaskGovernance> {
    let own = agents.and_then(|a| a.view.own.as_ref());
    let parent = ctx
        .agents
        .as_ref()
        .and_then(|a| a.origin.as_ref())
        .map(|o| &o.governance);
    let policy = governance::task_policy(
        &ctx.tool_policy,
        own.map(|o| AgentLayer {
            id: &o.id,
            role: &o.role,
            tools: &o.tools,
        }),
        ctx.options.tools.as_ref(),
        parent.map(|p| &p.policy),
    );
    let mut authorization: Vec<String> = ctx
        .options
        .authorization
        .iter()
        .cloned()
        .chain(
            parent
                .into_iter()
                .flat_map(|p| p.authorization.iter().cloned()),
        )
        .collect();
    // In the order presented (the message's own, then its dispatcher's): the first that
    // covers a call is the one used.
    let mut seen = std::collections::HashSet::new();
    authorization.retain(|digest| seen.insert(digest.clone()));
    Arc::new(TaskGovernance {
        policy,
        authorization,
        approval_policy: ctx.approval_policy,
        sandbox_policy: ctx.sandbox_policy,
    })
}

/// The agent whose task this is (`None`: the session's own conversation).
pub(super) fn agent_of(ctx: &TaskContext) -> Option<&str> {
    ctx.agents
        .as_ref()
        .and_then(|a| a.origin.as_ref())
        .map(|o| o.agent_id.as_str())
}

/// The policy's word on `call` before it runs: `Ok` lets it run; a refusal is emitted as
/// `policy_rejected` and comes back as the failure the model reads. A call of the capability
/// registry's tools is decided once, under the stricter of its own name and its capability's
/// qualified name (`capability__<id>`, see [`crate::capabilities::governed_name`]), so a
/// policy that denies a capability refuses both of its tools, and a call counts one decision
/// and uses a token at most once.
pub(super) async fn check_call(
    ctx: &TaskContext,
    gov: &TaskGovernance,
    chain: Option<&ExecutionChain>,
    call: &ToolCall,
) -> Result<(), ToolFailure> {
    let name = crate::capabilities::governed_name(&gov.policy, &call.name, &call.arguments.0);
    if name == call.name {
        return check_one(ctx, gov, chain, call).await;
    }
    let governed = ToolCall {
        name,
        ..call.clone()
    };
    check_one(ctx, gov, chain, &governed).await
}

async fn check_one(
    ctx: &TaskContext,
    gov: &TaskGovernance,
    chain: Option<&ExecutionChain>,
    call: &ToolCall,
) -> Result<(), ToolFailure> {
    let verdict = gov.policy.decide(&call.name);
    let (reason, message) = match verdict {
        ToolVerdict::Allowed {
            authorization: None,
        } => {
            governance::metrics::decided(Decision::Allowed);
            return Ok(());
        }
        ToolVerdict::Allowed {
            authorization: Some(layer),
        } => match super::authorize::authorize(ctx, gov, call, layer).await {
            Ok(()) => {
                governance::metrics::decided(Decision::Authorized);
                return Ok(());
            }
            Err(message) => {
                governance::metrics::decided(Decision::Unauthorized);
                (PolicyReason::Unauthorized, message)
            }
        },
        ToolVerdict::Denied(denial) => {
            governance::metrics::decided(Decision::Denied);
            governance::metrics::denied(denial.layer);
            (PolicyReason::ToolDenied, denial.message)
        }
    };
    let chain = chain.cloned().unwrap_or_default();
    tracing::info!(tool = %call.name, reason = reason.as_str(), "tool call refused by policy");
    ctx.emit(EventKind::PolicyRejected {
        agent_id: agent_of(ctx).unwrap_or_default().to_owned(),
        chain: chain.clone(),
        reason,
        message: message.clone(),
        tool: Some(call.name.clone()),
    });
    Err(ToolFailure::from(AgentError::PolicyRejected {
        reason,
        chain: chain.0,
        message,
    }))
}
