//! When to retry a model request and how long to wait. Pure, so the policy is tested without
//! a server or a clock.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

/// Statuses worth another attempt: rate limiting and server-side failures.
pub fn is_retryable_status(status: u16) -> bool {
    status == 429 || (500..=599).contains(&status)
}

/// Why an attempt is retried (a bounded metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    RateLimited,
    ServerError,
    Transport,
}

impl RetryReason {
    pub const ALL: [Self; 3] = [Self::RateLimited, Self::ServerError, Self::Transport];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RateLimited => "rate_limited",
            Self::ServerError => "server_error",
            Self::Transport => "transport",
        }
    }

    pub fn of_status(status: u16) -> Self {
        if status == 429 {
            Self::RateLimited
        } else {
            Self::ServerError
        }
    }
}

/// The wait before retry number `retry` (0 for the first retry): the server's `Retry-After`
/// when it gave one, else `base * 2^retry` with equal jitter (half fixed, half random, so
/// clients that failed together do not retry together); both capped at `max`.
pub fn delay(
    retry: u32,
    retry_after: Option<Duration>,
    base: Duration,
    max: Duration,
    jitter: f64,
) -> Duration {
    if let Some(wait) = retry_after {
        return wait.min(max);
    }
    let exp = base
        .checked_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
        .unwrap_or(max)
        .min(max);
    let half = exp / 2;
    half + half.mul_f64(jitter.clamp(0.0, 1.0))
}

/// A number in `[0, 1)` that differs between calls, processes and machines; good enough to
/// spread retries, not for anything secret.
pub fn jitter() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The wait a server asked for: `retry-after-ms` (OpenAI's), else `Retry-After` in seconds or
/// as an HTTP date (relative to `now`; a date in the past means no wait).
pub fn retry_after(headers: &reqwest::header::HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return finite_secs(ms / 1000.0);
    }
    parse_retry_after(text("retry-after")?, now)
}

/// Parses a `Retry-After` value: delta-seconds or an HTTP date.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return finite_secs(secs);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

fn finite_secs(secs: f64) -> Option<Duration> {
    (secs.is_finite() && secs >= 0.0)
        .then(|| Duration::try_from_secs_f64(secs).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn retryable_statuses() {
        for s in [429, 500, 502, 503, 504, 599] {
            assert!(is_retryable_status(s), "{s}");
        }
        for s in [200, 400, 401, 403, 404, 408, 409, 422, 600] {
            assert!(!is_retryable_status(s), "{s}");
        }
        assert_eq!(RetryReason::of_status(429), RetryReason::RateLimited);
        assert_eq!(RetryReason::of_status(503), RetryReason::ServerError);
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let base = 100 * MS;
        let max = 1000 * MS;
        // jitter 0: half the exponential step; jitter ~1: the whole step.
        assert_eq!(delay(0, None, base, max, 0.0), 50 * MS);
        assert_eq!(delay(0, None, base, max, 1.0), 100 * MS);
        assert_eq!(delay(1, None, base, max, 0.0), 100 * MS);
        assert_eq!(delay(2, None, base, max, 1.0), 400 * MS);
        assert_eq!(delay(3, None, base, max, 0.5), 600 * MS);
        assert_eq!(delay(4, None, base, max, 1.0), max);
        assert_eq!(delay(40, None, base, max, 1.0), max);
        assert_eq!(delay(u32::MAX, None, base, max, 1.0), max);
        for _ in 0..100 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j));
            let d = delay(1, None, base, max, j);
            assert!(d >= 100 * MS && d <= 200 * MS);
        }
    }

    #[test]
    fn retry_after_wins_but_is_capped() {
        let max = 2000 * MS;
        assert_eq!(delay(0, Some(1500 * MS), MS, max, 0.9), 1500 * MS);
        assert_eq!(delay(5, Some(Duration::ZERO), MS, max, 0.9), Duration::ZERO);
        assert_eq!(delay(0, Some(Duration::from_secs(60)), MS, max, 0.0), max);
    }

    #[test]
    fn retry_after_values() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(parse_retry_after("3", now), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(" 0.25 ", now), Some(250 * MS));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("-1", now), None);
        assert_eq!(parse_retry_after("soon", now), None);

        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&headers, now), None);
        headers.insert("retry-after", "7".parse().unwrap());
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(7)));
        headers.insert("retry-after-ms", "120".parse().unwrap());
        assert_eq!(retry_after(&headers, now), Some(120 * MS));
    }
}
