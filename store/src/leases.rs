//! Session leases with fencing tokens: which node owns a session, for how long, and the token
//! (`fence`) that every write it makes for that session carries.
//!
//! On PostgreSQL ([`crate::PgStore`] with a node name) a lease is a row of `session_leases`:
//! its owner, its fence and its expiry. Acquiring a session takes a free or expired lease and
//! bumps its fence (a takeover when another node held it); renewing extends the lease only if
//! its fence is still the one this node holds; releasing expires it and keeps its fence. Every
//! write about the session checks, in its own transaction, that the fence this node holds is
//! the lease's: a node that was paused or partitioned while another took the session over has
//! its writes refused (`Interrupted`, "lease lost"), however late it comes back. Fences only
//! grow, so a lease that changed hands never looks like the one a node held before.
//!
//! Expiries are compared with the caller's clock (`now_ms`): nodes are expected to keep their
//! clocks in step (NTP). A skew moves the moment another node may take over, never safety:
//! the fence refuses the old owner's writes from the takeover on.
//!
//! SQLite is single-node: [`SingleNode`] grants every lease (fence 0) and checks nothing.

use async_trait::async_trait;
use metrics::{Unit, counter, describe_counter};
use std::time::Duration;
use troupe_proto::{AgentError, SessionId};

/// Lease acquisitions, by outcome (`granted`, `held`: another node holds it).
pub const ACQUISITIONS: &str = "troupe_lease_acquisitions_total";
/// Leases taken over from another node whose lease had expired.
pub const TAKEOVERS: &str = "troupe_lease_takeovers_total";
/// Lease renewals, by outcome (`renewed`, `lost`: another node took the session over).
pub const RENEWALS: &str = "troupe_lease_renewals_total";
/// Writes refused because this node no longer holds the session's lease.
pub const REFUSED_WRITES: &str = "troupe_lease_refused_writes_total";

/// Registers the descriptions; every series exists at 0 from the start.
pub fn describe() {
    describe_counter!(
        ACQUISITIONS,
        Unit::Count,
        "Session lease acquisitions by this node, by outcome (granted; held: another node holds it)."
    );
    describe_counter!(
        TAKEOVERS,
        Unit::Count,
        "Session leases this node took over from another node whose lease had expired."
    );
    describe_counter!(
        RENEWALS,
        Unit::Count,
        "Session lease renewals by this node, by outcome (renewed; lost: another node took the session over)."
    );
    describe_counter!(
        REFUSED_WRITES,
        Unit::Count,
        "Writes of this node refused because the session's lease (its fencing token) is no longer the one it holds."
    );
    for outcome in ["granted", "held"] {
        counter!(ACQUISITIONS, "outcome" => outcome).increment(0);
    }
    for outcome in ["renewed", "lost"] {
        counter!(RENEWALS, "outcome" => outcome).increment(0);
    }
    counter!(TAKEOVERS).increment(0);
    counter!(REFUSED_WRITES).increment(0);
}

/// A lease this node holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub fence: u64,
    pub expires_ms: u64,
}

/// The answer to an acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// This node holds the session now; `from` names the node it was taken over from.
    Granted { lease: Lease, from: Option<String> },
    /// Another node holds it until `expires_ms`.
    Held { owner: String, expires_ms: u64 },
}

/// Who owns which session, and for how long.
#[async_trait]
pub trait SessionLeases: Send + Sync {
    /// This node's name (the leases' owner).
    fn node(&self) -> &str;

    /// Takes the session's lease if it is free, expired at `now_ms`, or this node's; a new
    /// fence either way (so an earlier holding of this node cannot write either).
    async fn acquire(
        &self,
        session_id: SessionId,
        now_ms: u64,
        ttl: Duration,
    ) -> Result<Acquired, AgentError>;

    /// Extends the lease this node holds to `now_ms + ttl`; `Interrupted` ("lease lost") when
    /// another node took the session over meanwhile (this node then holds nothing for it).
    async fn renew(
        &self,
        session_id: SessionId,
        now_ms: u64,
        ttl: Duration,
    ) -> Result<Lease, AgentError>;

    /// Gives the session up: its lease expires now, its fence stays.
    async fn release(&self, session_id: SessionId) -> Result<(), AgentError>;

    /// Gives up the lease of `fence` only: when this node acquired the session again
    /// meanwhile (a newer fence), that newer lease stays held and unexpired.
    async fn release_fence(&self, session_id: SessionId, fence: u64) -> Result<(), AgentError> {
        let _ = fence;
        self.release(session_id).await
    }

    /// Whether this node holds the session's lease, unexpired at `now_ms` by its last
    /// acquisition or renewal: answered from memory, without a query (one node alone:
    /// `false`, nothing is held).
    fn holds(&self, _session_id: SessionId, _now_ms: u64) -> bool {
        false
    }

    /// The sessions this node holds a fence for (acquired, not released nor lost), with that
    /// fence: what a new lease keeper renews after the previous one failed.
    fn held_fences(&self) -> Vec<(SessionId, u64)> {
        Vec::new()
    }

    /// [`renew`](Self::renew) for many leases at once (PostgreSQL: one statement), each
    /// with its outcome.
    async fn renew_many(
        &self,
        sessions: &[SessionId],
        now_ms: u64,
        ttl: Duration,
    ) -> Vec<(SessionId, Result<Lease, AgentError>)> {
        let mut out = Vec::with_capacity(sessions.len());
        for &session_id in sessions {
            out.push((session_id, self.renew(session_id, now_ms, ttl).await));
        }
        out
    }

    /// Publishes where this node answers its API (`http://host:port`), for the other nodes
    /// to forward calls for its sessions. One node alone: nothing to publish.
    async fn publish_api(&self, _api_url: &str, _now_ms: u64) -> Result<(), AgentError> {
        Ok(())
    }

    /// Those of `sessions` that no other node holds an unexpired lease on at `now_ms`: the
    /// ones this node may take (one alone: all of them).
    async fn not_held_elsewhere(
        &self,
        sessions: Vec<SessionId>,
        _now_ms: u64,
    ) -> Result<Vec<SessionId>, AgentError> {
        Ok(sessions)
    }

    /// The live node (its heartbeat after `alive_after_ms`) owning the fewest sessions at
    /// `now_ms` (ties at random), with its API address: where a new session goes.
    async fn least_loaded(
        &self,
        _now_ms: u64,
        _alive_after_ms: u64,
    ) -> Result<Option<(String, String)>, AgentError> {
        Ok(None)
    }

    /// The node whose lease on the session is unexpired at `now_ms`, with the API address it
    /// published (`None` when it published none); `None`: no node holds it.
    async fn owner_of(
        &self,
        _session_id: SessionId,
        _now_ms: u64,
    ) -> Result<Option<(String, Option<String>)>, AgentError> {
        Ok(None)
    }
}

/// One node alone (SQLite): every lease is granted, nothing is checked.
#[derive(Debug, Clone, Default)]
pub struct SingleNode;

#[async_trait]
impl SessionLeases for SingleNode {
    fn node(&self) -> &str {
        "local"
    }

    async fn acquire(
        &self,
        _session_id: SessionId,
        now_ms: u64,
        ttl: Duration,
    ) -> Result<Acquired, AgentError> {
        Ok(Acquired::Granted {
            lease: Lease {
                fence: 0,
                expires_ms: expiry(now_ms, ttl),
            },
            from: None,
        })
    }

    async fn renew(
        &self,
        _session_id: SessionId,
        now_ms: u64,
        ttl: Duration,
    ) -> Result<Lease, AgentError> {
        Ok(Lease {
            fence: 0,
            expires_ms: expiry(now_ms, ttl),
        })
    }

    async fn release(&self, _session_id: SessionId) -> Result<(), AgentError> {
        Ok(())
    }
}

/// `now_ms + ttl`, saturating.
pub fn expiry(now_ms: u64, ttl: Duration) -> u64 {
    now_ms.saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
}

/// Whether a write of `node` for a session may commit: the node holds a fence for it
/// (`held`) and the session's lease row (`owner`, `fence`) still says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceVerdict {
    Allowed,
    /// Refused, and why (for the error).
    Refused(String),
}

pub fn fence_verdict(node: &str, held: Option<u64>, lease: Option<(&str, u64)>) -> FenceVerdict {
    match (held, lease) {
        (Some(mine), Some((owner, fence))) if owner == node && fence == mine => {
            FenceVerdict::Allowed
        }
        (None, _) => FenceVerdict::Refused(format!("node {node} holds no lease for it")),
        (Some(mine), None) => FenceVerdict::Refused(format!(
            "node {node} holds fence {mine} but no lease exists"
        )),
        (Some(mine), Some((owner, fence))) => FenceVerdict::Refused(format!(
            "node {node} holds fence {mine}, but the lease is {owner}'s with fence {fence}"
        )),
    }
}

/// The error of a refused write.
pub fn lease_lost(session_id: &str, why: &str) -> AgentError {
    counter!(REFUSED_WRITES).increment(1);
    AgentError::Interrupted {
        reason: format!("lease lost: write for session {session_id} refused: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_holder_of_the_current_fence_writes() {
        assert_eq!(
            fence_verdict("a", Some(3), Some(("a", 3))),
            FenceVerdict::Allowed
        );
        for (held, lease) in [
            (Some(3), Some(("b", 4))), // taken over
            (Some(3), Some(("a", 4))), // this node again, a later holding
            (None, Some(("a", 3))),    // never acquired here
            (Some(3), None),
        ] {
            assert!(
                matches!(fence_verdict("a", held, lease), FenceVerdict::Refused(_)),
                "{held:?} {lease:?}"
            );
        }
        let FenceVerdict::Refused(why) = fence_verdict("a", Some(1), Some(("b", 2))) else {
            panic!()
        };
        assert!(why.contains("b's with fence 2"), "{why}");
    }

    #[test]
    fn every_lease_series_exists_at_zero_from_the_start() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, describe);
        let mut series: Vec<String> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                assert_eq!(value, DebugValue::Counter(0));
                let labels: Vec<String> =
                    key.key().labels().map(|l| l.value().to_owned()).collect();
                format!("{}{labels:?}", key.key().name())
            })
            .collect();
        series.sort();
        assert_eq!(
            series,
            [
                r#"troupe_lease_acquisitions_total["granted"]"#,
                r#"troupe_lease_acquisitions_total["held"]"#,
                "troupe_lease_refused_writes_total[]",
                r#"troupe_lease_renewals_total["lost"]"#,
                r#"troupe_lease_renewals_total["renewed"]"#,
                "troupe_lease_takeovers_total[]",
            ]
        );
    }

    #[tokio::test]
    async fn a_single_node_is_granted_everything() {
        let leases = SingleNode;
        let s = SessionId::new();
        let got = leases.acquire(s, 1_000, Duration::from_secs(2)).await;
        assert_eq!(
            got.unwrap(),
            Acquired::Granted {
                lease: Lease {
                    fence: 0,
                    expires_ms: 3_000
                },
                from: None
            }
        );
        assert_eq!(
            leases
                .renew(s, 5_000, Duration::from_secs(1))
                .await
                .unwrap(),
            Lease {
                fence: 0,
                expires_ms: 6_000
            }
        );
    }
}
