//! The agent card served at `/.well-known/agent-card.json` (spec 8).
//!
//! One document for both versions: the 1.0 fields (`supportedInterfaces`, one JSON-RPC
//! interface per protocol version at the same URL) plus the 0.3 fields a 0.3 client requires
//! (`url`, `preferredTransport`, `protocolVersion`, 0.3 security), as the reference SDK
//! serves it. A 1.0 client picks the 1.0 interface; a 0.3 client reads the legacy fields.

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

/// The card for an endpoint whose JSON-RPC URL is `rpc_url`.
pub fn agent_card(info: &CardInfo, rpc_url: &str) -> Value {
    let mut card = json!({
        "name": info.name,
        "description": info.description,
        "supportedInterfaces": [
            {"url": rpc_url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": rpc_url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        ],
        "provider": {"organization": "troupe", "url": "https://example.invalid/troupe"},
        "version": info.version,
        "capabilities": {
            "streaming": true,
            "pushNotifications": false,
            "extendedAgentCard": false,
            // 0.3: the task's history keeps earlier status messages.
            "stateTransitionHistory": false,
        },
        "defaultInputModes": INPUT_MODES,
        "defaultOutputModes": OUTPUT_MODES,
        "skills": [{
            "id": "conversation",
            "name": "Conversation",
            "description": "Answers a message in an ongoing conversation (one per contextId), \
                            using the tools its troupe session allows.",
            "tags": ["chat", "tools", "troupe"],
            "examples": ["Summarise the README of this project."],
        }],
        // 0.3 fields: the primary interface, spelled the old way.
        "url": rpc_url,
        "preferredTransport": "JSONRPC",
        "protocolVersion": "0.3",
    });
    if info.bearer_auth {
        card["securitySchemes"] = json!({
            "bearer": {
                "httpAuthSecurityScheme": {"scheme": "Bearer"},
                // 0.3 reads the scheme object itself, tagged by `type`.
                "type": "http",
                "scheme": "bearer",
            }
        });
        card["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
        card["security"] = json!([{"bearer": []}]);
    }
    card
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
}
