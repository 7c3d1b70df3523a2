//! Ttl sweep metrics. Labels are closed sets: the storage swept (`messages`: the store's
//! message content; `rollout`: the rollout's records) and the outcome.

use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};
use std::time::Duration;

/// Sweeps run, by store and outcome (`ok`, `error`).
pub const SWEEPS: &str = "troupe_ttl_sweeps_total";
/// Messages that lost their content and rollout records downgraded to headers, by store.
pub const DOWNGRADED: &str = "troupe_ttl_downgraded_total";
/// Time of one sweep of one store, by store.
pub const SWEEP_DURATION: &str = "troupe_ttl_sweep_duration_seconds";

/// Registers the descriptions (a Prometheus exporter rejects undescribed metrics).
pub fn describe() {
    describe_counter!(
        SWEEPS,
        Unit::Count,
        "Ttl sweeps run, by store (messages, rollout) and outcome (ok, error)"
    );
    describe_counter!(
        DOWNGRADED,
        Unit::Count,
        "Content dropped by Ttl sweeps once due: message contents (store=messages) and rollout \
         records downgraded to headers (store=rollout)"
    );
    describe_histogram!(
        SWEEP_DURATION,
        Unit::Seconds,
        "Duration of one Ttl sweep of one store, by store"
    );
}

/// What a sweep swept (the `store` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweptStore {
    Messages,
    Rollout,
}

impl SweptStore {
    pub const ALL: [Self; 2] = [Self::Messages, Self::Rollout];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Messages => "messages",
            Self::Rollout => "rollout",
        }
    }
}

/// How a sweep ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Error,
}

impl Outcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
        }
    }
}

/// The counters read 0 (not "no data") until the first sweep.
pub fn start_at_zero() {
    for store in SweptStore::ALL {
        for outcome in [Outcome::Ok, Outcome::Error] {
            counter!(SWEEPS, "store" => store.as_str(), "outcome" => outcome.as_str()).increment(0);
        }
        counter!(DOWNGRADED, "store" => store.as_str()).increment(0);
    }
}

/// One sweep of `store` took `took`, ended with `outcome` and dropped `downgraded` items.
pub fn swept(store: SweptStore, outcome: Outcome, downgraded: u64, took: Duration) {
    counter!(SWEEPS, "store" => store.as_str(), "outcome" => outcome.as_str()).increment(1);
    counter!(DOWNGRADED, "store" => store.as_str()).increment(downgraded);
    histogram!(SWEEP_DURATION, "store" => store.as_str()).record(took.as_secs_f64());
}
