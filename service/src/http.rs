//! The HTTP routes that are neither REST nor WebSocket: `POST /rpc`, `/healthz`, `/readyz`
//! and `/metrics`.

use crate::auth::Scope;
use crate::error::ApiError;
use crate::extract::body;
use crate::state::AppState;
use crate::supervisor::Health;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// `POST /rpc`: one call or a batch; 204 when only notifications were sent.
pub async fn rpc(
    State(app): State<AppState>,
    axum::Extension(scope): axum::Extension<Scope>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body(bytes, app.body_limit)?;
    Ok(match app.rpc.handle_frame(&scope, &bytes, None).await {
        Some(answer) => (
            [(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            )],
            answer,
        )
            .into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

/// Alive: every component runs or is being restarted. 503 with the reason once one could
/// not be recovered (the process is about to exit non-zero).
pub async fn healthz(State(app): State<AppState>) -> Response {
    match &*app.rpc.sessions.health().borrow() {
        Health::Ok => axum::Json(serde_json::json!({"status": "ok"})).into_response(),
        Health::Failed { component, reason } => (
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
pub async fn readyz(State(app): State<AppState>) -> Response {
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
pub async fn metrics(State(app): State<AppState>) -> Response {
    match &app.prometheus {
        Some(handle) => {
            // A waiting request ages with nothing to tell of it: its age is taken now.
            troupe_actors::scheduler::metrics::publish_oldest_wait();
            (
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                handle.render(),
            )
                .into_response()
        }
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no metrics recorder is installed in this process",
        )
        .into_response(),
    }
}
