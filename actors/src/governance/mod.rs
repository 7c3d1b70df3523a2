//! Tool governance (A5): which tools a task may call, enforced where calls are dispatched,
//! not in the prompt.
//!
//! A task computes its [`TaskGovernance`] once, before its first step ([`of_task`]): the
//! effective [`ToolPolicy`] of its layers (the session's `[tools]` and the role's, its
//! agent's file, its message's request) and of the task that dispatched it, and the
//! authorization tokens its message presented (or its dispatcher's). Then:
//! - a tool the policy denies is not offered to the model ([`offered`]);
//! - a call to a denied tool (one the model made up, one a sub-agent tries, an MCP tool that
//!   appeared after the list was made) is refused before anything runs, with a
//!   `policy_rejected` event and an observation that says which layer denied it;
//! - what the task dispatches carries its governance, so a sub-agent's rights are the
//!   intersection of its own and its dispatcher's.

pub mod guardrail;
pub mod metrics;
pub mod policy;
pub mod tokens;

pub use policy::{Clause, Denial, ToolPolicy, ToolVerdict, effective, glob, normalize};

use troupe_proto::ToolSpec;
use troupe_proto::agent::{AgentDefinition, ToolRules};
use troupe_proto::governance::{PolicyLayer, ToolPolicyConfig};

/// What a task carries of tool governance, and passes on to what it dispatches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskGovernance {
    pub policy: ToolPolicy,
    /// Digests of the authorization tokens presented with the task's message (or its
    /// dispatcher's): never the tokens themselves.
    pub authorization: Vec<String>,
    /// The approval and sandbox policies the task's commands run under: an in-process agent
    /// it dispatches to runs its own under policies no wider (C2).
    pub approval_policy: troupe_proto::ApprovalPolicy,
    pub sandbox_policy: troupe_proto::SandboxPolicy,
}

/// What is kept of an authorization token: its SHA-256, in hex. The token itself is never
/// stored, recorded or logged.
pub fn token_digest(token: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What a message brings to tool governance once it is inside troupe: its request layer,
/// and the digests of the tokens it presented (the tokens themselves stop at the API).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestGovernance {
    pub tools: Option<ToolRules>,
    pub authorization: Vec<String>,
    /// The text came from a program (an A2A peer, a module), not from a person: a `/hub` in
    /// it is no human's choice, but a dispatch governed as the supervisor's
    /// `dispatch_agent` would be (its policy layers, its workers).
    pub peer: bool,
}

impl From<troupe_proto::governance::MessageOptions> for RequestGovernance {
    fn from(options: troupe_proto::governance::MessageOptions) -> Self {
        Self {
            tools: options.tools.filter(|t| !t.is_empty()),
            authorization: options
                .authorization
                .iter()
                .map(|t| token_digest(t.trim()))
                .collect(),
            peer: false,
        }
    }
}

/// The task's own agent, as its file says (`None` for the session's own conversation).
#[derive(Debug, Clone, Copy)]
pub struct AgentLayer<'a> {
    pub id: &'a str,
    pub role: &'a str,
    pub tools: &'a ToolRules,
}

/// A task's policy: global, its agent's role, its agent, its request, and its parent's.
pub fn task_policy(
    config: &ToolPolicyConfig,
    agent: Option<AgentLayer<'_>>,
    request: Option<&ToolRules>,
    parent: Option<&ToolPolicy>,
) -> ToolPolicy {
    let role = agent.and_then(|a| {
        config
            .roles
            .get(a.role)
            .and_then(|rules| Clause::of(PolicyLayer::Role, a.role, rules))
    });
    effective(
        &[
            Clause::of(PolicyLayer::Global, "", &config.global()),
            role,
            agent.and_then(|a| Clause::of(PolicyLayer::Agent, a.id, a.tools)),
            request.and_then(|r| Clause::of(PolicyLayer::Request, "", r)),
        ],
        parent,
    )
}

/// The governance an external agent's tool calls answer to (an ACP agent's permission
/// requests): the layers of its own file (its role's `[tools.roles.<role>]`, its `tools`)
/// over its dispatcher's policy, which holds the global and request layers, so that the
/// agent gets no more than its dispatcher; and the tokens its dispatcher was given.
pub fn external_agent(
    config: &ToolPolicyConfig,
    definition: &AgentDefinition,
    dispatcher: &TaskGovernance,
) -> TaskGovernance {
    TaskGovernance {
        policy: task_policy(
            config,
            Some(AgentLayer {
                id: &definition.id,
                role: &definition.role,
                tools: &definition.tools,
            }),
            None,
            Some(&dispatcher.policy),
        ),
        authorization: dispatcher.authorization.clone(),
        approval_policy: dispatcher.approval_policy,
        sandbox_policy: dispatcher.sandbox_policy,
    }
}

/// Of a call's own tool name and the qualified name of what it reaches (a capability's
/// `capability__<id>`, a module's `module__<id>`), the one the policy decides the call by,
/// so that it is decided once (one decision counted, one token use at most): the stricter
/// (denied over needing a token over allowed; on a tie the qualified name, which tokens
/// name).
pub fn stricter_name(policy: &ToolPolicy, name: &str, qualified: String) -> String {
    let rank = |verdict: ToolVerdict| match verdict {
        ToolVerdict::Denied(_) => 2,
        ToolVerdict::Allowed {
            authorization: Some(_),
        } => 1,
        ToolVerdict::Allowed {
            authorization: None,
        } => 0,
    };
    if rank(policy.decide(name)) > rank(policy.decide(&qualified)) {
        name.to_owned()
    } else {
        qualified
    }
}

/// The tools offered to the model: those the policy allows, in their order.
pub fn offered(tools: Vec<ToolSpec>, policy: &ToolPolicy) -> (Vec<ToolSpec>, Vec<String>) {
    if policy.is_open() {
        return (tools, Vec::new());
    }
    let mut withheld = Vec::new();
    let kept = tools
        .into_iter()
        .filter(|t| {
            let allowed = policy.decide(&t.name).is_allowed();
            if !allowed {
                withheld.push(t.name.clone());
            }
            allowed
        })
        .collect();
    (kept, withheld)
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::Json;

    fn spec(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: Json(serde_json::json!({"type": "object"})),
        }
    }

    #[test]
    fn a_role_layer_applies_to_agents_of_that_role_only() {
        let config: ToolPolicyConfig = serde_json::from_value(serde_json::json!({
            "blacklist": ["git__push"],
            "roles": {"reviewer": {"whitelist": ["files__read_*"]}}
        }))
        .unwrap();
        let none = ToolRules::default();
        let reviewer = task_policy(
            &config,
            Some(AgentLayer {
                id: "rev",
                role: "reviewer",
                tools: &none,
            }),
            None,
            None,
        );
        assert!(!reviewer.decide("shell").is_allowed());
        assert!(reviewer.decide("files__read_file").is_allowed());
        let coder = task_policy(
            &config,
            Some(AgentLayer {
                id: "coder",
                role: "executor",
                tools: &none,
            }),
            None,
            None,
        );
        assert!(coder.decide("shell").is_allowed());
        assert!(!coder.decide("git__push").is_allowed());
        let root = task_policy(&config, None, None, None);
        assert!(!root.decide("git__push").is_allowed());
        assert!(task_policy(&ToolPolicyConfig::default(), None, None, None).is_open());
    }

    #[test]
    fn an_external_agent_answers_to_its_own_layers_and_its_dispatchers() {
        let config: ToolPolicyConfig = serde_json::from_value(serde_json::json!({
            "roles": {"reviewer": {"blacklist": ["apply_patch"]}}
        }))
        .unwrap();
        let definition: AgentDefinition = serde_json::from_value(serde_json::json!({
            "id": "codex",
            "role": "reviewer",
            "provider": {"type": "acp", "command": "codex-acp"},
            "tools": {"blacklist": ["shell"]}
        }))
        .unwrap();
        let request = ToolRules {
            blacklist: vec!["web_fetch".into()],
            ..ToolRules::default()
        };
        let dispatcher = TaskGovernance {
            policy: task_policy(&config, None, Some(&request), None),
            authorization: vec!["d1".into()],
            ..TaskGovernance::default()
        };
        let gov = external_agent(&config, &definition, &dispatcher);
        assert_eq!(gov.authorization, ["d1"]);
        for (tool, layer) in [
            ("shell", PolicyLayer::Agent),
            ("apply_patch", PolicyLayer::Role),
            ("web_fetch", PolicyLayer::Request),
        ] {
            match gov.policy.decide(tool) {
                ToolVerdict::Denied(denial) => assert_eq!(denial.layer, layer, "{tool}"),
                other => panic!("{tool}: {other:?}"),
            }
        }
        assert!(gov.policy.decide("acp__read").is_allowed());
        // An agent with no rules of its own gets its dispatcher's, no more.
        let open: AgentDefinition = serde_json::from_value(serde_json::json!({
            "id": "plain",
            "provider": {"type": "acp", "command": "codex-acp"}
        }))
        .unwrap();
        let plain = external_agent(&ToolPolicyConfig::default(), &open, &dispatcher);
        assert!(!plain.policy.decide("web_fetch").is_allowed());
        assert!(plain.policy.decide("shell").is_allowed());
    }

    #[test]
    fn denied_tools_are_not_offered() {
        let request = ToolRules {
            blacklist: vec!["shell".into()],
            ..ToolRules::default()
        };
        let policy = task_policy(&ToolPolicyConfig::default(), None, Some(&request), None);
        let (kept, withheld) = offered(vec![spec("shell"), spec("update_plan")], &policy);
        assert_eq!(
            kept.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["update_plan"]
        );
        assert_eq!(withheld, ["shell"]);
    }
}
