//! Responses stream parsing: typed events (`response.output_text.delta`,
//! `response.function_call_arguments.delta`, ...), function calls assembled per output item,
//! usage from `response.completed`, which ends the stream (there is no `[DONE]`).

use super::stream::{Collected, Held, RawCall, StreamParser, malformed, server_error};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use troupe_actors::ports::DeltaSink;
use troupe_proto::{AgentError, Usage};

/// Assembles one Responses stream.
#[derive(Debug, Default)]
pub struct ResponsesStream {
    id: Option<String>,
    model: Option<String>,
    text: String,
    /// Function calls by `output_index`, which orders them.
    calls: BTreeMap<u64, RawCall>,
    /// `item_id` → `output_index`, for events that carry only the item id.
    items: HashMap<String, u64>,
    usage: Option<Usage>,
    /// What `text`, `calls` and `items` hold.
    held: Held,
}

/// Events that carry nothing this parser keeps: the text comes from the deltas, the calls
/// from their own events and items.
const SKIPPED: [&str; 3] = [
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.done",
];

/// The fields of the most frequent events (a text delta, an event [`SKIPPED`]), read without
/// building a [`Value`]: every other field is skipped unread. `None` when the event is not an
/// object with those fields as strings (or absent); the event then goes through the whole
/// parse, as before, whose errors say what is wrong.
#[derive(serde::Deserialize)]
struct LightEvent<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    delta: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> LightEvent<'a> {
    fn parse(data: &'a str) -> Option<Self> {
        // A struct also reads from an array: only an object is this shape.
        if !data.trim_start().starts_with('{') {
            return None;
        }
        serde_json::from_str(data).ok()
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn u64_at(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

impl ResponsesStream {
    /// `response.model` of a lifecycle event, when present.
    fn take_model(&mut self, event: &Value) {
        if let Some(model) = event
            .pointer("/response/model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
        {
            self.model = Some(model.to_owned());
        }
    }

    /// The index of the call an event is about: by `output_index`, else by `item_id` (the call
    /// is created if unseen: a server may skip `output_item.added`).
    fn call_index(&self, event: &Value) -> u64 {
        let by_item = str_of(event, "item_id").and_then(|id| self.items.get(id).copied());
        event
            .get("output_index")
            .and_then(Value::as_u64)
            .or(by_item)
            .unwrap_or(0)
    }

    fn take_item(&mut self, event: &Value, item: &Value) {
        if str_of(item, "type") != Some("function_call") {
            return;
        }
        let index = event
            .get("output_index")
            .and_then(Value::as_u64)
            .unwrap_or(self.calls.len() as u64);
        if let Some(id) = str_of(item, "id")
            && self.items.insert(id.to_owned(), index).is_none()
        {
            self.held
                .add(id.len() + std::mem::size_of::<(String, u64)>());
        }
        self.held.call(&mut self.calls, index, |call| {
            if let Some(call_id) = str_of(item, "call_id").filter(|s| !s.is_empty()) {
                call.call_id = call_id.to_owned();
            }
            if let Some(name) = str_of(item, "name").filter(|s| !s.is_empty()) {
                call.name = name.to_owned();
            }
            // `added` carries "" and `done` the whole arguments: only a non-empty value
            // replaces.
            if let Some(args) = str_of(item, "arguments").filter(|s| !s.is_empty()) {
                call.arguments = args.to_owned();
            }
        });
    }
}

impl StreamParser for ResponsesStream {
    fn on_event(
        &mut self,
        kind: &str,
        data: &str,
        deltas: &mut dyn DeltaSink,
    ) -> Result<bool, AgentError> {
        if let Some(light) = LightEvent::parse(data) {
            match light.kind.as_deref().unwrap_or(kind) {
                "response.output_text.delta" => {
                    if let Some(delta) = light.delta.as_deref().filter(|d| !d.is_empty()) {
                        deltas.text_delta(delta);
                        self.held.add(delta.len());
                        self.text.push_str(delta);
                    }
                    return Ok(false);
                }
                kind if SKIPPED.contains(&kind) => return Ok(false),
                _ => {}
            }
        }
        let event: Value = serde_json::from_str(data).map_err(|e| malformed(e, data))?;
        if !event.is_object() {
            return Err(malformed("an event is not a JSON object", data));
        }
        let kind = str_of(&event, "type").unwrap_or(kind).to_owned();
        match kind.as_str() {
            "response.created" | "response.in_progress" => {
                if let Some(id) = event.pointer("/response/id").and_then(Value::as_str) {
                    self.id = Some(id.to_owned());
                }
                self.take_model(&event);
            }
            "response.output_text.delta" => {
                if let Some(delta) = str_of(&event, "delta").filter(|d| !d.is_empty()) {
                    deltas.text_delta(delta);
                    self.held.add(delta.len());
                    self.text.push_str(delta);
                }
            }
            "response.output_item.added" | "response.output_item.done" => {
                if let Some(item) = event.get("item") {
                    self.take_item(&event, item);
                }
            }
            "response.function_call_arguments.delta" => {
                if let Some(delta) = str_of(&event, "delta") {
                    let index = self.call_index(&event);
                    self.held.call(&mut self.calls, index, |call| {
                        call.arguments.push_str(delta);
                    });
                }
            }
            "response.function_call_arguments.done" => {
                if let Some(args) = str_of(&event, "arguments") {
                    let index = self.call_index(&event);
                    self.held.call(&mut self.calls, index, |call| {
                        args.clone_into(&mut call.arguments);
                    });
                }
            }
            // `incomplete` (e.g. the output token limit) still ends the response normally; a
            // truncated tool call then fails its JSON check.
            "response.completed" | "response.incomplete" => {
                let response = event.get("response").unwrap_or(&Value::Null);
                if let Some(id) = str_of(response, "id") {
                    self.id = Some(id.to_owned());
                }
                self.take_model(&event);
                if let Some(u) = response.get("usage").filter(|u| u.is_object()) {
                    self.usage = Some(Usage {
                        input_tokens: u64_at(u, "/input_tokens"),
                        output_tokens: u64_at(u, "/output_tokens"),
                        cached_tokens: u64_at(u, "/input_tokens_details/cached_tokens"),
                        reasoning_tokens: u64_at(u, "/output_tokens_details/reasoning_tokens"),
                    });
                }
                return Ok(true);
            }
            "response.failed" => {
                let error = event
                    .pointer("/response/error")
                    .cloned()
                    .unwrap_or_else(|| Value::String("response failed".into()));
                return Err(server_error(&serde_json::json!({ "error": error })));
            }
            "error" => return Err(server_error(&event)),
            _ => {}
        }
        Ok(false)
    }

    fn finish(self) -> Collected {
        Collected::gathered(self.id, self.model, self.text, self.calls, self.usage)
    }

    fn held(&self) -> usize {
        self.held.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::stream::tests::{Deltas, feed};

    #[test]
    fn fixture_stream_assembles_the_call() {
        let mut deltas = Deltas::default();
        let (done, c) = feed(
            ResponsesStream::default(),
            include_str!("../../../tests/support/fixtures/responses_tool_wire.txt"),
            &mut deltas,
        )
        .unwrap();
        assert!(done);
        assert_eq!(c.response_id.as_deref(), Some("resp_1"));
        assert_eq!(c.model.as_deref(), Some("m"), "the answering model");
        assert_eq!(
            c.calls,
            vec![RawCall {
                call_id: "call_1".into(),
                name: "add".into(),
                arguments: "{\"a\":2,\"b\":3}".into()
            }]
        );
        assert_eq!(
            c.usage,
            Some(Usage {
                input_tokens: 5,
                output_tokens: 2,
                ..Usage::default()
            })
        );
    }

    #[test]
    fn fragments_by_item_id_and_text() {
        let stream = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hel\"}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"lo\"}\n\n",
            "data: {\"type\":\"response.output_item.added\",\"output_index\":2,\"item\":{\"id\":\"fc_b\",\"type\":\"function_call\",\"call_id\":\"b\",\"name\":\"y\",\"arguments\":\"\"}}\n\n",
            "data: {\"type\":\"response.output_item.added\",\"output_index\":1,\"item\":{\"id\":\"fc_a\",\"type\":\"function_call\",\"call_id\":\"a\",\"name\":\"x\",\"arguments\":\"\"}}\n\n",
            "data: {\"type\":\"response.function_call_arguments.delta\",\"item_id\":\"fc_b\",\"delta\":\"{}\"}\n\n",
            "data: {\"type\":\"response.function_call_arguments.delta\",\"item_id\":\"fc_a\",\"delta\":\"{\\\"k\\\"\"}\n\n",
            "data: {\"type\":\"response.function_call_arguments.delta\",\"item_id\":\"fc_a\",\"delta\":\":1}\"}\n\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":9,\"output_tokens\":4,\"input_tokens_details\":{\"cached_tokens\":6},\"output_tokens_details\":{\"reasoning_tokens\":2}}}}\n\n",
        );
        let mut deltas = Deltas::default();
        let (done, c) = feed(ResponsesStream::default(), stream, &mut deltas).unwrap();
        assert!(done);
        assert_eq!(deltas.0, ["Hel", "lo"]);
        assert_eq!(c.text, "Hello");
        let calls: Vec<(&str, &str)> = c
            .calls
            .iter()
            .map(|c| (c.call_id.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(calls, [("a", "{\"k\":1}"), ("b", "{}")]);
        assert_eq!(
            c.usage.map(|u| (u.cached_tokens, u.reasoning_tokens)),
            Some((6, 2))
        );
    }

    #[test]
    fn the_light_read_of_deltas_keeps_what_the_whole_parse_kept() {
        let stream = concat!(
            // Escapes, and fields the light read skips.
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"m\",\"output_index\":0,\"content_index\":0,\"delta\":\"a\\n\\u00e9\\\"\",\"logprobs\":[{\"x\":1}]}\n\n",
            // No `type`: the SSE event's name says what it is.
            "event: response.output_text.delta\ndata: {\"delta\":\"b\"}\n\n",
            // A delta that is not a string is ignored, as before.
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":5}\n\n",
            "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"ignored\"}\n\n",
            "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"response\":{\"id\":\"r\",\"model\":\"m2\"}}\n\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\"}}\n\n",
        );
        let mut deltas = Deltas::default();
        let (done, c) = feed(ResponsesStream::default(), stream, &mut deltas).unwrap();
        assert!(done);
        assert_eq!(c.text, "a\n\u{e9}\"b");
        assert_eq!(
            c.model.as_deref(),
            Some("m2"),
            "in_progress still read whole"
        );
        // An array is no event, whatever it holds.
        let e = feed(
            ResponsesStream::default(),
            "event: response.output_text.delta\ndata: [\"response.output_text.delta\",\"x\"]\n\n",
            &mut deltas,
        )
        .unwrap_err();
        assert!(e.to_string().contains("malformed stream"), "{e}");
    }

    #[test]
    fn failures_carry_the_server_message() {
        let mut deltas = Deltas::default();
        let e = feed(
            ResponsesStream::default(),
            "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"error\":{\"code\":\"server_error\",\"message\":\"boom\"}}}\n\n",
            &mut deltas,
        )
        .unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
        let e = feed(
            ResponsesStream::default(),
            "event: error\ndata: {\"type\":\"error\",\"code\":\"x\",\"message\":\"rate limited mid-stream\"}\n\n",
            &mut deltas,
        )
        .unwrap_err();
        assert!(e.to_string().contains("rate limited mid-stream"), "{e}");
        let e = feed(ResponsesStream::default(), "data: [1,2]\n\n", &mut deltas).unwrap_err();
        assert!(e.to_string().contains("malformed stream"), "{e}");
    }
}
