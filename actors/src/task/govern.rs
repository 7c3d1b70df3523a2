//! A task's tool governance (A5): its policy and tokens, computed once before its first
//! step ([`governance_of`]), and the check every tool call passes before it runs
//! ([`check_call`]: the policy's word, [`decide`], then the token it needs, [`settle`],
//! taken only for a call that can run).

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

/// What the policy asks of an allowed call before it runs.
#[derive(Debug)]
pub(super) enum Pending {
    /// Nothing more: it may run.
    Free,
    /// A use of an authorization token, which [`settle`] takes: `call` under the name the
    /// policy decided it by, and the layer that requires the token.
    Token {
        call: ToolCall,
        layer: troupe_proto::governance::PolicyLayer,
    },
}

/// The policy's word on `call` before it runs ([`decide`], then [`settle`]): `Ok` lets it
/// run; a refusal is emitted as `policy_rejected` and comes back as the failure the model
/// reads.
pub(super) async fn check_call(
    ctx: &TaskContext,
    gov: &TaskGovernance,
    chain: Option<&ExecutionChain>,
    call: &ToolCall,
) -> Result<(), ToolFailure> {
    let pending = decide(ctx, gov, chain, call)?;
    settle(ctx, gov, chain, pending).await
}

/// The name a call is decided by: a call of the capability registry's tools, or of
/// `dispatch_module`, under the stricter of its own name and the qualified name of what it
/// reaches (`capability__<id>`, `module__<id>`; see [`governance::stricter_name`]), so that a
/// policy that denies a capability or a module refuses every call that reaches it, and a
/// call counts one decision and uses a token at most once; any other call, its own name.
fn governed_name(gov: &TaskGovernance, call: &ToolCall) -> String {
    if call.name == crate::modules::DISPATCH_MODULE_TOOL {
        crate::modules::governed_name(&gov.policy, &call.name, &call.arguments.0)
    } else {
        crate::capabilities::governed_name(&gov.policy, &call.name, &call.arguments.0)
    }
}

/// The policy's word on `call`, without using a token: a denial is refused here (emitted,
/// counted); an allowed call is [`Pending`] on a token when a layer requires one, which the
/// caller takes with [`settle`] only once it knows the call can run (a call of an unknown
/// tool, or with malformed arguments, spends no use).
pub(super) fn decide(
    ctx: &TaskContext,
    gov: &TaskGovernance,
    chain: Option<&ExecutionChain>,
    call: &ToolCall,
) -> Result<Pending, ToolFailure> {
    let name = governed_name(gov, call);
    match gov.policy.decide(&name) {
        ToolVerdict::Allowed {
            authorization: None,
        } => {
            governance::metrics::decided(Decision::Allowed);
            Ok(Pending::Free)
        }
        ToolVerdict::Allowed {
            authorization: Some(layer),
        } => Ok(Pending::Token {
            call: ToolCall {
                name,
                ..call.clone()
            },
            layer,
        }),
        ToolVerdict::Denied(denial) => {
            governance::metrics::decided(Decision::Denied);
            governance::metrics::denied(denial.layer);
            Err(refuse(
                ctx,
                chain,
                &name,
                PolicyReason::ToolDenied,
                denial.message,
            ))
        }
    }
}

/// Takes what [`decide`] left pending: one use of a presented token that covers the call
/// (or the refusal, `unauthorized`).
pub(super) async fn settle(
    ctx: &TaskContext,
    gov: &TaskGovernance,
    chain: Option<&ExecutionChain>,
    pending: Pending,
) -> Result<(), ToolFailure> {
    let Pending::Token { call, layer } = pending else {
        return Ok(());
    };
    match super::authorize::authorize(ctx, gov, &call, layer).await {
        Ok(()) => {
            governance::metrics::decided(Decision::Authorized);
            Ok(())
        }
        Err(message) => {
            governance::metrics::decided(Decision::Unauthorized);
            Err(refuse(
                ctx,
                chain,
                &call.name,
                PolicyReason::Unauthorized,
                message,
            ))
        }
    }
}

/// A refusal of a call of `tool`: logged, emitted as `policy_rejected`, and the failure the
/// model reads.
fn refuse(
    ctx: &TaskContext,
    chain: Option<&ExecutionChain>,
    tool: &str,
    reason: PolicyReason,
    message: String,
) -> ToolFailure {
    let chain = chain.cloned().unwrap_or_default();
    tracing::info!(tool = %tool, reason = reason.as_str(), "tool call refused by policy");
    ctx.emit(EventKind::PolicyRejected {
        agent_id: agent_of(ctx).unwrap_or_default().to_owned(),
        chain: chain.clone(),
        reason,
        message: message.clone(),
        tool: Some(tool.to_owned()),
    });
    ToolFailure::from(AgentError::PolicyRejected {
        reason,
        chain: chain.0,
        message,
    })
}
