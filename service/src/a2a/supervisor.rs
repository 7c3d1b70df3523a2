//! A2aSupervisor: keeps the endpoint's [`A2aTasks`] actor alive (O2).
//!
//! ```text
//! A2aSupervisor
//! └─ A2aTasks   (restarted on failure, at most RESTARTS_PER_WINDOW a window)
//! ```
//!
//! The current `A2aTasks` is published on a `watch` channel that the HTTP handlers read at
//! each request, so a restart is followed at once. A new `A2aTasks` starts over the same
//! session, store and writer, with the same settings, and takes the live records back from
//! the store (once the writer stored what the failed one queued): every task is still found;
//! one that troupe was running when the actor failed ends FAILED (its troupe task is
//! cancelled), as after a restart of the process. When it keeps
//! failing, the supervisor stops restarting it and calls its `give_up` hook: inside
//! `troupe serve` that turns the service's health to failed, so the process exits non-zero and
//! its service manager starts it again.

use super::A2aBackend;
use super::tasks::{A2aTasks, A2aTasksArgs, A2aTasksMsg, TasksConfig};
use crate::host::plan::may_restart;
use crate::metrics;
use crate::supervisor::stopped_child;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use troupe_proto::AgentError;

/// At most this many restarts of the A2A actor per [`RESTART_WINDOW`].
pub const RESTARTS_PER_WINDOW: usize = 5;
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// Called once when the supervisor gives up, with the reason.
pub type GiveUp = Arc<dyn Fn(String) + Send + Sync>;

/// Start-up arguments.
pub struct A2aSupervisorArgs {
    pub backend: Arc<dyn A2aBackend>,
    pub store: Arc<dyn troupe_store::Store>,
    pub persister: super::persist::Persister,
    pub config: TasksConfig,
    pub tasks_tx: watch::Sender<Option<ActorRef<A2aTasksMsg>>>,
    pub give_up: Option<GiveUp>,
}

/// The supervisor's mailbox.
pub enum A2aSupervisorMsg {
    /// Fault injection: makes the A2A actor fail, to exercise its restart in tests and drills.
    FailTasks,
}

/// The supervisor's state.
pub struct A2aSupervisorState {
    args: A2aSupervisorArgs,
    tasks: Option<ActorRef<A2aTasksMsg>>,
    restarts: Vec<Instant>,
}

/// The A2aSupervisor actor.
pub struct A2aSupervisor;

#[ractor::async_trait]
impl Actor for A2aSupervisor {
    type Msg = A2aSupervisorMsg;
    type State = A2aSupervisorState;
    type Arguments = A2aSupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<A2aSupervisorMsg>,
        args: A2aSupervisorArgs,
    ) -> Result<A2aSupervisorState, ActorProcessingErr> {
        let tasks = spawn_tasks(&myself, &args).await?;
        args.tasks_tx.send_replace(Some(tasks.clone()));
        Ok(A2aSupervisorState {
            args,
            tasks: Some(tasks),
            restarts: Vec::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<A2aSupervisorMsg>,
        msg: A2aSupervisorMsg,
        state: &mut A2aSupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            A2aSupervisorMsg::FailTasks => {
                if let Some(tasks) = &state.tasks {
                    let _ = tasks.cast(A2aTasksMsg::InjectPanic);
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<A2aSupervisorMsg>,
        event: SupervisionEvent,
        state: &mut A2aSupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let Some((cell, why)) = stopped_child(&event) else {
            return Ok(());
        };
        if state
            .tasks
            .as_ref()
            .is_none_or(|t| t.get_id() != cell.get_id())
        {
            return Ok(());
        }
        tracing::error!(reason = %why, "A2A actor stopped; starting a new one");
        state.tasks = None;
        state.args.tasks_tx.send_replace(None);
        if !may_restart(
            &mut state.restarts,
            Instant::now(),
            RESTARTS_PER_WINDOW,
            RESTART_WINDOW,
        ) {
            state.give_up(format!("the A2A endpoint keeps failing ({why})"));
            return Ok(());
        }
        match spawn_tasks(&myself, &state.args).await {
            Ok(tasks) => {
                metrics::service_restart("a2a", "restarted");
                state.args.tasks_tx.send_replace(Some(tasks.clone()));
                state.tasks = Some(tasks);
            }
            Err(e) => state.give_up(format!("the A2A endpoint could not be restarted: {e}")),
        }
        Ok(())
    }
}

async fn spawn_tasks(
    myself: &ActorRef<A2aSupervisorMsg>,
    args: &A2aSupervisorArgs,
) -> Result<ActorRef<A2aTasksMsg>, AgentError> {
    Actor::spawn_linked(
        None,
        A2aTasks,
        A2aTasksArgs {
            backend: args.backend.clone(),
            store: args.store.clone(),
            persister: args.persister.clone(),
            config: args.config.clone(),
        },
        myself.get_cell(),
    )
    .await
    .map(|(t, _)| t)
    .map_err(|e| AgentError::internal(format!("a2a tasks failed to start: {e}")))
}

impl A2aSupervisorState {
    fn give_up(&self, reason: String) {
        metrics::service_restart("a2a", "given_up");
        tracing::error!(%reason, "A2A endpoint left down");
        if let Some(give_up) = &self.args.give_up {
            give_up(reason);
        }
    }
}

// A message of actors on this process only (see `local_message!`).
troupe_actors::local_message!(A2aSupervisorMsg);
