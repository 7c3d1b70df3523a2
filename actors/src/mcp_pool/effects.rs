//! Carrying out the pool core's effects: connects, closes, timers, published routes and the
//! warnings and events they bring; and the connect task of one server.

use super::*;

impl McpPoolState {
    /// Carries out the effects of a transition.
    pub(super) fn apply(&mut self, myself: &ActorRef<McpPoolMsg>, fx: Vec<Effect>) {
        for effect in fx {
            match effect {
                Effect::Connect {
                    server,
                    generation,
                    config,
                } => self.spawn_connect(myself, server, generation, config),
                Effect::ScheduleIdle { server, epoch } => {
                    let name = server.clone();
                    let timer = myself.send_after(self.limits.idle_timeout, move || {
                        McpPoolMsg::IdleTimeout {
                            server: name,
                            epoch,
                        }
                    });
                    self.arm(server, timer);
                }
                Effect::ScheduleRestart {
                    server,
                    generation,
                    delay,
                } => {
                    metrics::server_restart(&server);
                    let name = server.clone();
                    let timer = myself.send_after(delay, move || McpPoolMsg::RestartDue {
                        server: name,
                        generation,
                    });
                    self.arm(server, timer);
                }
                Effect::CancelTimer { server } => {
                    if let Some(timer) = self.timers.remove(&server) {
                        timer.abort();
                    }
                }
                Effect::Close {
                    server,
                    conn,
                    reason,
                } => {
                    tracing::info!(server, reason = reason.as_str(), "MCP connection closed");
                    metrics::closed(reason);
                    tokio::spawn(async move { conn.close().await });
                }
                Effect::Refresh {
                    server,
                    generation,
                    seq,
                    conn,
                } => {
                    let me = myself.clone();
                    let bound = self.limits.connect_timeout;
                    tokio::spawn(async move {
                        let result = match tokio::time::timeout(bound, conn.list_tools()).await {
                            Ok(result) => result,
                            Err(_) => Err(AgentError::timeout("listing MCP tools", bound)),
                        };
                        let _ = me.cast(McpPoolMsg::ToolsListed {
                            server,
                            generation,
                            seq,
                            result,
                        });
                    });
                }
                Effect::Ready { server, tools } => {
                    tracing::info!(
                        server,
                        tools,
                        at_ms = self.clock.now_ms(),
                        "MCP server ready"
                    );
                    if let Some(events) = &self.events {
                        events.emit(EventDraft::session(EventKind::McpServerReady {
                            server,
                            tools: u32::try_from(tools).unwrap_or(u32::MAX),
                        }));
                    }
                }
                Effect::AllowlistUnknown {
                    conversation_id,
                    server,
                    entries,
                } => {
                    let message = format!(
                        "MCP server `{server}` is ready but offers no {}: these allowlist entries match nothing",
                        entries.join(", ")
                    );
                    tracing::warn!(%conversation_id, server, ?entries, "allowlisted MCP tools not offered");
                    if let Some(events) = &self.events {
                        events.emit(EventDraft::conversation(
                            conversation_id,
                            EventKind::Warning {
                                code: WarningCode::McpAllowlistUnknownTool,
                                message,
                            },
                        ));
                    }
                }
                Effect::Failed {
                    server,
                    reason,
                    retry_in,
                } => {
                    let message = match retry_in {
                        Some(delay) => format!(
                            "MCP server `{server}` failed: {reason}; restarting in {delay:?}"
                        ),
                        None => format!(
                            "MCP server `{server}` failed: {reason}; no view uses it, not restarting"
                        ),
                    };
                    tracing::warn!(server, %reason, ?retry_in, "MCP server failed");
                    self.warn(WarningCode::McpServerFailed, message);
                }
            }
        }
        self.occupancy
            .publish(self.core.connected_servers(), self.core.views_len());
    }

    pub(super) fn arm(
        &mut self,
        server: String,
        timer: JoinHandle<Result<(), MessagingErr<McpPoolMsg>>>,
    ) {
        if let Some(old) = self.timers.insert(server, timer) {
            old.abort();
        }
    }

    pub(super) fn warn(&self, code: WarningCode, message: String) {
        if let Some(events) = &self.events {
            events.emit(EventDraft::session(EventKind::Warning { code, message }));
        }
    }

    /// Connects and lists in a task; then forwards the connection's notices as messages.
    pub(super) fn spawn_connect(
        &self,
        myself: &ActorRef<McpPoolMsg>,
        server: String,
        generation: u64,
        config: McpServerConfig,
    ) {
        let connector = self.connector.clone();
        let handler: Arc<dyn McpClientHandler> = Arc::new(PoolClient {
            server: server.clone(),
            roots: self.roots.clone(),
            pool: myself.clone(),
        });
        let bound = self.limits.connect_timeout;
        let me = myself.clone();
        // A trace of its own: the connection outlives whatever caused it to start.
        let span = tracing::info_span!(parent: None, "mcp_connect", server = %server, generation);
        tracing::info!(parent: &span, "MCP server connecting");
        tokio::spawn(
            async move {
                // Notices sent during the handshake wait in the channel until forwarded.
                let (tx, rx) = mpsc::unbounded_channel();
                match connect_and_list(connector.as_ref(), &config, handler, tx, bound).await {
                    Ok((conn, tools)) => {
                        metrics::connect(true);
                        let sent = me.cast(McpPoolMsg::ServerConnected {
                            server: server.clone(),
                            generation,
                            conn: conn.clone(),
                            tools,
                        });
                        if sent.is_err() {
                            conn.close().await; // the pool is gone
                            return;
                        }
                        drop(conn);
                        forward_notices(rx, &me, &server, generation).await;
                    }
                    Err(error) => {
                        metrics::connect(false);
                        let _ = me.cast(McpPoolMsg::ServerFailed {
                            server,
                            generation,
                            error,
                        });
                    }
                }
            }
            .instrument(span),
        );
    }
}
