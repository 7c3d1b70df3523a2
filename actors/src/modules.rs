//! Modules as a task sees them (A10): the port through which a dispatch reaches a module
//! (the service runs the gateways behind it), the `dispatch_module` tool, and the
//! supervisor's `dispatch_module` routing decision.
//!
//! A dispatch is governed like a tool call, once, under the stricter of `dispatch_module` and
//! the module's own name `module__<id>` ([`governed_name`]): so `deny = ["module__*"]` shuts
//! every module out, `allow` can name the ones an agent may reach, and a dispatch uses one
//! authorization token at most. The module's answer, or its timeout, is the observation.

use async_trait::async_trait;
use serde_json::{Value, json};
use troupe_proto::{AgentError, ConversationId, Json, TaskId, ToolSpec};

/// The tool a model calls to hand a request to a module.
pub const DISPATCH_MODULE_TOOL: &str = "dispatch_module";

/// A module a dispatch may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleTarget {
    pub id: String,
    pub description: String,
}

/// One dispatch to a module.
#[derive(Debug, Clone)]
pub struct ModuleDispatch {
    pub module: String,
    pub payload: Value,
    pub conversation_id: ConversationId,
    pub task_id: TaskId,
}

/// Why a dispatch did not get an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleDispatchError {
    /// No module of that id takes dispatches.
    Unknown(String),
    /// The module did not answer within its timeout.
    Timeout(String),
    /// It is down, refused, or answered with an error.
    Failed(String),
}

/// The modules of the process, as the session's tasks reach them.
#[async_trait]
pub trait ModulePort: Send + Sync + std::fmt::Debug + 'static {
    /// The modules a dispatch may reach (output and duplex ones), sorted by id.
    fn targets(&self) -> Vec<ModuleTarget>;
    /// Delivers the dispatch and waits for the module's answer (within its timeout).
    async fn dispatch(&self, dispatch: ModuleDispatch) -> Result<Value, ModuleDispatchError>;
}

/// The tool-policy name of a dispatch to `module`.
pub fn policy_name(module: &str) -> String {
    format!("module__{module}")
}

/// The one name a call is governed by: for a `dispatch_module` call that names a module, the
/// stricter of `dispatch_module` and `module__<id>`
/// ([`stricter_name`](crate::governance::stricter_name)); any other call, its own name.
pub fn governed_name(policy: &crate::governance::ToolPolicy, name: &str, args: &Value) -> String {
    match parse_dispatch_module(args) {
        Ok((module, _)) if name == DISPATCH_MODULE_TOOL => {
            crate::governance::stricter_name(policy, name, policy_name(&module))
        }
        _ => name.to_owned(),
    }
}

/// The `dispatch_module` tool, listing the modules in reach.
pub fn dispatch_module_tool(targets: &[ModuleTarget]) -> ToolSpec {
    let listing: Vec<String> = targets
        .iter()
        .map(|t| {
            if t.description.is_empty() {
                t.id.clone()
            } else {
                format!("{}: {}", t.id, t.description)
            }
        })
        .collect();
    ToolSpec {
        name: DISPATCH_MODULE_TOOL.to_owned(),
        description: format!(
            "Send a request to a module (an external worker or notification channel) and get \
             its answer. Modules: {}",
            listing.join("; ")
        ),
        parameters: Json(json!({
            "type": "object",
            "properties": {
                "module": {"type": "string", "enum": targets.iter().map(|t| t.id.as_str()).collect::<Vec<_>>()},
                "payload": {"description": "What the module is given: any JSON value (a string for plain text)."},
            },
            "required": ["module", "payload"],
            "additionalProperties": false,
        })),
    }
}

/// `(module, payload)` of a `dispatch_module` call.
pub fn parse_dispatch_module(args: &Value) -> Result<(String, Value), String> {
    let module = args
        .get("module")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| "dispatch_module needs `module`: a non-empty string".to_owned())?;
    let payload = args
        .get("payload")
        .cloned()
        .ok_or_else(|| "dispatch_module needs `payload`".to_owned())?;
    Ok((module.to_owned(), payload))
}

/// A module's answer as the model reads it: a string as is, anything else as JSON; at most
/// `cap` bytes of it (the task's `exec_output_cap`), a longer one cut with a marker saying so.
pub fn observation(answer: &Value, cap: usize) -> String {
    let mut text = match answer {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    if text.len() > cap {
        let total = text.len();
        let mut end = cap;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(&format!("\n[output truncated: {end} of {total} bytes]"));
    }
    text
}

impl ModuleDispatchError {
    /// The error a task reports for it (`dispatch_module` is the tool that failed).
    pub fn into_agent_error(self) -> AgentError {
        let message = match self {
            Self::Unknown(m) | Self::Timeout(m) | Self::Failed(m) => m,
        };
        AgentError::ToolError {
            name: DISPATCH_MODULE_TOOL.to_owned(),
            message,
        }
    }

    /// The metric label of its outcome.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Unknown(_) => "unknown",
            Self::Timeout(_) => "timeout",
            Self::Failed(_) => "failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_lists_its_modules_and_its_calls_parse() {
        let tool = dispatch_module_tool(&[
            ModuleTarget {
                id: "notify".into(),
                description: "posts to the team channel".into(),
            },
            ModuleTarget {
                id: "bare".into(),
                description: String::new(),
            },
        ]);
        assert_eq!(tool.name, "dispatch_module");
        assert!(
            tool.description
                .contains("notify: posts to the team channel; bare")
        );
        assert_eq!(
            tool.parameters.0["properties"]["module"]["enum"],
            json!(["notify", "bare"])
        );
        assert_eq!(
            parse_dispatch_module(&json!({"module": " notify ", "payload": {"a": 1}})).unwrap(),
            ("notify".to_owned(), json!({"a": 1}))
        );
        assert!(parse_dispatch_module(&json!({"payload": 1})).is_err());
        assert!(parse_dispatch_module(&json!({"module": "x"})).is_err());
        assert_eq!(observation(&json!("done"), 64), "done");
        assert_eq!(observation(&json!({"ok": true}), 64), r#"{"ok":true}"#);
        assert_eq!(policy_name("notify"), "module__notify");
    }

    #[test]
    fn a_dispatch_is_governed_once_under_the_stricter_name() {
        use crate::governance::task_policy;
        use troupe_proto::governance::ToolPolicyConfig;
        let policy = |config: ToolPolicyConfig| task_policy(&config, None, None, None);
        let call = json!({"module": "notify", "payload": "hi"});
        // Both need a token: the module's name, so one token use covers the dispatch.
        let both = policy(ToolPolicyConfig {
            authorization_required: vec!["*".into()],
            ..ToolPolicyConfig::default()
        });
        assert_eq!(
            governed_name(&both, DISPATCH_MODULE_TOOL, &call),
            "module__notify"
        );
        // Only the tool needs one: the tool's name.
        let tool = policy(ToolPolicyConfig {
            authorization_required: vec![DISPATCH_MODULE_TOOL.into()],
            ..ToolPolicyConfig::default()
        });
        assert_eq!(
            governed_name(&tool, DISPATCH_MODULE_TOOL, &call),
            DISPATCH_MODULE_TOOL
        );
        // A denied module wins over the tool's token.
        let denied = policy(ToolPolicyConfig {
            blacklist: vec!["module__*".into()],
            authorization_required: vec![DISPATCH_MODULE_TOOL.into()],
            ..ToolPolicyConfig::default()
        });
        assert_eq!(
            governed_name(&denied, DISPATCH_MODULE_TOOL, &call),
            "module__notify"
        );
        // No module named, or another tool: its own name.
        assert_eq!(
            governed_name(&both, DISPATCH_MODULE_TOOL, &json!({})),
            DISPATCH_MODULE_TOOL
        );
        assert_eq!(governed_name(&both, "shell", &call), "shell");
    }

    #[test]
    fn a_long_answer_reaches_the_model_cut_at_the_cap_with_a_marker() {
        let long = "é".repeat(100);
        let seen = observation(&json!(long), 51);
        assert_eq!(
            seen,
            format!("{}\n[output truncated: 50 of 200 bytes]", "é".repeat(25))
        );
        let seen = observation(&json!({"rows": vec![1; 1000]}), 20);
        assert!(seen.starts_with(r#"{"rows":[1,1,1"#), "{seen}");
        assert!(
            seen.ends_with("[output truncated: 20 of 2010 bytes]"),
            "{seen}"
        );
    }
}
