//! Bearer-token authentication and the project scope a token grants.
//!
//! Every route but `/healthz`, `/readyz` (and `/metrics` when it is public) passes through
//! [`require_token`], which puts the caller's [`Scope`] into the request. The Sessions
//! registry checks the scope against a session's project on every call, and a session out of
//! scope answers `NotFound`, exactly like an unknown id, so ids do not leak across projects.

use super::error::ApiError;
use axum::extract::{Request, State};
use axum::http::header;
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
            (Self::Projects(_), None) => Err(AgentError::invalid(
                "project_id is required: this token is bound to several projects",
            )),
        }
    }
}

/// The token table. Tokens are kept hashed: a lookup compares digests, not secrets.
#[derive(Clone, Default)]
pub struct Auth {
    tokens: Arc<HashMap<[u8; 32], Scope>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Auth {
    /// `(secret, projects)` pairs; none means the API is open.
    pub fn new(tokens: impl IntoIterator<Item = (String, Vec<String>)>) -> Self {
        Self {
            tokens: Arc::new(
                tokens
                    .into_iter()
                    .map(|(t, p)| (digest(&t), Scope::projects(p)))
                    .collect(),
            ),
        }
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

/// Middleware: 401 without a valid token; otherwise the caller's [`Scope`] goes into the
/// request's extensions.
pub async fn require_token(State(auth): State<Auth>, mut req: Request, next: Next) -> Response {
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match auth.check(header) {
        Some(scope) => {
            req.extensions_mut().insert(scope);
            next.run(req).await
        }
        None => ApiError::unauthorized().into_response(),
    }
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
    }
}
