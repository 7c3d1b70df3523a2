//! The client side of an rmcp connection: answers the server's requests through troupe's
//! `McpClientHandler` and turns its notifications into `McpNotice`s.
//!
//! rmcp runs each server request and each notification in a task of its own, so a slow
//! `elicit` (a human answering) holds up nothing else.

// Roots and sampling are deprecated in the newest MCP draft (SEP-2577) but are what the
// 2025-11-25 servers use.
#![allow(deprecated)]

use rmcp::ClientHandler;
use rmcp::model::{
    ClientCapabilities, ClientInfo, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationCapability, ErrorData,
    FormElicitationCapability, Implementation, ListRootsResult, LoggingMessageNotificationParam,
    ProgressNotificationParam, ProgressToken, ProtocolVersion, Root, RootsCapabilities,
    SamplingCapability,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc::UnboundedSender;
use troupe_actors::ports::{ElicitOutcome, McpClientHandler, McpNotice};
use troupe_proto::Json;

/// Where each in-flight call's progress goes, keyed by the progress token rmcp put in the
/// request's `_meta`.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProgressRoutes {
    routes: Arc<Mutex<HashMap<ProgressToken, UnboundedSender<McpNotice>>>>,
}

impl ProgressRoutes {
    /// Routes `token`'s progress to `sender` until the returned guard is dropped.
    pub(crate) fn register(
        &self,
        token: ProgressToken,
        sender: UnboundedSender<McpNotice>,
    ) -> RouteGuard {
        self.lock().insert(token.clone(), sender);
        RouteGuard {
            routes: self.clone(),
            token,
        }
    }

    fn route(&self, token: &ProgressToken) -> Option<UnboundedSender<McpNotice>> {
        self.lock().get(token).cloned()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<ProgressToken, UnboundedSender<McpNotice>>> {
        // Single inserts and removes: a poisoned map is still consistent.
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Removes a progress route when its call ends, however it ends.
pub(crate) struct RouteGuard {
    routes: ProgressRoutes,
    token: ProgressToken,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        self.routes.lock().remove(&self.token);
    }
}

/// The rmcp `ClientHandler` of one connection.
pub(crate) struct TroupeClient {
    pub(crate) server: Arc<str>,
    pub(crate) handler: Arc<dyn McpClientHandler>,
    pub(crate) notices: UnboundedSender<McpNotice>,
    pub(crate) routes: ProgressRoutes,
}

/// What troupe tells a server in `initialize`: roots (a fixed list: `listChanged` false),
/// form elicitation and sampling, all answered by the `McpClientHandler`.
pub(crate) fn client_info() -> ClientInfo {
    let mut roots = RootsCapabilities::default();
    roots.list_changed = Some(false);
    let mut capabilities = ClientCapabilities::default();
    capabilities.roots = Some(roots);
    capabilities.sampling = Some(SamplingCapability::default());
    capabilities.elicitation =
        Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
    // The version the npm reference servers speak; a server answers with the one it picked.
    ClientInfo::new(
        capabilities,
        Implementation::new("troupe", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(ProtocolVersion::V_2025_11_25)
}

impl ClientHandler for TroupeClient {
    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        let roots = self.handler.list_roots().await;
        tracing::debug!(mcp_server = %self.server, roots = roots.len(), "roots/list answered");
        Ok(ListRootsResult::new(
            roots.into_iter().map(Root::new).collect(),
        ))
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } = request
        else {
            // Only form elicitation is declared; anything else is declined.
            return Ok(ElicitResult::new(ElicitationAction::Decline));
        };
        let schema = serde_json::to_value(&requested_schema).unwrap_or_default();
        let answer = tokio::select! {
            answer = self.handler.elicit_outcome(message, Json(schema)) => answer,
            // The server cancelled its request: nobody is waiting for the answer.
            _ = context.ct.cancelled() => return Ok(ElicitResult::new(ElicitationAction::Cancel)),
        };
        match answer {
            ElicitOutcome::Accept(Json(content)) => {
                Ok(ElicitResult::new(ElicitationAction::Accept).with_content(content))
            }
            ElicitOutcome::Decline => {
                tracing::info!(mcp_server = %self.server, "elicitation declined");
                Ok(ElicitResult::new(ElicitationAction::Decline))
            }
            ElicitOutcome::Cancel => {
                tracing::info!(mcp_server = %self.server, "elicitation cancelled");
                Ok(ElicitResult::new(ElicitationAction::Cancel))
            }
        }
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let request = serde_json::to_value(&params)
            .map_err(|e| ErrorData::internal_error(format!("sampling request: {e}"), None))?;
        let answer = tokio::select! {
            answer = self.handler.sample(Json(request)) => answer,
            _ = context.ct.cancelled() => {
                return Err(ErrorData::internal_error("sampling cancelled", None));
            }
        };
        match answer {
            Ok(Json(result)) => serde_json::from_value(result).map_err(|e| {
                ErrorData::internal_error(
                    format!("the client's sampling result is invalid: {e}"),
                    None,
                )
            }),
            Err(error) => {
                tracing::info!(mcp_server = %self.server, %error, "sampling refused");
                Err(ErrorData::internal_error(error.to_string(), None))
            }
        }
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        // Progress of a call that has ended (or never asked for it) has nowhere to go.
        if let Some(route) = self.routes.route(&params.progress_token) {
            let _ = route.send(McpNotice::Progress {
                progress: params.progress,
                total: params.total,
                message: params.message,
            });
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(mcp_server = %self.server, "tools/list_changed");
        let _ = self.notices.send(McpNotice::ToolsChanged);
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        tracing::debug!(
            mcp_server = %self.server,
            level = ?params.level,
            logger = params.logger.as_deref().unwrap_or(""),
            data = %params.data,
            "server log message"
        );
    }

    fn get_info(&self) -> ClientInfo {
        client_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::NumberOrString;

    #[test]
    fn declares_roots_without_list_changed_form_elicitation_and_sampling() {
        let info = serde_json::to_value(client_info()).unwrap();
        let caps = &info["capabilities"];
        assert_eq!(caps["roots"], serde_json::json!({"listChanged": false}));
        assert_eq!(caps["sampling"], serde_json::json!({}));
        assert_eq!(caps["elicitation"], serde_json::json!({"form": {}}));
        assert_eq!(info["protocolVersion"], "2025-11-25");
        assert_eq!(info["clientInfo"]["name"], "troupe");
    }

    #[test]
    fn a_route_lives_as_long_as_its_guard() {
        let routes = ProgressRoutes::default();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let token = ProgressToken(NumberOrString::Number(7));
        let guard = routes.register(token.clone(), tx);
        assert!(routes.route(&token).is_some());
        drop(guard);
        assert!(routes.route(&token).is_none());
        assert_eq!(routes.len(), 0);
    }
}
