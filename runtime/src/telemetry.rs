//! Tracing set-up: a fmt layer to stderr (filter from `TROUPE_LOG`, default `warn`) and an
//! OpenTelemetry layer, so every span has W3C trace and span ids that events and task stats
//! carry.
//!
//! Export is off by default: then the provider has no exporter, nothing leaves the process
//! and no connection is ever attempted. [`install`] turns it on from `[telemetry]` and the
//! standard `OTEL_*` variables (see [`TelemetryConfig`]): OTLP over HTTP/protobuf or gRPC,
//! in batches from the SDK's own thread. Only troupe's own spans are exported (see
//! [`TRACED_TARGETS`]); the span tree is described in `troupe_actors::task::spans`.
//!
//! Shutdown: dropping the [`TelemetryGuard`] flushes what is queued and stops the exporter,
//! within [`SHUTDOWN_TIMEOUT`], so a graceful exit loses no span.

use crate::config::{ConfigError, OtlpProtocol, TelemetryConfig};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::time::Duration;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The crates whose spans and events are exported, at `info` and above: the span tree of a
/// task and nothing of the libraries under it (their HTTP, MCP and runtime internals).
pub const TRACED_TARGETS: &[&str] = &[
    "troupe",
    "troupe_actors",
    "troupe_runtime",
    "troupe_store",
    "troupe_service",
];

/// How long a shutdown may take to flush what is queued.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Keeps the tracer provider alive; dropping it flushes and shuts tracing export down.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
    /// Where spans go, when they are exported (for logs and tests).
    exporting_to: Option<String>,
}

impl TelemetryGuard {
    /// The provider spans are made by.
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// The URL spans are exported to; `None` when export is off.
    pub fn exporting_to(&self) -> Option<&str> {
        self.exporting_to.as_deref()
    }

    /// Flushes and shuts export down on a blocking thread, so that the runtime goes on
    /// driving the exporter's connection meanwhile: on a current-thread runtime a gRPC
    /// exporter's connection lives on the very thread a plain drop would block. Bounded by
    /// [`SHUTDOWN_TIMEOUT`].
    pub async fn shutdown(self) {
        let _ = tokio::task::spawn_blocking(move || drop(self)).await;
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        // Ends the batch thread after one last export; bounded, so an unreachable collector
        // cannot hold up the exit.
        if let Err(error) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::debug!(%error, "tracer provider shutdown");
        }
    }
}

/// Installs the global subscriber without export: spans still get real ids. Safe to call
/// once per process; a second call is ignored.
pub fn init(service_name: &str) -> TelemetryGuard {
    let provider = provider(service_name, None);
    let _ = subscriber(&provider).try_init();
    TelemetryGuard {
        provider,
        exporting_to: None,
    }
}

/// Installs the global subscriber, exporting spans as `config` says (nothing when it is
/// off). Must run inside a tokio runtime when the protocol is gRPC (the channel lives on
/// it). A second call in a process keeps the first subscriber.
pub fn install(config: &TelemetryConfig) -> Result<TelemetryGuard, ConfigError> {
    let exporter = exporter(config)?;
    let exporting_to = exporter.is_some().then(|| config.traces_url());
    let provider = provider(&config.service_name, exporter);
    let _ = subscriber(&provider).try_init();
    if let Some(url) = &exporting_to {
        tracing::info!(%url, protocol = ?config.protocol, "exporting spans over OTLP");
    }
    Ok(TelemetryGuard {
        provider,
        exporting_to,
    })
}

/// The OTLP exporter `config` asks for; `None` when export is off (and then nothing that
/// could open a connection is built).
pub fn exporter(
    config: &TelemetryConfig,
) -> Result<Option<opentelemetry_otlp::SpanExporter>, ConfigError> {
    if !config.exporting() {
        return Ok(None);
    }
    let url = config.traces_url();
    let failed = |e: opentelemetry_otlp::ExporterBuildError| ConfigError::Telemetry {
        url: url.clone(),
        message: e.to_string(),
    };
    let exporter = match config.protocol {
        OtlpProtocol::HttpProtobuf => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(url.clone())
                .with_timeout(config.timeout);
            if !config.headers.is_empty() {
                // Checked as gRPC's are: the HTTP exporter would drop a bad one silently and
                // every export would then be refused by the collector.
                header_map(&url, &config.headers)?;
                builder = builder.with_headers(
                    config
                        .headers
                        .iter()
                        .map(|(k, v)| (k.clone(), sent_as_written(v)))
                        .collect(),
                );
            }
            builder.build().map_err(failed)?
        }
        OtlpProtocol::Grpc => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(url.clone())
                .with_timeout(config.timeout);
            if !config.headers.is_empty() {
                let map = header_map(&url, &config.headers)?;
                builder = builder.with_metadata(
                    opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(map),
                );
            }
            builder.build().map_err(failed)?
        }
    };
    Ok(Some(exporter))
}

/// `value` as the HTTP exporter's `with_headers` must be given it for `value` itself to be
/// sent: it percent-decodes what it is given (as it does `OTEL_EXPORTER_OTLP_HEADERS`, where
/// the specification asks for it), while gRPC's metadata goes out as given. A header of the
/// file is sent as written over both: each `%` escaped, so that decoding gives it back.
pub fn sent_as_written(value: &str) -> String {
    value.replace('%', "%25")
}

fn bad_header(url: &str, name: &str) -> ConfigError {
    ConfigError::Telemetry {
        url: url.to_owned(),
        message: format!("header `{name}` is not a valid HTTP header"),
    }
}

/// The exporter's headers, each a valid HTTP header name and value, or the error naming the
/// one that is not.
fn header_map<'a>(
    url: &str,
    headers: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<reqwest::header::HeaderMap, ConfigError> {
    let mut map = reqwest::header::HeaderMap::new();
    for (k, v) in headers {
        let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| bad_header(url, k))?;
        let value = reqwest::header::HeaderValue::from_str(v).map_err(|_| bad_header(url, k))?;
        map.insert(name, value);
    }
    Ok(map)
}

/// The `service.name` to set over the resource's own: `OTEL_SERVICE_NAME` (already in
/// `configured`) comes first, then a `service.name` in `OTEL_RESOURCE_ATTRIBUTES` (the
/// resource has it: `None`), then `configured` (the file's, or the default).
pub fn service_name_over(
    configured: &str,
    otel_service_name: Option<&str>,
    resource_attributes: Option<&str>,
) -> Option<String> {
    let named_by_attributes = resource_attributes.is_some_and(|attributes| {
        attributes.split(',').any(|pair| {
            pair.split_once('=')
                .is_some_and(|(k, _)| k.trim() == "service.name")
        })
    });
    let by_variable = otel_service_name.is_some_and(|n| !n.trim().is_empty());
    (by_variable || !named_by_attributes).then(|| configured.to_owned())
}

/// A provider with this `service.name` (`OTEL_RESOURCE_ATTRIBUTES` adds to the resource and,
/// without `OTEL_SERVICE_NAME`, names the service), exporting in batches through `exporter`
/// if there is one.
pub fn provider(
    service_name: &str,
    exporter: Option<opentelemetry_otlp::SpanExporter>,
) -> SdkTracerProvider {
    let mut resource = opentelemetry_sdk::Resource::builder();
    if let Some(name) = service_name_over(
        service_name,
        std::env::var("OTEL_SERVICE_NAME").ok().as_deref(),
        std::env::var("OTEL_RESOURCE_ATTRIBUTES").ok().as_deref(),
    ) {
        resource = resource.with_service_name(name);
    }
    let builder = SdkTracerProvider::builder().with_resource(resource.build());
    match exporter {
        Some(exporter) => builder.with_batch_exporter(exporter),
        None => builder,
    }
    .build()
}

/// The variable whose filter the console logs follow (`info`, `troupe=debug`, ...).
pub const LOG_ENV: &str = "TROUPE_LOG";

/// The most verbose level rmcp's OAuth module is logged at (see [`subscriber`]).
const OAUTH_LOG_CAP: &str = "rmcp::transport::auth=info";

/// The subscriber every troupe process runs: console logs per `TROUPE_LOG`, and troupe's
/// spans (at `info` and above, whatever the console shows) into `provider`.
pub fn subscriber(
    provider: &SdkTracerProvider,
) -> impl tracing::Subscriber + Send + Sync + 'static {
    let filter = EnvFilter::try_from_env(LOG_ENV).unwrap_or_else(|_| EnvFilter::new("warn"));
    // Colours only for a terminal: a log file or a pipe gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_filter(console_filter(filter));
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel_layer(provider))
}

/// The console's filter: `filter` (from `TROUPE_LOG`), with rmcp's OAuth module never
/// below `info`, since it prints authorization codes and token responses at debug. The cap
/// is a filter of its own, and'ed with `filter`: a directive of `filter` that enables
/// events inside a span (`[mcp_oauth_login]=debug`) cannot lift it.
pub fn console_filter<S>(filter: EnvFilter) -> impl tracing_subscriber::layer::Filter<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::filter::FilterExt;
    let cap = match OAUTH_LOG_CAP.parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    cap.and(tracing_subscriber::filter::filter_fn(|meta| {
        !(meta.target().starts_with(OAUTH_TARGET) && *meta.level() > Level::INFO)
    }))
}

/// rmcp's OAuth module, capped at `info` in the console (see [`console_filter`]).
const OAUTH_TARGET: &str = "rmcp::transport::auth";

/// The OpenTelemetry layer alone, for subscribers built elsewhere (tests).
pub fn otel_layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    let targets = TRACED_TARGETS.iter().fold(Targets::new(), |t, target| {
        t.with_target(*target, Level::INFO)
    });
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("troupe"))
        // Source locations, targets, thread names and busy/idle times are noise on every
        // span; the conventions' attributes and the ids are what matter.
        .with_location(false)
        .with_target(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_filter(targets)
}

#[cfg(test)]
mod tests;
