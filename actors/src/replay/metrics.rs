//! Replay metrics. The one label is a closed set (the outcome); task ids go to the span.

use super::report::ReplayOutcome;
use metrics::{Unit, counter, describe_counter};

/// Replays run, by outcome (identical, differs, refused).
pub const REPLAYS_TOTAL: &str = "troupe_replays_total";

/// Registers the description, and every series at 0.
pub fn describe() {
    describe_counter!(
        REPLAYS_TOTAL,
        Unit::Count,
        "Replays of recorded tasks, by outcome (identical, differs, refused)"
    );
    for outcome in ReplayOutcome::ALL {
        counter!(REPLAYS_TOTAL, "outcome" => outcome.as_str()).increment(0);
    }
}

pub fn replayed(outcome: ReplayOutcome) {
    counter!(REPLAYS_TOTAL, "outcome" => outcome.as_str()).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[test]
    fn every_outcome_is_registered_at_zero_and_counted() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            describe();
            replayed(ReplayOutcome::Differs);
        });
        let mut seen: Vec<(String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == REPLAYS_TOTAL)
            .map(|(key, _, _, value)| {
                let outcome = key
                    .key()
                    .labels()
                    .find(|l| l.key() == "outcome")
                    .map(|l| l.value().to_owned())
                    .unwrap_or_default();
                let DebugValue::Counter(n) = value else {
                    panic!("{REPLAYS_TOTAL} is a counter")
                };
                (outcome, n)
            })
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            [
                ("differs".to_owned(), 1),
                ("identical".to_owned(), 0),
                ("refused".to_owned(), 0)
            ]
        );
    }
}
