//! Spawning the session's service actors (Rollout, McpPool, Scheduler, TaskRegistry,
//! ApprovalStore) as linked children, at start and when one is replaced.

use super::*;

pub(super) async fn spawn_rollout(
    session_id: SessionId,
    config: &SessionConfig,
    storage: Arc<dyn RolloutStorage>,
    clock: Clock,
    policies: Vec<(ConversationId, StoragePolicy)>,
    cell: &ActorCell,
) -> Result<ActorRef<RolloutMsg>, ActorProcessingErr> {
    let args = RolloutArgs {
        session_id,
        storage,
        clock,
        subscriber_capacity: config.subscriber_capacity,
        policies,
    };
    Ok(Actor::spawn_linked(None, Rollout, args, cell.clone())
        .await?
        .0)
}

pub(super) async fn spawn_mcp_pool(
    config: &SessionConfig,
    connector: Arc<dyn McpConnector>,
    model: Arc<dyn ModelClient>,
    clock: Clock,
    directory: &DirectoryWriter,
    cell: &ActorCell,
) -> Result<McpPoolHandle, ActorProcessingErr> {
    let args = McpPoolArgs {
        servers: config.mcp_servers.clone(),
        connector,
        events: Some(directory.events()),
        limits: config.mcp_limits,
        clock,
        roots: config.mcp_roots.clone(),
        approvals: Some(directory.directory().approvals()),
        model: Some(model),
    };
    Ok(McpPoolHandle::spawn(args, Some(cell.clone())).await?.0)
}

/// A scheduler; `recover_from`: the holders that may hold grants of the one it replaces.
pub(super) async fn spawn_scheduler(
    config: &SessionConfig,
    recover_from: Vec<ActorCell>,
    cell: &ActorCell,
) -> Result<ActorRef<SchedulerMsg>, ActorProcessingErr> {
    let start = SchedulerStart {
        args: config.scheduler.clone(),
        recover_from,
    };
    Ok(Actor::spawn_linked(None, Scheduler, start, cell.clone())
        .await?
        .0)
}

pub(super) async fn spawn_registry(
    cell: &ActorCell,
) -> Result<ActorRef<TaskRegistryMsg>, ActorProcessingErr> {
    Ok(
        Actor::spawn_linked(None, TaskRegistry, TaskRegistryArgs, cell.clone())
            .await?
            .0,
    )
}

pub(super) async fn spawn_approvals(
    config: &SessionConfig,
    clock: Clock,
    events: EventSink,
    cell: &ActorCell,
) -> Result<ActorRef<ApprovalMsg>, ActorProcessingErr> {
    let args = ApprovalStoreArgs {
        clock,
        sweep_interval: config.approval_sweep_interval,
        request_timeout: config.approval_timeout,
        events: Some(events),
    };
    Ok(Actor::spawn_linked(None, ApprovalStore, args, cell.clone())
        .await?
        .0)
}

/// The session's AgentHub, when it has agents (`None` without a definition).
pub(super) async fn spawn_agent_hub(
    session: &ActorRef<SessionMsg>,
    state: &SessionState,
) -> Result<Option<crate::agents::hub::HubRef>, ActorProcessingErr> {
    let Some(ports) = state.ports.agents.clone().filter(|p| !p.catalog.is_empty()) else {
        return Ok(None);
    };
    // A watched directory's definitions in force now, else those read at start: read once,
    // for the tasks' views and the hub alike.
    let catalog = ports
        .live
        .as_ref()
        .map_or_else(|| ports.catalog.clone(), |live| live.borrow().clone());
    let views = Arc::new(crate::agents::hub::AgentViews::new(
        catalog,
        &ports,
        &state.ports.model,
    ));
    let directory = state.directory.directory();
    let args = crate::agents::hub::AgentHubArgs {
        session_id: state.id,
        session: session.clone(),
        ports,
        env: crate::agents::ProviderEnv {
            session_id: state.id,
            events: directory.events(),
            approvals: directory.approvals(),
            clock: state.clock,
            data_dir: state.config.data_dir.clone(),
            approval_timeout: state.config.approval_timeout,
        },
        model: state.ports.model.clone(),
        storage_policy: state.config.root.storage_policy,
        views: views.clone(),
    };
    let (actor, _) =
        Actor::spawn_linked(None, crate::agents::hub::AgentHub, args, session.get_cell()).await?;
    Ok(Some(crate::agents::hub::HubRef { actor, views }))
}

/// Which service a failed child was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Service {
    Rollout,
    Scheduler,
    Registry,
    Approvals,
    McpPool,
    AgentHub,
}
