//! The `a2a` agent provider: an agent definition whose provider is
//! `{"type": "a2a", "url": "...", "token_env": "..."}` is a remote agent spoken to over A2A
//! by [`A2aClient`].
//!
//! - `initialize` reads the agent's card (from `url`, see [`crate::client::card`]) and keeps
//!   the client of the JSON-RPC interface it names (1.0 first, else 0.3); the bearer token is
//!   read from the environment variable `token_env` names.
//! - The provider session is an A2A `contextId`: `open_session` names a new one (a UUID; the
//!   agent creates the context at its first message), `resume_session` takes a bound one up
//!   again as it is (A2A has no call to look a context up: the agent keeps it, or starts it
//!   anew at the next message).
//! - `handle` sends the dispatch's text as a message in that context and follows its task
//!   ([`run`]): streamed when the card says the agent streams (a broken stream is
//!   resubscribed, then polled), else sent and polled. What the agent says along the way
//!   becomes `agent_update` events; a task waiting for input is asked of a human through the
//!   session's approvals ([`input`]) and the answer sent back in the task; a dispatch
//!   cancelled (or whose lease expired) cancels the remote task.
//! - `health`: ready once the card was read; unavailable, saying why, when it could not be,
//!   or when the last call could not reach the agent (or its HTTP server refused it) — until
//!   a later call gets an answer. Nothing is called to tell it.
//! - `shutdown` cancels the remote tasks of dispatches still running; nothing else lives.

pub mod input;
pub mod reply;
mod run;

use crate::client::{A2aClient, ClientOptions, card};
use async_trait::async_trait;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use troupe_actors::agents::{
    AgentInput, AgentOutput, AgentProvider, AgentProviderFactory, AgentRunContext, ProviderEnv,
    ResumeError, SessionContext,
};
use troupe_proto::AgentError;
use troupe_proto::agent::{AgentDefinition, AgentHealth, ProviderKind, ProviderSpec};

/// How the provider follows remote tasks.
#[derive(Debug, Clone)]
pub struct A2aSettings {
    pub client: ClientOptions,
    /// First and longest pause between two `GetTask` polls of a task not streamed.
    pub poll_min: Duration,
    pub poll_max: Duration,
    /// How many times a broken stream is resubscribed before the task is polled.
    pub resubscribe_attempts: u32,
    /// How many times one dispatch may answer the agent's requests for input.
    pub max_input_rounds: u32,
    /// Longest wait for the agent to accept a cancel.
    pub cancel_timeout: Duration,
}

impl Default for A2aSettings {
    fn default() -> Self {
        Self {
            client: ClientOptions::default(),
            poll_min: Duration::from_millis(100),
            poll_max: Duration::from_secs(2),
            resubscribe_attempts: 3,
            max_input_rounds: 16,
            cancel_timeout: Duration::from_secs(5),
        }
    }
}

/// Builds the providers of `a2a` agents.
#[derive(Debug, Clone, Default)]
pub struct A2aProviderFactory {
    pub settings: A2aSettings,
}

impl AgentProviderFactory for A2aProviderFactory {
    fn kind(&self) -> ProviderKind {
        ProviderKind::A2a
    }

    fn probe(&self, definition: &AgentDefinition) -> AgentHealth {
        match Target::of(definition) {
            Ok(target) => match target.token() {
                Ok(_) => AgentHealth::ok(),
                Err(e) => AgentHealth::unavailable(e.to_string()),
            },
            Err(e) => AgentHealth::unavailable(e.to_string()),
        }
    }

    fn build(
        &self,
        definition: &AgentDefinition,
        _env: &ProviderEnv,
    ) -> Result<Arc<dyn AgentProvider>, AgentError> {
        Ok(Arc::new(A2aAgent {
            target: Target::of(definition)?,
            settings: self.settings.clone(),
            client: OnceLock::new(),
            last_error: Mutex::new(None),
            stopped: CancellationToken::new(),
        }))
    }
}

/// Which remote agent, and how to authenticate to it.
#[derive(Debug, Clone)]
struct Target {
    agent_id: String,
    url: String,
    token_env: Option<String>,
}

impl Target {
    fn of(definition: &AgentDefinition) -> Result<Self, AgentError> {
        let ProviderSpec::A2a { url, token_env } = &definition.provider else {
            return Err(AgentError::invalid(format!(
                "agent `{}` is not an a2a agent",
                definition.id
            )));
        };
        card::card_urls(url).map_err(|e| {
            AgentError::invalid(format!("agent `{}`: provider.url: {e}", definition.id))
        })?;
        Ok(Self {
            agent_id: definition.id.clone(),
            url: url.clone(),
            token_env: token_env.clone(),
        })
    }

    /// The bearer token, read now from the variable `token_env` names.
    fn token(&self) -> Result<Option<String>, AgentError> {
        let Some(var) = &self.token_env else {
            return Ok(None);
        };
        match std::env::var(var) {
            Ok(t) if !t.is_empty() => Ok(Some(t)),
            _ => Err(AgentError::invalid(format!(
                "the environment variable {var} (provider.token_env of agent `{}`) is not set",
                self.agent_id
            ))),
        }
    }
}

/// One remote agent, in one session.
pub struct A2aAgent {
    target: Target,
    settings: A2aSettings,
    /// Set by the first `initialize` that reads the card.
    client: OnceLock<Arc<A2aClient>>,
    /// Why the last `initialize` failed, for `health`.
    last_error: Mutex<Option<String>>,
    /// Fires at `shutdown`: running dispatches cancel their remote tasks and end.
    stopped: CancellationToken,
}

impl A2aAgent {
    fn client(&self) -> Result<Arc<A2aClient>, AgentError> {
        self.client.get().cloned().ok_or_else(|| {
            AgentError::internal(format!(
                "agent `{}` was not initialized",
                self.target.agent_id
            ))
        })
    }

    fn set_error(&self, error: Option<String>) {
        if let Ok(mut last) = self.last_error.lock() {
            *last = error;
        }
    }
}

#[async_trait]
impl AgentProvider for A2aAgent {
    async fn initialize(&self) -> Result<(), AgentError> {
        if self.stopped.is_cancelled() {
            return Err(AgentError::cancelled("the agent was shut down"));
        }
        if self.client.get().is_some() {
            return Ok(());
        }
        let token = self.target.token()?;
        match A2aClient::discover(&self.target.url, token, self.settings.client.clone()).await {
            Ok(client) => {
                tracing::info!(agent_id = %self.target.agent_id, endpoint = %client.endpoint().url,
                    version = client.version().as_str(), "a2a agent ready");
                let _ = self.client.set(Arc::new(client));
                self.set_error(None);
                Ok(())
            }
            Err(e) => {
                self.set_error(Some(e.to_string()));
                Err(e.into())
            }
        }
    }

    async fn open_session(&self, _ctx: &SessionContext<'_>) -> Result<String, AgentError> {
        self.client()?;
        Ok(uuid::Uuid::new_v4().to_string())
    }

    async fn resume_session(
        &self,
        provider_session_id: &str,
        _ctx: &SessionContext<'_>,
    ) -> Result<(), ResumeError> {
        self.client().map_err(ResumeError::Failed)?;
        if provider_session_id.trim().is_empty() {
            return Err(ResumeError::NotResumable(
                "an empty A2A contextId".to_owned(),
            ));
        }
        Ok(())
    }

    async fn handle(
        &self,
        input: AgentInput,
        ctx: &AgentRunContext<'_>,
    ) -> Result<AgentOutput, AgentError> {
        let client = self.client()?;
        let run = run::Run {
            client: &client,
            settings: &self.settings,
            agent_id: &self.target.agent_id,
            ctx,
            stopped: &self.stopped,
        };
        run.go(input.text).await
    }

    async fn health(&self) -> AgentHealth {
        if self.stopped.is_cancelled() {
            return AgentHealth::unavailable("shut down");
        }
        if let Err(e) = self.target.token() {
            return AgentHealth::unavailable(e.to_string());
        }
        let last = self.last_error.lock().ok().and_then(|l| l.clone());
        match (self.client.get(), last) {
            (Some(client), _) => match client.last_failure() {
                Some(e) => AgentHealth::unavailable(e.to_string()),
                None => AgentHealth::ok(),
            },
            (None, Some(e)) => AgentHealth::unavailable(e),
            (None, None) => AgentHealth::ok(),
        }
    }

    async fn shutdown(&self) {
        self.stopped.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::agent::HealthStatus;

    fn def(url: &str, token_env: Option<&str>) -> AgentDefinition {
        serde_json::from_value(serde_json::json!({
            "id": "remote",
            "provider": {"type": "a2a", "url": url, "token_env": token_env},
        }))
        .unwrap()
    }

    #[test]
    fn probe_checks_the_url_and_the_token_variable_without_calling() {
        let f = A2aProviderFactory::default();
        assert_eq!(f.kind(), ProviderKind::A2a);
        assert_eq!(
            f.probe(&def("http://127.0.0.1:1/a2a", None)).status,
            HealthStatus::Ok
        );
        let missing = f.probe(&def(
            "http://127.0.0.1:1/a2a",
            Some("TROUPE_TEST_A2A_TOKEN_THAT_IS_NOT_SET"),
        ));
        assert_eq!(missing.status, HealthStatus::Unavailable);
        assert!(
            missing
                .detail
                .unwrap()
                .contains("TROUPE_TEST_A2A_TOKEN_THAT_IS_NOT_SET"),
        );
        // PATH is set everywhere.
        assert_eq!(
            f.probe(&def("http://127.0.0.1:1/a2a", Some("PATH"))).status,
            HealthStatus::Ok
        );
    }
}
