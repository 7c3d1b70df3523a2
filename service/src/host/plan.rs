//! The host's decisions, as plain functions: what a restart does with each pending message,
//! which status a task's end gives its message and its session, which messages record the
//! exchange, how a stored session is started again.

use std::collections::HashMap;
use troupe_proto::store::{
    ConversationRecord, ConversationState, MessageKind, MessageRecord, MessageStatus, NewMessage,
    SessionRecord, SessionStatus,
};
use troupe_proto::{
    AgentError, ConversationId, ErrorKind, HistoryItem, Json, MessageReply, OpenConversation, Role,
    StoragePolicy, TaskStatus,
};

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

/// A queued message of a `ttl` conversation whose text expired (and was swept) while it
/// waited has no stored text to run.
pub const TEXT_EXPIRED: &str = "it was queued when the service stopped and its text passed its \
     conversation's ttl before the next start, so there is nothing to run";

/// What to do with `message` after a restart, given the session's conversations.
pub fn recover(
    message: &MessageRecord,
    conversations: &HashMap<ConversationId, ConversationRecord>,
) -> Recovery {
    let conversation = conversations.get(&message.conversation_id);
    let open = conversation.is_some_and(|c| c.state == ConversationState::Open);
    let ttl =
        conversation.is_some_and(|c| matches!(c.params.storage_policy, StoragePolicy::Ttl { .. }));
    match message.status {
        Some(MessageStatus::Running) => Recovery::Abort(INTERRUPTED_BY_RESTART),
        _ if !open => Recovery::Cancel,
        _ if message.content.is_none() && ttl => Recovery::Abort(TEXT_EXPIRED),
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

/// The session's status (P1) once something happened to it: `active` while any of its
/// messages is queued or running; else the outcome of the message that just ended (see
/// [`SessionStatus::after`]); else (nothing ended) what it was.
pub fn session_status(
    pending: usize,
    ended: Option<MessageStatus>,
    current: SessionStatus,
) -> SessionStatus {
    match ended {
        _ if pending > 0 => SessionStatus::Active,
        Some(outcome) => SessionStatus::after(outcome),
        None => current,
    }
}

/// The messages stored with a user message's end, before its reply (P1): what its task did
/// on the way, in order — the model's text between tool calls (`text`), each tool call
/// (`tool_call`: content = its arguments) and each result (`tool_result`: content = the
/// output) — then, when the message did not complete, a `status` message with the error.
/// The task's first item (the user message, already stored) and, when the message completed,
/// its last (the final text, stored as the reply) are left out: a message that ended
/// otherwise has no reply, its last text stays with the exchange. Content is what `policy` keeps; metadata holds no
/// content (tool names, call ids, error flags, codes, and `reply_to`: the user message).
/// Each is dated when it happened (a call when it started, its result when it ended), so
/// that under `ttl` it expires from then; the status message, and every item when the
/// reply carries no times, at `at_ms` (the end).
pub fn exchange(
    user: &MessageRecord,
    result: &Result<MessageReply, AgentError>,
    status: MessageStatus,
    policy: StoragePolicy,
    at_ms: u64,
) -> Vec<NewMessage> {
    let reply_to = user.message_id;
    let message = |kind, role, task_id, text: &str, metadata: serde_json::Value, at_ms: u64| {
        let (content, chars) = super::stored_content(policy, text);
        NewMessage {
            session_id: user.session_id,
            conversation_id: user.conversation_id,
            task_id,
            role,
            content,
            chars,
            created_ms: at_ms,
            status: None,
            kind,
            metadata: Some(Json(metadata)),
        }
    };
    let mut out = Vec::new();
    if let Ok(reply) = result {
        let task = Some(reply.task_id);
        let mut items: &[HistoryItem] = &reply.items;
        // When each item happened (the task's end when not known): content kept under
        // `ttl` expires from then, as the rollout's record of it does.
        let mut times: &[u64] = if reply.item_times_ms.len() == items.len() {
            &reply.item_times_ms
        } else {
            &[]
        };
        if let [
            HistoryItem::Message {
                role: Role::User, ..
            },
            rest @ ..,
        ] = items
        {
            items = rest;
            times = times.get(1..).unwrap_or_default();
        }
        if let [
            rest @ ..,
            HistoryItem::Message {
                role: Role::Assistant,
                text,
            },
        ] = items
            && *text == reply.text
            && status == MessageStatus::Completed
        {
            items = rest;
        }
        let mut tools: HashMap<&str, &str> = HashMap::new();
        for (n, item) in items.iter().enumerate() {
            let at_ms = times.get(n).copied().unwrap_or(at_ms);
            match item {
                HistoryItem::Message { role, text } => out.push(message(
                    MessageKind::Text,
                    *role,
                    task,
                    text,
                    serde_json::json!({ "reply_to": reply_to }),
                    at_ms,
                )),
                HistoryItem::ToolCall(call) => {
                    tools.insert(&call.call_id, &call.name);
                    out.push(message(
                        MessageKind::ToolCall,
                        Role::Assistant,
                        task,
                        &call.arguments.0.to_string(),
                        serde_json::json!({
                            "tool": call.name,
                            "call_id": call.call_id,
                            "reply_to": reply_to,
                        }),
                        at_ms,
                    ));
                }
                HistoryItem::ToolOutput(output) => out.push(message(
                    MessageKind::ToolResult,
                    Role::Assistant,
                    task,
                    &output.output,
                    serde_json::json!({
                        "tool": tools.get(output.call_id.as_str()),
                        "call_id": output.call_id,
                        "is_error": output.is_error,
                        "reply_to": reply_to,
                    }),
                    at_ms,
                )),
                // A task adds no summary to history; nothing of it is an exchange message.
                HistoryItem::Summary { .. } => {}
            }
        }
    }
    if status != MessageStatus::Completed {
        let error = match result {
            Ok(reply) => reply.error.clone(),
            Err(e) => Some(e.clone()),
        };
        out.push(message(
            MessageKind::Status,
            Role::System,
            result.as_ref().ok().map(|r| r.task_id),
            &error.as_ref().map(ToString::to_string).unwrap_or_default(),
            serde_json::json!({
                "status": status.as_str(),
                "code": error.as_ref().map(|e| e.kind().as_str()),
                "reply_to": reply_to,
            }),
            at_ms,
        ));
    }
    out
}

/// What restarting a stored session takes: the root conversation's parameters (the session's
/// root reopens under its id) and the other open conversations, oldest first.
///
/// Each conversation's parameters are as its store may hold them at `now_ms` (see
/// [`OpenConversation::kept_by_policy`] and [`OpenConversation::stored_at`]): a session
/// restarted from what its host holds in memory runs a `headers_only`, `none` or expired
/// `ttl` conversation without its instructions, as one reopened from the store does.
pub fn restore_plan(
    record: &SessionRecord,
    conversations: &[ConversationRecord],
    now_ms: u64,
) -> (
    Option<OpenConversation>,
    Vec<(ConversationId, OpenConversation)>,
) {
    let root = conversations
        .iter()
        .find(|c| c.conversation_id == record.root_conversation_id)
        .map(|c| as_stored(c, now_ms));
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
            .map(|c| (c.conversation_id, as_stored(c, now_ms)))
            .collect(),
    )
}

/// A conversation's parameters as its store may hold them at `now_ms`.
pub fn as_stored(c: &ConversationRecord, now_ms: u64) -> OpenConversation {
    c.params
        .clone()
        .kept_by_policy()
        .stored_at(c.created_ms, now_ms)
}

/// What a queued message whose start the store would not write has become, so that what its
/// caller hears is what holds after the next start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unstarted {
    /// It is not pending in the store any more (its failure was written, or the store refused
    /// the write for what it holds: the message ended or is gone): it never runs, and its
    /// caller hears why it did not start.
    Failed,
    /// Its failure could not be written either (the store is down, the session's lease was
    /// lost): the store still holds it `queued`. It keeps its place and its start is tried
    /// again ([`retried_start`]), and the next start of its session runs it if that comes
    /// first. Its caller hears that, not a failure that would not hold.
    StaysQueued,
}

/// What a message whose start failed has become, given how the write of its failure ended.
pub fn unstarted(failure_written: Result<(), ErrorKind>) -> Unstarted {
    match failure_written {
        Ok(()) | Err(ErrorKind::InvalidInput | ErrorKind::NotFound) => Unstarted::Failed,
        Err(_) => Unstarted::StaysQueued,
    }
}

/// Whether a run of the session in `status` still takes events and new messages. A run that
/// is being killed (its conversations' tasks end first, and their outcomes reach the host
/// before it hears the run stopped) does not: an update told to it would be lost, and a
/// message started on it would end interrupted, so both wait for the run that replaces it.
pub fn takes_events(status: ractor::ActorStatus) -> bool {
    !matches!(
        status,
        ractor::ActorStatus::Stopping | ractor::ActorStatus::Stopped
    )
}

/// What a refused start of a queued message does with it, given the starts of it the store
/// refused before (each time its failure too) and the kind of this refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetriedStart {
    /// Its first try: write its failure ([`unstarted`] says what it then becomes).
    Fail,
    /// A later try that the store failed too: it stays queued, tried again later. Never
    /// failed now: its caller was told it would run.
    Again,
    /// A later try the store refused for what it holds (the message ended or is gone): it
    /// leaves the line, with nothing to run or answer.
    Gone,
}

pub fn retried_start(refused_before: u32, error: ErrorKind) -> RetriedStart {
    match (refused_before, error) {
        (0, _) => RetriedStart::Fail,
        (_, ErrorKind::Internal) => RetriedStart::Again,
        (_, _) => RetriedStart::Gone,
    }
}

/// How long a conversation waits before it tries again to start a queued message whose
/// start (and whose failure) the store refused `refused` times in a row: 1 s, doubling, at
/// most a minute.
pub fn start_retry_delay(refused: u32) -> std::time::Duration {
    std::time::Duration::from_secs(1u64 << refused.min(6)).min(std::time::Duration::from_secs(60))
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

    /// A start the store refused is tried again after 1 s, then less and less often, at
    /// least once a minute however long the store refuses.
    #[test]
    fn a_refused_start_is_tried_again_at_least_once_a_minute() {
        let secs: Vec<u64> = (0..9).map(|n| start_retry_delay(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(start_retry_delay(u32::MAX).as_secs(), 60);
    }

    /// A first refused start may end the message failed; a message kept after one is only
    /// ever tried again while the store fails, and leaves the line once the store says it is
    /// no longer queued.
    #[test]
    fn a_kept_message_is_never_failed_by_a_later_try() {
        assert_eq!(retried_start(0, ErrorKind::Internal), RetriedStart::Fail);
        assert_eq!(
            retried_start(0, ErrorKind::InvalidInput),
            RetriedStart::Fail
        );
        for refused in [1, 2, 40] {
            assert_eq!(
                retried_start(refused, ErrorKind::Internal),
                RetriedStart::Again
            );
            assert_eq!(
                retried_start(refused, ErrorKind::InvalidInput),
                RetriedStart::Gone
            );
            assert_eq!(
                retried_start(refused, ErrorKind::NotFound),
                RetriedStart::Gone
            );
        }
    }

    /// Updates and new messages wait for the next run while the current one is stopping or
    /// stopped.
    #[test]
    fn a_stopping_run_takes_no_events() {
        use ractor::ActorStatus::*;
        for status in [Unstarted, Starting, Running, Upgrading, Draining] {
            assert!(takes_events(status), "{status:?}");
        }
        for status in [Stopping, Stopped] {
            assert!(!takes_events(status), "{status:?}");
        }
    }

    /// A message whose start failed is told failed only when the store no longer holds it
    /// pending; while its row may still read `queued`, it is told it stays queued.
    #[test]
    fn an_unstarted_message_fails_only_once_the_store_holds_it_so() {
        assert_eq!(unstarted(Ok(())), Unstarted::Failed);
        assert_eq!(unstarted(Err(ErrorKind::InvalidInput)), Unstarted::Failed);
        assert_eq!(unstarted(Err(ErrorKind::NotFound)), Unstarted::Failed);
        assert_eq!(unstarted(Err(ErrorKind::Internal)), Unstarted::StaysQueued);
        assert_eq!(
            unstarted(Err(ErrorKind::Interrupted)),
            Unstarted::StaysQueued
        );
    }

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
            kind: troupe_proto::store::MessageKind::Text,
            metadata: None,
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
        let mut ttl = conversation(s, ConversationState::Open);
        ttl.params.storage_policy = StoragePolicy::Ttl { secs: 1 };
        let with_ttl = HashMap::from([(ttl.conversation_id, ttl.clone())]);
        assert_eq!(
            recover(&message(&ttl, q, None), &with_ttl),
            Recovery::Abort(TEXT_EXPIRED),
            "a ttl conversation's text is gone because it expired"
        );
        assert_eq!(
            recover(&message(&ttl, q, Some("hi")), &with_ttl),
            Recovery::Requeue
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
            items: Vec::new(),
            item_times_ms: Vec::new(),
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
    fn a_session_is_active_while_it_has_work_then_takes_the_last_outcome() {
        use SessionStatus as S;
        let all = MessageStatus::ALL;
        for current in S::ALL {
            for ended in all.map(Some).into_iter().chain([None]) {
                assert_eq!(session_status(1, ended, current), S::Active, "work left");
            }
            assert_eq!(session_status(0, None, current), current, "nothing ended");
        }
        let ended = |m| session_status(0, Some(m), S::Active);
        assert_eq!(ended(MessageStatus::Completed), S::Completed);
        assert_eq!(ended(MessageStatus::Failed), S::Failed);
        assert_eq!(ended(MessageStatus::Aborted), S::Failed);
        assert_eq!(ended(MessageStatus::Cancelled), S::Cancelled);
    }

    #[test]
    fn the_exchange_is_what_the_task_did_between_the_question_and_the_reply() {
        use troupe_proto::{ToolCall, ToolOutput};
        let c = conversation(SessionId::new(), ConversationState::Open);
        let user = message(&c, MessageStatus::Running, Some("list files"));
        let task_id = TaskId::new();
        let call = ToolCall {
            call_id: "c1".into(),
            name: "shell".into(),
            arguments: Json(serde_json::json!({"command": ["ls"]})),
        };
        let reply = |status, text: &str, error| MessageReply {
            conversation_id: c.conversation_id,
            task_id,
            status,
            text: text.into(),
            stats: TaskStats::default(),
            error,
            items: vec![
                HistoryItem::user("list files"),
                HistoryItem::assistant("let me look"),
                HistoryItem::ToolCall(call.clone()),
                HistoryItem::ToolOutput(ToolOutput {
                    call_id: "c1".into(),
                    output: "a.txt".into(),
                    is_error: false,
                }),
                HistoryItem::assistant("one file: a.txt"),
            ],
            item_times_ms: vec![1, 2, 3, 4, 5],
        };
        let done = Ok(reply(TaskStatus::Ok, "one file: a.txt", None));
        let items = exchange(
            &user,
            &done,
            MessageStatus::Completed,
            StoragePolicy::Full,
            7,
        );
        let kinds: Vec<MessageKind> = items.iter().map(|m| m.kind).collect();
        assert_eq!(
            kinds,
            vec![
                MessageKind::Text,
                MessageKind::ToolCall,
                MessageKind::ToolResult
            ],
            "neither the question nor the reply: both are stored apart"
        );
        assert_eq!(items[0].content.as_deref(), Some("let me look"));
        assert_eq!(
            items[1].content.as_deref(),
            Some(r#"{"command":["ls"]}"#),
            "a call's content is its arguments"
        );
        assert_eq!(
            items[1].metadata.as_ref().unwrap().0,
            serde_json::json!({"tool": "shell", "call_id": "c1", "reply_to": 1})
        );
        assert_eq!(
            items[2].metadata.as_ref().unwrap().0,
            serde_json::json!({"tool": "shell", "call_id": "c1", "is_error": false, "reply_to": 1})
        );
        assert!(items.iter().all(|m| m.task_id == Some(task_id)
            && m.status.is_none()
            && m.session_id == user.session_id));
        let times: Vec<u64> = items.iter().map(|m| m.created_ms).collect();
        assert_eq!(
            times,
            [2, 3, 4],
            "each is dated when it happened (so a ttl expires from then), not at the end"
        );
        let mut undated = reply(TaskStatus::Ok, "one file: a.txt", None);
        undated.item_times_ms = vec![1];
        let items = exchange(
            &user,
            &Ok(undated),
            MessageStatus::Completed,
            StoragePolicy::Full,
            7,
        );
        assert!(
            items.iter().all(|m| m.created_ms == 7),
            "times that do not match the items: the end's"
        );

        // A policy that keeps no content keeps the metadata, never the content.
        let headers = exchange(
            &user,
            &done,
            MessageStatus::Completed,
            StoragePolicy::HeadersOnly,
            7,
        );
        assert!(
            headers
                .iter()
                .all(|m| m.content.is_none() && m.metadata.is_some())
        );
        assert_eq!(headers[1].chars, 18);

        // A message that did not complete ends with a status message.
        let failed = Ok(reply(
            TaskStatus::Error,
            "",
            Some(AgentError::internal("the model went away")),
        ));
        let items = exchange(
            &user,
            &failed,
            MessageStatus::Failed,
            StoragePolicy::Full,
            7,
        );
        let last = items.last().unwrap();
        assert_eq!(items.len(), 5, "the final text is not the reply here: kept");
        assert_eq!(
            items.iter().map(|m| m.created_ms).collect::<Vec<_>>(),
            [2, 3, 4, 5, 7],
            "the status message is dated at the end"
        );
        assert_eq!((last.kind, last.role), (MessageKind::Status, Role::System));
        assert!(
            last.content
                .as_deref()
                .unwrap()
                .contains("the model went away")
        );
        assert_eq!(
            last.metadata.as_ref().unwrap().0,
            serde_json::json!({"status": "failed", "code": "internal", "reply_to": 1})
        );
        // Cancelled after writing: no reply, the text it had stays in the exchange.
        let partial = Ok(reply(
            TaskStatus::Cancelled,
            "one file: a.txt",
            Some(AgentError::cancelled("cancelled")),
        ));
        let items = exchange(
            &user,
            &partial,
            MessageStatus::Cancelled,
            StoragePolicy::Full,
            7,
        );
        assert_eq!(items.len(), 5, "{items:?}");
        assert_eq!(items[3].content.as_deref(), Some("one file: a.txt"));
        assert_eq!(items[4].kind, MessageKind::Status);
        let cancelled = Err(AgentError::cancelled("conversation closed"));
        let items = exchange(
            &user,
            &cancelled,
            MessageStatus::Cancelled,
            StoragePolicy::Full,
            7,
        );
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].kind, MessageKind::Status);
        assert_eq!(items[0].task_id, None);
        assert_eq!(items[0].metadata.as_ref().unwrap().0["code"], "cancelled");
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
            status: troupe_proto::store::SessionStatus::Active,
            updated_ms: 0,
        };
        let (root_params, others) = restore_plan(
            &record,
            &[
                conv(later, false, ConversationState::Open, 9),
                conv(closed, false, ConversationState::Closed, 3),
                conv(root, true, ConversationState::Open, 1),
                conv(open, false, ConversationState::Open, 2),
            ],
            10,
        );
        assert_eq!(root_params.unwrap().base_instructions.as_deref(), Some("1"));
        let ids: Vec<ConversationId> = others.iter().map(|(id, _)| *id).collect();
        assert_eq!(
            ids,
            vec![open, later],
            "open ones, oldest first, not the closed one"
        );
    }

    #[test]
    fn a_restart_keeps_instructions_only_as_the_storage_policy_does() {
        use troupe_proto::StoragePolicy;
        let with = |policy| ConversationRecord {
            conversation_id: ConversationId::new(),
            session_id: SessionId::new(),
            params: OpenConversation {
                base_instructions: Some("be brief".into()),
                user_instructions: Some("in French".into()),
                storage_policy: policy,
                ..OpenConversation::default()
            },
            is_root: false,
            state: ConversationState::Open,
            created_ms: 1_000,
            closed_ms: None,
        };
        let kept = |policy, now_ms| as_stored(&with(policy), now_ms).has_instructions();
        assert!(kept(StoragePolicy::Full, 10_000_000));
        assert!(!kept(StoragePolicy::HeadersOnly, 1_000));
        assert!(!kept(StoragePolicy::None, 1_000));
        assert!(kept(StoragePolicy::Ttl { secs: 60 }, 60_999));
        assert!(!kept(StoragePolicy::Ttl { secs: 60 }, 61_000));
    }
}
