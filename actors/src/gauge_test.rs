//! Test helper: the gauges a piece of code leaves behind, read from a local recorder.

use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// Every gauge `record` touched, as `name{label=value,...}` and its value at the end.
pub fn gauges_after(record: impl FnOnce()) -> Vec<(String, f64)> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, record);
    let mut out: Vec<(String, f64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let DebugValue::Gauge(v) = value else {
                return None;
            };
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let name = if labels.is_empty() {
                key.key().name().to_owned()
            } else {
                format!("{}{{{}}}", key.key().name(), labels.join(","))
            };
            Some((name, v.into_inner()))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
