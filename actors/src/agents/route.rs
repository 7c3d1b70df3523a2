//! Routing (A3): how an input reaches an agent, as plain functions.
//!
//! - `/hub <agent_id> <text>` goes straight to the agent ([`hub_command`]), no supervisor.
//! - Otherwise the supervisor decides. Its model is offered one tool, `route`
//!   ([`route_tool`]); its call is the decision ([`parse_route`]), and an answer without a
//!   call is a direct reply of that text. Without a model for routing the rules decide
//!   ([`rules_route`]): `@agent` at the start dispatches to that agent, anything else is
//!   answered directly.
//! - A model agent with agents in sight (the supervisor's turn, a super-agent) has the
//!   `dispatch_agent` tool ([`dispatch_tool`]) to delegate during its turn.

use serde_json::{Value, json};
use troupe_proto::agent::{AgentDefinition, RouteDecision, RouteSource};
use troupe_proto::{Json, ToolSpec};

/// The supervisor's decision tool.
pub const ROUTE_TOOL: &str = "route";
/// The delegation tool of a model agent with agents in sight.
pub const DISPATCH_TOOL: &str = "dispatch_agent";
/// The command that bypasses the supervisor.
pub const HUB_COMMAND: &str = "/hub";

/// An agent as a dispatcher sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibleAgent {
    pub id: String,
    pub role: String,
    /// When to use it.
    pub summary: String,
}

impl VisibleAgent {
    pub fn of(def: &AgentDefinition) -> Self {
        Self {
            id: def.id.clone(),
            role: def.role.clone(),
            summary: def.summary().to_owned(),
        }
    }
}

/// A decision about one input.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub decision: RouteDecision,
    pub agent_id: Option<String>,
    pub module: Option<String>,
    /// What the agent or module is given (default: the input itself).
    pub input: Option<String>,
    /// A direct reply's text; `None`: the supervisor's conversation answers with its tools.
    pub reply: Option<String>,
    /// What `ask_human` asks.
    pub question: Option<String>,
    pub reason: String,
    /// 0 to 1.
    pub confidence: f64,
    pub source: RouteSource,
}

impl Route {
    fn new(decision: RouteDecision, confidence: f64, source: RouteSource) -> Self {
        Self {
            decision,
            agent_id: None,
            module: None,
            input: None,
            reply: None,
            question: None,
            reason: String::new(),
            confidence,
            source,
        }
    }

    /// A dispatch of `input` to `agent_id`.
    pub fn dispatch(agent_id: &str, input: &str, confidence: f64, source: RouteSource) -> Self {
        Self {
            agent_id: Some(agent_id.to_owned()),
            input: Some(input.to_owned()),
            ..Self::new(RouteDecision::DispatchAgent, confidence, source)
        }
    }

    /// Answered by the supervisor: with `reply`, or by its conversation's turn.
    pub fn direct(reply: Option<String>, confidence: f64, source: RouteSource) -> Self {
        Self {
            reply,
            ..Self::new(RouteDecision::DirectReply, confidence, source)
        }
    }

    #[must_use]
    pub fn because(mut self, reason: impl Into<String>) -> Self {
        self.reason = reason.into();
        self
    }
}

/// `/hub <agent_id> <text>`: `None` when the input is not a hub command; an error saying how
/// to write one when it is malformed.
pub fn hub_command(input: &str) -> Option<Result<(String, String), String>> {
    let rest = input.trim_start().strip_prefix(HUB_COMMAND)?;
    if !(rest.is_empty() || rest.starts_with(char::is_whitespace)) {
        return None; // `/hubble` is not the command
    }
    let rest = rest.trim_start();
    let (agent, text) = rest
        .split_once(char::is_whitespace)
        .map_or((rest, ""), |(a, t)| (a, t.trim()));
    if agent.is_empty() || text.is_empty() {
        return Some(Err("usage: /hub <agent_id> <text>".to_owned()));
    }
    Some(Ok((agent.to_owned(), text.to_owned())))
}

/// The rules, when no model routes: `@agent rest` (an agent in sight) dispatches `rest` to
/// it; anything else is answered directly by the supervisor's conversation.
pub fn rules_route(input: &str, visible: &[VisibleAgent]) -> Route {
    let trimmed = input.trim_start();
    if let Some(mention) = trimmed.strip_prefix('@') {
        let (agent, rest) = mention
            .split_once(char::is_whitespace)
            .map_or((mention, ""), |(a, r)| (a, r.trim()));
        if let Some(agent) = visible.iter().find(|a| a.id == agent) {
            let text = if rest.is_empty() { input } else { rest };
            return Route::dispatch(&agent.id, text, 1.0, RouteSource::Rules)
                .because(format!("the input names @{}", agent.id));
        }
    }
    Route::direct(None, 0.5, RouteSource::Rules).because("no agent is named: answered directly")
}

/// The supervisor's `route` tool: its arguments are the decision.
pub fn route_tool(visible: &[VisibleAgent]) -> ToolSpec {
    let ids: Vec<&str> = visible.iter().map(|a| a.id.as_str()).collect();
    let mut agent_id =
        json!({"type": "string", "description": "The agent to dispatch to (dispatch_agent)."});
    if !ids.is_empty() {
        agent_id["enum"] = json!(ids);
    }
    ToolSpec {
        name: ROUTE_TOOL.to_owned(),
        description: "Decide what to do with the user's message: reply directly, dispatch it to \
                      one of the agents, dispatch it to a module, ask the human a question, or \
                      reject it. Call it exactly once."
            .to_owned(),
        parameters: Json(json!({
            "type": "object",
            "properties": {
                "decision": {
                    "type": "string",
                    "enum": RouteDecision::ALL.map(RouteDecision::as_str),
                },
                "agent_id": agent_id,
                "module": {"type": "string", "description": "The module (dispatch_module)."},
                "input": {"type": "string", "description": "What the agent or module is given; default: the user's message."},
                "reply": {"type": "string", "description": "The answer (direct_reply); leave it out to answer with your tools."},
                "question": {"type": "string", "description": "What to ask the human (ask_human)."},
                "reason": {"type": "string", "description": "Why, in one sentence."},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["decision", "confidence"],
            "additionalProperties": false,
        })),
    }
}

/// The decision a `route` call's arguments hold; an error naming what is wrong (an unknown
/// decision, a dispatch without its agent, a confidence out of range).
pub fn parse_route(args: &Value) -> Result<Route, String> {
    let text = |key: &str| {
        args.get(key)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let decision = args
        .get("decision")
        .and_then(Value::as_str)
        .ok_or_else(|| "route needs `decision`".to_owned())?;
    let decision = RouteDecision::parse(decision).ok_or_else(|| {
        format!(
            "`{decision}` is not a decision ({})",
            RouteDecision::ALL.map(RouteDecision::as_str).join(", ")
        )
    })?;
    let confidence = match args.get("confidence") {
        None | Some(Value::Null) => 1.0,
        Some(v) => v
            .as_f64()
            .filter(|c| (0.0..=1.0).contains(c))
            .ok_or_else(|| format!("`confidence` must be a number from 0 to 1, not {v}"))?,
    };
    let route = Route {
        decision,
        agent_id: text("agent_id"),
        module: text("module"),
        input: text("input"),
        reply: text("reply"),
        question: text("question"),
        reason: text("reason").unwrap_or_default(),
        confidence,
        source: RouteSource::Model,
    };
    match decision {
        RouteDecision::DispatchAgent if route.agent_id.is_none() => {
            Err("dispatch_agent needs `agent_id`".to_owned())
        }
        RouteDecision::DispatchModule if route.module.is_none() => {
            Err("dispatch_module needs `module`".to_owned())
        }
        RouteDecision::AskHuman if route.question.is_none() => {
            Err("ask_human needs `question`".to_owned())
        }
        _ => Ok(route),
    }
}

/// The system prompt of the supervisor's routing step: its own instructions, then the agents
/// it may dispatch to.
pub fn router_instructions(own: Option<&str>, visible: &[VisibleAgent]) -> String {
    let mut out = String::new();
    if let Some(own) = own.filter(|s| !s.trim().is_empty()) {
        out.push_str(own.trim());
        out.push_str("\n\n");
    }
    out.push_str(
        "You are the supervisor of a team of agents. For the user's latest message, call the \
         `route` tool once with your decision: `direct_reply` (answer it yourself; give the \
         answer as `reply`, or leave `reply` out to work on it with your own tools), \
         `dispatch_agent` (hand it to one agent: `agent_id`, and `input` if the agent needs \
         it worded differently), `dispatch_module`, `ask_human` (a `question` when the request \
         is unclear) or `reject` (with a `reason`). Give your `confidence` from 0 to 1.\n",
    );
    if visible.is_empty() {
        out.push_str("\nNo agents are available.\n");
    } else {
        out.push_str("\nAgents:\n");
        for a in visible {
            out.push_str(&format!("- {} ({}): {}\n", a.id, a.role, a.summary));
        }
    }
    out
}

/// The `dispatch_agent` tool of a model agent with agents in sight.
pub fn dispatch_tool(visible: &[VisibleAgent]) -> ToolSpec {
    let listing: Vec<String> = visible
        .iter()
        .map(|a| format!("{} ({}): {}", a.id, a.role, a.summary))
        .collect();
    ToolSpec {
        name: DISPATCH_TOOL.to_owned(),
        description: format!(
            "Hand a task to another agent and get its answer. Agents: {}",
            listing.join("; ")
        ),
        parameters: Json(json!({
            "type": "object",
            "properties": {
                "agent_id": {"type": "string", "enum": visible.iter().map(|a| a.id.as_str()).collect::<Vec<_>>()},
                "input": {"type": "string", "description": "What the agent should do, with everything it needs to know."},
            },
            "required": ["agent_id", "input"],
            "additionalProperties": false,
        })),
    }
}

/// `(agent_id, input)` of a `dispatch_agent` call.
pub fn parse_dispatch(args: &Value) -> Result<(String, String), String> {
    let field = |key: &str| {
        args.get(key)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| format!("dispatch_agent needs `{key}`: a non-empty string"))
    };
    Ok((field("agent_id")?, field("input")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agents() -> Vec<VisibleAgent> {
        ["coder", "reviewer"]
            .iter()
            .map(|id| VisibleAgent {
                id: (*id).into(),
                role: "r".into(),
                summary: "s".into(),
            })
            .collect()
    }

    #[test]
    fn hub_commands_parse_or_say_how_to_write_one() {
        assert_eq!(
            hub_command("/hub coder fix the bug\nplease"),
            Some(Ok(("coder".into(), "fix the bug\nplease".into())))
        );
        assert_eq!(
            hub_command("  /hub  reviewer   look "),
            Some(Ok(("reviewer".into(), "look".into())))
        );
        assert!(hub_command("/hub coder").unwrap().is_err());
        assert!(hub_command("/hub").unwrap().is_err());
        assert_eq!(hub_command("/hubble x y"), None);
        assert_eq!(hub_command("hello /hub x y"), None);
    }

    #[test]
    fn rules_dispatch_a_mention_and_answer_the_rest() {
        let r = rules_route("@coder write a test", &agents());
        assert_eq!(r.decision, RouteDecision::DispatchAgent);
        assert_eq!(r.agent_id.as_deref(), Some("coder"));
        assert_eq!(r.input.as_deref(), Some("write a test"));
        assert_eq!(r.source, RouteSource::Rules);
        let r = rules_route("@ghost write a test", &agents());
        assert_eq!(r.decision, RouteDecision::DirectReply);
        assert_eq!(r.reply, None);
        assert_eq!(
            rules_route("hello", &agents()).decision,
            RouteDecision::DirectReply
        );
    }

    #[test]
    fn route_calls_parse_with_their_confidence() {
        let r = parse_route(&json!({"decision": "dispatch_agent", "agent_id": "coder", "confidence": 0.8, "reason": "code"})).unwrap();
        assert_eq!(
            (r.decision, r.agent_id.as_deref(), r.confidence),
            (RouteDecision::DispatchAgent, Some("coder"), 0.8)
        );
        assert_eq!(r.source, RouteSource::Model);
        let r = parse_route(&json!({"decision": "direct_reply", "reply": "Hi!", "confidence": 1}))
            .unwrap();
        assert_eq!(r.reply.as_deref(), Some("Hi!"));
        assert!(
            parse_route(&json!({"decision": "dispatch_agent", "confidence": 0.5}))
                .unwrap_err()
                .contains("agent_id")
        );
        assert!(
            parse_route(&json!({"decision": "maybe", "confidence": 0.5}))
                .unwrap_err()
                .contains("maybe")
        );
        assert!(
            parse_route(&json!({"decision": "reject", "confidence": 7}))
                .unwrap_err()
                .contains("confidence")
        );
        assert!(parse_route(&json!({"decision": "ask_human", "confidence": 0.5})).is_err());
        assert!(parse_route(&json!({})).is_err());
    }

    #[test]
    fn the_tools_list_what_may_be_chosen() {
        let spec = route_tool(&agents());
        assert_eq!(spec.name, "route");
        assert_eq!(
            spec.parameters.0["properties"]["agent_id"]["enum"],
            json!(["coder", "reviewer"])
        );
        assert_eq!(
            spec.parameters.0["properties"]["decision"]["enum"]
                .as_array()
                .unwrap()
                .len(),
            5
        );
        let d = dispatch_tool(&agents());
        assert_eq!(d.name, "dispatch_agent");
        assert!(d.description.contains("coder (r): s"));
        assert_eq!(
            parse_dispatch(&json!({"agent_id": "coder", "input": "x"})).unwrap(),
            ("coder".into(), "x".into())
        );
        assert!(parse_dispatch(&json!({"agent_id": "coder"})).is_err());
        let prompt = router_instructions(Some("Be terse."), &agents());
        assert!(prompt.starts_with("Be terse.") && prompt.contains("- reviewer (r): s"));
    }
}
