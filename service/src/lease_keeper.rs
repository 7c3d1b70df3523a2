//! LeaseKeeper: keeps this node's session leases (see `troupe_store::leases`) renewed.
//!
//! ```text
//! Acquire ──► task: leases.acquire ──► Acquired ──► held (renewed from now on), reply
//! Tick (every ttl / 3) ──► task: renew each held lease ──► Renewed
//!        lost ones are dropped and reported on `lost`; the node must give those sessions up
//! Release ──► dropped from held ──► task: leases.release, reply
//! ```
//!
//! No store call runs in `handle`: acquisitions and renewal rounds run in tasks that report
//! back, so a slow database never queues the keeper's callers. One renewal round at a time: a
//! tick that comes while one runs is skipped. A lease renewed late (past its expiry) still
//! counts if no other node took it meanwhile: the fence decides, not the clock.
//!
//! Children: none. Supervised by the service's supervisor
//! ([`ServiceSupervisor`](super::supervisor)): if it fails, a new one starts and takes over
//! the leases the node still holds (the store keeps their fences: [`SessionLeases::held_fences`])
//! by renewing them at once, so the node's sessions keep their leases and new sessions can
//! start again. Callers reach the current keeper through a [`KeeperRef`], which follows
//! restarts.

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use troupe_actors::clock::Clock;
use troupe_proto::{AgentError, SessionId};
use troupe_store::{Acquired, Lease, SessionLeases};

/// Start-up arguments.
#[derive(Clone)]
pub struct LeaseKeeperArgs {
    pub leases: Arc<dyn SessionLeases>,
    /// How long a lease lasts without renewal.
    pub ttl: Duration,
    /// Where expiries are read from (tokio's clock, so paused-time tests drive it).
    pub clock: Clock,
    /// Sessions whose lease was lost (another node took them over): this node must stop
    /// serving them.
    pub lost: tokio::sync::mpsc::UnboundedSender<SessionId>,
}

/// The LeaseKeeper's mailbox.
pub enum LeaseKeeperMsg {
    /// Takes a session's lease and keeps it renewed; answers what the store answered.
    Acquire {
        session_id: SessionId,
        reply: RpcReplyPort<Result<Acquired, AgentError>>,
    },
    /// An acquisition ended.
    AcquireDone {
        session_id: SessionId,
        result: Result<Acquired, AgentError>,
        reply: RpcReplyPort<Result<Acquired, AgentError>>,
    },
    /// Stops renewing a session's lease and releases it.
    Release {
        session_id: SessionId,
        reply: RpcReplyPort<Result<(), AgentError>>,
    },
    /// Timer: renew every held lease.
    Tick,
    /// A renewal round ended, with each lease's outcome.
    Renewed {
        outcomes: Vec<(SessionId, Result<Lease, AgentError>)>,
    },
    /// The sessions held now, with their leases (observation, tests).
    Held {
        reply: RpcReplyPort<Vec<(SessionId, Lease)>>,
    },
    /// Fault injection: panics inside `handle`, to exercise its supervisor in tests and drills.
    InjectPanic,
}

/// The current lease keeper, as its supervisor publishes it (a restart replaces it: a
/// reference taken once would go stale).
#[derive(Clone)]
pub struct KeeperRef(tokio::sync::watch::Receiver<Option<ActorRef<LeaseKeeperMsg>>>);

/// How long a caller waits for a keeper being restarted.
const KEEPER_WAIT: Duration = Duration::from_secs(5);

impl KeeperRef {
    /// A reference following what `tx` publishes.
    pub fn new(rx: tokio::sync::watch::Receiver<Option<ActorRef<LeaseKeeperMsg>>>) -> Self {
        Self(rx)
    }

    /// The keeper running now, if one does.
    pub fn now(&self) -> Option<ActorRef<LeaseKeeperMsg>> {
        self.0.borrow().clone()
    }

    /// The keeper, waiting a little for one being restarted.
    pub async fn get(&self) -> Result<ActorRef<LeaseKeeperMsg>, AgentError> {
        let mut rx = self.0.clone();
        let waited = tokio::time::timeout(KEEPER_WAIT, rx.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(keeper)) => keeper
                .clone()
                .ok_or_else(|| AgentError::internal("no lease keeper runs")),
            _ => Err(AgentError::Overloaded {
                resource: "the lease keeper of this node (restarting)".into(),
                limit: 0,
            }),
        }
    }
}

/// The LeaseKeeper's state.
pub struct LeaseKeeperState {
    args: LeaseKeeperArgs,
    held: HashMap<SessionId, Lease>,
    /// A renewal round is running.
    renewing: bool,
}

/// The LeaseKeeper actor.
pub struct LeaseKeeper;

/// How often leases are renewed: three times per ttl, so two renewals may fail (a slow
/// database) before a lease expires.
pub fn renew_interval(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(10))
}

/// The leases a new keeper starts with: those the store still holds fences for (their
/// expiry unknown here: renewed at once).
pub fn adopted(fences: Vec<(SessionId, u64)>) -> HashMap<SessionId, Lease> {
    fences
        .into_iter()
        .map(|(s, fence)| {
            (
                s,
                Lease {
                    fence,
                    expires_ms: 0,
                },
            )
        })
        .collect()
}

/// What a renewal round changes at `now_ms`: the leases kept (with their new expiry) and the
/// sessions lost. A renewal that failed for another reason (the database unreachable) keeps
/// the lease as it was while it has not expired: the next round tries again, and the fence
/// refuses writes if it was taken. Once its expiry has passed without a renewal, another node
/// may hold it: the session is lost here too (a node cut off from the database stops running
/// it rather than running it beside its new owner).
pub fn settle_renewals(
    held: &mut HashMap<SessionId, Lease>,
    outcomes: Vec<(SessionId, Result<Lease, AgentError>)>,
    now_ms: u64,
) -> Vec<SessionId> {
    let mut lost = Vec::new();
    for (session_id, outcome) in outcomes {
        match outcome {
            Ok(lease) => {
                if let Some(h) = held.get_mut(&session_id) {
                    *h = lease;
                }
            }
            Err(AgentError::Interrupted { .. }) => {
                if held.remove(&session_id).is_some() {
                    lost.push(session_id);
                }
            }
            Err(error) => {
                let expired = held
                    .get(&session_id)
                    .is_some_and(|l| l.expires_ms != 0 && l.expires_ms <= now_ms);
                if expired {
                    tracing::warn!(%session_id, %error, "lease renewal failed past its expiry");
                    held.remove(&session_id);
                    lost.push(session_id);
                } else {
                    tracing::warn!(%session_id, %error, "lease renewal failed; trying again");
                }
            }
        }
    }
    lost
}

#[ractor::async_trait]
impl Actor for LeaseKeeper {
    type Msg = LeaseKeeperMsg;
    type State = LeaseKeeperState;
    type Arguments = LeaseKeeperArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: LeaseKeeperArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_interval(renew_interval(args.ttl), || LeaseKeeperMsg::Tick);
        // What an earlier keeper of this node held: renewed at once, not acquired again (the
        // fences stay those the sessions write under).
        let held = adopted(args.leases.held_fences());
        if !held.is_empty() {
            tracing::warn!(
                sessions = held.len(),
                node = args.leases.node(),
                "lease keeper started with leases held: renewing them"
            );
            myself.cast(LeaseKeeperMsg::Tick)?;
        }
        super::metrics::leases_held(held.len());
        Ok(LeaseKeeperState {
            args,
            held,
            renewing: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            LeaseKeeperMsg::Acquire { session_id, reply } => {
                let (leases, now, ttl) = (
                    state.args.leases.clone(),
                    state.args.clock.now_ms(),
                    state.args.ttl,
                );
                tokio::spawn(async move {
                    let result = leases.acquire(session_id, now, ttl).await;
                    let _ = myself.cast(LeaseKeeperMsg::AcquireDone {
                        session_id,
                        result,
                        reply,
                    });
                });
            }
            LeaseKeeperMsg::AcquireDone {
                session_id,
                result,
                reply,
            } => {
                if let Ok(Acquired::Granted { lease, .. }) = &result {
                    state.held.insert(session_id, *lease);
                    super::metrics::leases_held(state.held.len());
                }
                let _ = reply.send(result);
            }
            LeaseKeeperMsg::Release { session_id, reply } => {
                let released = state.held.remove(&session_id);
                super::metrics::leases_held(state.held.len());
                let leases = state.args.leases.clone();
                tokio::spawn(async move {
                    // The lease this keeper held, by its fence: a release that runs after the
                    // session was acquired again leaves the newer lease alone.
                    let result = match released {
                        Some(lease) => leases.release_fence(session_id, lease.fence).await,
                        None => leases.release(session_id).await,
                    };
                    let _ = reply.send(result);
                });
            }
            LeaseKeeperMsg::Tick => state.renew_all(&myself),
            LeaseKeeperMsg::Renewed { outcomes } => {
                state.renewing = false;
                let now = state.args.clock.now_ms();
                for session_id in settle_renewals(&mut state.held, outcomes, now) {
                    tracing::warn!(%session_id, node = state.args.leases.node(), "session lease lost: giving the session up");
                    let _ = state.args.lost.send(session_id);
                }
                super::metrics::leases_held(state.held.len());
            }
            LeaseKeeperMsg::Held { reply } => {
                let mut held: Vec<(SessionId, Lease)> =
                    state.held.iter().map(|(s, l)| (*s, *l)).collect();
                held.sort_by_key(|(s, _)| *s);
                let _ = reply.send(held);
            }
            LeaseKeeperMsg::InjectPanic => panic!("injected fault in the lease keeper"),
        }
        Ok(())
    }
}

impl LeaseKeeperState {
    fn renew_all(&mut self, myself: &ActorRef<LeaseKeeperMsg>) {
        if self.renewing || self.held.is_empty() {
            return;
        }
        self.renewing = true;
        let sessions: Vec<SessionId> = self.held.keys().copied().collect();
        let (leases, now, ttl) = (
            self.args.leases.clone(),
            self.args.clock.now_ms(),
            self.args.ttl,
        );
        let myself = myself.clone();
        tokio::spawn(async move {
            let outcomes = leases.renew_many(&sessions, now, ttl).await;
            let _ = myself.cast(LeaseKeeperMsg::Renewed { outcomes });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_renewed_three_times_per_ttl() {
        assert_eq!(
            renew_interval(Duration::from_secs(15)),
            Duration::from_secs(5)
        );
        assert_eq!(renew_interval(Duration::ZERO), Duration::from_millis(10));
    }

    #[test]
    fn a_new_keeper_adopts_the_fences_the_store_holds_to_renew_them_at_once() {
        let (a, b) = (SessionId::new(), SessionId::new());
        let held = adopted(vec![(a, 3), (b, 7)]);
        assert_eq!(held.len(), 2);
        assert_eq!(held[&a].fence, 3);
        assert_eq!(held[&b].fence, 7);
        assert!(adopted(Vec::new()).is_empty());
    }

    #[test]
    fn a_lost_lease_is_dropped_and_reported_once_and_a_failed_renewal_keeps_it() {
        let (a, b, c) = (SessionId::new(), SessionId::new(), SessionId::new());
        let lease = |fence, expires_ms| Lease { fence, expires_ms };
        let mut held: HashMap<SessionId, Lease> =
            [(a, lease(1, 10)), (b, lease(2, 10)), (c, lease(3, 10))].into();
        let lost = settle_renewals(
            &mut held,
            vec![
                (a, Ok(lease(1, 20))),
                (
                    b,
                    Err(AgentError::Interrupted {
                        reason: "lease lost".into(),
                    }),
                ),
                (c, Err(AgentError::internal("connection refused"))),
            ],
            5,
        );
        assert_eq!(lost, vec![b]);
        assert_eq!(held.get(&a), Some(&lease(1, 20)));
        assert_eq!(
            held.get(&c),
            Some(&lease(3, 10)),
            "kept: tried again next round"
        );
        assert!(!held.contains_key(&b));
        let again = settle_renewals(
            &mut held,
            vec![(
                b,
                Err(AgentError::Interrupted {
                    reason: "lease lost".into(),
                }),
            )],
            5,
        );
        assert!(again.is_empty(), "reported once");
        // Failing past its expiry (a node cut off from the database): lost here too.
        let cut_off = settle_renewals(
            &mut held,
            vec![(c, Err(AgentError::internal("connection refused")))],
            10,
        );
        assert_eq!(cut_off, vec![c]);
        assert!(!held.contains_key(&c));
    }
}

// A message of actors on this process only (see `local_message!`).
troupe_actors::local_message!(LeaseKeeperMsg);
