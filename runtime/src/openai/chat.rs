//! Chat Completions stream parsing: `data: {chunk}` events, tool calls assembled by their
//! `index`, usage from the last chunk (`stream_options.include_usage`), `data: [DONE]` at the
//! end.

use super::stream::{Collected, Held, RawCall, StreamParser, malformed, server_error};
use serde::Deserialize;
use std::collections::BTreeMap;
use troupe_actors::ports::DeltaSink;
use troupe_proto::{AgentError, Usage};

/// Assembles one chat completion stream.
#[derive(Debug, Default)]
pub struct ChatStream {
    id: Option<String>,
    model: Option<String>,
    text: String,
    /// By the `index` the server gives each call (a slot of its own for a call that reuses
    /// another's index, see [`indexed_slot`]).
    calls: BTreeMap<u64, RawCall>,
    /// The call the last tool-call delta went to.
    last_call: Option<u64>,
    /// Where the deltas of a reused index go now: the slot of the last call that came with
    /// that index.
    reused: BTreeMap<u64, u64>,
    usage: Option<Usage>,
    /// What `text` and `calls` hold.
    held: Held,
}

/// The slot of a tool-call delta with `index`: that index's call, unless the delta brings an
/// id and that call already has another one. Some servers (Ollama, some gateways) give every
/// call of a response `index: 0`; each new id is then a call of its own, in a new slot (or
/// the slot that already has that id), and the index's later fragments without an id go to
/// it.
fn indexed_slot(
    calls: &BTreeMap<u64, RawCall>,
    reused: &BTreeMap<u64, u64>,
    index: u64,
    id: Option<&str>,
) -> u64 {
    let current = reused.get(&index).copied().unwrap_or(index);
    let Some(id) = id.filter(|i| !i.is_empty()) else {
        return current;
    };
    match calls.get(&current) {
        Some(call) if !call.call_id.is_empty() && call.call_id != id => {
            calls.iter().find(|(_, c)| c.call_id == id).map_or_else(
                || calls.keys().next_back().map_or(0, |k| k + 1),
                |(k, _)| *k,
            )
        }
        _ => current,
    }
}

/// The slot of a tool-call delta that names no `index` (servers that send each call whole,
/// one per chunk, sometimes leave it out): the call with the delta's id when one has it, a
/// new call for a new id, else (a fragment without an id) the call the last delta went to.
fn unindexed_slot(calls: &BTreeMap<u64, RawCall>, last: Option<u64>, id: Option<&str>) -> u64 {
    let next = calls.keys().next_back().map_or(0, |k| k + 1);
    match id.filter(|i| !i.is_empty()) {
        Some(id) => calls
            .iter()
            .find(|(_, c)| c.call_id == id)
            .map_or(next, |(k, _)| *k),
        None => last.unwrap_or(next),
    }
}

/// A field's default when it is missing or `null`: some OpenAI-compatible servers send
/// `"tool_calls": null` or `"usage": {"prompt_tokens": null}` rather than leaving it out.
fn null_default<'de, D, T>(de: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(de)?.unwrap_or_default())
}

#[derive(Deserialize)]
struct Chunk {
    id: Option<String>,
    model: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    choices: Vec<Choice>,
    usage: Option<ChatUsage>,
    /// Some servers report a failure as a chunk instead of a status.
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default, deserialize_with = "null_default")]
    index: u64,
    delta: Option<Delta>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    index: Option<u64>,
    id: Option<String>,
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct ChatUsage {
    #[serde(default, deserialize_with = "null_default")]
    prompt_tokens: u64,
    #[serde(default, deserialize_with = "null_default")]
    completion_tokens: u64,
    prompt_tokens_details: Option<PromptDetails>,
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default, deserialize_with = "null_default")]
    cached_tokens: u64,
}

#[derive(Deserialize)]
struct CompletionDetails {
    #[serde(default, deserialize_with = "null_default")]
    reasoning_tokens: u64,
}

impl StreamParser for ChatStream {
    fn on_event(
        &mut self,
        _kind: &str,
        data: &str,
        deltas: &mut dyn DeltaSink,
    ) -> Result<bool, AgentError> {
        if data.trim() == "[DONE]" {
            return Ok(true);
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| malformed(e, data))?;
        if let Some(error) = chunk.error {
            return Err(server_error(&error));
        }
        if self.id.is_none() {
            self.id = chunk.id;
        }
        if self.model.is_none() {
            self.model = chunk.model.filter(|m| !m.is_empty());
        }
        if let Some(u) = chunk.usage {
            self.usage = Some(Usage {
                input_tokens: u.prompt_tokens,
                output_tokens: u.completion_tokens,
                cached_tokens: u.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
                reasoning_tokens: u
                    .completion_tokens_details
                    .map_or(0, |d| d.reasoning_tokens),
            });
        }
        // One completion was asked for; other choices would be a server quirk.
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            let Some(delta) = choice.delta else { continue };
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                deltas.text_delta(&text);
                self.held.add(text.len());
                self.text.push_str(&text);
            }
            for call in delta.tool_calls {
                let index = match call.index {
                    Some(index) => {
                        let slot =
                            indexed_slot(&self.calls, &self.reused, index, call.id.as_deref());
                        if slot != index {
                            self.reused.insert(index, slot);
                        }
                        slot
                    }
                    None => unindexed_slot(&self.calls, self.last_call, call.id.as_deref()),
                };
                self.last_call = Some(index);
                self.held.call(&mut self.calls, index, |slot| {
                    if let Some(id) = call.id.filter(|id| !id.is_empty()) {
                        slot.call_id = id;
                    }
                    if let Some(f) = call.function {
                        if let Some(name) = f.name.filter(|n| !n.is_empty()) {
                            slot.name = name;
                        }
                        if let Some(args) = f.arguments {
                            slot.arguments.push_str(&args);
                        }
                    }
                });
            }
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

    /// Ollama streams each of a response's calls whole, every one with `index: 0`: each is a
    /// call of its own, not one call whose arguments are the others' run together.
    #[test]
    fn calls_that_reuse_an_index_stay_apart() {
        let chunk = |id: &str, name: &str, args: &str| {
            format!(
                "data: {{\"id\":\"c\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":0,\"id\":\"{id}\",\"type\":\"function\",\"function\":{{\"name\":\"{name}\",\"arguments\":{args}}}}}]}}}}]}}\n\n"
            )
        };
        let wire = [
            chunk("call_a", "write", "\"{\\\"path\\\":\\\"hello.py\\\"}\""),
            chunk("call_b", "write", "\"{\\\"path\\\":\\\"world.py\\\"}\""),
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n".to_owned(),
        ]
        .concat();
        let mut deltas = Deltas::default();
        let (done, c) = feed(ChatStream::default(), &wire, &mut deltas).unwrap();
        assert!(done);
        let calls: Vec<(&str, &str)> = c
            .calls
            .iter()
            .map(|c| (c.call_id.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            calls,
            [
                ("call_a", "{\"path\":\"hello.py\"}"),
                ("call_b", "{\"path\":\"world.py\"}")
            ]
        );
    }

    #[test]
    fn a_reused_index_sends_its_later_fragments_to_its_newest_call() {
        let mut calls = BTreeMap::new();
        let reused = BTreeMap::new();
        calls.insert(
            0,
            RawCall {
                call_id: "a".into(),
                name: "f".into(),
                arguments: "{}".into(),
            },
        );
        assert_eq!(indexed_slot(&calls, &reused, 0, Some("a")), 0);
        assert_eq!(indexed_slot(&calls, &reused, 0, None), 0);
        assert_eq!(indexed_slot(&calls, &reused, 0, Some("b")), 1);
        assert_eq!(
            indexed_slot(&calls, &reused, 1, Some("c")),
            1,
            "a new index"
        );
        let reused = BTreeMap::from([(0, 1)]);
        calls.insert(1, RawCall::default());
        assert_eq!(indexed_slot(&calls, &reused, 0, None), 1);
    }

    #[test]
    fn fixture_stream_assembles_the_call() {
        let mut deltas = Deltas::default();
        let (done, c) = feed(
            ChatStream::default(),
            include_str!("../../../tests/support/fixtures/chat_tool_wire.txt"),
            &mut deltas,
        )
        .unwrap();
        assert!(done);
        assert_eq!(c.response_id.as_deref(), Some("chatcmpl-1"));
        assert_eq!(c.model.as_deref(), Some("m"), "the answering model");
        assert_eq!(
            c.calls,
            vec![RawCall {
                call_id: "call_1".into(),
                name: "add".into(),
                arguments: "{\"a\":2,\"b\":3}".into()
            }]
        );
        assert!(deltas.0.is_empty());
        assert_eq!(c.usage, None);
    }

    /// Calls sent whole without an `index`, one per chunk or several in one: each its own
    /// call (they were merged into one, arguments concatenated); a fragment without an id
    /// goes on with the call before it.
    #[test]
    fn calls_without_an_index_stay_apart() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"x\",\"arguments\":\"{\\\"n\\\":1}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"y\",\"arguments\":\"{\\\"n\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\":2}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"id\":\"c\",\"function\":{\"name\":\"z\",\"arguments\":\"{}\"}},{\"id\":\"d\",\"function\":{\"name\":\"w\",\"arguments\":\"[]\"}}]}}]}\n\n",
            "data: [DONE]\n\n",
        );
        let mut deltas = Deltas::default();
        let (done, c) = feed(ChatStream::default(), stream, &mut deltas).unwrap();
        assert!(done);
        let calls: Vec<(&str, &str, &str)> = c
            .calls
            .iter()
            .map(|c| (c.call_id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            calls,
            [
                ("a", "x", "{\"n\":1}"),
                ("b", "y", "{\"n\":2}"),
                ("c", "z", "{}"),
                ("d", "w", "[]")
            ]
        );
    }

    #[test]
    fn text_calls_by_index_and_usage() {
        let stream = concat!(
            "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi \"}}]}\n\n",
            "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"you\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"b\",\"function\":{\"name\":\"y\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"x\",\"arguments\":\"{\\\"k\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":6},\"completion_tokens_details\":{\"reasoning_tokens\":2}}}\n\n",
            "data: [DONE]\n\n",
        );
        let mut deltas = Deltas::default();
        let (done, c) = feed(ChatStream::default(), stream, &mut deltas).unwrap();
        assert!(done);
        assert_eq!(deltas.0, ["Hi ", "you"]);
        assert_eq!(c.text, "Hi you");
        let calls: Vec<(&str, &str, &str)> = c
            .calls
            .iter()
            .map(|c| (c.call_id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(calls, [("a", "x", "{\"k\":1}"), ("b", "y", "{}")]);
        assert_eq!(
            c.usage,
            Some(Usage {
                input_tokens: 9,
                output_tokens: 4,
                cached_tokens: 6,
                reasoning_tokens: 2
            })
        );
    }

    #[test]
    fn null_lists_and_counts_read_as_absent() {
        let stream = concat!(
            "data: {\"id\":\"x\",\"choices\":[{\"index\":null,\"delta\":{\"content\":\"hi\",\"tool_calls\":null}}],\"usage\":null}\n\n",
            "data: {\"choices\":null,\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":null,\"prompt_tokens_details\":{\"cached_tokens\":null}}}\n\n",
            "data: [DONE]\n\n",
        );
        let mut deltas = Deltas::default();
        let (done, c) = feed(ChatStream::default(), stream, &mut deltas).unwrap();
        assert!(done);
        assert_eq!(c.text, "hi");
        assert!(c.calls.is_empty());
        assert_eq!(
            c.usage.map(|u| (u.input_tokens, u.output_tokens)),
            Some((3, 0))
        );
    }

    #[test]
    fn errors_in_the_stream() {
        let mut deltas = Deltas::default();
        let e = feed(ChatStream::default(), "data: {not json\n\n", &mut deltas).unwrap_err();
        assert!(e.to_string().contains("malformed stream"), "{e}");
        let e = feed(
            ChatStream::default(),
            "data: {\"error\":{\"message\":\"model overloaded\"}}\n\n",
            &mut deltas,
        )
        .unwrap_err();
        assert!(e.to_string().contains("model overloaded"), "{e}");
        // Whole calls without an index or id (some local servers).
        let (done, c) = feed(
            ChatStream::default(),
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}\n\n",
            &mut deltas,
        )
        .unwrap();
        assert!(!done);
        assert_eq!(c.calls[0].call_id, "call_0");
    }
}
