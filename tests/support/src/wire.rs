//! Renders a [`StreamScript`] as the SSE events of each OpenAI API, exactly as the captured
//! fixtures show them. Pure: the server only sends what these functions return.

use crate::reply::{Fault, StreamScript, Usage};
use serde_json::{Value, json};

/// What a rendered stream echoes from its request and the server's counters.
#[derive(Debug, Clone, PartialEq)]
pub struct WireContext {
    /// Number of the request (from 1): response ids are `chatcmpl-<n>` / `resp_<n>`.
    pub request: u64,
    /// Number of the first tool call of this reply: calls are `call_<k>` / `fc_<k>`, unique
    /// across the server's life.
    pub first_call: u64,
    pub created: u64,
    pub model: String,
    /// Chat: whether the request asked for the usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Responses: echoed in the response object.
    pub tools: Value,
    pub tool_choice: Value,
    pub parallel_tool_calls: Value,
}

impl WireContext {
    /// The context for request number `request` with this JSON body.
    pub fn from_request(request: u64, first_call: u64, created: u64, body: &Value) -> Self {
        Self {
            request,
            first_call,
            created,
            model: body
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or("test-model")
                .to_owned(),
            include_usage: body
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            tools: body.get("tools").cloned().unwrap_or_else(|| json!([])),
            tool_choice: body
                .get("tool_choice")
                .cloned()
                .unwrap_or_else(|| json!("auto")),
            parallel_tool_calls: body
                .get("parallel_tool_calls")
                .cloned()
                .unwrap_or(json!(true)),
        }
    }

    fn call_ids(&self, i: usize, explicit: Option<&str>) -> (String, String) {
        let k = self.first_call + i as u64;
        let call_id = explicit.map_or_else(|| format!("call_{k}"), str::to_owned);
        (call_id, format!("fc_{k}"))
    }
}

/// The SSE frames of one response, and whether the connection then stays open silently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub frames: Vec<String>,
    pub stall: bool,
}

/// Chat Completions: `data: {chunk}` frames, then `data: [DONE]`.
pub(crate) fn chat(script: &StreamScript, ctx: &WireContext) -> Rendered {
    let chunk = |delta: Value, finish: Value| {
        data_frame(&json!({
            "id": format!("chatcmpl-{}", ctx.request),
            "object": "chat.completion.chunk",
            "created": ctx.created,
            "model": ctx.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }))
    };
    let mut frames = Vec::new();
    let mut role_sent = false;
    if !script.text.is_empty() || script.calls.is_empty() {
        frames.push(chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        ));
        role_sent = true;
    }
    for text in &script.text {
        frames.push(chunk(json!({"content": text}), Value::Null));
    }
    for (i, call) in script.calls.iter().enumerate() {
        let (call_id, _) = ctx.call_ids(i, call.call_id.as_deref());
        let header = json!({
            "index": i,
            "id": call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        });
        let delta = if role_sent {
            json!({"tool_calls": [header]})
        } else {
            role_sent = true;
            json!({"role": "assistant", "content": null, "tool_calls": [header]})
        };
        frames.push(chunk(delta, Value::Null));
        for fragment in &call.fragments {
            frames.push(chunk(
                json!({"tool_calls": [{"index": i, "function": {"arguments": fragment}}]}),
                Value::Null,
            ));
        }
    }
    let finish = if script.calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    frames.push(chunk(json!({}), json!(finish)));
    if ctx.include_usage && !script.no_usage {
        frames.push(data_frame(&json!({
            "id": format!("chatcmpl-{}", ctx.request),
            "object": "chat.completion.chunk",
            "created": ctx.created,
            "model": ctx.model,
            "choices": [],
            "usage": chat_usage(script.usage),
        })));
    }
    frames.push("data: [DONE]\n\n".to_owned());
    apply_fault(
        frames,
        script.fault,
        "data: {\"id\": \"chatcmpl-broken\", \"choices\": [\n\n",
    )
}

/// Responses: `event: T` + `data: {"type": T, "sequence_number": n, ...}` frames, ending with
/// `response.completed`; no `[DONE]`.
pub(crate) fn responses(script: &StreamScript, ctx: &WireContext) -> Rendered {
    let mut out = ResponsesFrames::default();
    let response = |status: &str, output: Vec<Value>, usage: Option<Usage>| {
        let mut r = json!({
            "id": format!("resp_{}", ctx.request),
            "object": "response",
            "created_at": ctx.created,
            "status": status,
            "model": ctx.model,
            "output": output,
            "parallel_tool_calls": ctx.parallel_tool_calls,
            "tool_choice": ctx.tool_choice,
            "tools": ctx.tools,
        });
        if let (Some(u), Some(obj)) = (usage, r.as_object_mut()) {
            obj.insert("usage".into(), responses_usage(u));
        }
        r
    };
    out.push(
        "response.created",
        json!({"response": response("in_progress", Vec::new(), None)}),
    );
    let mut done_items = Vec::new();
    if !script.text.is_empty() {
        let output_index = done_items.len();
        let item_id = format!("msg_{}", ctx.request);
        let text = script.text.concat();
        let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
        out.push(
            "response.output_item.added",
            json!({"output_index": output_index, "item": {
                "id": item_id, "type": "message", "status": "in_progress",
                "role": "assistant", "content": [],
            }}),
        );
        out.push(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": output_index, "content_index": 0,
                   "part": part("")}),
        );
        for delta in &script.text {
            out.push(
                "response.output_text.delta",
                json!({"item_id": item_id, "output_index": output_index, "content_index": 0,
                       "delta": delta}),
            );
        }
        out.push(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": output_index, "content_index": 0,
                   "text": text}),
        );
        out.push(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": output_index, "content_index": 0,
                   "part": part(&text)}),
        );
        let item = json!({
            "id": item_id, "type": "message", "status": "completed", "role": "assistant",
            "content": [part(&text)],
        });
        out.push(
            "response.output_item.done",
            json!({"output_index": output_index, "item": item}),
        );
        done_items.push(item);
    }
    for (i, call) in script.calls.iter().enumerate() {
        let output_index = done_items.len();
        let (call_id, item_id) = ctx.call_ids(i, call.call_id.as_deref());
        let arguments = call.arguments();
        let item = |status: &str, arguments: &str| {
            json!({"id": item_id, "type": "function_call", "status": status,
                   "call_id": call_id, "name": call.name, "arguments": arguments})
        };
        out.push(
            "response.output_item.added",
            json!({"output_index": output_index, "item": item("in_progress", "")}),
        );
        for delta in &call.fragments {
            out.push(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": output_index, "delta": delta}),
            );
        }
        out.push(
            "response.function_call_arguments.done",
            json!({"item_id": item_id, "output_index": output_index, "arguments": arguments}),
        );
        let done = item("completed", &arguments);
        out.push(
            "response.output_item.done",
            json!({"output_index": output_index, "item": done}),
        );
        done_items.push(done);
    }
    out.push(
        "response.completed",
        json!({"response": response("completed", done_items, (!script.no_usage).then_some(script.usage))}),
    );
    apply_fault(
        out.frames,
        script.fault,
        "event: response.output_text.delta\ndata: {\"type\": \"response.output_text.delta\", \"delta\": \n\n",
    )
}

#[derive(Default)]
struct ResponsesFrames {
    frames: Vec<String>,
    sequence: u64,
}

impl ResponsesFrames {
    fn push(&mut self, kind: &str, mut fields: Value) {
        if let Some(obj) = fields.as_object_mut() {
            obj.insert("type".into(), json!(kind));
            obj.insert("sequence_number".into(), json!(self.sequence));
        }
        self.sequence += 1;
        self.frames
            .push(format!("event: {kind}\ndata: {fields}\n\n"));
    }
}

fn data_frame(value: &Value) -> String {
    format!("data: {value}\n\n")
}

fn chat_usage(u: Usage) -> Value {
    json!({
        "prompt_tokens": u.input,
        "completion_tokens": u.output,
        "total_tokens": u.input + u.output,
        "prompt_tokens_details": {"cached_tokens": u.cached},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning},
    })
}

fn responses_usage(u: Usage) -> Value {
    json!({
        "input_tokens": u.input,
        "output_tokens": u.output,
        "total_tokens": u.input + u.output,
        "input_tokens_details": {"cached_tokens": u.cached},
        "output_tokens_details": {"reasoning_tokens": u.reasoning},
    })
}

/// Both APIs end with exactly one terminal frame (`[DONE]` / `response.completed`).
fn apply_fault(mut frames: Vec<String>, fault: Option<Fault>, garbage: &str) -> Rendered {
    match fault {
        None => Rendered {
            frames,
            stall: false,
        },
        Some(Fault::Malformed) => {
            frames.insert(1.min(frames.len()), garbage.to_owned());
            Rendered {
                frames,
                stall: false,
            }
        }
        Some(Fault::StallAfter(n)) => {
            frames.truncate(n);
            Rendered {
                frames,
                stall: true,
            }
        }
        Some(Fault::EndEarly) => {
            frames.pop();
            Rendered {
                frames,
                stall: false,
            }
        }
    }
}

/// One parsed SSE event: its `event:` name (if any) and its `data:` text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Parses SSE text (as in the fixture files) into events; enough for `event:`/`data:` lines.
pub fn parse_sse(text: &str) -> Vec<SseEvent> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let mut event = None;
        let mut data: Vec<&str> = Vec::new();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                event = Some(v.trim_start().to_owned());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if event.is_some() || !data.is_empty() {
            out.push(SseEvent {
                event,
                data: data.join("\n"),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::{CallScript, Reply, ReplyBody};

    fn script(reply: Reply) -> StreamScript {
        match reply.body {
            ReplyBody::Stream(s) => s,
            ReplyBody::Error { .. } => panic!("not a stream"),
        }
    }

    // Copies of the captures in shared/fixtures (checked against the official SDKs).
    const CHAT_FIXTURE: &str = include_str!("../fixtures/chat_tool_wire.txt");
    const RESPONSES_FIXTURE: &str = include_str!("../fixtures/responses_tool_wire.txt");

    /// Events as (name, JSON data without timestamps) for comparison.
    fn comparable(text: &str) -> Vec<(Option<String>, Value)> {
        fn strip(v: &mut Value) {
            match v {
                Value::Object(map) => {
                    map.remove("created");
                    map.remove("created_at");
                    map.values_mut().for_each(strip);
                }
                Value::Array(items) => items.iter_mut().for_each(strip),
                _ => {}
            }
        }
        parse_sse(text)
            .into_iter()
            .map(|e| {
                let mut v = if e.data == "[DONE]" {
                    Value::String(e.data)
                } else {
                    serde_json::from_str(&e.data).unwrap()
                };
                strip(&mut v);
                (e.event, v)
            })
            .collect()
    }

    fn fixture_request() -> Value {
        json!({
            "model": "m",
            "tools": [{"type": "function", "name": "add", "parameters": {}}],
            "tool_choice": "auto",
            "parallel_tool_calls": true,
            "stream": true,
        })
    }

    fn add_call() -> Reply {
        Reply::tool_call("add", ["{\"a\":", "2,\"b\":3}"])
    }

    #[test]
    fn chat_tool_call_matches_the_fixture() {
        let ctx = WireContext::from_request(1, 1, 1_795_317_204, &fixture_request());
        let rendered = chat(&script(add_call()), &ctx);
        assert!(!rendered.stall);
        assert_eq!(
            comparable(&rendered.frames.concat()),
            comparable(CHAT_FIXTURE)
        );
    }

    #[test]
    fn responses_tool_call_matches_the_fixture() {
        let ctx = WireContext::from_request(1, 1, 1_795_317_204, &fixture_request());
        let rendered = responses(&script(add_call()), &ctx);
        assert_eq!(
            comparable(&rendered.frames.concat()),
            comparable(RESPONSES_FIXTURE)
        );
    }

    #[test]
    fn chat_text_with_usage_and_two_calls() {
        let mut body = fixture_request();
        body["stream_options"] = json!({"include_usage": true});
        let ctx = WireContext::from_request(3, 7, 0, &body);
        let reply = Reply::text(["Hi", " there"])
            .with_call(CallScript::new("a", ["{}"]))
            .with_call(CallScript::new("b", ["{\"x\"", ":1}"]).with_id("mine"))
            .with_usage(10, 4, 6, 2);
        let events = comparable(&chat(&script(reply), &ctx).frames.concat());
        let deltas: Vec<&Value> = events
            .iter()
            .filter_map(|(_, v)| v.pointer("/choices/0/delta"))
            .collect();
        assert_eq!(deltas[0], &json!({"role": "assistant", "content": ""}));
        assert_eq!(deltas[1], &json!({"content": "Hi"}));
        assert_eq!(deltas[3]["tool_calls"][0]["id"], "call_7");
        assert_eq!(deltas[5]["tool_calls"][0]["index"], 1);
        assert_eq!(deltas[5]["tool_calls"][0]["id"], "mine");
        let n = events.len();
        assert_eq!(events[n - 3].1["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(events[n - 2].1["choices"], json!([]));
        assert_eq!(
            events[n - 2].1["usage"]["prompt_tokens_details"]["cached_tokens"],
            6
        );
        assert_eq!(
            events[n - 2].1["usage"]["completion_tokens_details"]["reasoning_tokens"],
            2
        );
        assert_eq!(events[n - 1].1, json!("[DONE]"));
        assert!(
            events
                .iter()
                .all(|(_, v)| v == "[DONE]" || v["id"] == "chatcmpl-3")
        );
    }

    #[test]
    fn responses_text_sequence_and_ids() {
        let ctx = WireContext::from_request(2, 1, 0, &fixture_request());
        let reply = Reply::text(["a", "b"]).with_usage(9, 3, 4, 1);
        let events = comparable(&responses(&script(reply), &ctx).frames.concat());
        let kinds: Vec<&str> = events.iter().filter_map(|(k, _)| k.as_deref()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, (kind, v)) in events.iter().enumerate() {
            assert_eq!(v["type"].as_str(), kind.as_deref());
            assert_eq!(v["sequence_number"], i);
        }
        let completed = &events[8].1["response"];
        assert_eq!(completed["id"], "resp_2");
        assert_eq!(events[0].1["response"]["id"], "resp_2");
        assert_eq!(completed["output"][0]["content"][0]["text"], "ab");
        assert_eq!(
            completed["usage"]["input_tokens_details"]["cached_tokens"],
            4
        );
        assert_eq!(
            completed["usage"]["output_tokens_details"]["reasoning_tokens"],
            1
        );
    }

    #[test]
    fn faults_change_the_frames() {
        let ctx = WireContext::from_request(1, 1, 0, &fixture_request());
        let full = chat(&script(Reply::text(["x"])), &ctx).frames;
        let early = chat(&script(Reply::text(["x"]).end_early()), &ctx).frames;
        assert_eq!(early.len(), full.len() - 1);
        assert!(!early.concat().contains("[DONE]"));
        let stalled = responses(&script(Reply::text(["x"]).stall_after(2)), &ctx);
        assert_eq!(stalled.frames.len(), 2);
        assert!(stalled.stall);
        let bad = chat(&script(Reply::text(["x"]).malformed()), &ctx).frames;
        assert_eq!(bad.len(), full.len() + 1);
        assert!(serde_json::from_str::<Value>(&parse_sse(&bad[1])[0].data).is_err());
    }
}
