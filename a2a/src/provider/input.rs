//! A remote task that waits for input, asked of troupe's human, and the answer sent back.
//! Pure: what to ask and what to send; the run loop does the asking.
//!
//! - A troupe peer's endpoint says what it waits for in a data part `approvalRequest`
//!   (`kind` command, elicitation, sampling or question): the same request is asked here,
//!   namespaced under `a2a <agent>` so that no key this session remembers for its own
//!   commands or MCP servers answers a remote one, and the decision, whatever it is, goes
//!   back as `{"decision": ..}` for the peer to carry out.
//! - Any other `input-required` is a question: asked as an `AgentQuestion`, its answer goes
//!   back as the text of the reply; refused, the dispatch ends and the remote task is
//!   canceled.

use crate::model::{Message, Part, PartContent, Role};
use serde_json::{Value, json};
use troupe_actors::approval_store::{Ask, Granted};
use troupe_proto::approval::answer_text;
use troupe_proto::{AgentError, ApprovalDecision, ApprovalSubject, ConversationId, Json};

/// What a waiting remote task asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum InputRequest {
    /// A troupe peer's approval request, relayed: the decision is sent back.
    Relayed { ask: Ask },
    /// A question in words: the answer is sent back.
    Question { ask: Ask },
}

impl InputRequest {
    /// The metric label of its kind.
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Relayed { .. } => "approval",
            Self::Question { .. } => "question",
        }
    }

    pub fn ask(&self) -> &Ask {
        match self {
            Self::Relayed { ask } | Self::Question { ask } => ask,
        }
    }
}

/// What the status message of a task waiting in `input-required` asks, for the agent
/// `agent_id`. The ask's conversation and task are filled in by whoever asks.
pub fn classify(agent_id: &str, message: Option<&Message>) -> InputRequest {
    let parts = message.map(|m| m.parts.as_slice()).unwrap_or_default();
    let request = parts.iter().find_map(|p| match &p.content {
        PartContent::Data(d) => d.get("approvalRequest").filter(|r| r.is_object()),
        _ => None,
    });
    let text: String = parts
        .iter()
        .filter_map(|p| match &p.content {
            PartContent::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n");
    if let Some(ask) = request.and_then(|r| relayed(agent_id, r, &text)) {
        return InputRequest::Relayed { ask };
    }
    let question = if text.trim().is_empty() {
        "The agent needs input to go on.".to_owned()
    } else {
        text
    };
    InputRequest::Question {
        ask: ask(
            vec!["a2a".into(), agent_id.into(), "question".into()],
            question.clone(),
            ApprovalSubject::AgentQuestion {
                agent_id: agent_id.into(),
                question,
            },
        ),
    }
}

fn ask(command: Vec<String>, reason: String, subject: ApprovalSubject) -> Ask {
    Ask {
        conversation_id: ConversationId::default(),
        task_id: None,
        command,
        reason,
        subject,
        workdir: None,
    }
}

/// A troupe peer's `approvalRequest`, as asked here.
fn relayed(agent_id: &str, request: &Value, text: &str) -> Option<Ask> {
    let str_of = |k: &str| request.get(k).and_then(Value::as_str).unwrap_or_default();
    let prefix = ["a2a".to_owned(), agent_id.to_owned()];
    let said = |what: &str| {
        if what.is_empty() {
            format!("the agent `{agent_id}` asks")
        } else {
            format!("the agent `{agent_id}` asks: {what}")
        }
    };
    match str_of("kind") {
        kind @ ("command" | "patch") => {
            let argv: Vec<String> = request
                .get("command")?
                .as_array()?
                .iter()
                .map(|a| a.as_str().map(str::to_owned))
                .collect::<Option<_>>()?;
            // A patch stays a patch here: remembered apart from commands.
            let subject = match kind {
                "patch" => ApprovalSubject::Patch,
                _ => ApprovalSubject::Command,
            };
            Some(ask(
                prefix.into_iter().chain(argv).collect(),
                said(str_of("reason")),
                subject,
            ))
        }
        "elicitation" => {
            let server = format!("{agent_id}:{}", str_of("server"));
            Some(ask(
                prefix
                    .into_iter()
                    .chain(["mcp".into(), server.clone(), "elicitation".into()])
                    .collect(),
                said(str_of("message")),
                ApprovalSubject::McpElicitation {
                    server,
                    message: str_of("message").to_owned(),
                    schema: Json(request.get("schema").cloned().unwrap_or(json!({}))),
                },
            ))
        }
        "sampling" => {
            let server = format!("{agent_id}:{}", str_of("server"));
            Some(ask(
                prefix
                    .into_iter()
                    .chain(["mcp".into(), server.clone(), "sampling".into()])
                    .collect(),
                said(""),
                ApprovalSubject::McpSampling {
                    server,
                    request: Json(request.get("request").cloned().unwrap_or(Value::Null)),
                },
            ))
        }
        "question" => {
            let question = match str_of("question") {
                "" => text.to_owned(),
                q => q.to_owned(),
            };
            let asker = match str_of("agentId") {
                "" => agent_id.to_owned(),
                inner => format!("{agent_id}/{inner}"),
            };
            Some(ask(
                prefix.into_iter().chain(["question".into()]).collect(),
                question.clone(),
                ApprovalSubject::AgentQuestion {
                    agent_id: asker,
                    question,
                },
            ))
        }
        _ => None,
    }
}

/// What to send back once the human answered `request` (`answer`: what asking gave).
/// `Err`: the dispatch ends with it (a question refused, or the dispatch cancelled).
pub fn reply_parts(
    request: &InputRequest,
    answer: Result<Granted, AgentError>,
) -> Result<Vec<Part>, AgentError> {
    match request {
        InputRequest::Relayed { .. } => {
            let decision = match answer {
                Ok(Granted::Remembered) => ApprovalDecision::ApproveOnce,
                Ok(Granted::Decided(d)) => d,
                Err(AgentError::Cancelled { reason }) => {
                    return Err(AgentError::Cancelled { reason });
                }
                Err(AgentError::Timeout { .. }) => ApprovalDecision::TimedOut,
                Err(e) => ApprovalDecision::Deny {
                    reason: Some(e.to_string()),
                },
            };
            let decision = serde_json::to_value(&decision)
                .map_err(|e| AgentError::internal(format!("a decision as JSON: {e}")))?;
            Ok(vec![Part::data(json!({ "decision": decision }))])
        }
        InputRequest::Question { ask } => match answer {
            Ok(Granted::Decided(d)) => match answer_text(&d) {
                Some(text) => Ok(vec![Part::text(text)]),
                None => Err(AgentError::invalid(
                    "the agent's question was approved without an answer",
                )),
            },
            Ok(Granted::Remembered) => Err(AgentError::internal(
                "a question cannot be answered by a remembered approval",
            )),
            Err(e) => Err(e).map_err(|e| match e {
                AgentError::ApprovalDenied { .. } | AgentError::Cancelled { .. } => e,
                other => AgentError::ApprovalDenied {
                    command: ask.command.clone(),
                    reason: other.to_string(),
                },
            }),
        },
    }
}

/// The client's message in a task that waits: `parts`, in `context_id`'s task `task_id`.
pub fn reply_message(
    message_id: String,
    context_id: &str,
    task_id: &str,
    parts: Vec<Part>,
) -> Message {
    Message {
        message_id,
        context_id: Some(context_id.to_owned()),
        task_id: Some(task_id.to_owned()),
        role: Role::User,
        parts,
        metadata: None,
        reference_task_ids: Vec::new(),
        extensions: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(parts: Vec<Part>) -> Message {
        Message {
            message_id: "m".into(),
            context_id: Some("c".into()),
            task_id: Some("t".into()),
            role: Role::Agent,
            parts,
            metadata: None,
            reference_task_ids: Vec::new(),
            extensions: Vec::new(),
        }
    }

    #[test]
    fn a_peers_command_approval_is_asked_under_its_agent() {
        let m = waiting(vec![
            Part::text("Approval needed to run `ls -la`: list. Reply ..."),
            Part::data(
                json!({"approvalRequest": {"approvalId": "a", "kind": "command",
                "command": ["ls", "-la"], "reason": "list the files"}}),
            ),
        ]);
        let request = classify("remote", Some(&m));
        let InputRequest::Relayed { ask } = &request else {
            panic!("{request:?}")
        };
        assert_eq!(ask.command, ["a2a", "remote", "ls", "-la"]);
        assert_eq!(ask.reason, "the agent `remote` asks: list the files");
        assert_eq!(ask.subject, ApprovalSubject::Command);
        assert_eq!(request.kind(), "approval");
        // Whatever the human decides goes back to the peer.
        let once = reply_parts(&request, Ok(Granted::Remembered)).unwrap();
        assert_eq!(once, [Part::data(json!({"decision": "approve_once"}))]);
        let denied = reply_parts(
            &request,
            Err(AgentError::ApprovalDenied {
                command: ask.command.clone(),
                reason: "no".into(),
            }),
        )
        .unwrap();
        let PartContent::Data(d) = &denied[0].content else {
            panic!()
        };
        assert!(
            d["decision"]["deny"]["reason"]
                .as_str()
                .unwrap()
                .contains("no")
        );
        assert!(matches!(
            reply_parts(&request, Err(AgentError::cancelled("gone"))),
            Err(AgentError::Cancelled { .. })
        ));
        // The peer reads the decision back as the same troupe decision.
        let back: ApprovalDecision = serde_json::from_value(json!("approve_once")).unwrap();
        assert_eq!(back, ApprovalDecision::ApproveOnce);
    }

    #[test]
    fn a_peers_elicitation_sampling_and_question_keep_their_subject() {
        let elicit = classify(
            "remote",
            Some(&waiting(vec![Part::data(json!({"approvalRequest": {
                "kind": "elicitation", "server": "everything", "message": "name?",
                "schema": {"type": "object"}}}))])),
        );
        assert!(matches!(&elicit.ask().subject,
            ApprovalSubject::McpElicitation { server, message, .. }
                if server == "remote:everything" && message == "name?"));
        let sampling = classify(
            "remote",
            Some(&waiting(vec![Part::data(json!({"approvalRequest": {
                "kind": "sampling", "server": "s", "request": {"messages": []}}}))])),
        );
        assert_eq!(
            sampling.ask().command,
            ["a2a", "remote", "mcp", "remote:s", "sampling"]
        );
        let question = classify(
            "remote",
            Some(&waiting(vec![Part::data(json!({"approvalRequest": {
                "kind": "question", "agentId": "deep", "question": "which?"}}))])),
        );
        assert!(matches!(&question,
            InputRequest::Relayed { ask } if ask.subject == ApprovalSubject::AgentQuestion {
                agent_id: "remote/deep".into(), question: "which?".into() }));
    }

    #[test]
    fn anything_else_is_a_question_whose_answer_is_the_reply() {
        let request = classify("remote", Some(&waiting(vec![Part::text("Which branch?")])));
        let InputRequest::Question { ask } = &request else {
            panic!("{request:?}")
        };
        assert_eq!(
            ask.subject,
            ApprovalSubject::AgentQuestion {
                agent_id: "remote".into(),
                question: "Which branch?".into()
            }
        );
        assert_eq!(request.kind(), "question");
        let answer = troupe_proto::approval::agent_answer("main");
        assert_eq!(
            reply_parts(&request, Ok(Granted::Decided(answer))).unwrap(),
            [Part::text("main")]
        );
        assert!(matches!(
            reply_parts(
                &request,
                Err(AgentError::timeout(
                    "an answer",
                    std::time::Duration::from_secs(1)
                ))
            ),
            Err(AgentError::ApprovalDenied { .. })
        ));
        // A malformed request is a question too, and no message at all still asks.
        let odd = classify(
            "remote",
            Some(&waiting(vec![Part::data(
                json!({"approvalRequest": {"kind": "command"}}),
            )])),
        );
        assert_eq!(odd.kind(), "question");
        assert!(matches!(&classify("remote", None).ask().subject,
            ApprovalSubject::AgentQuestion { question, .. } if !question.is_empty()));
    }
}
