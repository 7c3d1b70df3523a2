//! What a view sees and where its calls go: its sorted, qualified tools (S8), the route of a
//! call or the failure that refuses it, and the route table views read without asking the
//! actor.

use super::*;

impl PoolCore {
    /// The tools a view sees, qualified and sorted by name (S8).
    pub fn list_tools(&self, id: ViewId) -> Result<Vec<ToolSpec>, AgentError> {
        let view = self.view(id)?;
        let mut tools: Vec<ToolSpec> = view
            .servers
            .iter()
            .filter_map(|name| match self.servers.get(name).map(|s| &s.phase) {
                Some(Phase::Ready(live)) => Some((name, live)),
                _ => None,
            })
            .flat_map(|(name, live)| {
                live.tools.values().map(move |tool| ToolSpec {
                    name: qualify(name, &tool.name),
                    description: tool.description.clone(),
                    parameters: tool.input_schema.clone(),
                })
            })
            .filter(|spec| visible(view.allowlist.as_ref(), &spec.name))
            .collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(tools)
    }

    /// Where a call of `name` goes, if the view may make it.
    pub fn resolve(&self, id: ViewId, name: &str) -> Result<Route, ToolFailure> {
        let view = self.view(id)?;
        let unknown = || ToolFailure::unknown_tool(name);
        let (server, tool) = split_qualified(name).ok_or_else(unknown)?;
        if !view.servers.contains(server) || !visible(view.allowlist.as_ref(), name) {
            return Err(unknown());
        }
        let slot = self.servers.get(server).ok_or_else(unknown)?;
        let live = match &slot.phase {
            Phase::Ready(live) => live,
            other => {
                return Err(AgentError::McpError {
                    server: server.to_owned(),
                    message: format!("the server is not connected ({})", other.name()),
                }
                .into());
            }
        };
        if !live.tools.contains_key(tool) {
            return Err(match live.left_out.get(tool) {
                Some(LeftOut::RequiresTask) => AgentError::ToolError {
                    name: name.to_owned(),
                    message: "the tool needs MCP task augmentation, which is not supported".into(),
                }
                .into(),
                _ => unknown(),
            });
        }
        Ok(Route {
            server: server.to_owned(),
            tool: tool.to_owned(),
            conn: live.conn.clone(),
            closed: live.closed.clone(),
            events: None,
        })
    }

    /// Every tool of every ready server, by qualified name, with its route: what views
    /// resolve calls against without asking the actor (visibility is checked by the view).
    pub fn route_table(&self) -> RouteTable {
        let mut routes = HashMap::new();
        for (server, slot) in &self.servers {
            if let Phase::Ready(live) = &slot.phase {
                for tool in live.tools.keys() {
                    routes.insert(
                        qualify(server, tool),
                        Route {
                            server: server.clone(),
                            tool: tool.clone(),
                            conn: live.conn.clone(),
                            closed: live.closed.clone(),
                            events: None,
                        },
                    );
                }
            }
        }
        RouteTable { routes }
    }

    /// What a view may see: its servers and its allowlist (fixed for its life).
    pub fn view_scope(&self, id: ViewId) -> Option<ViewScope> {
        self.views.get(&id).map(|v| ViewScope {
            servers: v.servers.clone(),
            allowlist: v.allowlist.clone(),
        })
    }

    pub(super) fn view(&self, id: ViewId) -> Result<&ViewRecord, AgentError> {
        self.views
            .get(&id)
            .ok_or_else(|| AgentError::not_found("MCP view (released)", id))
    }
}
