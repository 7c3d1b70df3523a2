//! The bearer token of one connection: read from the token store before every request,
//! renewed when it is about to expire (a refresh, or the client-credentials grant asked
//! again), and renewed once more when the server answers 401, before the request is sent a
//! second time. Discovery, registration, PKCE, the token requests and their `resource`
//! parameter are rmcp's (`AuthorizationManager`); the decisions are in [`super::decide`].

use super::decide::{needs_renewal, renewal_outcome, renewed_meanwhile};
use super::store::{CredentialFile, StoredLogin, TokenStore};
use super::{EnvLookup, OAuthError, discovery, now_secs};
use crate::mcp::metrics::{self, RenewalOutcome, RenewalTrigger};
use oauth2::TokenResponse;
use rmcp::transport::auth::{AuthorizationManager, ClientCredentialsConfig, OAuthClientConfig};
use rmcp::transport::streamable_http_client::StreamableHttpError;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use troupe_actors::ports::{McpOAuth, McpOAuthGrant};

/// The redirect URI rmcp's client is configured with when the login recorded none (a refresh
/// does not send it).
const PLACEHOLDER_REDIRECT: &str = "http://127.0.0.1/callback";

/// One connection's tokens.
pub(crate) struct Authorizer {
    server: Arc<str>,
    /// The URL the connection sends its tokens to: a stored login for another is not used.
    url: Arc<str>,
    grant: McpOAuthGrant,
    /// The client the connection's tokens belong to, when it knows it.
    client_id: Option<String>,
    /// rmcp's OAuth client: discovered metadata, the configured client, the token requests.
    manager: AuthorizationManager,
    store: TokenStore,
    /// The client-credentials grant's request (id, secret, scopes, resource).
    client_credentials: Option<ClientCredentialsConfig>,
    /// One renewal at a time; a caller that waited finds the token already renewed.
    gate: tokio::sync::Mutex<()>,
    /// The last failure, for the error of the call or handshake it broke.
    failure: Mutex<Option<OAuthError>>,
    /// Fired when the login is lost for good (a person must log in again): the connection
    /// ends, and the pool says why.
    pub(crate) lost: CancellationToken,
    /// Why the login was lost (set before `lost` fires).
    lost_reason: std::sync::OnceLock<String>,
}

impl Authorizer {
    /// Sets up the tokens of `server` at `url`. Fails at once, without touching the network,
    /// when an authorization-code server has no login.
    pub(crate) async fn open(
        server: &str,
        url: &str,
        headers: &BTreeMap<String, String>,
        oauth: &McpOAuth,
        store: TokenStore,
        env: &EnvLookup,
    ) -> Result<Self, OAuthError> {
        let result = Self::open_inner(server, url, headers, oauth, store, env).await;
        if let Err(error) = &result {
            metrics::oauth_failure(error.reason());
        }
        result
    }

    async fn open_inner(
        server: &str,
        url: &str,
        headers: &BTreeMap<String, String>,
        oauth: &McpOAuth,
        store: TokenStore,
        env: &EnvLookup,
    ) -> Result<Self, OAuthError> {
        let login_required = |reason: &str| OAuthError::LoginRequired {
            server: server.to_owned(),
            reason: reason.to_owned(),
        };
        let unavailable = |message: String| OAuthError::Unavailable {
            server: server.to_owned(),
            message,
        };
        let stored = store.read().map_err(unavailable)?;
        let stored = stored.filter(|login| login.is_for(url, oauth.grant, None));
        let client_secret = super::client_secret(server, oauth, env)?;
        match oauth.grant {
            McpOAuthGrant::AuthorizationCode => {
                let Some(login) = stored.filter(|l| l.credentials.is_some()) else {
                    return Err(login_required(&format!(
                        "no OAuth login is stored for {url}"
                    )));
                };
                let mut manager = super::manager(url).await.map_err(unavailable)?;
                let metadata = manager
                    .resolve_metadata_from_challenge(login.challenge.as_deref())
                    .await
                    .map_err(|e| unavailable(format!("discovery failed: {e}")))?
                    .metadata;
                let stored_issuer = login.credentials.as_ref().and_then(|c| c.issuer.clone());
                if let (Some(stored), Some(current)) = (&stored_issuer, &metadata.issuer)
                    && stored != current
                {
                    return Err(login_required(&format!(
                        "the authorization server is now {current}, the login was with {stored}"
                    )));
                }
                manager.set_metadata(metadata);
                let client_id = login
                    .credentials
                    .as_ref()
                    .map(|c| c.client_id.clone())
                    .unwrap_or_default();
                let mut client = OAuthClientConfig::new(
                    client_id,
                    login
                        .redirect_uri
                        .as_deref()
                        .unwrap_or(PLACEHOLDER_REDIRECT),
                );
                if let Some(secret) = client_secret.or(login.registered_client_secret.clone()) {
                    client = client.with_client_secret(secret);
                }
                manager
                    .configure_client(client)
                    .map_err(|e| unavailable(format!("cannot configure the client: {e}")))?;
                manager.set_credential_store(CredentialFile {
                    store: store.clone(),
                    base: StoredLogin {
                        credentials: None,
                        ..login
                    },
                });
                // A new login may have registered another client: its tokens are for this
                // URL all the same, so only the URL and the grant are checked.
                Ok(Self::new(
                    server,
                    (url, oauth.grant, None),
                    manager,
                    store,
                    None,
                ))
            }
            McpOAuthGrant::ClientCredentials => {
                let client_id =
                    super::client_id(server, oauth, env)?.ok_or_else(|| OAuthError::Config {
                        server: server.to_owned(),
                        message:
                            "the client_credentials grant needs `client_id` or `client_id_env`"
                                .into(),
                    })?;
                let client_secret = client_secret.ok_or_else(|| OAuthError::Config {
                    server: server.to_owned(),
                    message: "the client_credentials grant needs `client_secret_env`".into(),
                })?;
                let challenge = match stored.as_ref().and_then(|l| l.challenge.clone()) {
                    Some(challenge) => Some(challenge),
                    None => discovery::probe(url, headers).await.map_err(unavailable)?,
                };
                let mut manager = super::manager(url).await.map_err(unavailable)?;
                let metadata = manager
                    .resolve_metadata_from_challenge(challenge.as_deref())
                    .await
                    .map_err(|e| unavailable(format!("discovery failed: {e}")))?
                    .metadata;
                manager.set_metadata(metadata);
                let resource = discovery::resource_indicator(url, challenge.as_deref()).await;
                let config = ClientCredentialsConfig::ClientSecret {
                    client_id: client_id.clone(),
                    client_secret,
                    scopes: oauth.scopes.clone(),
                    resource: Some(resource),
                };
                manager
                    .validate_client_credentials_metadata(&config)
                    .and_then(|()| manager.configure_client_credentials(&config))
                    .map_err(|e| OAuthError::Config {
                        server: server.to_owned(),
                        message: e.to_string(),
                    })?;
                let mut base = StoredLogin::new(url, oauth.grant);
                base.challenge = challenge;
                // Tokens of another client are not this one's.
                let reusable = stored.filter(|l| {
                    l.credentials
                        .as_ref()
                        .is_some_and(|c| c.client_id == client_id)
                });
                if reusable.is_none() {
                    store.write(&base).map_err(unavailable)?;
                }
                manager.set_credential_store(CredentialFile {
                    store: store.clone(),
                    base,
                });
                Ok(Self::new(
                    server,
                    (url, oauth.grant, Some(client_id)),
                    manager,
                    store,
                    Some(config),
                ))
            }
        }
    }

    fn new(
        server: &str,
        (url, grant, client_id): (&str, McpOAuthGrant, Option<String>),
        manager: AuthorizationManager,
        store: TokenStore,
        client_credentials: Option<ClientCredentialsConfig>,
    ) -> Self {
        Self {
            server: server.into(),
            url: url.into(),
            grant,
            client_id,
            manager,
            store,
            client_credentials,
            gate: tokio::sync::Mutex::new(()),
            failure: Mutex::new(None),
            lost: CancellationToken::new(),
            lost_reason: std::sync::OnceLock::new(),
        }
    }

    /// The stored access token and whether it is still good to send.
    fn stored_token(&self) -> Result<Option<(String, bool)>, OAuthError> {
        let login = self
            .store
            .read()
            .map_err(|message| OAuthError::Unavailable {
                server: self.server.to_string(),
                message,
            })?;
        let login = login.filter(|l| l.is_for(&self.url, self.grant, self.client_id.as_deref()));
        Ok(login.and_then(|l| l.snapshot()).map(|snapshot| {
            let fresh = !needs_renewal(now_secs(), snapshot.received_at, snapshot.expires_in);
            (snapshot.access_token, fresh)
        }))
    }

    /// The token to send now, renewed first when it is missing or about to expire.
    pub(crate) async fn token(&self) -> Result<String, OAuthError> {
        match self.stored_token()? {
            Some((token, true)) => Ok(token),
            Some((token, false)) => self.renew(Some(&token), RenewalTrigger::Expiring).await,
            None => self.renew(None, RenewalTrigger::Missing).await,
        }
    }

    /// A new token in place of `sent` (none, expiring, or refused by the server).
    pub(crate) async fn renew(
        &self,
        sent: Option<&str>,
        trigger: RenewalTrigger,
    ) -> Result<String, OAuthError> {
        let _gate = self.gate.lock().await;
        let stored = self.stored_token()?;
        if let Some(token) = renewed_meanwhile(
            sent,
            stored.as_ref().map(|(t, _)| t.as_str()),
            stored.as_ref().is_some_and(|(_, fresh)| *fresh),
        ) {
            return Ok(token.to_owned());
        }
        let span = tracing::info_span!(
            "mcp_oauth_renew",
            mcp_server = %self.server,
            grant = self.grant.as_str(),
            trigger = trigger.as_str(),
            outcome = tracing::field::Empty,
        );
        let result = async {
            match (&self.client_credentials, self.grant) {
                (Some(config), McpOAuthGrant::ClientCredentials) => {
                    self.manager.exchange_client_credentials(config).await
                }
                _ if sent.is_none() => Err(rmcp::transport::auth::AuthError::AuthorizationRequired),
                _ => self.manager.refresh_token().await,
            }
        }
        .instrument(span.clone())
        .await;
        let outcome = match &result {
            Ok(_) => RenewalOutcome::Ok,
            Err(error) => renewal_outcome(error),
        };
        span.record("outcome", outcome.as_str());
        metrics::oauth_renewal(self.grant, trigger, outcome);
        match result {
            Ok(token) => {
                span.in_scope(|| {
                    tracing::info!(
                        mcp_server = %self.server,
                        grant = self.grant.as_str(),
                        trigger = trigger.as_str(),
                        expires_in_s = token.expires_in().map(|d| d.as_secs()),
                        "mcp oauth token renewed"
                    );
                });
                Ok(token.access_token().secret().clone())
            }
            Err(error) => {
                let failure = match (outcome, self.grant) {
                    (RenewalOutcome::LoginRequired, McpOAuthGrant::AuthorizationCode) => {
                        OAuthError::LoginRequired {
                            server: self.server.to_string(),
                            reason: if sent.is_none() {
                                "no OAuth token is stored".to_owned()
                            } else {
                                format!("the token could not be refreshed ({error})")
                            },
                        }
                    }
                    (RenewalOutcome::LoginRequired, McpOAuthGrant::ClientCredentials) => {
                        OAuthError::CredentialsRefused {
                            server: self.server.to_string(),
                            message: error.to_string(),
                        }
                    }
                    _ => OAuthError::Unavailable {
                        server: self.server.to_string(),
                        message: format!("the token could not be renewed: {error}"),
                    },
                };
                span.in_scope(|| {
                    tracing::warn!(mcp_server = %self.server, error = %failure, "mcp oauth renewal failed");
                });
                Err(self.fail(failure))
            }
        }
    }

    /// Notes in the stored login that the server asked for `scope`, so that the next login
    /// asks for it.
    fn want(&self, scope: &str) {
        let Ok(Some(mut login)) = self.store.read() else {
            return;
        };
        if login.want(scope)
            && let Err(error) = self.store.write(&login)
        {
            tracing::warn!(mcp_server = %self.server, %error, "cannot note the scope the server wants");
        }
    }

    /// Records `failure` (counted, kept for the error message, and the login marked lost
    /// when only a person can fix it) and hands it back.
    pub(crate) fn fail(&self, failure: OAuthError) -> OAuthError {
        metrics::oauth_failure(failure.reason());
        if failure.ends_connection() {
            let _ = self.lost_reason.set(failure.to_string());
            self.lost.cancel();
        }
        *self
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(failure.clone());
        failure
    }

    /// The last failure, once.
    pub(crate) fn take_failure(&self) -> Option<OAuthError> {
        self.failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// Why the login was lost, once `lost` has fired.
    pub(crate) fn lost_reason(&self) -> Option<String> {
        self.lost_reason.get().cloned()
    }

    /// Runs one HTTP exchange with the current token; after a 401, renews the token once and
    /// runs it again.
    pub(crate) async fn send<T, E, F, Fut>(&self, call: F) -> Result<T, StreamableHttpError<E>>
    where
        E: std::error::Error + Send + Sync + 'static,
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<T, StreamableHttpError<E>>>,
    {
        let as_error = |failure: OAuthError| {
            StreamableHttpError::Auth(rmcp::transport::auth::AuthError::OAuthError(
                failure.to_string(),
            ))
        };
        let token = self.token().await.map_err(as_error)?;
        let first = call(Some(token.clone())).await;
        let second = match first {
            Err(StreamableHttpError::AuthRequired(_)) => {
                tracing::info!(mcp_server = %self.server, "the server refused the token (401); renewing it once");
                let fresh = self
                    .renew(Some(&token), RenewalTrigger::Rejected)
                    .await
                    .map_err(as_error)?;
                call(Some(fresh)).await
            }
            other => other,
        };
        match second {
            Err(StreamableHttpError::AuthRequired(challenge)) => {
                self.fail(OAuthError::TokenRejected {
                    server: self.server.to_string(),
                });
                Err(StreamableHttpError::AuthRequired(challenge))
            }
            Err(StreamableHttpError::InsufficientScope(error)) => {
                let scope = error.required_scope.clone().unwrap_or_default();
                self.want(&scope);
                self.fail(OAuthError::InsufficientScope {
                    server: self.server.to_string(),
                    scope,
                });
                Err(StreamableHttpError::InsufficientScope(error))
            }
            other => other,
        }
    }
}
