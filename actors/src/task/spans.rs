//! The spans of a task, named after the OpenTelemetry GenAI semantic conventions (v1.41):
//! one trace per task, whatever actors and tasks the work crosses.
//!
//! ```text
//! invoke_agent troupe            INTERNAL  root; links to the caller's span
//! ├─ troupe.scheduler.wait                 queued for a scheduler slot
//! └─ troupe.turn                           the steps, once the slot is held
//!    ├─ chat {model}             CLIENT    one per model call (step)
//!    │  └─ POST                  CLIENT    each HTTP attempt (OpenAI-compatible providers)
//!    └─ execute_tool {tool}      INTERNAL  one per tool call; MCP attributes for MCP tools,
//!       │                                  whose `traceparent` it is
//!       ├─ troupe.approval.wait            a human's answer (shell, apply_patch)
//!       ├─ mcp_server_request              elicitation or sampling the call caused
//!       └─ troupe.dispatch       INTERNAL  a `dispatch_agent` call's dispatch (a `/hub` or
//!                                          routed dispatch is a child of `troupe.turn`)
//! ```
//!
//! An in-process agent's task, run for a dispatch, is a trace of its own whose root links to
//! that `troupe.dispatch` span.
//!
//! Every span carries `conversation_id` and `task_id`. Span names and kinds are set through
//! tracing-opentelemetry's `otel.name` / `otel.kind`; a failure sets `otel.status_code` and
//! `error.type` (an [`AgentError`] kind). Prompts, completions, tool arguments and results
//! are recorded only when content capture is on (`record_content`).

use opentelemetry::trace::TraceContextExt;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use troupe_proto::{
    AgentError, ConversationId, HistoryItem, Role, SessionId, TaskId, ToolCall, ToolOutput, Usage,
};

/// `gen_ai.agent.name`: the agent a task invokes.
pub const AGENT_NAME: &str = "troupe";

/// `gen_ai.tool.type` of the built-in tools: run by troupe itself.
pub const TOOL_TYPE_FUNCTION: &str = "function";
/// `gen_ai.tool.type` of MCP tools: run by an external server.
pub const TOOL_TYPE_EXTENSION: &str = "extension";

/// `gen_ai.provider.name` of a model client's provider: the wire format the OpenAI-compatible
/// clients speak is OpenAI's; others name themselves.
pub fn provider_name(provider: &str) -> &str {
    if provider.starts_with("openai") {
        "openai"
    } else {
        provider
    }
}

/// What a task's root span needs to know.
#[derive(Debug, Clone, Copy)]
pub struct TaskSpanInfo<'a> {
    pub session_id: SessionId,
    pub conversation_id: ConversationId,
    pub task_id: TaskId,
    /// Index of the turn in its conversation.
    pub turn: u32,
    /// `message` or `compact`.
    pub kind: &'static str,
    pub provider: &'a str,
    pub model: &'a str,
}

/// The root span of a task (`invoke_agent`, INTERNAL). A new trace: `caller` (the span the
/// message came with, if any) is linked, not parent, so each task is one tree of its own.
pub fn invoke_agent(info: TaskSpanInfo<'_>, caller: &Span) -> Span {
    let span = tracing::info_span!(
        parent: None,
        "invoke_agent",
        otel.name = %format!("invoke_agent {AGENT_NAME}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        "gen_ai.operation.name" = "invoke_agent",
        "gen_ai.agent.name" = AGENT_NAME,
        "gen_ai.conversation.id" = %info.conversation_id,
        "gen_ai.provider.name" = provider_name(info.provider),
        "gen_ai.request.model" = info.model,
        "gen_ai.usage.input_tokens" = Empty,
        "gen_ai.usage.output_tokens" = Empty,
        "gen_ai.usage.cache_read.input_tokens" = Empty,
        "gen_ai.usage.reasoning.output_tokens" = Empty,
        "error.type" = Empty,
        conversation_id = %info.conversation_id,
        task_id = %info.task_id,
        "troupe.session.id" = %info.session_id,
        "troupe.task.kind" = info.kind,
        "troupe.turn" = info.turn,
        "troupe.task.status" = Empty,
    );
    if !caller.is_none() {
        span.follows_from(caller);
    }
    span
}

/// Waiting for a scheduler slot (S3).
pub fn scheduler_wait(conversation_id: ConversationId, task_id: TaskId) -> Span {
    tracing::info_span!(
        "troupe.scheduler.wait",
        otel.status_code = Empty,
        "error.type" = Empty,
        conversation_id = %conversation_id,
        task_id = %task_id,
    )
}

/// The turn: its steps, once the task holds a slot.
pub fn turn(conversation_id: ConversationId, task_id: TaskId, turn: u32) -> Span {
    tracing::info_span!(
        "troupe.turn",
        conversation_id = %conversation_id,
        task_id = %task_id,
        "troupe.turn" = turn,
        "troupe.turn.steps" = Empty,
        "troupe.turn.tool_calls" = Empty,
    )
}

/// One model call (`chat {model}`, CLIENT). Model clients run inside it; the response's
/// attributes are recorded by [`record_response`].
pub fn chat(
    conversation_id: ConversationId,
    task_id: TaskId,
    provider: &str,
    model: &str,
    step: u32,
    estimated_tokens: u64,
) -> Span {
    tracing::info_span!(
        "chat",
        otel.name = %format!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        "gen_ai.operation.name" = "chat",
        "gen_ai.provider.name" = provider_name(provider),
        "gen_ai.request.model" = model,
        "gen_ai.response.model" = Empty,
        "gen_ai.response.id" = Empty,
        "gen_ai.conversation.id" = %conversation_id,
        "gen_ai.usage.input_tokens" = Empty,
        "gen_ai.usage.output_tokens" = Empty,
        "gen_ai.usage.cache_read.input_tokens" = Empty,
        "gen_ai.usage.reasoning.output_tokens" = Empty,
        "gen_ai.system_instructions" = Empty,
        "gen_ai.input.messages" = Empty,
        "gen_ai.output.messages" = Empty,
        "error.type" = Empty,
        conversation_id = %conversation_id,
        task_id = %task_id,
        "troupe.step" = step,
        "troupe.prompt.estimated_tokens" = estimated_tokens,
    )
}

/// One tool call (`execute_tool {tool}`, INTERNAL). An MCP call adds the MCP client
/// attributes to it rather than a span of its own (the MCP conventions' advice when a GenAI
/// span already covers the call), and sends its context as `traceparent`.
pub fn execute_tool(conversation_id: ConversationId, task_id: TaskId, call: &ToolCall) -> Span {
    tracing::info_span!(
        "execute_tool",
        otel.name = %format!("execute_tool {}", call.name),
        otel.kind = "internal",
        otel.status_code = Empty,
        "gen_ai.operation.name" = "execute_tool",
        "gen_ai.tool.name" = %call.name,
        "gen_ai.tool.call.id" = %call.call_id,
        "gen_ai.tool.type" = Empty,
        "gen_ai.tool.call.arguments" = Empty,
        "gen_ai.tool.call.result" = Empty,
        "gen_ai.conversation.id" = %conversation_id,
        "error.type" = Empty,
        "mcp.method.name" = Empty,
        "mcp.session.id" = Empty,
        "mcp.protocol.version" = Empty,
        "jsonrpc.request.id" = Empty,
        "network.transport" = Empty,
        "troupe.mcp.server" = Empty,
        conversation_id = %conversation_id,
        task_id = %task_id,
    )
}

/// Waiting for a human's answer to an approval request.
pub fn approval_wait(conversation_id: ConversationId, task_id: TaskId) -> Span {
    tracing::info_span!(
        "troupe.approval.wait",
        otel.status_code = Empty,
        "error.type" = Empty,
        "troupe.approval.outcome" = Empty,
        conversation_id = %conversation_id,
        task_id = %task_id,
    )
}

/// Marks a span failed: `error.type` is the error's kind (low cardinality), the status
/// `ERROR`. The message is left out: it may quote content.
pub fn record_error(span: &Span, error: &AgentError) {
    record_error_type(span, error.kind().as_str());
}

/// Marks a span failed with this `error.type`.
pub fn record_error_type(span: &Span, error_type: &str) {
    span.record("error.type", error_type);
    span.record("otel.status_code", "error");
}

/// Token usage, in the GenAI attributes.
pub fn record_usage(span: &Span, usage: &Usage) {
    span.record("gen_ai.usage.input_tokens", usage.input_tokens);
    span.record("gen_ai.usage.output_tokens", usage.output_tokens);
    span.record("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens);
    span.record(
        "gen_ai.usage.reasoning.output_tokens",
        usage.reasoning_tokens,
    );
}

/// What a model call answered, on its `chat` span.
pub fn record_response(span: &Span, response: &crate::ports::ModelResponse) {
    if let Some(model) = &response.response_model {
        span.record("gen_ai.response.model", model.as_str());
    }
    if let Some(id) = &response.response_id {
        span.record("gen_ai.response.id", id.as_str());
    }
    // A string array, which tracing fields cannot express: set on the OpenTelemetry span.
    span.set_attribute(
        "gen_ai.response.finish_reasons",
        opentelemetry::Value::Array(
            vec![opentelemetry::StringValue::from(finish_reason(response))].into(),
        ),
    );
    if let Some(usage) = &response.usage {
        record_usage(span, usage);
    }
}

/// Why the model stopped, in the conventions' terms.
fn finish_reason(response: &crate::ports::ModelResponse) -> &'static str {
    if response.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_call"
    }
}

/// W3C trace and span ids of a span, when an OpenTelemetry layer gave it a valid context.
pub fn span_ids(span: &Span) -> Option<(String, String)> {
    let cx = span.context();
    let otel = cx.span();
    let sc = otel.span_context();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

/// The W3C `traceparent` naming `span` as the parent, when it has a valid context.
pub fn traceparent(span: &Span) -> Option<String> {
    let cx = span.context();
    let otel = cx.span();
    let sc = otel.span_context();
    sc.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}

// ---------------------------------------------------------------------------------------
// Content capture (opt-in): the GenAI JSON message formats, serialised as strings since
// span attributes cannot hold structures.

/// `gen_ai.input.messages`: the prompt as the model receives it.
pub fn input_messages<'a>(items: impl Iterator<Item = &'a HistoryItem>) -> String {
    let messages: Vec<serde_json::Value> = items.map(message_of).collect();
    serde_json::Value::Array(messages).to_string()
}

/// `gen_ai.system_instructions`.
pub fn system_instructions(instructions: &str) -> String {
    serde_json::json!([{ "type": "text", "content": instructions }]).to_string()
}

/// `gen_ai.output.messages`: the model's one answer.
pub fn output_messages(response: &crate::ports::ModelResponse) -> String {
    let mut parts = Vec::new();
    if !response.text.is_empty() {
        parts.push(serde_json::json!({ "type": "text", "content": response.text }));
    }
    parts.extend(response.tool_calls.iter().map(tool_call_part));
    serde_json::json!([{
        "role": "assistant",
        "parts": parts,
        "finish_reason": finish_reason(response),
    }])
    .to_string()
}

/// `gen_ai.tool.call.result`: what the tool answered.
pub fn tool_result(output: &ToolOutput) -> String {
    output.output.clone()
}

fn tool_call_part(call: &ToolCall) -> serde_json::Value {
    serde_json::json!({
        "type": "tool_call",
        "id": call.call_id,
        "name": call.name,
        "arguments": call.arguments.0,
    })
}

fn message_of(item: &HistoryItem) -> serde_json::Value {
    let text = |role: &str, content: &str| serde_json::json!({ "role": role, "parts": [{ "type": "text", "content": content }] });
    match item {
        HistoryItem::Message { role, text: t } => text(
            match role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
            },
            t,
        ),
        // A summary stands for older turns; the model reads it as context.
        HistoryItem::Summary { text: t, .. } => text("user", t),
        HistoryItem::ToolCall(call) => {
            serde_json::json!({ "role": "assistant", "parts": [tool_call_part(call)] })
        }
        HistoryItem::ToolOutput(out) => serde_json::json!({
            "role": "tool",
            "parts": [{ "type": "tool_call_response", "id": out.call_id, "response": out.output }],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::ModelResponse;
    use troupe_proto::Json;

    #[test]
    fn providers_are_named_as_the_conventions_name_them() {
        assert_eq!(provider_name("openai-responses"), "openai");
        assert_eq!(provider_name("openai-chat"), "openai");
        assert_eq!(provider_name("scripted"), "scripted");
    }

    #[test]
    fn messages_follow_the_genai_json_formats() {
        let call = ToolCall {
            call_id: "c1".into(),
            name: "srv__echo".into(),
            arguments: Json(serde_json::json!({"message": "hi"})),
        };
        let items = [
            HistoryItem::user("say hi"),
            HistoryItem::ToolCall(call.clone()),
            HistoryItem::ToolOutput(ToolOutput {
                call_id: "c1".into(),
                output: "Echo: hi".into(),
                is_error: false,
            }),
        ];
        let input: serde_json::Value = serde_json::from_str(&input_messages(items.iter())).unwrap();
        assert_eq!(
            input,
            serde_json::json!([
                {"role": "user", "parts": [{"type": "text", "content": "say hi"}]},
                {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "srv__echo", "arguments": {"message": "hi"}}]},
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "Echo: hi"}]},
            ])
        );
        let response = ModelResponse {
            text: "calling".into(),
            tool_calls: vec![call],
            ..ModelResponse::default()
        };
        let output: serde_json::Value = serde_json::from_str(&output_messages(&response)).unwrap();
        assert_eq!(output[0]["finish_reason"], "tool_call");
        assert_eq!(output[0]["parts"][0]["content"], "calling");
        assert_eq!(output[0]["parts"][1]["name"], "srv__echo");
        let done = ModelResponse {
            text: "bye".into(),
            ..ModelResponse::default()
        };
        let output: serde_json::Value = serde_json::from_str(&output_messages(&done)).unwrap();
        assert_eq!(output[0]["finish_reason"], "stop");
    }

    #[test]
    fn without_an_opentelemetry_layer_there_is_no_traceparent() {
        let span = tracing::info_span!("x");
        assert_eq!(traceparent(&span), None);
        assert_eq!(span_ids(&span), None);
    }
}
