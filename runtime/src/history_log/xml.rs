//! Export of a JSONL history to the older XML format (T4: "an XML export remains possible").
//!
//! ```xml
//! <session id="…" started="…">
//!   <turn index="1" status="ok" conversation="…">
//!     <user>…</user>
//!     <step index="1">
//!       <assistant>…</assistant>
//!       <action tool="shell">{"command":["ls"]}</action>
//!       <observation tool="shell" error="false">…</observation>
//!     </step>
//!     <final>…</final>
//!   </turn>
//! </session>
//! ```
//!
//! Turns are grouped by number whatever the conversations' interleaving, in turn order; steps
//! in step order. Chunks are left out (the `assistant` line holds the whole text), and so are
//! approvals and warnings; `error` lines become `<error kind="…">` in their step (or their
//! turn). A turn without `turn_end` gets `status="incomplete"`. Lines of types this module
//! does not know are skipped, so newer files still export.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use troupe_proto::AgentError;

/// The XML of the history file at `jsonl`. Reads the file synchronously: call it from a
/// blocking context.
pub fn export_xml(jsonl: &Path) -> Result<String, AgentError> {
    let file = std::fs::File::open(jsonl).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => AgentError::not_found("history file", jsonl.display()),
        _ => AgentError::internal(format!("open {}: {e}", jsonl.display())),
    })?;
    export_xml_from_lines(std::io::BufReader::new(file))
}

/// The XML of JSONL history lines. A line that is not a history line is `InvalidInput`
/// naming its (1-based) number; blank lines are skipped.
pub fn export_xml_from_lines(lines: impl BufRead) -> Result<String, AgentError> {
    let mut doc = Document::default();
    for (index, line) in lines.lines().enumerate() {
        let number = index + 1;
        let line = line.map_err(|e| AgentError::invalid(format!("line {number}: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(&line)
            .map_err(|e| AgentError::invalid(format!("line {number}: {e}")))?;
        doc.add(line);
    }
    if doc.session_id.is_empty() {
        return Err(AgentError::invalid("empty history: no lines"));
    }
    Ok(doc.render())
}

/// A history line, loosely typed so that unknown types and meta keys still parse.
#[derive(Deserialize)]
struct Line {
    ts: String,
    session_id: String,
    turn: u32,
    step: u32,
    #[serde(rename = "type")]
    kind: String,
    content: String,
    #[allow(dead_code)]
    role: String,
    meta: serde_json::Map<String, serde_json::Value>,
}

impl Line {
    fn meta_str(&self, key: &str) -> Option<&str> {
        self.meta.get(key).and_then(serde_json::Value::as_str)
    }
}

#[derive(Default)]
struct Document {
    session_id: String,
    started: String,
    saw_start: bool,
    turns: BTreeMap<u32, Turn>,
}

#[derive(Default)]
struct Turn {
    status: Option<String>,
    conversation: Option<String>,
    user: Option<String>,
    /// Items outside any step (step 0), such as an error before the first model call.
    loose: Vec<Item>,
    steps: BTreeMap<u32, Vec<Item>>,
    final_text: Option<String>,
}

enum Item {
    Assistant(String),
    Action {
        tool: String,
        args: String,
    },
    Observation {
        tool: String,
        error: bool,
        text: String,
    },
    Error {
        kind: String,
        text: String,
    },
}

impl Document {
    fn add(&mut self, line: Line) {
        if self.session_id.is_empty() {
            self.session_id = line.session_id.clone();
            self.started = line.ts.clone();
        }
        if line.kind == "session_start" && !self.saw_start {
            // The session began at its first `session_start`, whatever came before it.
            self.saw_start = true;
            self.started = line.ts.clone();
        }
        if line.turn == 0 {
            return;
        }
        let turn = self.turns.entry(line.turn).or_default();
        if turn.conversation.is_none() {
            turn.conversation = line.meta_str("conversation_id").map(str::to_owned);
        }
        let item = match line.kind.as_str() {
            "turn_start" => {
                turn.user = Some(line.content);
                return;
            }
            "final" => {
                turn.final_text = Some(line.content);
                return;
            }
            "turn_end" => {
                turn.status = Some(line.meta_str("status").unwrap_or("unknown").to_owned());
                return;
            }
            "assistant" => Item::Assistant(line.content),
            "action" => Item::Action {
                tool: line.meta_str("tool").unwrap_or_default().to_owned(),
                args: line.content,
            },
            "observation" => Item::Observation {
                tool: line.meta_str("tool").unwrap_or_default().to_owned(),
                error: line
                    .meta
                    .get("is_error")
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(false),
                text: line.content,
            },
            "error" => Item::Error {
                kind: line.meta_str("kind").unwrap_or("unknown").to_owned(),
                text: line.content,
            },
            _ => return,
        };
        match line.step {
            0 => turn.loose.push(item),
            step => turn.steps.entry(step).or_default().push(item),
        }
    }

    fn render(&self) -> String {
        let mut x = String::new();
        x.push_str("<session id=\"");
        escape(&self.session_id, &mut x);
        x.push_str("\" started=\"");
        escape(&self.started, &mut x);
        x.push_str("\">\n");
        for (index, turn) in &self.turns {
            x.push_str(&format!("  <turn index=\"{index}\" status=\""));
            escape(turn.status.as_deref().unwrap_or("incomplete"), &mut x);
            if let Some(c) = &turn.conversation {
                x.push_str("\" conversation=\"");
                escape(c, &mut x);
            }
            x.push_str("\">\n");
            if let Some(user) = &turn.user {
                element(&mut x, 4, "user", &[], user);
            }
            for item in &turn.loose {
                render_item(&mut x, 4, item);
            }
            for (step, items) in &turn.steps {
                x.push_str(&format!("    <step index=\"{step}\">\n"));
                for item in items {
                    render_item(&mut x, 6, item);
                }
                x.push_str("    </step>\n");
            }
            if let Some(text) = &turn.final_text {
                element(&mut x, 4, "final", &[], text);
            }
            x.push_str("  </turn>\n");
        }
        x.push_str("</session>\n");
        x
    }
}

fn render_item(x: &mut String, indent: usize, item: &Item) {
    match item {
        Item::Assistant(text) => element(x, indent, "assistant", &[], text),
        Item::Action { tool, args } => element(x, indent, "action", &[("tool", tool)], args),
        Item::Observation { tool, error, text } => {
            let error = if *error { "true" } else { "false" };
            element(
                x,
                indent,
                "observation",
                &[("tool", tool), ("error", error)],
                text,
            );
        }
        Item::Error { kind, text } => element(x, indent, "error", &[("kind", kind)], text),
    }
}

/// `<name a="v">text</name>` on its own line.
fn element(x: &mut String, indent: usize, name: &str, attrs: &[(&str, &str)], text: &str) {
    x.extend(std::iter::repeat_n(' ', indent));
    x.push('<');
    x.push_str(name);
    for (key, value) in attrs {
        x.push(' ');
        x.push_str(key);
        x.push_str("=\"");
        escape(value, x);
        x.push('"');
    }
    x.push('>');
    escape(text, x);
    x.push_str("</");
    x.push_str(name);
    x.push_str(">\n");
}

/// Escapes text for XML content and attribute values. Characters XML 1.0 cannot carry at
/// all (most C0 controls, such as the ESC of terminal colours in tool output) become U+FFFD;
/// a carriage return is kept as `&#13;`, which parsers would otherwise fold into `\n`.
pub fn escape(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\r' => out.push_str("&#13;"),
            '\t' | '\n' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
}
