//! Wall-clock milliseconds that follow tokio's clock.
//!
//! Timestamps (event times, approval expiries, TTL cut-offs) must agree with the timers that
//! act on them, and tests run those timers with paused tokio time. A `Clock` captures the wall
//! time and tokio's `Instant` once, then derives every later wall time from tokio's clock, so
//! a paused-time test that advances an hour sees timestamps an hour later.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Unix milliseconds now, from the system clock (0 before 1970, saturating far ahead). For
/// record timestamps outside the timers' world; what timers act on goes through [`Clock`].
pub fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Unix milliseconds read from the system clock each time (or, in tests, from a function):
/// for times that must follow the wall, such as a token's expiry, which a person set as a
/// date, and which a clock derived from a monotonic one ([`Clock`]) would move past a
/// suspend of the machine (the monotonic clock stops, the wall does not).
#[derive(Clone, Default)]
pub struct WallClock(Option<std::sync::Arc<dyn Fn() -> u64 + Send + Sync>>);

impl WallClock {
    /// The system clock.
    pub fn system() -> Self {
        Self(None)
    }

    /// A clock that reads `now` (tests).
    pub fn from_fn(now: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self(Some(std::sync::Arc::new(now)))
    }

    /// Unix milliseconds now.
    pub fn now_ms(&self) -> u64 {
        self.0.as_ref().map_or_else(unix_now_ms, |now| now())
    }
}

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "WallClock(test)"
        } else {
            "WallClock(system)"
        })
    }
}

/// A wall clock anchored on tokio's monotonic clock. Cheap to copy.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall_base_ms: u64,
    instant_base: Instant,
}

impl Clock {
    /// Anchors a clock now. Must run inside a tokio runtime when time is paused.
    pub fn new() -> Self {
        Self {
            wall_base_ms: unix_now_ms(),
            instant_base: Instant::now(),
        }
    }

    /// Unix milliseconds now.
    pub fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// Unix milliseconds at a tokio instant.
    pub fn ms_at(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.instant_base);
        self.wall_base_ms
            .saturating_add(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }

    /// The tokio instant of a unix millisecond time (clamped to the anchor).
    pub fn instant_at(&self, ms: u64) -> Instant {
        self.instant_base + Duration::from_millis(ms.saturating_sub(self.wall_base_ms))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_paused_time() {
        let clock = Clock::new();
        let t0 = clock.now_ms();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(clock.now_ms() - t0, 3_600_000);
        assert_eq!(clock.ms_at(clock.instant_at(t0 + 5)), t0 + 5);
    }
}
