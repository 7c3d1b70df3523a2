//! What the nodes of a cluster tell each other over the node transport (`troupe serve` built
//! with `--features cluster`): typed notices, encoded with bincode 2 through serde.
//!
//! A notice never grants anything: the session leases in PostgreSQL, with their fencing
//! tokens, decide who owns a session. A notice only makes a node look now instead of at its
//! next periodic scan.

use serde::{Deserialize, Serialize};

/// A notice from one node to the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeNotice {
    /// The node stops: it has shut its sessions down and given their leases back, so the
    /// others may take its sessions with unfinished messages over at once.
    Leaving { node: String },
}

/// The kind of a [`NodeNotice`], a closed set (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeKind {
    Leaving,
}

impl NoticeKind {
    /// Every kind, to register each series at 0.
    pub const ALL: [Self; 1] = [Self::Leaving];

    pub const fn label(self) -> &'static str {
        match self {
            Self::Leaving => "leaving",
        }
    }
}

impl NodeNotice {
    pub const fn kind(&self) -> NoticeKind {
        match self {
            Self::Leaving { .. } => NoticeKind::Leaving,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_survives_bincode() {
        let config = bincode::config::standard();
        let notice = NodeNotice::Leaving { node: "a".into() };
        let bytes = bincode::serde::encode_to_vec(&notice, config).unwrap();
        let (back, read): (NodeNotice, usize) =
            bincode::serde::decode_from_slice(&bytes, config).unwrap();
        assert_eq!(back, notice);
        assert_eq!(read, bytes.len());
        assert_eq!(notice.kind().label(), "leaving");
    }
}
