//! Registry: which sessions are active in this process, and the way to each (P1, O2).
//!
//! ```text
//! ServiceSupervisor
//! └─ Registry
//!      └─ SessionHost × active sessions   (each owns its session's store rows and queue)
//! ```
//!
//! Stored sessions are not started with the service: a session is **activated** (its
//! [`SessionHost`] spawned, which starts its actors) on its first use, or at start-up when
//! the store says it has unfinished messages. So start-up costs the same with ten sessions as
//! with a hundred thousand.
//!
//! The registry never waits for the store or for a session in `handle`: a lookup or a
//! creation runs in a spawned task that answers with a past-tense notification. It writes
//! nothing itself; the store's rows of a session are written by its host (and, for a new
//! session, by the task that creates it, before the host exists).
//!
//! # Mailbox
//! - `Host { scope, session_id }` → the host of a session the scope sees. Active: at once.
//!   Otherwise a task reads the session's record → `Looked` → spawn its host (linked) and
//!   answer every caller that waited for it. A session outside the scope is `NotFound`, like
//!   an unknown one.
//! - `Create` → a task starts the session and stores it with its root → `Created` → spawn
//!   its host, reply.
//! - `Drain` → every host stops starting messages; answered once none runs. New hosts start
//!   drained. `Shutdown` → every host shuts its session down.
//! - `Ping` → answered (the registry runs).
//! - `Scan` (at start, every lease ttl on a node of a cluster, and when the node transport
//!   says another node left or was lost) → a task reads the sessions with unfinished
//!   messages → `Pending` → each one not active is activated (as `Host`).
//! - `LeaseLost` (a node of a cluster: another node took a session over) → its host is
//!   forgotten and shut down; its writes are refused by the fence meanwhile.
//!
//! # Cluster
//! On a node of a cluster (`[cluster] node`), a session is activated only under its lease:
//! the activation's task reads the record, then takes the lease through the
//! [`LeaseKeeper`](super::lease_keeper) (a new session takes it before anything of it is
//! written). A session whose lease another live node holds is not activated here: the
//! caller gets `Overloaded` naming the owner. A node that died stops renewing its leases; once
//! they expire, the next request for one of its sessions, or the periodic `Scan` of sessions
//! with unfinished messages, takes it over here and restores it from the shared store and
//! rollout as after a restart (queued messages run, interrupted ones end `aborted`). A host
//! that stops gives its lease back; so does a shutdown, for every active session.
//!
//! # Failure
//! A host that stops or fails on its own is forgotten, and its session is activated again at
//! once from the store (its running message ends `aborted`, its queued ones run), at most
//! [`RESTARTS_PER_WINDOW`] times per [`RESTART_WINDOW`]; past that, its next use does.
//! If the registry itself fails, ractor stops its hosts and their sessions with it; its
//! supervisor ([`super::supervisor`]) starts a new one, which activates the sessions with
//! unfinished messages again, as at start-up.

use super::api::CreateSession;
use super::auth::Scope;
use super::host::{
    Created, HostArgs, HostMsg, RESTART_WINDOW, RESTARTS_PER_WINDOW, SessionHost, SessionTemplate,
    plan,
};
use super::lease_keeper::{KeeperRef, LeaseKeeperMsg};
use super::metrics;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;
use troupe_actors::SessionHandle;
use troupe_actors::clock::unix_now_ms as now_ms;
use troupe_proto::store::{ConversationRecord, ConversationState, SessionRecord, SessionStatus};
use troupe_proto::{AgentError, Json, SessionId};
use troupe_store::{Acquired, Store};

/// Start-up arguments.
#[derive(Clone)]
pub struct RegistryArgs {
    pub store: Arc<dyn Store>,
    pub template: SessionTemplate,
    /// Set on a node of a cluster: sessions are activated under their lease.
    pub cluster: Option<RegistryCluster>,
}

/// A node of a cluster, as its registry sees it.
#[derive(Clone)]
pub struct RegistryCluster {
    /// Takes, renews and releases this node's session leases (the current keeper: its
    /// supervisor replaces it after a failure).
    pub keeper: KeeperRef,
    /// Who holds which lease (read only: a scan skips the sessions of live nodes).
    pub leases: Arc<dyn troupe_store::SessionLeases>,
    /// How often the sessions with unfinished messages are looked at, to take over those
    /// whose owner is gone (the lease ttl).
    pub scan_every: Duration,
}

type Reply<T> = RpcReplyPort<Result<T, AgentError>>;

/// Why a session is activated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// A caller asked for it.
    Request,
    /// It has messages that were queued or running when the service stopped.
    Pending,
    /// Its host ended on its own (it failed, or was killed): what its session ran or queued
    /// is settled by the activation, as after a restart, without waiting for a caller.
    HostEnded,
}

impl Activation {
    pub const ALL: [Self; 3] = [Self::Request, Self::Pending, Self::HostEnded];

    pub const fn label(self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::Pending => "pending",
            Self::HostEnded => "host_ended",
        }
    }
}

/// Why the sessions with unfinished messages are looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanTrigger {
    /// The registry started.
    Start,
    /// Every lease ttl, on a node of a cluster.
    Periodic,
    /// Another node said it stopped and gave its leases back (the node transport).
    PeerLeft,
    /// Another node's transport connection dropped, and its leases can have expired since.
    PeerLost,
}

impl ScanTrigger {
    pub const ALL: [Self; 4] = [Self::Start, Self::Periodic, Self::PeerLeft, Self::PeerLost];

    pub const fn label(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Periodic => "periodic",
            Self::PeerLeft => "peer_left",
            Self::PeerLost => "peer_lost",
        }
    }
}

/// The registry's mailbox.
pub enum RegistryMsg {
    /// The host of a session the scope sees, activating the session if needed.
    Host {
        scope: Scope,
        session_id: SessionId,
        reply: Reply<ActorRef<HostMsg>>,
    },
    /// Creates a session and its root conversation.
    Create {
        scope: Scope,
        request: CreateSession,
        reply: Reply<SessionRecord>,
    },
    /// Stops admitting messages; answered once none runs.
    Drain { reply: RpcReplyPort<()> },
    /// Shuts every active session down.
    Shutdown { reply: RpcReplyPort<()> },
    /// Gives every lease of this node back (after `Shutdown` and the drain that stores the
    /// cancelled tasks' outcomes: those writes are fenced by the leases).
    ReleaseLeases { reply: RpcReplyPort<()> },
    /// Answered at once: the registry runs.
    Ping { reply: RpcReplyPort<()> },
    /// Looks for sessions with unfinished messages that no host here runs.
    Scan { trigger: ScanTrigger },
    /// The sessions with unfinished messages, as read by `Scan`.
    Pending { ids: Vec<SessionId> },
    /// Another node took this session over: its host must stop.
    LeaseLost { session_id: SessionId },
    /// A session's record was read for an activation.
    Looked {
        session_id: SessionId,
        result: Result<Option<SessionRecord>, AgentError>,
        why: Activation,
    },
    /// A lookup found a record the scope that asked does not see (see [`look_up`]).
    Hidden {
        session_id: SessionId,
        record: SessionRecord,
    },
    /// A new session runs and is stored.
    Created {
        record: SessionRecord,
        created: Created,
        reply: Reply<SessionRecord>,
    },
    /// Fault injection: panics inside `handle`, to exercise the supervisor in tests and drills.
    InjectPanic,
}

/// An active session.
struct Active {
    record: SessionRecord,
    host: ActorRef<HostMsg>,
}

/// A caller waiting for an activation.
struct Waiter {
    scope: Scope,
    reply: Reply<ActorRef<HostMsg>>,
}

/// The registry's state.
pub struct RegistryState {
    store: Arc<dyn Store>,
    template: SessionTemplate,
    active: HashMap<SessionId, Active>,
    by_actor: HashMap<ActorId, SessionId>,
    /// Activations whose record is being read, with the callers that wait for them.
    looking: HashMap<SessionId, Vec<Waiter>>,
    draining: bool,
    cluster: Option<RegistryCluster>,
    /// A `Scan` runs.
    scanning: bool,
    /// A scan asked for while one ran: it runs once that one ends (the running one may have
    /// read the leases before the node that left gave them back).
    rescan: Option<ScanTrigger>,
    /// When each session's host last ended on its own (newest last): one that keeps ending
    /// is left for the next caller instead of being activated again at once.
    host_ends: HashMap<SessionId, Vec<Instant>>,
}

/// The Registry actor.
pub struct Registry;

#[ractor::async_trait]
impl Actor for Registry {
    type Msg = RegistryMsg;
    type State = RegistryState;
    type Arguments = RegistryArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<RegistryMsg>,
        args: RegistryArgs,
    ) -> Result<RegistryState, ActorProcessingErr> {
        Ok(RegistryState {
            store: args.store,
            template: args.template,
            active: HashMap::new(),
            by_actor: HashMap::new(),
            looking: HashMap::new(),
            draining: false,
            cluster: args.cluster,
            scanning: false,
            rescan: None,
            host_ends: HashMap::new(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<RegistryMsg>,
        state: &mut RegistryState,
    ) -> Result<(), ActorProcessingErr> {
        // Sessions with unfinished messages are woken now; every other one waits for its
        // first use. On a node of a cluster, again every lease ttl: those of a node that died.
        myself.send_message(RegistryMsg::Scan {
            trigger: ScanTrigger::Start,
        })?;
        if let Some(cluster) = &state.cluster {
            myself.send_interval(cluster.scan_every, || RegistryMsg::Scan {
                trigger: ScanTrigger::Periodic,
            });
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<RegistryMsg>,
        msg: RegistryMsg,
        state: &mut RegistryState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RegistryMsg::Host {
                scope,
                session_id,
                reply,
            } => state.host(&myself, scope, session_id, reply),
            RegistryMsg::Looked {
                session_id,
                result,
                why,
            } => state.looked(&myself, session_id, result, why).await,
            RegistryMsg::Hidden { session_id, record } => {
                state.hidden(&myself, session_id, &record);
            }
            RegistryMsg::Create {
                scope,
                request,
                reply,
            } => state.create(&myself, &scope, request, reply),
            RegistryMsg::Created {
                record,
                created,
                reply,
            } => {
                let r = state.created(&myself, record, created).await;
                let _ = reply.send(r);
            }
            RegistryMsg::Drain { reply } => {
                state.draining = true;
                let hosts = state.hosts();
                tokio::spawn(async move {
                    futures::future::join_all(
                        hosts.iter().map(|h| async move {
                            ractor::call!(h, |r| HostMsg::Drain { reply: r })
                        }),
                    )
                    .await;
                    let _ = reply.send(());
                });
            }
            RegistryMsg::Shutdown { reply } => {
                state.draining = true;
                let hosts = state.hosts();
                tracing::info!(sessions = hosts.len(), "shutting sessions down");
                // Their leases stay until the cancelled tasks' outcomes are stored
                // (`ReleaseLeases`): every such write checks this node's fence.
                tokio::spawn(async move {
                    futures::future::join_all(hosts.iter().map(|h| async move {
                        ractor::call!(h, |r| HostMsg::Shutdown { reply: r })
                    }))
                    .await;
                    let _ = reply.send(());
                });
            }
            RegistryMsg::ReleaseLeases { reply } => {
                // Another node may take these sessions over at once.
                let owned: Vec<SessionId> = state.active.keys().copied().collect();
                let keeper = state.cluster.as_ref().map(|c| c.keeper.clone());
                tokio::spawn(async move {
                    if let Some(keeper) = keeper {
                        futures::future::join_all(
                            owned.into_iter().map(|id| release(keeper.clone(), id)),
                        )
                        .await;
                    }
                    let _ = reply.send(());
                });
            }
            RegistryMsg::Ping { reply } => {
                let _ = reply.send(());
            }
            RegistryMsg::Scan { trigger } => state.scan(&myself, trigger),
            RegistryMsg::Pending { ids } => state.pending(&myself, ids),
            RegistryMsg::LeaseLost { session_id } => state.lease_lost(session_id),
            RegistryMsg::InjectPanic => panic!("injected fault in the sessions registry"),
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<RegistryMsg>,
        event: SupervisionEvent,
        state: &mut RegistryState,
    ) -> Result<(), ActorProcessingErr> {
        // A host never stops by itself, and the registry forgets one before it stops it (a
        // lost lease): a host it still knows ended on its own.
        let (cell, why) = match event {
            SupervisionEvent::ActorFailed(cell, error) => (cell, error.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.unwrap_or_else(|| "stopped".into()))
            }
            _ => return Ok(()),
        };
        if let Some(session_id) = state.forget(cell.get_id()) {
            state.host_ended(&myself, session_id, &why);
        }
        Ok(())
    }
}

/// The record of a session if `scope` sees it; `NotFound` otherwise, as for an unknown id.
pub fn visible(
    scope: &Scope,
    session_id: SessionId,
    record: Option<SessionRecord>,
) -> Result<SessionRecord, AgentError> {
    record
        .filter(|r| scope.sees(r.project_id.as_deref()))
        .ok_or_else(|| AgentError::not_found("session", session_id))
}

/// The error of a session another live node owns.
pub fn owned_elsewhere(session_id: SessionId, owner: &str) -> AgentError {
    AgentError::Overloaded {
        resource: format!("session {session_id} (owned by node {owner}; ask that node)"),
        limit: 0,
    }
}

/// Takes a session's lease through the keeper: `Ok` when this node holds it now.
async fn acquire(keeper: &KeeperRef, session_id: SessionId) -> Result<(), AgentError> {
    let keeper = keeper.get().await?;
    let answer = ractor::call!(keeper, |reply| LeaseKeeperMsg::Acquire {
        session_id,
        reply
    })
    .map_err(|e| AgentError::internal(format!("lease keeper: {e}")))??;
    match answer {
        Acquired::Granted { from, .. } => {
            if let Some(from) = from {
                tracing::warn!(%session_id, %from, "session taken over from another node");
            }
            Ok(())
        }
        Acquired::Held { owner, .. } => Err(owned_elsewhere(session_id, &owner)),
    }
}

/// Gives a session's lease back (a failure is logged: the lease then expires on its own).
async fn release(keeper: KeeperRef, session_id: SessionId) {
    let keeper = match keeper.get().await {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(%session_id, error = %e, "session lease not released");
            return;
        }
    };
    match ractor::call!(keeper, |reply| LeaseKeeperMsg::Release {
        session_id,
        reply
    }) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(%session_id, error = %e, "session lease not released"),
        Err(e) => tracing::warn!(%session_id, error = %e, "session lease not released"),
    }
}

/// Reads a session's record for its activation; on a node of a cluster, then takes its lease
/// (an unknown id takes none). Held by another node: [`owned_elsewhere`]. A record `scope`
/// does not see is `Err(record)`: nothing is activated or leased for it.
async fn look_up(
    store: &dyn Store,
    keeper: Option<&KeeperRef>,
    session_id: SessionId,
    scope: &Scope,
) -> Result<Result<Option<SessionRecord>, SessionRecord>, AgentError> {
    let record = store.get_session(session_id).await?;
    if let Some(r) = record
        .as_ref()
        .filter(|r| !scope.sees(r.project_id.as_deref()))
    {
        return Ok(Err(r.clone()));
    }
    if let (Some(keeper), Some(_)) = (keeper, &record) {
        acquire(keeper, session_id).await?;
    }
    Ok(Ok(record))
}

/// Starts a new session and stores it with its root conversation (the store's rows exist
/// before anyone can see the session). On a node of a cluster its lease is taken first.
async fn start_new(
    template: SessionTemplate,
    project_id: Option<String>,
    request: CreateSession,
    store: Arc<dyn Store>,
    keeper: Option<KeeperRef>,
) -> Result<(SessionRecord, Created), AgentError> {
    let mut config = template.config;
    if let Some(root) = request.root {
        config.root = root;
    }
    let root_params = config.root.clone();
    let session_id = SessionId::new();
    if let Some(keeper) = &keeper {
        acquire(keeper, session_id).await?;
    }
    let (handle, _join) = SessionHandle::start(session_id, config, template.ports).await?;
    let stored = async {
        let root_id = handle.root().await?;
        let created_ms = now_ms();
        let record = SessionRecord {
            session_id,
            project_id,
            title: request.title,
            created_ms,
            root_conversation_id: root_id,
            settings: request
                .settings
                .unwrap_or_else(|| Json(serde_json::json!({}))),
            status: SessionStatus::Active,
            updated_ms: created_ms,
        };
        let root = ConversationRecord {
            conversation_id: root_id,
            session_id,
            params: root_params,
            is_root: true,
            state: ConversationState::Open,
            created_ms,
            closed_ms: None,
        };
        store.create_session(record.clone()).await?;
        store.put_conversation(root.clone()).await?;
        // As stored (the root's write moved `updated_ms`): every view shows the same record.
        let record = store.get_session(session_id).await?.unwrap_or(record);
        Ok::<_, AgentError>((record, root))
    };
    match stored.await {
        Ok((record, root)) => {
            tracing::info!(%session_id, project_id = ?record.project_id, "session created");
            Ok((record, Created { handle, root }))
        }
        Err(e) => {
            tracing::error!(%session_id, error = %e, "session not stored");
            let _ = handle.shutdown().await;
            if let Some(keeper) = keeper {
                release(keeper, session_id).await;
            }
            Err(e)
        }
    }
}

impl RegistryState {
    fn hosts(&self) -> Vec<ActorRef<HostMsg>> {
        self.active.values().map(|a| a.host.clone()).collect()
    }

    /// Forgets a host that stopped; its lease goes back (on a node of a cluster).
    fn forget(&mut self, actor: ActorId) -> Option<SessionId> {
        let session_id = self.by_actor.remove(&actor)?;
        if self
            .active
            .get(&session_id)
            .is_some_and(|a| a.host.get_id() == actor)
        {
            self.active.remove(&session_id);
            if let Some(cluster) = &self.cluster {
                tokio::spawn(release(cluster.keeper.clone(), session_id));
            }
        }
        Some(session_id)
    }

    fn keeper(&self) -> Option<KeeperRef> {
        self.cluster.as_ref().map(|c| c.keeper.clone())
    }

    fn scan(&mut self, myself: &ActorRef<RegistryMsg>, trigger: ScanTrigger) {
        if self.draining {
            return;
        }
        if self.scanning {
            self.rescan = Some(trigger);
            return;
        }
        metrics::session_scan(trigger.label());
        self.scanning = true;
        let store = self.store.clone();
        let leases = self.cluster.as_ref().map(|c| c.leases.clone());
        let myself = myself.clone();
        tokio::spawn(async move {
            let ids = store.sessions_with_pending_messages().await;
            // On a node of a cluster, only those no live node holds: no lease is asked for
            // the sessions the other nodes run.
            let ids = match (ids, leases) {
                (Ok(ids), Some(leases)) => leases.not_held_elsewhere(ids, now_ms()).await,
                (ids, _) => ids,
            };
            let ids = match ids {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::error!(error = %e, "sessions with unfinished messages could not be read");
                    Vec::new()
                }
            };
            let _ = myself.cast(RegistryMsg::Pending { ids });
        });
    }

    /// Activates every session of `ids` that is neither active nor being activated, one
    /// after the other in one task.
    fn pending(&mut self, myself: &ActorRef<RegistryMsg>, ids: Vec<SessionId>) {
        self.scanning = false;
        if let Some(trigger) = self.rescan.take() {
            self.scan(myself, trigger);
        }
        self.activate_all(myself, ids, Activation::Pending);
    }

    /// A host ended on its own: its session is activated again at once (its running message
    /// ends `aborted`, its queued ones run), unless the service drains or the session's host
    /// ended [`RESTARTS_PER_WINDOW`] times in the last [`RESTART_WINDOW`]: then the next
    /// caller, or the next start, activates it.
    fn host_ended(&mut self, myself: &ActorRef<RegistryMsg>, session_id: SessionId, why: &str) {
        if self.draining {
            tracing::debug!(%session_id, why, "session host stopped");
            return;
        }
        let now = Instant::now();
        self.host_ends.retain(|_, ends| {
            ends.last()
                .is_some_and(|t| now.duration_since(*t) < RESTART_WINDOW)
        });
        let ends = self.host_ends.entry(session_id).or_default();
        if !plan::may_restart(ends, now, RESTARTS_PER_WINDOW, RESTART_WINDOW) {
            tracing::error!(%session_id, why, "session host keeps ending; the next use activates it again");
            return;
        }
        tracing::error!(%session_id, why, "session host ended on its own; activating it again");
        self.activate_all(myself, vec![session_id], Activation::HostEnded);
    }

    /// Activates every session of `ids` that is neither active nor being activated, one
    /// after the other in one task.
    fn activate_all(
        &mut self,
        myself: &ActorRef<RegistryMsg>,
        ids: Vec<SessionId>,
        why: Activation,
    ) {
        let ids: Vec<SessionId> = ids
            .into_iter()
            .filter(|id| !self.active.contains_key(id) && !self.looking.contains_key(id))
            .collect();
        if ids.is_empty() {
            return;
        }
        tracing::info!(
            sessions = ids.len(),
            reason = why.label(),
            "sessions to activate"
        );
        for id in &ids {
            self.looking.insert(*id, Vec::new());
        }
        let (store, keeper, myself) = (self.store.clone(), self.keeper(), myself.clone());
        tokio::spawn(async move {
            for session_id in ids {
                let result = look_up(store.as_ref(), keeper.as_ref(), session_id, &Scope::All)
                    .await
                    .map(|found| found.unwrap_or_else(Some));
                let _ = myself.cast(RegistryMsg::Looked {
                    session_id,
                    result,
                    why,
                });
            }
        });
    }

    /// Another node took the session over: its host is forgotten (its lease is not given
    /// back: it is not this node's any more) and shut down.
    fn lease_lost(&mut self, session_id: SessionId) {
        let Some(active) = self.active.remove(&session_id) else {
            return;
        };
        self.by_actor.remove(&active.host.get_id());
        tracing::warn!(%session_id, "session lease lost: its host stops");
        let host = active.host;
        tokio::spawn(async move {
            let _ = ractor::call_t!(host, |r| HostMsg::Shutdown { reply: r }, 10_000);
            host.stop(Some("session lease lost".into()));
        });
    }

    fn host(
        &mut self,
        myself: &ActorRef<RegistryMsg>,
        scope: Scope,
        session_id: SessionId,
        reply: Reply<ActorRef<HostMsg>>,
    ) {
        if let Some(active) = self.active.get(&session_id) {
            let answer = visible(&scope, session_id, Some(active.record.clone()))
                .map(|_| active.host.clone());
            let _ = reply.send(answer);
            return;
        }
        let asker = scope.clone();
        let waiter = Waiter { scope, reply };
        if let Some(waiters) = self.looking.get_mut(&session_id) {
            waiters.push(waiter);
            return;
        }
        self.looking.insert(session_id, vec![waiter]);
        let (store, keeper) = (self.store.clone(), self.keeper());
        let myself = myself.clone();
        tokio::spawn(
            async move {
                // In the scope of the request that asked first: another project's session is
                // neither activated nor leased for it.
                let found = look_up(store.as_ref(), keeper.as_ref(), session_id, &asker).await;
                let msg = match found {
                    Ok(Err(record)) => RegistryMsg::Hidden { session_id, record },
                    result => RegistryMsg::Looked {
                        session_id,
                        result: result.map(|found| found.unwrap_or_else(Some)),
                        why: Activation::Request,
                    },
                };
                let _ = myself.cast(msg);
            }
            .in_current_span(),
        );
    }

    /// A lookup found a record the asking scope does not see: that request is answered as
    /// for an unknown id; requests that joined it and see the session ask again in their
    /// own scope.
    fn hidden(
        &mut self,
        myself: &ActorRef<RegistryMsg>,
        session_id: SessionId,
        record: &SessionRecord,
    ) {
        for w in self.looking.remove(&session_id).unwrap_or_default() {
            if w.scope.sees(record.project_id.as_deref()) {
                let _ = myself.cast(RegistryMsg::Host {
                    scope: w.scope,
                    session_id,
                    reply: w.reply,
                });
            } else {
                let _ = w
                    .reply
                    .send(Err(AgentError::not_found("session", session_id)));
            }
        }
    }

    async fn looked(
        &mut self,
        myself: &ActorRef<RegistryMsg>,
        session_id: SessionId,
        result: Result<Option<SessionRecord>, AgentError>,
        why: Activation,
    ) {
        let waiters = self.looking.remove(&session_id).unwrap_or_default();
        let host = match (self.active.get(&session_id), result) {
            (Some(active), _) => Ok(Some((active.record.clone(), active.host.clone()))),
            (None, Ok(Some(record))) => {
                self.spawn_host(myself, record.clone(), None)
                    .await
                    .map(|host| {
                        metrics::session_activated(why.label());
                        Some((record, host))
                    })
            }
            (None, Ok(None)) => Ok(None),
            (None, Err(e)) => Err(e),
        };
        for w in waiters {
            let answer = match &host {
                Ok(found) => visible(&w.scope, session_id, found.as_ref().map(|f| f.0.clone()))
                    .and_then(|_| {
                        found
                            .as_ref()
                            .map(|f| f.1.clone())
                            .ok_or_else(|| AgentError::not_found("session", session_id))
                    }),
                Err(e) => Err(e.clone()),
            };
            let _ = w.reply.send(answer);
        }
    }

    async fn spawn_host(
        &mut self,
        myself: &ActorRef<RegistryMsg>,
        record: SessionRecord,
        created: Option<Created>,
    ) -> Result<ActorRef<HostMsg>, AgentError> {
        let session_id = record.session_id;
        let args = HostArgs {
            record: record.clone(),
            store: self.store.clone(),
            template: self.template.clone(),
            created,
            draining: self.draining,
        };
        let (host, _) = Actor::spawn_linked(None, SessionHost, args, myself.get_cell())
            .await
            .map_err(|e| AgentError::internal(format!("session host failed to start: {e}")))?;
        self.by_actor.insert(host.get_id(), session_id);
        self.active.insert(
            session_id,
            Active {
                record,
                host: host.clone(),
            },
        );
        Ok(host)
    }

    fn create(
        &self,
        myself: &ActorRef<RegistryMsg>,
        scope: &Scope,
        request: CreateSession,
        reply: Reply<SessionRecord>,
    ) {
        let project_id = match scope.project_for_new(request.project_id.clone()) {
            Ok(p) => p,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        if self.draining {
            let _ = reply.send(Err(AgentError::Overloaded {
                resource: "service (shutting down)".into(),
                limit: 0,
            }));
            return;
        }
        let template = self.template.clone();
        let store = self.store.clone();
        let keeper = self.keeper();
        let myself = myself.clone();
        tokio::spawn(
            async move {
                match start_new(template, project_id, request, store, keeper).await {
                    Ok((record, created)) => {
                        if let Err(e) = myself.cast(RegistryMsg::Created {
                            record,
                            created,
                            reply,
                        }) {
                            tracing::error!(error = %e, "registry gone before a new session was registered");
                        }
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            .in_current_span(),
        );
    }

    async fn created(
        &mut self,
        myself: &ActorRef<RegistryMsg>,
        record: SessionRecord,
        created: Created,
    ) -> Result<SessionRecord, AgentError> {
        let handle = created.handle.clone();
        match self.spawn_host(myself, record.clone(), Some(created)).await {
            Ok(_) => Ok(record),
            Err(e) => {
                tokio::spawn(async move {
                    let _ = handle.shutdown().await;
                });
                Err(e)
            }
        }
    }
}

// A message of actors on this process only (see `local_message!`).
troupe_actors::local_message!(RegistryMsg);
