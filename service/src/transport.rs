//! The node transport: the nodes of a cluster joined over ractor_cluster (a build with the
//! `cluster` feature, `[cluster] listen` set).
//!
//! ```text
//! ClusterTransport (this node's node actor, in the process group `troupe.nodes`)
//! ├─ NodeServer (ractor_cluster: listens on [cluster] listen, checks the cookie)
//! │    └─ NodeSession × connected nodes (one TCP connection each)
//! └─ a seed task × [cluster] seeds (connects; again with backoff while it is not connected)
//! ```
//!
//! What travels is typed and small ([`troupe_proto::cluster::NodeNotice`], bincode): a node
//! that stops gracefully tells the others once it has given its leases back, and they look
//! for its sessions with unfinished messages at once; a node whose connection drops (killed,
//! partitioned) makes the others look once its leases can have expired (one lease ttl after
//! the drop), instead of at their next periodic scan. Ownership stays with the session leases
//! in PostgreSQL and their fencing tokens; calls are still forwarded over HTTP.
//!
//! Without the feature, this module only registers the series (all 0) and says at start that
//! the build has no node transport when `[cluster]` asks for one.

use metrics::{Unit, counter, describe_counter, describe_gauge, gauge};
use troupe_proto::cluster::NoticeKind;
use troupe_runtime::config::ClusterConfig;

#[cfg(feature = "cluster")]
mod node;
#[cfg(feature = "cluster")]
pub use node::{ClusterTransport, TransportArgs, TransportMsg};

/// Nodes this node is connected to over the node transport (authenticated).
pub const PEERS: &str = "troupe_cluster_peers";
/// Transport connections by what became of them (`connected`: a node authenticated;
/// `refused`: closed before authentication, as with a wrong cookie; `lost`: a connected
/// node's last connection closed).
pub const PEER_EVENTS: &str = "troupe_cluster_peer_events_total";
/// Typed messages between nodes, by direction (`sent`, `received`) and kind.
pub const REMOTE_MESSAGES: &str = "troupe_cluster_remote_messages_total";

/// What became of a transport connection (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerEvent {
    Connected,
    Refused,
    Lost,
}

impl PeerEvent {
    pub const ALL: [Self; 3] = [Self::Connected, Self::Refused, Self::Lost];

    pub const fn label(self) -> &'static str {
        match self {
            Self::Connected => "connected",
            Self::Refused => "refused",
            Self::Lost => "lost",
        }
    }
}

/// Registers the descriptions; every series exists at 0 from the start, in every build.
pub fn describe() {
    describe_gauge!(
        PEERS,
        Unit::Count,
        "Nodes connected to this one over the node transport (0 in a build without the cluster feature)"
    );
    gauge!(PEERS).set(0.0);
    describe_counter!(
        PEER_EVENTS,
        Unit::Count,
        "Node transport connections, by event (connected: a node authenticated; refused: closed before authentication, e.g. a wrong cookie; lost: a node's last connection closed)"
    );
    for event in PeerEvent::ALL {
        counter!(PEER_EVENTS, "event" => event.label()).increment(0);
    }
    describe_counter!(
        REMOTE_MESSAGES,
        Unit::Count,
        "Typed messages between nodes over the node transport, by direction (sent, received) and kind (leaving)"
    );
    for kind in NoticeKind::ALL {
        for direction in ["sent", "received"] {
            counter!(REMOTE_MESSAGES, "direction" => direction, "kind" => kind.label())
                .increment(0);
        }
    }
}

/// What `troupe serve` says at start about the node transport, if anything: a `[cluster]`
/// that asks for a transport this build or this configuration does not give.
pub fn start_notice(cluster: &ClusterConfig) -> Option<String> {
    notice_of(cluster, cfg!(feature = "cluster"))
}

/// [`start_notice`] of a build that has the node transport (`built_with`) or not.
fn notice_of(cluster: &ClusterConfig, built_with: bool) -> Option<String> {
    let asked = cluster.listen.is_some() || !cluster.seeds.is_empty() || cluster.cookie.is_some();
    if built_with {
        match (&cluster.node, &cluster.listen) {
            (None, _) if asked => {
                Some("[cluster] listen, seeds and cookie are ignored without [cluster] node".into())
            }
            (Some(_), None) if asked => Some(
                "[cluster] seeds and cookie are ignored without [cluster] listen: this node does \
                 not join the node transport; the nodes meet through PostgreSQL alone"
                    .into(),
            ),
            _ => None,
        }
    } else if asked {
        Some(
            "this build has no node transport (built without the `cluster` feature): [cluster] \
             listen, seeds and cookie are ignored; the nodes meet through PostgreSQL alone \
             (session leases, calls forwarded over HTTP, takeover at the periodic scan)"
                .into(),
        )
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_asking_for_a_transport_is_told_what_each_build_does() {
        let mut c = ClusterConfig {
            node: Some("a".into()),
            ..ClusterConfig::default()
        };
        for built_with in [true, false] {
            assert_eq!(
                notice_of(&c, built_with),
                None,
                "PostgreSQL alone, as asked"
            );
        }
        c.listen = Some("127.0.0.1:4697".into());
        c.cookie = Some("secret".into());
        assert_eq!(notice_of(&c, true), None, "the transport runs");
        assert!(
            notice_of(&c, false)
                .unwrap()
                .contains("this build has no node transport"),
            "said at start"
        );
        c.listen = None;
        assert!(
            notice_of(&c, true)
                .unwrap()
                .contains("without [cluster] listen")
        );
        c.node = None;
        assert!(
            notice_of(&c, true)
                .unwrap()
                .contains("without [cluster] node")
        );
    }
}
