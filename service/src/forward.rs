//! Forwarding (a node of a cluster): a call for a session that another live node owns is
//! sent on to that node's API, and its answer (an event stream included) comes back as is, so
//! a client may talk to any node.
//!
//! ```text
//! request ─► token check ─► session named? (REST path /api/sessions/{id}/…, or a JSON-RPC
//!            call's params.session_id) ─► its lease unexpired and another node's
//!            ─► HTTP to that node's published API address (x-troupe-forwarded-by: this node)
//!            otherwise ─► answered here (activated here under its lease, or 503 naming the
//!            owner when it changed meanwhile)
//! ```
//!
//! A new session (`POST /api/sessions`, JSON-RPC `session.create`) is placed by load: created
//! on the live node (heartbeat within a lease ttl) owning the fewest sessions.
//!
//! A call for a session this node holds the unexpired lease of (as its last renewal says) is
//! answered here without asking the database.
//!
//! A JSON-RPC batch whose calls name sessions of one other node is forwarded whole; one
//! naming sessions of different nodes is refused, each call answered with an error naming
//! each session's owner.
//!
//! A session's WebSocket event route (`/api/sessions/{id}/events/ws`) is relayed to the
//! owner's: the upgrade is accepted here once the owner's accepted it, and frames go both
//! ways until either side closes.
//!
//! An A2A call (`POST /a2a`) goes to the node owning the A2A endpoint's session (the current
//! session of its project), its stream included.
//!
//! On a JSON-RPC WebSocket (`/rpc/ws`) each frame is routed on its own ([`RpcWsRelay`]): a
//! call (or a batch) for another node's session is posted to that node's `/rpc` with the
//! socket's credentials and its answer sent back as the frame's; `events.subscribe` and
//! `events.unsubscribe` stay on the node the socket is open on (a subscription lives with its
//! socket), as does `session.create`.
//!
//! A forwarded request is never forwarded again (the header says it was).

use crate::error::ApiError;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics::{Unit, counter, describe_counter};
use std::str::FromStr;
use std::sync::Arc;
use troupe_proto::{AgentError, SessionId};
use troupe_store::SessionLeases;

/// Calls forwarded to the node owning their session, by outcome (`ok`: the owner answered;
/// `failed`: it could not be reached).
pub const FORWARDED_CALLS: &str = "troupe_cluster_forwarded_calls_total";

/// Owner look-ups of session calls, by where the answer came from (`held`: this node holds
/// the session's unexpired lease, answered from memory; `store`: one PostgreSQL query).
pub const OWNER_LOOKUPS: &str = "troupe_cluster_owner_lookups_total";

/// The header a forwarded request carries: the node that forwarded it.
pub const FORWARDED_BY: &str = "x-troupe-forwarded-by";

/// Registers the description; every series exists at 0 from the start.
pub fn describe() {
    describe_counter!(
        FORWARDED_CALLS,
        Unit::Count,
        "Calls for a session another node owns, forwarded to that node, by outcome (ok; failed: the owner could not be reached)"
    );
    for outcome in ["ok", "failed"] {
        counter!(FORWARDED_CALLS, "outcome" => outcome).increment(0);
    }
    describe_counter!(
        OWNER_LOOKUPS,
        Unit::Count,
        "Owner look-ups of calls naming a session, by source (held: this node holds its lease, no query; store: one PostgreSQL query)"
    );
    for source in ["held", "store"] {
        counter!(OWNER_LOOKUPS, "source" => source).increment(0);
    }
}

/// What forwarding needs: this node's name, the leases (who owns what, where it answers), an
/// HTTP client, the request body limit.
pub struct Forwarder {
    pub node: String,
    /// A node whose heartbeat is older than this is not given new sessions.
    pub lease_ttl: std::time::Duration,
    pub leases: Arc<dyn SessionLeases>,
    pub http: reqwest::Client,
    pub body_limit: usize,
    /// The A2A endpoint's session (the current session of its project), where `POST /a2a`
    /// goes: `None` when the endpoint is off.
    pub a2a: Option<A2aRoute>,
}

/// Where the A2A endpoint's calls go: the current session of its project, as the endpoint
/// itself finds it (once, then kept: the endpoint keeps the session it first found too).
pub struct A2aRoute {
    store: Arc<dyn troupe_store::Store>,
    project: String,
    session: tokio::sync::OnceCell<SessionId>,
}

impl A2aRoute {
    pub fn new(store: Arc<dyn troupe_store::Store>, project: String) -> Self {
        Self {
            store,
            project,
            session: tokio::sync::OnceCell::new(),
        }
    }

    /// The A2A session once the project has one; `None` before (the first A2A call creates
    /// it where it is answered).
    async fn session(&self) -> Option<SessionId> {
        if let Some(id) = self.session.get() {
            return Some(*id);
        }
        match self.store.current_session(&self.project).await {
            Ok(Some(id)) => Some(*self.session.get_or_init(|| async { id }).await),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(project = %self.project, error = %e, "A2A session not read; answering here");
                None
            }
        }
    }
}

/// Whether a request is an A2A call (`POST /a2a`).
pub fn is_a2a_call(method: &Method, path: &str) -> bool {
    *method == Method::POST && matches!(path, "/a2a" | "/a2a/")
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Forwarder {
    pub fn new(
        node: String,
        leases: Arc<dyn SessionLeases>,
        body_limit: usize,
        lease_ttl: std::time::Duration,
    ) -> Result<Self, AgentError> {
        // No overall timeout: an event stream lasts as long as its client; an owner that
        // vanished without closing its connections (cut off, powered down) is found by TCP
        // keep-alive probes within ~30 s. Calls between nodes go straight to the owner:
        // never through a proxy of the environment (they carry the caller's token), and a
        // redirect is not followed (it would turn a POST into a GET without its body).
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .tcp_keepalive(std::time::Duration::from_secs(15))
            .tcp_keepalive_interval(std::time::Duration::from_secs(5))
            .tcp_keepalive_retries(3)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| AgentError::internal(format!("forwarding HTTP client: {e}")))?;
        Ok(Self {
            node,
            lease_ttl,
            leases,
            http,
            body_limit,
            a2a: None,
        })
    }
}

/// The session a REST path names (`/api/sessions/{id}` and below), but not a WebSocket route.
pub fn session_of_path(path: &str) -> Option<SessionId> {
    let rest = path.strip_prefix("/api/sessions/")?;
    let mut parts = rest.split('/');
    let id = parts.next()?;
    let tail: Vec<&str> = parts.collect();
    if tail.last() == Some(&"ws") {
        return None;
    }
    SessionId::from_str(id).ok()
}

/// The session of a WebSocket event route (`/api/sessions/{id}/events/ws`).
pub fn session_of_ws_path(path: &str) -> Option<SessionId> {
    let rest = path.strip_prefix("/api/sessions/")?;
    let id = rest.strip_suffix("/events/ws")?;
    SessionId::from_str(id).ok()
}

/// The WebSocket address of `path_and_query` on the node whose API is at `base`.
pub fn ws_url(base: &str, path_and_query: &str) -> String {
    let base = base.trim_end_matches('/');
    let base = if let Some(rest) = base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        base.to_owned()
    };
    format!("{base}{path_and_query}")
}

/// What a call is about, for forwarding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A session: its owner answers.
    Session(SessionId),
    /// A new session: the least loaded node creates it.
    NewSession,
}

/// The session a single JSON-RPC call names in `params.session_id` (a batch: none).
pub fn session_of_rpc(body: &[u8]) -> Option<SessionId> {
    match target_of_rpc(body) {
        Some(Target::Session(id)) => Some(id),
        _ => None,
    }
}

/// What a single JSON-RPC call is about: `session.create`, or the session of its
/// `params.session_id` (a batch: nothing).
pub fn target_of_rpc(body: &[u8]) -> Option<Target> {
    let call: serde_json::Value = serde_json::from_slice(body).ok()?;
    if call.get("method").and_then(|m| m.as_str()) == Some("session.create") {
        return Some(Target::NewSession);
    }
    let id = call.get("params")?.get("session_id")?.as_str()?;
    SessionId::from_str(id).ok().map(Target::Session)
}

/// The distinct sessions the calls of a JSON-RPC batch name in `params.session_id`, in the
/// order first named; `None` when the body is not a batch.
///
/// A batch of more calls than a node takes ([`crate::rpc::MAX_BATCH_CALLS`]) is
/// `None` too: answered here (refused as an invalid request) without reading any owner.
pub fn sessions_of_batch(body: &[u8]) -> Option<Vec<SessionId>> {
    let calls: Vec<serde_json::Value> = serde_json::from_slice(body).ok()?;
    if calls.len() > crate::rpc::MAX_BATCH_CALLS {
        return None;
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for call in &calls {
        let id = call
            .get("params")
            .and_then(|p| p.get("session_id"))
            .and_then(|v| v.as_str())
            .and_then(|v| SessionId::from_str(v).ok());
        if let Some(id) = id
            && seen.insert(id)
        {
            out.push(id);
        }
    }
    Some(out)
}

/// Where a JSON-RPC batch goes, from the owners of the sessions it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchRoute {
    /// Every session it names is this node's (or nobody's): answered here.
    Here,
    /// Every session it names is owned by one other node: forwarded there (node, API).
    To(String, String),
    /// Its sessions live on different nodes: refused, naming each session's owner.
    Mixed(Vec<(SessionId, String)>),
}

/// [`BatchRoute`] of a batch whose sessions have these owners (`forward_to` of each: `None`
/// = answered here).
pub fn batch_route(me: &str, owners: Vec<(SessionId, Option<(String, String)>)>) -> BatchRoute {
    let mut elsewhere: Option<(String, String)> = None;
    let mut mixed = false;
    let mut here = false;
    for (_, owner) in &owners {
        match (owner, &elsewhere) {
            (None, _) => here = true,
            (Some(o), None) => elsewhere = Some(o.clone()),
            (Some((node, _)), Some((first, _))) => mixed |= node != first,
        }
    }
    match elsewhere {
        None => BatchRoute::Here,
        Some((node, url)) if !mixed && !here => BatchRoute::To(node, url),
        Some(_) => BatchRoute::Mixed(
            owners
                .into_iter()
                .map(|(s, o)| (s, o.map_or_else(|| me.to_owned(), |(node, _)| node)))
                .collect(),
        ),
    }
}

/// The answer to a batch naming sessions of different nodes: one JSON-RPC error per call
/// (invalid request), naming each session's owner.
pub fn mixed_batch_answer(body: &[u8], owners: &[(SessionId, String)]) -> serde_json::Value {
    let named: Vec<String> = owners
        .iter()
        .map(|(s, node)| format!("session {s} on node {node}"))
        .collect();
    let message = format!(
        "a batch naming sessions owned by different nodes is not answered: {}; send each \
         node's calls in a batch of their own (or singly: any node forwards them)",
        named.join(", ")
    );
    let owners_data: serde_json::Map<String, serde_json::Value> = owners
        .iter()
        .map(|(s, node)| (s.to_string(), serde_json::Value::from(node.as_str())))
        .collect();
    let calls: Vec<serde_json::Value> = serde_json::from_slice(body).unwrap_or_default();
    let answers: Vec<serde_json::Value> = calls
        .iter()
        .filter_map(|c| c.get("id"))
        .map(|id| {
            serde_json::json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {
                    "code": crate::error::INVALID_REQUEST,
                    "message": message,
                    "data": {"owners": owners_data},
                },
            })
        })
        .collect();
    serde_json::Value::Array(answers)
}

/// What a REST call is about.
pub fn target_of_rest(method: &Method, path: &str) -> Option<Target> {
    if path == "/api/sessions" && method == Method::POST {
        return Some(Target::NewSession);
    }
    session_of_path(path).map(Target::Session)
}

/// Whether a call the owner may have received before failing could have changed something
/// (anything but a read): its failure is reported as of unknown outcome, not as a refusal.
/// 502 `forward_outcome_unknown`: `what` was sent to `node` at `url`, which did not answer.
fn outcome_unknown_answer(
    what: &str,
    node: &impl std::fmt::Display,
    url: &impl std::fmt::Display,
    e: &impl std::fmt::Display,
) -> Response {
    ApiError::new(
        axum::http::StatusCode::BAD_GATEWAY,
        "forward_outcome_unknown",
        format!(
            "{what} was sent to node {node} at {url}, which did not answer ({e}); it may have been applied: read the session before sending it again"
        ),
    )
    .into_response()
}

pub fn outcome_unknown(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// What a request body that could not be read is answered: 413 over the limit, 408 when it
/// did not arrive in time, 400 otherwise (the client went away, a broken chunk).
fn body_error(error: &axum::Error, limit: usize) -> ApiError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if e.is::<http_body_util::LengthLimitError>() {
            return ApiError::too_large(limit);
        }
        cause = e.source();
    }
    if crate::listen::timed_out(error) {
        return ApiError::request_timeout();
    }
    ApiError::bad_request(format!("the request body was not read: {error}"))
}

/// Whether to forward: the owner, when it is another node that published its API address.
pub fn forward_to(me: &str, owner: Option<(String, Option<String>)>) -> Option<(String, String)> {
    match owner {
        Some((node, Some(url))) if node != me => Some((node, url)),
        _ => None,
    }
}

/// The middleware (after the token check).
pub async fn forward(
    State(forwarder): State<Option<Arc<Forwarder>>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(f) = forwarder else {
        return next.run(req).await;
    };
    if req.headers().contains_key(FORWARDED_BY) {
        return next.run(req).await;
    }
    let path = req.uri().path().to_owned();
    if let Some(session_id) = session_of_ws_path(&path) {
        return forward_ws(&f, session_id, req, next).await;
    }
    if path == "/rpc/ws" {
        let mut req = req;
        let relay = RpcWsRelay::new(f.clone(), req.headers());
        req.extensions_mut().insert(relay);
        return next.run(req).await;
    }
    let rpc = path == "/rpc" && req.method() == Method::POST;
    let a2a = f.a2a.is_some() && is_a2a_call(req.method(), &path);
    if !rpc && !a2a && target_of_rest(req.method(), &path).is_none() {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, f.body_limit).await {
        Ok(b) => b,
        Err(e) => return body_error(&e, f.body_limit).into_response(),
    };
    if rpc && let Some(sessions) = sessions_of_batch(&bytes) {
        return forward_batch(&f, sessions, parts, bytes, next).await;
    }
    let target = if a2a {
        match &f.a2a {
            Some(route) => route.session().await.map(Target::Session),
            None => None,
        }
    } else if rpc {
        target_of_rpc(&bytes)
    } else {
        target_of_rest(&parts.method, &path)
    };
    let Some(target) = target else {
        return next
            .run(Request::from_parts(parts, Body::from(bytes)))
            .await;
    };
    let now = troupe_actors::clock::unix_now_ms();
    let owner = match target {
        Target::Session(session_id) if f.leases.holds(session_id, now) => {
            // Held here: served here, no query.
            counter!(OWNER_LOOKUPS, "source" => "held").increment(1);
            return next
                .run(Request::from_parts(parts, Body::from(bytes)))
                .await;
        }
        Target::Session(session_id) => {
            counter!(OWNER_LOOKUPS, "source" => "store").increment(1);
            f.leases.owner_of(session_id, now).await
        }
        Target::NewSession => {
            let alive_after =
                now.saturating_sub(u64::try_from(f.lease_ttl.as_millis()).unwrap_or(0));
            f.leases
                .least_loaded(now, alive_after)
                .await
                .map(|n| n.map(|(node, url)| (node, Some(url))))
        }
    };
    let owner = match owner {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(?target, error = %e, "owner not read; answering here");
            None
        }
    };
    let Some((node, url)) = forward_to(&f.node, owner) else {
        return next
            .run(Request::from_parts(parts, Body::from(bytes)))
            .await;
    };
    let session_id = match target {
        Target::Session(id) => id.to_string(),
        Target::NewSession => "(new)".to_owned(),
    };
    match send(&f, &url, &parts, bytes.clone()).await {
        Ok(response) => {
            counter!(FORWARDED_CALLS, "outcome" => "ok").increment(1);
            tracing::debug!(%session_id, owner = %node, "call forwarded");
            response
        }
        Err(Unsent::Unreachable(e)) => {
            // The owner is gone (its lease not expired yet): answered here, where reads are
            // served from the store and the session is taken over once the lease expires.
            counter!(FORWARDED_CALLS, "outcome" => "failed").increment(1);
            tracing::info!(%session_id, owner = %node, %url, error = %e, "session owner unreachable; answering here");
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(Unsent::Failed(e)) => {
            counter!(FORWARDED_CALLS, "outcome" => "failed").increment(1);
            tracing::warn!(%session_id, owner = %node, %url, error = %e, "call not forwarded");
            if outcome_unknown(&parts.method) {
                // The owner may have taken it before it failed: not a refusal that invites a
                // blind retry.
                return outcome_unknown_answer(
                    &format!("session {session_id}: the call"),
                    &node,
                    &url,
                    &e,
                );
            }
            ApiError::from(AgentError::Overloaded {
                resource: format!(
                    "session {session_id} (owned by node {node} at {url}, which did not answer: {e})"
                ),
                limit: 0,
            })
            .into_response()
        }
    }
}

/// A session's WebSocket event route: when another node owns the session, the upgrade is
/// accepted here and its frames relayed both ways to the same route on the owner.
async fn forward_ws(f: &Forwarder, session_id: SessionId, req: Request, next: Next) -> Response {
    use axum::extract::FromRequestParts;
    use axum::extract::ws::WebSocketUpgrade;
    let Some((node, url)) = elsewhere(f, session_id).await else {
        return next.run(req).await;
    };
    let (mut parts, body) = req.into_parts();
    let upgrading = parts
        .headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrading {
        // Not an upgrade: the route answers it as it would.
        return next.run(Request::from_parts(parts, body)).await;
    }
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
    let target = ws_url(&url, &path);
    let upstream = async {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = target
            .as_str()
            .into_client_request()
            .map_err(|e| e.to_string())?;
        let headers = request.headers_mut();
        for name in [header::AUTHORIZATION, header::COOKIE, header::ORIGIN] {
            if let Some(value) = parts.headers.get(&name) {
                headers.insert(name, value.clone());
            }
        }
        vouch_origin(headers, &url);
        if let Ok(me) = f.node.parse() {
            headers.insert(FORWARDED_BY, me);
        }
        // An owner whose packets are dropped does not hold the client for minutes.
        match tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tokio_tungstenite::connect_async(request),
        )
        .await
        {
            Ok(connected) => connected.map_err(|e| e.to_string()),
            Err(_) => Err("no answer within 5 s".to_owned()),
        }
    }
    .await;
    let upstream = match upstream {
        Ok((ws, _)) => ws,
        Err(e) => {
            counter!(FORWARDED_CALLS, "outcome" => "failed").increment(1);
            tracing::info!(%session_id, owner = %node, %url, error = %e, "session owner's WebSocket not reached; answering here");
            return next.run(Request::from_parts(parts, body)).await;
        }
    };
    // The upgrade is taken from the request only now: had the owner not been reached, the
    // route here would have answered the untouched request.
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return rejection.into_response(),
    };
    counter!(FORWARDED_CALLS, "outcome" => "ok").increment(1);
    tracing::debug!(%session_id, owner = %node, "WebSocket forwarded");
    upgrade.on_upgrade(move |client| relay(client, upstream))
}

/// How often a relay pings the owner's end of a relayed WebSocket.
const RELAY_PING: std::time::Duration = std::time::Duration::from_secs(15);

/// How long a relay waits for any frame (a pong included) from the owner before it takes
/// the owner for gone and closes the client's end (1011), so the client reconnects.
const RELAY_SILENCE: std::time::Duration = std::time::Duration::from_secs(45);

/// The owner of `session_id` when it is another node (its name and address): none when this
/// node holds its lease (no query), when nobody does, or when the owner could not be read.
async fn elsewhere(f: &Forwarder, session_id: SessionId) -> Option<(String, String)> {
    let now = troupe_actors::clock::unix_now_ms();
    if f.leases.holds(session_id, now) {
        counter!(OWNER_LOOKUPS, "source" => "held").increment(1);
        return None;
    }
    counter!(OWNER_LOOKUPS, "source" => "store").increment(1);
    match f.leases.owner_of(session_id, now).await {
        Ok(o) => forward_to(&f.node, o),
        Err(e) => {
            tracing::warn!(%session_id, error = %e, "owner not read; answering here");
            None
        }
    }
}

/// Relays frames between a client's WebSocket and the owner's until either side closes,
/// pinging the owner every [`RELAY_PING`] and closing once it was silent [`RELAY_SILENCE`].
async fn relay(
    client: axum::extract::ws::WebSocket,
    upstream: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
) {
    use futures::StreamExt;
    let (client_tx, client_rx) = client.split();
    let (up_tx, up_rx) = upstream.split();
    relay_frames((client_tx, client_rx), (up_tx, up_rx)).await;
}

/// [`relay`] over any two ends: the client's (axum's frames) and the owner's (tungstenite's).
async fn relay_frames<CT, CR, UT, UR, CE, UE>(
    (mut client_tx, mut client_rx): (CT, CR),
    (mut up_tx, mut up_rx): (UT, UR),
) where
    CT: futures::Sink<axum::extract::ws::Message> + Unpin,
    CR: futures::Stream<Item = Result<axum::extract::ws::Message, CE>> + Unpin,
    UT: futures::Sink<tokio_tungstenite::tungstenite::Message> + Unpin,
    UR: futures::Stream<Item = Result<tokio_tungstenite::tungstenite::Message, UE>> + Unpin,
{
    use axum::extract::ws::Message as Down;
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as Up;
    let to_owner = async {
        let mut pings = tokio::time::interval(RELAY_PING);
        pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        pings.tick().await;
        loop {
            let m = tokio::select! {
                m = client_rx.next() => match m {
                    Some(Ok(Down::Text(t))) => Up::text(t.as_str()),
                    Some(Ok(Down::Binary(b))) => Up::binary(b),
                    Some(Ok(Down::Ping(_) | Down::Pong(_))) => continue,
                    Some(Ok(Down::Close(_)) | Err(_)) | None => break,
                },
                _ = pings.tick() => Up::Ping(Bytes::new()),
            };
            if up_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = up_tx.close().await;
    };
    let to_client = async {
        loop {
            let m = match tokio::time::timeout(RELAY_SILENCE, up_rx.next()).await {
                Ok(Some(Ok(m))) => m,
                Ok(_) => break,
                Err(_) => {
                    tracing::info!(
                        silent_secs = RELAY_SILENCE.as_secs(),
                        "session owner's WebSocket silent; closing the relayed one"
                    );
                    let _ = client_tx
                        .send(Down::Close(Some(axum::extract::ws::CloseFrame {
                            code: 1011,
                            reason: "the session's node stopped answering; reconnect".into(),
                        })))
                        .await;
                    break;
                }
            };
            let m = match m {
                Up::Text(t) => Down::text(t.as_str()),
                Up::Binary(b) => Down::binary(b),
                Up::Close(frame) => {
                    let _ = client_tx
                        .send(Down::Close(frame.map(|f| axum::extract::ws::CloseFrame {
                            code: f.code.into(),
                            reason: f.reason.as_str().into(),
                        })))
                        .await;
                    break;
                }
                Up::Ping(_) | Up::Pong(_) | Up::Frame(_) => continue,
            };
            if client_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = client_tx.close().await;
    };
    tokio::select! {
        () = to_owner => {}
        () = to_client => {}
    }
}

/// A JSON-RPC batch: answered here when its sessions are all this node's (or nobody's),
/// forwarded when they are all one other node's, refused when they live on different nodes.
async fn forward_batch(
    f: &Forwarder,
    sessions: Vec<SessionId>,
    parts: axum::http::request::Parts,
    bytes: Bytes,
    next: Next,
) -> Response {
    let mut owners = Vec::with_capacity(sessions.len());
    for session_id in sessions {
        owners.push((session_id, elsewhere(f, session_id).await));
    }
    match batch_route(&f.node, owners) {
        BatchRoute::Here => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        BatchRoute::Mixed(owners) => {
            tracing::info!(
                sessions = owners.len(),
                "batch naming sessions of several nodes refused"
            );
            axum::Json(mixed_batch_answer(&bytes, &owners)).into_response()
        }
        BatchRoute::To(node, url) => match send(f, &url, &parts, bytes.clone()).await {
            Ok(response) => {
                counter!(FORWARDED_CALLS, "outcome" => "ok").increment(1);
                tracing::debug!(owner = %node, "batch forwarded");
                response
            }
            Err(Unsent::Unreachable(e)) => {
                counter!(FORWARDED_CALLS, "outcome" => "failed").increment(1);
                tracing::info!(owner = %node, %url, error = %e, "batch's owner unreachable; answering here");
                next.run(Request::from_parts(parts, Body::from(bytes)))
                    .await
            }
            // Sent, and not answered: the owner may have run some of its calls (a batch is a
            // POST), so not a refusal that invites a blind retry.
            Err(Unsent::Failed(e)) => {
                counter!(FORWARDED_CALLS, "outcome" => "failed").increment(1);
                tracing::warn!(owner = %node, %url, error = %e, "batch not forwarded");
                outcome_unknown_answer("a batch", &node, &url, &e)
            }
        },
    }
}

/// Routes the frames of one `/rpc/ws` socket whose calls name sessions of other nodes.
#[derive(Clone)]
pub struct RpcWsRelay {
    forwarder: Arc<Forwarder>,
    /// The socket's credentials (and Origin), sent with every call forwarded for it.
    headers: HeaderMap,
}

impl std::fmt::Debug for RpcWsRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcWsRelay").finish_non_exhaustive()
    }
}

/// Whether a JSON-RPC call stays on the node its WebSocket is open on whatever session it
/// names: a subscription lives with its socket.
pub fn stays_on_socket(method: Option<&str>) -> bool {
    matches!(method, Some("events.subscribe" | "events.unsubscribe"))
}

impl RpcWsRelay {
    fn new(forwarder: Arc<Forwarder>, from: &HeaderMap) -> Self {
        let mut headers = HeaderMap::new();
        for name in [header::AUTHORIZATION, header::COOKIE, header::ORIGIN] {
            for value in from.get_all(&name) {
                headers.append(name.clone(), value.clone());
            }
        }
        Self { forwarder, headers }
    }

    /// The answer to `frame` when its calls belong to another node: `Some(answer)` (`None`
    /// inside for notifications only), or `None` to answer it here.
    pub async fn answer(&self, frame: &[u8]) -> Option<Option<String>> {
        if let Some(sessions) = sessions_of_batch(frame) {
            let mut owners = Vec::with_capacity(sessions.len());
            for session_id in sessions {
                owners.push((session_id, elsewhere(&self.forwarder, session_id).await));
            }
            let subscribes =
                serde_json::from_slice::<Vec<serde_json::Value>>(frame).is_ok_and(|calls| {
                    calls
                        .iter()
                        .any(|c| stays_on_socket(c.get("method").and_then(|m| m.as_str())))
                });
            return match batch_route(&self.forwarder.node, owners) {
                BatchRoute::Here => None,
                BatchRoute::Mixed(owners) => {
                    Some(Some(mixed_batch_answer(frame, &owners).to_string()))
                }
                BatchRoute::To(..) if subscribes => None,
                BatchRoute::To(node, url) => self.post(frame, &node, &url).await,
            };
        }
        let call: serde_json::Value = serde_json::from_slice(frame).ok()?;
        if stays_on_socket(call.get("method").and_then(|m| m.as_str())) {
            return None;
        }
        let Some(Target::Session(session_id)) = target_of_rpc(frame) else {
            return None;
        };
        let (node, url) = elsewhere(&self.forwarder, session_id).await?;
        self.post(frame, &node, &url).await
    }

    /// Posts `frame` to the owner's `/rpc`: its answer, or `None` (answer here) when the
    /// owner could not be reached at all.
    async fn post(&self, frame: &[u8], node: &str, url: &str) -> Option<Option<String>> {
        let f = &self.forwarder;
        let mut headers = self.headers.clone();
        vouch_origin(&mut headers, url);
        let sent = f
            .http
            .post(format!("{}/rpc", url.trim_end_matches('/')))
            .headers(headers)
            .header(FORWARDED_BY, f.node.as_str())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Bytes::copy_from_slice(frame))
            .send()
            .await;
        let failed = |e: String| {
            counter!(FORWARDED_CALLS, "outcome" => "failed").increment(1);
            tracing::warn!(owner = %node, %url, error = %e, "WebSocket call not forwarded");
            Some(unanswered_frame(frame, node, url, &e))
        };
        let answer = match sent {
            Ok(answer) => answer,
            Err(e) if e.is_connect() => {
                counter!(FORWARDED_CALLS, "outcome" => "failed").increment(1);
                tracing::info!(owner = %node, %url, error = %e, "session owner unreachable; answering here");
                return None;
            }
            Err(e) => return failed(e.to_string()),
        };
        let status = answer.status();
        match answer.text().await {
            Ok(text) if status == reqwest::StatusCode::NO_CONTENT => {
                counter!(FORWARDED_CALLS, "outcome" => "ok").increment(1);
                drop(text);
                Some(None)
            }
            Ok(text) if status.is_success() => {
                counter!(FORWARDED_CALLS, "outcome" => "ok").increment(1);
                tracing::debug!(owner = %node, "WebSocket call forwarded");
                Some(Some(text))
            }
            Ok(text) => failed(format!("HTTP {status}: {text}")),
            Err(e) => failed(e.to_string()),
        }
    }
}

/// The frame's answer when its owner took it but gave no answer back: an error for each of
/// its calls (notifications get none) saying the outcome is unknown.
fn unanswered_frame(frame: &[u8], node: &str, url: &str, why: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct IdOf<'a> {
        #[serde(borrow, default)]
        id: Option<&'a serde_json::value::RawValue>,
    }
    let error = crate::error::RpcError::new(
        crate::error::INTERNAL_ERROR,
        format!(
            "forward_outcome_unknown: the call was sent to node {node} at {url}, which did not answer ({why}); it may have been applied: read the session before sending it again"
        ),
    );
    let error = serde_json::to_string(&error).unwrap_or_default();
    let one = |id: &serde_json::value::RawValue| {
        format!(r#"{{"jsonrpc":"2.0","id":{},"error":{error}}}"#, id.get())
    };
    if let Ok(calls) = serde_json::from_slice::<Vec<IdOf<'_>>>(frame) {
        let answers: Vec<String> = calls.iter().filter_map(|c| c.id.map(one)).collect();
        return (!answers.is_empty()).then(|| format!("[{}]", answers.join(",")));
    }
    serde_json::from_slice::<IdOf<'_>>(frame)
        .ok()
        .and_then(|c| c.id.map(one))
}

/// Headers that belong to one connection, not to the request or response.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "upgrade"
            | "te"
            | "trailer"
            | "host"
            | "content-length"
    )
}

/// Copies the end-to-end headers: not the hop-by-hop ones, nor those the `Connection` header
/// names as this hop's own (RFC 9110 §7.6.1).
fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    let named: Vec<String> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect();
    for (name, value) in from {
        if !hop_by_hop(name) && !named.iter().any(|n| n == name.as_str()) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// A browser's `Origin` passed this node's edge check before the call was forwarded: the
/// owner gets its own origin instead, so that its check (and the rule that a console cookie
/// changes state only with an Origin) passes for what this node already let through.
fn vouch_origin(headers: &mut HeaderMap, owner: &str) {
    if !headers.contains_key(header::ORIGIN) {
        return;
    }
    let origin = reqwest::Url::parse(owner)
        .ok()
        .map(|u| u.origin().ascii_serialization())
        .and_then(|o| axum::http::HeaderValue::from_str(&o).ok());
    match origin {
        Some(origin) => {
            headers.insert(header::ORIGIN, origin);
        }
        None => {
            headers.remove(header::ORIGIN);
        }
    }
}

/// Why a call was not forwarded.
enum Unsent {
    /// No connection to the owner: the request was not delivered.
    Unreachable(String),
    /// Delivered, or perhaps delivered, but no answer came back.
    Failed(String),
}

/// Sends the request to `base` and streams its answer back.
async fn send(
    f: &Forwarder,
    base: &str,
    parts: &axum::http::request::Parts,
    bytes: Bytes,
) -> Result<Response, Unsent> {
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
    let mut headers = HeaderMap::new();
    copy_headers(&parts.headers, &mut headers);
    vouch_origin(&mut headers, base);
    let mut request = f
        .http
        .request(
            parts.method.clone(),
            format!("{}{path}", base.trim_end_matches('/')),
        )
        .headers(headers)
        .header(FORWARDED_BY, f.node.as_str());
    if !bytes.is_empty() {
        request = request.body(bytes);
    }
    let answer = request.send().await.map_err(|e| {
        if e.is_connect() {
            Unsent::Unreachable(e.to_string())
        } else {
            Unsent::Failed(e.to_string())
        }
    })?;
    let mut response = Response::builder().status(answer.status());
    if let Some(h) = response.headers_mut() {
        copy_headers(answer.headers(), h);
        h.remove(header::CONTENT_LENGTH);
    }
    response
        .body(Body::from_stream(answer.bytes_stream()))
        .map_err(|e| Unsent::Failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_or_batch_sent_without_an_answer_is_502_outcome_unknown() {
        let response = outcome_unknown_answer("a batch", &"a", &"http://a", &"reset");
        assert_eq!(response.status(), axum::http::StatusCode::BAD_GATEWAY);
    }

    #[test]
    fn a_frame_the_owner_took_without_answering_gets_an_error_per_call() {
        let one = unanswered_frame(
            br#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"m"}"#,
            "a",
            "http://a",
            "reset",
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&one).unwrap();
        assert!(
            one.contains(r#""id":123456789012345678901234567890"#),
            "{one}"
        );
        assert_eq!(v["error"]["code"], crate::error::INTERNAL_ERROR);
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("forward_outcome_unknown")
        );
        let batch = unanswered_frame(
            br#"[{"jsonrpc":"2.0","id":"x","method":"m"},{"jsonrpc":"2.0","method":"n"}]"#,
            "a",
            "http://a",
            "reset",
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&batch).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 1, "notifications get none");
        assert_eq!(v[0]["id"], "x");
        assert_eq!(
            unanswered_frame(br#"{"jsonrpc":"2.0","method":"n"}"#, "a", "u", "r"),
            None
        );
        assert!(stays_on_socket(Some("events.subscribe")));
        assert!(stays_on_socket(Some("events.unsubscribe")));
        assert!(!stays_on_socket(Some("conversation.message")));
        assert!(!stays_on_socket(None));
    }

    #[test]
    fn a_checked_origin_is_passed_on_as_the_owners() {
        let mut h = HeaderMap::new();
        vouch_origin(&mut h, "http://10.0.0.2:7878/");
        assert!(h.get(header::ORIGIN).is_none(), "none added");
        h.insert(header::ORIGIN, "http://127.0.0.1:9000".parse().unwrap());
        vouch_origin(&mut h, "http://10.0.0.2:7878/");
        assert_eq!(h[header::ORIGIN], "http://10.0.0.2:7878");
        vouch_origin(&mut h, "not a url");
        assert!(h.get(header::ORIGIN).is_none());
    }

    /// A relay whose client end is two channels and whose owner end is a real WebSocket
    /// over an in-memory pipe; the owner's end is handed back to the test.
    async fn relay_pair() -> (
        futures::channel::mpsc::UnboundedSender<Result<axum::extract::ws::Message, String>>,
        futures::channel::mpsc::UnboundedReceiver<axum::extract::ws::Message>,
        tokio_tungstenite::WebSocketStream<tokio::io::DuplexStream>,
        tokio::task::JoinHandle<()>,
    ) {
        use futures::StreamExt;
        use tokio_tungstenite::tungstenite::protocol::Role;
        let (near, far) = tokio::io::duplex(1 << 16);
        let up =
            tokio_tungstenite::WebSocketStream::from_raw_socket(near, Role::Client, None).await;
        let owner =
            tokio_tungstenite::WebSocketStream::from_raw_socket(far, Role::Server, None).await;
        let (to_relay, client_rx) = futures::channel::mpsc::unbounded();
        let (client_tx, from_relay) = futures::channel::mpsc::unbounded();
        let (up_tx, up_rx) = up.split();
        let relay = tokio::spawn(relay_frames((client_tx, client_rx), (up_tx, up_rx)));
        (to_relay, from_relay, owner, relay)
    }

    #[tokio::test(start_paused = true)]
    async fn a_relay_closes_its_client_once_the_owner_is_silent() {
        use futures::StreamExt;
        let (_to_relay, mut from_relay, _owner, relay) = relay_pair().await;
        // The owner's end is never read: no pong, nothing.
        tokio::time::sleep(RELAY_SILENCE + std::time::Duration::from_secs(1)).await;
        let closed = from_relay.next().await;
        match closed {
            Some(axum::extract::ws::Message::Close(Some(frame))) => assert_eq!(frame.code, 1011),
            other => panic!("expected a close 1011, got {other:?}"),
        }
        relay.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_relay_pings_an_owner_that_answers_and_stays_open() {
        use futures::StreamExt;
        use tokio_tungstenite::tungstenite::Message as Up;
        let (_to_relay, mut from_relay, mut owner, relay) = relay_pair().await;
        // The owner's end is read (so it answers pings) for three silence periods.
        let pings = tokio::time::timeout(RELAY_SILENCE * 3, async {
            let mut pings = 0;
            while let Some(Ok(frame)) = owner.next().await {
                if matches!(frame, Up::Ping(_)) {
                    pings += 1;
                }
            }
            pings
        })
        .await;
        assert!(pings.is_err(), "the owner's end stayed open");
        assert!(!relay.is_finished(), "the relay still runs");
        assert!(from_relay.try_recv().is_err(), "nothing sent to the client");
        // The owner says a word: it reaches the client.
        futures::SinkExt::send(&mut owner, Up::text("hello"))
            .await
            .unwrap();
        let said = from_relay.next().await;
        assert_eq!(said, Some(axum::extract::ws::Message::text("hello")));
    }

    #[tokio::test]
    async fn a_body_not_read_is_answered_by_why() {
        use axum::http::StatusCode;
        let over = axum::body::to_bytes(Body::from(vec![b'x'; 20]), 10)
            .await
            .unwrap_err();
        assert_eq!(body_error(&over, 10).status, StatusCode::PAYLOAD_TOO_LARGE);
        let broken = futures::stream::iter([
            Ok::<_, std::io::Error>(Bytes::from_static(b"{")),
            Err(std::io::Error::other("connection reset")),
        ]);
        let broken = axum::body::to_bytes(Body::from_stream(broken), 10)
            .await
            .unwrap_err();
        let answer = body_error(&broken, 10);
        assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn only_end_to_end_headers_are_passed_on() {
        let mut from = HeaderMap::new();
        from.insert(header::CONNECTION, "keep-alive, X-Hop".parse().unwrap());
        from.insert("x-hop", "1".parse().unwrap());
        from.insert(header::HOST, "a:1".parse().unwrap());
        from.insert(header::AUTHORIZATION, "Bearer t".parse().unwrap());
        from.insert("x-end", "2".parse().unwrap());
        let mut to = HeaderMap::new();
        copy_headers(&from, &mut to);
        let mut names: Vec<&str> = to.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["authorization", "x-end"]);
    }

    #[test]
    fn the_session_a_call_names() {
        let id = SessionId::new();
        assert_eq!(session_of_path(&format!("/api/sessions/{id}")), Some(id));
        assert_eq!(
            session_of_path(&format!("/api/sessions/{id}/messages/3")),
            Some(id)
        );
        assert_eq!(
            session_of_path(&format!("/api/sessions/{id}/events/ws")),
            None
        );
        assert_eq!(session_of_path("/api/sessions"), None);
        assert_eq!(session_of_path("/api/sessions/not-an-id/messages"), None);
        assert_eq!(session_of_path("/api/agents"), None);
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "message.send",
            "params": {"session_id": id.to_string(), "text": "hi"}});
        assert_eq!(session_of_rpc(call.to_string().as_bytes()), Some(id));
        assert_eq!(
            session_of_rpc(format!("[{call}]").as_bytes()),
            None,
            "a batch"
        );
        assert_eq!(session_of_rpc(b"{\"method\": \"session.create\"}"), None);
        assert_eq!(
            target_of_rpc(b"{\"method\": \"session.create\", \"params\": {}}"),
            Some(Target::NewSession)
        );
        assert_eq!(
            target_of_rest(&Method::POST, "/api/sessions"),
            Some(Target::NewSession)
        );
        assert_eq!(target_of_rest(&Method::GET, "/api/sessions"), None);
        assert_eq!(
            target_of_rest(&Method::GET, &format!("/api/sessions/{id}")),
            Some(Target::Session(id))
        );
    }

    #[test]
    fn a_sessions_websocket_route_and_the_owners_address_for_it() {
        let id = SessionId::new();
        assert_eq!(
            session_of_ws_path(&format!("/api/sessions/{id}/events/ws")),
            Some(id)
        );
        assert_eq!(
            session_of_ws_path(&format!("/api/sessions/{id}/events")),
            None
        );
        assert_eq!(session_of_ws_path("/api/sessions/nope/events/ws"), None);
        assert_eq!(session_of_ws_path("/rpc/ws"), None);
        assert_eq!(
            ws_url("http://127.0.0.1:8081/", "/api/x/events/ws?after=3"),
            "ws://127.0.0.1:8081/api/x/events/ws?after=3"
        );
        assert_eq!(ws_url("https://a.example", "/p"), "wss://a.example/p");
    }

    #[test]
    fn a_batch_goes_where_all_its_sessions_live_or_is_refused() {
        let (x, y) = (SessionId::new(), SessionId::new());
        let on = |n: &str| Some((n.to_owned(), format!("http://{n}")));
        let call = |s: SessionId, id: u32| {
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "session.get",
                "params": {"session_id": s.to_string()}})
        };
        let body = serde_json::json!([call(x, 1), call(y, 2), call(x, 3)]).to_string();
        assert_eq!(sessions_of_batch(body.as_bytes()), Some(vec![x, y]));
        assert_eq!(sessions_of_batch(call(x, 1).to_string().as_bytes()), None);
        // More calls than a node takes: answered (refused) here, no owner read.
        let many: Vec<serde_json::Value> = (0..=crate::rpc::MAX_BATCH_CALLS)
            .map(|i| call(SessionId::new(), i as u32))
            .collect();
        assert_eq!(
            sessions_of_batch(serde_json::Value::Array(many).to_string().as_bytes()),
            None
        );
        assert!(outcome_unknown(&Method::POST) && outcome_unknown(&Method::DELETE));
        assert!(!outcome_unknown(&Method::GET));
        assert_eq!(batch_route("a", vec![]), BatchRoute::Here);
        assert_eq!(
            batch_route("a", vec![(x, None), (y, None)]),
            BatchRoute::Here
        );
        assert_eq!(
            batch_route("a", vec![(x, on("b")), (y, on("b"))]),
            BatchRoute::To("b".into(), "http://b".into())
        );
        assert_eq!(
            batch_route("a", vec![(x, None), (y, on("b"))]),
            BatchRoute::Mixed(vec![(x, "a".into()), (y, "b".into())])
        );
        assert_eq!(
            batch_route("a", vec![(x, on("c")), (y, on("b"))]),
            BatchRoute::Mixed(vec![(x, "c".into()), (y, "b".into())])
        );
        let answer = mixed_batch_answer(body.as_bytes(), &[(x, "a".into()), (y, "b".into())]);
        let answers = answer.as_array().unwrap();
        assert_eq!(answers.len(), 3);
        assert_eq!(answers[1]["id"], 2);
        assert_eq!(answers[1]["error"]["code"], crate::error::INVALID_REQUEST);
        let message = answers[1]["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("session {y} on node b")),
            "{message}"
        );
        assert_eq!(answers[0]["error"]["data"]["owners"][x.to_string()], "a");
    }

    #[test]
    fn only_another_nodes_published_lease_is_forwarded_to() {
        let url = || Some("http://127.0.0.1:1".to_owned());
        assert_eq!(
            forward_to("a", Some(("b".into(), url()))),
            Some(("b".into(), "http://127.0.0.1:1".into()))
        );
        assert_eq!(forward_to("a", Some(("a".into(), url()))), None, "mine");
        assert_eq!(
            forward_to("a", Some(("b".into(), None))),
            None,
            "no address"
        );
        assert_eq!(forward_to("a", None), None, "nobody's: activated here");
    }
}
