//! The client side: an external agent that speaks ACP, run as a supervised child process.
//!
//! One [`AcpAgent`] is one agent process for one binding (a troupe session and an agent id),
//! and at most one ACP session in it at a time. The process starts on first use and is
//! started again, after a backoff, on the next use after it crashed; the session it had is
//! then loaded again (`session/load`, else `session/resume`), or replaced by a new one when
//! it cannot be, and the caller is told which ([`SessionOpened`]).
//!
//! ```text
//! AcpAgent (handle) ──call──▶ supervisor actor ──spawns──▶ operation task (one at a time)
//!                                  ▲   ▲                        │ launch / open / prompt
//!                       ProcessExited  └──────OpDone(slot)──────┘
//!                                  │
//!                       watcher task (owns the Child) ◀── agent process (own group)
//! ```
//!
//! The API, in the order a dispatch uses it:
//! - [`AcpAgent::spawn`] — the supervisor for one binding; no process yet.
//! - [`AcpAgent::initialize`] — starts the process and runs `initialize` (idempotent).
//! - [`AcpAgent::open_session`] — binds a session: the stored provider session id when there
//!   is one (loaded or resumed, or replaced: [`SessionOpened::replaced`] says why), else new.
//! - [`AcpAgent::prompt`] — one turn: [`Turn`] carries the text, where [`AcpEvent`]s go, and
//!   the [`PermissionHandler`] that answers `session/request_permission`. Opens a new session
//!   first if none is bound; re-opens the bound one if the process was restarted
//!   ([`TurnOutcome::reopened`]). A crash mid-turn ends it with [`AcpError::Exited`].
//! - [`AcpAgent::cancel`] — `session/cancel` for the running turn (it ends `Cancelled`).
//! - [`AcpAgent::health`] — the process's state, pid, restarts and last error.
//! - [`AcpAgent::shutdown`] — SIGTERM, then SIGKILL after the grace period.
//!
//! [`ApprovalStorePermissions`] is the handler that routes permission requests into the
//! session's ApprovalStore as approvals of the dispatching task.
//!
//! [`AcpEvent`]: crate::AcpEvent

mod approvals;
pub mod governed;
pub(crate) mod process;
mod restart;
pub(crate) mod session;
mod supervisor;

pub use approvals::{ApprovalStorePermissions, Governed, command_in_input, command_of};
pub use process::{AgentCommand, Stopped};
pub use restart::RestartPolicy;

use crate::error::AcpError;
use crate::event::{AcpEvent, PermissionDecision, PermissionRequest};
use agent_client_protocol::v1::schema as acp;
use ractor::{Actor, ActorRef};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use supervisor::{AgentMsg, Supervisor, SupervisorArgs};
use tokio::sync::mpsc;

/// How to run one external agent.
#[derive(Debug, Clone, PartialEq)]
pub struct AcpAgentSpec {
    /// The agent's id in troupe (traces, events and logs name it).
    pub agent_id: String,
    pub command: AgentCommand,
    /// The wait before a start after a crash or a failed start.
    pub restart: RestartPolicy,
    /// How long `initialize` may take.
    pub handshake_timeout: Duration,
    /// How long the process has after SIGTERM before SIGKILL.
    pub shutdown_grace: Duration,
}

impl AcpAgentSpec {
    pub fn new(agent_id: impl Into<String>, command: AgentCommand) -> Self {
        Self {
            agent_id: agent_id.into(),
            command,
            restart: RestartPolicy::default(),
            handshake_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(3),
        }
    }
}

/// Decides the agent's permission requests (`session/request_permission`).
#[async_trait::async_trait]
pub trait PermissionHandler: Send + Sync {
    /// The decision on one request. Several may be asked at once; a turn cancelled meanwhile
    /// answers `cancelled` without waiting for this.
    async fn decide(&self, request: &PermissionRequest) -> PermissionDecision;
}

/// The same answer to every request.
#[derive(Debug, Clone, Copy)]
pub struct FixedPermissions(pub PermissionDecision);

#[async_trait::async_trait]
impl PermissionHandler for FixedPermissions {
    async fn decide(&self, _request: &PermissionRequest) -> PermissionDecision {
        self.0
    }
}

/// One prompt turn.
#[derive(Clone)]
pub struct Turn {
    pub text: String,
    /// Where the turn's events go, in order (none: not streamed). A full channel slows the
    /// turn down; a closed one is ignored.
    pub events: Option<mpsc::Sender<AcpEvent>>,
    pub permissions: Arc<dyn PermissionHandler>,
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn")
            .field("text", &self.text)
            .field("streamed", &self.events.is_some())
            .finish_non_exhaustive()
    }
}

/// Why a turn ended, as the agent said (`stopReason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    MaxTurnRequests,
    Refusal,
    Cancelled,
}

impl StopReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::EndTurn => "end_turn",
            Self::MaxTokens => "max_tokens",
            Self::MaxTurnRequests => "max_turn_requests",
            Self::Refusal => "refusal",
            Self::Cancelled => "cancelled",
        }
    }

    pub(crate) fn from_acp(r: acp::StopReason) -> Self {
        match r {
            acp::StopReason::MaxTokens => Self::MaxTokens,
            acp::StopReason::MaxTurnRequests => Self::MaxTurnRequests,
            acp::StopReason::Refusal => Self::Refusal,
            acp::StopReason::Cancelled => Self::Cancelled,
            _ => Self::EndTurn,
        }
    }
}

/// How the bound session came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionOrigin {
    /// `session/new`.
    New,
    /// `session/load` of the previous session.
    Loaded,
    /// `session/resume` of the previous session.
    Resumed,
    /// Already open in the running process.
    Live,
}

/// A previous session that could not be resumed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replaced {
    pub previous: String,
    pub reason: String,
}

/// The session a binding now uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOpened {
    pub session_id: String,
    pub origin: SessionOrigin,
    /// Set when a previous session was asked for and a new one replaces it.
    pub replaced: Option<Replaced>,
}

impl SessionOpened {
    /// Whether the previous session goes on (loaded, resumed or still open).
    pub fn resumed(&self) -> bool {
        matches!(
            self.origin,
            SessionOrigin::Loaded | SessionOrigin::Resumed | SessionOrigin::Live
        )
    }

    pub(crate) fn origin_label(&self) -> &'static str {
        match (self.origin, &self.replaced) {
            (SessionOrigin::New, Some(_)) => "replaced",
            (SessionOrigin::New, None) => "new",
            (SessionOrigin::Loaded, _) => "loaded",
            (SessionOrigin::Resumed, _) => "resumed",
            (SessionOrigin::Live, _) => "live",
        }
    }
}

/// The end of a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnOutcome {
    pub stop_reason: StopReason,
    /// The agent's reply: its message chunks, joined.
    pub text: String,
    /// The session the turn ran in.
    pub session_id: String,
    /// Set when this turn had to open its session first (none was bound, or the process was
    /// restarted): new, loaded, resumed or replaced. The caller updates its binding.
    pub reopened: Option<SessionOpened>,
}

/// What the agent said of itself in `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// Its name and version, when it says.
    pub name: Option<String>,
    pub version: Option<String>,
    pub protocol_version: u16,
    /// It offers `session/load`.
    pub load_session: bool,
    /// It offers `session/resume`.
    pub resume_session: bool,
}

impl AgentInfo {
    pub(crate) fn of(init: &acp::InitializeResponse) -> Self {
        let v = serde_json::to_value(init.protocol_version).unwrap_or_default();
        Self {
            name: init.agent_info.as_ref().map(|i| i.name.clone()),
            version: init.agent_info.as_ref().map(|i| i.version.clone()),
            protocol_version: v.as_u64().and_then(|v| u16::try_from(v).ok()).unwrap_or(0),
            load_session: init.agent_capabilities.load_session,
            resume_session: init
                .agent_capabilities
                .session_capabilities
                .resume
                .is_some(),
        }
    }
}

/// Where the agent's process stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentPhase {
    /// Never started (it starts on first use).
    Idle,
    /// Starting, or waiting for its backoff before a start.
    Starting,
    /// Running, no turn.
    Ready,
    /// Running a turn.
    Busy,
    /// Its process ended on its own; the next use starts it again.
    Crashed,
    /// Shut down.
    Stopped,
}

/// The agent's health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHealth {
    pub phase: AgentPhase,
    /// Whether it can take work now or on next use without a known failure pending.
    pub ok: bool,
    pub pid: Option<u32>,
    /// Processes started successfully.
    pub starts: u64,
    /// Processes that ended on their own.
    pub crashes: u64,
    pub last_error: Option<String>,
}

/// A supervised external ACP agent (one process, one binding). Cheap to clone.
#[derive(Debug, Clone)]
pub struct AcpAgent {
    actor: ActorRef<AgentMsg>,
}

fn gone<E>(_: E) -> AcpError {
    AcpError::Stopped
}

impl AcpAgent {
    /// Starts the supervisor; the process starts on first use.
    pub async fn spawn(spec: AcpAgentSpec) -> Result<Self, AcpError> {
        let (actor, _join) = Actor::spawn(None, Supervisor, SupervisorArgs { spec })
            .await
            .map_err(|e| AcpError::Spawn {
                command: "supervisor".into(),
                message: e.to_string(),
            })?;
        Ok(Self { actor })
    }

    /// Starts the process if it is not running, and answers what `initialize` said.
    pub async fn initialize(&self) -> Result<AgentInfo, AcpError> {
        ractor::call!(self.actor, |reply| AgentMsg::Initialize { reply }).map_err(gone)?
    }

    /// Binds a session: `previous` (the binding's stored provider session id) loaded or
    /// resumed when the agent offers it, else a new session (saying why in `replaced`).
    pub async fn open_session(&self, previous: Option<&str>) -> Result<SessionOpened, AcpError> {
        let previous = previous.map(str::to_owned);
        ractor::call!(self.actor, |reply| AgentMsg::OpenSession {
            previous,
            reply
        })
        .map_err(gone)?
    }

    /// Runs one turn (see the module doc). `Busy` when a turn is already running.
    pub async fn prompt(&self, turn: Turn) -> Result<TurnOutcome, AcpError> {
        ractor::call!(self.actor, |reply| AgentMsg::Prompt { turn, reply }).map_err(gone)?
    }

    /// Cancels the running turn (and any operation waiting); whether there was one.
    pub async fn cancel(&self) -> Result<bool, AcpError> {
        ractor::call!(self.actor, |reply| AgentMsg::Cancel { reply }).map_err(gone)
    }

    pub async fn health(&self) -> AgentHealth {
        ractor::call!(self.actor, |reply| AgentMsg::Health { reply }).unwrap_or(AgentHealth {
            phase: AgentPhase::Stopped,
            ok: false,
            pid: None,
            starts: 0,
            crashes: 0,
            last_error: None,
        })
    }

    /// Stops the process (SIGTERM, SIGKILL after the grace period) and the supervisor;
    /// work still queued ends with `Stopped`.
    pub async fn shutdown(&self) -> Stopped {
        ractor::call!(self.actor, |reply| AgentMsg::Shutdown { reply })
            .unwrap_or(Stopped::AlreadyExited)
    }
}
