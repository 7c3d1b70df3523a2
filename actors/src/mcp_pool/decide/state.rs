//! The data the pool core decides on and answers with: servers and their phases, views,
//! routes and the route table, the effects a transition asks for, and snapshots.

use super::*;

/// Identifies one open view within its pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ViewId(pub u64);

impl std::fmt::Display for ViewId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "view-{}", self.0)
    }
}

/// Where a server is in its life.
pub enum Phase {
    /// No connection, none wanted (no references), or reclaimed.
    Idle,
    /// A connect (handshake and first listing) is under way.
    Connecting,
    /// Connected; its tools are known.
    Ready(Live),
    /// Died or failed to connect; a restart is due after a delay.
    Backoff,
}

impl Phase {
    /// Bounded name, for snapshots and logs.
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Connecting => "connecting",
            Self::Ready(_) => "ready",
            Self::Backoff => "backoff",
        }
    }
}

/// A ready connection and what it offers.
pub struct Live {
    pub conn: Arc<dyn McpConnection>,
    /// Offered tools, by unqualified name.
    pub tools: BTreeMap<String, McpTool>,
    /// Listed but not offered, and why.
    pub left_out: BTreeMap<String, LeftOut>,
    /// Fired when this connection ends: calls waiting for a slot on it fail at once.
    pub closed: CancellationToken,
    /// Refreshes asked for and the newest applied, so an older listing that arrives late
    /// never replaces a newer one.
    pub(super) refresh_asked: u64,
    pub(super) refresh_applied: u64,
    /// When the connection was made: one that dies before the backoff's maximum has passed
    /// does not reset the backoff.
    pub(super) up_since: Instant,
}

/// One configured server.
pub struct ServerSlot {
    pub config: McpServerConfig,
    pub phase: Phase,
    /// Generation of the current phase.
    pub generation: u64,
    /// Open views that can see this server.
    pub refs: usize,
    /// `Some(epoch)` while an idle reclaim is armed (refs = 0, a connection up or coming).
    pub idle_epoch: Option<u64>,
    /// Failures since the last successful connect (what a snapshot shows).
    pub failures: u32,
    /// Failures, early deaths included, since a connection last stayed up for the backoff's
    /// maximum: sets the backoff. A connect alone does not reset it, so a server that
    /// connects, lists its tools and dies soon after keeps backing off instead of being
    /// restarted at the base delay for good.
    pub streak: u32,
}

/// An open view as the pool remembers it.
pub struct ViewRecord {
    pub conversation_id: ConversationId,
    /// Qualified names; `None` = every tool.
    pub allowlist: Option<BTreeSet<String>>,
    /// Servers it references.
    pub servers: BTreeSet<String>,
}

/// The routes of every ready tool, published by the actor after each change of connections
/// or tools, so that a call does not need a mailbox round trip to find its connection.
#[derive(Clone, Default)]
pub struct RouteTable {
    pub(super) routes: HashMap<String, Route>,
}

impl RouteTable {
    /// The route of qualified `name` for a view with `scope`, if the call may go straight to
    /// its connection: visible to the view, and the connection still open. `None` sends the
    /// caller to the actor, which answers exactly (including every error).
    pub fn fast_route(&self, scope: &ViewScope, name: &str) -> Option<&Route> {
        let (server, _) = split_qualified(name)?;
        if !scope.servers.contains(server) || !visible(scope.allowlist.as_ref(), name) {
            return None;
        }
        self.routes.get(name).filter(|r| !r.closed.is_cancelled())
    }

    pub fn len(&self) -> usize {
        self.routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Sets the sink progress events go to on every route.
    pub fn with_events(mut self, events: Option<&crate::events::EventSink>) -> Self {
        for route in self.routes.values_mut() {
            route.events = events.cloned();
        }
        self
    }
}

/// What a view may see, copied into the view when it opens.
#[derive(Debug, Clone, Default)]
pub struct ViewScope {
    pub servers: BTreeSet<String>,
    pub allowlist: Option<BTreeSet<String>>,
}

/// What a call needs once it is allowed: the connection and its end signal.
#[derive(Clone)]
pub struct Route {
    pub server: String,
    /// Unqualified tool name.
    pub tool: String,
    pub conn: Arc<dyn McpConnection>,
    pub closed: CancellationToken,
    /// Where the call's progress events go (the pool's current sink; set by the actor).
    pub events: Option<crate::events::EventSink>,
}

/// Work the actor does after a transition.
pub enum Effect {
    /// Start a connect attempt (handshake, then the first listing).
    Connect {
        server: String,
        generation: u64,
        config: McpServerConfig,
    },
    /// Arm the idle reclaim timer.
    ScheduleIdle { server: String, epoch: u64 },
    /// Arm the restart timer.
    ScheduleRestart {
        server: String,
        generation: u64,
        delay: Duration,
    },
    /// Disarm the server's timer.
    CancelTimer { server: String },
    /// End a connection.
    Close {
        server: String,
        conn: Arc<dyn McpConnection>,
        reason: CloseReason,
    },
    /// List the tools again.
    Refresh {
        server: String,
        generation: u64,
        seq: u64,
        conn: Arc<dyn McpConnection>,
    },
    /// A server's tools are available.
    Ready { server: String, tools: usize },
    /// A view's allowlist names tools of `server` that it does not offer, now that its tools
    /// are known (C5): the conversation is told.
    AllowlistUnknown {
        conversation_id: ConversationId,
        server: String,
        entries: Vec<String>,
    },
    /// A connection died or could not be made; `retry_in` when a restart is scheduled.
    Failed {
        server: String,
        reason: String,
        retry_in: Option<Duration>,
    },
}

impl std::fmt::Debug for Effect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connect {
                server, generation, ..
            } => write!(f, "Connect({server}, gen {generation})"),
            Self::ScheduleIdle { server, epoch } => write!(f, "ScheduleIdle({server}, {epoch})"),
            Self::ScheduleRestart { server, delay, .. } => {
                write!(f, "ScheduleRestart({server}, {delay:?})")
            }
            Self::CancelTimer { server } => write!(f, "CancelTimer({server})"),
            Self::Close { server, reason, .. } => write!(f, "Close({server}, {reason:?})"),
            Self::Refresh { server, seq, .. } => write!(f, "Refresh({server}, {seq})"),
            Self::Ready { server, tools } => write!(f, "Ready({server}, {tools})"),
            Self::AllowlistUnknown {
                server, entries, ..
            } => write!(f, "AllowlistUnknown({server}, {entries:?})"),
            Self::Failed {
                server, retry_in, ..
            } => write!(f, "Failed({server}, {retry_in:?})"),
        }
    }
}

/// A server as a snapshot shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSnapshot {
    pub name: String,
    /// `idle`, `connecting`, `ready` or `backoff`.
    pub phase: &'static str,
    pub refs: usize,
    /// Offered tools, qualified, sorted.
    pub tools: Vec<String>,
    pub failures: u32,
    pub process_id: Option<u32>,
}

/// The pool, for observation and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSnapshot {
    pub servers: Vec<ServerSnapshot>,
    pub views: usize,
    /// Calls the pool still holds for attributing server requests (ended ones are forgotten
    /// as they end).
    pub calls_held: usize,
}
