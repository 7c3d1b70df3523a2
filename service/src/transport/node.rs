//! ClusterTransport: this node's node actor on the node transport.
//!
//! # Mailbox
//! - `Notify` (from another node, over the transport: bincode) → counted; `Leaving` → a scan
//!   for sessions with unfinished messages now (their leases were given back); acknowledged.
//! - `SessionOpened` / `SessionAuthenticated` / `SessionClosed` (the NodeServer's events) →
//!   the connected nodes (gauge `troupe_cluster_peers`). The last connection of a node closes
//!   → `lost`, and one lease ttl later `PeerExpired`. One closed before it authenticated →
//!   `refused` (a wrong cookie).
//! - `PeerExpired` → a scan, unless the node is connected again.
//! - `SeedConnected` (a seed task) → whether a seed address has a connection.
//! - `Leave` (this node stops, after it gave its leases back) → `Notify(Leaving)` to every
//!   other node of the group, answered with how many acknowledged.
//! - `Peers` → the connected nodes' names.
//!
//! # Failure
//! The NodeServer is linked: if it stops on its own, this actor starts a new one on the same
//! address (its seed tasks again, its connections counted from nothing), at most
//! [`RESTARTS_PER_WINDOW`](crate::host::RESTARTS_PER_WINDOW) times per
//! [`RESTART_WINDOW`](crate::host::RESTART_WINDOW)
//! (`troupe_service_restarts_total{component="node_transport"}`); past that, or when no new
//! one starts, it reports the service failed (`/healthz` 503, the process exits to be
//! restarted) and stops. Seed tasks end with the server they dial through.

use super::{PEER_EVENTS, PEERS, PeerEvent, REMOTE_MESSAGES};
use crate::registry::ScanTrigger;
use crate::sessions_api::SessionsApi;
use metrics::{counter, gauge};
use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::node::{NodeConnectionMode, NodeServerSessionInformation};
use ractor_cluster::{NodeEventSubscription, NodeServer, NodeServerMessage};
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use troupe_proto::cluster::NodeNotice;

/// The process group every node actor joins: each node sees the others' there.
pub const GROUP: &str = "troupe.nodes";

/// The variant name of `Notify` on the wire.
const NOTIFY: &str = "notify";

/// How long a node waits for the others to acknowledge that it leaves.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);

/// A seed task's first wait after a failed attempt, and the longest.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often a seed task checks a connected seed.
const SEED_POLL: Duration = Duration::from_secs(1);

/// Start-up arguments.
pub struct TransportArgs {
    /// This node's name (`[cluster] node`).
    pub node: String,
    /// Where the NodeServer listens (`[cluster] listen`).
    pub listen: SocketAddr,
    /// The secret the nodes share: a node with another cookie is refused.
    pub cookie: String,
    /// Other nodes' transport addresses, kept connected.
    pub seeds: Vec<String>,
    /// A lost node's leases can have expired one ttl after its connection dropped.
    pub lease_ttl: Duration,
    /// Where scans are asked for (reads the current registry at each use).
    pub sessions: SessionsApi,
}

/// One transport connection.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Link {
    /// The address at the other end (a seed's own address for a connection this node opened).
    addr: String,
    /// The other node's name, once it authenticated.
    peer: Option<String>,
}

/// What a NodeServer is started with (again, after it failed).
struct ServerArgs {
    node: String,
    listen: SocketAddr,
    cookie: String,
}

/// The actor's state.
pub struct TransportState {
    node: String,
    lease_ttl: Duration,
    sessions: SessionsApi,
    server: ActorRef<NodeServerMessage>,
    server_args: ServerArgs,
    /// When the NodeServer was started again lately.
    restarts: Vec<std::time::Instant>,
    links: HashMap<u64, Link>,
    /// The node met at each address (a seed connected once), to know a seed is connected
    /// through a connection the other node opened.
    met: HashMap<String, String>,
    /// Ends the seed tasks.
    stop: CancellationToken,
    seeds: Vec<String>,
}

/// The actor's mailbox.
pub enum TransportMsg {
    /// Another node's notice (a call over the transport: acknowledged with `true`).
    Notify {
        notice: NodeNotice,
        reply: RpcReplyPort<bool>,
    },
    /// A transport connection opened.
    SessionOpened { id: u64, addr: String },
    /// The node at the other end authenticated (the cookie matched); `advertised`: the
    /// address it listens on, as it says.
    SessionAuthenticated {
        id: u64,
        peer: String,
        advertised: String,
    },
    /// A transport connection closed.
    SessionClosed { id: u64 },
    /// A lost node's leases can have expired now.
    PeerExpired { peer: String },
    /// Whether one of `addrs` (a seed, resolved) has a connection.
    SeedConnected {
        addrs: Vec<String>,
        reply: RpcReplyPort<bool>,
    },
    /// This node stops (its leases given back): tells the others, answers how many heard it.
    Leave { reply: RpcReplyPort<usize> },
    /// The connected nodes' names.
    Peers { reply: RpcReplyPort<Vec<String>> },
}

/// The node actor.
pub struct ClusterTransport;

#[ractor::async_trait]
impl Actor for ClusterTransport {
    type Msg = TransportMsg;
    type State = TransportState;
    type Arguments = TransportArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<TransportMsg>,
        args: TransportArgs,
    ) -> Result<TransportState, ActorProcessingErr> {
        let server_args = ServerArgs {
            node: args.node.clone(),
            listen: args.listen,
            cookie: args.cookie,
        };
        let server = start_server(&myself, &server_args).await?;
        ractor::pg::join(GROUP.into(), vec![myself.get_cell()]);
        Ok(TransportState {
            node: args.node,
            lease_ttl: args.lease_ttl,
            sessions: args.sessions,
            server,
            server_args,
            restarts: Vec::new(),
            links: HashMap::new(),
            met: HashMap::new(),
            stop: CancellationToken::new(),
            seeds: args.seeds,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<TransportMsg>,
        state: &mut TransportState,
    ) -> Result<(), ActorProcessingErr> {
        state.dial_seeds(&myself);
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<TransportMsg>,
        event: ractor::SupervisionEvent,
        state: &mut TransportState,
    ) -> Result<(), ActorProcessingErr> {
        use ractor::SupervisionEvent;
        let why = match &event {
            SupervisionEvent::ActorFailed(who, e) if who.get_id() == state.server.get_id() => {
                e.to_string()
            }
            SupervisionEvent::ActorTerminated(who, _, reason)
                if who.get_id() == state.server.get_id() =>
            {
                reason.clone().unwrap_or_else(|| "stopped".into())
            }
            _ => return Ok(()),
        };
        state.restart_server(&myself, why).await;
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<TransportMsg>,
        state: &mut TransportState,
    ) -> Result<(), ActorProcessingErr> {
        state.stop.cancel();
        gauge!(PEERS).set(0.0);
        // When the service did not stop it (its NodeServer failed), the node goes on through
        // PostgreSQL alone until it is restarted: say so.
        tracing::warn!(
            "node transport stopped: this node meets the others through PostgreSQL alone from now on (expected when the service stops)"
        );
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<TransportMsg>,
        msg: TransportMsg,
        state: &mut TransportState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            TransportMsg::Notify { notice, reply } => {
                counted("received", &notice);
                match &notice {
                    NodeNotice::Leaving { node } => {
                        tracing::info!(peer = %node, "a node left: looking for its sessions");
                        state.sessions.scan(ScanTrigger::PeerLeft);
                    }
                }
                let _ = reply.send(true);
            }
            TransportMsg::SessionOpened { id, addr } => {
                state.links.insert(id, Link { addr, peer: None });
            }
            TransportMsg::SessionAuthenticated {
                id,
                peer,
                advertised,
            } => {
                let peer = node_name(&peer).to_owned();
                let known = connected(&state.links).contains(peer.as_str());
                if let Some(link) = state.links.get_mut(&id) {
                    link.peer = Some(peer.clone());
                    state.met.insert(link.addr.clone(), peer.clone());
                }
                // A seed that connected to this node first is met at the address it listens
                // on: its seed task sees it connected and does not dial it again (two nodes
                // naming each other as seeds keep one connection, not a dial every 5 s).
                state.met.insert(advertised, peer.clone());
                if !known {
                    tracing::info!(%peer, "node connected");
                    counter!(PEER_EVENTS, "event" => PeerEvent::Connected.label()).increment(1);
                }
                state.set_gauge();
            }
            TransportMsg::SessionClosed { id } => {
                let Some(link) = state.links.remove(&id) else {
                    return Ok(());
                };
                match closed(&link, &state.links) {
                    Some(PeerEvent::Lost) => {
                        let peer = link.peer.unwrap_or_default();
                        tracing::warn!(
                            %peer,
                            "node lost: looking for its sessions once its leases can have expired"
                        );
                        counter!(PEER_EVENTS, "event" => PeerEvent::Lost.label()).increment(1);
                        let wait = expiry_wait(state.lease_ttl);
                        myself.send_after(wait, move || TransportMsg::PeerExpired { peer });
                    }
                    Some(event) => {
                        counter!(PEER_EVENTS, "event" => event.label()).increment(1);
                    }
                    None => {}
                }
                state.set_gauge();
            }
            TransportMsg::PeerExpired { peer } => {
                if !connected(&state.links).contains(peer.as_str()) {
                    state.sessions.scan(ScanTrigger::PeerLost);
                }
            }
            TransportMsg::SeedConnected { addrs, reply } => {
                let _ = reply.send(seed_connected(&addrs, &state.links, &state.met));
            }
            TransportMsg::Leave { reply } => {
                let notice = NodeNotice::Leaving {
                    node: state.node.clone(),
                };
                tokio::spawn(async move {
                    let _ = reply.send(tell_everyone(notice).await);
                });
            }
            TransportMsg::Peers { reply } => {
                let peers = connected(&state.links)
                    .into_iter()
                    .map(str::to_owned)
                    .collect();
                let _ = reply.send(peers);
            }
        }
        Ok(())
    }
}

impl TransportState {
    fn set_gauge(&self) {
        gauge!(PEERS).set(connected(&self.links).len() as f64);
    }

    /// A seed task per seed, dialling through the current NodeServer.
    fn dial_seeds(&self, myself: &ActorRef<TransportMsg>) {
        for seed in &self.seeds {
            tokio::spawn(keep_connected(
                seed.clone(),
                self.server.clone(),
                myself.clone(),
                self.stop.clone(),
            ));
        }
    }

    /// The NodeServer stopped on its own: a new one on the same address, or the service
    /// reported failed when they keep failing (or none starts).
    async fn restart_server(&mut self, myself: &ActorRef<TransportMsg>, why: String) {
        tracing::error!(reason = %why, "node transport's server stopped; starting a new one");
        self.stop.cancel();
        self.links.clear();
        self.set_gauge();
        let allowed = crate::host::plan::may_restart(
            &mut self.restarts,
            std::time::Instant::now(),
            crate::host::RESTARTS_PER_WINDOW,
            crate::host::RESTART_WINDOW,
        );
        let started = if allowed {
            // Its listener may take a moment to let the address go.
            let mut wait = BACKOFF_MIN;
            let mut last = String::new();
            let mut server = None;
            for _ in 0..5 {
                match start_server(myself, &self.server_args).await {
                    Ok(s) => {
                        server = Some(s);
                        break;
                    }
                    Err(e) => last = e.to_string(),
                }
                tokio::time::sleep(wait).await;
                wait = next_wait(wait);
            }
            server.ok_or(last)
        } else {
            Err(format!("it keeps failing ({why})"))
        };
        match started {
            Ok(server) => {
                crate::metrics::service_restart("node_transport", "restarted");
                tracing::warn!(listen = %self.server_args.listen, "node transport restarted");
                self.server = server;
                self.stop = CancellationToken::new();
                self.dial_seeds(myself);
            }
            Err(e) => {
                crate::metrics::service_restart("node_transport", "given_up");
                self.sessions.report_failure(
                    "node_transport",
                    format!("the node transport could not be started again: {e}"),
                );
                myself.stop(Some("node transport given up".into()));
            }
        }
    }
}

/// Starts a NodeServer linked to this actor and subscribes to its events.
async fn start_server(
    myself: &ActorRef<TransportMsg>,
    args: &ServerArgs,
) -> Result<ActorRef<NodeServerMessage>, ActorProcessingErr> {
    let server = NodeServer::new(
        args.listen.port(),
        args.cookie.clone(),
        args.node.clone(),
        args.listen.ip().to_string(),
        None,
        // A node that joins through one seed meets the seed's peers too.
        Some(NodeConnectionMode::Transitive),
    )
    .with_listen_addr(args.listen.ip());
    let (server, _) = Actor::spawn_linked(None, server, (), myself.get_cell()).await?;
    server
        .cast(NodeServerMessage::SubscribeToEvents {
            id: "troupe".into(),
            subscription: Box::new(Events(myself.clone())),
        })
        .map_err(|_| "the node server stopped at start")?;
    Ok(server)
}

/// Sends `notice` to every other node of the group; how many acknowledged it in time.
async fn tell_everyone(notice: NodeNotice) -> usize {
    let others: Vec<ActorRef<TransportMsg>> = ractor::pg::get_members(&GROUP.to_owned())
        .into_iter()
        .filter(|cell| !cell.get_id().is_local())
        .map(ActorRef::from)
        .collect();
    let calls = others.into_iter().map(|peer| {
        let notice = notice.clone();
        async move {
            counted("sent", &notice);
            matches!(
                ractor::call_t!(
                    peer,
                    |reply| TransportMsg::Notify { notice, reply },
                    LEAVE_TIMEOUT.as_millis() as u64
                ),
                Ok(true)
            )
        }
    });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .filter(|acked| *acked)
        .count()
}

fn counted(direction: &'static str, notice: &NodeNotice) {
    counter!(REMOTE_MESSAGES, "direction" => direction, "kind" => notice.kind().label())
        .increment(1);
}

/// Keeps this node connected to `seed`: connects when no connection reaches it, again after
/// a growing wait while it stays unreachable or refuses (a seed down or restarting).
async fn keep_connected(
    seed: String,
    server: ActorRef<NodeServerMessage>,
    node: ActorRef<TransportMsg>,
    stop: CancellationToken,
) {
    let mut wait = BACKOFF_MIN;
    loop {
        let addrs: Vec<String> = match tokio::net::lookup_host(seed.as_str()).await {
            Ok(addrs) => addrs.map(|a| a.to_string()).collect(),
            Err(_) => Vec::new(),
        };
        let Ok(up) = ractor::call!(node, |reply| TransportMsg::SeedConnected {
            addrs: addrs.clone(),
            reply
        }) else {
            return;
        };
        let pause = if up {
            wait = BACKOFF_MIN;
            SEED_POLL
        } else {
            if let Err(e) = ractor_cluster::client_connect(&server, seed.as_str()).await {
                tracing::debug!(%seed, error = %e, "seed not reached");
            }
            let this = wait;
            wait = next_wait(wait);
            this
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// The NodeServer's events, as messages to the node actor.
struct Events(ActorRef<TransportMsg>);

impl NodeEventSubscription for Events {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        let _ = self.0.cast(TransportMsg::SessionOpened {
            id: ses.node_id,
            addr: ses.peer_addr,
        });
    }

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        let _ = self.0.cast(TransportMsg::SessionClosed { id: ses.node_id });
    }

    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        if let Some(peer) = ses.peer_name {
            let _ = self.0.cast(TransportMsg::SessionAuthenticated {
                id: ses.node_id,
                peer: peer.name,
                advertised: peer.connection_string,
            });
        }
    }
}

// The node actor is the only message type that crosses to another node: `Notify`, as a call
// whose notice is bincode and whose acknowledgement is one byte. Every other variant is local.
impl ractor::Message for TransportMsg {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        match self {
            Self::Notify { notice, reply } => Ok(SerializedMessage::Call {
                variant: NOTIFY.into(),
                args: encode(&notice)?,
                reply: ack_to_bytes(reply),
                metadata: None,
            }),
            _ => Err(BoxedDowncastErr),
        }
    }

    fn deserialize(bytes: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        match bytes {
            SerializedMessage::Call {
                variant,
                args,
                reply,
                ..
            } if variant == NOTIFY => Ok(Self::Notify {
                notice: decode(&args)?,
                reply: ack_from_bytes(reply),
            }),
            _ => Err(BoxedDowncastErr),
        }
    }
}

fn encode(notice: &NodeNotice) -> Result<Vec<u8>, BoxedDowncastErr> {
    bincode::serde::encode_to_vec(notice, bincode::config::standard()).map_err(|e| {
        tracing::warn!(error = %e, "a node notice could not be encoded");
        BoxedDowncastErr
    })
}

fn decode(bytes: &[u8]) -> Result<NodeNotice, BoxedDowncastErr> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map(|(notice, _)| notice)
        .map_err(|e| {
            tracing::warn!(error = %e, "a node notice could not be decoded");
            BoxedDowncastErr
        })
}

/// The caller's typed port, fed from the byte port the transport answers on.
fn ack_to_bytes(reply: RpcReplyPort<bool>) -> RpcReplyPort<Vec<u8>> {
    let (tx, rx) = ractor::concurrency::oneshot::<Vec<u8>>();
    let timeout = reply.get_timeout();
    tokio::spawn(async move {
        if let Ok(bytes) = rx.await {
            let _ = reply.send(bytes.first() == Some(&1));
        }
    });
    match timeout {
        Some(t) => RpcReplyPort::from((tx, t)),
        None => RpcReplyPort::from(tx),
    }
}

/// A typed port for the local actor, whose answer goes back as bytes.
fn ack_from_bytes(reply: RpcReplyPort<Vec<u8>>) -> RpcReplyPort<bool> {
    let (tx, rx) = ractor::concurrency::oneshot::<bool>();
    let timeout = reply.get_timeout();
    tokio::spawn(async move {
        if let Ok(acked) = rx.await {
            let _ = reply.send(vec![u8::from(acked)]);
        }
    });
    match timeout {
        Some(t) => RpcReplyPort::from((tx, t)),
        None => RpcReplyPort::from(tx),
    }
}

/// A ractor_cluster node name is `name@host`: the node's own name.
fn node_name(full: &str) -> &str {
    full.rsplit_once('@').map_or(full, |(name, _)| name)
}

/// The nodes with an authenticated connection.
fn connected(links: &HashMap<u64, Link>) -> BTreeSet<&str> {
    links.values().filter_map(|l| l.peer.as_deref()).collect()
}

/// What the closing of `link` means, the other connections being `rest`: refused (it never
/// authenticated), lost (the node's last connection), or nothing (another remains).
fn closed(link: &Link, rest: &HashMap<u64, Link>) -> Option<PeerEvent> {
    match &link.peer {
        None => Some(PeerEvent::Refused),
        Some(peer) if !connected(rest).contains(peer.as_str()) => Some(PeerEvent::Lost),
        Some(_) => None,
    }
}

/// Whether a seed (its resolved addresses) has a connection: one this node opened to it, or
/// one from the node met at that address before.
fn seed_connected(
    addrs: &[String],
    links: &HashMap<u64, Link>,
    met: &HashMap<String, String>,
) -> bool {
    let names: Vec<&String> = addrs.iter().filter_map(|a| met.get(a)).collect();
    links
        .values()
        .any(|l| addrs.contains(&l.addr) || l.peer.as_ref().is_some_and(|p| names.contains(&p)))
}

/// How long after a node's connection dropped its leases can have expired: its last renewal
/// was before the drop, and a lease lasts one ttl; a tenth more for the clocks and the scan.
fn expiry_wait(ttl: Duration) -> Duration {
    ttl + ttl / 10
}

/// The next wait of a seed task after a failed attempt: doubled, up to [`BACKOFF_MAX`].
fn next_wait(wait: Duration) -> Duration {
    (wait * 2).min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether something accepts TCP connections at `addr`.
    async fn listening(addr: SocketAddr) -> bool {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_server_that_stops_is_started_again_on_its_address() {
        let dir = tempfile::tempdir().unwrap();
        let config = troupe_runtime::config::TroupeConfig {
            data_dir: dir.path().to_owned(),
            ..troupe_runtime::config::TroupeConfig::default()
        };
        let ports = troupe_runtime::assembly::session_ports(
            &config,
            std::sync::Arc::new(troupe_runtime::ScriptedModel::default()),
            std::sync::Arc::new(troupe_actors::ports::ApproxTokens),
        );
        let store = std::sync::Arc::new(troupe_store::memory::MemoryStore::new());
        let service = crate::Service::start(&config, store, ports, None)
            .await
            .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let (transport, _) = Actor::spawn(
            None,
            ClusterTransport,
            TransportArgs {
                node: "restarting".into(),
                listen,
                cookie: "secret".into(),
                seeds: Vec::new(),
                lease_ttl: Duration::from_secs(2),
                sessions: service.sessions.clone(),
            },
        )
        .await
        .unwrap();
        let until = |check: bool| async move {
            for _ in 0..200 {
                if listening(listen).await == check {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            false
        };
        assert!(until(true).await, "listening at start");
        let server = transport.get_children();
        assert_eq!(server.len(), 1, "the NodeServer");
        server[0].stop(Some("a fault".into()));
        // A new server on the same address, the transport itself still running.
        let mut again = false;
        for _ in 0..200 {
            let children = transport.get_children();
            if children.len() == 1
                && children[0].get_id() != server[0].get_id()
                && listening(listen).await
            {
                again = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(again, "a new NodeServer listens on {listen}");
        assert_eq!(transport.get_status(), ractor::ActorStatus::Running);
        transport.stop(None);
        service.shutdown().await;
    }

    fn link(addr: &str, peer: Option<&str>) -> Link {
        Link {
            addr: addr.into(),
            peer: peer.map(str::to_owned),
        }
    }

    #[test]
    fn a_node_is_named_without_its_host() {
        assert_eq!(node_name("a@127.0.0.1"), "a");
        assert_eq!(node_name("a"), "a");
    }

    #[test]
    fn a_closed_connection_is_refused_lost_or_nothing() {
        let rest = HashMap::from([(2, link("127.0.0.1:5000", Some("b")))]);
        assert_eq!(closed(&link("x", None), &rest), Some(PeerEvent::Refused));
        assert_eq!(closed(&link("x", Some("c")), &rest), Some(PeerEvent::Lost));
        assert_eq!(closed(&link("x", Some("b")), &rest), None, "b has another");
    }

    #[test]
    fn a_seed_is_connected_by_its_address_or_by_the_node_met_there() {
        let seed = vec!["127.0.0.1:5000".to_owned()];
        let mut links = HashMap::new();
        let mut met = HashMap::new();
        assert!(!seed_connected(&seed, &links, &met));
        links.insert(1, link("127.0.0.1:5000", None));
        assert!(
            seed_connected(&seed, &links, &met),
            "opened, authenticating"
        );
        links.clear();
        links.insert(2, link("127.0.0.1:40312", Some("b")));
        assert!(
            !seed_connected(&seed, &links, &met),
            "b was never met there"
        );
        met.insert("127.0.0.1:5000".to_owned(), "b".to_owned());
        assert!(seed_connected(&seed, &links, &met), "b's own connection");
    }

    #[test]
    fn waits() {
        assert_eq!(
            expiry_wait(Duration::from_secs(10)),
            Duration::from_secs(11)
        );
        assert_eq!(next_wait(BACKOFF_MIN), BACKOFF_MIN * 2);
        assert_eq!(next_wait(BACKOFF_MAX), BACKOFF_MAX);
    }

    #[tokio::test]
    async fn a_notice_crosses_as_a_call_and_is_acknowledged() {
        let (tx, rx) = ractor::concurrency::oneshot::<bool>();
        let msg = TransportMsg::Notify {
            notice: NodeNotice::Leaving { node: "a".into() },
            reply: RpcReplyPort::from(tx),
        };
        let wire = ractor::Message::serialize(msg).unwrap();
        let back = <TransportMsg as ractor::Message>::deserialize(wire).unwrap();
        let TransportMsg::Notify { notice, reply } = back else {
            panic!("not a notice");
        };
        assert_eq!(notice, NodeNotice::Leaving { node: "a".into() });
        reply.send(true).unwrap();
        assert!(
            rx.await.unwrap(),
            "the acknowledgement came back through the bytes"
        );
        let local = TransportMsg::PeerExpired { peer: "b".into() };
        assert!(ractor::Message::serialize(local).is_err(), "local only");
    }
}
