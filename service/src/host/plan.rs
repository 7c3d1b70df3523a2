//! The host's decisions, as plain functions: what a restart does with each pending message,
//! which status a task's end gives its message, how a stored session is started again.

use std::collections::HashMap;
use troupe_proto::store::{
    ConversationRecord, ConversationState, MessageRecord, MessageStatus, SessionRecord,
};
use troupe_proto::{AgentError, ConversationId, MessageReply, OpenConversation, TaskStatus};

/// What a restart does with one message that was queued or running when the service stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// It had not started and its text is stored: it runs, in its place in the queue.
    Requeue,
    /// It had started, or its text was never stored: it ends `aborted`, with the reason.
    Abort(&'static str),
    /// Its conversation is closed: it ends `cancelled`.
    Cancel,
}

/// A task that a crash interrupted is not run again: it may have had effects.
pub const INTERRUPTED_BY_RESTART: &str = "its task was interrupted by a restart";
/// A queued message of a conversation that keeps no content has no stored text to run.
pub const TEXT_NOT_KEPT: &str = "it was queued when the service stopped and its conversation's storage policy does not \
     keep message text, so there is nothing to run";

/// What to do with `message` after a restart, given the session's conversations.
pub fn recover(
    message: &MessageRecord,
    conversations: &HashMap<ConversationId, ConversationRecord>,
) -> Recovery {
    let open = conversations
        .get(&message.conversation_id)
        .is_some_and(|c| c.state == ConversationState::Open);
    match message.status {
        Some(MessageStatus::Running) => Recovery::Abort(INTERRUPTED_BY_RESTART),
        _ if !open => Recovery::Cancel,
        _ if message.content.is_none() => Recovery::Abort(TEXT_NOT_KEPT),
        _ => Recovery::Requeue,
    }
}

/// The status a message ends with, given how its task ended.
pub fn outcome(result: &Result<MessageReply, AgentError>) -> MessageStatus {
    match result {
        Ok(reply) => match reply.status {
            TaskStatus::Ok | TaskStatus::MaxSteps => MessageStatus::Completed,
            TaskStatus::Error => MessageStatus::Failed,
            TaskStatus::Cancelled => MessageStatus::Cancelled,
        },
        Err(AgentError::Interrupted { .. }) => MessageStatus::Aborted,
        Err(AgentError::Cancelled { .. }) => MessageStatus::Cancelled,
        Err(_) => MessageStatus::Failed,
    }
}

/// What restarting a stored session takes: the root conversation's parameters (the session's
/// root reopens under its id) and the other open conversations, oldest first.
pub fn restore_plan(
    record: &SessionRecord,
    conversations: &[ConversationRecord],
) -> (
    Option<OpenConversation>,
    Vec<(ConversationId, OpenConversation)>,
) {
    let root = conversations
        .iter()
        .find(|c| c.conversation_id == record.root_conversation_id)
        .map(|c| c.params.clone());
    let mut others: Vec<&ConversationRecord> = conversations
        .iter()
        .filter(|c| c.conversation_id != record.root_conversation_id)
        .filter(|c| c.state == ConversationState::Open)
        .collect();
    others.sort_by_key(|c| (c.created_ms, c.conversation_id));
    (
        root,
        others
            .into_iter()
            .map(|c| (c.conversation_id, c.params.clone()))
            .collect(),
    )
}

/// Whether a session that stopped on its own may be started again now, given its recent
/// restarts (pruned to the window).
pub fn may_restart(
    recent: &mut Vec<std::time::Instant>,
    now: std::time::Instant,
    per_window: usize,
    window: std::time::Duration,
) -> bool {
    recent.retain(|t| now.duration_since(*t) < window);
    if recent.len() >= per_window {
        return false;
    }
    recent.push(now);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};
    use troupe_proto::{Json, Role, SessionId, TaskId, TaskStats};

    fn conversation(session_id: SessionId, state: ConversationState) -> ConversationRecord {
        ConversationRecord {
            conversation_id: ConversationId::new(),
            session_id,
            params: OpenConversation::default(),
            is_root: false,
            state,
            created_ms: 1,
            closed_ms: None,
        }
    }

    fn message(
        c: &ConversationRecord,
        status: MessageStatus,
        content: Option<&str>,
    ) -> MessageRecord {
        MessageRecord {
            message_id: 1,
            session_id: c.session_id,
            conversation_id: c.conversation_id,
            task_id: None,
            role: Role::User,
            content: content.map(str::to_owned),
            chars: 2,
            created_ms: 1,
            status: Some(status),
            reply_message_id: None,
        }
    }

    #[test]
    fn a_restart_runs_queued_messages_and_aborts_started_ones() {
        let s = SessionId::new();
        let open = conversation(s, ConversationState::Open);
        let closed = conversation(s, ConversationState::Closed);
        let all = HashMap::from([
            (open.conversation_id, open.clone()),
            (closed.conversation_id, closed.clone()),
        ]);
        let q = MessageStatus::Queued;
        assert_eq!(
            recover(&message(&open, q, Some("hi")), &all),
            Recovery::Requeue
        );
        assert_eq!(
            recover(&message(&open, MessageStatus::Running, Some("hi")), &all),
            Recovery::Abort(INTERRUPTED_BY_RESTART)
        );
        assert_eq!(
            recover(&message(&open, q, None), &all),
            Recovery::Abort(TEXT_NOT_KEPT)
        );
        assert_eq!(
            recover(&message(&closed, q, Some("hi")), &all),
            Recovery::Cancel
        );
        let unknown = conversation(s, ConversationState::Open);
        assert_eq!(
            recover(&message(&unknown, q, Some("hi")), &all),
            Recovery::Cancel
        );
        assert_eq!(
            recover(&message(&closed, MessageStatus::Running, None), &all),
            Recovery::Abort(INTERRUPTED_BY_RESTART),
            "a started task is aborted wherever it ran"
        );
    }

    #[test]
    fn a_task_end_gives_its_message_an_outcome() {
        let reply = |status| MessageReply {
            conversation_id: ConversationId::new(),
            task_id: TaskId::new(),
            status,
            text: String::new(),
            stats: TaskStats::default(),
            error: None,
        };
        assert_eq!(
            outcome(&Ok(reply(TaskStatus::Ok))),
            MessageStatus::Completed
        );
        assert_eq!(
            outcome(&Ok(reply(TaskStatus::MaxSteps))),
            MessageStatus::Completed
        );
        assert_eq!(
            outcome(&Ok(reply(TaskStatus::Error))),
            MessageStatus::Failed
        );
        assert_eq!(
            outcome(&Ok(reply(TaskStatus::Cancelled))),
            MessageStatus::Cancelled
        );
        assert_eq!(
            outcome(&Err(AgentError::interrupted("x"))),
            MessageStatus::Aborted
        );
        assert_eq!(
            outcome(&Err(AgentError::cancelled("x"))),
            MessageStatus::Cancelled
        );
        assert_eq!(
            outcome(&Err(AgentError::internal("x"))),
            MessageStatus::Failed
        );
        assert!(MessageStatus::ALL.iter().all(
            |s| s.is_terminal() != matches!(s, MessageStatus::Queued | MessageStatus::Running)
        ));
    }

    #[test]
    fn restarts_are_limited_per_window() {
        let t0 = Instant::now();
        let window = Duration::from_secs(60);
        let mut recent = Vec::new();
        for i in 0..3 {
            assert!(may_restart(
                &mut recent,
                t0 + Duration::from_secs(i),
                3,
                window
            ));
        }
        assert!(!may_restart(
            &mut recent,
            t0 + Duration::from_secs(10),
            3,
            window
        ));
        assert_eq!(recent.len(), 3, "a refusal is not counted");
        assert!(may_restart(
            &mut recent,
            t0 + Duration::from_secs(60),
            3,
            window
        ));
        assert!(!may_restart(
            &mut recent,
            t0 + Duration::from_secs(60),
            3,
            window
        ));
    }

    #[test]
    fn a_restart_reopens_the_root_and_the_open_conversations() {
        let session_id = SessionId::new();
        let root = ConversationId::new();
        let conv = |id, is_root, state, created_ms| ConversationRecord {
            conversation_id: id,
            session_id,
            params: OpenConversation {
                base_instructions: Some(format!("{created_ms}")),
                ..OpenConversation::default()
            },
            is_root,
            state,
            created_ms,
            closed_ms: None,
        };
        let (open, closed, later) = (
            ConversationId::new(),
            ConversationId::new(),
            ConversationId::new(),
        );
        let record = SessionRecord {
            session_id,
            project_id: None,
            title: None,
            created_ms: 1,
            root_conversation_id: root,
            settings: Json(serde_json::json!({})),
        };
        let (root_params, others) = restore_plan(
            &record,
            &[
                conv(later, false, ConversationState::Open, 9),
                conv(closed, false, ConversationState::Closed, 3),
                conv(root, true, ConversationState::Open, 1),
                conv(open, false, ConversationState::Open, 2),
            ],
        );
        assert_eq!(root_params.unwrap().base_instructions.as_deref(), Some("1"));
        let ids: Vec<ConversationId> = others.iter().map(|(id, _)| *id).collect();
        assert_eq!(
            ids,
            vec![open, later],
            "open ones, oldest first, not the closed one"
        );
    }
}
