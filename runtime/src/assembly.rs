//! From a [`TroupeConfig`] to what a session is started with: its ports (model, tokenizer,
//! command runner, MCP connector, summarizer) and its [`SessionConfig`]. `troupe chat` and
//! `troupe serve` assemble sessions the same way through these functions.

use crate::config::{Provider, SummarizerKind, TroupeConfig};
use crate::{ProcessRunner, ScriptedModel};
use std::path::Path;
use std::sync::Arc;
use troupe_actors::history::{LocalSummarizer, SummaryMode};
use troupe_actors::ports::{ApproxTokens, McpConnector, ModelClient, TokenCounter};
use troupe_actors::{SessionConfig, SessionPorts};
use troupe_proto::{AgentError, OpenConversation, StoragePolicy};

/// The model client the configuration names; the scripted model follows `script` when given.
pub fn build_model(
    config: &TroupeConfig,
    script: Option<&Path>,
) -> Result<Arc<dyn ModelClient>, AgentError> {
    Ok(match config.model.provider {
        Provider::Scripted => Arc::new(match script {
            Some(path) => ScriptedModel::from_file(path)?,
            None => ScriptedModel::default(),
        }),
        Provider::OpenaiResponses | Provider::OpenaiChat => Arc::new(
            crate::OpenAiClient::new(config.model.clone())
                .map_err(|e| AgentError::invalid(format!("cannot set up the model client: {e}")))?,
        ),
    })
}

/// The prompt estimator: `chat.tokenizer_model` when set (an encoding such as `o200k_base`,
/// an OpenAI model name, or `approx` for four bytes a token; anything else is
/// `InvalidInput`), else the model's own tokenizer (`cl100k_base` approximates models that
/// are not OpenAI's), or four bytes a token for the scripted model.
pub fn try_build_tokens(config: &TroupeConfig) -> Result<Arc<dyn TokenCounter>, AgentError> {
    Ok(
        match (&config.chat.tokenizer_model, config.model.provider) {
            (Some(name), _) if name == "approx" => Arc::new(ApproxTokens),
            (Some(name), _) => Arc::new(crate::tokens::TiktokenCounter::named(name).map_err(
                |e| match e {
                    // Said with the setting it came from, in each of its spellings.
                    AgentError::InvalidInput { message } => AgentError::invalid(format!(
                        "chat.tokenizer_model (TROUPE_TOKENIZER_MODEL, --tokenizer-model): \
                         {message}"
                    )),
                    other => other,
                },
            )?),
            (None, Provider::Scripted) => Arc::new(ApproxTokens),
            (None, _) => Arc::new(crate::tokens::TiktokenCounter::for_model(
                &config.model.model,
            )),
        },
    )
}

/// [`try_build_tokens`] for a configuration already checked by it: an unknown tokenizer name
/// is logged and estimated as the model's own tokenizer would be.
pub fn build_tokens(config: &TroupeConfig) -> Arc<dyn TokenCounter> {
    try_build_tokens(config).unwrap_or_else(|error| {
        tracing::error!(%error, "bad tokenizer; using the model's own");
        Arc::new(crate::tokens::TiktokenCounter::for_model(
            &config.model.model,
        ))
    })
}

/// The ports of a session: `model` and `tokens` shared, a process runner for the shell tool,
/// an MCP connector when servers are configured (its OAuth logins under
/// `<data_dir>/mcp-auth`), the local summarizer.
pub fn session_ports(
    config: &TroupeConfig,
    model: Arc<dyn ModelClient>,
    tokens: Arc<dyn TokenCounter>,
) -> SessionPorts {
    SessionPorts {
        model,
        mcp: None,
        mcp_connector: (!config.mcp.servers.is_empty()).then(|| {
            Arc::new(
                crate::RmcpConnector::new()
                    .with_connect_timeout(config.mcp.limits.connect_timeout)
                    .with_token_dir(crate::mcp::oauth::token_dir(&config.data_dir)),
            ) as Arc<dyn McpConnector>
        }),
        exec: Some(Arc::new(ProcessRunner::new())),
        effects: troupe_actors::ports::Effects::Live,
        summarizer: Arc::new(LocalSummarizer::default()),
        tokens,
        rollout_storage: None,
        agents: None,
    }
}

/// The agents of a session (A1–A4) from the configuration, or `None` when no definition
/// loaded (the session then runs as without agents). `script`: a script drives the scripted
/// model, which then routes like any model. The supervisor routes with its model (`route`
/// tool calls) unless `[agents] router = "rules"`, or nothing names a model to route with.
/// In-process agents that name another endpoint than the session's (`base_url`, or another
/// `provider`) get a client of their own.
pub fn agent_ports(
    config: &TroupeConfig,
    catalog: troupe_proto::agent::AgentCatalog,
    script: bool,
    bindings: Arc<dyn troupe_actors::ports::BindingStore>,
) -> Result<Option<troupe_actors::agents::AgentPorts>, AgentError> {
    use troupe_actors::agents::AgentPorts;
    use troupe_proto::agent::ProviderSpec;
    if catalog.is_empty() {
        return Ok(None);
    }
    let session_provider = crate::config::provider_name(config.model.provider);
    let mut models = std::collections::BTreeMap::new();
    for def in catalog.agents.values() {
        let ProviderSpec::Model {
            model,
            provider,
            base_url,
            ..
        } = &def.provider
        else {
            continue;
        };
        let other_provider = provider.as_deref().filter(|p| *p != session_provider);
        if other_provider.is_none() && base_url.is_none() {
            continue;
        }
        let mut own = config.clone();
        if let Some(p) = other_provider {
            own.model.provider = crate::config::parse_enum(
                "provider.provider",
                p,
                "openai-responses, openai-chat or scripted",
            )
            .map_err(|e| AgentError::invalid(format!("agent `{}`: {e}", def.id)))?;
        }
        if let Some(url) = base_url {
            own.model.base_url.clone_from(url);
            if own.model.provider == Provider::Scripted {
                own.model.provider = Provider::OpenaiChat;
            }
        }
        if let Some(m) = model {
            own.model.model.clone_from(m);
        }
        let client = build_model(&own, None)
            .map_err(|e| AgentError::invalid(format!("agent `{}`: {e}", def.id)))?;
        models.insert(def.id.clone(), client);
    }
    Ok(Some(AgentPorts {
        catalog: Arc::new(catalog),
        settings: agent_settings(config, script),
        factories: crate::agents::factories(),
        models,
        bindings,
        live: None,
    }))
}

/// The agents' settings of a session (`[agents]`): the supervisor routes with its model
/// (`route` tool calls) unless `router = "rules"`, or nothing names a model to route with
/// (the scripted model without a script).
pub fn agent_settings(config: &TroupeConfig, script: bool) -> troupe_actors::agents::AgentSettings {
    use troupe_actors::agents::{AgentSettings, RouterMode};
    let router = match config.agents.router {
        Some(crate::config::RouterKind::Model) => RouterMode::Model,
        Some(crate::config::RouterKind::Rules) => RouterMode::Rules,
        None if config.model.provider != Provider::Scripted || script => RouterMode::Model,
        None => RouterMode::Rules,
    };
    AgentSettings {
        supervisor: config.agents.supervisor.clone(),
        router,
        max_depth: config.agents.max_depth,
        lease_ttl: config.agents.lease_ttl,
    }
}

/// The session configuration: data directory, MCP servers, the chat limits and policies, and
/// the server's scheduling limits.
pub fn session_config(config: &TroupeConfig) -> SessionConfig {
    let mut s = SessionConfig {
        data_dir: config.data_dir.clone(),
        ttl_sweep_interval: config.ttl_sweep_interval,
        ..SessionConfig::default()
    };
    let chat = &config.chat;
    s.root = chat_conversation(chat.storage_policy);
    s.mcp_servers = config.mcp.servers.clone();
    s.mcp_roots = config.mcp.roots.clone();
    s.mcp_limits = config.mcp.limits.limits();
    s.scheduler.limit = config.server.max_running_tasks.max(1);
    s.scheduler.queue_capacity = config.server.task_queue;
    let conv = &mut s.conversation;
    conv.shell_tool = true;
    // The workspace is the directory troupe was started in.
    conv.workspace_roots = std::env::current_dir().into_iter().collect();
    conv.max_queued_messages = config.server.conversation_queue;
    conv.approval_policy = chat.approval_policy;
    conv.sandbox_policy = chat.sandbox_policy;
    conv.task.max_steps = chat.max_steps;
    conv.task.exec_timeout = chat.command_timeout;
    conv.task.exec_timeout_max = chat.max_command_timeout;
    conv.task.max_prompt_tokens = chat.max_prompt_tokens;
    conv.task.warn_prompt_tokens = chat.warn_prompt_tokens;
    conv.task.over_budget = chat.over_budget;
    conv.task.tool_errors = chat.tool_errors;
    conv.record_content = config.telemetry.record_content;
    conv.tool_policy = std::sync::Arc::new(config.tools.clone());
    conv.capabilities = std::sync::Arc::new(crate::capabilities::catalog(config));
    conv.capability_budget = config.capabilities.budget();
    conv.history.max_items = config.history.max_items;
    conv.history.max_tokens = config.history.max_tokens;
    conv.summary = match config.history.summarizer {
        SummarizerKind::Local => SummaryMode::Local,
        SummarizerKind::Model => SummaryMode::Model {
            timeout: config.history.summary_timeout,
        },
    };
    conv.close_timeout = config.conversation.close_timeout;
    conv.passivate_after = config.sessions.passivation();
    s.approval_timeout = config.conversation.approval_timeout;
    s
}

/// A chat conversation: the shell and plan built-ins, the given storage policy.
pub fn chat_conversation(storage_policy: StoragePolicy) -> OpenConversation {
    OpenConversation {
        storage_policy,
        include_plan_tool: true,
        ..OpenConversation::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_limits_reach_the_session() {
        let mut c = TroupeConfig::default();
        c.server.max_running_tasks = 0;
        c.server.task_queue = 3;
        c.server.conversation_queue = 2;
        c.chat.max_steps = 9;
        c.chat.command_timeout = std::time::Duration::from_secs(5);
        c.chat.max_command_timeout = std::time::Duration::from_secs(50);
        c.ttl_sweep_interval = std::time::Duration::from_secs(7);
        let s = session_config(&c);
        assert_eq!(s.scheduler.limit, 1, "0 would never grant");
        assert_eq!(s.scheduler.queue_capacity, 3);
        assert_eq!(s.conversation.max_queued_messages, 2);
        assert_eq!(s.conversation.task.max_steps, 9);
        assert_eq!(
            s.conversation.task.exec_timeout,
            std::time::Duration::from_secs(5)
        );
        assert_eq!(
            s.conversation.task.exec_timeout_max,
            std::time::Duration::from_secs(50)
        );
        assert_eq!(s.ttl_sweep_interval, std::time::Duration::from_secs(7));
        assert!(s.root.include_plan_tool);
    }

    #[test]
    fn history_and_timeouts_reach_the_conversations() {
        let mut c = TroupeConfig::default();
        c.history.max_items = 40;
        c.history.max_tokens = 900;
        c.history.summarizer = SummarizerKind::Model;
        c.history.summary_timeout = std::time::Duration::from_secs(9);
        c.conversation.close_timeout = std::time::Duration::from_secs(2);
        c.conversation.approval_timeout = std::time::Duration::from_secs(30);
        c.sessions.passivate_after = std::time::Duration::from_secs(90);
        let s = session_config(&c);
        assert_eq!(
            s.conversation.passivate_after,
            Some(std::time::Duration::from_secs(90))
        );
        assert_eq!(
            (
                s.conversation.history.max_items,
                s.conversation.history.max_tokens
            ),
            (40, 900)
        );
        assert_eq!(
            s.conversation.summary,
            SummaryMode::Model {
                timeout: std::time::Duration::from_secs(9)
            }
        );
        assert_eq!(
            s.conversation.close_timeout,
            std::time::Duration::from_secs(2)
        );
        assert_eq!(s.approval_timeout, std::time::Duration::from_secs(30));
        let local = session_config(&TroupeConfig::default());
        assert_eq!(local.conversation.summary, SummaryMode::Local);
    }

    /// A store that keeps nothing: the assembly only hands it on.
    struct NoBindings;

    #[async_trait::async_trait]
    impl troupe_actors::ports::BindingStore for NoBindings {
        async fn put_binding(
            &self,
            _: troupe_proto::agent::AgentBinding,
        ) -> Result<(), AgentError> {
            Ok(())
        }
        async fn bindings(
            &self,
            _: Option<troupe_proto::SessionId>,
        ) -> Result<Vec<troupe_proto::agent::AgentBinding>, AgentError> {
            Ok(Vec::new())
        }
        async fn remove_binding(
            &self,
            _: troupe_proto::SessionId,
            _: &str,
        ) -> Result<(), AgentError> {
            Ok(())
        }
    }

    fn catalog() -> troupe_proto::agent::AgentCatalog {
        let def: troupe_proto::agent::AgentDefinition = serde_json::from_value(serde_json::json!({
            "id": "coder", "role": "executor", "provider": {"type": "model"}
        }))
        .unwrap();
        troupe_proto::agent::AgentCatalog {
            agents: [(def.id.clone(), def)].into_iter().collect(),
            ..Default::default()
        }
    }

    #[test]
    fn agents_route_with_a_model_when_one_is_named_else_by_rules() {
        use troupe_actors::agents::RouterMode;
        let router = |c: &TroupeConfig, script: bool| {
            agent_ports(c, catalog(), script, Arc::new(NoBindings))
                .unwrap()
                .unwrap()
                .settings
                .router
        };
        let scripted = TroupeConfig::default();
        assert_eq!(scripted.model.provider, Provider::Scripted);
        assert_eq!(router(&scripted, false), RouterMode::Rules);
        assert_eq!(
            router(&scripted, true),
            RouterMode::Model,
            "a script routes"
        );
        let mut endpoint = TroupeConfig::default();
        endpoint.model.provider = Provider::OpenaiChat;
        assert_eq!(router(&endpoint, false), RouterMode::Model);
        endpoint.agents.router = Some(crate::config::RouterKind::Rules);
        assert_eq!(router(&endpoint, false), RouterMode::Rules, "the key wins");
        let mut limits = TroupeConfig::default();
        limits.agents.max_depth = 2;
        limits.agents.lease_ttl = std::time::Duration::from_secs(5);
        let ports = agent_ports(&limits, catalog(), false, Arc::new(NoBindings))
            .unwrap()
            .unwrap();
        assert_eq!(ports.settings.max_depth, 2);
        assert_eq!(ports.settings.lease_ttl, std::time::Duration::from_secs(5));
        assert_eq!(
            ports.factories.iter().map(|f| f.kind()).collect::<Vec<_>>(),
            [
                troupe_proto::agent::ProviderKind::Acp,
                troupe_proto::agent::ProviderKind::A2a
            ]
        );
        let none = agent_ports(
            &limits,
            troupe_proto::agent::AgentCatalog::default(),
            false,
            Arc::new(NoBindings),
        )
        .unwrap();
        assert!(none.is_none(), "no agents, no hub");
    }
}
