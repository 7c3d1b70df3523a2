//! A session's event stream as clients see it (P3, P4): every event after a given `seq`,
//! first those already recorded, then live ones, without a gap and without a duplicate.
//!
//! [`events`] is the only place that knows where events come from; SSE, WebSocket and the
//! JSON-RPC `events.subscribe` notifications all read it. It is the session's resumable
//! stream (`SessionHandle::events`): the recorded events after the resume point, then live
//! ones, which the rollout publishes only once they are committed, so a client that resumes
//! after a crash of the service neither misses nor repeats one. An error ends it (the client
//! resumes from its last `seq`).
//!
//! Event types (the `type` field and the SSE `event:` name):
//!
//! | type | troupe event kinds |
//! |---|---|
//! | `text_delta` | `assistant_chunk` |
//! | `tool_call` | `tool_call_started`, `tool_call_finished` |
//! | `error` | `error` |
//! | `message_complete` | `task_finished` |
//! | `approval_requested` | `approval_requested` |
//! | `approval_resolved` | `approval_resolved` |
//! | `message_status` | `message_updated`: a stored user message started or reached its outcome (`message_id`, `status`, `task_id`, `reply_message_id`) |
//! | `status_update` | every other kind (`task_started`, `step_started`, `step_finished`, `assistant_message`, `conversation_opened`, `conversation_closed`, `warning`, ...) |

use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use troupe_actors::SessionHandle;
use troupe_actors::rollout::{RolloutRecord, record_for};
use troupe_proto::{AgentError, ConversationId, EventEnvelope, EventName, StoragePolicy, TaskId};

/// One event as a client receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamEvent {
    /// The session's sequence number: the SSE `id`, the resume cursor.
    pub seq: u64,
    /// One of the eight client types (see the module doc).
    #[serde(rename = "type")]
    pub event_type: String,
    /// The troupe event kind (`assistant_chunk`, `task_finished`, ...).
    pub kind: EventName,
    pub ts_ms: u64,
    pub conversation_id: Option<ConversationId>,
    pub task_id: Option<TaskId>,
    /// The event's fields when its content is known (live, or recorded in full), else the
    /// content-free facts the record kept.
    pub data: serde_json::Value,
}

/// The client type of a troupe event kind.
pub fn event_type(kind: EventName) -> &'static str {
    match kind {
        EventName::AssistantChunk => "text_delta",
        EventName::ToolCallStarted | EventName::ToolCallFinished => "tool_call",
        EventName::Error => "error",
        EventName::TaskFinished => "message_complete",
        EventName::ApprovalRequested => "approval_requested",
        EventName::ApprovalResolved => "approval_resolved",
        EventName::MessageUpdated => "message_status",
        _ => "status_update",
    }
}

/// A recorded (or live, recorded in full) event as a client sees it.
pub fn from_record(record: &RolloutRecord) -> StreamEvent {
    let data = match &record.event {
        Some(event) => serde_json::to_value(event)
            .ok()
            .and_then(|mut v| v.get_mut("payload").map(serde_json::Value::take))
            .unwrap_or(serde_json::Value::Null),
        None => serde_json::to_value(&record.meta).unwrap_or(serde_json::Value::Null),
    };
    StreamEvent {
        seq: record.seq,
        event_type: event_type(record.kind).to_owned(),
        kind: record.kind,
        ts_ms: record.ts_ms,
        conversation_id: record.conversation_id,
        task_id: record.task_id,
        data,
    }
}

/// A live event: never written anywhere, so it is shown whole.
pub fn from_live(env: &EventEnvelope) -> Option<StreamEvent> {
    record_for(StoragePolicy::Full, env).map(|r| from_record(&r))
}

/// Every event of the session with `seq > after`: recorded ones, then live ones, from the
/// session's resumable stream (stored records first, then live, nothing twice).
pub async fn events(
    handle: &SessionHandle,
    after: u64,
) -> Result<impl Stream<Item = Result<StreamEvent, AgentError>> + Send + 'static + use<>, AgentError>
{
    let records = handle.events(after).await?;
    Ok(records.map(|r| r.map(|record| from_record(&record))))
}

/// Keeps `troupe_stream_subscribers{transport}` right for as long as a stream lives.
pub struct Subscriber {
    transport: &'static str,
}

impl Subscriber {
    pub fn new(transport: &'static str) -> Self {
        super::metrics::subscribers(transport, 1.0);
        Self { transport }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        super::metrics::subscribers(self.transport, -1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::{EventKind, SessionId};

    fn env(seq: u64, event: EventKind) -> EventEnvelope {
        EventEnvelope {
            seq,
            ts_ms: 7,
            session_id: SessionId::new(),
            conversation_id: Some(ConversationId::new()),
            task_id: None,
            sub_id: None,
            trace_id: None,
            span_id: None,
            event,
        }
    }

    #[test]
    fn kinds_map_to_the_seven_types() {
        let e = from_live(&env(3, EventKind::AssistantChunk { delta: "hi".into() })).unwrap();
        assert_eq!(e.event_type, "text_delta");
        assert_eq!(e.kind, EventName::AssistantChunk);
        assert_eq!(e.data, serde_json::json!({"delta": "hi"}));
        assert_eq!(e.seq, 3);
        assert_eq!(event_type(EventName::TaskFinished), "message_complete");
        assert_eq!(event_type(EventName::ToolCallFinished), "tool_call");
        assert_eq!(event_type(EventName::StepStarted), "status_update");
        assert_eq!(event_type(EventName::ApprovalResolved), "approval_resolved");
        assert_eq!(event_type(EventName::MessageUpdated), "message_status");
    }

    #[test]
    fn a_headers_record_shows_its_facts() {
        let r = record_for(
            StoragePolicy::HeadersOnly,
            &env(
                9,
                EventKind::AssistantMessage {
                    text: "secret".into(),
                },
            ),
        )
        .unwrap();
        let e = from_record(&r);
        assert_eq!(e.event_type, "status_update");
        assert!(!e.data.to_string().contains("secret"));
        assert_eq!(e.data["chars"], 6);
    }
}
