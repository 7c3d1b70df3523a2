//! OAuth 2.1 for streamable-HTTP MCP servers, as the MCP authorization spec describes it:
//! the server's 401 challenge and protected resource metadata (RFC 9728) lead to its
//! authorization server (RFC 8414 / OpenID discovery); troupe registers itself there when no
//! client id is configured (RFC 7591), logs a person in with the authorization code and PKCE
//! (S256) over a loopback redirect, or uses the client-credentials grant headless; every token
//! request names the server as its `resource` (RFC 8707). rmcp's `auth` module does the
//! protocol; this module decides when, keeps the tokens and reports failures.
//!
//! - [`login`], [`status`], [`logout`]: what `troupe mcp login|status|logout` run.
//! - [`store`]: one 0600 file per server under `<data_dir>/mcp-auth/`.
//! - `Authorizer` (crate): the bearer token of one connection, renewed before it expires and
//!   once after a 401.
//!
//! Failure: a server that needs a login nobody did fails at connect, at once and without a
//! request, with an error naming `troupe mcp login <server>`; so does a connection whose
//! refresh token is refused mid-session (the connection ends, the pool reports it and retries
//! with backoff, and succeeds once someone has logged in).

mod authorizer;
mod decide;
mod discovery;
mod login;
pub mod store;

pub(crate) use authorizer::Authorizer;
pub use login::{LoginOutcome, LoginStatus, login, logout, status};
pub use store::{StoredLogin, TokenStore};

use crate::mcp::metrics::OAuthFailureReason;
use rmcp::transport::auth::AuthorizationManager;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use troupe_actors::ports::McpOAuth;

/// Reads an environment variable (a seam: tests hand the connector their own).
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The process environment.
pub fn process_env() -> EnvLookup {
    Arc::new(|name| std::env::var(name).ok())
}

/// Where the logins of a data directory are kept.
pub fn token_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("mcp-auth")
}

/// Why troupe could not get (or use) a token for a server. Each says what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OAuthError {
    /// Nobody logged in, or the login can no longer be used.
    #[error("MCP server `{server}` needs a login: {reason}; run `troupe mcp login {server}`")]
    LoginRequired { server: String, reason: String },
    /// The server refused a token just renewed.
    #[error(
        "MCP server `{server}` refused its OAuth token even after renewing it; run `troupe mcp login {server}`"
    )]
    TokenRejected { server: String },
    /// The server wants a scope the token was not granted.
    #[error(
        "MCP server `{server}` needs the OAuth scope `{scope}`, which its token does not carry; run `troupe mcp login {server}` (the login asks for it)"
    )]
    InsufficientScope { server: String, scope: String },
    /// The authorization server refused the client credentials.
    #[error(
        "the authorization server of MCP server `{server}` refused troupe's client credentials: {message}"
    )]
    CredentialsRefused { server: String, message: String },
    /// Discovery, the token endpoint or the token file failed; worth retrying.
    #[error("OAuth for MCP server `{server}` failed: {message}")]
    Unavailable { server: String, message: String },
    /// The configuration cannot work (a missing variable, a server without `oauth`).
    #[error("OAuth configuration of MCP server `{server}`: {message}")]
    Config { server: String, message: String },
    /// The interactive login did not complete (refused, timed out, a bad redirect).
    #[error("the login to MCP server `{server}` failed: {message}")]
    Login { server: String, message: String },
}

impl OAuthError {
    /// Its bounded metric label.
    pub fn reason(&self) -> OAuthFailureReason {
        match self {
            Self::LoginRequired { .. } | Self::Login { .. } => OAuthFailureReason::LoginRequired,
            Self::TokenRejected { .. } => OAuthFailureReason::TokenRejected,
            Self::InsufficientScope { .. } => OAuthFailureReason::InsufficientScope,
            Self::Unavailable { .. } => OAuthFailureReason::Unavailable,
            Self::CredentialsRefused { .. } | Self::Config { .. } => OAuthFailureReason::Config,
        }
    }

    /// Whether a connection cannot go on: only a login (or a configuration change) fixes it.
    pub fn ends_connection(&self) -> bool {
        matches!(
            self,
            Self::LoginRequired { .. }
                | Self::TokenRejected { .. }
                | Self::CredentialsRefused { .. }
        )
    }
}

/// What a stored token looks like. `Debug` leaves the token out.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenSnapshot {
    pub client_id: String,
    /// The bearer token itself (never printed).
    pub access_token: String,
    /// When it was received (seconds since the epoch).
    pub received_at: Option<u64>,
    pub expires_in: Option<Duration>,
    pub has_refresh_token: bool,
    pub scopes: Vec<String>,
}

impl std::fmt::Debug for TokenSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSnapshot")
            .field("client_id", &self.client_id)
            .field("access_token", &"<redacted>")
            .field("received_at", &self.received_at)
            .field("expires_in", &self.expires_in)
            .field("has_refresh_token", &self.has_refresh_token)
            .field("scopes", &self.scopes)
            .finish()
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// rmcp's OAuth client for the server at `url`. Hosts that discovered metadata names may be
/// loopback or private addresses only when `url` is one of the same kind.
async fn manager(url: &str) -> Result<AuthorizationManager, String> {
    AuthorizationManager::new(url)
        .await
        .map_err(|e| format!("cannot set up OAuth for {url}: {e}"))
}

/// The configured client id: `client_id`, else the variable `client_id_env` names.
fn client_id(
    server: &str,
    oauth: &McpOAuth,
    env: &EnvLookup,
) -> Result<Option<String>, OAuthError> {
    if let Some(id) = &oauth.client_id {
        return Ok(Some(id.clone()));
    }
    oauth
        .client_id_env
        .as_deref()
        .map(|name| required_var(server, name, env))
        .transpose()
}

/// The configured client secret (from the variable `client_secret_env` names).
fn client_secret(
    server: &str,
    oauth: &McpOAuth,
    env: &EnvLookup,
) -> Result<Option<String>, OAuthError> {
    oauth
        .client_secret_env
        .as_deref()
        .map(|name| required_var(server, name, env))
        .transpose()
}

fn required_var(server: &str, name: &str, env: &EnvLookup) -> Result<String, OAuthError> {
    env(name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| OAuthError::Config {
            server: server.to_owned(),
            message: format!("the environment variable `{name}` is not set"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_command_that_fixes_them() {
        let e = OAuthError::LoginRequired {
            server: "remote".into(),
            reason: "no OAuth login is stored for http://x/mcp".into(),
        };
        assert!(
            e.to_string().contains("run `troupe mcp login remote`"),
            "{e}"
        );
        assert!(e.ends_connection());
        assert_eq!(e.reason(), OAuthFailureReason::LoginRequired);
        let e = OAuthError::Unavailable {
            server: "remote".into(),
            message: "connection refused".into(),
        };
        assert!(!e.ends_connection());
    }

    #[test]
    fn client_ids_and_secrets_come_from_the_named_variables() {
        let env: EnvLookup = Arc::new(|name| (name == "ID").then(|| "from-env".to_owned()));
        let mut oauth = McpOAuth {
            client_id_env: Some("ID".into()),
            ..McpOAuth::default()
        };
        assert_eq!(
            client_id("s", &oauth, &env).unwrap().as_deref(),
            Some("from-env")
        );
        oauth.client_id = Some("literal".into());
        assert_eq!(
            client_id("s", &oauth, &env).unwrap().as_deref(),
            Some("literal")
        );
        assert_eq!(client_secret("s", &oauth, &env).unwrap(), None);
        oauth.client_secret_env = Some("MISSING".into());
        let e = client_secret("s", &oauth, &env).unwrap_err();
        assert!(e.to_string().contains("`MISSING` is not set"), "{e}");
    }
}
