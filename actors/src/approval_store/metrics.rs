//! ApprovalStore metrics: names, descriptions and typed helpers. Labels are bounded enums only;
//! approval and conversation ids go into spans and events, never into labels.

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use std::time::Duration;

/// Requests received, by admission (one per caller).
pub const REQUESTED_TOTAL: &str = "troupe_approval_requested_total";
/// Requests answered, by outcome (one per caller, so two callers sharing a pending request
/// count twice).
pub const RESOLVED_TOTAL: &str = "troupe_approval_resolved_total";
/// Pending requests waiting for a human, summed over the sessions of this process.
pub const PENDING: &str = "troupe_approval_pending";
/// Stored keys (expired ones included until the next sweep), summed over sessions.
pub const KEYS: &str = "troupe_approval_keys";
/// How long a pending request waited for its resolution, by outcome.
pub const WAIT_SECONDS: &str = "troupe_approval_wait_seconds";
/// Requests asked again of a store that replaced one that failed before answering, by who
/// asked.
pub const REASKED_TOTAL: &str = "troupe_approval_reasked_total";

/// Who waits for an approval (a label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Asker {
    /// A task's command or patch.
    Task,
    /// An MCP server's elicitation or sampling request.
    Mcp,
}

impl Asker {
    pub const ALL: [Self; 2] = [Self::Task, Self::Mcp];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Task => "task",
            Self::Mcp => "mcp",
        }
    }
}

/// How a request ended, as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A key covered it; no human was asked (or the human's answer to another request did).
    Remembered,
    /// A human approved it.
    Approved,
    /// A human refused it.
    Denied,
    /// Nobody answered in time.
    TimedOut,
    /// Withdrawn: its task was cancelled or aborted, or nobody waits any more.
    Withdrawn,
}

impl Outcome {
    pub const ALL: [Self; 5] = [
        Self::Remembered,
        Self::Approved,
        Self::Denied,
        Self::TimedOut,
        Self::Withdrawn,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Remembered => "remembered",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::TimedOut => "timed_out",
            Self::Withdrawn => "withdrawn",
        }
    }
}

/// How a request was taken in, as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdmissionLabel {
    /// A key covered it: answered at once.
    Remembered,
    /// A new pending request: a human is asked.
    Asked,
    /// An identical request was already pending: the caller waits for its answer.
    Attached,
}

impl AdmissionLabel {
    pub const ALL: [Self; 3] = [Self::Remembered, Self::Asked, Self::Attached];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Remembered => "remembered",
            Self::Asked => "asked",
            Self::Attached => "attached",
        }
    }
}

/// Registers descriptions; call once after installing a recorder.
pub fn describe() {
    describe_counter!(
        REQUESTED_TOTAL,
        Unit::Count,
        "Approval requests received, by admission (remembered, asked, attached)."
    );
    describe_counter!(
        RESOLVED_TOTAL,
        Unit::Count,
        "Approval requests answered, by outcome (remembered, approved, denied, timed_out)."
    );
    // Closed label sets: every series exists from the start, so that a ratio or an alert on
    // denials or expiries reads 0 rather than nothing.
    for admission in AdmissionLabel::ALL {
        counter!(REQUESTED_TOTAL, "admission" => admission.as_str()).increment(0);
    }
    for outcome in Outcome::ALL {
        counter!(RESOLVED_TOTAL, "outcome" => outcome.as_str()).increment(0);
    }
    describe_gauge!(
        PENDING,
        Unit::Count,
        "Approval requests waiting for a human."
    );
    describe_gauge!(
        KEYS,
        Unit::Count,
        "Approval keys held (expired keys count until swept)."
    );
    describe_histogram!(
        WAIT_SECONDS,
        Unit::Seconds,
        "Time from an approval request to its resolution, by outcome."
    );
    describe_counter!(
        REASKED_TOTAL,
        Unit::Count,
        "Approval requests asked again of a store that replaced a failed one, by asker (task, mcp)."
    );
    for asker in Asker::ALL {
        counter!(REASKED_TOTAL, "asker" => asker.as_str()).increment(0);
    }
    gauge!(PENDING).increment(0.0);
    gauge!(KEYS).increment(0.0);
    for outcome in Outcome::ALL {
        // Registering the handle is enough for an empty histogram to be exported.
        let _ = histogram!(WAIT_SECONDS, "outcome" => outcome.as_str());
    }
}

/// Counts a request asked again after its store failed.
pub fn reasked(asker: Asker) {
    counter!(REASKED_TOTAL, "asker" => asker.as_str()).increment(1);
}

/// Counts one request taken in.
pub fn requested(admission: AdmissionLabel) {
    counter!(REQUESTED_TOTAL, "admission" => admission.as_str()).increment(1);
}

/// Counts `callers` answers with `outcome`.
pub fn answered(outcome: Outcome, callers: usize) {
    counter!(RESOLVED_TOTAL, "outcome" => outcome.as_str())
        .increment(u64::try_from(callers).unwrap_or(u64::MAX));
}

/// Records how long a pending request waited.
pub fn waited(outcome: Outcome, waited: Duration) {
    histogram!(WAIT_SECONDS, "outcome" => outcome.as_str()).record(waited.as_secs_f64());
}

/// The sizes last reported by one store. Several stores (one per session) share the unlabeled
/// gauges, so each reports only its own changes instead of setting absolute values.
#[derive(Debug, Default)]
pub struct Gauges {
    pending: usize,
    keys: usize,
}

impl Gauges {
    /// Moves the shared gauges by the change since the last report.
    pub fn sync(&mut self, pending: usize, keys: usize) {
        shift(PENDING, self.pending, pending);
        shift(KEYS, self.keys, keys);
        self.pending = pending;
        self.keys = keys;
    }

    /// Withdraws everything this store reported (it is stopping).
    pub fn clear(&mut self) {
        self.sync(0, 0);
    }
}

impl Drop for Gauges {
    /// A store that fails runs no `post_stop`: its share of the gauges goes with its state.
    fn drop(&mut self) {
        self.clear();
    }
}

fn shift(name: &'static str, from: usize, to: usize) {
    // Counts this small are exact in f64.
    match to.cmp(&from) {
        std::cmp::Ordering::Greater => gauge!(name).increment((to - from) as f64),
        std::cmp::Ordering::Less => gauge!(name).decrement((from - to) as f64),
        std::cmp::Ordering::Equal => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_whose_state_drops_withdraws_what_it_reported() {
        let mut kept = Gauges::default();
        let gauges = crate::gauge_test::gauges_after(|| {
            kept.sync(1, 1);
            // A store that failed: no `post_stop`, its state dropped.
            let mut failed = Gauges::default();
            failed.sync(3, 2);
            drop(failed);
        });
        assert_eq!(gauges, [(KEYS.to_owned(), 1.0), (PENDING.to_owned(), 1.0)]);
    }
}
