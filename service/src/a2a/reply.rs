//! How what a troupe task produced becomes A2A parts: its final answer ([`answer_form`]),
//! and the files its tools made ([`tool_file`]). Pure functions.
//!
//! The final answer, when the task ended `ok`:
//! - text → one `text` part (the `answer` artifact);
//! - a JSON object or array (the whole answer, or the whole answer inside one ```` ```json ````
//!   fence) → one `data` part (`application/json`);
//! - the **A2A reply form**, a JSON object with the single key `a2a`:
//!   ```json
//!   {"a2a": {"reply": "task" | "message",
//!            "state": "completed" | "input-required" | "rejected",
//!            "text": "…",
//!            "parts": [{"text": "…"}, {"data": {…}},
//!                      {"url": "https://…", "mediaType": "…", "filename": "…"},
//!                      {"raw": "<base64>", "mediaType": "…", "filename": "…"}]}}
//!   ```
//!   (`text` is a first text part; parts are A2A 1.0 parts). `completed` (the default) puts
//!   the parts in the `answer` artifact; `input-required` asks the client (the task waits
//!   for its next message, which runs the task again in the same conversation); `rejected`
//!   ends the task REJECTED with the parts as its reason; `"reply": "message"` (with
//!   `completed`) answers with a plain Message instead of a task's artifact.
//!   A reply form that does not read is sent as the text it is.
//!
//! Tool results become files as they happen: the patch of an `apply_patch` call that applied
//! (`text/x-diff`) and the output of a `shell` command that succeeded (`text/plain`), each an
//! artifact of its own with a `raw` part.

use super::model::{Part, PartContent};
use base64::Engine;
use serde::Deserialize;
use serde_json::Value;

/// What the final answer asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerForm {
    /// The answer artifact, with these parts; the task completes.
    Artifact(Vec<Part>),
    /// A plain Message with these parts; the task completes.
    Message(Vec<Part>),
    /// Ask the client: the task waits for input, with these parts as the question.
    InputRequired(Vec<Part>),
    /// The agent refuses: the task ends REJECTED, with these parts as the reason.
    Rejected(Vec<Part>),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ReplyForm {
    #[serde(default)]
    reply: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    parts: Vec<Value>,
}

/// The JSON an answer is, if it is one: the whole text, or the whole text inside one
/// ```` ```json ```` (or bare ```` ``` ````) fence; only objects and arrays count.
fn json_answer(text: &str) -> Option<Value> {
    let t = text.trim();
    let body = match t.strip_prefix("```") {
        Some(rest) => {
            let rest = rest.strip_prefix("json").unwrap_or(rest);
            rest.strip_suffix("```")?.trim()
        }
        None => t,
    };
    if !(body.starts_with('{') || body.starts_with('[')) {
        return None;
    }
    serde_json::from_str::<Value>(body)
        .ok()
        .filter(|v| v.is_object() || v.is_array())
}

/// Reads the reply form's object (the value of `a2a`).
fn reply_form(v: &Value) -> Result<AnswerForm, String> {
    let form: ReplyForm = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    let mut parts = Vec::new();
    if let Some(t) = form.text.filter(|t| !t.is_empty()) {
        parts.push(Part::text(t));
    }
    for p in &form.parts {
        parts.push(super::wire_v1::part_from_json(p).map_err(|e| e.to_string())?);
    }
    if parts.is_empty() {
        return Err("the reply has no text and no parts".into());
    }
    let message = match form.reply.as_deref() {
        None | Some("task") => false,
        Some("message") => true,
        Some(other) => return Err(format!("unknown reply {other:?}")),
    };
    match form.state.as_deref() {
        None | Some("completed") if message => Ok(AnswerForm::Message(parts)),
        None | Some("completed") => Ok(AnswerForm::Artifact(parts)),
        Some(_) if message => Err("a message reply cannot change the task's state".into()),
        Some("input-required") => Ok(AnswerForm::InputRequired(parts)),
        Some("rejected") => Ok(AnswerForm::Rejected(parts)),
        Some(other) => Err(format!("unknown state {other:?}")),
    }
}

/// What a final answer becomes (see the module doc).
pub fn answer_form(text: &str) -> AnswerForm {
    let Some(json) = json_answer(text) else {
        return AnswerForm::Artifact(vec![Part::text(text)]);
    };
    match json
        .as_object()
        .and_then(|o| o.get("a2a").filter(|_| o.len() == 1))
    {
        Some(form) => reply_form(form).unwrap_or_else(|why| {
            tracing::warn!(%why, "an A2A reply form that does not read is sent as text");
            AnswerForm::Artifact(vec![Part::text(text)])
        }),
        None => {
            let mut part = Part::data(json);
            part.media_type = Some("application/json".into());
            AnswerForm::Artifact(vec![part])
        }
    }
}

/// An answer an output schema validated (A8): its object or array as a data part, never
/// read as the reply form (a schema may let an answer be `{"a2a": ...}`); another JSON value
/// as text.
pub fn data_form(text: &str) -> AnswerForm {
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(json) if json.is_object() || json.is_array() => {
            let mut part = Part::data(json);
            part.media_type = Some("application/json".into());
            AnswerForm::Artifact(vec![part])
        }
        _ => AnswerForm::Artifact(vec![Part::text(text)]),
    }
}

/// Whether a step's text, as it starts, may be JSON (a data answer or the reply form): it is
/// then not streamed piece by piece but arrives whole at the task's end.
pub fn held_back(start: &str) -> bool {
    let t = start.trim_start();
    t.starts_with('{') || t.starts_with('[') || t.starts_with("```")
}

/// A file a tool made, as an artifact's part and name.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolFile {
    /// `patch` or `shell output`.
    pub name: &'static str,
    pub part: Part,
}

/// The file a finished tool call made, if any: `n` numbers the task's files.
pub fn tool_file(tool: &str, arguments: &Value, output: &str, n: u32) -> Option<ToolFile> {
    match tool {
        "apply_patch" => {
            let patch = arguments.get("input").and_then(Value::as_str)?;
            Some(ToolFile {
                name: "patch",
                part: raw_part(patch.as_bytes(), "text/x-diff", format!("patch-{n}.diff")),
            })
        }
        "shell" => {
            let mut part = raw_part(output.as_bytes(), "text/plain", format!("shell-{n}.txt"));
            if let Some(command) = arguments.get("command") {
                part.metadata = Some(serde_json::json!({ "command": command }));
            }
            Some(ToolFile {
                name: "shell output",
                part,
            })
        }
        _ => None,
    }
}

/// A `raw` part holding `bytes`.
pub fn raw_part(bytes: &[u8], media_type: &str, filename: String) -> Part {
    Part {
        content: PartContent::Raw(base64::engine::general_purpose::STANDARD.encode(bytes)),
        media_type: Some(media_type.to_owned()),
        filename: Some(filename),
        metadata: None,
    }
}

/// The bytes of a `raw` part (standard base64, padded or not).
pub fn raw_bytes(b64: &str) -> Option<Vec<u8>> {
    let t = b64.trim();
    base64::engine::general_purpose::STANDARD
        .decode(t)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(t))
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(t))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn plain_text_is_a_text_answer() {
        assert_eq!(
            answer_form("It is 42."),
            AnswerForm::Artifact(vec![Part::text("It is 42.")])
        );
        // JSON-looking text that is not JSON stays text.
        assert_eq!(
            answer_form("{not json"),
            AnswerForm::Artifact(vec![Part::text("{not json")])
        );
        assert_eq!(
            answer_form("42"),
            AnswerForm::Artifact(vec![Part::text("42")]),
            "a bare number is text"
        );
    }

    #[test]
    fn a_json_answer_is_data() {
        let AnswerForm::Artifact(parts) = answer_form(" {\"total\": 3} ") else {
            panic!("an artifact")
        };
        assert_eq!(parts[0].content, PartContent::Data(json!({"total": 3})));
        assert_eq!(parts[0].media_type.as_deref(), Some("application/json"));
        let AnswerForm::Artifact(parts) = answer_form("```json\n[1, 2]\n```") else {
            panic!("an artifact")
        };
        assert_eq!(parts[0].content, PartContent::Data(json!([1, 2])));
    }

    #[test]
    fn the_reply_form_picks_parts_and_state() {
        let form = |v: Value| answer_form(&v.to_string());
        let AnswerForm::Artifact(parts) = form(json!({"a2a": {
            "text": "Here:",
            "parts": [{"url": "https://example.com/r.pdf", "mediaType": "application/pdf",
                       "filename": "r.pdf"},
                      {"raw": "aGVsbG8=", "mediaType": "text/plain", "filename": "h.txt"},
                      {"data": {"k": 1}}]}}))
        else {
            panic!("an artifact")
        };
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[0], Part::text("Here:"));
        assert_eq!(
            parts[1].content,
            PartContent::Url("https://example.com/r.pdf".into())
        );
        assert_eq!(parts[1].filename.as_deref(), Some("r.pdf"));
        assert_eq!(parts[2].content, PartContent::Raw("aGVsbG8=".into()));
        assert_eq!(
            form(json!({"a2a": {"reply": "message", "text": "hi"}})),
            AnswerForm::Message(vec![Part::text("hi")])
        );
        assert_eq!(
            form(json!({"a2a": {"state": "input-required", "text": "Which city?"}})),
            AnswerForm::InputRequired(vec![Part::text("Which city?")])
        );
        assert_eq!(
            form(json!({"a2a": {"state": "rejected", "text": "No."}})),
            AnswerForm::Rejected(vec![Part::text("No.")])
        );
    }

    #[test]
    fn a_reply_form_that_does_not_read_is_text() {
        for bad in [
            json!({"a2a": {}}),
            json!({"a2a": {"text": "x", "state": "sleeping"}}),
            json!({"a2a": {"text": "x", "reply": "message", "state": "rejected"}}),
            json!({"a2a": {"text": "x", "colour": "red"}}),
            json!({"a2a": {"parts": [{"text": "a", "url": "b"}]}}),
        ] {
            let text = bad.to_string();
            assert_eq!(
                answer_form(&text),
                AnswerForm::Artifact(vec![Part::text(text.clone())]),
                "{text}"
            );
        }
        // Another key beside `a2a`: just data.
        let AnswerForm::Artifact(parts) = answer_form(r#"{"a2a": {"text": "x"}, "more": 1}"#)
        else {
            panic!("an artifact")
        };
        assert!(matches!(parts[0].content, PartContent::Data(_)));
    }

    #[test]
    fn json_starts_are_held_back() {
        assert!(held_back("  {\"a"));
        assert!(held_back("["));
        assert!(held_back("```json"));
        assert!(!held_back("Hello {"));
    }

    #[test]
    fn tools_make_files() {
        let patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch";
        let f = tool_file("apply_patch", &json!({"input": patch}), "Done!", 1).unwrap();
        assert_eq!(f.part.media_type.as_deref(), Some("text/x-diff"));
        assert_eq!(f.part.filename.as_deref(), Some("patch-1.diff"));
        let PartContent::Raw(b) = &f.part.content else {
            panic!("raw")
        };
        assert_eq!(raw_bytes(b).unwrap(), patch.as_bytes());
        let f = tool_file("shell", &json!({"command": ["ls"]}), "a\nb\n", 2).unwrap();
        assert_eq!(f.part.filename.as_deref(), Some("shell-2.txt"));
        assert_eq!(f.part.metadata, Some(json!({"command": ["ls"]})));
        assert!(tool_file("update_plan", &json!({}), "", 3).is_none());
        assert!(tool_file("everything__echo", &json!({}), "x", 3).is_none());
    }
}
