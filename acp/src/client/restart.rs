//! When to start an agent's process again: an exponential backoff (backon) over the
//! consecutive failures (crashes and failed starts), counted from the last one.

use backon::{BackoffBuilder, ExponentialBuilder};
use std::time::Duration;

/// The backoff before a start that follows failures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RestartPolicy {
    /// The wait after one failure.
    pub min_delay: Duration,
    /// The longest wait.
    pub max_delay: Duration,
    /// Each further failure multiplies the wait by this.
    pub factor: f32,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(10),
            factor: 2.0,
        }
    }
}

impl RestartPolicy {
    /// The backoff's delay after `failures` consecutive failures (none after none).
    pub fn delay(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let n = usize::try_from(failures - 1).unwrap_or(usize::MAX);
        ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_factor(self.factor)
            .without_max_times()
            .build()
            .nth(n)
            .unwrap_or(self.max_delay)
    }

    /// How long a start must still wait, `since_failure` after the last failure.
    pub fn wait(&self, failures: u32, since_failure: Duration) -> Duration {
        self.delay(failures).saturating_sub(since_failure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_up_to_the_cap_and_counts_from_the_failure() {
        let p = RestartPolicy {
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
            factor: 2.0,
        };
        let ms = |n| p.delay(n).as_millis();
        assert_eq!(
            [ms(0), ms(1), ms(2), ms(3), ms(4), ms(9)],
            [0, 100, 200, 400, 500, 500]
        );
        assert_eq!(p.wait(2, Duration::from_millis(150)).as_millis(), 50);
        assert_eq!(p.wait(2, Duration::from_secs(1)), Duration::ZERO);
    }
}
