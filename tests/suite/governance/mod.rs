//! Governance (A5, A8): tool policies enforced where calls are dispatched, authorization
//! tokens, output guardrails.

mod a2a_data;
mod capabilities;
mod guardrail;
mod policy;
mod reload;
mod serve_tokens;
mod tokens;

use troupe_proto::EventKind;
use troupe_proto::agent::PolicyReason;

/// The tool refusals among `events`: (agent, tool, reason, message).
pub(crate) fn tool_refusals(events: &[EventKind]) -> Vec<(String, String, PolicyReason, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::PolicyRejected {
                agent_id,
                reason,
                message,
                tool: Some(tool),
                ..
            } => Some((agent_id.clone(), tool.clone(), *reason, message.clone())),
            _ => None,
        })
        .collect()
}
