//! Metrics of troupe's A2A client. Labels are closed sets (the operation, the protocol
//! version, the outcome); agent, task and context ids go to traces and events only.

use crate::client::error::OUTCOMES;
use crate::version::{Operation, Version};
use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};
use std::time::Duration;

/// Calls to remote agents, by operation, version and outcome.
pub const CALLS: &str = "troupe_a2a_client_calls_total";
/// How long a call took to answer (a stream: until it opened).
pub const CALL_DURATION: &str = "troupe_a2a_client_call_duration_seconds";
/// Remote tasks that stopped for input, by what they asked: `approval` (a troupe peer's
/// approval request), `question` (anything else) or `auth` (credentials troupe cannot give).
pub const INPUT_REQUESTS: &str = "troupe_a2a_client_input_requests_total";
/// The kinds of [`INPUT_REQUESTS`].
pub const INPUT_KINDS: [&str; 3] = ["approval", "question", "auth"];

/// The operations the client makes.
pub const CLIENT_OPERATIONS: [Operation; 6] = [
    Operation::SendMessage,
    Operation::SendStreamingMessage,
    Operation::GetTask,
    Operation::CancelTask,
    Operation::SubscribeToTask,
    Operation::ListTasks,
];

/// Registers the descriptions, every operation's outcomes at 0 and its duration histogram.
pub fn describe() {
    describe_counter!(
        CALLS,
        Unit::Count,
        "Calls of troupe's A2A client to remote agents, by operation, protocol version and outcome"
    );
    describe_histogram!(
        CALL_DURATION,
        Unit::Seconds,
        "How long a call of troupe's A2A client took to answer (a stream: to open)"
    );
    describe_counter!(
        INPUT_REQUESTS,
        Unit::Count,
        "Remote A2A tasks that stopped for input, by kind: approval, question, auth"
    );
    for op in CLIENT_OPERATIONS {
        for version in [Version::V0_3, Version::V1_0] {
            if op.method(version).is_some() {
                for outcome in OUTCOMES {
                    counter!(CALLS, "operation" => op.label(), "version" => version.as_str(), "outcome" => outcome)
                        .increment(0);
                }
            }
        }
        let _ = histogram!(CALL_DURATION, "operation" => op.label());
    }
    for kind in INPUT_KINDS {
        counter!(INPUT_REQUESTS, "kind" => kind).increment(0);
    }
}

pub fn call(op: Operation, version: Version, outcome: &'static str) {
    counter!(CALLS, "operation" => op.label(), "version" => version.as_str(), "outcome" => outcome)
        .increment(1);
}

pub fn duration(op: Operation, took: Duration) {
    histogram!(CALL_DURATION, "operation" => op.label()).record(took.as_secs_f64());
}

/// `kind`: one of [`INPUT_KINDS`].
pub fn input_request(kind: &'static str) {
    counter!(INPUT_REQUESTS, "kind" => kind).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[test]
    fn every_series_exists_at_zero_from_the_start_and_counts() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            describe();
            call(Operation::GetTask, Version::V1_0, "rpc_error");
            input_request("question");
        });
        let snapshot = snapshotter.snapshot().into_vec();
        let histograms: Vec<String> = snapshot
            .iter()
            .filter(|(key, _, _, value)| {
                key.key().name() == CALL_DURATION && matches!(value, DebugValue::Histogram(_))
            })
            .filter_map(|(key, _, _, _)| key.key().labels().next().map(|l| l.value().to_owned()))
            .collect();
        assert_eq!(histograms.len(), CLIENT_OPERATIONS.len(), "{histograms:?}");
        let series: Vec<(String, Vec<String>, u64)> = snapshot
            .into_iter()
            .filter_map(|(key, _, _, value)| match value {
                DebugValue::Counter(n) => Some((
                    key.key().name().to_owned(),
                    key.key().labels().map(|l| l.value().to_owned()).collect(),
                    n,
                )),
                _ => None,
            })
            .collect();
        let count = |name: &str, labels: &[&str]| {
            series
                .iter()
                .find(|(n, l, _)| n == name && l == labels)
                .map(|(_, _, v)| *v)
        };
        // 1.0 has the six operations, 0.3 all but ListTasks.
        assert_eq!(
            series
                .iter()
                .filter(|(n, l, _)| n == CALLS && l[2] == "ok")
                .count(),
            11
        );
        assert_eq!(
            series.iter().filter(|(n, _, _)| n == CALLS).count(),
            11 * OUTCOMES.len()
        );
        assert_eq!(count(CALLS, &["send_message", "0.3", "ok"]), Some(0));
        assert_eq!(
            count(CALLS, &["subscribe_to_task", "1.0", "transport_error"]),
            Some(0)
        );
        assert_eq!(count(CALLS, &["list_tasks", "0.3", "ok"]), None);
        assert_eq!(count(CALLS, &["get_task", "1.0", "rpc_error"]), Some(1));
        assert_eq!(count(INPUT_REQUESTS, &["auth"]), Some(0));
        assert_eq!(count(INPUT_REQUESTS, &["question"]), Some(1));
    }
}
