//! ServiceSupervisor: the root of the service's actors (O2).
//!
//! ```text
//! ServiceSupervisor
//! ├─ LeaseKeeper                  (a node of a cluster; restarted on failure, same limit)
//! └─ Registry                     (restarted on failure, at most RESTARTS_PER_WINDOW a window)
//!      └─ SessionHost × active sessions
//!           └─ Session (troupe-actors)
//! ```
//!
//! A new lease keeper renews at once the leases the node still holds (their fences are kept
//! by the store), and is published on a `watch` channel that the registry's
//! [`KeeperRef`](super::lease_keeper::KeeperRef) follows. One that keeps failing turns the
//! health `failed`, as the registry does.
//!
//! The A2A endpoint has a supervisor of its own (`a2a::supervisor`), which reports here when
//! it gives up (`ComponentFailed`), so the whole service's health says so.
//!
//! It publishes two things on `watch` channels, read by every caller at the moment of use:
//! the current [`Registry`] (a restart replaces it; a reference taken once would go stale)
//! and the service's [`Health`]. When the registry fails it starts a new one, which reloads
//! what it needs from the store (the sessions with unfinished messages). If that is
//! impossible (the registry does not start, or keeps failing), the health turns `failed`:
//! `/healthz` answers 503 with the reason, and `troupe serve` exits non-zero so that its
//! service manager restarts the process. A registry stopped on purpose (`Stop`) is not
//! restarted.

use super::lease_keeper::{LeaseKeeper, LeaseKeeperArgs, LeaseKeeperMsg};
use super::metrics;
use super::registry::{Registry, RegistryArgs, RegistryMsg};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use troupe_proto::AgentError;

/// At most this many registry restarts per [`RESTART_WINDOW`].
pub const RESTARTS_PER_WINDOW: usize = 5;
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// Whether the service can still do its work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ok,
    /// A component failed and could not be recovered; the process should exit.
    Failed {
        component: String,
        reason: String,
    },
}

/// Start-up arguments.
pub struct SupervisorArgs {
    pub registry: RegistryArgs,
    pub registry_tx: watch::Sender<Option<ActorRef<RegistryMsg>>>,
    pub health_tx: watch::Sender<Health>,
    /// A node of a cluster: its lease keeper, started before the registry.
    pub keeper: Option<KeeperSpec>,
}

/// How to start a node's lease keeper, and where to publish the one running.
pub struct KeeperSpec {
    pub args: LeaseKeeperArgs,
    pub tx: watch::Sender<Option<ActorRef<LeaseKeeperMsg>>>,
}

/// The supervisor's mailbox.
pub enum SupervisorMsg {
    /// Stops the registry for good (the service is shutting down).
    Stop { reply: RpcReplyPort<()> },
    /// Fault injection: makes the registry fail, to exercise its restart in tests and drills.
    FailRegistry,
    /// Fault injection: makes the lease keeper fail, to exercise its restart.
    FailLeaseKeeper,
    /// Another supervised part of the service (the A2A endpoint) failed for good.
    ComponentFailed {
        component: &'static str,
        reason: String,
    },
}

/// The supervisor's state.
pub struct SupervisorState {
    args: RegistryArgs,
    registry: Option<ActorRef<RegistryMsg>>,
    registry_tx: watch::Sender<Option<ActorRef<RegistryMsg>>>,
    health_tx: watch::Sender<Health>,
    restarts: Vec<Instant>,
    stopping: bool,
    keeper: Option<KeeperSpec>,
    keeper_ref: Option<ActorRef<LeaseKeeperMsg>>,
    keeper_restarts: Vec<Instant>,
}

/// The ServiceSupervisor actor.
pub struct ServiceSupervisor;

#[ractor::async_trait]
impl Actor for ServiceSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        metrics::service_healthy(true);
        let keeper_ref = match &args.keeper {
            Some(spec) => {
                let keeper = spawn_keeper(&myself, &spec.args).await?;
                spec.tx.send_replace(Some(keeper.clone()));
                Some(keeper)
            }
            None => None,
        };
        let registry = spawn_registry(&myself, &args.registry).await?;
        args.registry_tx.send_replace(Some(registry.clone()));
        Ok(SupervisorState {
            args: args.registry,
            registry: Some(registry),
            registry_tx: args.registry_tx,
            health_tx: args.health_tx,
            restarts: Vec::new(),
            stopping: false,
            keeper: args.keeper,
            keeper_ref,
            keeper_restarts: Vec::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Stop { reply } => {
                state.stopping = true;
                if let Some(registry) = state.registry.take() {
                    state.registry_tx.send_replace(None);
                    let _ = registry
                        .stop_and_wait(None, Some(Duration::from_secs(30)))
                        .await;
                }
                if let Some(keeper) = state.keeper_ref.take() {
                    if let Some(spec) = &state.keeper {
                        spec.tx.send_replace(None);
                    }
                    let _ = keeper
                        .stop_and_wait(None, Some(Duration::from_secs(5)))
                        .await;
                }
                let _ = reply.send(());
            }
            SupervisorMsg::FailLeaseKeeper => {
                if let Some(keeper) = &state.keeper_ref {
                    let _ = keeper.cast(LeaseKeeperMsg::InjectPanic);
                }
            }
            SupervisorMsg::FailRegistry => {
                if let Some(registry) = &state.registry {
                    let _ = registry.cast(RegistryMsg::InjectPanic);
                }
            }
            SupervisorMsg::ComponentFailed { component, reason } => {
                state.fail(component, reason);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let Some((cell, why)) = stopped_child(&event) else {
            return Ok(());
        };
        let is_keeper = state
            .keeper_ref
            .as_ref()
            .is_some_and(|k| k.get_id() == cell.get_id());
        if is_keeper && !state.stopping {
            state.restart_keeper(&myself, why).await;
            return Ok(());
        }
        let is_registry = state
            .registry
            .as_ref()
            .is_some_and(|r| r.get_id() == cell.get_id());
        if !is_registry || state.stopping {
            return Ok(());
        }
        tracing::error!(reason = %why, "sessions registry stopped; starting a new one");
        state.registry = None;
        state.registry_tx.send_replace(None);
        if !super::host::plan::may_restart(
            &mut state.restarts,
            Instant::now(),
            RESTARTS_PER_WINDOW,
            RESTART_WINDOW,
        ) {
            metrics::service_restart("registry", "given_up");
            state.fail(
                "registry",
                format!("the sessions registry keeps failing ({why})"),
            );
            return Ok(());
        }
        match spawn_registry(&myself, &state.args).await {
            Ok(registry) => {
                metrics::service_restart("registry", "restarted");
                tracing::warn!("sessions registry restarted");
                state.registry_tx.send_replace(Some(registry.clone()));
                state.registry = Some(registry);
            }
            Err(e) => {
                metrics::service_restart("registry", "given_up");
                state.fail(
                    "registry",
                    format!("the sessions registry could not be restarted: {e}"),
                );
            }
        }
        Ok(())
    }
}

async fn spawn_registry(
    myself: &ActorRef<SupervisorMsg>,
    args: &RegistryArgs,
) -> Result<ActorRef<RegistryMsg>, AgentError> {
    Actor::spawn_linked(None, Registry, args.clone(), myself.get_cell())
        .await
        .map(|(r, _)| r)
        .map_err(|e| AgentError::internal(format!("sessions registry failed to start: {e}")))
}

async fn spawn_keeper(
    myself: &ActorRef<SupervisorMsg>,
    args: &LeaseKeeperArgs,
) -> Result<ActorRef<LeaseKeeperMsg>, AgentError> {
    Actor::spawn_linked(None, LeaseKeeper, args.clone(), myself.get_cell())
        .await
        .map(|(k, _)| k)
        .map_err(|e| AgentError::internal(format!("lease keeper failed to start: {e}")))
}

impl SupervisorState {
    /// The lease keeper stopped: a new one takes over the leases the node holds.
    async fn restart_keeper(&mut self, myself: &ActorRef<SupervisorMsg>, why: String) {
        tracing::error!(reason = %why, "lease keeper stopped; starting a new one");
        self.keeper_ref = None;
        let Some(spec) = &self.keeper else {
            return;
        };
        spec.tx.send_replace(None);
        if !super::host::plan::may_restart(
            &mut self.keeper_restarts,
            Instant::now(),
            RESTARTS_PER_WINDOW,
            RESTART_WINDOW,
        ) {
            metrics::service_restart("lease_keeper", "given_up");
            self.fail(
                "lease_keeper",
                format!("the lease keeper keeps failing ({why})"),
            );
            return;
        }
        match spawn_keeper(myself, &spec.args).await {
            Ok(keeper) => {
                metrics::service_restart("lease_keeper", "restarted");
                tracing::warn!("lease keeper restarted");
                spec.tx.send_replace(Some(keeper.clone()));
                self.keeper_ref = Some(keeper);
            }
            Err(e) => {
                metrics::service_restart("lease_keeper", "given_up");
                self.fail(
                    "lease_keeper",
                    format!("the lease keeper could not be restarted: {e}"),
                );
            }
        }
    }

    fn fail(&self, component: &str, reason: String) {
        tracing::error!(component, %reason, "service unhealthy: it cannot recover by itself");
        metrics::service_healthy(false);
        self.health_tx.send_replace(Health::Failed {
            component: component.to_owned(),
            reason,
        });
    }
}

/// The child a supervision event says stopped, and why (its error, or its stop reason);
/// `None` for events that stop nothing.
pub(crate) fn stopped_child(event: &SupervisionEvent) -> Option<(&ractor::ActorCell, String)> {
    match event {
        SupervisionEvent::ActorFailed(cell, e) => Some((cell, e.to_string())),
        SupervisionEvent::ActorTerminated(cell, _, reason) => {
            Some((cell, reason.clone().unwrap_or_else(|| "stopped".into())))
        }
        _ => None,
    }
}

// A message of actors on this process only (see `local_message!`).
troupe_actors::local_message!(SupervisorMsg);
