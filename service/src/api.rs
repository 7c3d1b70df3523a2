//! Request and result shapes of the service's API that are not session-API types of
//! `troupe-proto`: creating sessions, sending messages, the current session of a project.
//! Shared by the JSON-RPC methods and the REST routes, like the page size of a listing.

use serde::{Deserialize, Serialize};
use troupe_proto::store::{MessageRecord, SessionRecord};
use troupe_proto::{AgentError, ConversationId, Json, MessageReply, OpenConversation};

/// Default page size of `messages.list` and the REST listing.
pub const DEFAULT_PAGE: usize = 50;

/// The page size asked for, checked: 1..=max, default [`DEFAULT_PAGE`] (capped by max).
pub fn page_limit(limit: Option<usize>, max: usize) -> Result<usize, AgentError> {
    match limit {
        None => Ok(DEFAULT_PAGE.min(max.max(1))),
        Some(0) => Err(AgentError::invalid("limit must be at least 1")),
        Some(n) if n > max => Err(AgentError::invalid(format!("limit must be at most {max}"))),
        Some(n) => Ok(n),
    }
}

/// `session.create` / `POST /api/sessions`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CreateSession {
    /// Defaults to the token's only project; required when the token has several.
    pub project_id: Option<String>,
    pub title: Option<String>,
    /// Free-form, stored with the session.
    pub settings: Option<Json>,
    /// Parameters of the root conversation (default: the configured chat conversation).
    pub root: Option<OpenConversation>,
}

impl CreateSession {
    /// What both `session.create` and `POST /api/sessions` refuse: an empty `project_id`,
    /// and `settings` that are not an object.
    pub fn validate(&self) -> Result<(), AgentError> {
        if self
            .project_id
            .as_deref()
            .is_some_and(|p| p.trim().is_empty())
        {
            return Err(AgentError::invalid(
                "project_id must not be empty (leave it out for no project)",
            ));
        }
        if let Some(settings) = &self.settings
            && !settings.0.is_object()
        {
            return Err(AgentError::invalid("settings must be a JSON object"));
        }
        Ok(())
    }
}

/// `conversation.message` / `conversation.send` / `POST /api/sessions/{id}/messages`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendText {
    /// Default: the session's root conversation.
    #[serde(default)]
    pub conversation_id: Option<ConversationId>,
    pub text: String,
    /// Wait for the reply (default) or answer once the message is stored.
    #[serde(default = "yes")]
    pub wait: bool,
    /// The request layer of the task's tool policy (A5): it can only narrow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<troupe_proto::agent::ToolRules>,
    /// Authorization tokens for the tools that need one (A5). Never stored or logged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authorization: Vec<String>,
}

/// Never prints a token.
impl std::fmt::Debug for SendText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendText")
            .field("conversation_id", &self.conversation_id)
            .field("text", &self.text)
            .field("wait", &self.wait)
            .field("tools", &self.tools)
            .field(
                "authorization",
                &format_args!("[{} tokens]", self.authorization.len()),
            )
            .finish()
    }
}

impl SendText {
    /// What it asks of tool governance.
    pub fn options(&self) -> troupe_proto::governance::MessageOptions {
        troupe_proto::governance::MessageOptions {
            tools: self.tools.clone(),
            authorization: self.authorization.clone(),
        }
    }
}

fn yes() -> bool {
    true
}

/// What sending a message answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sent {
    /// The user message, as stored before anything ran.
    pub message: MessageRecord,
    /// The task's reply, when the caller waited for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply: Option<MessageReply>,
    /// The assistant message, as stored, when the caller waited for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assistant: Option<MessageRecord>,
}

/// A project's current session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurrentSession {
    pub project_id: String,
    pub session: SessionRecord,
}

/// `PUT /api/projects/{pid}/current-session`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetCurrent {
    pub session_id: troupe_proto::SessionId,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_new_session_may_not_be() {
        let create = |v: serde_json::Value| serde_json::from_value::<CreateSession>(v).unwrap();
        assert!(create(serde_json::json!({})).validate().is_ok());
        assert!(
            create(serde_json::json!({"project_id": "p", "settings": {"a": 1}}))
                .validate()
                .is_ok()
        );
        for bad in [
            serde_json::json!({"project_id": ""}),
            serde_json::json!({"project_id": "  "}),
            serde_json::json!({"settings": "x"}),
            serde_json::json!({"settings": [1]}),
        ] {
            assert!(
                matches!(
                    create(bad.clone()).validate(),
                    Err(AgentError::InvalidInput { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn page_limits() {
        assert_eq!(page_limit(None, 1000).unwrap(), DEFAULT_PAGE);
        assert_eq!(page_limit(None, 10).unwrap(), 10);
        assert_eq!(page_limit(Some(3), 10).unwrap(), 3);
        assert!(page_limit(Some(0), 10).is_err());
        assert!(page_limit(Some(11), 10).is_err());
    }
}
