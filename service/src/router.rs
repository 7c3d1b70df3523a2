//! The router: every route of the service, and the middleware each request passes (a span
//! and the request metrics, then authentication for all but the public routes). Every error
//! leaves as `{code, message, details}`, axum's own rejections included
//! ([`crate::error::json_errors`]).

use crate::auth::{Auth, require_token};
use crate::error::ApiError;
use crate::state::{AppState, ExtraRoutes};
use crate::{http, rest, ws};
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use std::time::Instant;
use tracing::Instrument;

/// The whole service, with `extra` routes merged in (`protected` ones behind the token check).
pub fn router(
    app: AppState,
    auth: Auth,
    metrics_public: bool,
    console: Option<troupe_runtime::config::ConsoleConfig>,
    extra: ExtraRoutes,
) -> Router {
    let mut api = Router::new()
        .route("/rpc", post(http::rpc))
        .route("/rpc/ws", get(ws::rpc))
        .route("/api/sessions", post(rest::create_session))
        .route("/api/sessions/{id}", get(rest::get_session))
        .route(
            "/api/sessions/{id}/messages",
            get(rest::list_messages).post(rest::post_message),
        )
        .route(
            "/api/sessions/{id}/messages/{message_id}",
            get(rest::get_message),
        )
        .route(
            "/api/sessions/{id}/conversations/{cid}/cancel",
            post(rest::cancel_conversation),
        )
        .route(
            "/api/sessions/{id}/conversations/{cid}/compact",
            post(rest::compact_conversation),
        )
        .route(
            "/api/sessions/{id}/conversations/{cid}/context",
            axum::routing::put(rest::set_context),
        )
        .route("/api/agents", get(rest::list_agents))
        .route("/api/modules", get(rest::list_modules))
        .route(
            "/api/tokens",
            get(rest::list_tokens).post(rest::issue_token),
        )
        .route(
            "/api/tokens/{id}",
            axum::routing::delete(rest::revoke_token),
        )
        .route("/api/sessions/{id}/agents", get(rest::session_agents))
        .route("/api/sessions/{id}/events", get(rest::events_sse))
        .route("/api/sessions/{id}/events/head", get(rest::events_head))
        .route("/api/sessions/{id}/events/ws", get(ws::events))
        .route("/api/projects/{pid}/sessions", get(rest::project_sessions))
        .route(
            "/api/projects/{pid}/current-session",
            get(rest::current_session).put(rest::set_current_session),
        );
    let mut open = Router::new()
        .route("/healthz", get(http::healthz))
        .route("/readyz", get(http::readyz));
    if metrics_public {
        open = open.route("/metrics", get(http::metrics));
    } else {
        api = api.route("/metrics", get(http::metrics));
    }
    let limit = app.body_limit;
    let console = match console {
        Some(config) => crate::console::routes(app.clone(), auth.clone(), config),
        None => Router::new(),
    };
    let forward = app.forward.clone();
    let api = api
        .with_state(app.clone())
        .merge(extra.protected)
        .route_layer(middleware::from_fn_with_state(
            forward,
            crate::forward::forward,
        ))
        .route_layer(middleware::from_fn_with_state(auth, require_token));
    Router::new()
        .merge(open.with_state(app))
        .merge(extra.public)
        .merge(console)
        .merge(api)
        .route_layer(middleware::from_fn(observe))
        .fallback(|| async { ApiError::route_not_found() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn(crate::error::json_errors))
}

/// A span and the request metrics, labelled by route template.
async fn observe(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let span = tracing::info_span!(
        "http",
        route = %route,
        method = %req.method(),
        status = tracing::field::Empty
    );
    let start = Instant::now();
    let response = next.run(req).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.record("status", status);
    crate::metrics::request(&route, status, start.elapsed());
    response
}
