//! Bearer-token authentication and the project scope a token grants.
//!
//! Every route but `/healthz`, `/readyz` (and `/metrics` when it is public) passes through
//! [`require_token`], which puts the caller's [`Scope`] into the request. A browser signed in
//! to the web console proves itself with its sign-in cookie instead ([`crate::sign_in`]); such
//! a request that could change something must also carry an `Origin` (which the edge has
//! checked is the service's own), so that only the console's own pages use the cookie. The Sessions
//! registry checks the scope against a session's project on every call, and a session out of
//! scope answers `NotFound`, exactly like an unknown id, so ids do not leak across projects.

use super::error::ApiError;
use crate::sign_in::{self, KeyId, MacKey};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use troupe_proto::AgentError;

/// What a caller may touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every project and sessions outside any project (no tokens configured, stdio, or a
    /// token with `"*"`).
    All,
    /// These projects only.
    Projects(BTreeSet<String>),
}

impl Scope {
    pub fn projects<I: IntoIterator<Item = S>, S: Into<String>>(projects: I) -> Self {
        let set: BTreeSet<String> = projects.into_iter().map(Into::into).collect();
        if set.contains("*") {
            Self::All
        } else {
            Self::Projects(set)
        }
    }

    /// Whether a session of `project` is visible.
    pub fn sees(&self, project: Option<&str>) -> bool {
        match (self, project) {
            (Self::All, _) => true,
            (Self::Projects(set), Some(p)) => set.contains(p),
            (Self::Projects(_), None) => false,
        }
    }

    /// The project a new session goes to: the one asked for (if visible), else the token's
    /// only project, else none (`All`) or an error (several projects to choose from).
    pub fn project_for_new(&self, asked: Option<String>) -> Result<Option<String>, AgentError> {
        match (self, asked) {
            (_, Some(p)) if self.sees(Some(&p)) => Ok(Some(p)),
            (_, Some(p)) => Err(AgentError::not_found("project", p)),
            (Self::All, None) => Ok(None),
            (Self::Projects(set), None) if set.len() == 1 => Ok(set.iter().next().cloned()),
            (Self::Projects(set), None) if set.is_empty() => Err(AgentError::invalid(
                "this token is bound to no project: it cannot create sessions",
            )),
            (Self::Projects(_), None) => Err(AgentError::invalid(
                "project_id is required: this token is bound to several projects",
            )),
        }
    }
}

/// The token table. Tokens are kept hashed: a lookup compares digests, not secrets.
#[derive(Clone)]
pub struct Auth {
    tokens: Arc<HashMap<[u8; 32], Scope>>,
    /// Each token's sign-in key, by key id, with the scope the token grants.
    sign_in_keys: Arc<HashMap<KeyId, (MacKey, Scope)>>,
    /// The console's cookie: its name carries the listen port, so that two services on one
    /// host (cookies ignore ports) do not sign each other out.
    cookie_name: Arc<str>,
    /// How long a sign-in lasts.
    sign_in_ttl: std::time::Duration,
}

impl Default for Auth {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("tokens", &self.tokens.len())
            .field("cookie_name", &self.cookie_name)
            .finish()
    }
}

/// How a request proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// No tokens are configured: everyone is trusted.
    Open,
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// The console's sign-in cookie.
    SignIn,
}

/// The cookie's name when the listen port is not known (a router built outside `serve_http`).
pub const DEFAULT_COOKIE: &str = "troupe_console";

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Auth {
    /// `(secret, projects)` pairs; none means the API is open.
    pub fn new(tokens: impl IntoIterator<Item = (String, Vec<String>)>) -> Self {
        let tokens: Vec<(String, Scope)> = tokens
            .into_iter()
            .map(|(t, p)| (t, Scope::projects(p)))
            .collect();
        Self {
            sign_in_keys: Arc::new(
                tokens
                    .iter()
                    .map(|(t, s)| (sign_in::key_id(t), (sign_in::mac_key(t), s.clone())))
                    .collect(),
            ),
            tokens: Arc::new(tokens.into_iter().map(|(t, s)| (digest(&t), s)).collect()),
            cookie_name: Arc::from(DEFAULT_COOKIE),
            sign_in_ttl: std::time::Duration::from_secs(12 * 3600),
        }
    }

    /// The same tokens, with the console's cookie named for `port` and signing in for `ttl`.
    pub fn with_sign_in(mut self, port: Option<u16>, ttl: std::time::Duration) -> Self {
        self.cookie_name = match port {
            Some(p) => Arc::from(format!("{DEFAULT_COOKIE}_{p}")),
            None => Arc::from(DEFAULT_COOKIE),
        };
        self.sign_in_ttl = ttl;
        self
    }

    pub fn cookie_name(&self) -> &str {
        &self.cookie_name
    }

    pub fn sign_in_ttl(&self) -> std::time::Duration {
        self.sign_in_ttl
    }

    /// The cookie value that signs a browser in with `token`; `None` when the token grants
    /// nothing (or no tokens are configured: there is nothing to sign in to).
    pub fn sign_in(&self, token: &str) -> Option<String> {
        let token = token.trim();
        self.tokens.get(&digest(token))?;
        let expires = now_secs().saturating_add(self.sign_in_ttl.as_secs());
        Some(sign_in::issue(
            &sign_in::key_id(token),
            &sign_in::mac_key(token),
            expires,
        ))
    }

    /// The scope of a console cookie value (valid, unexpired, of a configured token).
    pub fn check_cookie(&self, value: &str) -> Option<Scope> {
        let id = sign_in::verify(
            value,
            |id| self.sign_in_keys.get(id).map(|(key, _)| key),
            now_secs(),
        )?;
        self.sign_in_keys.get(&id).map(|(_, scope)| scope.clone())
    }

    /// Who a request is: the `Authorization` header when it has one (a bad one grants
    /// nothing, whatever cookie comes with it), else the console's cookie.
    pub fn check_request(&self, headers: &HeaderMap) -> Option<(Scope, Credential)> {
        if self.is_open() {
            return Some((Scope::All, Credential::Open));
        }
        if let Some(authorization) = headers.get(header::AUTHORIZATION) {
            let scope = self.check(authorization.to_str().ok())?;
            return Some((scope, Credential::Bearer));
        }
        let cookies = || {
            headers
                .get_all(header::COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
        };
        let own = cookies()
            .find_map(|h| sign_in::cookie_value(h, &self.cookie_name))
            .and_then(|v| self.check_cookie(v));
        // A call another node forwarded carries the cookie of the node the browser signed in
        // to, named for that node's port: any console cookie this service's tokens signed
        // stands for its token here too.
        let scope = match own {
            Some(scope) => scope,
            None if headers.contains_key(crate::forward::FORWARDED_BY) => cookies()
                .flat_map(|h| sign_in::console_cookie_values(h, DEFAULT_COOKIE))
                .find_map(|v| self.check_cookie(v))?,
            None => return None,
        };
        Some((scope, Credential::SignIn))
    }

    /// No tokens: everyone gets [`Scope::All`].
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The scope of an `Authorization` header value; `None` when it grants nothing.
    pub fn check(&self, authorization: Option<&str>) -> Option<Scope> {
        if self.is_open() {
            return Some(Scope::All);
        }
        let (scheme, token) = authorization?.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.tokens.get(&digest(token.trim())).cloned()
    }
}

/// Middleware: 401 without a valid token (or console cookie); otherwise the caller's
/// [`Scope`] goes into the request's extensions. A cookie alone does not let a request
/// without an `Origin` change anything (403).
pub async fn require_token(State(auth): State<Auth>, mut req: Request, next: Next) -> Response {
    match auth.check_request(req.headers()) {
        Some((_, Credential::SignIn)) if !cookie_may(req.method(), req.headers()) => ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "a request signed in by the console's cookie may change state only from the \
                 console's own pages (with an Origin header); other clients send \
                 Authorization: Bearer <token>",
        )
        .into_response(),
        Some((scope, _)) => {
            req.extensions_mut().insert(scope);
            next.run(req).await
        }
        None => ApiError::unauthorized().into_response(),
    }
}

/// Whether a request that only has the console's cookie may go on: a read, or one that
/// names its Origin (the edge refused it already if that is not the service's own).
pub fn cookie_may(method: &Method, headers: &HeaderMap) -> bool {
    let upgrade = headers.contains_key(header::UPGRADE);
    (matches!(*method, Method::GET | Method::HEAD) && !upgrade)
        || headers.contains_key(header::ORIGIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_grant_their_projects_only() {
        let auth = Auth::new([
            ("a".to_owned(), vec!["alpha".to_owned()]),
            ("ops".to_owned(), vec!["*".to_owned()]),
        ]);
        assert_eq!(auth.check(None), None);
        assert_eq!(auth.check(Some("Bearer nope")), None);
        assert_eq!(auth.check(Some("a")), None, "the scheme is required");
        let a = auth.check(Some("Bearer a")).unwrap();
        assert!(a.sees(Some("alpha")));
        assert!(!a.sees(Some("beta")));
        assert!(!a.sees(None));
        assert_eq!(auth.check(Some("Bearer ops")), Some(Scope::All));
        // The scheme is case-insensitive (RFC 7235); the token is not.
        assert_eq!(auth.check(Some("bearer ops")), Some(Scope::All));
        assert_eq!(auth.check(Some("BEARER  ops")), Some(Scope::All));
        assert_eq!(auth.check(Some("Bearer OPS")), None);
        assert_eq!(auth.check(Some("Basic ops")), None);
        assert_eq!(auth.check(Some("Bearerops")), None);
        assert_eq!(Auth::default().check(None), Some(Scope::All));
    }

    #[test]
    fn a_sign_in_cookie_stands_for_its_token() {
        let auth = Auth::new([
            ("a".to_owned(), vec!["alpha".to_owned()]),
            ("ops".to_owned(), vec!["*".to_owned()]),
        ])
        .with_sign_in(Some(7878), std::time::Duration::from_secs(60));
        assert_eq!(auth.cookie_name(), "troupe_console_7878");
        assert_eq!(auth.sign_in("nope"), None);
        let cookie = auth.sign_in(" a ").unwrap();
        assert!(!cookie.contains("alpha"));
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            format!("x=1; troupe_console_7878={cookie}")
                .parse()
                .unwrap(),
        );
        let (scope, via) = auth.check_request(&headers).unwrap();
        assert_eq!(via, Credential::SignIn);
        assert!(scope.sees(Some("alpha")) && !scope.sees(Some("beta")));
        // The same tokens again (a restart) take the cookie; others do not.
        let restarted = Auth::new([("a".to_owned(), vec!["alpha".to_owned()])])
            .with_sign_in(Some(7878), std::time::Duration::from_secs(60));
        assert!(restarted.check_request(&headers).is_some());
        let revoked = Auth::new([("ops".to_owned(), vec!["*".to_owned()])])
            .with_sign_in(Some(7878), std::time::Duration::from_secs(60));
        assert!(revoked.check_request(&headers).is_none());
        // Another port's service reads another cookie.
        let other = auth
            .clone()
            .with_sign_in(Some(9000), std::time::Duration::from_secs(60));
        assert!(other.check_request(&headers).is_none());
        // ... unless another node forwarded the call: the cookie it signed is taken.
        let mut forwarded = headers.clone();
        forwarded.insert(crate::forward::FORWARDED_BY, "b".parse().unwrap());
        assert_eq!(
            other.check_request(&forwarded).map(|(_, via)| via),
            Some(Credential::SignIn)
        );
        assert!(revoked.check_request(&forwarded).is_none());
        // A bad Authorization header is not rescued by the cookie.
        headers.insert(header::AUTHORIZATION, "Bearer wrong".parse().unwrap());
        assert!(auth.check_request(&headers).is_none());
        // No tokens: nothing to sign in to.
        assert_eq!(Auth::default().sign_in("a"), None);
    }

    #[test]
    fn a_cookie_changes_state_only_with_an_origin() {
        let mut h = HeaderMap::new();
        assert!(cookie_may(&Method::GET, &h));
        assert!(!cookie_may(&Method::POST, &h));
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        assert!(!cookie_may(&Method::GET, &h));
        h.insert(header::ORIGIN, "http://127.0.0.1:7878".parse().unwrap());
        assert!(cookie_may(&Method::GET, &h));
        assert!(cookie_may(&Method::POST, &h));
    }

    #[test]
    fn where_a_new_session_goes() {
        let one = Scope::projects(["alpha"]);
        assert_eq!(one.project_for_new(None).unwrap().as_deref(), Some("alpha"));
        assert!(matches!(
            one.project_for_new(Some("beta".into())),
            Err(AgentError::NotFound { .. })
        ));
        let two = Scope::projects(["alpha", "beta"]);
        assert!(matches!(
            two.project_for_new(None),
            Err(AgentError::InvalidInput { .. })
        ));
        assert_eq!(Scope::All.project_for_new(None).unwrap(), None);
        // A token bound to no project (the metrics scraper's) is told so, not "several".
        let none = Scope::projects(Vec::<&str>::new());
        match none.project_for_new(None) {
            Err(AgentError::InvalidInput { message }) => {
                assert!(message.contains("no project"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}
