//! What the routes share: the [`AppState`] every handler gets, and the [`ExtraRoutes`]
//! served beside the API.

use crate::auth::Scope;
use crate::error::ApiError;
use crate::rpc::Rpc;
use crate::stream::StreamEvent;
use futures::{Stream, StreamExt};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;
use troupe_proto::{AgentError, SessionId};

/// What every route handler gets.
#[derive(Clone)]
pub struct AppState {
    pub rpc: Rpc,
    pub body_limit: usize,
    /// Fired when the service starts shutting down: streams end, `/readyz` says so.
    pub shutdown: CancellationToken,
    pub prometheus: Option<PrometheusHandle>,
    /// A node of a cluster forwards calls for the sessions other nodes own.
    pub forward: Option<std::sync::Arc<crate::forward::Forwarder>>,
    /// The JSON-RPC WebSocket connections (upgraded, so no longer the HTTP server's): a
    /// shutdown waits for them to answer the calls they still carry.
    pub connections: tokio_util::task::TaskTracker,
}

impl AppState {
    /// The events of a session the scope sees after a point, ending when the service shuts
    /// down.
    pub async fn session_events(
        &self,
        scope: Scope,
        id: SessionId,
        after: u64,
    ) -> Result<
        impl Stream<Item = Result<StreamEvent, AgentError>> + Send + 'static + use<>,
        ApiError,
    > {
        let events = self.rpc.sessions.events(scope, id, after).await?;
        Ok(events.take_until(self.shutdown.clone().cancelled_owned()))
    }
}

/// Routes served beside the API: `public` ones without a token (like `/healthz`), and
/// `protected` ones behind the same bearer-token check as the API.
#[derive(Default)]
pub struct ExtraRoutes {
    pub public: axum::Router,
    pub protected: axum::Router,
}

impl std::fmt::Debug for ExtraRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtraRoutes").finish_non_exhaustive()
    }
}
