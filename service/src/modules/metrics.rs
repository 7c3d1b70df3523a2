//! Module metrics (A10). Labels are closed sets: the module's id (from the modules
//! directory, so bounded by configuration), its direction, and the outcome.

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use std::time::Duration;
use troupe_runtime::modules::ModuleDefinition;

/// Deliveries to output and duplex modules (replies, acknowledgements aside), by outcome.
pub const DELIVERIES: &str = "troupe_module_deliveries_total";
/// The outcomes of [`DELIVERIES`]: delivered (acknowledged, or written for an async
/// module), retried (an async attempt failed and is tried again), timeout (a sync module did
/// not acknowledge in time), failed (down, refused, or out of retries).
pub const DELIVERY_OUTCOMES: [&str; 4] = ["delivered", "retried", "timeout", "failed"];
/// How long a delivery took to be acknowledged (sync) or written (async).
pub const DELIVERY_SECONDS: &str = "troupe_module_delivery_seconds";
/// Messages input gateways fed, by outcome.
pub const MESSAGES: &str = "troupe_module_messages_total";
/// The outcomes of [`MESSAGES`]: accepted (stored and run), refused (bad frame, unknown
/// session, overloaded).
pub const MESSAGE_OUTCOMES: [&str; 2] = ["accepted", "refused"];
/// Dispatches to modules (`dispatch_module`), by outcome.
pub const DISPATCHES: &str = "troupe_module_dispatches_total";
/// The outcomes of [`DISPATCHES`].
pub const DISPATCH_OUTCOMES: [&str; 3] = ["ok", "timeout", "failed"];
/// Restarts of stdio modules' processes, by outcome.
pub const RESTARTS: &str = "troupe_module_restarts_total";
/// The outcomes of [`RESTARTS`]: restarted, failed (the start failed), given_up (past its
/// restart budget, it stays down).
pub const RESTART_OUTCOMES: [&str; 3] = ["restarted", "failed", "given_up"];
/// Whether a module can take work now (1) or not (0).
pub const UP: &str = "troupe_module_up";

/// Registers the descriptions.
pub fn describe() {
    describe_counter!(
        DELIVERIES,
        Unit::Count,
        "Deliveries to output and duplex modules, by module, direction and outcome (delivered, retried, timeout, failed)"
    );
    describe_histogram!(
        DELIVERY_SECONDS,
        Unit::Seconds,
        "Time until a module acknowledged a delivery (sync) or took it (async), by module and direction"
    );
    describe_counter!(
        MESSAGES,
        Unit::Count,
        "Messages input gateways fed into sessions, by module, direction and outcome (accepted, refused)"
    );
    describe_counter!(
        DISPATCHES,
        Unit::Count,
        "Dispatches to modules (dispatch_module), by module, direction and outcome (ok, timeout, failed)"
    );
    describe_counter!(
        RESTARTS,
        Unit::Count,
        "Restarts of stdio modules' processes, by module, direction and outcome (restarted, failed, given_up)"
    );
    describe_gauge!(
        UP,
        Unit::Count,
        "Whether a module can take work (1) or not (0), by module and direction"
    );
}

/// Every series of `module` at 0 (its gauge as it starts).
pub fn start_at_zero(module: &ModuleDefinition) {
    let (id, dir) = labels(module);
    for outcome in DELIVERY_OUTCOMES {
        counter!(DELIVERIES, "module" => id.clone(), "direction" => dir, "outcome" => outcome)
            .increment(0);
    }
    for outcome in MESSAGE_OUTCOMES {
        counter!(MESSAGES, "module" => id.clone(), "direction" => dir, "outcome" => outcome)
            .increment(0);
    }
    for outcome in DISPATCH_OUTCOMES {
        counter!(DISPATCHES, "module" => id.clone(), "direction" => dir, "outcome" => outcome)
            .increment(0);
    }
    for outcome in RESTART_OUTCOMES {
        counter!(RESTARTS, "module" => id.clone(), "direction" => dir, "outcome" => outcome)
            .increment(0);
    }
    let _ = histogram!(DELIVERY_SECONDS, "module" => id.clone(), "direction" => dir);
    gauge!(UP, "module" => id, "direction" => dir).set(0.0);
}

/// With no module configured: one series of each name without the module's labels (by
/// outcome where the name has one), at 0, so that the names exist for dashboards and alerts.
pub fn start_at_zero_without_modules() {
    for outcome in DELIVERY_OUTCOMES {
        counter!(DELIVERIES, "outcome" => outcome).increment(0);
    }
    for outcome in MESSAGE_OUTCOMES {
        counter!(MESSAGES, "outcome" => outcome).increment(0);
    }
    for outcome in DISPATCH_OUTCOMES {
        counter!(DISPATCHES, "outcome" => outcome).increment(0);
    }
    for outcome in RESTART_OUTCOMES {
        counter!(RESTARTS, "outcome" => outcome).increment(0);
    }
    let _ = histogram!(DELIVERY_SECONDS);
    gauge!(UP).set(0.0);
}

fn labels(module: &ModuleDefinition) -> (String, &'static str) {
    (module.id.clone(), module.direction.as_str())
}

pub fn delivered(module: &ModuleDefinition, outcome: &'static str, took: Option<Duration>) {
    let (id, dir) = labels(module);
    counter!(DELIVERIES, "module" => id.clone(), "direction" => dir, "outcome" => outcome)
        .increment(1);
    if let Some(took) = took {
        histogram!(DELIVERY_SECONDS, "module" => id, "direction" => dir).record(took.as_secs_f64());
    }
}

pub fn message(module: &ModuleDefinition, outcome: &'static str) {
    let (id, dir) = labels(module);
    counter!(MESSAGES, "module" => id, "direction" => dir, "outcome" => outcome).increment(1);
}

pub fn dispatched(module: &ModuleDefinition, outcome: &'static str) {
    let (id, dir) = labels(module);
    counter!(DISPATCHES, "module" => id, "direction" => dir, "outcome" => outcome).increment(1);
}

pub fn restarted(module: &ModuleDefinition, outcome: &'static str) {
    let (id, dir) = labels(module);
    counter!(RESTARTS, "module" => id, "direction" => dir, "outcome" => outcome).increment(1);
}

pub fn up(module: &ModuleDefinition, up: bool) {
    let (id, dir) = labels(module);
    gauge!(UP, "module" => id, "direction" => dir).set(if up { 1.0 } else { 0.0 });
}
