//! The OAuth decisions, as plain functions of their inputs: is a token due for renewal, what to
//! send after a 401, what a failed renewal means.

use crate::mcp::metrics::RenewalOutcome;
use rmcp::transport::auth::AuthError;
use std::time::Duration;

/// A token is renewed this long before it expires (or halfway through its life, for tokens
/// that live less than twice as long), so that it does not expire between being read and
/// reaching the server.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(30);

/// Whether a token received at `received_at` (seconds since the epoch) that lives
/// `expires_in` should be renewed at `now` before it is sent. A token that says nothing of its
/// lifetime is used until the server refuses it.
pub fn needs_renewal(now: u64, received_at: Option<u64>, expires_in: Option<Duration>) -> bool {
    let (Some(received_at), Some(lifetime)) = (received_at, expires_in) else {
        return false;
    };
    let lifetime = lifetime.as_secs();
    let margin = REFRESH_MARGIN.as_secs().min(lifetime / 2);
    now.saturating_sub(received_at).saturating_add(margin) >= lifetime
}

/// After the server refused `sent`: the token to retry with, when someone else already
/// renewed it (`stored` is another, still fresh), or `None` to renew now.
pub fn renewed_meanwhile<'a>(
    sent: Option<&str>,
    stored: Option<&'a str>,
    stored_fresh: bool,
) -> Option<&'a str> {
    match stored {
        Some(token) if stored_fresh && Some(token) != sent => Some(token),
        _ => None,
    }
}

/// What a failed renewal means: the authorization server's definite "no" (a person must log
/// in again, or the client credentials are wrong) or a failure worth retrying later.
pub fn renewal_outcome(error: &AuthError) -> RenewalOutcome {
    match error {
        AuthError::AuthorizationRequired
        | AuthError::TokenRefreshRejected(_)
        | AuthError::ClientCredentialsError(_)
        | AuthError::AuthorizationFailed(_)
        | AuthError::InvalidScope(_) => RenewalOutcome::LoginRequired,
        _ => RenewalOutcome::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_token_is_renewed_within_the_margin_of_its_expiry() {
        assert!(!needs_renewal(1000, Some(1000), Some(HOUR)));
        assert!(!needs_renewal(1000 + 3569, Some(1000), Some(HOUR)));
        assert!(needs_renewal(1000 + 3570, Some(1000), Some(HOUR)));
        assert!(needs_renewal(1000 + 7200, Some(1000), Some(HOUR)));
        // A short-lived token is renewed halfway.
        let ten = Duration::from_secs(10);
        assert!(!needs_renewal(1004, Some(1000), Some(ten)));
        assert!(needs_renewal(1005, Some(1000), Some(ten)));
        // A clock that went back does not make a token expire.
        assert!(!needs_renewal(900, Some(1000), Some(HOUR)));
        // An already expired lifetime is always due.
        assert!(needs_renewal(1000, Some(1000), Some(Duration::ZERO)));
    }

    #[test]
    fn a_token_without_a_lifetime_is_used_until_refused() {
        assert!(!needs_renewal(u64::MAX, Some(0), None));
        assert!(!needs_renewal(u64::MAX, None, Some(HOUR)));
    }

    #[test]
    fn a_token_renewed_meanwhile_is_used_instead_of_renewing_again() {
        assert_eq!(renewed_meanwhile(Some("a"), Some("b"), true), Some("b"));
        assert_eq!(renewed_meanwhile(Some("a"), Some("a"), true), None);
        assert_eq!(renewed_meanwhile(Some("a"), Some("b"), false), None);
        assert_eq!(renewed_meanwhile(Some("a"), None, true), None);
        assert_eq!(renewed_meanwhile(None, Some("b"), true), Some("b"));
    }

    #[test]
    fn a_refusal_needs_a_login_and_a_network_failure_does_not() {
        assert_eq!(
            renewal_outcome(&AuthError::TokenRefreshRejected("invalid_grant".into())),
            RenewalOutcome::LoginRequired
        );
        assert_eq!(
            renewal_outcome(&AuthError::AuthorizationRequired),
            RenewalOutcome::LoginRequired
        );
        assert_eq!(
            renewal_outcome(&AuthError::TokenRefreshFailed("connection refused".into())),
            RenewalOutcome::Failed
        );
    }
}
