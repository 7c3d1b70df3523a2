//! [`McpLimits`]: the limits and timings of a pool, and their validation.

use super::*;

/// Limits and timings of a pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct McpLimits {
    /// How long a connection nobody references stays open (a view reopened meanwhile keeps
    /// it).
    pub idle_timeout: Duration,
    /// First restart delay after a death or failed connect; doubles per consecutive failure.
    pub restart_backoff_base: Duration,
    /// The longest restart delay; a connection that stays up this long resets the delay.
    pub restart_backoff_max: Duration,
    /// Calls of one conversation in flight at once (>= 1).
    pub per_conversation_concurrency: usize,
    /// Calls of one conversation per second, with a burst; `None` = unlimited.
    pub per_conversation_rate: Option<Rate>,
    /// Calls of the whole session in flight at once (>= 1).
    pub session_concurrency: usize,
    /// How long a call may wait for its slots and rate token before `Overloaded`.
    pub wait_bound: Duration,
    /// How long one call may run.
    pub call_timeout: Duration,
    /// How long a connect (handshake and first listing) may take before it counts as failed.
    pub connect_timeout: Duration,
}

impl Default for McpLimits {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_secs(60),
            restart_backoff_base: Duration::from_millis(500),
            restart_backoff_max: Duration::from_secs(30),
            per_conversation_concurrency: 4,
            per_conversation_rate: Some(Rate {
                per_second: 10.0,
                burst: 20,
            }),
            session_concurrency: 16,
            wait_bound: Duration::from_secs(30),
            call_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(30),
        }
    }
}

impl McpLimits {
    /// Checks the limits; the error names every bad one.
    pub fn validate(&self) -> Result<(), AgentError> {
        let mut problems = Vec::new();
        if self.per_conversation_concurrency == 0 {
            problems.push("per_conversation_concurrency must be at least 1");
        }
        if self.session_concurrency == 0 {
            problems.push("session_concurrency must be at least 1");
        }
        if let Some(rate) = self.per_conversation_rate {
            if !(rate.per_second.is_finite() && rate.per_second > 0.0) {
                problems.push("per_conversation_rate.per_second must be a positive number");
            }
            if rate.burst == 0 {
                problems.push("per_conversation_rate.burst must be at least 1");
            }
        }
        if self.restart_backoff_base.is_zero() {
            problems.push("restart_backoff_base must be positive");
        }
        // The delay is the doubled base capped at the max: a max below the base (zero, say)
        // would restart a crashing server in a tight loop.
        if self.restart_backoff_max < self.restart_backoff_base {
            problems.push("restart_backoff_max must be at least restart_backoff_base");
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(AgentError::invalid(format!(
                "invalid MCP limits: {}",
                problems.join("; ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backoff_max_below_its_base_is_refused() {
        assert!(McpLimits::default().validate().is_ok());
        for max in [Duration::ZERO, Duration::from_millis(100)] {
            let limits = McpLimits {
                restart_backoff_base: Duration::from_millis(500),
                restart_backoff_max: max,
                ..McpLimits::default()
            };
            let error = limits.validate().unwrap_err().to_string();
            assert!(error.contains("restart_backoff_max"), "{error}");
        }
    }
}
