//! The text tool dialect (`ToolMode::Text`), for models without native tool calling: tools
//! are described in the instructions, the model calls one by replying
//! `<action tool="NAME">{json args}</action>` and finishes with `<final>answer</final>`;
//! past calls are shown to it as its own action tags and their outputs as
//! `<observation>…</observation>` user messages.

use troupe_proto::{AgentError, ToolSpec};

/// The instructions with the tool block and the dialect's rules appended. Without tools there
/// is nothing to call, so the instructions are left as they are.
pub fn instructions(base: &str, tools: &[ToolSpec]) -> String {
    if tools.is_empty() {
        return base.to_owned();
    }
    let mut out = String::with_capacity(base.len() + 512 * tools.len());
    out.push_str(base);
    if !base.is_empty() {
        out.push_str("\n\n");
    }
    out.push_str("# Tools\n\nYou can use these tools:\n");
    for tool in tools {
        out.push_str("\n## ");
        out.push_str(&tool.name);
        out.push('\n');
        if !tool.description.is_empty() {
            out.push_str(&tool.description);
            out.push('\n');
        }
        out.push_str("Arguments (JSON Schema): ");
        out.push_str(&tool.parameters.0.to_string());
        out.push('\n');
    }
    out.push_str(
        "\n# How to reply\n\
         To call a tool, reply with an action tag holding one JSON object of arguments:\n\
         <action tool=\"NAME\">{\"argument\": \"value\"}</action>\n\
         You may call several tools in one reply, one action tag each. Each result comes back \
         as <observation>…</observation>; never write observations yourself.\n\
         When you have the answer, reply with:\n\
         <final>your answer</final>\n",
    );
    out
}

/// How a past tool call is shown to the model: the action tag it would have written.
pub fn render_action(name: &str, arguments: &serde_json::Value) -> String {
    format!("<action tool=\"{name}\">{arguments}</action>")
}

/// How a tool's output is shown to the model.
pub fn render_observation(output: &str) -> String {
    format!("<observation>{output}</observation>")
}

/// One tool call found in a reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    pub tool: String,
    pub arguments: serde_json::Value,
}

/// A parsed reply.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Parsed {
    /// The `<final>` content; without one, the text outside the tags (the whole reply when it
    /// has no tags at all).
    pub text: String,
    pub actions: Vec<Action>,
}

const ACTION_OPEN: &str = "<action";
const ACTION_CLOSE: &str = "</action>";
const FINAL_OPEN: &str = "<final>";
const FINAL_CLOSE: &str = "</final>";
/// A model that writes its own observation is imagining the tool's answer; whatever follows
/// is not to be trusted.
const OBSERVATION_OPEN: &str = "<observation>";

/// Parses a complete reply. A tag that is opened and never closed, an action without a tool
/// name, or arguments that are not a JSON object are model errors.
pub fn parse(reply: &str) -> Result<Parsed, AgentError> {
    let mut outside = String::new();
    let mut finals: Vec<&str> = Vec::new();
    let mut actions = Vec::new();
    let mut rest = reply;
    loop {
        let next = [ACTION_OPEN, FINAL_OPEN, OBSERVATION_OPEN]
            .into_iter()
            .filter_map(|tag| rest.find(tag).map(|at| (at, tag)))
            .min_by_key(|&(at, _)| at);
        let Some((at, tag)) = next else {
            outside.push_str(rest);
            break;
        };
        outside.push_str(&rest[..at]);
        let after = &rest[at + tag.len()..];
        match tag {
            ACTION_OPEN => {
                let end_of_open = after
                    .find('>')
                    .ok_or_else(|| dialect_error("an <action> tag is not closed with '>'"))?;
                let tool = tool_attribute(&after[..end_of_open])?;
                let body_and_rest = &after[end_of_open + 1..];
                let close = body_and_rest.find(ACTION_CLOSE).ok_or_else(|| {
                    dialect_error(format!("<action tool=\"{tool}\"> has no </action>"))
                })?;
                let arguments = action_arguments(&tool, &body_and_rest[..close])?;
                actions.push(Action { tool, arguments });
                rest = &body_and_rest[close + ACTION_CLOSE.len()..];
            }
            FINAL_OPEN => {
                let close = after
                    .find(FINAL_CLOSE)
                    .ok_or_else(|| dialect_error("<final> has no </final>"))?;
                finals.push(after[..close].trim());
                rest = &after[close + FINAL_CLOSE.len()..];
            }
            _ => break,
        }
    }
    let text = if finals.is_empty() {
        outside.trim().to_owned()
    } else {
        finals.join("\n")
    };
    Ok(Parsed { text, actions })
}

fn dialect_error(message: impl std::fmt::Display) -> AgentError {
    AgentError::ModelError {
        message: format!("text tool dialect: {message}"),
        retryable: false,
    }
}

/// The `tool` attribute of an action tag (`tool="x"` or `tool='x'`).
fn tool_attribute(attributes: &str) -> Result<String, AgentError> {
    let missing = || dialect_error(format!("<action{attributes}> names no tool"));
    let at = attributes.find("tool").ok_or_else(missing)?;
    let value = attributes[at + "tool".len()..].trim_start();
    let value = value.strip_prefix('=').ok_or_else(missing)?.trim_start();
    let quote = value.chars().next().filter(|c| *c == '"' || *c == '\'');
    let quote = quote.ok_or_else(missing)?;
    let value = &value[1..];
    let end = value.find(quote).ok_or_else(missing)?;
    let name = value[..end].trim();
    if name.is_empty() {
        return Err(missing());
    }
    Ok(name.to_owned())
}

/// The JSON object inside an action; empty means no arguments. Models often wrap JSON in a
/// Markdown code fence, so one is removed.
fn action_arguments(tool: &str, body: &str) -> Result<serde_json::Value, AgentError> {
    let mut body = body.trim();
    if let Some(fenced) = body.strip_prefix("```") {
        let fenced = fenced.strip_prefix("json").unwrap_or(fenced);
        body = fenced.strip_suffix("```").unwrap_or(fenced).trim();
    }
    if body.is_empty() {
        return Ok(serde_json::Value::Object(serde_json::Map::new()));
    }
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(_) => Err(dialect_error(format!(
            "arguments of `{tool}` are not a JSON object"
        ))),
        Err(e) => Err(dialect_error(format!(
            "arguments of `{tool}` are not valid JSON: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use troupe_proto::Json;

    fn message(e: AgentError) -> String {
        match e {
            AgentError::ModelError { message, retryable } => {
                assert!(!retryable);
                message
            }
            other => panic!("not a model error: {other:?}"),
        }
    }

    #[test]
    fn plain_text_is_the_final_answer() {
        let p = parse("  The answer is 4.\n").unwrap();
        assert_eq!(p.text, "The answer is 4.");
        assert!(p.actions.is_empty());
    }

    #[test]
    fn final_tag_wins_over_text_outside() {
        let p = parse("Thinking it over.\n<final>\n 42 \n</final>\ntrailing").unwrap();
        assert_eq!(p.text, "42");
        assert!(p.actions.is_empty());
    }

    #[test]
    fn several_actions_with_whitespace_and_text_outside() {
        let reply = "I will add, then look.\n\
            <action tool=\"add\">\n  {\"a\": 2, \"b\": 3}\n</action>\n\n\
            <action  tool = 'fs__read' >```json\n{\"path\":\"x\"}\n```</action>\
            <action tool=\"now\"></action>";
        let p = parse(reply).unwrap();
        assert_eq!(p.text, "I will add, then look.");
        assert_eq!(
            p.actions,
            vec![
                Action {
                    tool: "add".into(),
                    arguments: json!({"a": 2, "b": 3})
                },
                Action {
                    tool: "fs__read".into(),
                    arguments: json!({"path": "x"})
                },
                Action {
                    tool: "now".into(),
                    arguments: json!({})
                },
            ]
        );
    }

    #[test]
    fn imagined_observations_are_cut_off() {
        let p = parse(
            "<action tool=\"add\">{\"a\":1}</action><observation>3</observation><final>3</final>",
        )
        .unwrap();
        assert_eq!(p.actions.len(), 1);
        assert_eq!(p.text, "");
    }

    #[test]
    fn missing_closing_tags_are_errors() {
        let m = message(parse("<action tool=\"add\">{\"a\":1}").unwrap_err());
        assert!(m.contains("</action>") && m.contains("add"), "{m}");
        let m = message(parse("ok <final>half an answer").unwrap_err());
        assert!(m.contains("</final>"), "{m}");
        let m = message(parse("<action tool=\"add\"").unwrap_err());
        assert!(m.contains("'>'"), "{m}");
    }

    #[test]
    fn bad_actions_are_errors_naming_the_tool() {
        let m = message(parse("<action tool=\"add\">{\"a\":</action>").unwrap_err());
        assert!(m.contains("`add`") && m.contains("not valid JSON"), "{m}");
        let m = message(parse("<action tool=\"add\">[1]</action>").unwrap_err());
        assert!(m.contains("not a JSON object"), "{m}");
        let m = message(parse("<action name=\"add\">{}</action>").unwrap_err());
        assert!(m.contains("names no tool"), "{m}");
        assert!(parse("<action tool=\"\">{}</action>").is_err());
    }

    #[test]
    fn instructions_describe_tools_and_rules() {
        let tools = [ToolSpec {
            name: "add".into(),
            description: "Adds two numbers".into(),
            parameters: Json(json!({"type": "object"})),
        }];
        let text = instructions("Be brief.", &tools);
        assert!(text.starts_with("Be brief.\n\n# Tools"));
        assert!(
            text.contains(
                "## add\nAdds two numbers\nArguments (JSON Schema): {\"type\":\"object\"}"
            )
        );
        assert!(text.contains("<action tool=\"NAME\">"));
        assert!(text.contains("<final>your answer</final>"));
        assert_eq!(instructions("Be brief.", &[]), "Be brief.");
        assert_eq!(
            render_action("add", &json!({"a": 1})),
            "<action tool=\"add\">{\"a\":1}</action>"
        );
        // What the dialect renders, it parses back.
        let p = parse(&render_action("add", &json!({"a": 1}))).unwrap();
        assert_eq!(p.actions[0].arguments, json!({"a": 1}));
    }
}
