//! When a service actor of the session stops: which service it was, and its replacement
//! (the storage policies a new Rollout needs, a new McpPool for the open conversations),
//! published in the session's directory.

use super::*;

impl SessionState {
    pub(super) fn service_of(&self, cell: &ActorCell) -> Option<Service> {
        let id = cell.get_id();
        let services = self.directory.snapshot();
        if id == services.rollout.get_id() {
            Some(Service::Rollout)
        } else if id == services.scheduler.get_id() {
            Some(Service::Scheduler)
        } else if id == services.registry.get_id() {
            Some(Service::Registry)
        } else if id == services.approvals.get_id() {
            Some(Service::Approvals)
        } else if self
            .mcp_pool
            .as_ref()
            .is_some_and(|pool| pool.actor().get_id() == id)
        {
            Some(Service::McpPool)
        } else if self
            .agent_hub
            .as_ref()
            .is_some_and(|hub| hub.get_id() == id)
        {
            Some(Service::AgentHub)
        } else {
            None
        }
    }

    /// A child stopped (`failed`: it panicked or returned an error).
    pub(super) async fn child_down(
        &mut self,
        myself: &ActorCell,
        cell: &ActorCell,
        failed: bool,
    ) -> Result<(), ActorProcessingErr> {
        if self.shutting_down {
            return Ok(());
        }
        if let Some(conversation_id) = self.by_actor.remove(&cell.get_id()) {
            let Some(entry) = self.conversations.remove(&conversation_id) else {
                return Ok(());
            };
            let live = match entry {
                ConversationEntry::Live(live) => *live,
                passivated @ ConversationEntry::Passivated(_) => {
                    self.conversations.insert(conversation_id, passivated);
                    return Ok(());
                }
            };
            let me: ActorRef<SessionMsg> = myself.clone().into();
            if !failed && live.held.is_some() {
                // It stopped because it was asked to passivate (its answer may come later).
                self.passivated(&me, conversation_id, live, None).await;
            } else if failed {
                // What its aborted task asked a human is withdrawn: nobody will act on it.
                let _ = self.directory.directory().approvals().get().cast(
                    crate::approval_store::ApprovalMsg::ConversationFailed { conversation_id },
                );
                // Restart from the rollout under the same id; siblings are untouched.
                metrics::restarted(metrics::Restarted::Conversation);
                match self
                    .spawn_conversation(
                        myself,
                        Some(conversation_id),
                        live.params,
                        live.model,
                        Some(RestoreCause::Failure),
                    )
                    .await
                {
                    Ok(_) => self.release_held(&me, conversation_id, live.held).await,
                    Err(e) => {
                        tracing::error!(%conversation_id, error = %e, "conversation restart failed");
                        for request in live.held.into_iter().flatten() {
                            request.refuse(
                                conversation_id,
                                AgentError::not_found("conversation", conversation_id),
                            );
                        }
                    }
                }
            }
            return Ok(());
        }
        if let Some(service) = self.service_of(cell) {
            tracing::warn!(session_id = %self.id, ?service, "restarting service actor");
            self.restart_service(myself, service).await?;
        }
        Ok(())
    }

    /// Replaces a service actor that stopped and publishes the new one in the directory.
    pub(super) async fn restart_service(
        &mut self,
        myself: &ActorCell,
        service: Service,
    ) -> Result<(), ActorProcessingErr> {
        match service {
            Service::Rollout => {
                metrics::restarted(metrics::Restarted::Rollout);
                let rollout = spawn_rollout(
                    self.id,
                    &self.config,
                    self.rollout_storage.clone(),
                    self.clock,
                    self.storage_policies(),
                    myself,
                )
                .await?;
                let parked = self.directory.replace_rollout(rollout);
                tracing::info!(session_id = %self.id, parked, "rollout replaced");
            }
            Service::Scheduler => {
                metrics::restarted(metrics::Restarted::Scheduler);
                let holders = self
                    .conversations
                    .values()
                    .filter_map(|e| Some(e.live()?.actor.get_cell()))
                    .collect();
                let scheduler = spawn_scheduler(&self.config, holders, myself).await?;
                self.directory.replace_scheduler(scheduler);
            }
            Service::Registry => {
                metrics::restarted(metrics::Restarted::TaskRegistry);
                self.directory
                    .replace_registry(spawn_registry(myself).await?);
            }
            Service::Approvals => {
                metrics::restarted(metrics::Restarted::ApprovalStore);
                let events = self.directory.events();
                let approvals = spawn_approvals(&self.config, self.clock, events, myself).await?;
                self.directory.replace_approvals(approvals);
            }
            Service::McpPool => self.restart_mcp_pool(myself).await,
            Service::AgentHub => {
                metrics::restarted(metrics::Restarted::AgentHub);
                let me: ActorRef<SessionMsg> = myself.clone().into();
                let hub = spawn_agent_hub(&me, self).await?;
                self.agent_hub = hub.as_ref().map(|h| h.actor.clone());
                self.directory.replace_agents(hub);
            }
        }
        // Conversations opened from now on read the new actor at their start; those open now
        // re-declare what it must know (their running task's slot, registration, MCP view).
        for live in self
            .conversations
            .values()
            .filter_map(ConversationEntry::live)
        {
            let _ = live.actor.cast(ConversationMsg::ServicesChanged);
        }
        Ok(())
    }

    /// The storage policy of every open conversation, for a new Rollout.
    pub(super) fn storage_policies(&self) -> Vec<(ConversationId, StoragePolicy)> {
        self.conversations
            .iter()
            .map(|(id, e)| (*id, e.params().storage_policy))
            .collect()
    }

    /// Starts a new McpPool in place of one that stopped. A pool that cannot start again
    /// costs the session its MCP tools, not its life: `None` is published, so that tasks
    /// waiting for a new pool stop waiting.
    pub(super) async fn restart_mcp_pool(&mut self, myself: &ActorCell) {
        let Some(connector) = self.ports.mcp_connector.clone() else {
            return;
        };
        metrics::restarted(metrics::Restarted::McpPool);
        match spawn_mcp_pool(
            &self.config,
            connector,
            self.ports.model.clone(),
            self.clock,
            &self.directory,
            myself,
        )
        .await
        {
            Ok(pool) => {
                tracing::warn!(session_id = %self.id, "MCP pool restarted");
                self.directory.replace_mcp(Some(Arc::new(pool.clone())));
                self.mcp_pool = Some(pool);
            }
            Err(error) => {
                tracing::error!(session_id = %self.id, %error, "MCP pool restart failed");
                self.mcp_pool = None;
                self.directory.replace_mcp(None);
            }
        }
    }
}
