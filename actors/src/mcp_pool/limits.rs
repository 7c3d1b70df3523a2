//! Call admission: a per-conversation concurrency slot, a per-conversation rate token and a
//! session-wide slot, each waited for in the caller's task (never in the pool's mailbox).
//!
//! Concurrency slots are tokio `Semaphore` permits: FIFO, released by `Drop` even when the
//! calling task is aborted, so a slot can never leak. The rate is a GCRA (the virtual-scheduling
//! form of a token bucket) over one atomic "theoretical arrival time": a call reserves the next
//! conforming instant with a compare-and-swap and sleeps until it. Neither is a lock, and neither
//! lives in the pool actor's state: the actor only hands the same `Arc` to every view of a
//! conversation.

use super::McpLimits;
use super::metrics::{self, Limit};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use troupe_proto::AgentError;

/// A call rate: `per_second` on average, up to `burst` at once after a quiet spell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Sustained calls per second (> 0, finite).
    pub per_second: f64,
    /// Calls that may start back to back after a quiet spell (>= 1).
    pub burst: u32,
}

/// What every view of one conversation shares: its concurrency slots and its rate.
#[derive(Debug)]
pub struct ConversationLimiter {
    slots: Arc<Semaphore>,
    rate: Option<RateLimiter>,
}

impl ConversationLimiter {
    pub fn new(limits: &McpLimits) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(limits.per_conversation_concurrency.max(1))),
            rate: limits.per_conversation_rate.map(RateLimiter::new),
        }
    }
}

/// The slots a call holds while it runs; dropping it gives them back.
#[derive(Debug)]
pub struct CallSlots {
    _conversation: OwnedSemaphorePermit,
    _session: OwnedSemaphorePermit,
}

/// Takes a conversation slot, then a rate token, then a session slot, waiting at most
/// `limits.wait_bound` in all. In that order so that a conversation over its own limits never
/// sits on a session slot, and a call sleeping for its rate token holds no session slot.
///
/// A rate token whose wait is already known to exceed what is left of the bound is refused at
/// once instead of after a pointless wait. `closed` fires when the server's connection dies, so
/// a waiting call fails as fast as a running one.
pub async fn admit(
    conversation: &ConversationLimiter,
    session: &Arc<Semaphore>,
    limits: &McpLimits,
    server: &str,
    closed: &CancellationToken,
    cancel: &CancellationToken,
) -> Result<CallSlots, AgentError> {
    let started = Instant::now();
    let deadline = started + limits.wait_bound;
    let waits = Waits {
        deadline,
        closed,
        cancel,
        server,
        limits,
    };
    // A free slot is taken without setting up the wait (timer, cancellation waiters): the
    // common case, on every call's path.
    let conv = match conversation.slots.clone().try_acquire_owned() {
        Ok(permit) if waits.still_wanted() => permit,
        _ => waits
            .wait(
                conversation.slots.clone().acquire_owned(),
                Limit::ConversationConcurrency,
            )
            .await?
            .map_err(|_| AgentError::internal("conversation MCP slots closed"))?,
    };
    if let Some(rate) = &conversation.rate {
        let now = Instant::now();
        match rate.reserve(now, deadline.saturating_duration_since(now)) {
            Ok(wait) if wait.is_zero() => {}
            Ok(wait) => {
                waits
                    .wait(tokio::time::sleep(wait), Limit::ConversationRate)
                    .await?;
            }
            Err(_) => return Err(overloaded(Limit::ConversationRate, limits)),
        }
    }
    let sess = match session.clone().try_acquire_owned() {
        Ok(permit) if waits.still_wanted() => permit,
        _ => waits
            .wait(session.clone().acquire_owned(), Limit::SessionConcurrency)
            .await?
            .map_err(|_| AgentError::internal("session MCP slots closed"))?,
    };
    metrics::slot_wait(started.elapsed());
    Ok(CallSlots {
        _conversation: conv,
        _session: sess,
    })
}

/// What bounds every wait of one admission.
struct Waits<'a> {
    deadline: Instant,
    closed: &'a CancellationToken,
    cancel: &'a CancellationToken,
    server: &'a str,
    limits: &'a McpLimits,
}

impl Waits<'_> {
    /// Neither cancelled nor closed: a slot taken at once may be used (otherwise `wait`
    /// answers why not, exactly as it would have).
    fn still_wanted(&self) -> bool {
        !self.cancel.is_cancelled() && !self.closed.is_cancelled()
    }

    /// Awaits `fut` unless the call is cancelled, the connection closes or the deadline
    /// passes first (a tie goes to `fut`).
    async fn wait<T>(&self, fut: impl Future<Output = T>, limit: Limit) -> Result<T, AgentError> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(AgentError::cancelled(
                "the MCP call was cancelled while it waited for a slot",
            )),
            _ = self.closed.cancelled() => Err(AgentError::McpError {
                server: self.server.to_owned(),
                message: "the connection closed while the call waited for a slot".into(),
            }),
            out = fut => Ok(out),
            _ = tokio::time::sleep_until(self.deadline) => Err(overloaded(limit, self.limits)),
        }
    }
}

/// The error of a limit that stayed full past the wait bound; names the limit.
pub fn overloaded(limit: Limit, limits: &McpLimits) -> AgentError {
    metrics::overloaded(limit);
    let waited = limits.wait_bound;
    let (resource, n) = match limit {
        Limit::ConversationConcurrency => (
            format!("concurrent MCP calls of this conversation (waited {waited:?})"),
            limits.per_conversation_concurrency,
        ),
        Limit::SessionConcurrency => (
            format!("concurrent MCP calls of the session (waited {waited:?})"),
            limits.session_concurrency,
        ),
        Limit::ConversationRate => {
            let rate = limits.per_conversation_rate;
            let per_second = rate.map_or(0.0, |r| r.per_second);
            let burst = rate.map_or(0, |r| r.burst);
            (
                format!(
                    "MCP call rate of this conversation ({per_second} calls/s, burst {burst}; \
                     the next token is more than {waited:?} away)"
                ),
                burst as usize,
            )
        }
    };
    AgentError::Overloaded {
        resource,
        limit: u32::try_from(n).unwrap_or(u32::MAX),
    }
}

/// A GCRA rate limiter: one atomic holds the theoretical arrival time (TAT) in nanoseconds
/// since `base`.
#[derive(Debug)]
pub struct RateLimiter {
    base: Instant,
    tat: AtomicU64,
    /// Nanoseconds between calls at the sustained rate.
    interval: u64,
    /// How far ahead of the TAT a call may start: `(burst - 1) * interval`.
    tolerance: u64,
}

impl RateLimiter {
    pub fn new(rate: Rate) -> Self {
        let (interval, tolerance) = gcra_params(rate);
        Self {
            base: Instant::now(),
            tat: AtomicU64::new(0),
            interval,
            tolerance,
        }
    }

    /// Reserves the next token: `Ok(wait)` until the call may start (zero = now), or
    /// `Err(wait)` when that is more than `max_wait` away (nothing is reserved then).
    pub fn reserve(&self, now: Instant, max_wait: Duration) -> Result<Duration, Duration> {
        let now = nanos(now.saturating_duration_since(self.base));
        let max_wait = nanos(max_wait);
        let mut current = self.tat.load(Ordering::Acquire);
        loop {
            match gcra(current, now, self.interval, self.tolerance, max_wait) {
                Err(need) => return Err(Duration::from_nanos(need)),
                Ok((next, wait)) => match self.tat.compare_exchange_weak(
                    current,
                    next,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Ok(Duration::from_nanos(wait)),
                    Err(actual) => current = actual,
                },
            }
        }
    }
}

/// `(interval, tolerance)` in nanoseconds for a rate.
pub fn gcra_params(rate: Rate) -> (u64, u64) {
    let interval = if rate.per_second.is_finite() && rate.per_second > 0.0 {
        // Saturating float-to-int cast; at least 1 ns so the arithmetic stays monotone.
        ((1e9 / rate.per_second) as u64).max(1)
    } else {
        1
    };
    let tolerance = interval.saturating_mul(u64::from(rate.burst.max(1) - 1));
    (interval, tolerance)
}

/// One GCRA decision. `tat` is the theoretical arrival time, `now` the request time, all in
/// nanoseconds. A call may start at `max(now, tat - tolerance)`; if that is within `max_wait`
/// it is admitted and the TAT moves one interval past `max(tat, now)`. Returns
/// `Ok((new_tat, wait))` or `Err(wait needed)`.
pub fn gcra(
    tat: u64,
    now: u64,
    interval: u64,
    tolerance: u64,
    max_wait: u64,
) -> Result<(u64, u64), u64> {
    let tat = tat.max(now);
    let wait = tat.saturating_sub(tolerance).saturating_sub(now);
    if wait > max_wait {
        Err(wait)
    } else {
        Ok((tat.saturating_add(interval), wait))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn params_follow_the_rate() {
        let r = Rate {
            per_second: 4.0,
            burst: 3,
        };
        assert_eq!(gcra_params(r), (SEC / 4, 2 * SEC / 4));
        let one = Rate {
            per_second: 0.5,
            burst: 1,
        };
        assert_eq!(gcra_params(one), (2 * SEC, 0));
    }

    #[test]
    fn a_burst_passes_then_calls_are_spaced() {
        let (interval, tolerance) = gcra_params(Rate {
            per_second: 1.0,
            burst: 3,
        });
        let mut tat = 0;
        for _ in 0..3 {
            let (next, wait) = gcra(tat, 0, interval, tolerance, 0).unwrap();
            assert_eq!(wait, 0);
            tat = next;
        }
        // The fourth at t=0 needs one interval.
        assert_eq!(gcra(tat, 0, interval, tolerance, 0), Err(SEC));
        // Allowed to wait: reserved for t=1s.
        let (next, wait) = gcra(tat, 0, interval, tolerance, SEC).unwrap();
        assert_eq!(wait, SEC);
        // And the fifth for t=2s.
        assert_eq!(
            gcra(next, 0, interval, tolerance, 5 * SEC).unwrap().1,
            2 * SEC
        );
    }

    #[test]
    fn a_refused_request_reserves_nothing() {
        let (interval, tolerance) = gcra_params(Rate {
            per_second: 1.0,
            burst: 1,
        });
        let (tat, _) = gcra(0, 0, interval, tolerance, 0).unwrap();
        assert!(gcra(tat, 0, interval, tolerance, 0).is_err());
        // The refused request left `tat` unchanged: one second later a call passes at once.
        assert_eq!(gcra(tat, SEC, interval, tolerance, 0).unwrap().1, 0);
    }

    #[test]
    fn a_quiet_spell_refills_only_up_to_the_burst() {
        let (interval, tolerance) = gcra_params(Rate {
            per_second: 1.0,
            burst: 2,
        });
        let mut tat = 0;
        let now = 3600 * SEC;
        let mut passed = 0;
        while let Ok((next, 0)) = gcra(tat, now, interval, tolerance, 0) {
            tat = next;
            passed += 1;
        }
        assert_eq!(passed, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_limiter_reserves_in_order() {
        let limiter = RateLimiter::new(Rate {
            per_second: 2.0,
            burst: 1,
        });
        let now = Instant::now();
        let long = Duration::from_secs(10);
        assert_eq!(limiter.reserve(now, long), Ok(Duration::ZERO));
        assert_eq!(limiter.reserve(now, long), Ok(Duration::from_millis(500)));
        assert_eq!(limiter.reserve(now, long), Ok(Duration::from_millis(1000)));
        assert_eq!(
            limiter.reserve(now, Duration::from_millis(100)),
            Err(Duration::from_millis(1500))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the arrivals and waits allowed, the start times of admitted calls keep
        /// the rate: any n+1 consecutive starts span at least n intervals minus the tolerance
        /// (so a window of length T holds at most burst + T / interval starts), and no call
        /// waits longer than it was allowed to.
        #[test]
        fn admitted_starts_respect_the_rate(
            per_second in 0.5f64..50.0,
            burst in 1u32..8,
            gaps in proptest::collection::vec(0u64..(2 * SEC), 1..80),
            max_waits in proptest::collection::vec(0u64..(3 * SEC), 80),
        ) {
            let (interval, tolerance) = gcra_params(Rate { per_second, burst });
            let mut tat = 0;
            let mut now = 0;
            let mut starts: Vec<u64> = Vec::new();
            for (gap, max_wait) in gaps.iter().zip(max_waits.iter()) {
                now += gap;
                match gcra(tat, now, interval, tolerance, *max_wait) {
                    Ok((next, wait)) => {
                        prop_assert!(wait <= *max_wait);
                        tat = next;
                        starts.push(now + wait);
                    }
                    Err(need) => prop_assert!(need > *max_wait),
                }
            }
            // Reserved starts are handed out in order.
            prop_assert!(starts.windows(2).all(|w| w[0] <= w[1]));
            for i in 0..starts.len() {
                for j in (i + 1)..starts.len() {
                    let n = (j - i) as u64;
                    prop_assert!(
                        starts[j] - starts[i] + tolerance >= n * interval,
                        "starts {i} and {j} too close"
                    );
                }
            }
        }

        /// Arrivals that keep the sustained rate are never delayed.
        #[test]
        fn calls_at_the_rate_never_wait(
            per_second in 0.5f64..50.0,
            burst in 1u32..8,
            n in 1usize..60,
        ) {
            let (interval, tolerance) = gcra_params(Rate { per_second, burst });
            let mut tat = 0;
            for k in 0..n as u64 {
                let (next, wait) = gcra(tat, k * interval, interval, tolerance, 0)
                    .map_err(|e| TestCaseError::fail(format!("refused, needs {e}")))?;
                prop_assert_eq!(wait, 0);
                tat = next;
            }
        }
    }
}
