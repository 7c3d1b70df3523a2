//! What an external ACP agent does during a turn, as troupe sees it: [`AcpEvent`] (one per
//! `session/update` worth keeping, and one per permission asked and answered), and the
//! permission request a [`PermissionHandler`](crate::PermissionHandler) decides on.
//!
//! The ACP schema's own types stay inside this crate: callers get these plain, serialisable
//! values, which keep the fields troupe records and shows (ids, titles, kinds and statuses as
//! the protocol's snake_case names, raw input and output as JSON).

use agent_client_protocol::v1::schema as acp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One thing the agent did during a turn, in the order it reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AcpEvent {
    /// A piece of the agent's reply (`agent_message_chunk`, text content).
    MessageChunk { text: String },
    /// A piece of the agent's reasoning (`agent_thought_chunk`, text content).
    ThoughtChunk { text: String },
    /// The agent started a tool call (`tool_call`).
    ToolCall {
        tool_call_id: String,
        title: String,
        /// `read`, `edit`, `execute`, ... (`other` when the agent says nothing).
        kind: String,
        /// `pending`, `in_progress`, `completed` or `failed`.
        status: String,
        raw_input: Option<Value>,
    },
    /// A tool call moved on (`tool_call_update`): only what changed is set.
    ToolCallUpdate {
        tool_call_id: String,
        status: Option<String>,
        title: Option<String>,
        /// A kind the update changes (it usually does not).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<String>,
        /// An input the update changes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raw_input: Option<Value>,
        /// The text of its content blocks, joined by newlines (diffs as `path` lines).
        output: Option<String>,
        raw_output: Option<Value>,
    },
    /// The agent's plan, whole (`plan`).
    Plan { entries: Vec<PlanEntry> },
    /// Context use (`usage_update`): tokens in context and the window's size.
    Usage { used: u64, size: u64 },
    /// The agent asked permission for a tool call (`session/request_permission`).
    PermissionRequested(PermissionRequest),
    /// How that request was answered.
    PermissionAnswered {
        tool_call_id: String,
        decision: PermissionDecision,
    },
}

/// One entry of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanEntry {
    pub content: String,
    /// `pending`, `in_progress` or `completed`.
    pub status: String,
    /// `high`, `medium` or `low`.
    pub priority: String,
}

/// A `session/request_permission` from the agent, as the handler sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PermissionRequest {
    /// The agent's session the request belongs to.
    pub session_id: String,
    pub tool_call_id: String,
    /// What the agent wants to do, in its words (e.g. the command line).
    pub title: Option<String>,
    /// `execute`, `edit`, ... when the agent says.
    pub kind: Option<String>,
    /// The tool call's input (for a command: its argv or command line).
    pub raw_input: Option<Value>,
    /// The choices the agent offers.
    pub options: Vec<PermissionChoice>,
}

/// One option of a permission request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionChoice {
    pub option_id: String,
    pub name: String,
    /// `allow_once`, `allow_always`, `reject_once` or `reject_always`.
    pub kind: String,
}

/// A handler's answer, in the protocol's four kinds (or no answer at all). The client picks
/// the agent's option of that kind; when the agent offers none of it, the nearest one in the
/// same direction (`allow_always` for `allow_once` and back; likewise for reject), and
/// `cancelled` when there is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionDecision {
    AllowOnce,
    AllowAlways,
    RejectOnce,
    RejectAlways,
    /// No decision (the turn is being cancelled, nobody can answer).
    Cancelled,
}

impl PermissionDecision {
    pub const ALL: [Self; 5] = [
        Self::AllowOnce,
        Self::AllowAlways,
        Self::RejectOnce,
        Self::RejectAlways,
        Self::Cancelled,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AllowOnce => "allow_once",
            Self::AllowAlways => "allow_always",
            Self::RejectOnce => "reject_once",
            Self::RejectAlways => "reject_always",
            Self::Cancelled => "cancelled",
        }
    }

    pub const fn allows(self) -> bool {
        matches!(self, Self::AllowOnce | Self::AllowAlways)
    }
}

/// The option that carries `decision` among `options`: its kind, else a narrower one of the
/// same direction (`allow_once` for an always, a rejection of either kind); never a wider
/// grant (a one-time approval is never answered `allow_always`, which would let the agent
/// run it again unasked). `None` (the request answered cancelled, a denial) for `Cancelled`
/// or when the agent offers nothing that fits.
pub fn choose_option(options: &[PermissionChoice], decision: PermissionDecision) -> Option<&str> {
    let preference: &[&str] = match decision {
        PermissionDecision::AllowOnce => &["allow_once"],
        PermissionDecision::AllowAlways => &["allow_always", "allow_once"],
        PermissionDecision::RejectOnce => &["reject_once", "reject_always"],
        PermissionDecision::RejectAlways => &["reject_always", "reject_once"],
        PermissionDecision::Cancelled => &[],
    };
    preference.iter().find_map(|kind| {
        options
            .iter()
            .find(|o| o.kind == *kind)
            .map(|o| o.option_id.as_str())
    })
}

/// The snake_case name serde gives a schema enum value (`ToolKind::Execute` -> `execute`).
fn name_of<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        _ => String::from("other"),
    }
}

fn text_of(block: &acp::ContentBlock) -> Option<&str> {
    match block {
        acp::ContentBlock::Text(t) => Some(&t.text),
        _ => None,
    }
}

fn tool_output(content: &[acp::ToolCallContent]) -> String {
    let mut lines = Vec::new();
    for item in content {
        match item {
            acp::ToolCallContent::Content(c) => {
                if let Some(text) = text_of(&c.content) {
                    lines.push(text.to_owned());
                }
            }
            acp::ToolCallContent::Diff(d) => lines.push(format!("diff {}", d.path.display())),
            acp::ToolCallContent::Terminal(t) => lines.push(format!("terminal {}", t.terminal_id)),
            _ => {}
        }
    }
    lines.join("\n")
}

impl AcpEvent {
    /// The event a `session/update` carries; `None` for updates troupe does not keep (the
    /// user's own message echoed back, command lists, modes, config options, ...).
    pub(crate) fn from_update(update: &acp::SessionUpdate) -> Option<Self> {
        Some(match update {
            acp::SessionUpdate::AgentMessageChunk(c) => Self::MessageChunk {
                text: text_of(&c.content)?.to_owned(),
            },
            acp::SessionUpdate::AgentThoughtChunk(c) => Self::ThoughtChunk {
                text: text_of(&c.content)?.to_owned(),
            },
            acp::SessionUpdate::ToolCall(t) => Self::ToolCall {
                tool_call_id: t.tool_call_id.0.to_string(),
                title: t.title.clone(),
                kind: name_of(&t.kind),
                status: name_of(&t.status),
                raw_input: t.raw_input.clone(),
            },
            acp::SessionUpdate::ToolCallUpdate(u) => Self::ToolCallUpdate {
                tool_call_id: u.tool_call_id.0.to_string(),
                status: u.fields.status.as_ref().map(name_of),
                title: u.fields.title.clone(),
                kind: u.fields.kind.as_ref().map(name_of),
                raw_input: u.fields.raw_input.clone(),
                output: u.fields.content.as_deref().map(tool_output),
                raw_output: u.fields.raw_output.clone(),
            },
            acp::SessionUpdate::Plan(p) => Self::Plan {
                entries: p
                    .entries
                    .iter()
                    .map(|e| PlanEntry {
                        content: e.content.clone(),
                        status: name_of(&e.status),
                        priority: name_of(&e.priority),
                    })
                    .collect(),
            },
            acp::SessionUpdate::UsageUpdate(u) => Self::Usage {
                used: u.used,
                size: u.size,
            },
            _ => return None,
        })
    }
}

impl PermissionRequest {
    pub(crate) fn from_acp(r: &acp::RequestPermissionRequest) -> Self {
        let fields = &r.tool_call.fields;
        Self {
            session_id: r.session_id.0.to_string(),
            tool_call_id: r.tool_call.tool_call_id.0.to_string(),
            title: fields.title.clone(),
            kind: fields.kind.as_ref().map(name_of),
            raw_input: fields.raw_input.clone(),
            options: r
                .options
                .iter()
                .map(|o| PermissionChoice {
                    option_id: o.option_id.0.to_string(),
                    name: o.name.clone(),
                    kind: name_of(&o.kind),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn choices(kinds: &[&str]) -> Vec<PermissionChoice> {
        kinds
            .iter()
            .map(|k| PermissionChoice {
                option_id: format!("opt-{k}"),
                name: (*k).to_owned(),
                kind: (*k).to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_decision_picks_its_kind_then_its_direction() {
        let all = choices(&["allow_once", "allow_always", "reject_once"]);
        assert_eq!(
            choose_option(&all, PermissionDecision::AllowOnce),
            Some("opt-allow_once")
        );
        assert_eq!(
            choose_option(&all, PermissionDecision::RejectAlways),
            Some("opt-reject_once")
        );
        let only_always = choices(&["allow_always"]);
        // Never wider than decided: a one-time approval is not a standing one.
        assert_eq!(
            choose_option(&only_always, PermissionDecision::AllowOnce),
            None
        );
        assert_eq!(
            choose_option(&only_always, PermissionDecision::AllowAlways),
            Some("opt-allow_always")
        );
        assert_eq!(
            choose_option(&choices(&["allow_once"]), PermissionDecision::AllowAlways),
            Some("opt-allow_once")
        );
        assert_eq!(
            choose_option(&only_always, PermissionDecision::RejectOnce),
            None
        );
        assert_eq!(choose_option(&all, PermissionDecision::Cancelled), None);
    }

    #[test]
    fn updates_from_the_wire_become_events() {
        let wire = json!([
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Hi"}},
            {"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "touch x",
             "kind": "execute", "status": "pending", "rawInput": {"cmd": "touch x"}},
            {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed",
             "content": [{"type": "content", "content": {"type": "text", "text": "done"}}]},
            {"sessionUpdate": "plan", "entries": [
                {"content": "step", "priority": "high", "status": "in_progress"}]},
            {"sessionUpdate": "usage_update", "used": 14, "size": 258400},
            {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "q"}}
        ]);
        let updates: Vec<acp::SessionUpdate> = serde_json::from_value(wire).unwrap();
        let events: Vec<AcpEvent> = updates.iter().filter_map(AcpEvent::from_update).collect();
        assert_eq!(
            serde_json::to_value(&events).unwrap(),
            json!([
                {"type": "message_chunk", "text": "Hi"},
                {"type": "tool_call", "tool_call_id": "c1", "title": "touch x",
                 "kind": "execute", "status": "pending", "raw_input": {"cmd": "touch x"}},
                {"type": "tool_call_update", "tool_call_id": "c1", "status": "completed",
                 "title": null, "output": "done", "raw_output": null},
                {"type": "plan", "entries": [
                    {"content": "step", "status": "in_progress", "priority": "high"}]},
                {"type": "usage", "used": 14, "size": 258400}
            ])
        );
    }
}
