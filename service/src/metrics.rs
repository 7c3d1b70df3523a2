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
/// Requests refused at the edge, before authentication, by reason (`host`, `origin`,
/// `content_type`).
pub const API_REFUSED_TOTAL: &str = "troupe_api_refused_total";
/// HTTP connections open now.
pub const HTTP_CONNECTIONS_OPEN: &str = "troupe_http_connections_open";
/// HTTP connections closed, by reason (`done`, `idle_timeout`, `header_timeout`,
/// `shutdown`, `error`).
pub const HTTP_CONNECTIONS_CLOSED_TOTAL: &str = "troupe_http_connections_closed_total";
/// Open event streams, by transport (`sse`, `ws`, `rpc_ws`, `stdio`).
pub const STREAM_SUBSCRIBERS: &str = "troupe_stream_subscribers";
/// JSON-RPC calls, by method and outcome (`ok` or an error kind / JSON-RPC error name).
pub const RPC_CALLS_TOTAL: &str = "troupe_rpc_calls_total";
/// Always 1, labelled with the version: which build a process runs.
pub const BUILD_INFO: &str = "troupe_build_info";
/// User messages stored, by the status they were stored with (`running`, `queued`).
pub const MESSAGES_ACCEPTED_TOTAL: &str = "troupe_messages_accepted_total";
/// User messages refused before anything was stored, by reason (a bounded set).
pub const MESSAGES_REFUSED_TOTAL: &str = "troupe_messages_refused_total";
/// User messages that reached their outcome, by status.
pub const MESSAGES_FINISHED_TOTAL: &str = "troupe_messages_finished_total";
/// Sessions active in this process (their host runs; idle stored sessions are not counted).
pub const SESSIONS_ACTIVE: &str = "troupe_sessions_active";
/// Session leases this node holds: the sessions it owns (0 unless it is a node of a cluster).
pub const LEASES_HELD: &str = "troupe_leases_held";
/// Sessions activated, by why (`request`: first use; `pending`: unfinished messages at start).
pub const SESSION_ACTIVATIONS_TOTAL: &str = "troupe_session_activations_total";
/// Scans of the sessions with unfinished messages, by trigger (start, periodic, peer_left,
/// peer_lost).
pub const SESSION_SCANS_TOTAL: &str = "troupe_session_scans_total";
/// Closed conversations opened again (an A2A context's next message after its idle close).
pub const CONVERSATIONS_REOPENED_TOTAL: &str = "troupe_conversations_reopened_total";
/// The service's own actors (the registry, the A2A endpoint's) restarted by their
/// supervisor, by component and outcome.
pub const SERVICE_RESTARTS_TOTAL: &str = "troupe_service_restarts_total";
/// 1 while the service is healthy, 0 once a component could not be recovered.
pub const SERVICE_HEALTHY: &str = "troupe_service_healthy";
/// Streaming clients (WebSocket, stdio) the service dropped, by transport and reason.
pub const STREAM_CLIENTS_DROPPED_TOTAL: &str = "troupe_stream_clients_dropped_total";
/// Sign-ins to the web console, by outcome (`ok`, `refused`: not a valid token, `open`: no
/// tokens are configured, nothing to sign in to).
pub const CONSOLE_SIGN_INS_TOTAL: &str = "troupe_console_sign_ins_total";
/// The outcomes of a console sign-in.
pub const SIGN_IN_OUTCOMES: [&str; 3] = ["ok", "refused", "open"];
/// Why a streaming client was dropped: it left its outbox full, or one write to it took too
/// long.
pub const DROP_REASONS: [&str; 2] = ["outbox_full", "send_timeout"];
/// The streaming transports.
pub const STREAM_TRANSPORTS: [&str; 3] = ["rpc_ws", "events_ws", "stdio"];

/// Buckets of every `*_seconds` histogram without its own: 0.5 ms (a store read) to an hour
/// (a task or an approval waiting for a human).
pub const SECONDS_BUCKETS: [f64; 21] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];
/// Buckets of the group-commit sizes (`*_batch_size`): powers of two up to the writers' cap.
pub const BATCH_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// Registers the descriptions (a Prometheus exporter rejects undescribed metrics).
pub fn describe() {
    describe_counter!(
        REQUESTS_TOTAL,
        Unit::Count,
        "HTTP API requests, by route template and status"
    );
    describe_histogram!(
        REQUEST_DURATION_SECONDS,
        Unit::Seconds,
        "HTTP API request duration until the response starts, by route template"
    );
    describe_counter!(
        API_REFUSED_TOTAL,
        Unit::Count,
        "HTTP requests refused before authentication, by reason (host: a foreign Host header; \
         origin: a foreign Origin on a WebSocket upgrade or a state-changing request; \
         content_type: a non-JSON body sent to a JSON API)"
    );
    describe_gauge!(
        HTTP_CONNECTIONS_OPEN,
        Unit::Count,
        "HTTP connections open (at most server.max_connections)"
    );
    describe_counter!(
        HTTP_CONNECTIONS_CLOSED_TOTAL,
        Unit::Count,
        "HTTP connections closed, by reason (done: by the client or after a response; \
         idle_timeout: no request within server.idle_timeout; header_timeout: a request head \
         not complete within server.header_timeout; shutdown; error)"
    );
    describe_counter!(
        SESSION_RESTARTS_TOTAL,
        Unit::Count,
        "Sessions started again by their host after stopping on their own, by outcome \
         (restarted, failed, given_up)"
    );
    describe_counter!(
        SESSION_RESYNCS_TOTAL,
        Unit::Count,
        "Conversation changes a stopped session run answered after the run that replaced it \
         had started, told to that run, by outcome (told, failed)"
    );
    describe_gauge!(
        STREAM_SUBSCRIBERS,
        Unit::Count,
        "Open event streams, by transport"
    );
    describe_counter!(
        RPC_CALLS_TOTAL,
        Unit::Count,
        "JSON-RPC calls, by method and outcome"
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label says which troupe build this process runs"
    );
    describe_counter!(
        MESSAGES_ACCEPTED_TOTAL,
        Unit::Count,
        "User messages stored and acknowledged, by the status they were stored with \
         (running, queued)"
    );
    describe_counter!(
        MESSAGES_REFUSED_TOTAL,
        Unit::Count,
        "User messages refused before anything was stored, by reason"
    );
    describe_counter!(
        MESSAGES_FINISHED_TOTAL,
        Unit::Count,
        "User messages that reached their outcome, by status (completed, failed, cancelled, \
         aborted)"
    );
    describe_gauge!(
        SESSIONS_ACTIVE,
        Unit::Count,
        "Sessions active in this process (stored sessions are activated on first use)"
    );
    describe_gauge!(
        LEASES_HELD,
        Unit::Count,
        "Session leases this node holds: the sessions it owns (0 unless it is a node of a cluster)"
    );
    describe_counter!(
        SESSION_ACTIVATIONS_TOTAL,
        Unit::Count,
        "Sessions activated, by reason (request, pending)"
    );
    describe_counter!(
        SESSION_SCANS_TOTAL,
        Unit::Count,
        "Scans for sessions with unfinished messages to take over, by trigger (start; periodic: every lease ttl on a node of a cluster; peer_left: another node said it stopped; peer_lost: another node's transport connection dropped and its leases can have expired)"
    );
    describe_counter!(
        CONVERSATIONS_REOPENED_TOTAL,
        Unit::Count,
        "Closed conversations opened again under their id, their history rebuilt from the \
         rollout (an A2A context's next message after its idle close)"
    );
    describe_counter!(
        SERVICE_RESTARTS_TOTAL,
        Unit::Count,
        "The service's own actors restarted by their supervisor, by component (registry, a2a, lease_keeper) \
         and outcome (restarted, given_up)"
    );
    describe_counter!(
        STREAM_CLIENTS_DROPPED_TOTAL,
        Unit::Count,
        "Streaming clients disconnected for not reading, by transport (rpc_ws, events_ws, \
         stdio) and reason (outbox_full: frames worth the outbox left unread; send_timeout: \
         one write took too long)"
    );
    describe_counter!(
        CONSOLE_SIGN_INS_TOTAL,
        Unit::Count,
        "Sign-ins to the web console, by outcome (ok; refused: not a valid token; open: no \
         tokens are configured)"
    );
    describe_gauge!(
        SERVICE_HEALTHY,
        "1 while every component of the service runs or can be restarted; 0 once one could \
         not be recovered (the process then exits non-zero)"
    );
}

/// Every message and service series reads 0 (not "no data") from the start.
pub fn service_series_start_at_zero() {
    use troupe_proto::store::MessageStatus;
    gauge!(LEASES_HELD).set(0.0);
    for status in [MessageStatus::Running, MessageStatus::Queued] {
        counter!(MESSAGES_ACCEPTED_TOTAL, "status" => status.as_str()).increment(0);
    }
    for status in MessageStatus::ALL.into_iter().filter(|s| s.is_terminal()) {
        counter!(MESSAGES_FINISHED_TOTAL, "status" => status.as_str()).increment(0);
    }
    for reason in REFUSAL_REASONS {
        counter!(MESSAGES_REFUSED_TOTAL, "reason" => reason).increment(0);
    }
    for reason in crate::registry::Activation::ALL {
        counter!(SESSION_ACTIVATIONS_TOTAL, "reason" => reason.label()).increment(0);
    }
    for trigger in crate::registry::ScanTrigger::ALL {
        counter!(SESSION_SCANS_TOTAL, "trigger" => trigger.label()).increment(0);
    }
    for component in ["registry", "a2a", "lease_keeper", "node_transport"] {
        for outcome in ["restarted", "given_up"] {
            counter!(SERVICE_RESTARTS_TOTAL, "component" => component, "outcome" => outcome)
                .increment(0);
        }
    }
    for transport in STREAM_TRANSPORTS {
        for reason in DROP_REASONS {
            counter!(STREAM_CLIENTS_DROPPED_TOTAL, "transport" => transport, "reason" => reason)
                .increment(0);
        }
    }
    for outcome in SIGN_IN_OUTCOMES {
        counter!(CONSOLE_SIGN_INS_TOTAL, "outcome" => outcome).increment(0);
    }
    for refusal in crate::edge::Refusal::ALL {
        counter!(API_REFUSED_TOTAL, "reason" => refusal.reason()).increment(0);
    }
    for reason in crate::listen::Closed::ALL {
        counter!(HTTP_CONNECTIONS_CLOSED_TOTAL, "reason" => reason.as_str()).increment(0);
    }
    gauge!(HTTP_CONNECTIONS_OPEN).increment(0.0);
    gauge!(SESSIONS_ACTIVE).increment(0.0);
    counter!(CONVERSATIONS_REOPENED_TOTAL).increment(0);
    session_restarts_start_at_zero();
    for transport in SUBSCRIBER_TRANSPORTS {
        gauge!(STREAM_SUBSCRIBERS, "transport" => transport).increment(0.0);
    }
    for method in crate::rpc::METHODS {
        for outcome in crate::rpc::OUTCOMES {
            counter!(RPC_CALLS_TOTAL, "method" => *method, "outcome" => outcome).increment(0);
        }
    }
}

/// The `transport` values of `troupe_stream_subscribers`: REST's SSE, the events WebSocket,
/// and JSON-RPC subscriptions over WebSocket and stdio.
pub const SUBSCRIBER_TRANSPORTS: [&str; 4] = ["sse", "ws", "rpc_ws", "stdio"];

/// The reasons a message is refused: the error kind of the refusal.
const REFUSAL_REASONS: [&str; 4] = ["overloaded", "not_found", "internal", "other"];

/// A message was stored with `status`.
pub fn message_accepted(status: troupe_proto::store::MessageStatus) {
    counter!(MESSAGES_ACCEPTED_TOTAL, "status" => status.as_str()).increment(1);
}

/// A message was refused with `error` before anything was stored.
pub fn message_refused(error: &troupe_proto::AgentError) {
    use troupe_proto::ErrorKind;
    let reason = match error.kind() {
        ErrorKind::Overloaded => "overloaded",
        ErrorKind::NotFound => "not_found",
        ErrorKind::Internal => "internal",
        _ => "other",
    };
    counter!(MESSAGES_REFUSED_TOTAL, "reason" => reason).increment(1);
}

/// A message reached its outcome.
pub fn message_finished(status: troupe_proto::store::MessageStatus) {
    counter!(MESSAGES_FINISHED_TOTAL, "status" => status.as_str()).increment(1);
}

/// A closed conversation was opened again.
pub fn conversation_reopened() {
    counter!(CONVERSATIONS_REOPENED_TOTAL).increment(1);
}

/// A scan for sessions with unfinished messages began.
pub fn session_scan(trigger: &'static str) {
    counter!(SESSION_SCANS_TOTAL, "trigger" => trigger).increment(1);
}

/// A session was activated (`request`, `pending` or `host_ended`).
pub fn session_activated(reason: &'static str) {
    counter!(SESSION_ACTIVATIONS_TOTAL, "reason" => reason).increment(1);
}

/// A supervisor restarted `component` (`restarted`), or gave up on it (`given_up`).
pub fn service_restart(component: &'static str, outcome: &'static str) {
    counter!(SERVICE_RESTARTS_TOTAL, "component" => component, "outcome" => outcome).increment(1);
}

/// How many session leases this node holds now.
#[allow(clippy::cast_precision_loss)]
pub fn leases_held(n: usize) {
    gauge!(LEASES_HELD).set(n as f64);
}

/// The service's health as a gauge.
pub fn service_healthy(healthy: bool) {
    gauge!(SERVICE_HEALTHY).set(if healthy { 1.0 } else { 0.0 });
}

/// Counts an active session in `troupe_sessions_active` while it lives.
#[derive(Debug)]
pub struct ActiveSession(());

impl ActiveSession {
    pub fn start() -> Self {
        gauge!(SESSIONS_ACTIVE).increment(1.0);
        Self(())
    }
}

impl Drop for ActiveSession {
    fn drop(&mut self) {
        gauge!(SESSIONS_ACTIVE).decrement(1.0);
    }
}

/// Counts an open HTTP connection in `troupe_http_connections_open` while it lives.
#[derive(Debug)]
pub struct ConnectionOpen(());

impl ConnectionOpen {
    pub fn start() -> Self {
        gauge!(HTTP_CONNECTIONS_OPEN).increment(1.0);
        Self(())
    }

    /// The connection closed for `reason`.
    pub fn close(self, reason: crate::listen::Closed) {
        counter!(HTTP_CONNECTIONS_CLOSED_TOTAL, "reason" => reason.as_str()).increment(1);
    }
}

impl Drop for ConnectionOpen {
    fn drop(&mut self) {
        gauge!(HTTP_CONNECTIONS_OPEN).decrement(1.0);
    }
}

/// One HTTP request answered.
pub fn request(route: &str, status: u16, elapsed: Duration) {
    counter!(REQUESTS_TOTAL, "route" => route.to_owned(), "status" => status.to_string())
        .increment(1);
    histogram!(REQUEST_DURATION_SECONDS, "route" => route.to_owned()).record(elapsed.as_secs_f64());
}

/// A request refused at the edge.
/// A console sign-in; `outcome` is one of [`SIGN_IN_OUTCOMES`].
pub fn console_sign_in(outcome: &'static str) {
    counter!(CONSOLE_SIGN_INS_TOTAL, "outcome" => outcome).increment(1);
}

pub fn edge_refused(refusal: crate::edge::Refusal) {
    counter!(API_REFUSED_TOTAL, "reason" => refusal.reason()).increment(1);
}

/// A stream opened (`+1.0`) or closed (`-1.0`).
pub fn subscribers(transport: &'static str, delta: f64) {
    gauge!(STREAM_SUBSCRIBERS, "transport" => transport).increment(delta);
}

/// One JSON-RPC call answered. `method` must come from the method list.
/// A streaming client was dropped for not reading.
pub fn stream_client_dropped(transport: &'static str, reason: &'static str) {
    counter!(STREAM_CLIENTS_DROPPED_TOTAL, "transport" => transport, "reason" => reason)
        .increment(1);
}

pub fn rpc_call(method: &'static str, outcome: &'static str) {
    counter!(RPC_CALLS_TOTAL, "method" => method, "outcome" => outcome).increment(1);
}

/// The exporter's configuration: every histogram gets explicit buckets (a summary could not
/// be aggregated across processes): the GenAI conventions' advice for the `gen_ai_*` metrics
/// and the model's time to first token, [`BATCH_BUCKETS`] for batch sizes, and
/// [`SECONDS_BUCKETS`] for every other duration (and anything new).
pub fn prometheus_builder()
-> Result<metrics_exporter_prometheus::PrometheusBuilder, metrics_exporter_prometheus::BuildError> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    use troupe_runtime::openai::metrics as model;
    let overrides: [(Matcher, &[f64]); 4] = [
        (
            Matcher::Full(model::GEN_AI_OPERATION_DURATION.into()),
            &model::GEN_AI_DURATION_BUCKETS,
        ),
        (
            Matcher::Full(model::GEN_AI_TOKEN_USAGE.into()),
            &model::GEN_AI_TOKEN_BUCKETS,
        ),
        (
            Matcher::Full(model::TIME_TO_FIRST_BYTE_SECONDS.into()),
            &model::GEN_AI_DURATION_BUCKETS,
        ),
        (Matcher::Suffix("_batch_size".into()), &BATCH_BUCKETS),
    ];
    let mut builder = PrometheusBuilder::new().set_buckets(&SECONDS_BUCKETS)?;
    for (matcher, buckets) in overrides {
        builder = builder.set_buckets_for_metric(matcher, buckets)?;
    }
    Ok(builder)
}

/// Installs the Prometheus recorder for this process (once) and keeps its histograms
/// trimmed; `None` when a recorder is already installed.
pub fn install_prometheus() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    let handle = prometheus_builder().ok()?.install_recorder().ok()?;
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
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
pub const SESSION_RESYNCS_TOTAL: &str = "troupe_session_resyncs_total";

/// A change a stopped run answered late was told to the run that replaced it (`told`), or the
/// new run refused it (`failed`).
pub fn session_resync(outcome: &'static str) {
    counter!(SESSION_RESYNCS_TOTAL, "outcome" => outcome).increment(1);
}

/// A session's host restarted its stopped session (`restarted`), could not (`failed`), or
/// left it down because it keeps stopping (`given_up`).
pub fn session_restart(outcome: &'static str) {
    counter!(SESSION_RESTARTS_TOTAL, "outcome" => outcome).increment(1);
}

/// Session restarts read 0 (not "no data") until one happens.
pub fn session_restarts_start_at_zero() {
    for outcome in ["restarted", "failed", "given_up"] {
        counter!(SESSION_RESTARTS_TOTAL, "outcome" => outcome).increment(0);
    }
    for outcome in ["told", "failed"] {
        counter!(SESSION_RESYNCS_TOTAL, "outcome" => outcome).increment(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renders what `record` records through a recorder built like the installed one.
    fn render(record: impl FnOnce()) -> String {
        let recorder = prometheus_builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, record);
        handle.render()
    }

    #[test]
    fn gen_ai_histograms_use_the_conventions_buckets() {
        let call = troupe_runtime::openai::metrics::GenAiCall {
            provider: "openai",
            request_model: "gpt-4o-mini",
            response_model: Some("gpt-4o-mini-2024-07-18"),
        };
        let text = render(|| {
            troupe_runtime::openai::metrics::gen_ai_operation(
                call,
                Duration::from_millis(300),
                None,
            );
            troupe_runtime::openai::metrics::gen_ai_tokens(
                call,
                &troupe_proto::Usage {
                    input_tokens: 120,
                    output_tokens: 7,
                    ..troupe_proto::Usage::default()
                },
            );
        });
        for le in ["0.01", "0.32", "81.92", "+Inf"] {
            assert!(
                text.contains(&format!(
                    "gen_ai_client_operation_duration_seconds_bucket{{gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"openai\",gen_ai_request_model=\"gpt-4o-mini\",gen_ai_response_model=\"gpt-4o-mini-2024-07-18\",le=\"{le}\"}}"
                )),
                "{le}: {text}"
            );
        }
        for le in ["1", "256", "67108864"] {
            assert!(
                text.contains(&format!("gen_ai_token_type=\"input\",le=\"{le}\"}}")),
                "{le}: {text}"
            );
        }
        assert!(
            text.contains("gen_ai_token_type=\"output\",le=\"16\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn a_failed_model_call_carries_its_error_type() {
        let call = troupe_runtime::openai::metrics::GenAiCall {
            provider: "openai",
            request_model: "m",
            response_model: None,
        };
        let text = render(|| {
            troupe_runtime::openai::metrics::gen_ai_operation(
                call,
                Duration::from_secs(1),
                Some("http_error"),
            );
        });
        assert!(
            text.contains("gen_ai_request_model=\"m\",error_type=\"http_error\",le=\"1.28\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn edge_series_exist_from_the_start() {
        let text = render(|| {
            service_series_start_at_zero();
            edge_refused(crate::edge::Refusal::Origin);
            ConnectionOpen::start().close(crate::listen::Closed::HeaderTimeout);
        });
        for line in [
            "troupe_api_refused_total{reason=\"host\"} 0",
            "troupe_api_refused_total{reason=\"content_type\"} 0",
            "troupe_api_refused_total{reason=\"origin\"} 1",
            "troupe_http_connections_closed_total{reason=\"idle_timeout\"} 0",
            "troupe_http_connections_closed_total{reason=\"header_timeout\"} 1",
            "troupe_http_connections_open 0",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }

    #[test]
    fn every_histogram_has_buckets_never_quantiles() {
        let text = render(|| {
            request("/api/sessions", 201, Duration::from_millis(3));
            histogram!("troupe_store_write_batch_size").record(3.0);
            histogram!("troupe_some_new_thing").record(2.0);
        });
        assert!(!text.contains("quantile="), "{text}");
        assert!(
            text.contains(
                "troupe_api_request_duration_seconds_bucket{route=\"/api/sessions\",le=\"0.005\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("troupe_store_write_batch_size_bucket{le=\"4\"} 1"),
            "{text}"
        );
        assert!(text.contains("troupe_some_new_thing_bucket"), "{text}");
    }
}
