//! `AcpError`: how work with an external ACP agent fails, with the kind as a bounded label.

use troupe_proto::AgentError;

/// Everything that can end an operation on an external ACP agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AcpError {
    /// The agent's program could not be started.
    #[error("cannot start ACP agent `{command}`: {message}")]
    Spawn { command: String, message: String },
    /// The process started but the `initialize` handshake failed or did not answer in time.
    #[error("ACP agent did not initialize: {message}")]
    Handshake { message: String },
    /// The agent answered a request with a JSON-RPC error.
    #[error("ACP agent refused `{method}` ({code}): {message}")]
    Refused {
        method: &'static str,
        code: i32,
        message: String,
    },
    /// The agent's process ended while `during` was in progress (a crash mid-turn, or a
    /// process that exits on its own). The next use starts it again, after a backoff.
    #[error("ACP agent process exited during {during} ({status}){stderr}", stderr = stderr_tail(.stderr))]
    Exited {
        during: &'static str,
        status: String,
        /// The last lines it wrote on stderr, for the reader of the error.
        stderr: String,
    },
    /// A turn is already running on this agent (one binding runs one turn at a time).
    #[error("ACP agent is busy with another turn")]
    Busy,
    /// The turn was cancelled before it reached the agent.
    #[error("cancelled: {reason}")]
    Cancelled { reason: String },
    /// The agent was shut down; it takes no more work.
    #[error("ACP agent was shut down")]
    Stopped,
}

fn stderr_tail(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; its stderr ended with: {stderr}")
    }
}

/// The kind of an [`AcpError`]: a bounded metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcpErrorKind {
    Spawn,
    Handshake,
    Refused,
    Exited,
    Busy,
    Cancelled,
    Stopped,
}

impl AcpErrorKind {
    pub const ALL: [Self; 7] = [
        Self::Spawn,
        Self::Handshake,
        Self::Refused,
        Self::Exited,
        Self::Busy,
        Self::Cancelled,
        Self::Stopped,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Spawn => "spawn",
            Self::Handshake => "handshake",
            Self::Refused => "refused",
            Self::Exited => "exited",
            Self::Busy => "busy",
            Self::Cancelled => "cancelled",
            Self::Stopped => "stopped",
        }
    }
}

impl AcpError {
    pub const fn kind(&self) -> AcpErrorKind {
        match self {
            Self::Spawn { .. } => AcpErrorKind::Spawn,
            Self::Handshake { .. } => AcpErrorKind::Handshake,
            Self::Refused { .. } => AcpErrorKind::Refused,
            Self::Exited { .. } => AcpErrorKind::Exited,
            Self::Busy => AcpErrorKind::Busy,
            Self::Cancelled { .. } => AcpErrorKind::Cancelled,
            Self::Stopped => AcpErrorKind::Stopped,
        }
    }

    pub(crate) fn refused(method: &'static str, e: &agent_client_protocol::Error) -> Self {
        Self::Refused {
            method,
            code: i32::from(e.code),
            message: e.message.clone(),
        }
    }
}

/// How troupe's own layers see an external agent's failure.
impl From<AcpError> for AgentError {
    fn from(e: AcpError) -> Self {
        match e {
            AcpError::Busy => AgentError::Overloaded {
                resource: "acp agent turn".into(),
                limit: 1,
            },
            AcpError::Cancelled { reason } => AgentError::cancelled(reason),
            AcpError::Exited { .. } => AgentError::interrupted(e.to_string()),
            other => AgentError::ToolError {
                name: "acp_agent".into(),
                message: other.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_names_the_phase_the_status_and_the_stderr() {
        let e = AcpError::Exited {
            during: "session/prompt",
            status: "signal 9 (SIGKILL)".into(),
            stderr: "boom".into(),
        };
        assert_eq!(
            e.to_string(),
            "ACP agent process exited during session/prompt (signal 9 (SIGKILL)); its stderr \
             ended with: boom"
        );
        assert_eq!(e.kind().as_str(), "exited");
        assert!(matches!(
            AgentError::from(e),
            AgentError::Interrupted { .. }
        ));
    }
}
