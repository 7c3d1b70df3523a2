//! Session metrics: sessions alive and the supervision tree's restarts. Labels are closed
//! enums (which actor restarted); session and conversation ids go to traces only.

use metrics::{Unit, counter, describe_counter, describe_gauge, gauge};

/// Session actors alive in this process.
pub const SESSIONS_LIVE: &str = "troupe_sessions_live";
/// Idle conversations stopped and kept only in the store.
pub const PASSIVATED: &str = "troupe_conversations_passivated_total";
/// Passivated conversations started again from the store by a request for them.
pub const REACTIVATED: &str = "troupe_conversations_reactivated_total";
/// Children the session restarted after they failed, by actor.
pub const ACTOR_RESTARTS: &str = "troupe_actor_restarts_total";

/// A child of the session that it restarts when it fails (the `actor` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restarted {
    Conversation,
    Rollout,
    Scheduler,
    TaskRegistry,
    ApprovalStore,
    McpPool,
    AgentHub,
}

impl Restarted {
    pub const ALL: [Self; 7] = [
        Self::Conversation,
        Self::Rollout,
        Self::Scheduler,
        Self::TaskRegistry,
        Self::ApprovalStore,
        Self::McpPool,
        Self::AgentHub,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Conversation => "conversation",
            Self::Rollout => "rollout",
            Self::Scheduler => "scheduler",
            Self::TaskRegistry => "task_registry",
            Self::ApprovalStore => "approval_store",
            Self::McpPool => "mcp_pool",
            Self::AgentHub => "agent_hub",
        }
    }
}

/// Registers the descriptions (a Prometheus exporter rejects undescribed metrics).
pub fn describe() {
    describe_gauge!(
        SESSIONS_LIVE,
        Unit::Count,
        "Session actors alive in this process."
    );
    describe_counter!(
        ACTOR_RESTARTS,
        Unit::Count,
        "Actors a session restarted after they failed, by actor (conversation, rollout, scheduler, task_registry, approval_store, mcp_pool, agent_hub)."
    );
    describe_counter!(
        PASSIVATED,
        Unit::Count,
        "Idle conversations passivated: stopped, kept only in the store and in their session's index."
    );
    describe_counter!(
        REACTIVATED,
        Unit::Count,
        "Passivated conversations reactivated from the store by a request for them."
    );
    counter!(PASSIVATED).increment(0);
    counter!(REACTIVATED).increment(0);
    // Restarts are rare: every series exists at 0 so that an alert on an increase sees it.
    for actor in Restarted::ALL {
        counter!(ACTOR_RESTARTS, "actor" => actor.as_str()).increment(0);
    }
}

pub fn restarted(actor: Restarted) {
    counter!(ACTOR_RESTARTS, "actor" => actor.as_str()).increment(1);
}

pub fn passivated() {
    counter!(PASSIVATED).increment(1);
}

pub fn reactivated() {
    counter!(REACTIVATED).increment(1);
}

/// Counts a session while it lives (a failed session's state is dropped too).
#[derive(Debug)]
pub struct Live;

impl Live {
    pub fn start() -> Self {
        gauge!(SESSIONS_LIVE).increment(1.0);
        Self
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        gauge!(SESSIONS_LIVE).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[test]
    fn every_restartable_actor_has_a_series_from_the_start() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            describe();
            restarted(Restarted::Scheduler);
        });
        let mut series: Vec<(String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == ACTOR_RESTARTS)
            .map(|(key, _, _, value)| {
                let actor = key.key().labels().next().unwrap().value().to_owned();
                let DebugValue::Counter(n) = value else {
                    panic!("not a counter")
                };
                (actor, n)
            })
            .collect();
        series.sort();
        let mut want: Vec<(String, u64)> = Restarted::ALL
            .iter()
            .map(|a| (a.as_str().to_owned(), u64::from(*a == Restarted::Scheduler)))
            .collect();
        want.sort();
        assert_eq!(series, want);
    }
}
