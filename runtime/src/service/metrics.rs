//! Service metrics. Labels are route templates (`/api/sessions/{id}`), JSON-RPC method names
//! from the fixed method list, transports and status codes: never ids.

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use std::time::Duration;

/// HTTP requests, by route template and status code.
pub const REQUESTS_TOTAL: &str = "troupe_api_requests_total";
/// HTTP request durations (to the response head; a stream counts until it starts).
pub const REQUEST_DURATION_SECONDS: &str = "troupe_api_request_duration_seconds";
/// Open event streams, by transport (`sse`, `ws`, `rpc_ws`, `stdio`).
pub const STREAM_SUBSCRIBERS: &str = "troupe_stream_subscribers";
/// JSON-RPC calls, by method and outcome (`ok` or an error kind / JSON-RPC error name).
pub const RPC_CALLS_TOTAL: &str = "troupe_rpc_calls_total";

/// Registers the descriptions (a Prometheus exporter rejects undescribed metrics).
pub fn describe() {
    describe_counter!(
        REQUESTS_TOTAL,
        "HTTP API requests, by route template and status"
    );
    describe_histogram!(
        REQUEST_DURATION_SECONDS,
        Unit::Seconds,
        "HTTP API request duration until the response starts, by route template"
    );
    describe_gauge!(STREAM_SUBSCRIBERS, "Open event streams, by transport");
    describe_counter!(RPC_CALLS_TOTAL, "JSON-RPC calls, by method and outcome");
    describe_counter!(
        SESSION_RESTARTS_TOTAL,
        "Sessions started again by the registry after stopping on their own, by outcome \
         (restarted, failed, given_up)"
    );
}

/// One HTTP request answered.
pub fn request(route: &str, status: u16, elapsed: Duration) {
    counter!(REQUESTS_TOTAL, "route" => route.to_owned(), "status" => status.to_string())
        .increment(1);
    histogram!(REQUEST_DURATION_SECONDS, "route" => route.to_owned()).record(elapsed.as_secs_f64());
}

/// A stream opened (`+1.0`) or closed (`-1.0`).
pub fn subscribers(transport: &'static str, delta: f64) {
    gauge!(STREAM_SUBSCRIBERS, "transport" => transport).increment(delta);
}

/// One JSON-RPC call answered. `method` must come from the method list.
pub fn rpc_call(method: &'static str, outcome: &'static str) {
    counter!(RPC_CALLS_TOTAL, "method" => method, "outcome" => outcome).increment(1);
}

/// Installs the Prometheus recorder for this process (once) and keeps its histograms
/// trimmed; `None` when a recorder is already installed.
pub fn install_prometheus() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .ok()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Some(handle)
}

pub const SESSION_RESTARTS_TOTAL: &str = "troupe_session_restarts_total";

/// The registry restarted a stopped session (`restarted`), could not (`failed`), or left it
/// down because it keeps stopping (`given_up`).
pub fn session_restart(outcome: &'static str) {
    counter!(SESSION_RESTARTS_TOTAL, "outcome" => outcome).increment(1);
}
