//! OpenAI-compatible model providers: the Responses API (`POST {base_url}/responses`) and
//! Chat Completions (`POST {base_url}/chat/completions`), both streamed over SSE.
//!
//! One step is one model call:
//! 1. the body is built from the prompt (`request.rs`; in the text tool dialect, `dialect.rs`
//!    describes the tools in the instructions instead);
//! 2. it is POSTed; 429, 5xx and transport failures before the first stream event are retried
//!    with capped exponential backoff and jitter, honouring `Retry-After` (`retry.rs`); other
//!    statuses fail at once;
//! 3. the SSE body is parsed event by event (`chat.rs`, `responses.rs` over `stream.rs` and
//!    `sse.rs`), text deltas are forwarded as they come, tool calls are assembled from their
//!    fragments, and a silence longer than `idle_timeout` ends the step, as does a response
//!    holding more than `max_response_bytes` or one event larger than that and 4 MiB (the
//!    body of an error status is read up to [`ERROR_BODY_MAX`] only);
//! 4. the whole call is bounded by `request_timeout`, and cancellation drops the response at
//!    once, which closes the connection.
//!
//! A step runs inside the task's `chat {model}` span, which the task records the response's
//! model, id and usage on (returned in [`ModelResponse`]); each HTTP attempt is a `POST`
//! child span (method, URL without query, status, attempt). Metrics are in `metrics.rs`.

mod chat;
pub mod dialect;
pub mod metrics;
mod request;
mod responses;
pub mod retry;
mod stream;
mod transport;

use self::metrics::Outcome;
use crate::config::{ModelConfig, Provider, ToolMode};
use async_trait::async_trait;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use retry::RetryReason;
use std::time::{Duration, Instant, SystemTime};
use stream::{Collected, ReadError, StreamLimits, StreamParser, error_message, read_events};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing::field::Empty;
use troupe_actors::ports::{DeltaSink, ModelClient, ModelInfo, ModelRequest, ModelResponse};
use troupe_proto::{AgentError, ConversationId, HistoryItem, Json, TaskId, ToolCall};

/// A client of one OpenAI-compatible endpoint. Cheap to share: one connection pool serves
/// every conversation of a session (a clone shares it).
#[derive(Clone)]
pub struct OpenAiClient {
    config: ModelConfig,
    /// Every endpoint but plain HTTP to a loopback address: reqwest (TLS, proxies). Not built
    /// for a local endpoint, so that one pays for no TLS set-up (root certificates, crypto
    /// provider).
    http: Option<reqwest::Client>,
    /// Plain HTTP to a loopback address: the client of `transport.rs` (one write per request,
    /// immediate ACKs), with the headers `http` would add by default.
    local: Option<(transport::LocalClient, HeaderMap)>,
    /// The endpoint, e.g. `https://api.openai.com/v1/responses`.
    url: String,
    /// The endpoint without query or credentials, for errors, logs and spans.
    shown_url: String,
    /// `openai-responses` / `openai-chat`: the provider name and a bounded metric label.
    provider: &'static str,
    family: String,
}

impl std::fmt::Debug for OpenAiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiClient")
            .field("provider", &self.provider)
            .field("url", &self.shown_url)
            .field("model", &self.config.model)
            .finish_non_exhaustive()
    }
}

/// Most bytes of an error status's body read for its message; the rest is never read.
pub const ERROR_BODY_MAX: usize = 64 * 1024;

/// A failed call, with the outcome label it counts under.
struct Failed {
    outcome: Outcome,
    error: AgentError,
}

impl Failed {
    fn new(outcome: Outcome, error: AgentError) -> Self {
        Self { outcome, error }
    }
}

/// How one HTTP attempt failed.
enum AttemptError {
    /// Worth another attempt (nothing was consumed from a stream yet).
    Retryable {
        reason: RetryReason,
        retry_after: Option<Duration>,
        /// The last status, if the server answered at all.
        status: Option<u16>,
        message: String,
    },
    Fatal(Failed),
}

/// Why a request could not be sent.
enum SendError {
    /// The request itself is wrong (not worth another attempt).
    Invalid(String),
    /// The transport failed before a response head arrived.
    Transport(String),
}

/// Swallows deltas: the text dialect's raw reply holds tags the user should not see.
struct NoDeltas;

impl DeltaSink for NoDeltas {
    fn text_delta(&mut self, _delta: &str) {}
}

/// `path` under `base_url`'s path, its query kept (`…/v1?api-version=X` posts to
/// `…/v1/chat/completions?api-version=X`), its fragment dropped.
fn endpoint_url(base_url: &str, path: &str) -> Result<reqwest::Url, AgentError> {
    let bad = |e: &dyn std::fmt::Display| {
        // Not the URL itself: its query or credentials may hold a key.
        AgentError::invalid(format!("bad model base_url: {e}"))
    };
    let mut url = reqwest::Url::parse(base_url.trim()).map_err(|e| bad(&e))?;
    if url.cannot_be_a_base() || !matches!(url.scheme(), "http" | "https") {
        return Err(bad(&"it must be an http:// or https:// URL"));
    }
    let joined = format!("{}/{path}", url.path().trim_end_matches('/'));
    url.set_path(&joined);
    url.set_fragment(None);
    Ok(url)
}

impl OpenAiClient {
    /// Builds the client: one connection pool with the connect timeout, the extra headers
    /// and the `Authorization: Bearer` header (from `api_key`, else from the environment
    /// variable named by `api_key_env` when it is set and not empty).
    pub fn new(config: ModelConfig) -> Result<Self, AgentError> {
        let (provider, path) = match config.provider {
            Provider::OpenaiResponses => ("openai-responses", "responses"),
            Provider::OpenaiChat => ("openai-chat", "chat/completions"),
            Provider::Scripted => {
                return Err(AgentError::invalid(
                    "the OpenAI client does not serve the scripted provider",
                ));
            }
        };
        let parsed = endpoint_url(&config.base_url, path)?;
        let url = parsed.to_string();
        let shown_url = shown_url(&parsed);
        let loopback = parsed.host_str().is_some_and(is_loopback);

        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| AgentError::invalid(format!("bad model header name `{name}`: {e}")))?;
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| AgentError::invalid(format!("bad value for model header `{name}`")))?;
            // Extra headers often carry keys (`api-key`, ...).
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        if let Some(key) = api_key(&config) {
            let mut value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                AgentError::invalid("the model API key is not a valid header value")
            })?;
            value.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, value);
        }
        const USER_AGENT: &str = concat!("troupe/", env!("CARGO_PKG_VERSION"));
        let local = (loopback && parsed.scheme() == "http").then(|| {
            let mut headers = headers.clone();
            headers.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
            (transport::local_client(config.connect_timeout), headers)
        });
        let http = match local {
            Some(_) => None,
            None => {
                let mut builder = reqwest::Client::builder()
                    .connect_timeout(config.connect_timeout)
                    .default_headers(headers)
                    .user_agent(USER_AGENT)
                    // A model API answers its POST itself: a redirect is not followed (it
                    // would carry the extra headers, which often hold keys, to another host).
                    .redirect(reqwest::redirect::Policy::none());
                if loopback {
                    // A local model server is never behind the machine's proxy.
                    builder = builder.no_proxy();
                }
                Some(builder.build().map_err(|e| {
                    AgentError::internal(format!("cannot build the HTTP client: {e}"))
                })?)
            }
        };
        metrics::describe();
        Ok(Self {
            family: family(&config.model),
            config,
            http,
            local,
            url,
            shown_url,
            provider,
        })
    }

    /// The endpoint this client posts to, as shown in errors (without query or credentials).
    pub fn shown_url(&self) -> &str {
        &self.shown_url
    }

    /// One model call; the response and the model the server says answered.
    async fn call(
        &self,
        request: ModelRequest<'_>,
        deltas: &mut dyn DeltaSink,
    ) -> Result<(ModelResponse, Option<String>), Failed> {
        let mode = self.config.tool_mode;
        let body = match self.config.provider {
            Provider::OpenaiChat => {
                serde_json::to_vec(&request::chat_body(&request, &self.config.model, mode))
            }
            _ => serde_json::to_vec(&request::responses_body(&request, &self.config.model, mode)),
        };
        let body = body.map_err(|e| {
            Failed::new(
                Outcome::BadReply,
                AgentError::internal(format!("cannot encode the model request: {e}")),
            )
        })?;
        let mut quiet = NoDeltas;
        let sink: &mut dyn DeltaSink = match mode {
            ToolMode::Native => &mut *deltas,
            ToolMode::Text => &mut quiet,
        };
        let ids = (request.conversation_id, request.task_id);
        let collected = match self.config.provider {
            Provider::OpenaiChat => {
                self.with_retries::<chat::ChatStream>(&body, sink, ids)
                    .await?
            }
            _ => {
                self.with_retries::<responses::ResponsesStream>(&body, sink, ids)
                    .await?
            }
        };
        let response_model = collected.model.clone();
        if let Some(usage) = &collected.usage {
            metrics::tokens(self.provider, usage);
            metrics::gen_ai_tokens(self.gen_ai(response_model.as_deref()), usage);
        }
        let response = match mode {
            ToolMode::Native => native_response(collected),
            ToolMode::Text => text_response(collected, next_call_number(request.prompt.iter())),
        }
        .map_err(|e| Failed::new(Outcome::BadReply, e))?;
        if mode == ToolMode::Text && !response.text.is_empty() {
            deltas.text_delta(&response.text);
        }
        Ok((response, response_model))
    }

    /// The GenAI attributes of a call to this client's endpoint.
    fn gen_ai<'a>(&'a self, response_model: Option<&'a str>) -> metrics::GenAiCall<'a> {
        metrics::GenAiCall {
            provider: "openai",
            request_model: &self.config.model,
            response_model,
        }
    }

    async fn with_retries<P: StreamParser + Default>(
        &self,
        body: &[u8],
        deltas: &mut dyn DeltaSink,
        (conversation_id, task_id): (ConversationId, TaskId),
    ) -> Result<Collected, Failed> {
        let mut retry: u32 = 0;
        loop {
            let attempt = retry + 1;
            let span = tracing::info_span!(
                "http.request",
                otel.name = "POST",
                otel.kind = "client",
                "http.request.method" = "POST",
                "url.full" = %self.shown_url,
                "http.response.status_code" = Empty,
                "http.request.resend_count" = retry,
                attempt,
                "troupe.provider" = self.provider,
                conversation_id = %conversation_id,
                task_id = %task_id,
            );
            let (reason, retry_after, status, message) =
                match self.attempt::<P>(body, deltas).instrument(span).await {
                    Ok(collected) => return Ok(collected),
                    Err(AttemptError::Fatal(failed)) => return Err(failed),
                    Err(AttemptError::Retryable {
                        reason,
                        retry_after,
                        status,
                        message,
                    }) => (reason, retry_after, status, message),
                };
            if retry >= self.config.max_retries {
                let outcome = if status.is_some() {
                    Outcome::HttpError
                } else {
                    Outcome::Transport
                };
                return Err(Failed::new(
                    outcome,
                    AgentError::ModelError {
                        message: format!("{message} (gave up after {attempt} attempts)"),
                        retryable: true,
                    },
                ));
            }
            let wait = retry::delay(
                retry,
                retry_after,
                self.config.retry_base,
                self.config.retry_max,
                retry::jitter(),
            );
            metrics::retry(self.provider, reason);
            tracing::info!(
                attempt,
                reason = reason.as_str(),
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                %message,
                "retrying the model request"
            );
            // Cancellation and the overall timeout interrupt this wait from outside.
            tokio::time::sleep(wait).await;
            retry += 1;
        }
    }

    /// One HTTP attempt: send, check the status, read the stream.
    async fn attempt<P: StreamParser + Default>(
        &self,
        body: &[u8],
        deltas: &mut dyn DeltaSink,
    ) -> Result<Collected, AttemptError> {
        let idle = self.config.idle_timeout;
        let sent = Instant::now();
        // A server that accepts the connection but never answers is as idle as a silent
        // stream, and nothing has been consumed yet: worth a retry.
        let response = match tokio::time::timeout(idle, self.send(body)).await {
            Err(_) => {
                return Err(AttemptError::Retryable {
                    reason: RetryReason::Transport,
                    retry_after: None,
                    status: None,
                    message: format!(
                        "no response from {} within {}s",
                        self.shown_url,
                        idle.as_secs_f64()
                    ),
                });
            }
            Ok(Err(SendError::Invalid(e))) => {
                return Err(AttemptError::Fatal(Failed::new(
                    Outcome::Transport,
                    AgentError::invalid(format!("cannot send to {}: {e}", self.shown_url)),
                )));
            }
            Ok(Err(SendError::Transport(e))) => {
                return Err(AttemptError::Retryable {
                    reason: RetryReason::Transport,
                    retry_after: None,
                    status: None,
                    message: format!("request to {} failed: {e}", self.shown_url),
                });
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status().as_u16();
        tracing::Span::current().record("http.response.status_code", status);
        if !response.status().is_success() {
            return Err(self.status_error(response, status).await);
        }
        if let Some(kind) = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.starts_with("application/json"))
        {
            return Err(AttemptError::Fatal(Failed::new(
                Outcome::StreamError,
                AgentError::ModelError {
                    message: format!(
                        "{} answered {kind} instead of an event stream",
                        self.shown_url
                    ),
                    retryable: false,
                },
            )));
        }
        let provider = self.provider;
        let mut parser = P::default();
        let read = read_events(
            // Its errors without the URL (a base_url's query may hold a key).
            Box::pin(futures::StreamExt::map(response.bytes_stream(), |r| {
                r.map_err(reqwest::Error::without_url)
            })),
            &mut parser,
            deltas,
            StreamLimits {
                idle,
                response_bytes: self.config.max_response_bytes,
            },
            || metrics::time_to_first_byte(provider, sent.elapsed()),
        )
        .await;
        match read {
            Ok(()) => Ok(parser.finish()),
            Err(ReadError::BeforeFirstEvent(e)) => Err(AttemptError::Retryable {
                reason: RetryReason::Transport,
                retry_after: None,
                status: None,
                message: format!(
                    "stream from {} broke before its first event: {e}",
                    self.shown_url
                ),
            }),
            Err(ReadError::Failed(error)) => {
                tracing::warn!(%error, "model stream failed");
                Err(AttemptError::Fatal(Failed::new(
                    Outcome::StreamError,
                    error,
                )))
            }
        }
    }

    /// Sends `body` as this client sends a model request (the same connection pool and
    /// transport, the same headers) and reads the response body to its end without parsing
    /// it; the bytes read. The baseline of `cargo bench --bench model_http`: the bare request
    /// troupe's turn makes.
    #[doc(hidden)]
    pub async fn raw_request(&self, body: &[u8]) -> Result<usize, AgentError> {
        let mut response = self.send(body).await.map_err(|e| match e {
            SendError::Invalid(message) => AgentError::invalid(message),
            SendError::Transport(message) => AgentError::internal(message),
        })?;
        let status = response.status();
        if !status.is_success() {
            return Err(AgentError::internal(format!(
                "HTTP {status} from {}",
                self.shown_url
            )));
        }
        let mut read = 0;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| AgentError::internal(chain(&e.without_url())))?
        {
            read += chunk.len();
        }
        Ok(read)
    }

    /// Sends the request; the response once its head has arrived.
    async fn send(&self, body: &[u8]) -> Result<reqwest::Response, SendError> {
        let Some((local, headers)) = &self.local else {
            let Some(http) = &self.http else {
                return Err(SendError::Invalid(
                    "no HTTP client for this endpoint".into(),
                ));
            };
            return http
                .post(&self.url)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "text/event-stream")
                .body(body.to_vec())
                .send()
                .await
                .map_err(|e| {
                    // Not its URL: a base_url's query may hold a key.
                    let builder = e.is_builder();
                    let text = chain(&e.without_url());
                    if builder {
                        SendError::Invalid(text)
                    } else {
                        SendError::Transport(text)
                    }
                });
        };
        let mut request = hyper::Request::post(self.url.as_str())
            .body(reqwest::Body::from(body.to_vec()))
            .map_err(|e| SendError::Invalid(chain(&e)))?;
        let h = request.headers_mut();
        h.extend(headers.iter().map(|(k, v)| (k.clone(), v.clone())));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        let response = local
            .request(request)
            .await
            .map_err(|e| SendError::Transport(chain(e.as_ref())))?;
        Ok(reqwest::Response::from(response.map(reqwest::Body::wrap)))
    }

    /// The error of a non-success status, with the server's own message.
    /// The body is read up to [`ERROR_BODY_MAX`] within `idle_timeout`; dropping the response
    /// leaves the rest unread.
    async fn status_error(&self, mut response: reqwest::Response, status: u16) -> AttemptError {
        let retry_after = retry::retry_after(response.headers(), SystemTime::now());
        let mut body = Vec::new();
        let read = read_at_most(&mut response, &mut body, ERROR_BODY_MAX);
        // A body that broke or stalled is shown as far as it came.
        let cut_short = matches!(
            tokio::time::timeout(self.config.idle_timeout, read).await,
            Ok(Ok(true))
        );
        let detail = error_detail(&body, cut_short);
        let message = format!("HTTP {status} from {}: {detail}", self.shown_url);
        if retry::is_retryable_status(status) {
            AttemptError::Retryable {
                reason: RetryReason::of_status(status),
                retry_after,
                status: Some(status),
                message,
            }
        } else {
            tracing::warn!(status, %message, "model request refused");
            AttemptError::Fatal(Failed::new(
                Outcome::HttpError,
                AgentError::ModelError {
                    message,
                    retryable: false,
                },
            ))
        }
    }
}

#[async_trait]
impl ModelClient for OpenAiClient {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: self.provider.to_owned(),
            model: self.config.model.clone(),
            family: self.family.clone(),
        }
    }

    fn with_model(&self, model: &str) -> Option<std::sync::Arc<dyn ModelClient>> {
        let mut client = self.clone();
        client.config.model = model.to_owned();
        client.family = family(model);
        Some(std::sync::Arc::new(client))
    }

    async fn step(
        &self,
        request: ModelRequest<'_>,
        deltas: &mut dyn DeltaSink,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, AgentError> {
        let timeout = self.config.request_timeout;
        let call = async {
            tokio::select! {
                biased;
                () = cancel.cancelled() => Err(Failed::new(
                    Outcome::Cancelled,
                    AgentError::cancelled("cancelled during the model call"),
                )),
                r = tokio::time::timeout(timeout, self.call(request, deltas)) => match r {
                    Ok(r) => r,
                    Err(_) => Err(Failed::new(
                        Outcome::Timeout,
                        AgentError::timeout(format!("model call to {}", self.shown_url), timeout),
                    )),
                },
            }
        };
        // Leaving the select drops the call, and with it the response: the connection closes.
        let started = Instant::now();
        match call.await {
            Ok((response, model)) => {
                metrics::request(self.provider, Outcome::Ok);
                metrics::gen_ai_operation(self.gen_ai(model.as_deref()), started.elapsed(), None);
                Ok(response)
            }
            Err(Failed { outcome, error }) => {
                metrics::request(self.provider, outcome);
                metrics::gen_ai_operation(
                    self.gen_ai(None),
                    started.elapsed(),
                    Some(outcome.as_str()),
                );
                Err(error)
            }
        }
    }
}

/// Reads `response`'s body into `into` up to `max` bytes; whether there was more (left
/// unread).
async fn read_at_most(
    response: &mut reqwest::Response,
    into: &mut Vec<u8>,
    max: usize,
) -> Result<bool, reqwest::Error> {
    while let Some(chunk) = response.chunk().await? {
        let room = max.saturating_sub(into.len());
        if chunk.len() > room {
            into.extend_from_slice(&chunk[..room]);
            return Ok(true);
        }
        into.extend_from_slice(&chunk);
    }
    Ok(false)
}

/// What an error status's body says: the message of a JSON error body, else the start of its
/// text; `cut_short` when only the first [`ERROR_BODY_MAX`] bytes of it were read.
fn error_detail(body: &[u8], cut_short: bool) -> String {
    const SHOWN: usize = 300;
    let text = String::from_utf8_lossy(body);
    let detail = (!cut_short)
        .then(|| serde_json::from_str(&text).ok())
        .flatten()
        .and_then(|v| error_message(&v))
        .unwrap_or_else(|| {
            let cut = text
                .char_indices()
                .nth(SHOWN)
                .map_or(text.len(), |(i, _)| i);
            text[..cut].trim().to_owned()
        });
    if cut_short {
        format!("{detail} (body truncated: only its first {ERROR_BODY_MAX} bytes were read)")
    } else {
        detail
    }
}

/// The key to send, if any: `api_key`, else the variable named by `api_key_env`.
fn api_key(config: &ModelConfig) -> Option<String> {
    config
        .api_key
        .clone()
        .filter(|k| !k.is_empty())
        .or_else(|| {
            config
                .api_key_env
                .as_deref()
                .and_then(|name| std::env::var(name).ok())
                .filter(|k| !k.trim().is_empty())
        })
}

pub(crate) fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The URL without query (Azure-style `?api-version=`, sometimes keys) or credentials.
pub(crate) fn shown_url(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    url.set_query(None);
    url.set_fragment(None);
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}

/// An error with its sources: reqwest's own message rarely names the cause.
fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = e.source();
    }
    out
}

/// The family used in the prompt cache key: a known OpenAI family by prefix
/// (`gpt-4o-mini-2024-07-18` → `gpt-4o`), else the model name itself.
pub fn family(model: &str) -> String {
    // Longest first, so `gpt-4.1` is not taken for `gpt-4`.
    const FAMILIES: &[&str] = &[
        "chatgpt-4o",
        "gpt-4.1",
        "gpt-4.5",
        "gpt-4o",
        "gpt-3.5",
        "gpt-5",
        "gpt-4",
        "o4",
        "o3",
        "o1",
    ];
    let name = model.rsplit('/').next().unwrap_or(model);
    FAMILIES
        .iter()
        .find(|f| {
            name.strip_prefix(**f)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', '.', ':']))
        })
        .map_or_else(|| model.to_owned(), |f| (*f).to_owned())
}

/// The first free `call_<n>` number after those in the prompt, so text-dialect call ids are
/// unique within the conversation and the same on every replay.
fn next_call_number<'a>(prompt: impl Iterator<Item = &'a HistoryItem>) -> u64 {
    prompt
        .filter_map(|item| match item {
            HistoryItem::ToolCall(c) => c.call_id.strip_prefix("call_")?.parse::<u64>().ok(),
            _ => None,
        })
        .max()
        .map_or(1, |n| n.saturating_add(1))
}

/// Tool arguments as JSON: empty means none (`{}`), anything else must parse.
fn parse_arguments(name: &str, arguments: &str) -> Result<Json, AgentError> {
    if arguments.trim().is_empty() {
        return Ok(Json::empty_object());
    }
    serde_json::from_str(arguments)
        .map(Json)
        .map_err(|e| AgentError::ModelError {
            message: format!("invalid JSON arguments for tool `{name}`: {e}"),
            retryable: false,
        })
}

fn native_response(collected: Collected) -> Result<ModelResponse, AgentError> {
    let tool_calls = collected
        .calls
        .into_iter()
        .map(|raw| {
            if raw.name.is_empty() {
                return Err(AgentError::ModelError {
                    message: format!("tool call `{}` has no tool name", raw.call_id),
                    retryable: false,
                });
            }
            Ok(ToolCall {
                arguments: parse_arguments(&raw.name, &raw.arguments)?,
                call_id: raw.call_id,
                name: raw.name,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ModelResponse {
        text: collected.text,
        tool_calls,
        usage: collected.usage,
        response_id: collected.response_id,
        response_model: collected.model,
    })
}

fn text_response(collected: Collected, first_call: u64) -> Result<ModelResponse, AgentError> {
    let parsed = dialect::parse(&collected.text)?;
    let tool_calls = parsed
        .actions
        .into_iter()
        .zip(first_call..)
        .map(|(action, n)| ToolCall {
            call_id: format!("call_{n}"),
            name: action.tool,
            arguments: Json(action.arguments),
        })
        .collect();
    Ok(ModelResponse {
        text: parsed.text,
        tool_calls,
        usage: collected.usage,
        response_id: collected.response_id,
        response_model: collected.model,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_to_loopback_takes_the_local_transport() {
        let client = |url: &str| {
            OpenAiClient::new(ModelConfig {
                provider: Provider::OpenaiResponses,
                base_url: url.to_owned(),
                ..ModelConfig::default()
            })
            .unwrap()
        };
        for url in [
            "http://127.0.0.1:8080/v1",
            "http://localhost:11434/v1",
            "http://[::1]:8000/v1",
        ] {
            let c = client(url);
            assert!(c.local.is_some(), "{url}");
            assert!(c.http.is_none(), "{url}: no TLS client is set up");
        }
        for url in [
            "https://127.0.0.1:8443/v1",
            "http://example.com/v1",
            "https://api.openai.com/v1",
        ] {
            let c = client(url);
            assert!(c.local.is_none() && c.http.is_some(), "{url}");
        }
    }

    #[test]
    fn families() {
        assert_eq!(family("gpt-4o-mini-2024-07-18"), "gpt-4o");
        assert_eq!(family("gpt-4o"), "gpt-4o");
        assert_eq!(family("gpt-4.1-nano"), "gpt-4.1");
        assert_eq!(family("gpt-4-turbo"), "gpt-4");
        assert_eq!(family("o3-mini"), "o3");
        assert_eq!(family("openai/gpt-5-mini"), "gpt-5");
        assert_eq!(family("o30b"), "o30b");
        assert_eq!(family("llama3.1:8b"), "llama3.1:8b");
    }

    #[test]
    fn call_numbers_follow_the_prompt() {
        let call = |id: &str| {
            HistoryItem::ToolCall(ToolCall {
                call_id: id.into(),
                name: "x".into(),
                arguments: Json::empty_object(),
            })
        };
        assert_eq!(next_call_number([].iter()), 1);
        let items = [call("call_7"), call("call_x"), call("fc_9"), call("call_3")];
        assert_eq!(next_call_number(items.iter()), 8);
    }

    #[test]
    fn arguments_are_checked() {
        assert_eq!(parse_arguments("t", "").unwrap(), Json::empty_object());
        assert_eq!(parse_arguments("t", " {\"a\":1} ").unwrap().0["a"], 1);
        let e = parse_arguments("add", "{\"a\":").unwrap_err();
        assert!(e.to_string().contains("`add`"), "{e}");
    }

    #[test]
    fn the_endpoint_keeps_the_base_urls_query() {
        let url = |base: &str| endpoint_url(base, "chat/completions").map(|u| u.to_string());
        assert_eq!(
            url("http://127.0.0.1:8000/v1").unwrap(),
            "http://127.0.0.1:8000/v1/chat/completions"
        );
        assert_eq!(
            url("http://127.0.0.1:8000/v1/").unwrap(),
            "http://127.0.0.1:8000/v1/chat/completions"
        );
        assert_eq!(
            url("https://x.example/openai/v1?api-version=2024-10-21#frag").unwrap(),
            "https://x.example/openai/v1/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(url("http://h:1").unwrap(), "http://h:1/chat/completions");
        for bad in ["not a url", "ftp://h/v1", "mailto:a@b", ""] {
            let e = url(bad).unwrap_err().to_string();
            assert!(e.contains("bad model base_url"), "{bad}: {e}");
        }
        let e = url("https://u:s3cret@x.example:99999/v1")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn urls_are_shown_without_secrets() {
        let url =
            reqwest::Url::parse("https://user:pw@example.com/v1/responses?key=s3cret#x").unwrap();
        assert_eq!(shown_url(&url), "https://example.com/v1/responses");
        assert!(is_loopback("127.0.0.1") && is_loopback("[::1]") && is_loopback("localhost"));
        assert!(!is_loopback("example.com") && !is_loopback("10.0.0.1"));
    }

    /// A transport error says what failed, not the URL: a base_url's query may hold a key.
    #[tokio::test]
    async fn a_transport_error_does_not_carry_the_urls_query() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port(); // closed again: nothing listens there
        let client = OpenAiClient::new(ModelConfig {
            provider: Provider::OpenaiResponses,
            base_url: format!("https://127.0.0.1:{port}/v1?key=s3cret"),
            ..ModelConfig::default()
        })
        .unwrap();
        let error = match client.send(b"{}").await {
            Err(SendError::Transport(text) | SendError::Invalid(text)) => text,
            Ok(response) => panic!("answered: {}", response.status()),
        };
        assert!(!error.contains("s3cret"), "{error}");
        assert!(!error.contains("key="), "{error}");
    }

    #[test]
    fn error_details_show_the_servers_message_or_the_start_of_the_body() {
        let json = br#"{"error": {"message": "bad key", "type": "auth"}}"#;
        assert_eq!(error_detail(json, false), "bad key");
        assert_eq!(error_detail(b"  Bad Gateway\n", false), "Bad Gateway");
        let long = "\u{e9}".repeat(1000);
        assert_eq!(error_detail(long.as_bytes(), false), "\u{e9}".repeat(300));
        // Cut short: never parsed as a whole, and said so.
        assert_eq!(
            error_detail(&json[..20], true),
            format!(
                "{{\"error\": {{\"message\" (body truncated: only its first {ERROR_BODY_MAX} \
                 bytes were read)"
            )
        );
        // A cut through a character is shown, not refused.
        assert!(error_detail(&long.as_bytes()[..3], true).starts_with("\u{e9}\u{fffd}"));
    }

    #[test]
    fn scripted_provider_is_refused() {
        let e = OpenAiClient::new(ModelConfig::default()).unwrap_err();
        assert!(matches!(e, AgentError::InvalidInput { .. }));
    }
}
