//! Version negotiation (spec 3.6) and resolving a method name (the names of each version are
//! `troupe_a2a::version`'s).
//!
//! The `A2A-Version` header picks the protocol: absent or empty means 0.3, `1.x` means 1.0,
//! anything else is `VersionNotSupported`. A method belongs to one version: a 1.0 name under
//! 0.3 (or the reverse) is `VersionNotSupported` too, as the reference SDK answers, so a
//! client that forgot the header learns why rather than seeing "method not found".

use super::error::A2aError;

pub use troupe_a2a::version::{METHOD_NAMES, Operation, Version};

/// Reads the `A2A-Version` header (patch numbers are ignored, spec 3.6).
pub fn negotiate(header: Option<&str>) -> Result<Version, A2aError> {
    let raw = header.map(str::trim).unwrap_or_default();
    if raw.is_empty() {
        return Ok(Version::V0_3);
    }
    let unsupported = || A2aError::VersionNotSupported {
        requested: raw.chars().take(32).collect(),
    };
    let mut parts = raw.split('.');
    let major: u32 = parts
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(unsupported)?;
    let minor: u32 = match parts.next() {
        Some(p) => p.parse().map_err(|_| unsupported())?,
        None => 0,
    };
    if parts.any(|p| p.parse::<u32>().is_err()) {
        return Err(unsupported());
    }
    match (major, minor) {
        (0, 3) => Ok(Version::V0_3),
        // Same major: a 1.x client speaks 1.0's wire (as the reference SDK accepts).
        (1, _) => Ok(Version::V1_0),
        _ => Err(unsupported()),
    }
}

/// The operation a method name asks for under the negotiated version.
pub fn resolve(version: Version, method: &str) -> Result<Operation, A2aError> {
    for (op, v1, v03) in METHOD_NAMES {
        let in_v1 = v1 == method;
        let in_v03 = v03 == Some(method);
        if !(in_v1 || in_v03) {
            continue;
        }
        return match (version, in_v1) {
            (Version::V1_0, true) | (Version::V0_3, false) => Ok(op),
            (Version::V0_3, true) => Err(A2aError::VersionNotSupported {
                requested: "0.3 (no A2A-Version header)".into(),
            }),
            (Version::V1_0, false) => Err(A2aError::VersionNotSupported {
                requested: format!("1.0 with the 0.3 method {method}"),
            }),
        };
    }
    Err(A2aError::MethodNotFound(method.chars().take(64).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_header_means_0_3() {
        assert_eq!(negotiate(None), Ok(Version::V0_3));
        assert_eq!(negotiate(Some("")), Ok(Version::V0_3));
        assert_eq!(negotiate(Some("0.3")), Ok(Version::V0_3));
        assert_eq!(negotiate(Some("0.3.0")), Ok(Version::V0_3));
        assert_eq!(negotiate(Some("1.0")), Ok(Version::V1_0));
        assert_eq!(negotiate(Some(" 1.0.2 ")), Ok(Version::V1_0));
        assert_eq!(negotiate(Some("1")), Ok(Version::V1_0));
        for bad in ["0.5", "2.0", "banana", "1.x", "0.2", "1.0.beta"] {
            assert_eq!(
                negotiate(Some(bad)).map_err(|e| e.code()),
                Err(-32009),
                "{bad}"
            );
        }
    }

    #[test]
    fn each_name_belongs_to_its_version() {
        assert_eq!(
            resolve(Version::V1_0, "SendMessage"),
            Ok(Operation::SendMessage)
        );
        assert_eq!(
            resolve(Version::V0_3, "message/send"),
            Ok(Operation::SendMessage)
        );
        assert_eq!(
            resolve(Version::V0_3, "tasks/resubscribe"),
            Ok(Operation::SubscribeToTask)
        );
        assert_eq!(
            resolve(Version::V0_3, "GetTask").map_err(|e| e.code()),
            Err(-32009)
        );
        assert_eq!(
            resolve(Version::V1_0, "tasks/get").map_err(|e| e.code()),
            Err(-32009)
        );
        assert_eq!(
            resolve(Version::V1_0, "tasks/list").map_err(|e| e.code()),
            Err(-32601)
        );
        assert_eq!(
            resolve(Version::V0_3, "nope").map_err(|e| e.code()),
            Err(-32601)
        );
    }
}
