//! The gateways' decisions as plain functions: when a stopped process starts again, and who
//! receives a reply.

use backon::{BackoffBuilder, ExponentialBuilder};
use std::time::Duration;
use tokio::time::Instant;
use troupe_runtime::modules::{ModuleDefinition, RestartPolicy};

/// What to do after a module's process exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterExit {
    /// Start it again after this delay.
    Restart(Duration),
    /// It exited `max_restarts` times within the window: it stays down.
    GiveUp,
}

/// Decides after an exit at `now`, given the times of the previous restarts (pruned to the
/// window here, newest last).
pub fn after_exit(policy: &RestartPolicy, restarts: &mut Vec<Instant>, now: Instant) -> AfterExit {
    restarts.retain(|t| now.saturating_duration_since(*t) < policy.window);
    let count = u32::try_from(restarts.len()).unwrap_or(u32::MAX);
    if count >= policy.max_restarts {
        return AfterExit::GiveUp;
    }
    AfterExit::Restart(backoff(
        policy.backoff_min,
        policy.backoff_max,
        count.saturating_add(1),
    ))
}

/// The `attempt`-th delay (from 1) of an exponential backoff (factor 2, with backon's
/// schedule) from `min` capped at `max`.
pub fn backoff(min: Duration, max: Duration, attempt: u32) -> Duration {
    if attempt == 0 {
        return Duration::ZERO;
    }
    let n = usize::try_from(attempt - 1).unwrap_or(usize::MAX);
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_factor(2.0)
        .without_max_times()
        .build()
        .nth(n)
        .unwrap_or(max)
}

/// Who receives the reply to a message `source` fed: `source` itself when it is duplex,
/// then every output or duplex module that lists it (or `*`) in `sources`, in id order.
pub fn recipients<'a>(
    modules: impl IntoIterator<Item = &'a ModuleDefinition>,
    source: &ModuleDefinition,
) -> Vec<String> {
    let mut out = Vec::new();
    if source.direction.receives() {
        out.push(source.id.clone());
    }
    for m in modules {
        if m.id != source.id && m.receives_from(&source.id) {
            out.push(m.id.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RestartPolicy {
        RestartPolicy {
            max_restarts: 3,
            window: Duration::from_secs(60),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_millis(300),
        }
    }

    #[test]
    fn restarts_back_off_and_stop_past_the_budget_of_the_window() {
        let t0 = Instant::now();
        let p = policy();
        let mut restarts = Vec::new();
        let mut delays = Vec::new();
        for i in 0..4u64 {
            let now = t0 + Duration::from_secs(i);
            match after_exit(&p, &mut restarts, now) {
                AfterExit::Restart(d) => {
                    delays.push(d.as_millis());
                    restarts.push(now);
                }
                AfterExit::GiveUp => delays.push(0),
            }
        }
        assert_eq!(delays, [100, 200, 300, 0]);
        // Once the window has passed, the budget is back.
        let later = t0 + Duration::from_secs(120);
        assert_eq!(
            after_exit(&p, &mut restarts, later),
            AfterExit::Restart(Duration::from_millis(100))
        );
        assert!(restarts.is_empty());
    }

    fn def(json: &str) -> ModuleDefinition {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn replies_go_back_to_a_duplex_source_and_to_the_outputs_that_list_it() {
        let bridge =
            def(r#"{"id":"bridge","direction":"duplex","protocol":"stdio","command":"x"}"#);
        let watcher =
            def(r#"{"id":"watcher","direction":"input","protocol":"stdio","command":"x"}"#);
        let all = def(
            r#"{"id":"all","direction":"output","protocol":"http","url":"http://x","sources":["*"]}"#,
        );
        let only = def(
            r#"{"id":"only","direction":"output","protocol":"http","url":"http://x","sources":["watcher"]}"#,
        );
        let none = def(r#"{"id":"none","direction":"output","protocol":"http","url":"http://x"}"#);
        let modules = [&all, &bridge, &none, &only, &watcher];
        assert_eq!(recipients(modules, &bridge), ["bridge", "all"]);
        assert_eq!(recipients(modules, &watcher), ["all", "only"]);
    }
}
