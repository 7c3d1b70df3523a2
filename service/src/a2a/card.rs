//! The agent card served at `/.well-known/agent-card.json` (spec 8).
//!
//! Two documents for one agent. The 1.0 card has only 1.0 fields (`supportedInterfaces`
//! lists one JSON-RPC interface per protocol version at the same URL, so a 1.x SDK can still
//! pick 0.3); the 0.3 card (`url`, `preferredTransport`, `protocolVersion`, 0.3 security) is
//! for clients that only know 0.3: they get it with `A2A-Version: 0.3` or at the 0.3-era path
//! `/.well-known/agent.json`.

use super::request::{INPUT_MODES, OUTPUT_MODES};
use serde_json::{Value, json};

/// What the card says about this agent.
#[derive(Debug, Clone, PartialEq)]
pub struct CardInfo {
    pub name: String,
    pub description: String,
    /// The agent's version (troupe's).
    pub version: String,
    /// Requests need `Authorization: Bearer <token>` (the card itself is public).
    pub bearer_auth: bool,
    /// Skills only an authenticated client sees, in the extended card: what the agent can
    /// use (its tools, its MCP servers). The extended card is offered when requests need a
    /// token, since only then is a caller known.
    pub extended_skills: Vec<Value>,
}

impl Default for CardInfo {
    fn default() -> Self {
        Self {
            name: "troupe".into(),
            description: "An LLM agent orchestrated by troupe: each A2A context is a troupe \
                          conversation with its own history, each A2A task one troupe task."
                .into(),
            version: env!("CARGO_PKG_VERSION").into(),
            bearer_auth: false,
            extended_skills: Vec::new(),
        }
    }
}

/// The 1.0 card for an endpoint whose JSON-RPC URL is `rpc_url`: only fields of the 1.0
/// `AgentCard`, so a strict 1.0 client (or the 1.0 JSON schema, which allows no other field)
/// accepts it. `supportedInterfaces` also lists the 0.3 binding at the same URL, which 1.x
/// SDKs use to talk 0.3.
pub fn agent_card(info: &CardInfo, rpc_url: &str) -> Value {
    let mut card = json!({
        "name": info.name,
        "description": info.description,
        "supportedInterfaces": [
            {"url": rpc_url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": rpc_url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        ],
        "version": info.version,
        "capabilities": {
            "streaming": true,
            "pushNotifications": true,
            "extendedAgentCard": info.bearer_auth,
        },
        "defaultInputModes": INPUT_MODES,
        "defaultOutputModes": OUTPUT_MODES,
        "skills": skills(),
    });
    if info.bearer_auth {
        card["securitySchemes"] = json!({
            "bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}
        });
        card["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
    }
    card
}

/// The same agent as a 0.3 client reads it (0.3 `AgentCard`: `url`, `preferredTransport`,
/// `protocolVersion`, security schemes tagged by `type`), served to requests that ask for
/// 0.3 (`A2A-Version: 0.3`) and at the 0.3-era path `/.well-known/agent.json`.
pub fn agent_card_v03(info: &CardInfo, rpc_url: &str) -> Value {
    let mut card = json!({
        "name": info.name,
        "description": info.description,
        "url": rpc_url,
        "preferredTransport": "JSONRPC",
        "protocolVersion": "0.3.0",
        "version": info.version,
        "capabilities": {
            "streaming": true,
            "pushNotifications": true,
            // The task's history keeps earlier status messages.
            "stateTransitionHistory": false,
        },
        "defaultInputModes": INPUT_MODES,
        "defaultOutputModes": OUTPUT_MODES,
        "skills": skills(),
    });
    if info.bearer_auth {
        card["securitySchemes"] = json!({"bearer": {"type": "http", "scheme": "bearer"}});
        card["security"] = json!([{"bearer": []}]);
        card["supportsAuthenticatedExtendedCard"] = json!(true);
    }
    card
}

/// The card an authenticated client gets from `GetExtendedAgentCard` (0.3
/// `agent/getAuthenticatedExtendedCard`): the public card of that version with the extended
/// skills added.
pub fn extended_card(info: &CardInfo, rpc_url: &str, v03: bool) -> Value {
    let mut card = if v03 {
        agent_card_v03(info, rpc_url)
    } else {
        agent_card(info, rpc_url)
    };
    if let Some(skills) = card["skills"].as_array_mut() {
        skills.extend(info.extended_skills.iter().cloned());
    }
    card
}

/// The extended skills of an agent whose conversations have the shell tool and these MCP
/// servers.
pub fn tool_skills(shell: bool, mcp_servers: &[String]) -> Vec<Value> {
    let mut skills = Vec::new();
    if shell {
        skills.push(json!({
            "id": "tool-shell",
            "name": "Shell commands",
            "description": "Runs commands in the agent's workspace, sandboxed as its policy \
                            says; a command that needs approval makes the task INPUT_REQUIRED.",
            "tags": ["tool", "shell"],
        }));
    }
    for server in mcp_servers {
        skills.push(json!({
            "id": format!("mcp-{server}"),
            "name": format!("MCP server `{server}`"),
            "description": format!("The tools of the MCP server `{server}` (named `{server}__<tool>`)."),
            "tags": ["tool", "mcp"],
        }));
    }
    skills
}

fn skills() -> Value {
    json!([{
        "id": "conversation",
        "name": "Conversation",
        "description": "Answers a message in an ongoing conversation (one per contextId), \
                        using the tools its troupe session allows.",
        "tags": ["chat", "tools", "troupe"],
        "examples": ["Summarise the README of this project."],
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_snapshot() {
        // Keys sorted: the same snapshot whether serde_json keeps insertion order or not (its
        // `preserve_order` feature, which the ACP crate turns on for builds that include it).
        let mut sorted = insta::Settings::clone_current();
        sorted.set_sort_maps(true);
        let _sorted = sorted.bind_to_scope();
        let info = CardInfo {
            version: "0.0.0-test".into(),
            ..CardInfo::default()
        };
        insta::assert_json_snapshot!("agent_card", agent_card(&info, "http://127.0.0.1:7777/a2a"));
    }

    #[test]
    fn card_with_bearer_auth_snapshot() {
        // Keys sorted: the same snapshot whether serde_json keeps insertion order or not (its
        // `preserve_order` feature, which the ACP crate turns on for builds that include it).
        let mut sorted = insta::Settings::clone_current();
        sorted.set_sort_maps(true);
        let _sorted = sorted.bind_to_scope();
        let info = CardInfo {
            version: "0.0.0-test".into(),
            bearer_auth: true,
            ..CardInfo::default()
        };
        let card = agent_card(&info, "http://127.0.0.1:7777/a2a");
        insta::assert_json_snapshot!("agent_card_bearer", {
            let mut c = serde_json::Map::new();
            for k in ["securitySchemes", "securityRequirements", "security"] {
                c.insert(k.into(), card[k].clone());
            }
            c
        });
    }

    #[test]
    fn the_extended_card_adds_the_tools_for_authenticated_callers() {
        let open = CardInfo::default();
        assert_eq!(
            agent_card(&open, "u")["capabilities"]["extendedAgentCard"],
            false
        );
        let info = CardInfo {
            bearer_auth: true,
            extended_skills: tool_skills(true, &["files".into()]),
            ..CardInfo::default()
        };
        let public = agent_card(&info, "u");
        assert_eq!(public["capabilities"]["extendedAgentCard"], true);
        let ids = |card: &Value| -> Vec<String> {
            card["skills"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["id"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            ids(&public),
            ["conversation"],
            "the public card keeps them back"
        );
        for v03 in [false, true] {
            let extended = extended_card(&info, "u", v03);
            assert_eq!(ids(&extended), ["conversation", "tool-shell", "mcp-files"]);
            assert_eq!(extended.get("url").is_some(), v03);
        }
        assert_eq!(
            agent_card_v03(&info, "u")["supportsAuthenticatedExtendedCard"],
            true
        );
        assert!(tool_skills(false, &[]).is_empty());
    }

    #[test]
    fn card_v03_snapshot() {
        // Keys sorted: the same snapshot whether serde_json keeps insertion order or not (its
        // `preserve_order` feature, which the ACP crate turns on for builds that include it).
        let mut sorted = insta::Settings::clone_current();
        sorted.set_sort_maps(true);
        let _sorted = sorted.bind_to_scope();
        let info = CardInfo {
            version: "0.0.0-test".into(),
            bearer_auth: true,
            ..CardInfo::default()
        };
        insta::assert_json_snapshot!(
            "agent_card_v03",
            agent_card_v03(&info, "http://127.0.0.1:7777/a2a")
        );
    }
}
