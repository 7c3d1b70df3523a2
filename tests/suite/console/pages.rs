//! The console's pages over plain HTTP (no browser): the service in this process, with API
//! tokens, read with reqwest.

use super::super::serve::{Server, with_tokens};
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
