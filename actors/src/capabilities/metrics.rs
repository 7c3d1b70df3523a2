//! Capability registry metrics (A6). Labels are closed sets (levels, outcomes); capability
//! ids go to spans and events only.

use super::Level;
use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use std::time::Duration;

/// Capabilities in force, as last loaded.
pub const REGISTERED: &str = "troupe_capability_registered";
/// Capability folders that did not load at the last reading.
pub const LOAD_ERRORS: &str = "troupe_capability_load_errors";
/// `capability_inspect` answers, by level (`list`, `summary`, `usage`, `full`).
pub const INSPECTIONS_TOTAL: &str = "troupe_capability_inspections_total";
/// `capability_run` calls, by outcome.
pub const RUNS_TOTAL: &str = "troupe_capability_runs_total";
/// How long a capability's command took (approval waits included), by outcome.
pub const RUN_DURATION: &str = "troupe_capability_run_duration_seconds";
/// Prompts whose capability summary was cut to its budget (`+N more`).
pub const PROMPT_TRUNCATIONS_TOTAL: &str = "troupe_capability_prompt_truncations_total";

/// How a `capability_run` call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// Exit code 0.
    Ok,
    /// It ran and failed (a non-zero exit, a timeout, a signal).
    Error,
    /// It did not run: unknown command, bad arguments, refused approval or sandbox.
    NotRun,
}

impl RunOutcome {
    pub const ALL: [Self; 3] = [Self::Ok, Self::Error, Self::NotRun];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::NotRun => "not_run",
        }
    }
}

/// Registers the descriptions, and every series at 0.
pub fn describe() {
    describe_gauge!(REGISTERED, Unit::Count, "Capabilities in force");
    describe_gauge!(
        LOAD_ERRORS,
        Unit::Count,
        "Capability folders that did not load at the last reading (the last good version of each stays)"
    );
    describe_counter!(
        INSPECTIONS_TOTAL,
        Unit::Count,
        "capability_inspect answers, by level (list, summary, usage, full)"
    );
    describe_counter!(
        RUNS_TOTAL,
        Unit::Count,
        "capability_run calls, by outcome (ok, error: it ran and failed, not_run)"
    );
    describe_histogram!(
        RUN_DURATION,
        Unit::Seconds,
        "Duration of a capability's command, approval waits included, by outcome"
    );
    describe_counter!(
        PROMPT_TRUNCATIONS_TOTAL,
        Unit::Count,
        "Prompts whose capability summary was cut to its context budget"
    );
    gauge!(REGISTERED).set(0.0);
    gauge!(LOAD_ERRORS).set(0.0);
    for level in ["list"].into_iter().chain(Level::ALL.map(Level::as_str)) {
        counter!(INSPECTIONS_TOTAL, "level" => level).increment(0);
    }
    for outcome in RunOutcome::ALL {
        counter!(RUNS_TOTAL, "outcome" => outcome.as_str()).increment(0);
        let _ = histogram!(RUN_DURATION, "outcome" => outcome.as_str());
    }
    counter!(PROMPT_TRUNCATIONS_TOTAL).increment(0);
}

/// A catalog was loaded: `registered` capabilities in force, `errors` folders rejected.
pub fn loaded(registered: usize, errors: usize) {
    gauge!(REGISTERED).set(registered as f64);
    gauge!(LOAD_ERRORS).set(errors as f64);
}

/// `level`: `None` for the list of every capability.
pub fn inspected(level: Option<Level>) {
    let level = level.map_or("list", Level::as_str);
    counter!(INSPECTIONS_TOTAL, "level" => level).increment(1);
}

pub fn ran(outcome: RunOutcome, took: Duration) {
    counter!(RUNS_TOTAL, "outcome" => outcome.as_str()).increment(1);
    histogram!(RUN_DURATION, "outcome" => outcome.as_str()).record(took.as_secs_f64());
}

pub fn summary_truncated() {
    counter!(PROMPT_TRUNCATIONS_TOTAL).increment(1);
}
