//! An event before the session's Rollout numbers and times it: [`EventDraft`], with the
//! ids producers stamp on it. Plain data with no actor in it, so that both the Rollout (which
//! stamps drafts) and the event sink (which sends them to the Rollout) depend on it, and not
//! on each other.

use opentelemetry::trace::TraceContextExt;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use troupe_proto::{ConversationId, EventKind, TaskId};

/// An event before the rollout numbers it.
#[derive(Debug, Clone)]
pub struct EventDraft {
    pub conversation_id: Option<ConversationId>,
    pub task_id: Option<TaskId>,
    pub sub_id: Option<String>,
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    pub event: EventKind,
    /// For an event whose content carries older content (a history summary): when the oldest
    /// of it was written (unix ms). Under a `Ttl` policy its record is due no later than that
    /// content is, so a summary never keeps an excerpt on disk past the excerpt's own expiry.
    pub content_since_ms: Option<u64>,
}

impl EventDraft {
    /// A session-level event.
    pub fn session(event: EventKind) -> Self {
        Self {
            conversation_id: None,
            task_id: None,
            sub_id: None,
            trace_id: None,
            span_id: None,
            event,
            content_since_ms: None,
        }
    }

    /// An event of a conversation, outside any task.
    pub fn conversation(conversation_id: ConversationId, event: EventKind) -> Self {
        Self {
            conversation_id: Some(conversation_id),
            ..Self::session(event)
        }
    }

    /// An event of a task.
    pub fn task(conversation_id: ConversationId, task_id: TaskId, event: EventKind) -> Self {
        Self {
            conversation_id: Some(conversation_id),
            task_id: Some(task_id),
            sub_id: Some(sub_id(conversation_id, task_id)),
            ..Self::session(event)
        }
    }

    /// Says the event carries content written as early as `since_ms` (see
    /// [`EventDraft::content_since_ms`]).
    pub fn carrying_content_since(mut self, since_ms: Option<u64>) -> Self {
        self.content_since_ms = since_ms;
        self
    }

    /// Stamps the ids of the current tracing span (if it has an OpenTelemetry context).
    pub fn traced(mut self) -> Self {
        let (trace_id, span_id) = current_trace_ids();
        self.trace_id = trace_id;
        self.span_id = span_id;
        self
    }
}

/// The legacy correlation id older consumers read: `<conversation>/<task>`.
pub fn sub_id(conversation_id: ConversationId, task_id: TaskId) -> String {
    format!("{conversation_id}/{task_id}")
}

/// W3C trace and span ids of the current span, when an OpenTelemetry layer is installed.
pub fn current_trace_ids() -> (Option<String>, Option<String>) {
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    if sc.is_valid() {
        (
            Some(sc.trace_id().to_string()),
            Some(sc.span_id().to_string()),
        )
    } else {
        (None, None)
    }
}
