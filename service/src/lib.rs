//! `troupe serve`: sessions as a durable service (P1–P4, S5 over the wire, O2).
//!
//! ```text
//!                 ┌─ HTTP: POST /rpc, REST /api/..., SSE /api/sessions/{id}/events
//! transports ─────┼─ WebSocket: /rpc/ws (JSON-RPC + notifications), /api/sessions/{id}/events/ws
//!                 └─ stdio: one JSON-RPC frame per line
//!       │  (auth: bearer token → Scope)
//!       ▼
//! rpc::Rpc / rest ──► SessionsApi ──► Registry ──► SessionHost × active ──► Session
//!                          │                          │  (durable queue,       (troupe-actors)
//!                          │ reads                    │   store writes)
//!                          └──────────► Store ◄───────┘
//! stream::events ──► SessionHandle::events (the rollout's record, then live; resume by seq)
//! ttl::TtlSweeper ──► Store + rollout storage (drops Ttl content once due; no session needed)
//! ```
//!
//! - [`sessions_api`]: the front door; reads go to the store, work to a session's host.
//! - [`supervisor`], [`registry`], [`host`]: the service's actors: the supervisor restarts
//!   the registry, the registry activates sessions on first use, a host owns one session's
//!   rows and its durable queue of messages; [`admission`] decides what a host takes.
//! - [`rpc`]: JSON-RPC decoding and dispatch, shared by the three transports.
//! - [`rest`], [`ws`], [`stdio`], [`http`]: the transports and the router.
//! - [`stream`]: the event stream every transport reads, and the client event types.
//! - [`listen`]: the HTTP/1 connections (timeouts for slow and idle clients, a connection
//!   cap); [`edge`]: the Host, Origin and content-type checks every request passes first.
//! - [`console`]: the web console at `/` (its pages, embedded assets and sign-in,
//!   [`sign_in`]).
//! - [`auth`], [`error`], [`metrics`].
//! - The Ttl sweeper ([`troupe_store::ttl`]): one sweep at start-up, before sessions are restored
//!   and anything is served, then one every `ttl_sweep_interval` until shutdown begins.
//!
//! The A2A routes ([`a2a`]) are merged into the router by [`Service::extra_routes`]:
//! the agent card public, the JSON-RPC route behind authentication.
//!
//! Shutdown ([`Service::shutdown`]), step by step: stop accepting connections and end the
//! event streams; stop admitting messages and let running tasks finish within the grace
//! period; shut every session down (what still runs is cancelled, rollouts are flushed);
//! wait for the last replies to be stored and answered.
#![forbid(unsafe_code)]

pub mod a2a;
pub mod admission;
pub mod api;
pub mod auth;
pub mod console;
pub mod edge;
pub mod error;
pub mod extract;
pub mod forward;
pub mod host;
pub mod http;
pub mod lease_keeper;
pub mod listen;
pub mod metrics;
pub mod modules;
pub mod registry;
pub mod rest;
pub mod router;
pub mod rpc;
pub mod sessions_api;
pub mod sign_in;
pub mod state;
pub mod stdio;
pub mod stream;
pub mod supervisor;
pub mod transport;
pub mod ws;

use auth::Auth;
use host::SessionTemplate;
use metrics_exporter_prometheus::PrometheusHandle;
use registry::RegistryArgs;
use rpc::Rpc;
use sessions_api::SessionsApi;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use troupe_actors::SessionPorts;
use troupe_actors::rollout::FileRolloutStorage;
use troupe_proto::AgentError;
use troupe_runtime::config::TroupeConfig;
use troupe_store::Store;
use troupe_store::ttl::TtlSweeper;

pub use state::{AppState, ExtraRoutes};

/// How long a failed service keeps its listener open, answering 503 on `/healthz` with the
/// reason, before it shuts down and exits non-zero.
pub const FAILED_LINGER: Duration = Duration::from_secs(2);
/// How long a shutdown waits, once every task has ended, for the last answers to reach the
/// clients (HTTP connections, JSON-RPC WebSockets, stdio) before it leaves them.
pub const LAST_ANSWERS: Duration = Duration::from_secs(10);

/// A running service: the registry and what the transports share.
#[derive(Clone)]
pub struct Service {
    pub sessions: SessionsApi,
    /// This node's session leases, on a node of a cluster.
    leases: Option<Arc<dyn troupe_store::SessionLeases>>,
    /// This node's node actor on the node transport (`[cluster] listen`).
    #[cfg(feature = "cluster")]
    transport: Option<ractor::ActorRef<transport::TransportMsg>>,
    state: AppState,
    auth: Auth,
    metrics_public: bool,
    grace_period: Duration,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
    limits: listen::ConnLimits,
    a2a: troupe_runtime::config::A2aServerConfig,
    /// What each A2A context's conversation is opened with.
    a2a_conversation: troupe_proto::OpenConversation,
    console: troupe_runtime::config::ConsoleConfig,
    /// What the A2A extended card adds: the shell tool and the configured MCP servers.
    a2a_skills: Vec<serde_json::Value>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("auth", &self.auth)
            .field("grace_period", &self.grace_period)
            .finish_non_exhaustive()
    }
}

/// Registers the description of every metric a `troupe serve` process can record (the
/// actors', the runtime's, the store's and the service's), so that `/metrics` gives each its help text from the start.
pub fn describe_metrics() {
    troupe_actors::describe_metrics();
    metrics::describe();
    forward::describe();
    transport::describe();
    modules::metrics::describe();
    a2a::metrics::describe();
    troupe_a2a::describe_metrics();
    troupe_runtime::describe_metrics();
    troupe_store::describe_metrics();
}

/// What [`Service::start_with`] adds to [`Service::start`].
#[derive(Default)]
pub struct StartOptions {
    /// The reloadable settings, as the live configuration publishes them (A7).
    pub live: Option<tokio::sync::watch::Receiver<Arc<troupe_actors::conversation::Reloadable>>>,
    /// The process's modules and I/O gateways (A10).
    pub modules: Option<modules::Modules>,
    /// This node's session leases, when it is one node of a cluster ([`Storage::cluster`]).
    pub cluster: Option<ClusterStorage>,
    /// The agent definition files that did not load: listed by `agents.list` even when no
    /// definition loaded (and so no session runs agents).
    pub agent_errors: Vec<troupe_proto::agent::AgentLoadError>,
}

impl Service {
    /// Starts the registry over `store` (restoring what it holds); sessions are assembled
    /// from `config` with `ports`. Before anything is restored or served, content whose Ttl
    /// has passed is swept from the store and the rollout (`ports.rollout_storage`, or the
    /// JSONL files under the data directory); a [`TtlSweeper`] then sweeps every
    /// `ttl_sweep_interval` until shutdown, whatever sessions are in memory.
    pub async fn start(
        config: &TroupeConfig,
        store: Arc<dyn Store>,
        ports: SessionPorts,
        prometheus: Option<PrometheusHandle>,
    ) -> Result<Self, AgentError> {
        Self::start_with(config, store, ports, prometheus, StartOptions::default()).await
    }

    /// [`Self::start`], with what `troupe serve` adds: the reloadable settings (`[tools]`,
    /// the capabilities) taken from `options.live` by each task when it starts, instead of
    /// from `config` once (A7); and the process's modules (A10): their gateways start once
    /// the sessions can take messages, every task may dispatch to them, and they stop after
    /// the sessions' last replies are delivered.
    pub async fn start_with(
        config: &TroupeConfig,
        store: Arc<dyn Store>,
        mut ports: SessionPorts,
        prometheus: Option<PrometheusHandle>,
        options: StartOptions,
    ) -> Result<Self, AgentError> {
        // Each configured MCP server's series exist from the start, before any session
        // starts its pool (a dashboard's panel or an alert's `increase()` needs them at 0).
        troupe_actors::mcp_pool::metrics::servers_configured(
            config.mcp.servers.iter().map(|s| s.name.as_str()),
        );
        let env = |k: &str| std::env::var(k).ok();
        let mut tokens = Vec::new();
        for t in &config.server.tokens {
            let secret = t.secret(&env).ok_or_else(|| {
                AgentError::invalid(format!(
                    "a [[server.tokens]] entry has no token (token_env = {:?} is unset)",
                    t.token_env
                ))
            })?;
            tokens.push((secret, t.projects.clone()));
        }
        let mut session_config = troupe_runtime::assembly::session_config(config);
        let StartOptions {
            live,
            modules,
            cluster,
            agent_errors,
        } = options;
        session_config.conversation.live = live;
        // Listed even when none loaded: `modules.list` reports the files that did not.
        let listed = modules.clone();
        let modules = modules.filter(|m| !m.is_empty());
        if let Some(m) = &modules {
            session_config.conversation.modules = Some(Arc::new(m.clone()));
        }
        // The sessions write to the very storage the sweeper sweeps.
        let rollout = ports.rollout_storage.clone().unwrap_or_else(|| {
            Arc::new(FileRolloutStorage::new(
                session_config.data_dir.join("rollout"),
            ))
        });
        ports.rollout_storage = Some(rollout.clone());
        let sweeper = TtlSweeper::new(Some(store.clone()), rollout);
        sweeper.sweep().await;
        let ttl_sweep_interval = session_config.ttl_sweep_interval;
        let forward = cluster
            .as_ref()
            .map(|c| {
                forward::Forwarder::new(
                    c.leases.node().to_owned(),
                    c.leases.clone(),
                    config.server.body_limit,
                    c.lease_ttl,
                )
                .map(|mut f| {
                    if config.server.a2a.enabled {
                        f.a2a = Some(forward::A2aRoute::new(
                            store.clone(),
                            config.server.a2a.project.clone(),
                        ));
                    }
                    Arc::new(f)
                })
            })
            .transpose()?;
        let leases = cluster.as_ref().map(|c| c.leases.clone());
        #[cfg(feature = "cluster")]
        let joins = cluster.as_ref().map(|c| c.lease_ttl);
        let (cluster, keeper, lost) = match cluster {
            Some(c) => {
                let (mut registry, keeper, lost) = lease_keeper_of(c);
                if let Some(every) = config.cluster.scan_every {
                    registry.scan_every = every.max(Duration::from_millis(100));
                }
                (Some(registry), Some(keeper), Some(lost))
            }
            None => (None, None, None),
        };
        let sessions = SessionsApi::start_with_keeper(
            RegistryArgs {
                store,
                template: SessionTemplate {
                    config: session_config,
                    ports,
                    modules: modules.clone(),
                },
                cluster,
            },
            keeper,
        )
        .await?;
        if let Some(mut lost) = lost {
            // A session another node took over: its host stops here.
            let sessions = sessions.clone();
            tokio::spawn(async move {
                while let Some(session_id) = lost.recv().await {
                    sessions.lease_lost(session_id);
                }
            });
        }
        if let Some(m) = listed {
            sessions.set_modules(m);
        }
        sessions.set_agent_errors(agent_errors);
        if let Some(m) = &modules {
            m.start(sessions.clone()).await?;
        }
        #[cfg(feature = "cluster")]
        let transport = match (joins, &config.cluster.listen) {
            (Some(lease_ttl), Some(listen)) => {
                Some(join_transport(&config.cluster, listen, lease_ttl, sessions.clone()).await?)
            }
            _ => None,
        };
        let shutdown = CancellationToken::new();
        // Ends with the service: the token fires when shutdown begins.
        let _sweeping = sweeper.spawn(ttl_sweep_interval, shutdown.clone());
        let state = AppState {
            rpc: Rpc::new(sessions.clone(), config.server.max_page.max(1)),
            body_limit: config.server.body_limit,
            shutdown,
            prometheus,
            forward,
            connections: tokio_util::task::TaskTracker::new(),
        };
        Ok(Self {
            sessions,
            leases,
            #[cfg(feature = "cluster")]
            transport,
            state,
            auth: Auth::new(tokens),
            metrics_public: config.server.metrics_public,
            grace_period: config.server.grace_period,
            allowed_hosts: config.server.allowed_hosts.clone(),
            allowed_origins: config.server.allowed_origins.clone(),
            limits: listen::ConnLimits {
                header_timeout: config.server.header_timeout,
                body_timeout: config.server.body_timeout,
                idle_timeout: config.server.idle_timeout,
                max_connections: config.server.max_connections,
            },
            a2a: config.server.a2a.clone(),
            a2a_conversation: config.server.a2a.conversation(&config.chat),
            console: config.server.console.clone(),
            a2a_skills: a2a::card::tool_skills(
                true,
                &config
                    .mcp
                    .servers
                    .iter()
                    .map(|s| s.name.clone())
                    .collect::<Vec<_>>(),
            ),
        })
    }

    /// The router, with `extra` routes (the A2A endpoint) merged in.
    pub fn router(&self, extra: ExtraRoutes) -> axum::Router {
        self.router_on(None, extra)
    }

    /// The router of a service listening on `port` (the console's cookie is named for it).
    fn router_on(&self, port: Option<u16>, extra: ExtraRoutes) -> axum::Router {
        router::router(
            self.state.clone(),
            self.auth
                .clone()
                .with_sign_in(port, self.console.sign_in_ttl),
            self.metrics_public,
            self.console.enabled.then(|| self.console.clone()),
            extra,
        )
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// A node of a cluster publishes where its API answers (`http://host:port`), so that the
    /// other nodes forward to it the calls for its sessions. One node alone: nothing to do.
    pub async fn publish_api(&self, api_url: &str) -> Result<(), AgentError> {
        match &self.leases {
            Some(leases) => {
                leases
                    .publish_api(api_url, troupe_actors::clock::unix_now_ms())
                    .await
            }
            None => Ok(()),
        }
    }

    /// [`Self::publish_api`] now, then again every `every` until shutdown: the node's
    /// heartbeat (a node silent for a lease ttl gets no new sessions).
    pub async fn keep_published(&self, api_url: String, every: Duration) -> Result<(), AgentError> {
        self.publish_api(&api_url).await?;
        let Some(leases) = self.leases.clone() else {
            return Ok(());
        };
        let stop = self.state.shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
                if let Err(e) = leases
                    .publish_api(&api_url, troupe_actors::clock::unix_now_ms())
                    .await
                {
                    tracing::warn!(error = %e, "node heartbeat not written");
                }
            }
        });
        Ok(())
    }

    /// Fired when shutdown begins.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.state.shutdown.clone()
    }

    /// Refuses an open API on anything but loopback.
    pub fn check_bind(&self, addr: SocketAddr) -> Result<(), AgentError> {
        check_bind(self.auth.is_open(), addr)
    }

    /// The routes served beside the API: the A2A endpoint (its agent card public, its
    /// JSON-RPC route behind the token check) unless `[server.a2a] enabled = false`.
    pub async fn extra_routes(&self) -> Result<(Option<a2a::A2a>, ExtraRoutes), AgentError> {
        if !self.a2a.enabled {
            return Ok((None, ExtraRoutes::default()));
        }
        let (mounted, routes) = a2a::mount::mount(
            self.sessions.clone(),
            &self.a2a,
            self.a2a_conversation.clone(),
            !self.auth.is_open(),
            self.a2a_skills.clone(),
        )
        .await?;
        tracing::info!(project = %self.a2a.project, "A2A endpoint mounted");
        Ok((Some(mounted), routes))
    }

    /// The Host, Origin and content-type checks of a service listening on `addr`.
    pub fn edge_policy(&self, addr: SocketAddr) -> Result<edge::EdgePolicy, AgentError> {
        edge::EdgePolicy::new(addr, &self.allowed_hosts, &self.allowed_origins)
    }

    /// Serves HTTP on `listener` until `shutdown` fires, then shuts down gracefully. Every
    /// request passes the [`edge`] checks first.
    pub async fn serve_http(&self, listener: tokio::net::TcpListener) -> Result<(), AgentError> {
        let addr = listener
            .local_addr()
            .map_err(|e| AgentError::internal(format!("listener address: {e}")))?;
        self.check_bind(addr)?;
        let policy = Arc::new(self.edge_policy(addr)?);
        let (a2a, extra) = self.extra_routes().await?;
        let app = self
            .router_on(Some(addr.port()), extra)
            .layer(axum::middleware::from_fn_with_state(policy, edge::guard));
        let stop = self.state.shutdown.clone();
        let limits = self.limits;
        let server = tokio::spawn(listen::serve(listener, app, limits, stop));
        let failure = tokio::select! {
            () = self.state.shutdown.cancelled() => None,
            reason = self.failed() => Some(reason),
        };
        if let Some(reason) = &failure {
            tracing::error!(%reason, "service failed; shutting down to be restarted");
            // Keep answering for a moment, so that health checks see why (503 on /healthz
            // and /readyz) before the listener closes.
            tokio::select! {
                () = tokio::time::sleep(FAILED_LINGER) => {}
                () = self.state.shutdown.cancelled() => {}
            }
        }
        self.shutdown().await;
        // Every task has ended: the WebSocket connections write the answers of the calls
        // that waited on them, then close.
        self.state.connections.close();
        if tokio::time::timeout(LAST_ANSWERS, self.state.connections.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                ?LAST_ANSWERS,
                "WebSocket connections still open after shutdown; leaving them"
            );
        }
        if let Some(a2a) = a2a {
            a2a.stop().await;
        }
        // The last connections close once their replies are out.
        let served = match tokio::time::timeout(LAST_ANSWERS, server).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(AgentError::internal(format!("http server task: {e}"))),
            Err(_) => {
                tracing::warn!(
                    ?LAST_ANSWERS,
                    "connections still open after shutdown; leaving them"
                );
                Ok(())
            }
        };
        match failure {
            Some(reason) => Err(AgentError::internal(format!("service failed: {reason}"))),
            None => served,
        }
    }

    /// Serves JSON-RPC on stdin/stdout until stdin ends, `shutdown` fires or the service
    /// fails, then shuts down as over HTTP: no line is read any more, running tasks get the
    /// grace period and what still runs is cancelled, so every call still waiting is answered
    /// (then the transport ends; a peer that reads none of it is left after
    /// [`LAST_ANSWERS`]). A failure is the error returned (the process exits non-zero).
    pub async fn serve_stdio<R, W>(&self, input: R, output: W) -> Result<(), AgentError>
    where
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
        W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let closed = CancellationToken::new();
        let mut transport = tokio::spawn(stdio::serve(
            self.state.rpc.clone(),
            input,
            output,
            self.state.body_limit,
            self.state.shutdown.clone(),
            closed.clone(),
        ));
        let failure = tokio::select! {
            _ = &mut transport => None,
            () = self.state.shutdown.cancelled() => None,
            reason = self.failed() => Some(reason),
        };
        if let Some(reason) = &failure {
            tracing::error!(%reason, "service failed; shutting down to be restarted");
        }
        self.shutdown().await;
        if !transport.is_finished()
            && tokio::time::timeout(LAST_ANSWERS, &mut transport)
                .await
                .is_err()
        {
            tracing::warn!("stdio answers still unread after shutdown; leaving them");
            closed.cancel();
            let _ = transport.await;
        }
        match failure {
            Some(reason) => Err(AgentError::internal(format!("service failed: {reason}"))),
            None => Ok(()),
        }
    }

    /// The graceful part of shutdown: no new messages; running ones get the grace period;
    /// then every session is shut down (cancelling the rest, flushing rollouts) and the
    /// last replies are stored.
    pub async fn shutdown(&self) {
        self.state.shutdown.cancel();
        let grace = self.grace_period;
        tracing::info!(grace_ms = grace.as_millis() as u64, "draining");
        if tokio::time::timeout(grace, self.sessions.drain())
            .await
            .is_err()
        {
            tracing::warn!("grace period over; cancelling what still runs");
        }
        if let Err(e) = self.sessions.shutdown().await {
            tracing::error!(error = %e, "sessions shutdown");
        }
        // Cancelled tasks answer promptly; their replies are stored before this returns
        // (under this node's leases, which fence those writes).
        let _ = tokio::time::timeout(Duration::from_secs(10), self.sessions.drain()).await;
        // Then the leases go back: the other nodes may take its sessions over at once.
        if let Err(e) = self.sessions.release_leases().await {
            tracing::warn!(error = %e, "session leases not given back");
        }
        #[cfg(feature = "cluster")]
        if let Some(node) = &self.transport {
            match ractor::call!(node, |reply| transport::TransportMsg::Leave { reply }) {
                Ok(heard) => tracing::info!(nodes = heard, "told the other nodes this one leaves"),
                Err(e) => tracing::warn!(error = %e, "the other nodes were not told"),
            }
        }
        // The last replies went to their modules; now the gateways stop.
        if let Some(modules) = self.sessions.modules() {
            modules.stop().await;
        }
        self.sessions.stop().await;
        #[cfg(feature = "cluster")]
        if let Some(node) = &self.transport {
            node.stop(Some("service stopped".into()));
        }
    }

    /// The nodes connected to this one over the node transport, by name (none without it).
    pub async fn peers(&self) -> Vec<String> {
        #[cfg(feature = "cluster")]
        if let Some(node) = &self.transport {
            return ractor::call!(node, |reply| transport::TransportMsg::Peers { reply })
                .unwrap_or_default();
        }
        Vec::new()
    }

    /// Resolves when the service can no longer do its work by itself (a component failed
    /// and could not be restarted), with the reason.
    pub async fn failed(&self) -> String {
        let mut health = self.sessions.health();
        loop {
            if let supervisor::Health::Failed { reason, .. } = &*health.borrow_and_update() {
                return reason.clone();
            }
            if health.changed().await.is_err() {
                return "the service supervisor stopped".to_owned();
            }
        }
    }
}

/// Starts this node's node actor on the node transport: its NodeServer listening on
/// `listen` with the cluster's cookie, connected to the seeds.
#[cfg(feature = "cluster")]
async fn join_transport(
    cluster: &troupe_runtime::config::ClusterConfig,
    listen: &str,
    lease_ttl: Duration,
    sessions: SessionsApi,
) -> Result<ractor::ActorRef<transport::TransportMsg>, AgentError> {
    let invalid = |m: String| AgentError::invalid(format!("[cluster] listen: {m}"));
    let (Some(node), Some(cookie)) = (
        &cluster.node,
        cluster.cookie.as_ref().filter(|c| !c.trim().is_empty()),
    ) else {
        return Err(invalid(
            "the node transport needs [cluster] cookie (TROUPE_CLUSTER_COOKIE), the secret every node shares (not empty)"
                .into(),
        ));
    };
    let addr = tokio::net::lookup_host(listen)
        .await
        .map_err(|e| invalid(format!("cannot resolve `{listen}`: {e}")))?
        .next()
        .ok_or_else(|| invalid(format!("`{listen}` resolves to no address")))?;
    if addr.ip().is_unspecified() {
        // The node tells its peers this address: they would call themselves.
        return Err(invalid(format!(
            "`{listen}` is every address, which this node would tell the others to reach it at: name the address they reach it at"
        )));
    }
    let (actor, _) = ractor::Actor::spawn(
        None,
        transport::ClusterTransport,
        transport::TransportArgs {
            node: node.clone(),
            listen: addr,
            cookie: cookie.clone(),
            seeds: cluster.seeds.clone(),
            lease_ttl,
            sessions,
        },
    )
    .await
    .map_err(|e| invalid(format!("cannot listen on {addr}: {e}")))?;
    Ok(actor)
}

/// This node's [`LeaseKeeper`](lease_keeper::LeaseKeeper), as the service's supervisor starts
/// (and restarts) it: what the registry takes leases through, and where the sessions it loses
/// are reported.
fn lease_keeper_of(
    cluster: ClusterStorage,
) -> (
    registry::RegistryCluster,
    supervisor::KeeperSpec,
    tokio::sync::mpsc::UnboundedReceiver<troupe_proto::SessionId>,
) {
    let (lost_tx, lost) = tokio::sync::mpsc::unbounded_channel();
    let (tx, rx) = tokio::sync::watch::channel(None);
    let spec = supervisor::KeeperSpec {
        args: lease_keeper::LeaseKeeperArgs {
            leases: cluster.leases.clone(),
            ttl: cluster.lease_ttl,
            clock: troupe_actors::clock::Clock::new(),
            lost: lost_tx,
        },
        tx,
    };
    (
        registry::RegistryCluster {
            keeper: lease_keeper::KeeperRef::new(rx),
            leases: cluster.leases,
            scan_every: cluster.lease_ttl,
        },
        spec,
        lost,
    )
}

/// Where the service keeps things.
pub struct Storage {
    pub store: Arc<dyn Store>,
    /// The sessions' rollout record; `None`: the rollout's JSONL files under the data
    /// directory.
    pub rollout: Option<Arc<dyn troupe_actors::rollout::storage::RolloutStorage>>,
    /// A line saying which, for the operator.
    pub description: String,
    /// This node's session leases, when it is one node of a cluster (`[cluster] node`).
    pub cluster: Option<ClusterStorage>,
    /// The data directory's lock (`troupe.lock`), held as long as this value lives: one
    /// service at a time writes a data directory's `troupe.db` and `rollout.db`.
    pub lock: Option<DataDirLock>,
}

/// The exclusive lock of a data directory ([`lock_data_dir`]), released when dropped (or
/// when the process ends, however it ends).
#[derive(Debug)]
pub struct DataDirLock {
    _file: std::fs::File,
}

/// The lock file of a data directory.
pub const DATA_DIR_LOCK_FILE: &str = "troupe.lock";

/// Takes the exclusive lock of `dir` (creating it), or says who holds it: two services on
/// one data directory would both write its databases, each taking the other's sequence
/// numbers, and lose records.
pub fn lock_data_dir(dir: &std::path::Path) -> Result<DataDirLock, AgentError> {
    use std::io::{Read, Seek, Write};
    // Made the user's alone (the store holds the conversations' content); one that exists
    // keeps the mode it was given.
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| {
        AgentError::invalid(format!(
            "cannot create the data directory {}: {e}",
            dir.display()
        ))
    })?;
    let path = dir.join(DATA_DIR_LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| AgentError::invalid(format!("cannot open {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(AgentError::invalid(data_dir_in_use(dir, holder.trim())));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(AgentError::invalid(format!(
                "cannot lock {}: {e}",
                path.display()
            )));
        }
    }
    // Who holds it, for the next one's error; the lock stands without it.
    let _ = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()));
    Ok(DataDirLock { _file: file })
}

/// The error of a data directory another process holds (`holder`: its pid, as it wrote it).
fn data_dir_in_use(dir: &std::path::Path, holder: &str) -> String {
    let by = match holder.parse::<u32>() {
        Ok(pid) => format!(" (pid {pid})"),
        Err(_) => String::new(),
    };
    format!(
        "the data directory {} is in use by another troupe serve{by}: give each service its own --data-dir",
        dir.display()
    )
}

/// What a node of a cluster owns its sessions through.
#[derive(Clone)]
pub struct ClusterStorage {
    pub leases: Arc<dyn troupe_store::SessionLeases>,
    pub lease_ttl: Duration,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

/// The service's storage: with `ephemeral` the store and every rollout are in memory (nothing
/// is written to disk); otherwise as `[store] backend` says: SQLite, the store in
/// `<data_dir>/troupe.db` and every session's rollout in `<data_dir>/rollout.db` (see
/// `SqliteRolloutStorage::path_in`), or PostgreSQL, both on the server at `[store]
/// postgres_url`, whose schema is brought up to date.
pub async fn open_store(config: &TroupeConfig, ephemeral: bool) -> Result<Storage, AgentError> {
    if ephemeral {
        return Ok(Storage {
            store: Arc::new(troupe_store::memory::MemoryStore::new()),
            rollout: Some(Arc::new(troupe_store::MemoryRolloutStorage::new())),
            description: "store and rollout: in memory (--ephemeral); nothing is written to disk"
                .to_owned(),
            cluster: None,
            lock: None,
        });
    }
    match placement(config)? {
        Placement::Sqlite => open_sqlite(config),
        Placement::Postgres { url, node } => open_postgres(config, &url, node).await,
    }
}

/// Where `config` puts the store.
enum Placement {
    /// `troupe.db` in the data directory.
    Sqlite,
    /// PostgreSQL at `url`: `[store] backend = "postgres"`, or a cluster node's database.
    Postgres {
        url: String,
        node: Option<troupe_runtime::config::ClusterNode>,
    },
}

fn placement(config: &TroupeConfig) -> Result<Placement, AgentError> {
    let node = config
        .cluster
        .node(&config.store)
        .map_err(|e| AgentError::invalid(e.to_string()))?;
    Ok(match (node, config.store.backend) {
        (Some(node), _) => Placement::Postgres {
            url: node.postgres_url.clone(),
            node: Some(node),
        },
        (None, troupe_runtime::config::StoreBackend::Postgres) => Placement::Postgres {
            url: postgres_url(config)?,
            node: None,
        },
        (None, troupe_runtime::config::StoreBackend::Sqlite) => Placement::Sqlite,
    })
}

/// The store that authorization tokens are kept in, as `troupe serve` on `config` keeps them:
/// PostgreSQL when the store (or the cluster) is there, else `troupe.db` in the data
/// directory. What `troupe tokens` and `troupe chat --auth-token` use, so that all three
/// count uses in the same table.
pub async fn open_token_store(
    config: &TroupeConfig,
) -> Result<Arc<dyn troupe_actors::ports::TokenStore>, AgentError> {
    match placement(config)? {
        Placement::Postgres { url, .. } => token_store_on_postgres(config, &url).await,
        Placement::Sqlite => {
            let dir = config.data_dir.clone();
            let store =
                tokio::task::spawn_blocking(move || troupe_store::SqliteStore::open_in(&dir))
                    .await
                    .map_err(|e| AgentError::internal(format!("open the token store: {e}")))??;
            Ok(Arc::new(store))
        }
    }
}

#[cfg(feature = "postgres")]
async fn token_store_on_postgres(
    config: &TroupeConfig,
    url: &str,
) -> Result<Arc<dyn troupe_actors::ports::TokenStore>, AgentError> {
    let options = troupe_store::PgOptions {
        pool_size: config.store.postgres_pool_size,
        ..troupe_store::PgOptions::default()
    };
    Ok(Arc::new(
        troupe_store::PgStore::connect_with(url, options).await?,
    ))
}

#[cfg(not(feature = "postgres"))]
async fn token_store_on_postgres(
    _config: &TroupeConfig,
    _url: &str,
) -> Result<Arc<dyn troupe_actors::ports::TokenStore>, AgentError> {
    Err(AgentError::invalid(NO_POSTGRES))
}

/// What a build without the `postgres` feature says when PostgreSQL is asked for.
#[cfg(not(feature = "postgres"))]
const NO_POSTGRES: &str = "this build of troupe has no PostgreSQL store (cargo feature \
     `postgres`); use [store] backend = \"sqlite\"";

fn open_sqlite(config: &TroupeConfig) -> Result<Storage, AgentError> {
    let lock = lock_data_dir(&config.data_dir)?;
    // Where the rollout goes is decided before the store creates troupe.db.
    let rollout_path = troupe_store::SqliteRolloutStorage::path_in(&config.data_dir)?;
    let durable = config.store.power_loss_durable;
    let store = troupe_store::SqliteStore::open_in_with(
        &config.data_dir,
        troupe_store::SqliteOptions {
            power_loss_durable: durable,
            ..Default::default()
        },
    )?;
    let path = troupe_store::db_path(&config.data_dir);
    let rollout = troupe_store::SqliteRolloutStorage::open_with(&rollout_path, durable)?;
    Ok(Storage {
        store: Arc::new(store),
        rollout: Some(Arc::new(rollout)),
        description: format!(
            "store: {}, rollout: {}",
            path.display(),
            rollout_path.display()
        ),
        cluster: None,
        lock: Some(lock),
    })
}

/// The PostgreSQL server the rollout is on: a cluster node's, or `[store] postgres_url`
/// when `[store] backend = "postgres"`; `None` when the rollout is the data directory's.
pub fn rollout_postgres_url(config: &TroupeConfig) -> Result<Option<String>, AgentError> {
    let node = config
        .cluster
        .node(&config.store)
        .map_err(|e| AgentError::invalid(e.to_string()))?;
    if let Some(node) = node {
        return Ok(Some(node.postgres_url));
    }
    match config.store.backend {
        troupe_runtime::config::StoreBackend::Sqlite => Ok(None),
        troupe_runtime::config::StoreBackend::Postgres => postgres_url(config).map(Some),
    }
}

/// The `[store] postgres_url`, or what to set.
pub fn postgres_url(config: &TroupeConfig) -> Result<String, AgentError> {
    config
        .store
        .postgres_url
        .clone()
        .filter(|u| !u.trim().is_empty())
        .ok_or_else(|| {
            AgentError::invalid(
                "[store] backend = \"postgres\" needs [store] postgres_url (or TROUPE_POSTGRES_URL)",
            )
        })
}

/// The store and the rollout on PostgreSQL at `url`; a node of a cluster (`node`) fences
/// both with its leases.
#[cfg(feature = "postgres")]
async fn open_postgres(
    config: &TroupeConfig,
    url: &str,
    node: Option<troupe_runtime::config::ClusterNode>,
) -> Result<Storage, AgentError> {
    let options = troupe_store::PgOptions {
        pool_size: config.store.postgres_pool_size,
        node: node.as_ref().map(|n| n.node.clone()),
        ..troupe_store::PgOptions::default()
    };
    let store = Arc::new(troupe_store::PgStore::connect_with(url, options).await?);
    let rollout = {
        let (url, fencing) = (url.to_owned(), store.fencing());
        tokio::task::spawn_blocking(move || {
            troupe_store::PgRolloutStorage::connect_fenced(&url, fencing)
        })
        .await
        .map_err(|e| AgentError::internal(format!("postgres rollout storage: {e}")))??
    };
    let mut description = format!(
        "store and rollout: PostgreSQL at {}",
        troupe_store::describe_pg_url(url)
    );
    if let Some(n) = &node {
        description.push_str(&format!(
            "; cluster node {} (session leases of {:?})",
            n.node, n.lease_ttl
        ));
    }
    Ok(Storage {
        cluster: node.map(|n| ClusterStorage {
            leases: store.clone(),
            lease_ttl: n.lease_ttl,
        }),
        store,
        rollout: Some(Arc::new(rollout)),
        description,
        lock: None,
    })
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(
    _config: &TroupeConfig,
    _url: &str,
    _node: Option<troupe_runtime::config::ClusterNode>,
) -> Result<Storage, AgentError> {
    Err(AgentError::invalid(NO_POSTGRES))
}

/// An API without tokens may only listen on loopback.
pub fn check_bind(open: bool, addr: SocketAddr) -> Result<(), AgentError> {
    if open && !addr.ip().is_loopback() {
        return Err(AgentError::invalid(format!(
            "refusing to serve {addr} without API tokens: configure [[server.tokens]] \
             (or TROUPE_API_TOKENS), or listen on a loopback address"
        )));
    }
    Ok(())
}

/// Fires `token` on SIGTERM or SIGINT. The handlers are in place when this returns, so a
/// signal sent right after start-up is not lost to the default action.
pub fn cancel_on_signals(token: CancellationToken) -> Result<(), AgentError> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let handler =
            |kind| signal(kind).map_err(|e| AgentError::internal(format!("signal handler: {e}")));
        let mut term = handler(SignalKind::terminate())?;
        let mut int = handler(SignalKind::interrupt())?;
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM"),
                _ = int.recv() => tracing::info!("SIGINT"),
            }
            token.cancel();
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        token.cancel();
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn extra_routes_are_public_or_behind_the_token() {
        use axum::routing::get;
        let dir = tempfile::tempdir().unwrap();
        let mut config = TroupeConfig {
            data_dir: dir.path().to_owned(),
            ..TroupeConfig::default()
        };
        config.server.tokens = vec![troupe_runtime::config::ApiToken {
            token: Some("t".into()),
            token_env: None,
            projects: vec!["*".into()],
        }];
        let ports = troupe_runtime::assembly::session_ports(
            &config,
            Arc::new(troupe_runtime::ScriptedModel::default()),
            Arc::new(troupe_actors::ports::ApproxTokens),
        );
        let store = Arc::new(troupe_store::memory::MemoryStore::new());
        let service = Service::start(&config, store, ports, None).await.unwrap();
        let app = service.router(ExtraRoutes {
            public: axum::Router::new().route("/card", get(|| async { "card" })),
            protected: axum::Router::new().route("/a2a", get(|| async { "a2a" })),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let http = reqwest::Client::new();
        let status = |path: &str, token: Option<&str>| {
            let mut r = http.get(format!("{base}{path}"));
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            async move { r.send().await.unwrap().status().as_u16() }
        };
        assert_eq!(status("/card", None).await, 200);
        assert_eq!(status("/a2a", None).await, 401);
        assert_eq!(status("/a2a", Some("t")).await, 200);
        service.shutdown().await;
    }

    #[test]
    fn open_apis_stay_on_loopback() {
        assert!(check_bind(true, "127.0.0.1:80".parse().unwrap()).is_ok());
        assert!(check_bind(true, "[::1]:80".parse().unwrap()).is_ok());
        assert!(check_bind(true, "0.0.0.0:80".parse().unwrap()).is_err());
        assert!(check_bind(false, "0.0.0.0:80".parse().unwrap()).is_ok());
    }
}
