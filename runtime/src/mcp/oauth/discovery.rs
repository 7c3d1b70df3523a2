//! What the MCP server itself says about its protection, before rmcp's discovery takes over:
//! the `WWW-Authenticate` challenge of an unauthenticated request (it may name the protected
//! resource metadata, RFC 9728, and the scopes wanted), and the resource indicator (RFC 8707)
//! that metadata declares.

use reqwest::header::{ACCEPT, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{StatusCode, Url};
use std::collections::BTreeMap;
use std::time::Duration;

/// Bound of each discovery request.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);

fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(DISCOVERY_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// Sends the server an `initialize` without a token and returns its challenge: `Ok(None)`
/// when it answered without asking for one.
pub async fn probe(
    url: &str,
    headers: &BTreeMap<String, String>,
) -> Result<Option<String>, String> {
    let headers = crate::mcp::http::parse_headers(headers)?;
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "troupe", "version": env!("CARGO_PKG_VERSION")}
        }
    });
    let mut request = client()?
        .post(url)
        .header(ACCEPT, "application/json, text/event-stream")
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("cannot reach {url}: {e}"))?;
    let status = response.status();
    let challenge = response
        .headers()
        .get_all(WWW_AUTHENTICATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.trim_start().to_ascii_lowercase().starts_with("bearer"))
        .map(str::to_owned);
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Ok(Some(
            // A 401 without a Bearer challenge still means "authorize": discovery then
            // goes by the well-known locations.
            challenge.unwrap_or_else(|| "Bearer".to_owned()),
        )),
        s if s.is_success() => Ok(None),
        s => Err(format!(
            "{url} answered {s} to an unauthenticated initialize"
        )),
    }
}

/// The resource indicator to send with token requests: the `resource` of the server's
/// protected resource metadata (from the challenge's `resource_metadata`, else the
/// well-known locations) when it names this server or a prefix of it, else the server URL.
pub async fn resource_indicator(url: &str, challenge: Option<&str>) -> String {
    let Ok(base) = Url::parse(url) else {
        return url.to_owned();
    };
    let Ok(client) = client() else {
        return url.to_owned();
    };
    for candidate in metadata_candidates(&base, challenge) {
        let Ok(response) = client.get(candidate).send().await else {
            continue;
        };
        if !response.status().is_success() {
            continue;
        }
        let Ok(document) = response.json::<serde_json::Value>().await else {
            continue;
        };
        if let Some(resource) = document.get("resource").and_then(|r| r.as_str())
            && names_resource(&base, resource)
        {
            return resource.to_owned();
        }
    }
    url.to_owned()
}

/// Where the protected resource metadata may be: the challenge's `resource_metadata` first,
/// then RFC 9728's path-inserted and root well-known URLs.
pub fn metadata_candidates(base: &Url, challenge: Option<&str>) -> Vec<Url> {
    let mut out = Vec::new();
    if let Some(challenge) = challenge {
        let params = rmcp::transport::auth::WWWAuthenticateParams::parse(challenge, base);
        if let Some(url) = params.resource_metadata_url {
            out.push(url);
        }
    }
    let path = base.path().trim_matches('/');
    let mut well_known = base.clone();
    well_known.set_query(None);
    well_known.set_fragment(None);
    if !path.is_empty() {
        well_known.set_path(&format!("/.well-known/oauth-protected-resource/{path}"));
        out.push(well_known.clone());
    }
    well_known.set_path("/.well-known/oauth-protected-resource");
    out.push(well_known);
    out.dedup();
    out
}

/// Whether `resource` identifies `base`: the same origin, and a path that is `base`'s or a
/// prefix of it.
pub fn names_resource(base: &Url, resource: &str) -> bool {
    let Ok(resource) = Url::parse(resource) else {
        return false;
    };
    let prefix = resource.path().trim_end_matches('/');
    let path = base.path().trim_end_matches('/');
    resource.fragment().is_none()
        && resource.scheme() == base.scheme()
        && resource.host_str() == base.host_str()
        && resource.port_or_known_default() == base.port_or_known_default()
        && (path == prefix || path.starts_with(&format!("{prefix}/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_looked_for_where_the_challenge_says_then_at_the_well_known_urls() {
        let base = Url::parse("http://127.0.0.1:9/mcp").unwrap();
        let found = metadata_candidates(
            &base,
            Some(r#"Bearer resource_metadata="http://127.0.0.1:9/custom/prm.json", scope="a b""#),
        );
        let found: Vec<&str> = found.iter().map(Url::as_str).collect();
        assert_eq!(
            found,
            [
                "http://127.0.0.1:9/custom/prm.json",
                "http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp",
                "http://127.0.0.1:9/.well-known/oauth-protected-resource",
            ]
        );
        let root = Url::parse("http://127.0.0.1:9/").unwrap();
        assert_eq!(metadata_candidates(&root, None).len(), 1);
    }

    #[test]
    fn a_resource_must_name_this_server_or_a_prefix_of_it() {
        let base = Url::parse("http://127.0.0.1:9/tenant/mcp").unwrap();
        assert!(names_resource(&base, "http://127.0.0.1:9/tenant/mcp"));
        assert!(names_resource(&base, "http://127.0.0.1:9/tenant"));
        assert!(names_resource(&base, "http://127.0.0.1:9/"));
        assert!(!names_resource(&base, "https://evil.example.com/mcp"));
        assert!(!names_resource(&base, "http://127.0.0.1:10/tenant/mcp"));
        assert!(!names_resource(&base, "http://127.0.0.1:9/other"));
        assert!(!names_resource(&base, "http://127.0.0.1:9/ten"));
        assert!(!names_resource(&base, "http://127.0.0.1:9/tenant/mcp#x"));
    }
}
