//! The console's pages over plain HTTP (no browser): the service in this process, with API
//! tokens, read with reqwest.

use super::super::serve::{Server, id, with_tokens};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;

/// A page's status, headers and text; `token`: sent as a bearer token.
async fn page(server: &Server, path: &str, token: Option<&str>) -> (StatusCode, HeaderMap, String) {
    let mut request = reqwest::Client::new().get(format!("{}{path}", server.base));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

/// A session id that does not even decode (bad percent-encoding) names no session: the
/// not-found page, 404, like an unknown id (never a 400); without a token, the sign-in form.
#[tokio::test]
async fn a_session_id_that_does_not_decode_is_not_found() {
    let server = Server::start_with(with_tokens, Vec::new()).await;
    for path in ["/sessions/%ff", "/sessions/%ff%fe", "/sessions/nope"] {
        let (status, headers, text) = page(&server, path, Some("ops-token")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {text}");
        assert!(
            headers[reqwest::header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/html"),
            "{path}: {headers:?}"
        );
        assert!(text.contains("<h1>Not found</h1>"), "{path}: {text}");
        assert!(text.contains(r#"data-page="not-found""#), "{path}: {text}");
        let (status, _, text) = page(&server, path, None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {text}");
        assert!(text.contains(r#"id="sign-in-form""#), "{path}: {text}");
    }
    server.stop().await;
}

/// Every console page carries the headers the README promises: a strict CSP that forbids
/// framing, `X-Frame-Options: DENY`, `X-Content-Type-Options: nosniff`, `Cache-Control:
/// no-store`, and no referrer to other sites.
#[tokio::test]
async fn every_console_page_carries_its_security_headers() {
    let server = Server::start_with(with_tokens, Vec::new()).await;
    let sid = id(
        &server.api_as("ops-token").session(Some("alpha")).await,
        "session_id",
    );
    let session = format!("/sessions/{sid}");
    let pages = [
        ("/", Some("ops-token"), StatusCode::OK, "sessions"),
        (
            session.as_str(),
            Some("ops-token"),
            StatusCode::OK,
            "session",
        ),
        ("/tokens", Some("ops-token"), StatusCode::OK, "tokens"),
        (
            "/sessions/0190a000-0000-7000-8000-000000000009",
            Some("ops-token"),
            StatusCode::NOT_FOUND,
            "not-found",
        ),
        ("/", None, StatusCode::OK, "sign-in"),
    ];
    for (path, token, want, kind) in pages {
        let (status, headers, text) = page(&server, path, token).await;
        assert_eq!(status, want, "{path}: {text}");
        assert!(
            text.contains(&format!(r#"data-page="{kind}""#)),
            "{path}: {text}"
        );
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_else(|| panic!("{path}: no {name} in {headers:?}"))
                .to_owned()
        };
        let csp = header("content-security-policy");
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "form-action 'self'",
            "base-uri 'none'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {directive} in {csp}");
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        assert_eq!(header("x-frame-options"), "DENY", "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
        assert_eq!(header("cache-control"), "no-store", "{path}");
        assert_eq!(header("referrer-policy"), "same-origin", "{path}");
    }
    server.stop().await;
}
