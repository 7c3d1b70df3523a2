//! Decoded A2A requests, the same for both versions, and their validation: which parts and
//! media types troupe accepts (text, JSON, and text files), and the paging limits of
//! `ListTasks`.

use super::error::A2aError;
use super::model::{Message, PartContent, Role, TaskState};
use serde_json::Value;

/// `SendMessage` / `SendStreamingMessage` (1.0 `SendMessageRequest`, 0.3 `MessageSendParams`).
#[derive(Debug, Clone, PartialEq)]
pub struct SendParams {
    pub message: Message,
    /// Media types the client takes; empty = anything.
    pub accepted_output_modes: Vec<String>,
    pub history_length: Option<u32>,
    /// 1.0 `returnImmediately`, 0.3 `blocking: false`.
    pub return_immediately: bool,
    /// A push notification config for the new task (its `task_id` is empty until the task
    /// exists).
    pub push_config: Option<super::push::PushConfig>,
    pub metadata: Option<Value>,
}

/// `GetTask`.
#[derive(Debug, Clone, PartialEq)]
pub struct GetParams {
    pub id: String,
    pub history_length: Option<u32>,
}

/// `ListTasks` (1.0 only).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListParams {
    pub context_id: Option<String>,
    pub status: Option<TaskState>,
    pub page_size: Option<u32>,
    pub page_token: Option<String>,
    pub history_length: Option<u32>,
    pub status_timestamp_after_ms: Option<u64>,
    pub include_artifacts: bool,
}

/// A decoded request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Send(SendParams),
    Stream(SendParams),
    Get(GetParams),
    List(ListParams),
    Cancel {
        id: String,
    },
    Subscribe {
        id: String,
    },
    /// A push notification config method.
    Push(super::push::PushRequest),
    ExtendedCard,
}

/// `ListTasks` page size: default and maximum (as the reference SDK).
pub const DEFAULT_PAGE_SIZE: u32 = 50;
pub const MAX_PAGE_SIZE: u32 = 100;

/// A `historyLength` or `pageSize` from the wire: non-negative and in range.
pub fn non_negative(field: &str, v: Option<i64>) -> Result<Option<u32>, A2aError> {
    match v {
        None => Ok(None),
        Some(n) => u32::try_from(n).map(Some).map_err(|_| {
            A2aError::InvalidParams(format!("{field} must be a non-negative integer, got {n}"))
        }),
    }
}

pub fn page_size(v: Option<i64>) -> Result<Option<u32>, A2aError> {
    match v {
        None => Ok(None),
        Some(n) if (1..=i64::from(MAX_PAGE_SIZE)).contains(&n) => Ok(u32::try_from(n).ok()),
        Some(n) => Err(A2aError::InvalidParams(format!(
            "pageSize must be between 1 and {MAX_PAGE_SIZE} inclusive, got {n}"
        ))),
    }
}

/// Media types troupe reads in a message (text files of any `text/*` type too), and what it
/// writes: text, JSON data, and the files its tools make (patches, command output).
pub const INPUT_MODES: [&str; 2] = ["text/plain", "application/json"];
pub const OUTPUT_MODES: [&str; 3] = ["text/plain", "application/json", "text/x-diff"];

/// Largest text file a message may carry (decoded).
pub const MAX_FILE_BYTES: usize = 256 * 1024;

/// The text troupe's conversation receives for a client message: its text parts; its data
/// parts as JSON text; its text files (`raw` parts of a `text/*` or JSON media type, or of
/// none when the bytes are UTF-8), each as its name, media type and content in a fenced
/// block. Files by URL (troupe fetches nothing for a client), binary files and other media
/// types are refused with `ContentTypeNotSupported`; so is a client that accepts no text
/// output.
pub fn input_text(params: &SendParams) -> Result<String, A2aError> {
    if !params.accepted_output_modes.is_empty()
        && !params.accepted_output_modes.iter().any(|m| accepts_text(m))
    {
        return Err(A2aError::ContentTypeNotSupported(format!(
            "troupe answers in text/plain; acceptedOutputModes: {}",
            params.accepted_output_modes.join(", ")
        )));
    }
    if params.message.role != Role::User {
        return Err(A2aError::InvalidParams(
            "message.role must be ROLE_USER (0.3: user)".into(),
        ));
    }
    let mut pieces = Vec::with_capacity(params.message.parts.len());
    for part in &params.message.parts {
        if let Some(mt) = &part.media_type
            && !mt.is_empty()
            && !is_text_type(mt)
        {
            return Err(A2aError::ContentTypeNotSupported(format!(
                "{mt}; troupe reads text (text/*) and JSON"
            )));
        }
        match &part.content {
            PartContent::Text(t) => pieces.push(t.clone()),
            PartContent::Data(v) => pieces.push(v.to_string()),
            PartContent::Raw(b64) => pieces.push(text_file(part, b64)?),
            PartContent::Url(_) => {
                return Err(A2aError::ContentTypeNotSupported(
                    "files by URL: troupe does not fetch them; send the file's content (raw) \
                     or its text"
                        .into(),
                ));
            }
        }
    }
    let text = pieces.join("\n");
    if text.trim().is_empty() {
        return Err(A2aError::InvalidParams(
            "message has no text to act on".into(),
        ));
    }
    Ok(text)
}

/// A media type troupe reads as text: `text/*`, JSON (`application/json`, `+json`) and the
/// usual textual application types.
fn is_text_type(mt: &str) -> bool {
    let essence = mt
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence.starts_with("text/")
        || INPUT_MODES.iter().any(|m| essence == *m)
        || essence.ends_with("+json")
        || essence.ends_with("+xml")
        || matches!(
            essence.as_str(),
            "application/xml" | "application/yaml" | "application/x-yaml" | "application/toml"
        )
}

/// A text file of a message, as the conversation reads it.
fn text_file(part: &super::model::Part, b64: &str) -> Result<String, A2aError> {
    let name = part.filename.as_deref().unwrap_or("file");
    let bytes = super::reply::raw_bytes(b64)
        .ok_or_else(|| A2aError::InvalidParams(format!("file {name}: raw is not base64")))?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(A2aError::InvalidParams(format!(
            "file {name} is larger than {MAX_FILE_BYTES} bytes"
        )));
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        A2aError::ContentTypeNotSupported(format!(
            "file {name} is not UTF-8 text; troupe reads text files"
        ))
    })?;
    let media_type = part.media_type.as_deref().unwrap_or("text/plain");
    let fence = if text.contains("```") { "````" } else { "```" };
    Ok(format!(
        "File `{name}` ({media_type}):\n{fence}\n{text}\n{fence}"
    ))
}

fn accepts_text(mode: &str) -> bool {
    let m = mode.split(';').next().unwrap_or_default().trim();
    m.eq_ignore_ascii_case("text/plain")
        || m.eq_ignore_ascii_case("text/*")
        || m == "*/*"
        || m.eq_ignore_ascii_case("text")
}

/// Required, non-empty string field.
pub fn required(field: &str, v: Option<String>) -> Result<String, A2aError> {
    match v {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(A2aError::InvalidParams(format!("{field} is required"))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::Part;
    use super::*;

    fn send(parts: Vec<Part>) -> SendParams {
        SendParams {
            message: Message {
                message_id: "m".into(),
                context_id: None,
                task_id: None,
                role: Role::User,
                parts,
                metadata: None,
                reference_task_ids: vec![],
                extensions: vec![],
            },
            accepted_output_modes: vec![],
            history_length: None,
            return_immediately: false,
            push_config: None,
            metadata: None,
        }
    }

    #[test]
    fn text_and_data_parts_become_the_input() {
        let p = send(vec![
            Part::text("hello"),
            Part::data(serde_json::json!({"a": 1})),
        ]);
        assert_eq!(input_text(&p).unwrap(), "hello\n{\"a\":1}");
    }

    #[test]
    fn text_files_are_read_and_named() {
        let mut file = Part::text("");
        file.content = PartContent::Raw("aGVsbG8gZmlsZQ==".into());
        file.media_type = Some("text/markdown".into());
        file.filename = Some("notes.md".into());
        let text = input_text(&send(vec![Part::text("Summarise:"), file.clone()])).unwrap();
        assert_eq!(
            text,
            "Summarise:\nFile `notes.md` (text/markdown):\n```\nhello file\n```"
        );
        // No media type: read when the bytes are text.
        file.media_type = None;
        assert!(input_text(&send(vec![file.clone()])).is_ok());
        // Binary bytes, or not base64.
        file.content = PartContent::Raw("//79/A==".into());
        assert_eq!(
            input_text(&send(vec![file.clone()])).unwrap_err().code(),
            -32005
        );
        file.content = PartContent::Raw("not base64!".into());
        assert_eq!(input_text(&send(vec![file])).unwrap_err().code(), -32602);
    }

    #[test]
    fn files_and_foreign_media_types_are_refused() {
        let mut file = Part::text("");
        file.content = PartContent::Url("https://x/y.txt".into());
        assert_eq!(input_text(&send(vec![file])).unwrap_err().code(), -32005);
        let mut image = Part::text("");
        image.content = PartContent::Raw("aGVsbG8=".into());
        image.media_type = Some("image/png".into());
        assert_eq!(input_text(&send(vec![image])).unwrap_err().code(), -32005);
        let mut png = Part::text("x");
        png.media_type = Some("image/png".into());
        assert_eq!(input_text(&send(vec![png])).unwrap_err().code(), -32005);
        let mut p = send(vec![Part::text("x")]);
        p.accepted_output_modes = vec!["image/png".into()];
        assert_eq!(input_text(&p).unwrap_err().code(), -32005);
        p.accepted_output_modes = vec!["text/plain; charset=utf-8".into()];
        assert!(input_text(&p).is_ok());
    }

    #[test]
    fn an_empty_message_is_invalid() {
        assert_eq!(
            input_text(&send(vec![Part::text("  ")]))
                .unwrap_err()
                .code(),
            -32602
        );
    }

    #[test]
    fn limits_are_checked() {
        assert_eq!(page_size(Some(150)).unwrap_err().code(), -32602);
        assert_eq!(page_size(Some(0)).unwrap_err().code(), -32602);
        assert_eq!(page_size(Some(10)).unwrap(), Some(10));
        assert_eq!(
            non_negative("historyLength", Some(-5)).unwrap_err().code(),
            -32602
        );
    }
}
