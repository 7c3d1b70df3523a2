//! The built-in scripted model: replies follow a script, so every path of the task loop runs
//! without a network. It is the default model when no endpoint is configured, and it says so
//! (`ModelInfo::provider == "scripted"`).
//!
//! A script is a queue of replies consumed one per model call (a Step). Each reply may wait,
//! stream text in chunks, call tools, fail, or hang (honouring cancellation or not). Its text
//! may be given as JSON (`json`: a structured answer) or as an A2A reply form (`a2a`: the
//! A2A endpoint's file, link, data, message-only, input-required and rejected replies), so
//! every A2A path runs offline. When the queue is empty the model answers by rule: it reports
//! the last tool observation, or repeats the last user message.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use troupe_actors::ports::{DeltaSink, ModelClient, ModelInfo, ModelRequest, ModelResponse};
use troupe_proto::{AgentError, HistoryItem, Json, Role, ToolCall, Usage};

/// One scripted tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    pub name: String,
    #[serde(default = "empty_object")]
    pub arguments: serde_json::Value,
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

fn yes() -> bool {
    true
}

/// One reply of the script. A reply with no text, no tool call, no error and no hang gets
/// the rule-based answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScriptedReply {
    /// Wait this long before answering (cancellable).
    pub delay_ms: u64,
    /// Text to stream.
    pub text: Option<String>,
    /// A JSON answer: its compact text is the reply's text (when `text` is not set).
    pub json: Option<serde_json::Value>,
    /// An A2A reply form (`{"reply", "state", "text", "parts"}`, see the A2A endpoint): the
    /// reply's text is `{"a2a": <this>}` (when neither `text` nor `json` is set).
    pub a2a: Option<serde_json::Value>,
    /// Streamed in chunks of this many characters (0 = one chunk).
    pub chunk_chars: usize,
    pub tool_calls: Vec<ScriptedCall>,
    /// Fail the step with a model error carrying this message.
    pub error: Option<String>,
    /// Never finish (a never-ending stream).
    pub hang: bool,
    /// Whether a hang stops when the task is cancelled.
    #[serde(default = "yes")]
    pub honour_cancel: bool,
}

impl Default for ScriptedReply {
    fn default() -> Self {
        Self {
            delay_ms: 0,
            text: None,
            json: None,
            a2a: None,
            chunk_chars: 0,
            tool_calls: Vec::new(),
            error: None,
            hang: false,
            honour_cancel: true,
        }
    }
}

impl ScriptedReply {
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            honour_cancel: true,
            ..Self::default()
        }
    }

    /// A JSON answer.
    pub fn json(value: serde_json::Value) -> Self {
        Self {
            json: Some(value),
            ..Self::default()
        }
    }

    /// An A2A reply form (see [`ScriptedReply::a2a`]).
    pub fn a2a(form: serde_json::Value) -> Self {
        Self {
            a2a: Some(form),
            ..Self::default()
        }
    }

    /// The text this reply answers with: `text`, else the JSON answer, else the reply form.
    pub fn answer_text(&self) -> Option<String> {
        self.text
            .clone()
            .or_else(|| self.json.as_ref().map(serde_json::Value::to_string))
            .or_else(|| {
                self.a2a
                    .as_ref()
                    .map(|f| serde_json::json!({ "a2a": f }).to_string())
            })
    }

    pub fn tool(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        Self {
            tool_calls: vec![ScriptedCall {
                name: name.into(),
                arguments,
            }],
            honour_cancel: true,
            ..Self::default()
        }
    }

    pub fn error(message: impl Into<String>) -> Self {
        Self {
            error: Some(message.into()),
            honour_cancel: true,
            ..Self::default()
        }
    }

    pub fn hang(honour_cancel: bool) -> Self {
        Self {
            hang: true,
            honour_cancel,
            ..Self::default()
        }
    }

    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self
    }

    pub fn chunked(mut self, chars: usize) -> Self {
        self.chunk_chars = chars;
        self
    }
}

/// A script file: `{"replies": [...]}`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    #[serde(default)]
    pub replies: Vec<ScriptedReply>,
}

/// The scripted model. Shared by every conversation of a session; the queue is consumed in
/// call order.
pub struct ScriptedModel {
    // A plain mutex, held only to pop a reply: the model is a port implementation, not an
    // actor, and callers are concurrent tasks.
    queue: Mutex<VecDeque<ScriptedReply>>,
    calls: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedModel").finish_non_exhaustive()
    }
}

impl Default for ScriptedModel {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl ScriptedModel {
    pub fn new(replies: Vec<ScriptedReply>) -> Self {
        Self {
            queue: Mutex::new(replies.into()),
            calls: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Loads a JSON script file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, AgentError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            AgentError::invalid(format!("cannot read script {}: {e}", path.display()))
        })?;
        let script: Script = serde_json::from_str(&text)
            .map_err(|e| AgentError::invalid(format!("bad script {}: {e}", path.display())))?;
        Ok(Self::new(script.replies))
    }

    /// Appends replies to the script.
    pub fn push(&self, replies: impl IntoIterator<Item = ScriptedReply>) {
        if let Ok(mut q) = self.queue.lock() {
            q.extend(replies);
        }
    }

    /// Model calls answered so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn next_reply(&self) -> Option<ScriptedReply> {
        self.queue.lock().ok().and_then(|mut q| q.pop_front())
    }
}

/// The rule-based answer when the script is exhausted.
pub fn default_answer<'a>(prompt: impl Iterator<Item = &'a HistoryItem>) -> String {
    let mut last_user = None;
    let mut last_output = None;
    for item in prompt {
        match item {
            HistoryItem::Message {
                role: Role::User,
                text,
            } => {
                last_user = Some(text.as_str());
                last_output = None;
            }
            HistoryItem::ToolOutput(o) => last_output = Some(o.output.as_str()),
            _ => {}
        }
    }
    match (last_output, last_user) {
        (Some(out), _) => format!("The tool answered: {}", out.trim()),
        (None, Some(user)) => format!("You said: {user}"),
        (None, None) => "Hello from troupe's scripted model.".to_owned(),
    }
}

async fn wait(d: Duration, cancel: &CancellationToken) -> Result<(), AgentError> {
    tokio::select! {
        () = tokio::time::sleep(d) => Ok(()),
        () = cancel.cancelled() => Err(AgentError::cancelled("cancelled during the model call")),
    }
}

#[async_trait]
impl ModelClient for ScriptedModel {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "scripted".into(),
            model: "scripted".into(),
            family: "scripted".into(),
        }
    }

    async fn step(
        &self,
        request: ModelRequest<'_>,
        deltas: &mut dyn DeltaSink,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, AgentError> {
        let n = self
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let reply = self.next_reply();
        let mut reply = reply.unwrap_or_default();
        reply.text = reply.answer_text();
        if reply.text.is_none()
            && reply.tool_calls.is_empty()
            && reply.error.is_none()
            && !reply.hang
        {
            reply.text = Some(default_answer(request.prompt.iter()));
        }
        if reply.delay_ms > 0 {
            wait(Duration::from_millis(reply.delay_ms), cancel).await?;
        }
        if reply.hang {
            if reply.honour_cancel {
                cancel.cancelled().await;
                return Err(AgentError::cancelled("cancelled during the model call"));
            }
            // Deliberately deaf to cancellation: only an abort ends this.
            std::future::pending::<()>().await;
        }
        if let Some(message) = reply.error {
            return Err(AgentError::ModelError {
                message,
                retryable: false,
            });
        }
        let text = reply.text.unwrap_or_default();
        if !text.is_empty() {
            for chunk in chunks(&text, reply.chunk_chars) {
                if cancel.is_cancelled() {
                    return Err(AgentError::cancelled("cancelled during the model call"));
                }
                deltas.text_delta(chunk);
            }
        }
        let tool_calls = reply
            .tool_calls
            .into_iter()
            .enumerate()
            .map(|(i, c)| ToolCall {
                call_id: format!("call_{n}_{i}"),
                name: c.name,
                arguments: Json(c.arguments),
            })
            .collect();
        let input_tokens = u64::try_from(request.prompt.approx_tokens()).unwrap_or(u64::MAX)
            + u64::try_from(request.instructions.len().div_ceil(4)).unwrap_or(u64::MAX);
        let output_tokens = u64::try_from(text.len().div_ceil(4)).unwrap_or(u64::MAX);
        Ok(ModelResponse {
            text,
            tool_calls,
            usage: Some(Usage {
                input_tokens,
                output_tokens,
                ..Usage::default()
            }),
            response_id: Some(format!("scripted-{n}")),
            response_model: Some("scripted".into()),
        })
    }
}

/// Splits on char boundaries into pieces of at most `n` chars (`0`: one piece).
fn chunks(text: &str, n: usize) -> Vec<&str> {
    if n == 0 {
        return vec![text];
    }
    let mut out = Vec::new();
    let mut start = 0;
    for (count, (i, _)) in text.char_indices().enumerate() {
        if count > 0 && count % n == 0 {
            out.push(&text[start..i]);
            start = i;
        }
    }
    out.push(&text[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_respect_char_boundaries() {
        assert_eq!(chunks("héllo", 2), vec!["hé", "ll", "o"]);
        assert_eq!(chunks("abc", 0), vec!["abc"]);
    }

    #[test]
    fn default_answer_prefers_the_last_observation() {
        let items = [
            HistoryItem::user("hi"),
            HistoryItem::ToolOutput(troupe_proto::ToolOutput {
                call_id: "1".into(),
                output: "42\n".into(),
                is_error: false,
            }),
        ];
        assert_eq!(default_answer(items.iter()), "The tool answered: 42");
        assert_eq!(default_answer(items[..1].iter()), "You said: hi");
    }

    #[test]
    fn a_misspelt_key_is_refused_not_ignored() {
        for text in [
            r#"{"replys":[]}"#,
            r#"{"replies":[{"txt":"hi"}]}"#,
            r#"{"replies":[{"tool_calls":[{"name":"shell","args":{}}]}]}"#,
        ] {
            let e = serde_json::from_str::<Script>(text)
                .unwrap_err()
                .to_string();
            assert!(e.contains("unknown field"), "{text}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        std::fs::write(&path, r#"{"replies":[{"txt":"hi"}]}"#).unwrap();
        let e = ScriptedModel::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("bad script") && e.contains("`txt`"), "{e}");
    }

    #[test]
    fn json_and_reply_forms_are_the_text() {
        let s: Script = serde_json::from_str(
            r#"{"replies":[{"json":{"total":3}},{"a2a":{"state":"rejected","text":"No."}},{"text":"t","json":[1]}]}"#,
        )
        .unwrap();
        assert_eq!(s.replies[0].answer_text().unwrap(), r#"{"total":3}"#);
        assert_eq!(
            s.replies[1].answer_text().unwrap(),
            r#"{"a2a":{"state":"rejected","text":"No."}}"#
        );
        assert_eq!(s.replies[2].answer_text().unwrap(), "t", "text first");
        assert_eq!(ScriptedReply::default().answer_text(), None);
    }

    #[test]
    fn script_file_format() {
        let s: Script = serde_json::from_str(
            r#"{"replies":[{"text":"a"},{"tool_calls":[{"name":"shell","arguments":{"command":["ls"]}}]},{"hang":true,"honour_cancel":false}]}"#,
        )
        .unwrap();
        assert_eq!(s.replies.len(), 3);
        assert!(s.replies[0].honour_cancel);
        assert!(!s.replies[2].honour_cancel);
    }
}
