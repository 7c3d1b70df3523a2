//! Tracing set-up: a fmt layer to stderr (filter from `TROUPE_LOG`, default `warn`) and an
//! OpenTelemetry layer, so every span has W3C trace and span ids that events and task stats
//! carry. Spans are exported when an exporter is configured; without one they are still
//! created with real ids.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the tracer provider alive; dropping it shuts tracing export down.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// Installs the global subscriber. Safe to call once per process; a second call is ignored.
pub fn init(service_name: &str) -> TelemetryGuard {
    let provider = SdkTracerProvider::builder()
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service_name.to_owned())
                .build(),
        )
        .build();
    let tracer = provider.tracer("troupe");
    let filter = EnvFilter::try_from_env("TROUPE_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    // Spans are created at info level for every task; keep them for the OTel layer even when
    // the console shows only warnings.
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(EnvFilter::new("info"));
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init();
    TelemetryGuard { provider }
}
