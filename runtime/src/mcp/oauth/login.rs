//! `troupe mcp login|status|logout`: the interactive authorization-code login (PKCE, a
//! loopback redirect, dynamic registration when no client id is configured), a first
//! client-credentials token for the headless grant, and what is stored.

use super::authorizer::Authorizer;
use super::store::{StoredLogin, TokenStore};
use super::{EnvLookup, OAuthError, TokenSnapshot, discovery, now_secs};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rmcp::transport::auth::{
    AuthorizationRequest, AuthorizationSession, CredentialStore, InMemoryCredentialStore,
};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::Instrument;
use troupe_actors::ports::{McpOAuth, McpOAuthGrant, McpServerConfig, McpTransport};

/// The client name troupe registers under.
const CLIENT_NAME: &str = "troupe";
/// The redirect's path on the loopback listener.
const CALLBACK_PATH: &str = "/callback";

/// What a login obtained (no secrets).
#[derive(Debug, Clone)]
pub struct LoginOutcome {
    pub grant: McpOAuthGrant,
    pub client_id: String,
    /// troupe registered this client just now (no client id was configured).
    pub registered: bool,
    pub scopes: Vec<String>,
    pub expires_in: Option<Duration>,
    pub has_refresh_token: bool,
    /// Where the login is kept (none in memory).
    pub path: Option<PathBuf>,
}

/// A server's `url`, `headers` and `oauth`, or the error saying why it has no OAuth.
fn oauth_of(
    server: &McpServerConfig,
) -> Result<(&str, &std::collections::BTreeMap<String, String>, &McpOAuth), OAuthError> {
    match &server.transport {
        McpTransport::StreamableHttp {
            url,
            headers,
            oauth: Some(oauth),
        } => Ok((url, headers, oauth)),
        _ => Err(OAuthError::Config {
            server: server.name.clone(),
            message: "it is not a `streamable_http` server with an `oauth` table".into(),
        }),
    }
}

/// Logs in to `server` and stores its tokens in `store`.
///
/// Authorization code: binds the loopback redirect, asks the server for its challenge,
/// discovers the authorization server, registers troupe unless a client id is configured,
/// hands the authorization URL to `show_url` (print it, open a browser), waits up to
/// `timeout` for the browser to come back, exchanges the code (with the PKCE verifier) and
/// stores the tokens. Client credentials: asks for a first token, which proves the
/// credentials.
pub async fn login(
    server: &McpServerConfig,
    store: TokenStore,
    env: &EnvLookup,
    timeout: Duration,
    show_url: &mut (dyn FnMut(&str) + Send),
) -> Result<LoginOutcome, OAuthError> {
    let (url, headers, oauth) = oauth_of(server)?;
    let name = server.name.as_str();
    let span = tracing::info_span!(
        "mcp_oauth_login",
        mcp_server = name,
        grant = oauth.grant.as_str()
    );
    let result = async {
        match oauth.grant {
            McpOAuthGrant::ClientCredentials => {
                client_credentials(name, url, headers, oauth, store, env).await
            }
            McpOAuthGrant::AuthorizationCode => {
                authorization_code(name, url, headers, oauth, store, env, timeout, show_url).await
            }
        }
    }
    .instrument(span)
    .await;
    match &result {
        Ok(outcome) => tracing::info!(
            mcp_server = name,
            client_id = %outcome.client_id,
            registered = outcome.registered,
            "mcp oauth login stored"
        ),
        Err(error) => {
            crate::mcp::metrics::oauth_failure(error.reason());
            tracing::warn!(mcp_server = name, %error, "mcp oauth login failed");
        }
    }
    result
}

async fn client_credentials(
    name: &str,
    url: &str,
    headers: &std::collections::BTreeMap<String, String>,
    oauth: &McpOAuth,
    store: TokenStore,
    env: &EnvLookup,
) -> Result<LoginOutcome, OAuthError> {
    // A fresh token, not one kept from before: the point is to try the credentials.
    store.remove().map_err(|message| OAuthError::Unavailable {
        server: name.to_owned(),
        message,
    })?;
    let auth = Authorizer::open(name, url, headers, oauth, store.clone(), env).await?;
    auth.token().await?;
    outcome_of(name, &store, false)
}

#[allow(clippy::too_many_arguments)]
async fn authorization_code(
    name: &str,
    url: &str,
    headers: &std::collections::BTreeMap<String, String>,
    oauth: &McpOAuth,
    store: TokenStore,
    env: &EnvLookup,
    timeout: Duration,
    show_url: &mut (dyn FnMut(&str) + Send),
) -> Result<LoginOutcome, OAuthError> {
    let failed = |message: String| OAuthError::Login {
        server: name.to_owned(),
        message,
    };
    let unavailable = |message: String| OAuthError::Unavailable {
        server: name.to_owned(),
        message,
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", oauth.redirect_port))
        .await
        .map_err(|e| {
            failed(format!(
                "cannot listen for the redirect on 127.0.0.1:{}: {e}",
                oauth.redirect_port
            ))
        })?;
    let port = listener
        .local_addr()
        .map_err(|e| failed(e.to_string()))?
        .port();
    let redirect_uri = format!("http://127.0.0.1:{port}{CALLBACK_PATH}");

    // Scopes a server asked for since the last login are asked for now.
    let wanted = store
        .read()
        .ok()
        .flatten()
        .filter(|l| l.url == url)
        .map(|l| l.wanted_scopes)
        .unwrap_or_default();
    let challenge = discovery::probe(url, headers).await.map_err(unavailable)?;
    let mut manager = super::manager(url).await.map_err(unavailable)?;
    let resolution = manager
        .resolve_metadata_from_challenge(challenge.as_deref())
        .await
        .map_err(|e| unavailable(format!("discovery failed: {e}")))?;
    let accepts_metadata_documents = resolution
        .metadata
        .additional_fields
        .get("client_id_metadata_document_supported")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    tracing::info!(
        mcp_server = name,
        authorization_endpoint = %resolution.metadata.authorization_endpoint,
        source = ?resolution.source,
        "authorization server found"
    );
    manager.set_metadata(resolution.metadata);
    let tokens = InMemoryCredentialStore::new();
    manager.set_credential_store(tokens.clone());

    // The configured scopes (else those the server names), and those it asked for since.
    let mut scopes = if oauth.scopes.is_empty() {
        manager.select_initial_scopes(&[]).await
    } else {
        oauth.scopes.clone()
    };
    for scope in wanted {
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    let configured_id = super::client_id(name, oauth, env)?;
    let configured_secret = super::client_secret(name, oauth, env)?;
    let metadata_document = oauth
        .client_metadata_url
        .clone()
        .filter(|_| accepts_metadata_documents);
    let mut request = AuthorizationRequest::new(&redirect_uri).with_client_name(CLIENT_NAME);
    let (client_secret, registered) = match (configured_id, metadata_document) {
        (Some(id), _) => {
            request = request.with_preregistered_client(id);
            (configured_secret, false)
        }
        // The document's URL is the client id (rmcp checks it is an https URL).
        (None, Some(document)) => {
            request = request.with_client_metadata_url(document);
            (None, false)
        }
        (None, None) => {
            let scopes: Vec<&str> = scopes.iter().map(String::as_str).collect();
            let client = manager
                .register_client(CLIENT_NAME, &redirect_uri, &scopes)
                .await
                .map_err(|e| failed(format!("troupe could not register itself: {e}")))?;
            request = request.with_preregistered_client(client.client_id);
            (client.client_secret, true)
        }
    };
    if let Some(secret) = &client_secret {
        request = request.with_client_secret(secret);
    }
    request = if scopes.is_empty() {
        request.with_initial_scope_selection()
    } else {
        request.with_scopes(scopes)
    };
    if let Some(challenge) = &challenge {
        request = request.with_challenge(challenge);
    }
    let session = AuthorizationSession::new(manager, request)
        .await
        .map_err(|(_, e)| failed(format!("cannot start the authorization: {e}")))?;
    show_url(session.get_authorization_url());

    let callback = wait_for_callback(listener, port, timeout)
        .await
        .map_err(failed)?;
    session
        .handle_callback_url(&callback)
        .await
        .map_err(|e| failed(format!("the code exchange failed: {e}")))?;

    let credentials = tokens
        .load()
        .await
        .map_err(|e| failed(e.to_string()))?
        .ok_or_else(|| failed("the authorization server issued no token".into()))?;
    let login = StoredLogin {
        url: url.to_owned(),
        grant: McpOAuthGrant::AuthorizationCode,
        challenge,
        redirect_uri: Some(redirect_uri),
        registered_client_secret: if registered { client_secret } else { None },
        wanted_scopes: Vec::new(),
        credentials: Some(credentials),
    };
    store.write(&login).map_err(unavailable)?;
    outcome_of(name, &store, registered)
}

fn outcome_of(
    name: &str,
    store: &TokenStore,
    registered: bool,
) -> Result<LoginOutcome, OAuthError> {
    let unavailable = |message: String| OAuthError::Unavailable {
        server: name.to_owned(),
        message,
    };
    let login = store
        .read()
        .map_err(unavailable)?
        .ok_or_else(|| unavailable("the login was not stored".into()))?;
    let snapshot = login
        .snapshot()
        .ok_or_else(|| unavailable("the login holds no token".into()))?;
    Ok(LoginOutcome {
        grant: login.grant,
        client_id: snapshot.client_id,
        registered,
        scopes: snapshot.scopes,
        expires_in: snapshot.expires_in,
        has_refresh_token: snapshot.has_refresh_token,
        path: store.path().map(PathBuf::from),
    })
}

/// Serves the loopback redirect until the browser comes back with a code (or an error), or
/// `timeout` passes. Returns the full callback URL.
async fn wait_for_callback(
    listener: tokio::net::TcpListener,
    port: u16,
    timeout: Duration,
) -> Result<String, String> {
    let (tx, mut rx) = mpsc::channel::<Result<String, String>>(1);
    let accept = async {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let tx = tx.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(&request, port, &tx)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    };
    tokio::select! {
        result = rx.recv() => result.unwrap_or_else(|| Err("the redirect listener stopped".into())),
        () = accept => Err("the redirect listener stopped".into()),
        () = tokio::time::sleep(timeout) => Err(format!(
            "nobody came back to the redirect within {}",
            humantime::format_duration(timeout)
        )),
    }
}

/// The page the browser lands on, and what it tells the login.
fn answer(
    request: &Request<Incoming>,
    port: u16,
    tx: &mpsc::Sender<Result<String, String>>,
) -> Response<String> {
    let page = |status: StatusCode, text: &str| {
        let mut response = Response::new(format!(
            "<!doctype html><meta charset=utf-8><title>troupe</title><p>{text}</p>\n"
        ));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/html; charset=utf-8"),
        );
        response
    };
    if request.uri().path() != CALLBACK_PATH {
        return page(StatusCode::NOT_FOUND, "Not found.");
    }
    let query = request.uri().query().unwrap_or("");
    let params: std::collections::HashMap<String, String> = url_params(query);
    if let Some(error) = params.get("error") {
        let detail = params
            .get("error_description")
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        let _ = tx.try_send(Err(format!(
            "the authorization server answered `{error}`{detail}"
        )));
        return page(
            StatusCode::BAD_REQUEST,
            "The authorization was refused. You can close this tab.",
        );
    }
    if !params.contains_key("code") || !params.contains_key("state") {
        return page(
            StatusCode::BAD_REQUEST,
            "This redirect carries no authorization code.",
        );
    }
    let _ = tx.try_send(Ok(format!(
        "http://127.0.0.1:{port}{CALLBACK_PATH}?{query}"
    )));
    page(
        StatusCode::OK,
        "troupe is logged in. You can close this tab and go back to the terminal.",
    )
}

fn url_params(query: &str) -> std::collections::HashMap<String, String> {
    reqwest::Url::parse(&format!("http://x/?{query}"))
        .map(|u| u.query_pairs().into_owned().collect())
        .unwrap_or_default()
}

/// What is stored for a server.
#[derive(Debug, Clone, PartialEq)]
pub enum LoginStatus {
    /// Nothing.
    None,
    /// A login for another URL (the configuration changed): it is not used.
    OtherUrl { url: String },
    /// A login for this URL, with its token (if any).
    Stored {
        grant: McpOAuthGrant,
        token: Option<TokenSnapshot>,
        /// Scopes the server asked for that the token lacks (a new login asks for them).
        wanted_scopes: Vec<String>,
        /// Seconds until the access token expires (negative: it has); none if unknown.
        expires_in_secs: Option<i64>,
    },
}

/// What `store` holds for the server at `url`.
pub fn status(url: &str, store: &TokenStore) -> Result<LoginStatus, String> {
    let Some(login) = store.read()? else {
        return Ok(LoginStatus::None);
    };
    if login.url != url {
        return Ok(LoginStatus::OtherUrl { url: login.url });
    }
    let token = login.snapshot();
    let expires_in_secs = token.as_ref().and_then(|t| {
        let received = i64::try_from(t.received_at?).ok()?;
        let lifetime = i64::try_from(t.expires_in?.as_secs()).ok()?;
        let now = i64::try_from(now_secs()).ok()?;
        Some(received + lifetime - now)
    });
    Ok(LoginStatus::Stored {
        grant: login.grant,
        token,
        wanted_scopes: login.wanted_scopes,
        expires_in_secs,
    })
}

/// Forgets the login of the server; `true` if there was one.
pub fn logout(store: &TokenStore) -> Result<bool, String> {
    store.remove()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callback_parameters_are_decoded() {
        let p = url_params("code=a%2Fb&state=xyz&iss=http%3A%2F%2Fas");
        assert_eq!(p["code"], "a/b");
        assert_eq!(p["state"], "xyz");
        assert_eq!(p["iss"], "http://as");
    }

    #[test]
    fn a_stdio_server_or_one_without_oauth_cannot_log_in() {
        let stdio = McpServerConfig {
            name: "local".into(),
            transport: McpTransport::Stdio {
                command: "x".into(),
                args: vec![],
                env: Default::default(),
                cwd: None,
            },
        };
        assert!(matches!(oauth_of(&stdio), Err(OAuthError::Config { .. })));
        let plain = McpServerConfig {
            name: "remote".into(),
            transport: McpTransport::StreamableHttp {
                url: "http://127.0.0.1:1/mcp".into(),
                headers: Default::default(),
                oauth: None,
            },
        };
        let e = oauth_of(&plain).unwrap_err();
        assert!(e.to_string().contains("`oauth` table"), "{e}");
    }
}
