//! Configuration of models and chats: a TOML file, environment variables and command-line
//! flags, in that order of increasing precedence.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Which wire protocol a model endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Provider {
    /// The built-in scripted model (no network).
    #[default]
    Scripted,
    /// OpenAI Responses API (`POST {base_url}/responses`, SSE).
    OpenaiResponses,
    /// OpenAI Chat Completions API (`POST {base_url}/chat/completions`, SSE), which most
    /// OpenAI-compatible servers (Ollama, vLLM, llama.cpp, LM Studio) speak.
    OpenaiChat,
}

/// How tools are offered to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ToolMode {
    /// The API's native tool calling.
    #[default]
    Native,
    /// The text dialect: `<action tool="NAME">JSON</action>` / `<final>…</final>`, for models
    /// without tool calling.
    Text,
}

/// A model endpoint.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    pub provider: Provider,
    /// e.g. `https://api.openai.com/v1`, `http://127.0.0.1:11434/v1` (Ollama).
    pub base_url: String,
    /// Name of the environment variable holding the API key (none: no Authorization header).
    pub api_key_env: Option<String>,
    /// The API key itself; takes precedence over `api_key_env`. Meant for tests and embedding
    /// (a config file should name an environment variable instead). Never printed by `Debug`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    pub model: String,
    pub tool_mode: ToolMode,
    /// Extra HTTP headers sent with every request.
    pub headers: BTreeMap<String, String>,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Whole-request bound (streaming included).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Longest silence allowed between two stream events.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Retries after the first attempt on 429, 5xx and transport errors.
    pub max_retries: u32,
    /// First backoff; doubled each retry (with jitter), capped at `retry_max`.
    #[serde(with = "humantime_serde")]
    pub retry_base: Duration,
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
}

// By hand so the key never reaches a log line.
impl std::fmt::Debug for ModelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelConfig")
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("api_key_env", &self.api_key_env)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("tool_mode", &self.tool_mode)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_retries", &self.max_retries)
            .field("retry_base", &self.retry_base)
            .field("retry_max", &self.retry_max)
            .finish()
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            provider: Provider::Scripted,
            base_url: "https://api.openai.com/v1".into(),
            api_key_env: Some("OPENAI_API_KEY".into()),
            api_key: None,
            model: "gpt-4o-mini".into(),
            tool_mode: ToolMode::Native,
            headers: BTreeMap::new(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(120),
            max_retries: 4,
            retry_base: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
        }
    }
}
