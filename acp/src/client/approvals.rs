//! A [`PermissionHandler`] that asks troupe's ApprovalStore: an external agent's permission
//! request becomes a pending approval of the dispatching task (an `approval_requested`
//! event, answered by a human through the API, the CLI or `troupe acp`'s client), exactly as
//! a shell command of that task would.
//!
//! The command a human sees (and that a remembered approval is keyed by) is the tool call's
//! argv when the agent gives one (`rawInput.command` as a list), else its command line
//! (`rawInput.command` or `rawInput.cmd` as a string), else its title. troupe keeps the
//! memory of approvals: a request it approves is answered `allow_once` to the agent (so the
//! agent asks again next time and troupe's keys answer), a denial `reject_once`, and a
//! request nobody can answer any more (the dispatch cancelled, the session gone)
//! `cancelled`.

use super::PermissionHandler;
use crate::event::{PermissionDecision, PermissionRequest};
use serde_json::Value;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use troupe_actors::approval_store::{ApprovalMsg, Ask, ask_until_answered, metrics::Asker};
use troupe_actors::directory::ServiceRef;
use troupe_proto::{AgentError, ApprovalSubject, ConversationId, TaskId};

/// Asks the session's ApprovalStore on behalf of one task.
#[derive(Clone)]
pub struct ApprovalStorePermissions {
    /// The store, read at each request (it may be replaced while the task runs).
    pub approvals: ServiceRef<ApprovalMsg>,
    /// The task that dispatched to the agent: the approval is its.
    pub conversation_id: ConversationId,
    pub task_id: TaskId,
    /// The agent's id, named in the reason a human reads.
    pub agent_id: String,
    /// How long a human has (the session's approval timeout).
    pub timeout: Option<Duration>,
    /// The dispatch is over: stop asking.
    pub cancel: CancellationToken,
}

impl std::fmt::Debug for ApprovalStorePermissions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalStorePermissions")
            .field("conversation_id", &self.conversation_id)
            .field("task_id", &self.task_id)
            .field("agent_id", &self.agent_id)
            .finish_non_exhaustive()
    }
}

/// The command a human approves for this request.
pub fn command_of(request: &PermissionRequest) -> Vec<String> {
    let input = request.raw_input.as_ref();
    let field = |name: &str| input.and_then(|v| v.get(name));
    if let Some(Value::Array(items)) = field("command") {
        let argv: Vec<String> = items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        if !argv.is_empty() && argv.len() == items.len() {
            return argv;
        }
    }
    for name in ["command", "cmd"] {
        if let Some(Value::String(line)) = field(name) {
            return vec![line.clone()];
        }
    }
    vec![
        request
            .title
            .clone()
            .unwrap_or_else(|| request.tool_call_id.clone()),
    ]
}

/// The agent's answer for the store's.
pub fn decision_of(
    answer: Option<Result<troupe_actors::approval_store::Granted, AgentError>>,
) -> PermissionDecision {
    match answer {
        Some(Ok(_)) => PermissionDecision::AllowOnce,
        Some(Err(AgentError::Cancelled { .. } | AgentError::Interrupted { .. })) | None => {
            PermissionDecision::Cancelled
        }
        Some(Err(_)) => PermissionDecision::RejectOnce,
    }
}

#[async_trait::async_trait]
impl PermissionHandler for ApprovalStorePermissions {
    async fn decide(&self, request: &PermissionRequest) -> PermissionDecision {
        let title = request.title.clone().unwrap_or_default();
        let ask = Ask {
            conversation_id: self.conversation_id,
            task_id: Some(self.task_id),
            command: command_of(request),
            reason: format!("ACP agent `{}` asks to run: {title}", self.agent_id),
            subject: ApprovalSubject::Command,
        };
        let asked = ask_until_answered(&self.approvals, ask, self.timeout, Asker::Task);
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => PermissionDecision::Cancelled,
            answer = asked => decision_of(answer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(raw_input: Option<Value>, title: Option<&str>) -> PermissionRequest {
        PermissionRequest {
            session_id: "s".into(),
            tool_call_id: "c1".into(),
            title: title.map(str::to_owned),
            kind: Some("execute".into()),
            raw_input,
            options: Vec::new(),
        }
    }

    #[test]
    fn the_command_is_the_argv_else_the_line_else_the_title() {
        let argv = request(Some(json!({"command": ["touch", "x"]})), Some("t"));
        assert_eq!(command_of(&argv), ["touch", "x"]);
        let line = request(Some(json!({"cmd": "touch x"})), Some("t"));
        assert_eq!(command_of(&line), ["touch x"]);
        let titled = request(Some(json!({"other": 1})), Some("Run touch x"));
        assert_eq!(command_of(&titled), ["Run touch x"]);
        assert_eq!(command_of(&request(None, None)), ["c1"]);
    }

    #[test]
    fn approvals_allow_once_denials_reject_and_silence_cancels() {
        use troupe_actors::approval_store::Granted;
        assert_eq!(
            decision_of(Some(Ok(Granted::Remembered))),
            PermissionDecision::AllowOnce
        );
        let denied = AgentError::ApprovalDenied {
            command: vec![],
            reason: "no".into(),
        };
        assert_eq!(
            decision_of(Some(Err(denied))),
            PermissionDecision::RejectOnce
        );
        assert_eq!(decision_of(None), PermissionDecision::Cancelled);
    }
}
