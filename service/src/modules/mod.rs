//! Modules and I/O gateways inside `troupe serve` (A10).
//!
//! ```text
//! Modules (handle; the sessions' ModulePort)
//! ├─ StdioGateway × stdio module   its resident process, restarted with backoff (gateway.rs)
//! │    └─ feeder (input/duplex)    its messages, in order, into sessions (feed.rs)
//! └─ http modules                  a webhook each: POST of every delivery (webhook.rs)
//! ```
//!
//! - An input gateway's message goes through [`SessionsApi::send_tracked`]: the same
//!   admission, storage and durability as a message of the API. troupe acknowledges it once
//!   stored, with its origin in its metadata; when its task ends (also after a restart),
//!   its session host hands the reply to [`Modules::route_reply_later`]: it goes to the
//!   module it came from (a duplex one) and to every output module whose `sources` name
//!   that module (or `*`).
//! - A delivery to a `sync` module waits for its acknowledgement within the module's
//!   timeout: a stdio module's `ack` line, an http module's 2xx answer. An `async` one is
//!   sent in the background and tried again (`retries`, with backoff) when it fails. Every
//!   outcome is counted (`troupe_module_deliveries_total`) and a failure is logged with the
//!   module's id.
//! - A dispatch (`dispatch_module`) is always a request: the module's acknowledgement
//!   carries its `result`, or the http answer's body is the result.
//!
//! Shutdown: [`Modules::stop`] runs after the sessions drained, waits a moment for the
//! replies being routed and the async deliveries still trying, then stops the gateways (each
//! closes its process's stdin, then kills it).

pub mod feed;
pub mod frame;
pub mod gateway;
pub mod metrics;
pub mod plan;
pub mod webhook;

use crate::sessions_api::SessionsApi;
use async_trait::async_trait;
use gateway::{GatewayArgs, GatewayMsg, GatewayStatus, StdioGateway};
use ractor::{Actor, ActorRef};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use troupe_actors::modules::{ModuleDispatch, ModuleDispatchError, ModulePort, ModuleTarget};
use troupe_proto::agent::AgentLoadError;
use troupe_proto::{AgentError, SessionId};
use troupe_runtime::modules::{DeliveryMode, ModuleCatalog, ModuleDefinition, ModuleProtocol};

/// How long [`Modules::stop`] waits for replies being routed and async deliveries still
/// being tried.
const STOP_DELIVERIES: Duration = Duration::from_secs(2);

/// The process's modules. Cheap to clone.
#[derive(Clone)]
pub struct Modules {
    inner: Arc<Inner>,
}

struct Inner {
    defs: BTreeMap<String, Arc<ModuleDefinition>>,
    errors: Vec<AgentLoadError>,
    http: reqwest::Client,
    /// The stdio gateways, once started.
    gateways: OnceLock<BTreeMap<String, ActorRef<GatewayMsg>>>,
    /// Async deliveries and replies being routed, in the background: [`Modules::stop`]
    /// waits for them.
    deliveries: TaskTracker,
    /// Set once the gateways run: a reply routed before (a message that ended while the
    /// service started again) waits for it.
    started: tokio::sync::watch::Sender<bool>,
    /// The sessions, once started: a reply that could not be delivered is reported in its
    /// session.
    sessions: OnceLock<SessionsApi>,
    /// Each receiving module's replies go out in the order they were routed (the order their
    /// messages ended: a conversation's replies in the order of its messages), each recipient
    /// at its own pace.
    reply_order: BTreeMap<String, ReplyOrder>,
}

impl std::fmt::Debug for Modules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Modules")
            .field("modules", &self.inner.defs.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// A module as `modules.list` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModuleInfo {
    pub id: String,
    pub description: String,
    pub direction: &'static str,
    pub mode: &'static str,
    pub protocol: &'static str,
    /// `up`, `down` (restarting), `failed` (past its restart budget) or `ready` (an http
    /// module: reached at its first delivery).
    pub health: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<GatewayStatus>,
}

/// What a delivery attempt came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Attempt {
    /// Acknowledged (sync) or taken (async), with the module's result when it gave one.
    Done(Option<Value>),
    Timeout(String),
    Failed(String),
}

impl Modules {
    /// The modules of `catalog` (nothing runs until [`Self::start`]); their series start at 0.
    /// An error when the HTTP client for webhook modules cannot be set up.
    pub fn new(catalog: ModuleCatalog) -> Result<Self, AgentError> {
        for def in catalog.modules.values() {
            metrics::start_at_zero(def);
        }
        if catalog.modules.is_empty() {
            metrics::start_at_zero_without_modules();
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| {
                AgentError::internal(format!("the webhook client cannot be set up: {e}"))
            })?;
        let defs: BTreeMap<String, Arc<ModuleDefinition>> = catalog
            .modules
            .into_iter()
            .map(|(id, d)| (id, Arc::new(d)))
            .collect();
        let reply_order = defs
            .values()
            .filter(|d| d.direction.receives())
            .map(|d| (d.id.clone(), ReplyOrder::new()))
            .collect();
        Ok(Self {
            inner: Arc::new(Inner {
                defs,
                errors: catalog.errors,
                http,
                gateways: OnceLock::new(),
                deliveries: TaskTracker::new(),
                started: tokio::sync::watch::Sender::new(false),
                sessions: OnceLock::new(),
                reply_order,
            }),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.inner.defs.is_empty()
    }

    /// The files of the modules directory that did not load.
    pub fn errors(&self) -> &[AgentLoadError] {
        &self.inner.errors
    }

    pub fn get(&self, id: &str) -> Option<&Arc<ModuleDefinition>> {
        self.inner.defs.get(id)
    }

    /// Starts every stdio module's process (input ones feed `sessions`). A module whose
    /// program cannot start is retried by its gateway, like one that exits.
    pub async fn start(&self, sessions: SessionsApi) -> Result<(), AgentError> {
        let _ = self.inner.sessions.set(sessions.clone());
        let mut gateways = BTreeMap::new();
        for def in self.inner.defs.values() {
            if def.protocol != ModuleProtocol::Stdio {
                metrics::up(def, true);
                continue;
            }
            let feeder = def.direction.feeds().then(|| {
                let (tx, rx) = tokio::sync::mpsc::channel(gateway::FEED_QUEUE);
                tokio::spawn(feed::run(self.clone(), sessions.clone(), def.clone(), rx));
                tx
            });
            let (actor, _) = Actor::spawn(
                None,
                StdioGateway,
                GatewayArgs {
                    def: def.clone(),
                    feeder,
                },
            )
            .await
            .map_err(|e| {
                AgentError::internal(format!("module `{}` gateway did not start: {e}", def.id))
            })?;
            gateways.insert(def.id.clone(), actor);
        }
        let _ = self.inner.gateways.set(gateways);
        self.inner.started.send_replace(true);
        Ok(())
    }

    /// Stops every gateway (and its process), after a moment for the replies being routed
    /// and the async deliveries.
    pub async fn stop(&self) {
        self.inner.deliveries.close();
        let _ = tokio::time::timeout(STOP_DELIVERIES, self.inner.deliveries.wait()).await;
        if let Some(gateways) = self.inner.gateways.get() {
            for gateway in gateways.values() {
                let _ = gateway
                    .stop_and_wait(None, Some(Duration::from_secs(5)))
                    .await;
            }
        }
    }

    /// Every module with its health.
    pub async fn list(&self) -> Vec<ModuleInfo> {
        let mut out = Vec::new();
        for def in self.inner.defs.values() {
            let process = match self.gateway(&def.id) {
                Some(g) => ractor::call!(g, |reply| GatewayMsg::Status { reply }).ok(),
                None => None,
            };
            let health = match (&def.protocol, &process) {
                (ModuleProtocol::Http, _) => "ready",
                (_, Some(p)) if p.up => "up",
                (_, Some(p)) if p.given_up => "failed",
                _ => "down",
            };
            out.push(ModuleInfo {
                id: def.id.clone(),
                description: def.description.clone(),
                direction: def.direction.as_str(),
                mode: def.mode.as_str(),
                protocol: match def.protocol {
                    ModuleProtocol::Stdio => "stdio",
                    ModuleProtocol::Http => "http",
                    ModuleProtocol::Websocket => "websocket",
                },
                health,
                process,
            });
        }
        out
    }

    fn gateway(&self, id: &str) -> Option<&ActorRef<GatewayMsg>> {
        self.inner.gateways.get()?.get(id)
    }

    /// Writes `frame` to a stdio module without waiting for anything (troupe's
    /// acknowledgements of its messages).
    pub(crate) async fn tell(&self, id: &str, frame: Value) {
        if let Some(g) = self.gateway(id) {
            let _ = ractor::call!(g, |reply| GatewayMsg::Write {
                frame,
                ack: None,
                reply
            });
        }
    }

    /// One attempt at delivering `frame` to `def`; `wait`: for its acknowledgement.
    async fn attempt(&self, def: &ModuleDefinition, frame: &Value, wait: bool) -> Attempt {
        match def.protocol {
            ModuleProtocol::Http => webhook::post(&self.inner.http, def, frame).await,
            ModuleProtocol::Stdio => {
                let Some(gateway) = self.gateway(&def.id) else {
                    return Attempt::Failed(format!("module `{}` is not running", def.id));
                };
                let id = frame
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let (waiter, answered) = tokio::sync::oneshot::channel();
                let ack = wait.then_some((id, waiter));
                let written = ractor::call!(gateway, |reply| GatewayMsg::Write {
                    frame: frame.clone(),
                    ack,
                    reply
                });
                match written {
                    Ok(Ok(())) if !wait => Attempt::Done(None),
                    Ok(Ok(())) => match tokio::time::timeout(def.timeout, answered).await {
                        Ok(Ok(Ok(result))) => Attempt::Done(result),
                        Ok(Ok(Err(e))) => Attempt::Failed(e),
                        Ok(Err(_)) => Attempt::Failed(format!("module `{}` restarted", def.id)),
                        Err(_) => Attempt::Timeout(format!(
                            "module `{}` did not acknowledge within {:?}",
                            def.id, def.timeout
                        )),
                    },
                    Ok(Err(e)) => Attempt::Failed(e),
                    Err(e) => Attempt::Failed(format!("module `{}` gateway: {e}", def.id)),
                }
            }
            ModuleProtocol::Websocket => {
                Attempt::Failed("websocket modules are not supported".into())
            }
        }
    }

    /// Delivers `frame` to module `id` as its mode says: `sync` waits for the
    /// acknowledgement (one attempt); `async` returns at once and tries in the background,
    /// again after a failure, `retries` times with backoff.
    pub async fn deliver(&self, id: &str, frame: Value) {
        self.deliver_for(id, frame, None).await;
    }

    /// [`Self::deliver`]; a delivery that fails in the end is reported in `session` as a
    /// `module_delivery_failed` warning.
    async fn deliver_for(&self, id: &str, frame: Value, session: Option<SessionId>) {
        let Some(def) = self.inner.defs.get(id).cloned() else {
            return;
        };
        let span = tracing::info_span!("troupe.module.deliver", module = %def.id, direction = def.direction.as_str(), mode = def.mode.as_str(), outcome = tracing::field::Empty);
        match def.mode {
            DeliveryMode::Sync => {
                let started = Instant::now();
                let outcome = self
                    .attempt(&def, &frame, true)
                    .instrument(span.clone())
                    .await;
                record(&def, &span, &outcome, started.elapsed());
                self.report(&def, session, &outcome).await;
            }
            DeliveryMode::Async => {
                let this = self.clone();
                self.inner.deliveries.spawn(
                    async move {
                        let started = Instant::now();
                        let mut tries = 0u32;
                        loop {
                            let outcome = this.attempt(&def, &frame, false).await;
                            if matches!(outcome, Attempt::Done(_)) || tries >= def.retries {
                                record(&def, &tracing::Span::current(), &outcome, started.elapsed());
                                this.report(&def, session, &outcome).await;
                                return;
                            }
                            tries += 1;
                            metrics::delivered(&def, "retried", None);
                            let delay = plan::backoff(
                                def.restart.backoff_min,
                                def.restart.backoff_max,
                                tries,
                            );
                            tracing::info!(module = %def.id, try_again_in_ms = delay.as_millis() as u64, ?outcome, "delivery failed; trying again");
                            tokio::time::sleep(delay).await;
                        }
                    }
                    .instrument(span),
                );
            }
        }
    }

    /// A delivery that failed, as a warning in the session of the reply it carried.
    async fn report(&self, def: &ModuleDefinition, session: Option<SessionId>, outcome: &Attempt) {
        let (Some(session), Some(sessions)) = (session, self.inner.sessions.get()) else {
            return;
        };
        let why = match outcome {
            Attempt::Done(_) => return,
            Attempt::Timeout(why) | Attempt::Failed(why) => why,
        };
        if let Ok(handle) = sessions.session(crate::auth::Scope::All, session).await {
            handle.emit(troupe_actors::events::EventDraft::session(
                troupe_proto::EventKind::Warning {
                    code: troupe_proto::WarningCode::ModuleDeliveryFailed,
                    message: format!("a reply was not delivered to module `{}`: {why}", def.id),
                },
            ));
        }
    }

    /// Delivers a task's reply (or its failure) to whoever receives the replies of
    /// `origin.source` (see [`plan::recipients`]), in the background once the modules
    /// started; [`Self::stop`] waits for it. The session hosts call it when a module's
    /// message ended. Each recipient gets its replies in the order of these calls (its turn
    /// is taken here, at the call), at its own pace: a slow sync one holds up no other.
    pub(crate) fn route_reply_later(
        &self,
        origin: frame::ReplyOrigin,
        result: Result<troupe_proto::MessageReply, AgentError>,
    ) {
        let Some(source) = self.inner.defs.get(&origin.source) else {
            return;
        };
        let turns: Vec<(String, u64)> =
            plan::recipients(self.inner.defs.values().map(|d| &**d), source)
                .into_iter()
                .filter_map(|id| {
                    let turn = self.inner.reply_order.get(&id)?.take_turn();
                    Some((id, turn))
                })
                .collect();
        let this = self.clone();
        let mut started = self.inner.started.subscribe();
        self.inner.deliveries.spawn(async move {
            // Each turn is given up however this ends, so that no later reply waits for it.
            let mut turns: Vec<Turn<'_>> = turns
                .into_iter()
                .filter_map(|(id, turn)| {
                    Some(Turn {
                        order: this.inner.reply_order.get(&id)?,
                        turn,
                        recipient: id,
                        done: false,
                    })
                })
                .collect();
            if started.wait_for(|s| *s).await.is_err() {
                return;
            }
            let deliveries = turns.iter_mut().map(|turn| {
                let id = turn.recipient.clone();
                let frame_id = frame::new_id("r");
                let frame = match &result {
                    Ok(reply) => frame::reply(&frame_id, &origin, reply),
                    Err(e) => frame::failed_reply(&frame_id, &origin, e),
                };
                let session = Some(origin.session);
                let this = &this;
                async move {
                    turn.wait().await;
                    this.deliver_for(&id, frame, session).await;
                    turn.done();
                }
            });
            futures::future::join_all(deliveries).await;
        });
    }
}

/// The order of one receiving module's replies: turns are taken in the order replies are
/// routed, and served one after the other.
struct ReplyOrder {
    next: std::sync::atomic::AtomicU64,
    served: tokio::sync::watch::Sender<Served>,
}

/// The turns served: every one below `all_below`, and these past it (served out of order:
/// dropped before their turn came).
#[derive(Default)]
struct Served {
    all_below: u64,
    beyond: std::collections::BTreeSet<u64>,
}

impl ReplyOrder {
    fn new() -> Self {
        Self {
            next: std::sync::atomic::AtomicU64::new(0),
            served: tokio::sync::watch::Sender::new(Served::default()),
        }
    }

    fn take_turn(&self) -> u64 {
        self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

/// A reply's turn at one recipient: served (the next one may go) when done, or when dropped
/// before (its delivery task stopped).
struct Turn<'a> {
    order: &'a ReplyOrder,
    turn: u64,
    recipient: String,
    done: bool,
}

impl Turn<'_> {
    /// Until every earlier turn was served.
    async fn wait(&self) {
        let mut served = self.order.served.subscribe();
        let _ = served.wait_for(|s| s.all_below >= self.turn).await;
    }

    fn done(&mut self) {
        if !self.done {
            self.done = true;
            let turn = self.turn;
            self.order.served.send_modify(|s| {
                s.beyond.insert(turn);
                while s.beyond.remove(&s.all_below) {
                    s.all_below += 1;
                }
            });
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.done();
    }
}

/// Counts and logs a delivery's outcome.
fn record(def: &ModuleDefinition, span: &tracing::Span, outcome: &Attempt, took: Duration) {
    let label = match outcome {
        Attempt::Done(_) => "delivered",
        Attempt::Timeout(_) => "timeout",
        Attempt::Failed(_) => "failed",
    };
    span.record("outcome", label);
    match outcome {
        Attempt::Done(_) => {
            metrics::delivered(def, label, Some(took));
            tracing::info!(module = %def.id, outcome = label, took_ms = took.as_millis() as u64, "delivered to a module");
        }
        Attempt::Timeout(why) | Attempt::Failed(why) => {
            metrics::delivered(def, label, None);
            tracing::warn!(module = %def.id, outcome = label, %why, "delivery to a module failed");
        }
    }
}

#[async_trait]
impl ModulePort for Modules {
    fn targets(&self) -> Vec<ModuleTarget> {
        self.inner
            .defs
            .values()
            .filter(|d| d.direction.receives())
            .map(|d| ModuleTarget {
                id: d.id.clone(),
                description: d.description.clone(),
            })
            .collect()
    }

    async fn dispatch(&self, dispatch: ModuleDispatch) -> Result<Value, ModuleDispatchError> {
        let Some(def) = self
            .inner
            .defs
            .get(&dispatch.module)
            .filter(|d| d.direction.receives())
            .cloned()
        else {
            return Err(ModuleDispatchError::Unknown(format!(
                "no module `{}` takes dispatches",
                dispatch.module
            )));
        };
        let span = tracing::info_span!("troupe.module.dispatch", module = %def.id, conversation_id = %dispatch.conversation_id, task_id = %dispatch.task_id, outcome = tracing::field::Empty);
        let id = frame::new_id("d");
        let frame = frame::dispatch(
            &id,
            &dispatch.payload,
            dispatch.conversation_id,
            dispatch.task_id,
        );
        let outcome = self
            .attempt(&def, &frame, true)
            .instrument(span.clone())
            .await;
        let result = match outcome {
            Attempt::Done(result) => Ok(result.unwrap_or(Value::Null)),
            Attempt::Timeout(why) => Err(ModuleDispatchError::Timeout(why)),
            Attempt::Failed(why) => Err(ModuleDispatchError::Failed(why)),
        };
        let label = match &result {
            Ok(_) => "ok",
            Err(e) => e.outcome(),
        };
        span.record("outcome", label);
        metrics::dispatched(&def, label);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Turns are served in the order they were taken, whatever order their deliveries get
    /// to run in; a turn dropped unserved lets the next one go.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replies_to_one_recipient_go_out_in_the_order_they_were_routed() {
        let order = Arc::new(ReplyOrder::new());
        let turns: Vec<u64> = (0..6).map(|_| order.take_turn()).collect();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        // Started last first, each after a pause: without the turns they would run in reverse.
        let mut tasks = Vec::new();
        for &turn in turns.iter().rev() {
            let (order, tx) = (order.clone(), tx.clone());
            tasks.push(tokio::spawn(async move {
                let mut t = Turn {
                    order: &order,
                    turn,
                    recipient: "bridge".into(),
                    done: false,
                };
                if turn == 3 {
                    return; // dropped unserved
                }
                t.wait().await;
                let _ = tx.send(turn);
                t.done();
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(tx);
        for t in tasks {
            t.await.unwrap();
        }
        let mut delivered = Vec::new();
        while let Some(turn) = rx.recv().await {
            delivered.push(turn);
        }
        assert_eq!(delivered, [0, 1, 2, 4, 5]);
    }
}
