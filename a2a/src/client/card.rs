//! Reading a remote agent's card (spec 8.2): where to look for it, and which of its
//! interfaces troupe talks to. Pure functions; the fetching is the client's.
//!
//! The URL an agent definition names may be the card itself (`…/agent-card.json`), the
//! agent's base URL, or its JSON-RPC endpoint: the card is looked for under that URL, then
//! at the root of its host, at the 1.0 well-known path and then the 0.3 one.
//!
//! Of the card's interfaces, troupe takes a JSON-RPC one: 1.0 when the card offers it, else
//! 0.3 (a 0.3 card names its JSON-RPC endpoint in `url` with `preferredTransport`, or in
//! `additionalInterfaces`).

use crate::version::Version;
use serde_json::Value;

/// The 1.0 well-known path of the card.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";
/// Where 0.3 agents served it.
pub const CARD_PATH_V03: &str = "/.well-known/agent.json";

/// Where a JSON-RPC call goes, in which version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: String,
    pub version: Version,
}

/// What troupe keeps of a card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardSummary {
    pub name: String,
    /// Where the card was read.
    pub card_url: String,
    pub endpoint: Endpoint,
    /// The agent streams (`capabilities.streaming`): troupe sends with `SendStreamingMessage`,
    /// else with `SendMessage` and polls the task.
    pub streaming: bool,
}

/// Where to look for the card of the agent at `url`, in order.
pub fn card_urls(url: &str) -> Result<Vec<String>, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("`{url}` is not an http(s) URL"));
    }
    if parsed.path().ends_with(".json") {
        return Ok(vec![url.to_owned()]);
    }
    let mut base = parsed.clone();
    base.set_query(None);
    base.set_fragment(None);
    let base = base.as_str().trim_end_matches('/').to_owned();
    let origin = parsed.origin().ascii_serialization();
    let mut urls = Vec::new();
    for path in [CARD_PATH, CARD_PATH_V03] {
        for root in [&base, &origin] {
            let candidate = format!("{root}{path}");
            if !urls.contains(&candidate) {
                urls.push(candidate);
            }
        }
    }
    Ok(urls)
}

/// The card's JSON-RPC endpoint troupe uses (`prefer`: only that version), and the rest of
/// what troupe keeps of it.
pub fn summarize(
    card: &Value,
    card_url: &str,
    prefer: Option<Version>,
) -> Result<CardSummary, String> {
    if !card.is_object() {
        return Err(format!("the agent card at {card_url} is not a JSON object"));
    }
    let endpoint = endpoint(card, prefer).ok_or_else(|| {
        format!(
            "the agent card at {card_url} offers no JSON-RPC interface in A2A {}",
            match prefer {
                Some(v) => v.as_str().to_owned(),
                None => "1.0 or 0.3".to_owned(),
            }
        )
    })?;
    Ok(CardSummary {
        name: card
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        card_url: card_url.to_owned(),
        endpoint,
        streaming: card
            .pointer("/capabilities/streaming")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

fn endpoint(card: &Value, prefer: Option<Version>) -> Option<Endpoint> {
    let mut offered: Vec<Endpoint> = Vec::new();
    // 1.0: supportedInterfaces [{url, protocolBinding, protocolVersion}].
    for i in card
        .get("supportedInterfaces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let binding = i.get("protocolBinding").and_then(Value::as_str);
        let url = i.get("url").and_then(Value::as_str);
        let version = i
            .get("protocolVersion")
            .and_then(Value::as_str)
            .and_then(version_of);
        if let (Some("JSONRPC"), Some(url), Some(version)) = (binding, url, version) {
            offered.push(Endpoint {
                url: url.to_owned(),
                version,
            });
        }
    }
    // 0.3: url + preferredTransport (JSONRPC when absent), additionalInterfaces
    // [{url, transport}], all in the card's protocolVersion.
    if let Some(version) = card
        .get("protocolVersion")
        .and_then(Value::as_str)
        .and_then(version_of)
    {
        let preferred = card
            .get("preferredTransport")
            .and_then(Value::as_str)
            .unwrap_or("JSONRPC");
        if let (Some(url), "JSONRPC") = (card.get("url").and_then(Value::as_str), preferred) {
            offered.push(Endpoint {
                url: url.to_owned(),
                version,
            });
        }
        for i in card
            .get("additionalInterfaces")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let (Some(url), Some("JSONRPC")) = (
                i.get("url").and_then(Value::as_str),
                i.get("transport").and_then(Value::as_str),
            ) {
                offered.push(Endpoint {
                    url: url.to_owned(),
                    version,
                });
            }
        }
    }
    let wanted: &[Version] = match prefer {
        Some(Version::V1_0) => &[Version::V1_0],
        Some(Version::V0_3) => &[Version::V0_3],
        None => &[Version::V1_0, Version::V0_3],
    };
    wanted
        .iter()
        .find_map(|v| offered.iter().find(|e| e.version == *v).cloned())
}

/// `1.0`, `1.0.2`, `0.3.0`, ... as a version troupe speaks.
fn version_of(s: &str) -> Option<Version> {
    let mut parts = s.split('.');
    match (parts.next(), parts.next()) {
        (Some("1"), _) => Some(Version::V1_0),
        (Some("0"), Some("3")) => Some(Version::V0_3),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_card_is_looked_for_under_the_url_then_at_the_root() {
        assert_eq!(
            card_urls("http://127.0.0.1:8080/a2a").unwrap(),
            [
                "http://127.0.0.1:8080/a2a/.well-known/agent-card.json",
                "http://127.0.0.1:8080/.well-known/agent-card.json",
                "http://127.0.0.1:8080/a2a/.well-known/agent.json",
                "http://127.0.0.1:8080/.well-known/agent.json",
            ]
        );
        assert_eq!(
            card_urls("https://agents.example/").unwrap(),
            [
                "https://agents.example/.well-known/agent-card.json",
                "https://agents.example/.well-known/agent.json",
            ]
        );
        assert_eq!(
            card_urls("http://h/cards/coder.json").unwrap(),
            ["http://h/cards/coder.json"]
        );
        assert!(card_urls("ftp://h/x").unwrap_err().contains("http(s)"));
        assert!(card_urls("not a url").is_err());
    }

    #[test]
    fn a_1_0_interface_is_preferred_to_a_0_3_one() {
        let card = json!({
            "name": "troupe",
            "capabilities": {"streaming": true},
            "supportedInterfaces": [
                {"url": "http://h/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
                {"url": "http://h/old", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
                {"url": "http://h/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            ],
        });
        let s = summarize(&card, "http://h/card", None).unwrap();
        assert_eq!(
            s.endpoint,
            Endpoint {
                url: "http://h/a2a".into(),
                version: Version::V1_0
            }
        );
        assert!(s.streaming);
        assert_eq!(s.name, "troupe");
        let old = summarize(&card, "http://h/card", Some(Version::V0_3)).unwrap();
        assert_eq!(old.endpoint.url, "http://h/old");
    }

    #[test]
    fn a_0_3_card_names_its_endpoint_in_url_or_additional_interfaces() {
        let card = json!({
            "name": "old", "protocolVersion": "0.3.0", "url": "http://h/rpc",
            "capabilities": {},
        });
        let s = summarize(&card, "c", None).unwrap();
        assert_eq!(
            (s.endpoint.url.as_str(), s.endpoint.version, s.streaming),
            ("http://h/rpc", Version::V0_3, false)
        );
        let grpc_first = json!({
            "protocolVersion": "0.3.0", "url": "http://h/grpc", "preferredTransport": "GRPC",
            "additionalInterfaces": [{"url": "http://h/jsonrpc", "transport": "JSONRPC"}],
        });
        assert_eq!(
            summarize(&grpc_first, "c", None).unwrap().endpoint.url,
            "http://h/jsonrpc"
        );
    }

    #[test]
    fn a_card_without_a_usable_interface_says_so() {
        for card in [
            json!({"supportedInterfaces": [{"url": "u", "protocolBinding": "GRPC", "protocolVersion": "1.0"}]}),
            json!({"supportedInterfaces": [{"url": "u", "protocolBinding": "JSONRPC", "protocolVersion": "2.0"}]}),
            json!({"name": "nothing"}),
            json!([1]),
        ] {
            let e = summarize(&card, "http://h/card", None).unwrap_err();
            assert!(e.contains("http://h/card"), "{e}");
        }
        let only_old = json!({"protocolVersion": "0.3.0", "url": "http://h/rpc"});
        let e = summarize(&only_old, "c", Some(Version::V1_0)).unwrap_err();
        assert!(e.contains("A2A 1.0"), "{e}");
    }
}
