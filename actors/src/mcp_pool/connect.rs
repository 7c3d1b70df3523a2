//! One server's connection from the pool's side: the handshake and first listing within a
//! bound, its notices forwarded to the pool, and the client handler that answers the
//! server's own requests (roots, elicitation, sampling) on behalf of the task that made the
//! call.

use super::*;

/// Handshake then first listing, within `bound` in all; a connection whose listing fails is
/// closed here.
pub(super) async fn connect_and_list(
    connector: &dyn McpConnector,
    config: &McpServerConfig,
    handler: Arc<dyn McpClientHandler>,
    notices: mpsc::UnboundedSender<McpNotice>,
    bound: Duration,
) -> Result<(Arc<dyn McpConnection>, Vec<McpTool>), AgentError> {
    let deadline = Instant::now() + bound;
    let timed_out =
        || AgentError::timeout(format!("connecting to MCP server `{}`", config.name), bound);
    let conn = tokio::time::timeout_at(deadline, connector.connect(config, handler, notices))
        .await
        .map_err(|_| timed_out())??;
    match tokio::time::timeout_at(deadline, conn.list_tools()).await {
        Ok(Ok(tools)) => Ok((conn, tools)),
        Ok(Err(error)) => {
            conn.close().await;
            Err(error)
        }
        Err(_) => {
            conn.close().await;
            Err(timed_out())
        }
    }
}

/// Turns a connection's notices into messages until it closes.
pub(super) async fn forward_notices(
    mut rx: mpsc::UnboundedReceiver<McpNotice>,
    me: &ActorRef<McpPoolMsg>,
    server: &str,
    generation: u64,
) {
    loop {
        let msg = match rx.recv().await {
            Some(McpNotice::ToolsChanged) => McpPoolMsg::ToolsChanged {
                server: server.to_owned(),
                generation,
            },
            Some(McpNotice::Progress { progress, .. }) => {
                // Progress outside any call that asked for it: nothing to attach it to.
                tracing::debug!(server, progress, "MCP progress without a call");
                continue;
            }
            Some(McpNotice::Closed { reason }) => McpPoolMsg::ServerClosed {
                server: server.to_owned(),
                generation,
                reason,
            },
            None => McpPoolMsg::ServerClosed {
                server: server.to_owned(),
                generation,
                reason: "the connection went away".into(),
            },
        };
        let last = matches!(msg, McpPoolMsg::ServerClosed { .. });
        if me.cast(msg).is_err() || last {
            return;
        }
    }
}

/// Answers one server's requests to the client.
pub(super) struct PoolClient {
    pub(super) server: String,
    pub(super) roots: Arc<[String]>,
    /// Attributes elicitation and sampling requests to a task.
    pub(super) pool: ActorRef<McpPoolMsg>,
}

impl PoolClient {
    pub(super) async fn requester(&self, kind: RequestKind) -> Result<Requester, AgentError> {
        ractor::call!(self.pool, |reply| McpPoolMsg::Attribute {
            server: self.server.clone(),
            kind,
            reply,
        })
        .map_err(|e| AgentError::McpError {
            server: self.server.clone(),
            message: format!("the MCP pool is gone: {e}"),
        })?
    }
}

#[async_trait]
impl McpClientHandler for PoolClient {
    async fn list_roots(&self) -> Vec<String> {
        self.roots.to_vec()
    }

    async fn elicit(
        &self,
        message: String,
        schema: troupe_proto::Json,
    ) -> Result<troupe_proto::Json, AgentError> {
        match self.elicit_outcome(message, schema).await {
            ElicitOutcome::Accept(content) => Ok(content),
            ElicitOutcome::Decline => Err(AgentError::ApprovalDenied {
                command: requests::mcp_command(&self.server, RequestKind::Elicitation),
                reason: "the elicitation was declined".into(),
            }),
            ElicitOutcome::Cancel => Err(AgentError::cancelled("the elicitation was cancelled")),
        }
    }

    async fn elicit_outcome(&self, message: String, schema: troupe_proto::Json) -> ElicitOutcome {
        match self.requester(RequestKind::Elicitation).await {
            Ok(requester) => requests::elicit(&requester, message, schema).await,
            Err(_) => ElicitOutcome::Decline,
        }
    }

    async fn sample(&self, request: troupe_proto::Json) -> Result<troupe_proto::Json, AgentError> {
        let requester = self.requester(RequestKind::Sampling).await?;
        requests::sample(&requester, request).await
    }
}
