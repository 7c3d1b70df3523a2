//! `[telemetry]`: OpenTelemetry span export over OTLP. Off by default, and then nothing is
//! exported and no connection is attempted (spans still get W3C ids, which events carry).
//!
//! The standard `OTEL_*` variables apply over the file (see [`TelemetryConfig::apply_env`]).

use super::{ConfigError, parse_bool, parse_duration, parse_enum};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum OtlpProtocol {
    /// Protobuf over HTTP (`POST {endpoint}/v1/traces`), port 4318 by convention.
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// gRPC (tonic), port 4317 by convention.
    #[serde(rename = "grpc")]
    Grpc,
}

impl OtlpProtocol {
    /// The collector's conventional local address for this protocol.
    pub const fn default_endpoint(self) -> &'static str {
        match self {
            Self::HttpProtobuf => "http://localhost:4318",
            Self::Grpc => "http://localhost:4317",
        }
    }
}

/// `[telemetry]`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Export spans. Unset: on exactly when an endpoint is configured (here or in
    /// `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`); `OTEL_TRACES_EXPORTER` and `OTEL_SDK_DISABLED`
    /// set it.
    pub enabled: Option<bool>,
    /// Base URL of the collector, like `OTEL_EXPORTER_OTLP_ENDPOINT`: HTTP appends
    /// `/v1/traces`; gRPC uses it as is.
    pub endpoint: Option<String>,
    /// Full URL of the traces endpoint, used as is (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
    pub traces_endpoint: Option<String>,
    /// `http/protobuf` (default) or `grpc`.
    pub protocol: OtlpProtocol,
    /// The resource's `service.name` (`OTEL_SERVICE_NAME` wins).
    pub service_name: String,
    /// Extra headers of every export request (e.g. an API key), sent as written; the
    /// exporter adds `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS` (percent-decoded) over them.
    pub headers: BTreeMap<String, String>,
    /// Bound of one export.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Record prompts and completions (`gen_ai.input.messages`, `gen_ai.output.messages`,
    /// tool arguments and results) on spans. They may hold secrets: off by default
    /// (`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` turns it on).
    pub record_content: bool,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            enabled: None,
            endpoint: None,
            traces_endpoint: None,
            protocol: OtlpProtocol::HttpProtobuf,
            service_name: "troupe".into(),
            headers: BTreeMap::new(),
            timeout: Duration::from_secs(10),
            record_content: false,
        }
    }
}

// By hand so header values (often credentials) never reach a log line.
impl std::fmt::Debug for TelemetryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetryConfig")
            .field("enabled", &self.enabled)
            .field("endpoint", &self.endpoint)
            .field("traces_endpoint", &self.traces_endpoint)
            .field("protocol", &self.protocol)
            .field("service_name", &self.service_name)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("record_content", &self.record_content)
            .finish()
    }
}

/// The `OTEL_*` variables read, and what they set.
pub const OTEL_ENV_VARS: &[(&str, &str)] = &[
    ("OTEL_SDK_DISABLED", "telemetry.enabled = false when true"),
    ("OTEL_TRACES_EXPORTER", "telemetry.enabled (otlp or none)"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "telemetry.endpoint"),
    (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "telemetry.traces_endpoint",
    ),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "telemetry.protocol"),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "telemetry.protocol"),
    (
        "OTEL_EXPORTER_OTLP_TIMEOUT",
        "telemetry.timeout (milliseconds)",
    ),
    (
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "telemetry.timeout (milliseconds)",
    ),
    ("OTEL_SERVICE_NAME", "telemetry.service_name"),
    (
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
        "telemetry.record_content",
    ),
];

impl TelemetryConfig {
    /// Applies the standard `OTEL_*` variables over the file's values. Signal-specific
    /// variables beat the generic ones; `OTEL_SDK_DISABLED=true` beats everything.
    pub fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let get = |name: &str| {
            env(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        if let Some(v) = get("OTEL_EXPORTER_OTLP_ENDPOINT") {
            self.endpoint = Some(v);
        }
        if let Some(v) = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            self.traces_endpoint = Some(v);
        }
        for name in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ] {
            if let Some(v) = get(name) {
                self.protocol = parse_enum(name, &v, "http/protobuf or grpc")?;
            }
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        ] {
            if let Some(v) = get(name) {
                // The specification's unit is milliseconds; a humantime value is accepted too.
                self.timeout = match v.parse::<u64>() {
                    Ok(ms) => Duration::from_millis(ms),
                    Err(_) => parse_duration(name, &v)?,
                };
            }
        }
        if let Some(v) = get("OTEL_SERVICE_NAME") {
            self.service_name = v;
        }
        if let Some(v) = get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT") {
            self.record_content =
                parse_bool("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", &v)?;
        }
        if let Some(v) = get("OTEL_TRACES_EXPORTER") {
            self.enabled = Some(match v.as_str() {
                "otlp" => true,
                "none" => false,
                _ => {
                    return Err(ConfigError::Value {
                        name: "OTEL_TRACES_EXPORTER".into(),
                        value: v,
                        expected: "otlp or none",
                    });
                }
            });
        }
        if let Some(v) = get("OTEL_SDK_DISABLED")
            && parse_bool("OTEL_SDK_DISABLED", &v)?
        {
            self.enabled = Some(false);
        }
        Ok(())
    }

    /// Whether spans are exported: `enabled` when set, else whether an endpoint is given.
    pub fn exporting(&self) -> bool {
        self.enabled
            .unwrap_or(self.endpoint.is_some() || self.traces_endpoint.is_some())
    }

    /// The URL exports go to: `traces_endpoint` as is, else `endpoint` (HTTP: plus
    /// `/v1/traces`), else the protocol's local default.
    pub fn traces_url(&self) -> String {
        if let Some(url) = &self.traces_endpoint {
            return url.clone();
        }
        let base = self
            .endpoint
            .as_deref()
            .unwrap_or(self.protocol.default_endpoint());
        match self.protocol {
            OtlpProtocol::HttpProtobuf => format!("{}/v1/traces", base.trim_end_matches('/')),
            OtlpProtocol::Grpc => base.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn with_env(pairs: &[(&str, &str)]) -> TelemetryConfig {
        let mut c = TelemetryConfig::default();
        c.apply_env(&env(pairs)).unwrap();
        c
    }

    #[test]
    fn off_by_default() {
        let c = with_env(&[]);
        assert!(!c.exporting());
        assert!(!c.record_content);
        assert_eq!(c.service_name, "troupe");
    }

    #[test]
    fn an_endpoint_turns_export_on_and_the_switches_turn_it_off() {
        let c = with_env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/")]);
        assert!(c.exporting());
        assert_eq!(c.traces_url(), "http://127.0.0.1:4318/v1/traces");
        let c = with_env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ]);
        assert!(!c.exporting());
        let c = with_env(&[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://h:1/custom"),
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "otlp"),
        ]);
        assert!(!c.exporting(), "OTEL_SDK_DISABLED beats everything");
        assert_eq!(c.traces_url(), "http://h:1/custom", "used as is");
        let c = with_env(&[("OTEL_TRACES_EXPORTER", "otlp")]);
        assert!(c.exporting());
        assert_eq!(c.traces_url(), "http://localhost:4318/v1/traces");
    }

    #[test]
    fn grpc_uses_the_endpoint_as_is() {
        let c = with_env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ]);
        assert_eq!(c.protocol, OtlpProtocol::Grpc, "the traces variable wins");
        assert_eq!(c.traces_url(), "http://127.0.0.1:4317");
        let c = with_env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
        assert_eq!(c.traces_url(), "http://localhost:4317");
    }

    #[test]
    fn content_service_name_and_timeout_from_the_environment() {
        let c = with_env(&[
            ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true"),
            ("OTEL_SERVICE_NAME", "troupe-east"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ]);
        assert!(c.record_content);
        assert_eq!(c.service_name, "troupe-east");
        assert_eq!(c.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn bad_values_are_named() {
        let mut c = TelemetryConfig::default();
        let e = c
            .apply_env(&env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]))
            .unwrap_err();
        assert!(e.to_string().contains("grpc"), "{e}");
        let e = c
            .apply_env(&env(&[("OTEL_TRACES_EXPORTER", "zipkin")]))
            .unwrap_err();
        assert!(e.to_string().contains("OTEL_TRACES_EXPORTER"), "{e}");
    }

    #[test]
    fn explicit_false_in_the_file_keeps_export_off() {
        let mut c: TelemetryConfig = toml::from_str(
            r#"
enabled = false
endpoint = "http://collector:4318"
record_content = true
headers = { "x-api-key" = "k3y" }
"#,
        )
        .unwrap();
        assert!(!c.exporting());
        assert!(c.record_content);
        assert!(
            !format!("{c:?}").contains("k3y"),
            "header values are redacted"
        );
        c.apply_env(&env(&[("OTEL_TRACES_EXPORTER", "otlp")]))
            .unwrap();
        assert!(c.exporting());
        let c: TelemetryConfig = toml::from_str("protocol = \"grpc\"").unwrap();
        assert_eq!(c.protocol, OtlpProtocol::Grpc);
        assert!(!c.exporting());
    }
}
