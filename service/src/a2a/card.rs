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
            "extendedAgentCard": false,
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
    }
    card
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
        let info = CardInfo {
            version: "0.0.0-test".into(),
            ..CardInfo::default()
        };
        insta::assert_json_snapshot!("agent_card", agent_card(&info, "http://127.0.0.1:7777/a2a"));
    }

    #[test]
    fn card_with_bearer_auth_snapshot() {
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
    fn card_v03_snapshot() {
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
