//! An OAuth-protected MCP server for tests: [`ProtectedMcp`] runs, on two loopback ports,
//! an authorization server (RFC 8414 metadata, dynamic client registration, an authorization
//! endpoint that approves at once and redirects with a code, a token endpoint for the
//! authorization code with PKCE S256, the refresh token — rotated at each use — and client
//! credentials) and a resource server that publishes its protected resource metadata
//! (RFC 9728), answers 401 with a `WWW-Authenticate` challenge to a request without a valid
//! bearer token, and passes the others on to a real MCP server (`upstream`).
//!
//! Tests steer it (revoke the access or the refresh tokens, choose the tokens' lifetime, deny
//! the next authorization) and read what it saw ([`OAuthStats`]).

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Value, json};
use sha2::Digest;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How the authorization server behaves.
#[derive(Debug, Clone)]
pub struct OAuthOptions {
    /// Lifetime of access tokens (`expires_in`, and enforced by the resource server).
    pub access_ttl: Duration,
    /// Whether `/register` is offered.
    pub dynamic_registration: bool,
    /// Clients registered beforehand: id and secret (none: a public client).
    pub clients: Vec<(String, Option<String>)>,
    /// `scopes_supported` of both metadata documents.
    pub scopes_supported: Vec<String>,
    /// Whether the authorization code grant also returns a refresh token.
    pub refresh_tokens: bool,
}

impl Default for OAuthOptions {
    fn default() -> Self {
        Self {
            access_ttl: Duration::from_secs(3600),
            dynamic_registration: true,
            clients: Vec::new(),
            scopes_supported: vec!["mcp:tools".into()],
            refresh_tokens: true,
        }
    }
}

/// What the two servers saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OAuthStats {
    pub registrations: u32,
    pub authorizations: u32,
    /// Codes exchanged (the PKCE verifier matched).
    pub code_exchanges: u32,
    pub refreshes: u32,
    /// Refresh requests refused (revoked, reused or unknown refresh token).
    pub refused_refreshes: u32,
    pub client_credentials: u32,
    /// Client-credentials requests refused (unknown client, wrong secret).
    pub refused_client_credentials: u32,
    /// 401 answers of the resource server.
    pub unauthorized: u32,
    /// MCP requests passed on to the upstream server.
    pub proxied: u32,
    /// The `resource` parameter of every authorization and token request, in order.
    pub resources: Vec<String>,
    /// The scope of every authorization request.
    pub scopes: Vec<String>,
    /// Every bearer token the resource server was sent, in order.
    pub tokens_seen: Vec<String>,
}

struct Client {
    secret: Option<String>,
    redirect_uris: Vec<String>,
}

struct Code {
    client_id: String,
    redirect_uri: String,
    challenge: String,
    scope: String,
}

struct Access {
    expires: Instant,
}

struct AuthState {
    options: OAuthOptions,
    issuer: String,
    resource: String,
    clients: HashMap<String, Client>,
    codes: HashMap<String, Code>,
    access: HashMap<String, Access>,
    /// Refresh token -> (client id, scope).
    refresh: HashMap<String, (String, String)>,
    deny_next: bool,
    counter: u64,
    stats: OAuthStats,
}

impl AuthState {
    fn fresh(&mut self, prefix: &str) -> String {
        self.counter += 1;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        format!("{prefix}-{}-{nanos:x}", self.counter)
    }

    fn issue(&mut self, client_id: &str, scope: &str, refresh: bool) -> Value {
        let access = self.fresh("at");
        self.access.insert(
            access.clone(),
            Access {
                expires: Instant::now() + self.options.access_ttl,
            },
        );
        let mut body = json!({
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": self.options.access_ttl.as_secs(),
        });
        if !scope.is_empty() {
            body["scope"] = json!(scope);
        }
        if refresh {
            let token = self.fresh("rt");
            self.refresh
                .insert(token.clone(), (client_id.to_owned(), scope.to_owned()));
            body["refresh_token"] = json!(token);
        }
        body
    }
}

type Shared = Arc<Mutex<AuthState>>;

fn lock(state: &Shared) -> MutexGuard<'_, AuthState> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An OAuth-protected MCP server in front of `upstream`. Stops when dropped.
pub struct ProtectedMcp {
    /// The MCP endpoint clients connect to (`http://127.0.0.1:P/mcp`).
    pub url: String,
    /// The authorization server (`http://127.0.0.1:Q`).
    pub issuer: String,
    state: Shared,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for ProtectedMcp {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl ProtectedMcp {
    /// Starts both servers; MCP requests with a valid token go to `upstream` (an MCP
    /// streamable-HTTP endpoint such as `http://127.0.0.1:N/mcp`).
    pub async fn start(upstream: &str, options: OAuthOptions) -> Self {
        let as_listener = bind().await;
        let rs_listener = bind().await;
        let issuer = format!("http://{}", addr(&as_listener));
        let url = format!("http://{}/mcp", addr(&rs_listener));
        let clients = options
            .clients
            .iter()
            .map(|(id, secret)| {
                (
                    id.clone(),
                    Client {
                        secret: secret.clone(),
                        redirect_uris: Vec::new(),
                    },
                )
            })
            .collect();
        let state: Shared = Arc::new(Mutex::new(AuthState {
            options,
            issuer: issuer.clone(),
            resource: url.clone(),
            clients,
            codes: HashMap::new(),
            access: HashMap::new(),
            refresh: HashMap::new(),
            deny_next: false,
            counter: 0,
            stats: OAuthStats::default(),
        }));
        let authorization = Router::new()
            .route("/.well-known/oauth-authorization-server", get(as_metadata))
            .route("/register", post(register))
            .route("/authorize", get(authorize))
            .route("/token", post(token))
            .with_state(state.clone());
        let proxy = Proxy {
            state: state.clone(),
            upstream: upstream.to_owned(),
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap_or_default(),
        };
        let resource = Router::new()
            .route(
                "/.well-known/oauth-protected-resource/mcp",
                get(rs_metadata),
            )
            .with_state(state.clone())
            .merge(Router::new().route("/mcp", any(forward)).with_state(proxy));
        let tasks = vec![
            tokio::spawn(async move {
                let _ = axum::serve(as_listener, authorization).await;
            }),
            tokio::spawn(async move {
                let _ = axum::serve(rs_listener, resource).await;
            }),
        ];
        Self {
            url,
            issuer,
            state,
            tasks,
        }
    }

    /// What both servers saw so far.
    pub fn stats(&self) -> OAuthStats {
        lock(&self.state).stats.clone()
    }

    /// Every access token issued so far stops working (the resource server answers 401).
    pub fn revoke_access_tokens(&self) {
        lock(&self.state).access.clear();
    }

    /// Every refresh token issued so far stops working (`invalid_grant`).
    pub fn revoke_refresh_tokens(&self) {
        lock(&self.state).refresh.clear();
    }

    /// Lifetime of the access tokens issued from now on.
    pub fn set_access_ttl(&self, ttl: Duration) {
        lock(&self.state).options.access_ttl = ttl;
    }

    /// The next authorization request is refused (`error=access_denied`).
    pub fn deny_next_authorization(&self) {
        lock(&self.state).deny_next = true;
    }

    /// The protected resource metadata URL (what the 401 challenge names).
    pub fn resource_metadata_url(&self) -> String {
        self.url
            .replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    }
}

async fn bind() -> tokio::net::TcpListener {
    match tokio::net::TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => panic!("cannot bind: {e}"),
    }
}

fn addr(listener: &tokio::net::TcpListener) -> std::net::SocketAddr {
    match listener.local_addr() {
        Ok(a) => a,
        Err(e) => panic!("no address: {e}"),
    }
}

fn error(status: StatusCode, code: &str, description: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": code, "error_description": description})),
    )
        .into_response()
}

async fn as_metadata(State(state): State<Shared>) -> Response {
    let s = lock(&state);
    let issuer = &s.issuer;
    let mut doc = json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{issuer}/authorize"),
        "token_endpoint": format!("{issuer}/token"),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
        "scopes_supported": s.options.scopes_supported,
        "authorization_response_iss_parameter_supported": true,
    });
    if s.options.dynamic_registration {
        doc["registration_endpoint"] = json!(format!("{issuer}/register"));
    }
    axum::Json(doc).into_response()
}

async fn rs_metadata(State(state): State<Shared>) -> Response {
    let s = lock(&state);
    axum::Json(json!({
        "resource": s.resource,
        "authorization_servers": [s.issuer],
        "scopes_supported": s.options.scopes_supported,
        "bearer_methods_supported": ["header"],
    }))
    .into_response()
}

async fn register(State(state): State<Shared>, axum::Json(body): axum::Json<Value>) -> Response {
    let mut s = lock(&state);
    if !s.options.dynamic_registration {
        return error(StatusCode::NOT_FOUND, "not_found", "no registration");
    }
    let redirect_uris: Vec<String> = body["redirect_uris"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if redirect_uris.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_redirect_uri",
            "redirect_uris is required",
        );
    }
    let public = body["token_endpoint_auth_method"].as_str() == Some("none");
    let id = s.fresh("client");
    let secret = (!public).then(|| s.fresh("secret"));
    s.clients.insert(
        id.clone(),
        Client {
            secret: secret.clone(),
            redirect_uris: redirect_uris.clone(),
        },
    );
    s.stats.registrations += 1;
    let mut reply = json!({
        "client_id": id,
        "redirect_uris": redirect_uris,
        "client_name": body["client_name"],
        "token_endpoint_auth_method": if public { "none" } else { "client_secret_post" },
    });
    if let Some(secret) = secret {
        reply["client_secret"] = json!(secret);
    }
    (StatusCode::CREATED, axum::Json(reply)).into_response()
}

async fn authorize(
    State(state): State<Shared>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let mut s = lock(&state);
    s.stats.authorizations += 1;
    s.stats
        .resources
        .push(q.get("resource").cloned().unwrap_or_default());
    s.stats
        .scopes
        .push(q.get("scope").cloned().unwrap_or_default());
    let param = |k: &str| q.get(k).cloned().unwrap_or_default();
    let client_id = param("client_id");
    let redirect_uri = param("redirect_uri");
    let known_redirect = s
        .clients
        .get(&client_id)
        .is_some_and(|c| c.redirect_uris.is_empty() || c.redirect_uris.contains(&redirect_uri));
    if !known_redirect {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "unknown client or redirect_uri",
        );
    }
    let Ok(mut target) = reqwest::Url::parse(&redirect_uri) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "bad redirect_uri",
        );
    };
    let state_param = param("state");
    if std::mem::take(&mut s.deny_next) {
        target
            .query_pairs_mut()
            .append_pair("error", "access_denied")
            .append_pair("error_description", "the user said no")
            .append_pair("state", &state_param);
        return redirect(target.as_str());
    }
    if param("response_type") != "code"
        || param("code_challenge_method") != "S256"
        || param("code_challenge").is_empty()
        || param("resource") != s.resource
    {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "needs response_type=code, an S256 code_challenge and this server's resource",
        );
    }
    let code = s.fresh("code");
    s.codes.insert(
        code.clone(),
        Code {
            client_id,
            redirect_uri,
            challenge: param("code_challenge"),
            scope: param("scope"),
        },
    );
    let issuer = s.issuer.clone();
    target
        .query_pairs_mut()
        .append_pair("code", &code)
        .append_pair("state", &state_param)
        .append_pair("iss", &issuer);
    redirect(target.as_str())
}

fn redirect(location: &str) -> Response {
    let mut response = StatusCode::FOUND.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// The client's id and secret, from HTTP Basic or the form.
fn client_auth(headers: &HeaderMap, form: &BTreeMap<String, String>) -> (String, Option<String>) {
    if let Some(basic) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        && let Ok(decoded) = STANDARD.decode(basic)
        && let Ok(text) = String::from_utf8(decoded)
        && let Some((id, secret)) = text.split_once(':')
    {
        let unescape = |s: &str| {
            reqwest::Url::parse(&format!("http://x/?v={s}"))
                .ok()
                .and_then(|u| u.query_pairs().next().map(|(_, v)| v.into_owned()))
                .unwrap_or_else(|| s.to_owned())
        };
        return (unescape(id), Some(unescape(secret)));
    }
    (
        form.get("client_id").cloned().unwrap_or_default(),
        form.get("client_secret").cloned(),
    )
}

async fn token(
    State(state): State<Shared>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<BTreeMap<String, String>>,
) -> Response {
    let mut s = lock(&state);
    let param = |k: &str| form.get(k).cloned().unwrap_or_default();
    s.stats.resources.push(param("resource"));
    let (client_id, secret) = client_auth(&headers, &form);
    let authenticated = match s.clients.get(&client_id) {
        Some(Client {
            secret: Some(expected),
            ..
        }) => secret.as_deref() == Some(expected.as_str()),
        Some(Client { secret: None, .. }) => true,
        None => false,
    };
    let resource_ok = param("resource") == s.resource;
    match param("grant_type").as_str() {
        "authorization_code" => {
            let Some(code) = s.codes.remove(&param("code")) else {
                return error(StatusCode::BAD_REQUEST, "invalid_grant", "unknown code");
            };
            let verifier = param("code_verifier");
            let challenge = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes()));
            if !authenticated
                || code.client_id != client_id
                || code.redirect_uri != param("redirect_uri")
                || code.challenge != challenge
                || !resource_ok
            {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_grant",
                    "client, redirect_uri, PKCE verifier or resource do not match the code",
                );
            }
            s.stats.code_exchanges += 1;
            let refresh = s.options.refresh_tokens;
            let body = s.issue(&client_id, &code.scope, refresh);
            axum::Json(body).into_response()
        }
        "refresh_token" => {
            // Rotation: a refresh token works once.
            let presented = param("refresh_token");
            match s.refresh.remove(&presented) {
                Some((owner, scope)) if owner == client_id && authenticated && resource_ok => {
                    s.stats.refreshes += 1;
                    let body = s.issue(&client_id, &scope, true);
                    axum::Json(body).into_response()
                }
                _ => {
                    s.stats.refused_refreshes += 1;
                    error(
                        StatusCode::BAD_REQUEST,
                        "invalid_grant",
                        "the refresh token is not valid",
                    )
                }
            }
        }
        "client_credentials" => {
            let confidential = s
                .clients
                .get(&client_id)
                .is_some_and(|c| c.secret.is_some());
            if !authenticated || !confidential {
                s.stats.refused_client_credentials += 1;
                return error(
                    StatusCode::UNAUTHORIZED,
                    "invalid_client",
                    "unknown client or wrong secret",
                );
            }
            if !resource_ok {
                return error(StatusCode::BAD_REQUEST, "invalid_target", "wrong resource");
            }
            s.stats.client_credentials += 1;
            let scope = param("scope");
            let body = s.issue(&client_id, &scope, false);
            axum::Json(body).into_response()
        }
        _ => error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "unsupported grant_type",
        ),
    }
}

#[derive(Clone)]
struct Proxy {
    state: Shared,
    upstream: String,
    client: reqwest::Client,
}

/// Headers passed between the client and the upstream MCP server.
const PASSED: [&str; 5] = [
    "content-type",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

async fn forward(
    State(proxy): State<Proxy>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    {
        let mut s = lock(&proxy.state);
        if let Some(token) = &bearer {
            s.stats.tokens_seen.push(token.clone());
        }
        let valid = bearer
            .as_ref()
            .and_then(|t| s.access.get(t))
            .is_some_and(|a| a.expires > Instant::now());
        if !valid {
            s.stats.unauthorized += 1;
            let metadata = s
                .resource
                .replace("/mcp", "/.well-known/oauth-protected-resource/mcp");
            let challenge = if bearer.is_some() {
                format!(
                    "Bearer error=\"invalid_token\", error_description=\"the token is not valid\", resource_metadata=\"{metadata}\""
                )
            } else {
                format!("Bearer resource_metadata=\"{metadata}\"")
            };
            let mut response = error(
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                "authorization required",
            );
            if let Ok(value) = HeaderValue::from_str(&challenge) {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, value);
            }
            return response;
        }
        s.stats.proxied += 1;
    }
    let mut request = proxy.client.request(method, &proxy.upstream).body(body);
    for name in PASSED {
        if let Some(value) = headers.get(name) {
            request = request.header(name, value);
        }
    }
    let upstream = match request.send().await {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_GATEWAY, "bad_gateway", &e.to_string()),
    };
    let mut response = Response::builder().status(upstream.status().as_u16());
    for name in ["content-type", "mcp-session-id", "cache-control"] {
        if let Some(value) = upstream.headers().get(name) {
            response = response.header(name, value.as_bytes());
        }
    }
    response
        .body(Body::from_stream(upstream.bytes_stream()))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}
