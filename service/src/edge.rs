//! The checks every HTTP request passes first, before authentication: the Host it names, the
//! Origin a browser gives it, and the content type of a JSON body. They keep web pages the
//! user visits from using the service through the user's browser:
//!
//! - **Host**: a page served from a name the attacker controls, re-pointed at 127.0.0.1 (DNS
//!   rebinding), sends that name as its Host: it is not one of the service's, 403.
//! - **Origin**: a foreign page's WebSocket upgrade, and any request of a foreign page that
//!   could change something (every method but GET and HEAD), carry its Origin: 403. A request
//!   without an Origin (curl, the SDKs, other services) passes; so does the service's own
//!   origin (`http://` or `https://` + an allowed host) and every configured one.
//! - **Content type**: a body sent to a JSON API (`/rpc`, `/a2a`, `/api/...`) must be
//!   `application/json` (or `application/*+json`, parameters allowed), else 415: a browser
//!   sends `text/plain` and form bodies cross-site without asking first, never JSON.
//!
//! `GET`/`HEAD` of `/healthz`, `/readyz` and `/metrics` pass without any check (probes and
//! scrapers name the service as they please). The decision ([`check`]) is a pure function of
//! the request's method, path and headers; [`guard`] is the middleware around it. Refusals are
//! counted in `troupe_api_refused_total{reason}` and logged at debug level.

use crate::error::ApiError;
use axum::body::HttpBody;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use troupe_proto::AgentError;

/// Why a request was refused at the edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The Host names none of the service's hosts.
    Host,
    /// A foreign Origin on a WebSocket upgrade or a state-changing request.
    Origin,
    /// A body for a JSON API that is not declared JSON.
    ContentType,
}

impl Refusal {
    pub const ALL: [Self; 3] = [Self::Host, Self::Origin, Self::ContentType];

    /// The metric label.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Origin => "origin",
            Self::ContentType => "content_type",
        }
    }

    /// The answer: 403 `forbidden` (Host, Origin) or 415 `unsupported_media_type`.
    pub fn to_error(self) -> ApiError {
        match self {
            Self::Host => ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "the Host header names none of this service's hosts (see server.allowed_hosts)",
            ),
            Self::Origin => ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "requests from this Origin may not change state or open WebSockets \
                 (see server.allowed_origins)",
            ),
            Self::ContentType => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "this route takes a JSON body: Content-Type: application/json",
            ),
        }
    }
}

/// What the checks read from a request.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    /// The Host header (or the URI's authority, HTTP/2).
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub content_type: Option<&'a str>,
    /// An `Upgrade: websocket` request.
    pub websocket: bool,
    /// The request has a body (a non-zero length, or a chunked one).
    pub has_body: bool,
}

/// Which hosts and origins the service answers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgePolicy {
    /// The listen port.
    port: u16,
    /// Names and IP literals (IPv6 in brackets) allowed at the listen port.
    own: BTreeSet<String>,
    /// Listening on every address: any IP literal at the listen port is ours.
    any_ip: bool,
    /// Configured `name` (any port) or `name:port`.
    configured: Vec<(String, Option<u16>)>,
    /// `allowed_hosts` holds `"*"`.
    any_host: bool,
    /// Configured origins, normalized (`scheme://host[:port]`, lowercase).
    origins: BTreeSet<String>,
}

impl EdgePolicy {
    /// The policy of a service listening on `addr`, with the configured `allowed_hosts` and
    /// `allowed_origins`; an entry that does not parse is an error.
    pub fn new(
        addr: SocketAddr,
        allowed_hosts: &[String],
        allowed_origins: &[String],
    ) -> Result<Self, AgentError> {
        let ip = addr.ip();
        let mut own = BTreeSet::from(["localhost".to_owned()]);
        if ip.is_loopback() {
            own.insert("127.0.0.1".to_owned());
            own.insert("[::1]".to_owned());
        }
        if !ip.is_unspecified() {
            own.insert(ip_literal(ip));
        }
        let mut configured = Vec::new();
        let mut any_host = false;
        for entry in allowed_hosts {
            if entry.trim() == "*" {
                any_host = true;
                continue;
            }
            let (name, port) = split_host(entry.trim()).ok_or_else(|| {
                AgentError::invalid(format!(
                    "server.allowed_hosts: `{entry}` is not `name` or `name:port`"
                ))
            })?;
            configured.push((name, port));
        }
        let mut origins = BTreeSet::new();
        for entry in allowed_origins {
            let normalized = normalize_origin(entry).ok_or_else(|| {
                AgentError::invalid(format!(
                    "server.allowed_origins: `{entry}` is not an origin such as \
                     `https://console.example.com`"
                ))
            })?;
            origins.insert(normalized);
        }
        Ok(Self {
            port: addr.port(),
            own,
            any_ip: ip.is_unspecified(),
            configured,
            any_host,
            origins,
        })
    }

    /// Whether `name` at `port` (both from a Host or an Origin) is one of the service's.
    fn host_allowed(&self, name: &str, port: u16) -> bool {
        if self.any_host {
            return true;
        }
        if port == self.port && (self.own.contains(name) || (self.any_ip && is_ip_literal(name))) {
            return true;
        }
        self.configured
            .iter()
            .any(|(n, p)| n == name && p.is_none_or(|p| p == port))
    }

    /// Whether a request to `host` (its Host header) may come from a page of `origin`: one
    /// of `allowed_origins`, or the service's own (an allowed host). With `allowed_hosts =
    /// "*"` every name is allowed as a Host, but not as an Origin: a page's origin is the
    /// service's own only when it is the host the request is sent to (same origin).
    fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        let Some(normalized) = normalize_origin(origin) else {
            return false;
        };
        if self.origins.contains(&normalized) {
            return true;
        }
        let Some((scheme, authority)) = normalized.split_once("://") else {
            return false;
        };
        let default_port = if scheme == "https" { 443 } else { 80 };
        let Some((name, port)) = split_host(authority) else {
            return false;
        };
        if !self.any_host {
            return self.host_allowed(&name, port.unwrap_or(default_port));
        }
        host.and_then(split_host).is_some_and(|(h_name, h_port)| {
            h_name == name && (h_port == port || (port.is_none() && h_port == Some(default_port)))
        })
    }
}

/// The decision: `Ok` lets the request on.
pub fn check(policy: &EdgePolicy, req: &Facts<'_>) -> Result<(), Refusal> {
    let read_only = matches!(*req.method, Method::GET | Method::HEAD);
    if read_only && !req.websocket && matches!(req.path, "/healthz" | "/readyz" | "/metrics") {
        return Ok(());
    }
    if let Some(host) = req.host {
        let allowed = split_host(host)
            .is_some_and(|(name, port)| policy.host_allowed(&name, port.unwrap_or(80)));
        if !allowed {
            return Err(Refusal::Host);
        }
    }
    if (req.websocket || !read_only)
        && let Some(origin) = req.origin
        && !policy.origin_allowed(origin, req.host)
    {
        return Err(Refusal::Origin);
    }
    let json_api = req.path == "/rpc"
        || req.path == "/a2a"
        || req.path.starts_with("/a2a/")
        || req.path.starts_with("/api/");
    let sends_body = req.has_body || req.content_type.is_some();
    let may_change = !matches!(
        *req.method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    );
    if json_api && may_change && sends_body && !req.content_type.is_some_and(is_json) {
        return Err(Refusal::ContentType);
    }
    Ok(())
}

/// `application/json` or `application/<anything>+json`, with any parameters.
pub fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match essence.strip_prefix("application/") {
        Some(sub) => sub == "json" || (sub.len() > 5 && sub.ends_with("+json")),
        None => false,
    }
}

/// `name[:port]` → the name in lowercase (without a trailing dot; IPv6 kept in brackets)
/// and the port; `None` when it is no host.
pub fn split_host(host: &str) -> Option<(String, Option<u16>)> {
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        inside.parse::<Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{inside}]"), port)
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name.to_owned(), Some(port)),
            None => (host.to_owned(), None),
        }
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => Some(p.parse().ok()?),
        Some(_) => return None,
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let valid = !name.is_empty()
        && (name.starts_with('[')
            || name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_'));
    valid.then_some((name, port))
}

/// `scheme://host[:port]` in lowercase, without a trailing slash; `None` for anything else
/// (including the opaque origin `null`).
fn normalize_origin(origin: &str) -> Option<String> {
    let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    let (scheme, authority) = origin.split_once("://")?;
    if !matches!(scheme, "http" | "https") || authority.contains('/') {
        return None;
    }
    split_host(authority)?;
    Some(origin)
}

fn ip_literal(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

fn is_ip_literal(name: &str) -> bool {
    match name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().is_ok(),
        None => name.parse::<std::net::Ipv4Addr>().is_ok(),
    }
}

/// The middleware: [`check`] on each request; a refusal is answered with its error body.
pub async fn guard(State(policy): State<Arc<EdgePolicy>>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let host = text(header::HOST).or_else(|| req.uri().authority().map(|a| a.as_str()));
    let has_body = !req.body().is_end_stream()
        || headers.contains_key(header::TRANSFER_ENCODING)
        || text(header::CONTENT_LENGTH).is_some_and(|l| l.trim() != "0");
    let facts = Facts {
        method: req.method(),
        path: req.uri().path(),
        host,
        origin: text(header::ORIGIN),
        content_type: text(header::CONTENT_TYPE),
        websocket: text(header::UPGRADE).is_some_and(|u| u.eq_ignore_ascii_case("websocket")),
        has_body,
    };
    match check(&policy, &facts) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            crate::metrics::edge_refused(refusal);
            tracing::debug!(
                reason = refusal.reason(),
                method = %facts.method,
                path = facts.path,
                host = facts.host,
                origin = facts.origin,
                content_type = facts.content_type,
                "request refused at the edge"
            );
            refusal.to_error().into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn loopback() -> EdgePolicy {
        EdgePolicy::new("127.0.0.1:7878".parse().unwrap(), &[], &[]).unwrap()
    }

    fn facts<'a>(method: &'a Method, path: &'a str) -> Facts<'a> {
        Facts {
            method,
            path,
            host: Some("127.0.0.1:7878"),
            origin: None,
            content_type: None,
            websocket: false,
            has_body: false,
        }
    }

    #[test]
    fn the_service_answers_to_its_own_hosts_only() {
        let p = loopback();
        let get = Method::GET;
        for host in [
            "127.0.0.1:7878",
            "localhost:7878",
            "LOCALHOST.:7878",
            "[::1]:7878",
        ] {
            let f = Facts {
                host: Some(host),
                ..facts(&get, "/api/sessions/x")
            };
            assert_eq!(check(&p, &f), Ok(()), "{host}");
        }
        for host in [
            "evil.example:7878",
            "127.0.0.1:7879",
            "localhost",
            "10.0.0.5:7878",
            "127.0.0.1:x",
            "",
            "a b:7878",
        ] {
            let f = Facts {
                host: Some(host),
                ..facts(&get, "/api/sessions/x")
            };
            assert_eq!(check(&p, &f), Err(Refusal::Host), "{host}");
        }
        let f = Facts {
            host: None,
            ..facts(&get, "/api/sessions/x")
        };
        assert_eq!(check(&p, &f), Ok(()), "no Host: not a browser");
    }

    #[test]
    fn configured_and_wildcard_hosts() {
        let any_ip = EdgePolicy::new(
            "0.0.0.0:9000".parse().unwrap(),
            &["troupe.internal".into(), "api.example:443".into()],
            &[],
        )
        .unwrap();
        let get = Method::GET;
        let at = |host| Facts {
            host: Some(host),
            ..facts(&get, "/rpc/ws")
        };
        for ok in [
            "10.1.2.3:9000",
            "[fe80::1]:9000",
            "troupe.internal",
            "troupe.internal:8080",
            "api.example:443",
            "localhost:9000",
        ] {
            assert_eq!(check(&any_ip, &at(ok)), Ok(()), "{ok}");
        }
        for no in ["10.1.2.3:9001", "api.example", "rebind.evil.example:9000"] {
            assert_eq!(check(&any_ip, &at(no)), Err(Refusal::Host), "{no}");
        }
        let star = EdgePolicy::new("127.0.0.1:1".parse().unwrap(), &["*".into()], &[]).unwrap();
        assert_eq!(check(&star, &at("anything.example")), Ok(()));
        // `*` opens the Host check, not the Origin check: a page may write only to the host
        // it came from.
        let post = Method::POST;
        let from = |host, origin| Facts {
            host: Some(host),
            origin: Some(origin),
            content_type: Some("application/json"),
            has_body: true,
            ..facts(&post, "/rpc")
        };
        for (host, origin) in [
            ("api.example", "https://api.example"),
            ("api.example:8443", "https://api.example:8443"),
            ("api.example:443", "https://api.example"),
            ("127.0.0.1:1", "http://127.0.0.1:1"),
        ] {
            assert_eq!(check(&star, &from(host, origin)), Ok(()), "{host} {origin}");
        }
        for (host, origin) in [
            ("127.0.0.1:1", "https://evil.example"),
            ("api.example", "https://sub.api.example"),
            ("api.example", "https://api.example:8443"),
            ("127.0.0.1:1", "http://127.0.0.1:2"),
        ] {
            assert_eq!(
                check(&star, &from(host, origin)),
                Err(Refusal::Origin),
                "{host} {origin}"
            );
        }
        assert!(EdgePolicy::new("127.0.0.1:1".parse().unwrap(), &["a/b".into()], &[]).is_err());
        assert!(EdgePolicy::new("127.0.0.1:1".parse().unwrap(), &[], &["null".into()]).is_err());
    }

    #[test]
    fn a_foreign_origin_may_read_but_not_write_or_upgrade() {
        let p = EdgePolicy::new(
            "127.0.0.1:7878".parse().unwrap(),
            &[],
            &["https://console.example.com/".into()],
        )
        .unwrap();
        let (get, post, delete) = (Method::GET, Method::POST, Method::DELETE);
        let json = Some("application/json");
        let with = |method, origin, websocket| Facts {
            origin,
            websocket,
            content_type: json,
            has_body: true,
            ..facts(method, "/rpc")
        };
        for foreign in ["https://evil.example", "null", "http://127.0.0.1:7879", "x"] {
            let o = Some(foreign);
            assert_eq!(check(&p, &with(&post, o, false)), Err(Refusal::Origin));
            assert_eq!(check(&p, &with(&delete, o, false)), Err(Refusal::Origin));
            assert_eq!(check(&p, &with(&get, o, true)), Err(Refusal::Origin));
            assert_eq!(check(&p, &with(&get, o, false)), Ok(()), "a plain read");
        }
        for own in [
            "http://127.0.0.1:7878",
            "http://localhost:7878",
            "https://Console.Example.com",
            "http://[::1]:7878",
        ] {
            assert_eq!(check(&p, &with(&post, Some(own), false)), Ok(()), "{own}");
            assert_eq!(check(&p, &with(&get, Some(own), true)), Ok(()), "{own}");
        }
        assert_eq!(check(&p, &with(&post, None, false)), Ok(()), "no Origin");
    }

    #[test]
    fn json_apis_take_json_bodies_only() {
        let p = loopback();
        let post = Method::POST;
        let put = Method::PUT;
        let body = |method, path, content_type| Facts {
            content_type,
            has_body: true,
            ..facts(method, path)
        };
        for path in ["/rpc", "/a2a", "/a2a/", "/api/sessions"] {
            for bad in [
                None,
                Some("text/plain"),
                Some("application/x-www-form-urlencoded"),
                Some("multipart/form-data; boundary=x"),
                Some("application/jsonp"),
                Some("application/+json"),
            ] {
                assert_eq!(
                    check(&p, &body(&post, path, bad)),
                    Err(Refusal::ContentType),
                    "{path} {bad:?}"
                );
            }
            for good in [
                "application/json",
                "Application/JSON; charset=utf-8",
                "application/merge-patch+json",
            ] {
                assert_eq!(check(&p, &body(&post, path, Some(good))), Ok(()), "{good}");
            }
        }
        assert_eq!(
            check(&p, &body(&put, "/api/projects/p/current-session", None)),
            Err(Refusal::ContentType)
        );
        assert_eq!(
            check(&p, &facts(&post, "/api/sessions")),
            Ok(()),
            "no body, no type: an empty object"
        );
        assert_eq!(
            check(
                &p,
                &Facts {
                    content_type: Some("text/plain"),
                    ..facts(&post, "/api/sessions")
                }
            ),
            Err(Refusal::ContentType),
            "a declared non-JSON type, even empty"
        );
        assert_eq!(
            check(&p, &body(&post, "/elsewhere", Some("text/plain"))),
            Ok(()),
            "not a JSON API: left to the router (404)"
        );
    }

    #[test]
    fn probes_pass_from_anywhere() {
        let p = loopback();
        let get = Method::GET;
        for path in ["/healthz", "/readyz", "/metrics"] {
            let f = Facts {
                host: Some("kubelet.example:1"),
                origin: Some("https://evil.example"),
                ..facts(&get, path)
            };
            assert_eq!(check(&p, &f), Ok(()), "{path}");
        }
        let post = Method::POST;
        let f = Facts {
            host: Some("evil.example"),
            ..facts(&post, "/healthz")
        };
        assert_eq!(check(&p, &f), Err(Refusal::Host));
    }

    #[test]
    fn json_types() {
        assert!(is_json("application/json"));
        assert!(is_json(" application/json ;charset=UTF-8"));
        assert!(is_json("application/vnd.a2a+json"));
        assert!(!is_json("text/json"));
        assert!(!is_json("application/json5"));
        assert!(!is_json(""));
    }

    #[test]
    fn the_middleware_answers_and_counts_refusals() {
        use tower::ServiceExt;
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let app = axum::Router::new()
            .route("/rpc", axum::routing::post(|| async { "called" }))
            .layer(axum::middleware::from_fn_with_state(
                Arc::new(loopback()),
                guard,
            ));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let statuses = metrics::with_local_recorder(&recorder, || {
            rt.block_on(async {
                let mut statuses = Vec::new();
                for (origin, content_type) in [
                    (None, "application/json"),
                    (Some("https://evil.example"), "application/json"),
                    (None, "text/plain"),
                ] {
                    let mut req = Request::post("/rpc")
                        .header(header::HOST, "localhost:7878")
                        .header(header::CONTENT_TYPE, content_type);
                    if let Some(o) = origin {
                        req = req.header(header::ORIGIN, o);
                    }
                    let req = req.body(axum::body::Body::from("{}")).unwrap();
                    let answer = app.clone().oneshot(req).await.unwrap();
                    statuses.push(answer.status().as_u16());
                }
                statuses
            })
        });
        assert_eq!(statuses, [200, 403, 415]);
        let counted: Vec<(String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == crate::metrics::API_REFUSED_TOTAL)
            .map(|(key, _, _, value)| {
                let reason = key.key().labels().next().unwrap().value().to_owned();
                let metrics_util::debugging::DebugValue::Counter(n) = value else {
                    panic!("a counter")
                };
                (reason, n)
            })
            .collect();
        assert_eq!(counted.len(), 2, "{counted:?}");
        assert!(counted.contains(&("origin".to_owned(), 1)), "{counted:?}");
        assert!(
            counted.contains(&("content_type".to_owned(), 1)),
            "{counted:?}"
        );
    }

    proptest! {
        #[test]
        fn host_parsing_never_panics_and_round_trips(s in "\\PC{0,40}") {
            if let Some((name, port)) = split_host(&s) {
                let again = match port {
                    Some(p) => format!("{name}:{p}"),
                    None => name.clone(),
                };
                prop_assert_eq!(split_host(&again), Some((name, port)));
            }
        }

        #[test]
        fn a_foreign_origin_never_changes_anything(
            name in "[a-z]{1,12}\\.(example|test|com)",
            port in proptest::option::of(any::<u16>()),
            scheme in prop_oneof![Just("http"), Just("https")],
            method in prop_oneof![Just(Method::POST), Just(Method::PUT), Just(Method::PATCH),
                Just(Method::DELETE), Just(Method::OPTIONS)],
            path in prop_oneof![Just("/rpc"), Just("/a2a"), Just("/api/sessions"), Just("/x")],
        ) {
            let origin = match port {
                Some(p) => format!("{scheme}://{name}:{p}"),
                None => format!("{scheme}://{name}"),
            };
            let f = Facts {
                origin: Some(&origin),
                content_type: Some("application/json"),
                has_body: true,
                ..facts(&method, path)
            };
            prop_assert_eq!(check(&loopback(), &f), Err(Refusal::Origin));
            let no_origin = Facts { origin: None, ..f };
            prop_assert_eq!(check(&loopback(), &no_origin), Ok(()));
        }

        #[test]
        fn a_foreign_host_reads_nothing(
            name in "[a-z]{1,12}\\.(example|test|com)",
            port in any::<u16>(),
            path in prop_oneof![Just("/rpc/ws"), Just("/api/sessions/x"), Just("/")],
        ) {
            let host = format!("{name}:{port}");
            let get = Method::GET;
            let f = Facts { host: Some(&host), ..facts(&get, path) };
            prop_assert_eq!(check(&loopback(), &f), Err(Refusal::Host));
        }
    }
}
