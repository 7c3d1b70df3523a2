//! The HTTP side: the router, `POST /rpc`, health, `/metrics`, and the middleware that every
//! request passes (a span and metrics per request, then authentication).

use super::auth::{Auth, Scope, require_token};
use super::error::ApiError;
use super::{AppState, ExtraRoutes};
use super::{rest, ws};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::time::Instant;
use tracing::Instrument;

/// The whole service, with `extra` routes merged in (`protected` ones behind the token check).
pub fn router(app: AppState, auth: Auth, metrics_public: bool, extra: ExtraRoutes) -> Router {
    let mut api = Router::new()
        .route("/rpc", post(rpc))
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
        .route("/api/sessions/{id}/events", get(rest::events_sse))
        .route("/api/sessions/{id}/events/ws", get(ws::events))
        .route("/api/projects/{pid}/sessions", get(rest::project_sessions))
        .route(
            "/api/projects/{pid}/current-session",
            get(rest::current_session).put(rest::set_current_session),
        );
    let mut open = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    if metrics_public {
        open = open.route("/metrics", get(metrics));
    } else {
        api = api.route("/metrics", get(metrics));
    }
    let limit = app.body_limit;
    let api = api
        .with_state(app.clone())
        .merge(extra.protected)
        .route_layer(middleware::from_fn_with_state(auth, require_token));
    Router::new()
        .merge(open.with_state(app))
        .merge(extra.public)
        .merge(api)
        .route_layer(middleware::from_fn(observe))
        .fallback(|| async { ApiError::route_not_found() })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(limit))
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
    super::metrics::request(&route, status, start.elapsed());
    response
}

/// The body, or 413 (over the limit) / 400 (unreadable) with the error body.
pub fn body(bytes: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    bytes.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else {
            ApiError::bad_request(e.body_text())
        }
    })
}

/// `POST /rpc`: one call or a batch; 204 when only notifications were sent.
async fn rpc(
    State(app): State<AppState>,
    axum::Extension(scope): axum::Extension<Scope>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body(bytes, app.body_limit)?;
    Ok(match app.rpc.handle_frame(&scope, &bytes, None).await {
        Some(answer) => axum::Json(answer).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

/// Alive: every component runs or is being restarted. 503 with the reason once one could
/// not be recovered (the process is about to exit non-zero).
async fn healthz(State(app): State<AppState>) -> Response {
    match &*app.rpc.sessions.health().borrow() {
        super::supervisor::Health::Ok => {
            axum::Json(serde_json::json!({"status": "ok"})).into_response()
        }
        super::supervisor::Health::Failed { component, reason } => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({
                "status": "failed",
                "component": component,
                "reason": reason,
            })),
        )
            .into_response(),
    }
}

/// Ready: the store answers, the registry is up, and the service is not shutting down.
async fn readyz(State(app): State<AppState>) -> Response {
    if app.shutdown.is_cancelled() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "shutting_down"})),
        )
            .into_response();
    }
    match app.rpc.sessions.ready().await {
        Ok(()) => axum::Json(serde_json::json!({"status": "ready"})).into_response(),
        Err(e) => {
            let mut r = ApiError::from(e);
            r.status = StatusCode::SERVICE_UNAVAILABLE;
            r.into_response()
        }
    }
}

/// Prometheus text format.
async fn metrics(State(app): State<AppState>) -> Response {
    match &app.prometheus {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no metrics recorder is installed in this process",
        )
        .into_response(),
    }
}
