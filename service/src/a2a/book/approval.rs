//! Approvals over A2A: the status message that asks a client for one, and the decision a
//! client's reply expresses.

use crate::a2a::model::{Part, PartContent};
use crate::a2a::request::SendParams;
use serde_json::json;
use troupe_proto::{ApprovalDecision, ApprovalId, ApprovalSubject};

/// The status message of a task that waits for a human: what is asked, in text and as a data
/// part (`approvalRequest`).
pub(super) fn approval_parts(
    approval_id: ApprovalId,
    command: &[String],
    reason: &str,
    subject: &ApprovalSubject,
) -> Vec<Part> {
    let id = approval_id.to_string();
    match subject {
        ApprovalSubject::Command => vec![
            Part::text(format!(
                "Approval needed to run `{}`: {reason}. Reply in this task with \"approve\" or \
                 \"deny\".",
                command.join(" ")
            )),
            Part::data(json!({"approvalRequest": {
                "approvalId": id, "kind": "command", "command": command, "reason": reason,
            }})),
        ],
        ApprovalSubject::CommandWithoutSandbox => vec![
            Part::text(format!(
                "Approval needed to run `{}` without the sandbox: {reason}. Reply in this task \
                 with \"approve\" or \"deny\".",
                command.join(" ")
            )),
            Part::data(json!({"approvalRequest": {
                "approvalId": id, "kind": "command_without_sandbox", "command": command,
                "reason": reason,
            }})),
        ],
        ApprovalSubject::Patch => vec![
            Part::text(format!(
                "Approval needed to apply a patch (`{}`): {reason}. Reply in this task with \
                 \"approve\" or \"deny\".",
                command.join(" ")
            )),
            Part::data(json!({"approvalRequest": {
                "approvalId": id, "kind": "patch", "command": command, "reason": reason,
            }})),
        ],
        ApprovalSubject::McpElicitation {
            server,
            message,
            schema,
        } => vec![
            Part::text(format!(
                "The MCP server `{server}` asks: {message} Reply in this task with a data part \
                 holding the answer (an object matching `schema`), or \"deny\"."
            )),
            Part::data(json!({"approvalRequest": {
                "approvalId": id, "kind": "elicitation", "server": server,
                "message": message, "schema": schema.0,
            }})),
        ],
        ApprovalSubject::AgentQuestion { agent_id, question } => vec![
            Part::text(format!(
                "The agent `{agent_id}` asks: {question} Reply in this task with a data part \
                 {{\"answer\": \"...\"}}, or \"deny\"."
            )),
            Part::data(json!({"approvalRequest": {
                "approvalId": id, "kind": "question", "agentId": agent_id, "question": question,
            }})),
        ],
        ApprovalSubject::McpSampling { server, request } => vec![
            Part::text(format!(
                "The MCP server `{server}` asks to use the model. Reply in this task with \
                 \"approve\" or \"deny\"."
            )),
            Part::data(json!({"approvalRequest": {
                "approvalId": id, "kind": "sampling", "server": server, "request": request.0,
            }})),
        ],
    }
}

/// The approval decision a client's reply expresses: a data part `{"decision": ...}` with a
/// troupe decision; for an elicitation or a question, any other data part is the content; else
/// text (`approve`, `yes`, ... approve once; anything else denies, the text being the reason).
pub(super) fn decision_of(params: &SendParams, elicitation: bool) -> ApprovalDecision {
    for part in &params.message.parts {
        if let PartContent::Data(d) = &part.content {
            if let Some(v) = d.get("decision")
                && let Ok(decision) = serde_json::from_value::<ApprovalDecision>(v.clone())
            {
                return decision;
            }
            if elicitation && d.is_object() {
                return ApprovalDecision::ApproveWithContent {
                    content: troupe_proto::Json(d.clone()),
                };
            }
        }
    }
    let text: String = params
        .message
        .parts
        .iter()
        .filter_map(|p| match &p.content {
            PartContent::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ");
    let word = text
        .trim()
        .trim_end_matches(['.', '!'])
        .to_ascii_lowercase();
    if matches!(
        word.as_str(),
        "approve" | "approved" | "yes" | "y" | "ok" | "allow" | "go ahead"
    ) {
        ApprovalDecision::ApproveOnce
    } else {
        ApprovalDecision::Deny {
            reason: Some(text.trim().chars().take(500).collect())
                .filter(|s: &String| !s.is_empty()),
        }
    }
}
