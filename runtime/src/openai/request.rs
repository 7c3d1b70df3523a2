//! Request bodies for both OpenAI APIs, built from a [`ModelRequest`] without copying the
//! history more than once (into the JSON itself).
//!
//! The history is first read into [`ApiItem`]s that the APIs accept: a tool output whose call
//! was trimmed away becomes a user message (both APIs reject an output without its call),
//! and a call left without an output gets a placeholder one (both reject that too).

use super::dialect;
use crate::config::ToolMode;
use serde::Serialize;
use serde_json::{Map, Value, json};
use std::collections::HashSet;
use troupe_actors::ports::ModelRequest;
use troupe_proto::{HistoryItem, Role, ToolCall};

/// Prefix of a `Summary` item, sent as a user message.
pub const SUMMARY_PREFIX: &str = "Summary of the earlier conversation:\n";
/// Output given to a call that has none in the history.
pub const MISSING_OUTPUT: &str = "(no output was recorded for this call)";

/// One history item as the model APIs see it.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiItem<'a> {
    Message { role: Role, text: String },
    Call(&'a ToolCall),
    Output { call_id: &'a str, output: &'a str },
}

/// Reads the prompt into API-acceptable entries (see the module doc). `items` walks the
/// prompt; it is called twice.
pub fn entries<'a, I>(items: impl Fn() -> I) -> Vec<ApiItem<'a>>
where
    I: Iterator<Item = &'a HistoryItem>,
{
    let answered: HashSet<&str> = items()
        .filter_map(|i| match i {
            HistoryItem::ToolOutput(o) => Some(o.call_id.as_str()),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    let mut called: HashSet<&str> = HashSet::new();
    let mut unanswered: Vec<&str> = Vec::new();
    for item in items() {
        if !matches!(item, HistoryItem::ToolCall(_) | HistoryItem::ToolOutput(_)) {
            flush_unanswered(&mut out, &mut unanswered);
        }
        match item {
            HistoryItem::Message { role, text } => out.push(ApiItem::Message {
                role: *role,
                text: text.clone(),
            }),
            HistoryItem::Summary { text, .. } => out.push(ApiItem::Message {
                role: Role::User,
                text: format!("{SUMMARY_PREFIX}{text}"),
            }),
            HistoryItem::ToolCall(call) => {
                called.insert(&call.call_id);
                if !answered.contains(call.call_id.as_str()) {
                    unanswered.push(&call.call_id);
                }
                out.push(ApiItem::Call(call));
            }
            HistoryItem::ToolOutput(o) if called.contains(o.call_id.as_str()) => {
                out.push(ApiItem::Output {
                    call_id: &o.call_id,
                    output: &o.output,
                });
            }
            HistoryItem::ToolOutput(o) => out.push(ApiItem::Message {
                role: Role::User,
                text: format!("Output of an earlier tool call:\n{}", o.output),
            }),
        }
    }
    flush_unanswered(&mut out, &mut unanswered);
    out
}

fn flush_unanswered<'a>(out: &mut Vec<ApiItem<'a>>, unanswered: &mut Vec<&'a str>) {
    for call_id in unanswered.drain(..) {
        out.push(ApiItem::Output {
            call_id,
            output: MISSING_OUTPUT,
        });
    }
}

/// In the text dialect, calls and outputs become plain messages, and neighbouring messages of
/// one role are joined: many local chat templates insist on alternating roles.
pub fn text_dialect_messages(entries: Vec<ApiItem<'_>>) -> Vec<(Role, String)> {
    let mut out: Vec<(Role, String)> = Vec::new();
    for entry in entries {
        let (role, text) = match entry {
            ApiItem::Message { role, text } => (role, text),
            ApiItem::Call(call) => (
                Role::Assistant,
                dialect::render_action(&call.name, &call.arguments.0),
            ),
            ApiItem::Output { output, .. } => (Role::User, dialect::render_observation(output)),
        };
        match out.last_mut() {
            Some((last, joined)) if *last == role => {
                joined.push('\n');
                joined.push_str(&text);
            }
            _ => out.push((role, text)),
        }
    }
    out
}

const fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

/// The instructions as sent: with the tool block in the text dialect.
fn instructions(request: &ModelRequest<'_>, mode: ToolMode) -> String {
    match mode {
        ToolMode::Native => request.instructions.to_owned(),
        ToolMode::Text => dialect::instructions(request.instructions, request.tools),
    }
}

fn insert_cache_key(body: &mut Map<String, Value>, key: &str) {
    if !key.is_empty() {
        body.insert("prompt_cache_key".into(), json!(key));
    }
}

/// The body of `POST /responses`, serialized straight from the request it borrows (no
/// intermediate `serde_json::Value`: the history and the tools' schemas are not copied). The
/// keys come out in this order: `model`, `instructions`, `input`, the tool keys, `stream`,
/// `store`, `prompt_cache_key`.
#[derive(Debug, Serialize)]
pub struct ResponsesBody<'a> {
    model: &'a str,
    instructions: String,
    input: Vec<ResponsesInput<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ResponsesTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    stream: bool,
    store: bool,
    #[serde(skip_serializing_if = "str::is_empty")]
    prompt_cache_key: &'a str,
}

/// One entry of a Responses `input`.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ResponsesInput<'a> {
    Message {
        role: &'static str,
        content: [ResponsesContent; 1],
    },
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        arguments: String,
    },
    FunctionCallOutput {
        call_id: &'a str,
        output: &'a str,
    },
}

/// A message's text: `input_text`, or `output_text` for the assistant's.
#[derive(Debug, Serialize)]
struct ResponsesContent {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
}

/// A function tool as the Responses API takes it.
#[derive(Debug, Serialize)]
struct ResponsesTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// `POST /responses`
pub fn responses_body<'a>(
    request: &ModelRequest<'a>,
    model: &'a str,
    mode: ToolMode,
) -> ResponsesBody<'a> {
    let entries = entries(|| request.prompt.iter());
    let message = |role: Role, text: String| {
        let kind = if role == Role::Assistant {
            "output_text"
        } else {
            "input_text"
        };
        ResponsesInput::Message {
            role: role_name(role),
            content: [ResponsesContent { kind, text }],
        }
    };
    let input: Vec<ResponsesInput<'a>> = match mode {
        ToolMode::Native => entries
            .into_iter()
            .map(|e| match e {
                ApiItem::Message { role, text } => message(role, text),
                ApiItem::Call(c) => ResponsesInput::FunctionCall {
                    call_id: &c.call_id,
                    name: &c.name,
                    arguments: c.arguments.0.to_string(),
                },
                ApiItem::Output { call_id, output } => {
                    ResponsesInput::FunctionCallOutput { call_id, output }
                }
            })
            .collect(),
        ToolMode::Text => text_dialect_messages(entries)
            .into_iter()
            .map(|(role, text)| message(role, text))
            .collect(),
    };
    let native_tools = mode == ToolMode::Native && !request.tools.is_empty();
    let tools = if native_tools {
        request
            .tools
            .iter()
            .map(|t| ResponsesTool {
                kind: "function",
                name: &t.name,
                description: &t.description,
                parameters: &t.parameters.0,
            })
            .collect()
    } else {
        Vec::new()
    };
    ResponsesBody {
        model,
        instructions: instructions(request, mode),
        input,
        tools,
        tool_choice: native_tools.then_some("auto"),
        parallel_tool_calls: native_tools.then_some(true),
        stream: true,
        store: false,
        prompt_cache_key: request.prompt_cache_key,
    }
}

/// `POST /chat/completions`
pub fn chat_body(request: &ModelRequest<'_>, model: &str, mode: ToolMode) -> Value {
    let entries = entries(|| request.prompt.iter());
    let mut messages = Vec::with_capacity(entries.len() + 1);
    let instructions = instructions(request, mode);
    if !instructions.is_empty() {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    match mode {
        ToolMode::Native => native_chat_messages(entries, &mut messages),
        ToolMode::Text => messages.extend(
            text_dialect_messages(entries)
                .into_iter()
                .map(|(role, text)| json!({"role": role_name(role), "content": text})),
        ),
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages));
    if mode == ToolMode::Native && !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {"name": t.name,
                            "description": t.description, "parameters": t.parameters.0}})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    insert_cache_key(&mut body, request.prompt_cache_key);
    Value::Object(body)
}

/// Chat messages with native tool calls: consecutive calls form one assistant message (whose
/// content is the assistant text right before them, if any), outputs are `tool` messages.
fn native_chat_messages(entries: Vec<ApiItem<'_>>, messages: &mut Vec<Value>) {
    // Whether the last message pushed may still take tool calls: the assistant message of
    // the previous entry (plain text or calls).
    let mut open_assistant = false;
    for entry in entries {
        match entry {
            ApiItem::Message { role, text } => {
                messages.push(json!({"role": role_name(role), "content": text}));
                open_assistant = role == Role::Assistant;
            }
            ApiItem::Call(c) => {
                let call = json!({"id": c.call_id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments.0.to_string()}});
                let last = messages.last_mut().filter(|_| open_assistant);
                match last.and_then(Value::as_object_mut) {
                    Some(last) => match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => {
                            last.insert("tool_calls".into(), json!([call]));
                        }
                    },
                    None => messages
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
                open_assistant = true;
            }
            ApiItem::Output { call_id, output } => {
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
                open_assistant = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::{Json, ToolOutput};

    fn call(id: &str, name: &str) -> HistoryItem {
        HistoryItem::ToolCall(ToolCall {
            call_id: id.into(),
            name: name.into(),
            arguments: Json(json!({"n": 1})),
        })
    }

    fn output(id: &str, text: &str) -> HistoryItem {
        HistoryItem::ToolOutput(ToolOutput {
            call_id: id.into(),
            output: text.into(),
            is_error: false,
        })
    }

    #[test]
    fn orphans_are_made_acceptable() {
        let items = [
            output("gone", "old result"),
            HistoryItem::user("hi"),
            call("a", "x"),
            HistoryItem::user("next"),
        ];
        let e = entries(|| items.iter());
        assert_eq!(
            e[0],
            ApiItem::Message {
                role: Role::User,
                text: "Output of an earlier tool call:\nold result".into()
            }
        );
        assert!(matches!(e[2], ApiItem::Call(_)));
        assert_eq!(
            e[3],
            ApiItem::Output {
                call_id: "a",
                output: MISSING_OUTPUT
            }
        );
        assert!(matches!(e[4], ApiItem::Message { .. }));
    }

    #[test]
    fn chat_merges_consecutive_calls_with_the_preceding_text() {
        let items = [
            HistoryItem::user("do it"),
            HistoryItem::assistant("on it"),
            call("a", "x"),
            call("b", "y"),
            output("a", "1"),
            output("b", "2"),
            call("c", "z"),
            output("c", "3"),
        ];
        let mut messages = Vec::new();
        native_chat_messages(entries(|| items.iter()), &mut messages);
        assert_eq!(
            Value::Array(messages),
            json!([
                {"role": "user", "content": "do it"},
                {"role": "assistant", "content": "on it", "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "x", "arguments": "{\"n\":1}"}},
                    {"id": "b", "type": "function", "function": {"name": "y", "arguments": "{\"n\":1}"}},
                ]},
                {"role": "tool", "tool_call_id": "a", "content": "1"},
                {"role": "tool", "tool_call_id": "b", "content": "2"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "z", "arguments": "{\"n\":1}"}},
                ]},
                {"role": "tool", "tool_call_id": "c", "content": "3"},
            ])
        );
    }

    /// A Responses request with every kind of input entry, the tools and a cache key.
    fn responses_bytes(mode: ToolMode, cache_key: &str) -> String {
        use std::sync::Arc;
        use troupe_actors::history::{HistoryLimits, HistoryStore, LocalSummarizer};
        let history = HistoryStore::new(
            HistoryLimits::default(),
            Arc::new(LocalSummarizer::default()),
        )
        .snapshot();
        let items = [
            HistoryItem::user("do it"),
            HistoryItem::assistant("on it"),
            call("a", "x"),
            output("a", "1"),
        ];
        let tools = [troupe_proto::ToolSpec {
            name: "x".into(),
            description: "does x".into(),
            parameters: Json(json!({"type": "object", "properties": {"n": {"type": "integer"}}})),
        }];
        let request = ModelRequest {
            conversation_id: troupe_proto::ConversationId::new(),
            task_id: troupe_proto::TaskId::new(),
            instructions: "be brief",
            prompt: history.view(None, &[], &items),
            tools: &tools,
            prompt_cache_key: cache_key,
        };
        String::from_utf8(serde_json::to_vec(&responses_body(&request, "m", mode)).unwrap())
            .unwrap()
    }

    #[test]
    fn responses_body_has_the_documented_keys_in_order() {
        let expected = json!({
            "model": "m",
            "instructions": "be brief",
            "input": [
                {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": "do it"}]},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "on it"}]},
                {"type": "function_call", "call_id": "a", "name": "x", "arguments": "{\"n\":1}"},
                {"type": "function_call_output", "call_id": "a", "output": "1"},
            ],
            "tools": [{"type": "function", "name": "x", "description": "does x",
                       "parameters": {"type": "object",
                                      "properties": {"n": {"type": "integer"}}}}],
            "tool_choice": "auto",
            "parallel_tool_calls": true,
            "stream": true,
            "store": false,
            "prompt_cache_key": "k",
        });
        // Byte for byte: the same keys in the same order as the object above.
        assert_eq!(responses_bytes(ToolMode::Native, "k"), expected.to_string());
        // The text dialect sends no tool keys; no cache key, no `prompt_cache_key`.
        let text: Value = serde_json::from_str(&responses_bytes(ToolMode::Text, "")).unwrap();
        let keys: Vec<&str> = text
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["model", "instructions", "input", "stream", "store"]);
        assert_eq!(text["input"][0]["content"][0]["type"], "input_text");
    }

    #[test]
    fn text_dialect_joins_roles() {
        let items = [
            HistoryItem::user("add"),
            HistoryItem::assistant("sure"),
            call("a", "add"),
            output("a", "3"),
            HistoryItem::user("thanks"),
        ];
        let m = text_dialect_messages(entries(|| items.iter()));
        assert_eq!(
            m,
            vec![
                (Role::User, "add".to_owned()),
                (
                    Role::Assistant,
                    "sure\n<action tool=\"add\">{\"n\":1}</action>".to_owned()
                ),
                (
                    Role::User,
                    "<observation>3</observation>\nthanks".to_owned()
                ),
            ]
        );
    }
}
