//! Push notifications (spec 3.1.7–3.1.10 and 4.3): webhooks a client registers for a task,
//! and their delivery.
//!
//! [`PushBook`] (a plain struct the `A2aTasks` actor owns) keeps each live task's configs and
//! decides what a request does to them. Each config gets one delivery worker ([`Deliveries`])
//! that POSTs the task's events to the webhook in order — the same `StreamResponse` a stream
//! carries (for a config made over 0.3, the 0.3 stream result) — with the config's token
//! (`X-A2A-Notification-Token`) and credentials (`Authorization: <scheme> <credentials>`). A
//! failed delivery (a transport error, 408, 429 or 5xx) is retried with exponential backoff
//! and jitter, honouring `Retry-After`; after the last attempt, or on any other status, the
//! event is given up (counted and logged) and the next one goes. A worker ends once the task's
//! last event is delivered or its config is deleted.
//!
//! Configs of live tasks are held with them, and every config is stored
//! ([`stored_config`], [`config_of`]): after a restart the configs of a task that goes on
//! still deliver; a finished task's configs are read from the store, and forgotten with it.

use super::error::A2aError;
use super::version::Version;
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::mpsc;
use troupe_runtime::openai::retry;

/// Configs a task may have at once.
pub const MAX_CONFIGS_PER_TASK: usize = 16;

/// Longest URL, token or credential accepted.
const MAX_FIELD: usize = 2048;

/// How a webhook authenticates troupe (1.0 `AuthenticationInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushAuth {
    /// An HTTP authentication scheme (`Bearer`, `Basic`, ...).
    pub scheme: String,
    pub credentials: Option<String>,
}

/// One webhook of one task (1.0 `TaskPushNotificationConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushConfig {
    /// Unique within the task; the server names it when the client does not.
    pub id: String,
    pub task_id: String,
    pub url: String,
    pub token: Option<String>,
    pub authentication: Option<PushAuth>,
    /// The version of the request that made it: the shape its receiver expects.
    pub version: Version,
}

/// A push config request, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum PushRequest {
    /// Create (or replace, same id) a config.
    Set(PushConfig),
    Get {
        task_id: String,
        id: Option<String>,
    },
    List {
        task_id: String,
    },
    Delete {
        task_id: String,
        id: String,
    },
}

/// A config as stored (its token and credentials included: they are what the webhook
/// checks).
pub fn stored_config(c: &PushConfig, now_ms: u64) -> troupe_proto::store::A2aPushRecord {
    let mut body = encode(Version::V1_0, c);
    body["version"] = json!(c.version.as_str());
    troupe_proto::store::A2aPushRecord {
        task_id: c.task_id.clone(),
        config_id: c.id.clone(),
        created_ms: now_ms,
        body: troupe_proto::Json(body),
    }
}

/// A stored config read back.
pub fn config_of(r: &troupe_proto::store::A2aPushRecord) -> Result<PushConfig, A2aError> {
    let mut c = config_v1(&r.body.0, Some(&r.task_id))?;
    c.id.clone_from(&r.config_id);
    c.version = match r.body.0.get("version").and_then(Value::as_str) {
        Some("0.3") => Version::V0_3,
        _ => Version::V1_0,
    };
    Ok(c)
}

/// Checks a webhook URL: absolute `http` or `https` with a host.
pub fn validate(config: &PushConfig) -> Result<(), A2aError> {
    let bad = |what: &str| Err(A2aError::InvalidParams(what.to_owned()));
    if config.task_id.is_empty() {
        return bad("taskId is required");
    }
    let too_long = [
        Some(config.url.as_str()),
        config.token.as_deref(),
        config
            .authentication
            .as_ref()
            .and_then(|a| a.credentials.as_deref()),
    ]
    .into_iter()
    .flatten()
    .any(|f| f.len() > MAX_FIELD);
    if too_long {
        return bad("url, token and credentials are at most 2048 bytes");
    }
    let Ok(url) = reqwest::Url::parse(&config.url) else {
        return bad("url must be an absolute http or https URL");
    };
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return bad("url must be an absolute http or https URL");
    }
    if let Some(a) = &config.authentication {
        let token_chars = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        };
        if !token_chars(&a.scheme) {
            return bad("authentication.scheme must be an HTTP authentication scheme name");
        }
        if a.credentials
            .as_deref()
            .is_some_and(|c| c.contains(['\r', '\n']))
        {
            return bad("authentication.credentials must be one line");
        }
    }
    if config
        .token
        .as_deref()
        .is_some_and(|t| t.contains(['\r', '\n']))
    {
        return bad("token must be one line");
    }
    Ok(())
}

/// The configs of the live tasks.
#[derive(Debug, Default)]
pub struct PushBook {
    by_task: HashMap<String, Vec<PushConfig>>,
}

impl PushBook {
    /// Stores a config (valid, for a known task), naming it when it has no id; a config with
    /// the id of an existing one replaces it. Answers the stored config.
    /// Whether [`Self::set`] would take `config` (checked before what it comes with is
    /// applied: a send that answers a task with a config it cannot take changes nothing).
    pub fn admits(&self, config: &PushConfig) -> Result<(), A2aError> {
        validate(config)?;
        let configs = self.of(&config.task_id);
        let known = !config.id.is_empty() && configs.iter().any(|c| c.id == config.id);
        if !known && configs.len() >= MAX_CONFIGS_PER_TASK {
            return Err(A2aError::InvalidParams(format!(
                "task {} has {MAX_CONFIGS_PER_TASK} push notification configs already",
                config.task_id
            )));
        }
        Ok(())
    }

    pub fn set(&mut self, mut config: PushConfig) -> Result<PushConfig, A2aError> {
        validate(&config)?;
        if config.id.is_empty() {
            config.id = uuid::Uuid::now_v7().to_string();
        }
        let configs = self.by_task.entry(config.task_id.clone()).or_default();
        let full = configs.len() >= MAX_CONFIGS_PER_TASK;
        match configs.iter_mut().find(|c| c.id == config.id) {
            Some(old) => *old = config.clone(),
            None if full => {
                return Err(A2aError::InvalidParams(format!(
                    "task {} has {MAX_CONFIGS_PER_TASK} push notification configs already",
                    config.task_id
                )));
            }
            None => configs.push(config.clone()),
        }
        Ok(config)
    }

    /// A task's config; `id` `None` is its only one (0.3 `get` without an id). A missing one
    /// is `TaskNotFound`, as the specification says.
    pub fn get(&self, task_id: &str, id: Option<&str>) -> Result<PushConfig, A2aError> {
        let configs = self.of(task_id);
        let found = match id {
            Some(id) => configs.iter().find(|c| c.id == id),
            None if configs.len() == 1 => configs.first(),
            None => None,
        };
        found.cloned().ok_or_else(|| A2aError::TaskNotFound {
            task_id: match id {
                Some(id) => format!("{task_id} (push notification config {id})"),
                None => format!("{task_id} (push notification config)"),
            },
        })
    }

    pub fn of(&self, task_id: &str) -> &[PushConfig] {
        self.by_task.get(task_id).map_or(&[], Vec::as_slice)
    }

    /// Removes a config; idempotent. Answers whether there was one.
    pub fn delete(&mut self, task_id: &str, id: &str) -> bool {
        let Some(configs) = self.by_task.get_mut(task_id) else {
            return false;
        };
        let before = configs.len();
        configs.retain(|c| c.id != id);
        let gone = configs.len() != before;
        if configs.is_empty() {
            self.by_task.remove(task_id);
        }
        gone
    }

    /// Puts back a config read from the store (already validated when it was made).
    pub fn restore(&mut self, config: PushConfig) {
        let configs = self.by_task.entry(config.task_id.clone()).or_default();
        if !configs.iter().any(|c| c.id == config.id) {
            configs.push(config);
        }
    }

    /// Forgets a task's configs (the task left the book; the store keeps them).
    pub fn forget(&mut self, task_id: &str) {
        self.by_task.remove(task_id);
    }
}

/// How deliveries are retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts per event, the first included.
    pub attempts: u32,
    pub base: Duration,
    pub max: Duration,
    /// Longest one request may take.
    pub timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 5,
            base: Duration::from_millis(500),
            max: Duration::from_secs(30),
            timeout: Duration::from_secs(15),
        }
    }
}

/// What one attempt's answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    Delivered,
    /// Worth another attempt (transport error, 408, 429, 5xx).
    Retry,
    /// The receiver refused it for good (another 4xx, a redirect, ...).
    Refused,
}

/// Judges an attempt: `status` `None` is a transport error or a timeout.
pub fn judge(status: Option<u16>) -> Attempt {
    match status {
        Some(s) if (200..300).contains(&s) => Attempt::Delivered,
        None => Attempt::Retry,
        Some(s) if s == 408 || retry::is_retryable_status(s) => Attempt::Retry,
        Some(_) => Attempt::Refused,
    }
}

/// The wait before retry `retry` (0 for the first), or `None` when the attempts are spent.
pub fn next_wait(
    policy: &RetryPolicy,
    retry: u32,
    retry_after: Option<Duration>,
    jitter: f64,
) -> Option<Duration> {
    (retry + 1 < policy.attempts.max(1))
        .then(|| retry::delay(retry, retry_after, policy.base, policy.max, jitter))
}

/// The delivery workers, one per config.
#[derive(Debug)]
pub struct Deliveries {
    http: reqwest::Client,
    policy: RetryPolicy,
    workers: HashMap<(String, String), mpsc::UnboundedSender<Value>>,
}

impl Deliveries {
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            http: client(),
            policy,
            workers: HashMap::new(),
        }
    }

    /// Queues one event (the body to POST) for a config, starting its worker if needed.
    pub fn send(&mut self, config: &PushConfig, body: Value) {
        let key = (config.task_id.clone(), config.id.clone());
        if let Some(tx) = self.workers.get(&key)
            && tx.send(body.clone()).is_ok()
        {
            return;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(body);
        tokio::spawn(deliver(self.http.clone(), self.policy, config.clone(), rx));
        self.workers.insert(key, tx);
    }

    /// A config is gone (deleted, replaced, its task over): its worker ends once it delivered
    /// what it holds.
    pub fn close(&mut self, task_id: &str, id: &str) {
        self.workers.remove(&(task_id.to_owned(), id.to_owned()));
    }

    /// Closes every worker of a task.
    pub fn close_task(&mut self, task_id: &str) {
        self.workers.retain(|(t, _), _| t != task_id);
    }
}

/// One config's worker: its events in order, each retried per the policy.
async fn deliver(
    http: reqwest::Client,
    policy: RetryPolicy,
    config: PushConfig,
    mut events: mpsc::UnboundedReceiver<Value>,
) {
    while let Some(body) = events.recv().await {
        let mut retry = 0;
        loop {
            let (status, retry_after) = post(&http, &policy, &config, &body).await;
            match judge(status) {
                Attempt::Delivered => {
                    super::metrics::push_delivery("delivered");
                    break;
                }
                Attempt::Refused => {
                    super::metrics::push_delivery("refused");
                    tracing::warn!(task_id = %config.task_id, config_id = %config.id, ?status, "a2a push notification refused by its receiver");
                    break;
                }
                Attempt::Retry => {
                    let Some(wait) = next_wait(&policy, retry, retry_after, retry::jitter()) else {
                        super::metrics::push_delivery("failed");
                        tracing::warn!(task_id = %config.task_id, config_id = %config.id, ?status, attempts = policy.attempts, "a2a push notification not delivered");
                        break;
                    };
                    super::metrics::push_delivery("retried");
                    tracing::debug!(task_id = %config.task_id, ?status, ?wait, "a2a push notification retried");
                    tokio::time::sleep(wait).await;
                    retry += 1;
                }
            }
        }
    }
}

/// The webhooks' client: it follows no redirect (a redirect is the receiver's refusal; a
/// followed one would turn the POST into a GET elsewhere, carry the notification token to
/// whatever host it names, and count as delivered).
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default()
}

/// One POST: the status (`None`: no answer) and the receiver's `Retry-After`.
async fn post(
    http: &reqwest::Client,
    policy: &RetryPolicy,
    config: &PushConfig,
    body: &Value,
) -> (Option<u16>, Option<Duration>) {
    let content_type = match config.version {
        Version::V1_0 => "application/a2a+json",
        Version::V0_3 => "application/json",
    };
    let mut req = http
        .post(&config.url)
        .timeout(policy.timeout)
        .header(reqwest::header::CONTENT_TYPE, content_type)
        .body(body.to_string());
    if let Some(token) = &config.token {
        req = req.header("X-A2A-Notification-Token", token);
    }
    if let Some(auth) = &config.authentication {
        let value = match &auth.credentials {
            Some(c) => format!("{} {c}", auth.scheme),
            None => auth.scheme.clone(),
        };
        req = req.header(reqwest::header::AUTHORIZATION, value);
    }
    match req.send().await {
        Ok(r) => (
            Some(r.status().as_u16()),
            retry::retry_after(r.headers(), std::time::SystemTime::now()),
        ),
        Err(_) => (None, None),
    }
}

// ----- the wire: 1.0 `TaskPushNotificationConfig` and its requests; 0.3 shapes -----

use super::version::Operation;
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WireAuthV1 {
    scheme: Option<String>,
    credentials: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WireConfigV1 {
    id: Option<String>,
    #[serde(alias = "task_id")]
    task_id: Option<String>,
    url: Option<String>,
    token: Option<String>,
    authentication: Option<WireAuthV1>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WireTaskAndIdV1 {
    #[serde(alias = "task_id")]
    task_id: Option<String>,
    id: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WireAuthV03 {
    schemes: Vec<String>,
    credentials: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WireConfigV03 {
    id: Option<String>,
    url: Option<String>,
    token: Option<String>,
    authentication: Option<WireAuthV03>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WireSetV03 {
    task_id: Option<String>,
    push_notification_config: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WireTaskAndIdV03 {
    id: Option<String>,
    push_notification_config_id: Option<String>,
}

fn parse<T: for<'de> Deserialize<'de> + Default>(params: &Value) -> Result<T, A2aError> {
    if params.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(params.clone()).map_err(|e| A2aError::InvalidParams(e.to_string()))
}

fn required(field: &str, v: Option<String>) -> Result<String, A2aError> {
    v.filter(|s| !s.is_empty())
        .ok_or_else(|| A2aError::InvalidParams(format!("{field} is required")))
}

/// A 1.0 config object (`task_id`: `None` in a `SendMessage` configuration, where the task
/// does not exist yet).
pub fn config_v1(value: &Value, task_id: Option<&str>) -> Result<PushConfig, A2aError> {
    let w: WireConfigV1 = parse(value)?;
    Ok(PushConfig {
        id: w.id.unwrap_or_default(),
        task_id: task_id.map(str::to_owned).or(w.task_id).unwrap_or_default(),
        url: required("url", w.url)?,
        token: w.token.filter(|t| !t.is_empty()),
        authentication: match w.authentication {
            None => None,
            Some(a) => Some(PushAuth {
                scheme: required("authentication.scheme", a.scheme)?,
                credentials: a.credentials.filter(|c| !c.is_empty()),
            }),
        },
        version: Version::V1_0,
    })
}

/// A 0.3 `PushNotificationConfig` (`task_id` as in [`config_v1`]).
pub fn config_v03(value: &Value, task_id: Option<&str>) -> Result<PushConfig, A2aError> {
    let w: WireConfigV03 = parse(value)?;
    Ok(PushConfig {
        id: w.id.unwrap_or_default(),
        task_id: task_id.map(str::to_owned).unwrap_or_default(),
        url: required("url", w.url)?,
        token: w.token.filter(|t| !t.is_empty()),
        authentication: match w.authentication {
            None => None,
            Some(a) => Some(PushAuth {
                scheme: a.schemes.into_iter().next().ok_or_else(|| {
                    A2aError::InvalidParams("authentication.schemes is empty".into())
                })?,
                credentials: a.credentials.filter(|c| !c.is_empty()),
            }),
        },
        version: Version::V0_3,
    })
}

/// Decodes a push config method's params.
pub fn decode(version: Version, op: Operation, params: &Value) -> Result<PushRequest, A2aError> {
    match version {
        Version::V1_0 => match op {
            Operation::CreatePushConfig => {
                let config = config_v1(params, None)?;
                if config.task_id.is_empty() {
                    return Err(A2aError::InvalidParams("taskId is required".into()));
                }
                Ok(PushRequest::Set(config))
            }
            Operation::GetPushConfig | Operation::DeletePushConfig => {
                let w: WireTaskAndIdV1 = parse(params)?;
                let task_id = required("taskId", w.task_id)?;
                let id = required("id", w.id)?;
                Ok(if op == Operation::GetPushConfig {
                    PushRequest::Get {
                        task_id,
                        id: Some(id),
                    }
                } else {
                    PushRequest::Delete { task_id, id }
                })
            }
            _ => {
                let w: WireTaskAndIdV1 = parse(params)?;
                Ok(PushRequest::List {
                    task_id: required("taskId", w.task_id)?,
                })
            }
        },
        Version::V0_3 => match op {
            Operation::CreatePushConfig => {
                let w: WireSetV03 = parse(params)?;
                let task_id = required("taskId", w.task_id)?;
                let config = w
                    .push_notification_config
                    .filter(|c| !c.is_null())
                    .ok_or_else(|| {
                        A2aError::InvalidParams("pushNotificationConfig is required".into())
                    })?;
                Ok(PushRequest::Set(config_v03(&config, Some(&task_id))?))
            }
            Operation::GetPushConfig => {
                let w: WireTaskAndIdV03 = parse(params)?;
                Ok(PushRequest::Get {
                    task_id: required("id", w.id)?,
                    id: w.push_notification_config_id.filter(|i| !i.is_empty()),
                })
            }
            Operation::DeletePushConfig => {
                let w: WireTaskAndIdV03 = parse(params)?;
                Ok(PushRequest::Delete {
                    task_id: required("id", w.id)?,
                    id: required("pushNotificationConfigId", w.push_notification_config_id)?,
                })
            }
            _ => {
                let w: WireTaskAndIdV03 = parse(params)?;
                Ok(PushRequest::List {
                    task_id: required("id", w.id)?,
                })
            }
        },
    }
}

/// A config as a result of the request's version.
pub fn encode(version: Version, c: &PushConfig) -> Value {
    match version {
        Version::V1_0 => {
            let mut v = json!({"id": c.id, "taskId": c.task_id, "url": c.url});
            if let Some(t) = &c.token {
                v["token"] = json!(t);
            }
            if let Some(a) = &c.authentication {
                v["authentication"] = json!({"scheme": a.scheme});
                if let Some(cr) = &a.credentials {
                    v["authentication"]["credentials"] = json!(cr);
                }
            }
            v
        }
        Version::V0_3 => {
            let mut inner = json!({"id": c.id, "url": c.url});
            if let Some(t) = &c.token {
                inner["token"] = json!(t);
            }
            if let Some(a) = &c.authentication {
                inner["authentication"] = json!({"schemes": [a.scheme]});
                if let Some(cr) = &a.credentials {
                    inner["authentication"]["credentials"] = json!(cr);
                }
            }
            json!({"taskId": c.task_id, "pushNotificationConfig": inner})
        }
    }
}

/// A list result: 1.0 `ListTaskPushNotificationConfigsResponse`, 0.3 a plain array.
pub fn encode_list(version: Version, configs: &[PushConfig]) -> Value {
    let items: Vec<Value> = configs.iter().map(|c| encode(version, c)).collect();
    match version {
        Version::V1_0 => json!({"configs": items, "nextPageToken": ""}),
        Version::V0_3 => Value::Array(items),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(task: &str, id: &str) -> PushConfig {
        PushConfig {
            id: id.into(),
            task_id: task.into(),
            url: "http://127.0.0.1:9/hook".into(),
            token: Some("tok".into()),
            authentication: None,
            version: Version::V1_0,
        }
    }

    #[test]
    fn configs_are_named_replaced_listed_and_deleted() {
        let mut b = PushBook::default();
        let named = b.set(config("t", "")).unwrap();
        assert!(!named.id.is_empty(), "the server names it");
        b.set(config("t", "mine")).unwrap();
        let mut replaced = config("t", "mine");
        replaced.url = "https://example.com/other".into();
        b.set(replaced.clone()).unwrap();
        assert_eq!(b.of("t").len(), 2);
        assert_eq!(b.get("t", Some("mine")).unwrap(), replaced);
        assert_eq!(b.get("t", Some("nope")).unwrap_err().code(), -32001);
        // Without an id, only a task's single config is found.
        assert_eq!(b.get("t", None).unwrap_err().code(), -32001);
        assert!(b.delete("t", "mine"));
        assert!(!b.delete("t", "mine"), "idempotent");
        assert_eq!(b.get("t", None).unwrap().id, named.id);
        b.forget("t");
        assert!(b.of("t").is_empty());
    }

    #[test]
    fn a_task_has_a_bounded_number_of_configs() {
        let mut b = PushBook::default();
        for i in 0..MAX_CONFIGS_PER_TASK {
            b.set(config("t", &i.to_string())).unwrap();
        }
        assert_eq!(b.set(config("t", "one more")).unwrap_err().code(), -32602);
        // Replacing one is fine.
        b.set(config("t", "0")).unwrap();
    }

    #[test]
    fn bad_configs_are_refused() {
        let bad = |f: &dyn Fn(&mut PushConfig)| {
            let mut c = config("t", "x");
            f(&mut c);
            validate(&c).unwrap_err().code()
        };
        assert_eq!(bad(&|c| c.url = "/relative".into()), -32602);
        assert_eq!(bad(&|c| c.url = "ftp://example.com/x".into()), -32602);
        assert_eq!(bad(&|c| c.url = "http://".into()), -32602);
        assert_eq!(bad(&|c| c.task_id.clear()), -32602);
        assert_eq!(bad(&|c| c.token = Some("a\r\nX-Evil: 1".into())), -32602);
        assert_eq!(
            bad(&|c| {
                c.authentication = Some(PushAuth {
                    scheme: "Bearer x".into(),
                    credentials: None,
                })
            }),
            -32602
        );
        assert_eq!(
            bad(&|c| c.url = format!("http://h/{}", "x".repeat(3000))),
            -32602
        );
        validate(&config("t", "x")).unwrap();
    }

    /// A receiver that redirects refuses: the redirect is not followed (the token goes
    /// nowhere else) and the event is not counted as delivered.
    #[tokio::test]
    async fn a_redirect_is_a_refusal_and_is_not_followed() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let followed = std::sync::Arc::new(AtomicUsize::new(0));
        let hits = followed.clone();
        let app = axum::Router::new()
            .route(
                "/hook",
                axum::routing::post(|| async {
                    (
                        axum::http::StatusCode::FOUND,
                        [(axum::http::header::LOCATION, "/elsewhere")],
                    )
                }),
            )
            .route(
                "/elsewhere",
                axum::routing::any(move || {
                    hits.fetch_add(1, Ordering::SeqCst);
                    async { axum::http::StatusCode::OK }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let mut hook = config("t", "x");
        hook.url = url;
        hook.token = Some("secret".into());
        let deliveries = Deliveries::new(RetryPolicy::default());
        let (status, _) = post(&deliveries.http, &RetryPolicy::default(), &hook, &json!({})).await;
        assert_eq!(status, Some(302));
        assert_eq!(judge(status), Attempt::Refused);
        assert_eq!(
            followed.load(Ordering::SeqCst),
            0,
            "the redirect was followed"
        );
    }

    #[test]
    fn attempts_are_judged_and_retried_with_growing_waits() {
        assert_eq!(judge(Some(200)), Attempt::Delivered);
        assert_eq!(judge(Some(204)), Attempt::Delivered);
        for retryable in [None, Some(408), Some(429), Some(500), Some(503)] {
            assert_eq!(judge(retryable), Attempt::Retry, "{retryable:?}");
        }
        for refused in [Some(301), Some(400), Some(401), Some(404)] {
            assert_eq!(judge(refused), Attempt::Refused, "{refused:?}");
        }
        let p = RetryPolicy {
            attempts: 3,
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
        };
        // No jitter: base, then twice base; the third attempt is the last.
        assert_eq!(
            next_wait(&p, 0, None, 1.0),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            next_wait(&p, 1, None, 1.0),
            Some(Duration::from_millis(200))
        );
        assert_eq!(next_wait(&p, 2, None, 1.0), None);
        // The receiver's Retry-After wins, capped.
        assert_eq!(
            next_wait(&p, 0, Some(Duration::from_secs(60)), 1.0),
            Some(Duration::from_secs(1))
        );
    }
}
