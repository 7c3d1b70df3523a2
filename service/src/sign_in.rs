//! The web console's sign-in cookie: what a browser holds instead of the API token.
//!
//! A browser's `EventSource` and `WebSocket` cannot send an `Authorization` header, and a
//! token in a URL lands in logs and histories. So the console trades the token once, in a
//! `POST /console/sign-in`, for a cookie that is `HttpOnly` (no script reads it) and
//! `SameSite=Strict` (no other site's page makes the browser send it):
//!
//! ```text
//! v1.<key id: 16 hex>.<expiry: unix seconds>.<HMAC-SHA256(key, "v1.<key id>.<expiry>"): 64 hex>
//! ```
//!
//! The key id and the MAC key are derived from the token (SHA-256 with distinct prefixes), so
//! the cookie holds nothing that gives the token back, needs no state on the server, still
//! holds after a restart, and dies with its token: a token removed from the configuration
//! signs nothing in any more. The MAC is compared in constant time. Everything here is a pure
//! function of its inputs; [`crate::auth::Auth`] holds the keys.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The cookie format's version tag.
const VERSION: &str = "v1";

/// Names one token's key in a cookie without revealing the token.
pub type KeyId = [u8; 8];

/// The MAC key of one token.
pub type MacKey = [u8; 32];

/// The key id of `token`.
pub fn key_id(token: &str) -> KeyId {
    let digest = Sha256::new()
        .chain_update(b"troupe console key id\0")
        .chain_update(token.as_bytes())
        .finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    id
}

/// The MAC key of `token`.
pub fn mac_key(token: &str) -> MacKey {
    Sha256::new()
        .chain_update(b"troupe console sign-in key\0")
        .chain_update(token.as_bytes())
        .finalize()
        .into()
}

fn mac(key: &MacKey) -> Hmac<Sha256> {
    // HMAC takes a key of any length: this cannot fail.
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    }
}

/// The cookie value for the token of `id`/`key`, valid until `expires` (unix seconds).
pub fn issue(id: &KeyId, key: &MacKey, expires: u64) -> String {
    let payload = format!("{VERSION}.{}.{expires}", hex(id));
    let tag = mac(key)
        .chain_update(payload.as_bytes())
        .finalize()
        .into_bytes();
    format!("{payload}.{}", hex(&tag))
}

/// The key id of a cookie value that is well formed, carries a valid MAC under the key
/// `lookup` gives for its id, and has not expired at `now` (unix seconds); `None` otherwise.
pub fn verify<'k>(
    value: &str,
    lookup: impl Fn(&KeyId) -> Option<&'k MacKey>,
    now: u64,
) -> Option<KeyId> {
    let mut parts = value.trim().split('.');
    let (version, id, expires, tag) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || version != VERSION {
        return None;
    }
    let id: KeyId = unhex(id)?.try_into().ok()?;
    if expires.is_empty() || !expires.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let expires_at: u64 = expires.parse().ok()?;
    let tag = unhex(tag)?;
    let key = lookup(&id)?;
    let payload = format!("{VERSION}.{}.{expires}", hex(&id));
    mac(key)
        .chain_update(payload.as_bytes())
        .verify_slice(&tag)
        .ok()?;
    (now < expires_at).then_some(id)
}

/// The value of cookie `name` in a `Cookie` request header (`a=1; b=2`).
pub fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k.trim() == name).then(|| v.trim().trim_matches('"'))
    })
}

/// The values of the console's cookies of every port (`troupe_console`, `troupe_console_<port>`)
/// in a `Cookie` request header, in their order.
pub fn console_cookie_values<'a>(
    header: &'a str,
    base: &'a str,
) -> impl Iterator<Item = &'a str> + 'a {
    header.split(';').filter_map(move |pair| {
        let (k, v) = pair.trim().split_once('=')?;
        let k = k.trim();
        let port = k.strip_prefix(base)?;
        let named = port.is_empty()
            || port
                .strip_prefix('_')
                .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        named.then(|| v.trim().trim_matches('"'))
    })
}

/// The `Set-Cookie` value that signs a browser in for `max_age_secs`; `secure` when the
/// console was reached over HTTPS.
pub fn set_cookie(name: &str, value: &str, max_age_secs: u64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{name}={value}; Path=/; Max-Age={max_age_secs}; HttpOnly; SameSite=Strict{secure}")
}

/// The `Set-Cookie` value that signs a browser out.
pub fn clear_cookie(name: &str) -> String {
    format!("{name}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict")
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn keys(token: &str) -> (KeyId, MacKey) {
        (key_id(token), mac_key(token))
    }

    #[test]
    fn a_cookie_holds_until_it_expires_and_only_under_its_key() {
        let (id, key) = keys("secret-token");
        let value = issue(&id, &key, 1_000);
        assert!(!value.contains("secret-token"));
        let lookup = |k: &KeyId| (k == &id).then_some(&key);
        assert_eq!(verify(&value, lookup, 999), Some(id));
        assert_eq!(verify(&value, lookup, 1_000), None, "expired");
        // Another token's key (a token removed, or replaced) signs nothing in.
        let (other_id, other_key) = keys("other-token");
        assert_ne!(other_id, id);
        assert_eq!(verify(&value, |_| Some(&other_key), 0), None);
        assert_eq!(verify(&value, |_| None, 0), None);
    }

    #[test]
    fn a_changed_cookie_is_refused() {
        let (id, key) = keys("t");
        let value = issue(&id, &key, 5_000);
        let lookup = |k: &KeyId| (k == &id).then_some(&key);
        let longer = value.replacen(".5000.", ".9000.", 1);
        assert_eq!(verify(&longer, lookup, 0), None, "a later expiry");
        for bad in [
            "",
            "v1",
            "v2.00.1.00",
            &format!("{value}.x"),
            &value.replacen("v1.", "v2.", 1),
            &value[..value.len() - 2],
            &value.replacen(".5000.", ".+5000.", 1),
        ] {
            assert_eq!(verify(bad, lookup, 0), None, "{bad}");
        }
    }

    #[test]
    fn console_cookies_of_every_port_are_found() {
        let h = "x=1; troupe_console_7878=a; troupe_console=b; troupe_consoleX=c; troupe_console_=d; troupe_console_9x=e; troupe_console_9=\"f\"";
        let found: Vec<&str> = console_cookie_values(h, "troupe_console").collect();
        assert_eq!(found, ["a", "b", "f"]);
    }

    #[test]
    fn cookies_are_found_by_name() {
        let h = "a=1; troupe_console_80=v1.x ; b=\"2\"";
        assert_eq!(cookie_value(h, "troupe_console_80"), Some("v1.x"));
        assert_eq!(cookie_value(h, "b"), Some("2"));
        assert_eq!(cookie_value(h, "troupe_console"), None);
        assert_eq!(cookie_value("", "a"), None);
    }

    #[test]
    fn the_cookie_is_http_only_and_same_site_strict() {
        let c = set_cookie("n", "v", 60, false);
        assert_eq!(c, "n=v; Path=/; Max-Age=60; HttpOnly; SameSite=Strict");
        assert!(set_cookie("n", "v", 60, true).ends_with("; Secure"));
        assert!(clear_cookie("n").contains("Max-Age=0"));
    }

    proptest! {
        #[test]
        fn hex_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            prop_assert_eq!(unhex(&hex(&bytes)), Some(bytes));
        }

        #[test]
        fn garbage_never_verifies(value in ".{0,120}") {
            let key = mac_key("t");
            prop_assert_eq!(verify(&value, |_| Some(&key), 0), None);
        }
    }
}
