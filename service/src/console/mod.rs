//! The web console (P7): `troupe serve` serves it at `/`, from assets compiled into the
//! binary (no network and no other server at run time, no build step).
//!
//! | route | |
//! |---|---|
//! | `GET /` | the session list (`?q=` searches), server-rendered: it reads without JavaScript |
//! | `GET /sessions/{id}` | a session's live view (its header and latest messages server-rendered) |
//! | `GET /console/{asset}` | the script and the style sheet (`ETag`, revalidated) |
//! | `POST /console/sign-in` | `{token}` (JSON) or a form: sets the sign-in cookie ([`crate::sign_in`]) |
//! | `POST /console/sign-out` | clears it |
//! | `GET /tokens` | the authorization tokens, the form that issues one, a revoke button each |
//! | `POST /console/tokens` | a form: issues a token and shows its secret once |
//! | `POST /console/tokens/{id}/revoke` | revokes a token, back to `/tokens` |
//!
//! The pages authenticate like the API (a bearer token, or the sign-in cookie); without
//! either, when tokens are configured, they answer the sign-in form. Everything live goes
//! through the ordinary API with the cookie: `POST /rpc`, the REST routes and the session's
//! SSE stream. Pages carry a strict Content-Security-Policy (only the service's own script,
//! styles and connections; no framing).

pub mod page;

use crate::auth::{Auth, Credential, Scope};
use crate::extract::body;
use crate::sign_in;
use crate::state::AppState;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;
use troupe_proto::governance::IssuedToken;
use troupe_runtime::config::ConsoleConfig;

/// The page size of the live view's message listing (and of its server-rendered part).
pub const PAGE: usize = 50;

/// How many recorded events before the present a live view replays (tasks in flight, tool
/// durations, trace ids, routing) before it goes live.
pub const REPLAY_EVENTS: u64 = 1_000;

/// Rows of the server-rendered session list.
pub const MAX_ROWS: usize = 500;

/// What the console's handlers share.
#[derive(Clone)]
pub struct ConsoleState {
    app: AppState,
    auth: Auth,
    config: ConsoleConfig,
    /// Tokens just issued from the form, waiting for the page the form's answer redirects
    /// to: each is shown once, then forgotten (a reload shows no secret and issues nothing).
    issued: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<(String, IssuedToken)>>>,
}

/// How many issued tokens wait for their page at most (the oldest is dropped).
const ISSUED_WAITING: usize = 32;

impl ConsoleState {
    fn stash(&self, token: IssuedToken) -> String {
        let key = uuid::Uuid::new_v4().simple().to_string();
        let mut waiting = self
            .issued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if waiting.len() >= ISSUED_WAITING {
            waiting.pop_front();
        }
        waiting.push_back((key.clone(), token));
        key
    }

    fn take(&self, key: &str) -> Option<IssuedToken> {
        let mut waiting = self
            .issued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = waiting.iter().position(|(k, _)| k == key)?;
        waiting.remove(at).map(|(_, token)| token)
    }
}

/// The console's routes (they authenticate on their own: a page without credentials is the
/// sign-in form, not a 401).
pub fn routes(app: AppState, auth: Auth, config: ConsoleConfig) -> Router {
    Router::new()
        .route("/", get(sessions_page))
        .route("/sessions/{id}", get(session_page))
        .route("/console/sign-in", post(sign_in_route))
        .route("/console/sign-out", post(sign_out))
        .route("/tokens", get(tokens_page))
        .route("/console/tokens", post(issue_token))
        .route("/console/tokens/{id}/revoke", post(revoke_token))
        .route("/console/{asset}", get(asset))
        .with_state(ConsoleState {
            app,
            auth,
            config,
            issued: Default::default(),
        })
}

/// The console's static files.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const ASSETS: &[Asset] = &[
    Asset {
        name: "console.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/console.js"),
    },
    Asset {
        name: "console.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("assets/console.css"),
    },
];

/// Each asset's ETag (a digest of its bytes), computed once.
static ETAGS: LazyLock<BTreeMap<&'static str, String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let digest = Sha256::digest(a.body.as_bytes());
            let tag: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
            (a.name, format!("\"{tag}\""))
        })
        .collect()
});

async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    let Some(asset) = ASSETS.iter().find(|a| a.name == name) else {
        return crate::error::ApiError::route_not_found().into_response();
    };
    let etag = ETAGS.get(asset.name).cloned().unwrap_or_default();
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let common = [
        (header::ETAG, etag),
        (header::CACHE_CONTROL, "no-cache".to_owned()),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
    ];
    if fresh {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (
        common,
        [(header::CONTENT_TYPE, asset.content_type)],
        asset.body,
    )
        .into_response()
}

/// The headers of every page: a strict CSP (the service's own script, styles and
/// connections only; no plugin, no frame), no sniffing, no referrer to other sites, never
/// cached.
fn html(status: StatusCode, text: String) -> Response {
    let mut response = (status, text).into_response();
    let h = response.headers_mut();
    let set = |h: &mut HeaderMap, name, value: &'static str| {
        h.insert(name, HeaderValue::from_static(value));
    };
    set(h, header::CONTENT_TYPE, "text/html; charset=utf-8");
    set(
        h,
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    );
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    // `same-origin`, not `no-referrer`: with `no-referrer` a form post says `Origin: null`,
    // which the edge refuses; other sites (a trace viewer) still get no referrer.
    set(h, header::REFERRER_POLICY, "same-origin");
    set(h, header::X_FRAME_OPTIONS, "DENY");
    set(h, header::CACHE_CONTROL, "no-store");
    response
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ListQuery {
    q: String,
}

/// `GET /`: the session list.
async fn sessions_page(
    State(c): State<ConsoleState>,
    headers: HeaderMap,
    q: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Some((scope, via)) = c.auth.check_request(&headers) else {
        return html(StatusCode::OK, page::sign_in("/", None));
    };
    let q = q.map(|Query(q)| q.q).unwrap_or_default();
    let q = q.trim();
    let mut all = match c.app.rpc.sessions.list(scope.clone(), None).await {
        Ok(all) => all,
        Err(e) => return error_page(&e, via),
    };
    all.sort_by(|a, b| {
        b.updated_ms
            .max(b.created_ms)
            .cmp(&a.updated_ms.max(a.created_ms))
    });
    let current = current_sessions(&c, &scope, &all).await;
    let matching: Vec<_> = all.iter().filter(|r| page::matches(r, q)).collect();
    let rows: Vec<page::SessionRow<'_>> = matching
        .iter()
        .take(MAX_ROWS)
        .map(|r| page::SessionRow {
            record: r,
            current: current.contains(&r.session_id),
        })
        .collect();
    html(
        StatusCode::OK,
        page::sessions(&rows, q, all.len(), via == Credential::SignIn),
    )
}

/// The current session of each project among `sessions`.
async fn current_sessions(
    c: &ConsoleState,
    scope: &Scope,
    sessions: &[troupe_proto::store::SessionRecord],
) -> BTreeSet<troupe_proto::SessionId> {
    let projects: BTreeSet<&str> = sessions
        .iter()
        .filter_map(|r| r.project_id.as_deref())
        .collect();
    let mut current = BTreeSet::new();
    for p in projects {
        if let Ok(record) = c
            .app
            .rpc
            .sessions
            .current(scope.clone(), p.to_owned())
            .await
        {
            current.insert(record.session_id);
        }
    }
    current
}

/// `GET /sessions/{id}`: a session's live view. An id that does not decode (bad
/// percent-encoding, not UTF-8) or does not parse names no session: 404, like an unknown one.
async fn session_page(
    State(c): State<ConsoleState>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    // The segment as it was asked for when it does not decode.
    let raw = path.map_or_else(
        |_| uri.path().rsplit('/').next().unwrap_or_default().to_owned(),
        |Path(raw)| raw,
    );
    let Some((scope, via)) = c.auth.check_request(&headers) else {
        return html(
            StatusCode::OK,
            page::sign_in(&format!("/sessions/{raw}"), None),
        );
    };
    let signed_in = via == Credential::SignIn;
    let Ok(id) = raw.parse::<troupe_proto::SessionId>() else {
        return html(
            StatusCode::NOT_FOUND,
            page::not_found(&format!("There is no session {raw}."), signed_in),
        );
    };
    let sessions = &c.app.rpc.sessions;
    let record = match sessions.get(scope.clone(), id).await {
        Ok(r) => r,
        Err(e) => return error_page(&e, via),
    };
    // The head of the event record first, then the messages: whatever happens after the
    // head reaches the page as an event, so the page misses nothing between the two.
    // `null` when this node does not run the session (another node of the cluster does): the
    // page then reads the head from `/events/head`, which that node answers, before the
    // messages.
    let last_seq = match sessions.session(scope.clone(), id).await {
        Ok(handle) => handle.last_seq().await.ok(),
        Err(_) => None,
    };
    let messages = match sessions.messages(scope, id, PAGE, None).await {
        Ok(page) => page.messages,
        Err(e) => return error_page(&e, via),
    };
    let boot = serde_json::json!({
        "session": record,
        "last_seq": last_seq,
        "replay_from": last_seq.map(|seq| seq.saturating_sub(REPLAY_EVENTS)),
        "replay_events": REPLAY_EVENTS,
        "page_size": PAGE,
        "trace_url": c.config.trace_url,
    });
    html(
        StatusCode::OK,
        page::session(&record, &messages, &boot, signed_in),
    )
}

fn error_page(e: &troupe_proto::AgentError, via: Credential) -> Response {
    let signed_in = via == Credential::SignIn;
    match e {
        troupe_proto::AgentError::NotFound { .. } => html(
            StatusCode::NOT_FOUND,
            page::not_found(&e.to_string(), signed_in),
        ),
        _ => {
            let status = crate::error::ApiError::from(e.clone()).status;
            html(status, page::not_found(&e.to_string(), signed_in))
        }
    }
}

/// What a sign-in sends: JSON from the console's script, or the form without it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignIn {
    token: String,
    #[serde(default)]
    next: Option<String>,
}

/// Where a form sign-in goes next: a path of this service, else `/`.
pub fn safe_next(next: Option<&str>) -> &str {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.contains('\\')
                && !n.chars().any(char::is_control) =>
        {
            n
        }
        _ => "/",
    }
}

/// Whether the console was reached over HTTPS (directly, or behind a proxy that says so):
/// the cookie is then `Secure`.
fn over_https(headers: &HeaderMap) -> bool {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    text(header::ORIGIN).is_some_and(|o| o.starts_with("https://"))
        || text(header::HeaderName::from_static("x-forwarded-proto"))
            .is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

/// `POST /console/sign-in`: a valid token sets the sign-in cookie (204 for the script, 303 to
/// `next` for a form); an invalid one is 401 (the form again, with the reason).
async fn sign_in_route(
    State(c): State<ConsoleState>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Response {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(crate::edge::is_json);
    let bytes = match body(bytes, c.app.body_limit) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let request: Result<SignIn, String> = if is_json {
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    } else {
        serde_urlencoded_form(&bytes)
    };
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            return crate::error::ApiError::bad_request(format!("bad sign-in: {e}"))
                .into_response();
        }
    };
    if c.auth.is_open() {
        crate::metrics::console_sign_in("open");
        return crate::error::ApiError::bad_request(
            "no API tokens are configured: the console needs no sign-in",
        )
        .into_response();
    }
    let Some(value) = c.auth.sign_in(&request.token) else {
        crate::metrics::console_sign_in("refused");
        tracing::info!("console sign-in refused");
        if is_json {
            return crate::error::ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "that token is not valid",
            )
            .into_response();
        }
        let next = safe_next(request.next.as_deref());
        return html(
            StatusCode::UNAUTHORIZED,
            page::sign_in(next, Some("That token is not valid.")),
        );
    };
    crate::metrics::console_sign_in("ok");
    let cookie = sign_in::set_cookie(
        c.auth.cookie_name(),
        &value,
        c.auth.sign_in_ttl().as_secs(),
        over_https(&headers),
    );
    let mut response = if is_json {
        StatusCode::NO_CONTENT.into_response()
    } else {
        let next = safe_next(request.next.as_deref()).to_owned();
        (StatusCode::SEE_OTHER, [(header::LOCATION, next)]).into_response()
    };
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// What the issue form sends (numbers as the form's text).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IssueForm {
    agent: String,
    tool: String,
    #[serde(default)]
    args: String,
    /// `NAME=PATTERN`, one a line.
    #[serde(default)]
    fields: String,
    ttl_secs: String,
    max_uses: String,
}

impl IssueForm {
    /// The request it makes, or what is wrong with it.
    fn request(self) -> Result<troupe_proto::governance::IssueToken, String> {
        let number = |name: &str, v: &str| {
            v.trim()
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{name} must be a whole number above 0, not `{v}`"))
        };
        let ttl_secs = number("Valid for", &self.ttl_secs)?;
        let max_uses = u32::try_from(number("Uses", &self.max_uses)?)
            .map_err(|_| "Uses is too large".to_owned())?;
        let args = self.args.trim();
        let mut fields = std::collections::BTreeMap::new();
        for line in self.fields.lines().filter(|l| !l.trim().is_empty()) {
            troupe_actors::governance::tokens::parse_field(&mut fields, line.trim())
                .map_err(|e| format!("Argument patterns: {e}"))?;
        }
        Ok(troupe_proto::governance::IssueToken {
            scope: troupe_proto::governance::TokenScope {
                agent: self.agent.trim().to_owned(),
                tool: self.tool.trim().to_owned(),
                args: (!args.is_empty()).then(|| args.to_owned()),
                fields,
            },
            ttl_secs,
            max_uses,
            issued_by: Some("console".into()),
        })
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The tokens page with `issued` (just issued) or `error` on top.
async fn tokens_view(
    c: &ConsoleState,
    scope: &Scope,
    via: Credential,
    status: StatusCode,
    issued: Option<&troupe_proto::governance::IssuedToken>,
    error: Option<&str>,
) -> Response {
    match c.app.rpc.sessions.tokens(scope).await {
        Ok(list) => html(
            status,
            page::tokens(&list, issued, error, now_ms(), via == Credential::SignIn),
        ),
        Err(e) => error_page(&e, via),
    }
}

#[derive(Debug, Deserialize)]
struct TokensQuery {
    /// The key of a token just issued, whose secret this page shows once.
    issued: Option<String>,
}

/// `GET /tokens`: the authorization tokens (and, once, the secret of the one just issued).
async fn tokens_page(
    State(c): State<ConsoleState>,
    headers: HeaderMap,
    Query(query): Query<TokensQuery>,
) -> Response {
    let Some((scope, via)) = c.auth.check_request(&headers) else {
        return html(StatusCode::OK, page::sign_in("/tokens", None));
    };
    let issued = query.issued.as_deref().and_then(|key| c.take(key));
    tokens_view(&c, &scope, via, StatusCode::OK, issued.as_ref(), None).await
}

/// Who may change state through a console form: the same rule as every cookie write
/// ([`crate::auth::cookie_may`]): a request signed in by the cookie alone must name its
/// Origin (the edge already refused another site's).
fn writer(auth: &Auth, headers: &HeaderMap) -> Option<(Scope, Credential)> {
    auth.check_request(headers).filter(|(_, via)| {
        *via != Credential::SignIn || crate::auth::cookie_may(&axum::http::Method::POST, headers)
    })
}

/// The answer to a form post [`writer`] refused: 401 without credentials, 403 for a
/// cookie that may not write from where it was sent.
fn refused(auth: &Auth, headers: &HeaderMap) -> Response {
    if auth.check_request(headers).is_some() {
        return crate::error::ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "a form signed in by the console's cookie is accepted only from the console's own \
             pages (with an Origin header)",
        )
        .into_response();
    }
    crate::error::ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "sign in first")
        .into_response()
}

/// `POST /console/tokens`: issues a token from the form, then 303 to the tokens page,
/// which shows its secret once.
async fn issue_token(
    State(c): State<ConsoleState>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Response {
    let Some((scope, via)) = writer(&c.auth, &headers) else {
        return refused(&c.auth, &headers);
    };
    let bytes = match body(bytes, c.app.body_limit) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let request = serde_urlencoded::from_bytes::<IssueForm>(&bytes)
        .map_err(|e| format!("bad form: {e}"))
        .and_then(IssueForm::request);
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            return tokens_view(&c, &scope, via, StatusCode::BAD_REQUEST, None, Some(&e)).await;
        }
    };
    match c.app.rpc.sessions.issue_token(&scope, request).await {
        Ok(issued) => {
            tracing::info!(token_id = %issued.info.id, "token issued from the console");
            // Redirect after post: reloading the page that shows the secret posts nothing.
            let key = c.stash(issued);
            (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, format!("/tokens?issued={key}"))],
            )
                .into_response()
        }
        Err(e @ troupe_proto::AgentError::InvalidInput { .. }) => {
            tokens_view(
                &c,
                &scope,
                via,
                StatusCode::BAD_REQUEST,
                None,
                Some(&e.to_string()),
            )
            .await
        }
        Err(e) => error_page(&e, via),
    }
}

/// `POST /console/tokens/{id}/revoke`: revokes it, then back to the list.
async fn revoke_token(
    State(c): State<ConsoleState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Some((scope, via)) = writer(&c.auth, &headers) else {
        return refused(&c.auth, &headers);
    };
    match c.app.rpc.sessions.revoke_token(&scope, id).await {
        Ok(info) => {
            tracing::info!(token_id = %info.id, "token revoked from the console");
            (StatusCode::SEE_OTHER, [(header::LOCATION, "/tokens")]).into_response()
        }
        Err(e) => error_page(&e, via),
    }
}

/// A form body (`token=...&next=...`).
fn serde_urlencoded_form(bytes: &[u8]) -> Result<SignIn, String> {
    serde_urlencoded::from_bytes(bytes).map_err(|e| e.to_string())
}

/// `POST /console/sign-out`: clears the cookie and goes to `/`.
async fn sign_out(State(c): State<ConsoleState>) -> Response {
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    if let Ok(v) = HeaderValue::from_str(&sign_in::clear_cookie(c.auth.cookie_name())) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_form_reads_one_argument_pattern_a_line() {
        let form = |fields: &str| IssueForm {
            agent: "*".into(),
            tool: "files__write".into(),
            args: String::new(),
            fields: fields.into(),
            ttl_secs: "60".into(),
            max_uses: "1".into(),
        };
        let request = form("path=notes/*\r\n\n mode = a=b \n").request().unwrap();
        assert_eq!(request.scope.args, None);
        assert_eq!(request.scope.fields["path"], "notes/*");
        assert_eq!(request.scope.fields["mode"], " a=b");
        assert!(form("no pattern").request().is_err());
        assert!(form("path=a\npath=b").request().is_err());
    }

    #[test]
    fn a_sign_in_goes_back_only_to_this_service() {
        assert_eq!(safe_next(Some("/sessions/abc")), "/sessions/abc");
        assert_eq!(safe_next(Some("/")), "/");
        for bad in [
            None,
            Some("https://evil.example/"),
            Some("//evil.example/x"),
            Some("/\\evil.example"),
            Some("sessions"),
            Some("/x\r\nSet-Cookie: a=b"),
        ] {
            assert_eq!(safe_next(bad), "/", "{bad:?}");
        }
    }

    #[test]
    fn a_form_sign_in_is_read() {
        let s = serde_urlencoded_form(b"token=a%20b&next=%2Fsessions%2Fx").unwrap();
        assert_eq!(s.token, "a b");
        assert_eq!(s.next.as_deref(), Some("/sessions/x"));
        assert!(serde_urlencoded_form(b"next=/").is_err());
        assert!(serde_urlencoded_form(b"token=a&other=1").is_err());
    }

    #[test]
    fn assets_are_embedded_with_their_etags() {
        for a in ASSETS {
            assert!(!a.body.is_empty(), "{}", a.name);
            assert!(ETAGS[a.name].starts_with('"'));
        }
    }
}
