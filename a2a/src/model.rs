//! A2A's data model, independent of the protocol version: what the endpoint keeps and
//! builds, and what the client reads. [`crate::wire`] turns it into (and reads it from) the
//! JSON shapes of each version. The serde derives are the endpoint's own format for its
//! stored records (never the wire).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The lifecycle state of an A2A task (spec 4.1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Submitted,
    Working,
    /// Interrupted: the agent waits for the client (here: a pending approval).
    InputRequired,
    /// Interrupted: the agent waits for credentials (not used by troupe; decoded for filters).
    AuthRequired,
    Completed,
    Failed,
    Canceled,
    Rejected,
}

impl TaskState {
    pub const ALL: [Self; 8] = [
        Self::Submitted,
        Self::Working,
        Self::InputRequired,
        Self::AuthRequired,
        Self::Completed,
        Self::Failed,
        Self::Canceled,
        Self::Rejected,
    ];

    /// No further change: the stream closes, cancel is refused.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Canceled | Self::Rejected
        )
    }

    /// Waiting for the client: a blocking send returns here.
    pub const fn is_interrupted(self) -> bool {
        matches!(self, Self::InputRequired | Self::AuthRequired)
    }

    /// The 1.0 (ProtoJSON) name.
    pub const fn v1_name(self) -> &'static str {
        match self {
            Self::Submitted => "TASK_STATE_SUBMITTED",
            Self::Working => "TASK_STATE_WORKING",
            Self::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            Self::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
            Self::Completed => "TASK_STATE_COMPLETED",
            Self::Failed => "TASK_STATE_FAILED",
            Self::Canceled => "TASK_STATE_CANCELED",
            Self::Rejected => "TASK_STATE_REJECTED",
        }
    }

    /// The 0.3 name.
    pub const fn v03_name(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Working => "working",
            Self::InputRequired => "input-required",
            Self::AuthRequired => "auth-required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::Rejected => "rejected",
        }
    }

    pub fn from_v1(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.v1_name() == name)
    }

    pub fn from_v03(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.v03_name() == name)
    }
}

/// Who sent a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Agent,
}

/// The content of a part: exactly one of these (a protobuf `oneof`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartContent {
    Text(String),
    /// File bytes, base64 as on the wire (never decoded here).
    Raw(String),
    Url(String),
    Data(Value),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    pub content: PartContent,
    pub media_type: Option<String>,
    pub filename: Option<String>,
    pub metadata: Option<Value>,
}

impl Part {
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            content: PartContent::Text(text.into()),
            media_type: None,
            filename: None,
            metadata: None,
        }
    }

    pub fn data(data: Value) -> Self {
        Self {
            content: PartContent::Data(data),
            media_type: None,
            filename: None,
            metadata: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub message_id: String,
    pub context_id: Option<String>,
    pub task_id: Option<String>,
    pub role: Role,
    pub parts: Vec<Part>,
    pub metadata: Option<Value>,
    pub reference_task_ids: Vec<String>,
    pub extensions: Vec<String>,
}

impl Message {
    /// A message from the agent about a task.
    pub fn agent(message_id: String, context_id: &str, task_id: &str, parts: Vec<Part>) -> Self {
        Self {
            message_id,
            context_id: Some(context_id.to_owned()),
            task_id: Some(task_id.to_owned()),
            role: Role::Agent,
            parts,
            metadata: None,
            reference_task_ids: Vec::new(),
            extensions: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub state: TaskState,
    pub message: Option<Message>,
    /// Unix milliseconds; written as ISO 8601 UTC.
    pub timestamp_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    pub artifact_id: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub parts: Vec<Part>,
    pub metadata: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub context_id: String,
    pub status: Status,
    pub artifacts: Vec<Artifact>,
    pub history: Vec<Message>,
    pub metadata: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StatusUpdate {
    pub task_id: String,
    pub context_id: String,
    pub status: Status,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactUpdate {
    pub task_id: String,
    pub context_id: String,
    pub artifact: Artifact,
    pub append: bool,
    pub last_chunk: bool,
}

/// One event of a stream (1.0 `StreamResponse`; 0.3 the `result` of a stream frame).
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    Task(Task),
    Message(Message),
    Status(StatusUpdate),
    Artifact(ArtifactUpdate),
}

impl StreamEvent {
    /// The state this event puts its task in, if it is a status.
    pub fn state(&self) -> Option<TaskState> {
        match self {
            Self::Task(t) => Some(t.status.state),
            Self::Status(s) => Some(s.status.state),
            Self::Message(_) | Self::Artifact(_) => None,
        }
    }
}

/// What `SendMessage` answers: a task, or (for simple replies) a message.
#[derive(Debug, Clone, PartialEq)]
pub enum SendResult {
    Task(Task),
    Message(Message),
}

/// One page of `ListTasks`.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskPage {
    pub tasks: Vec<Task>,
    /// Empty on the last page.
    pub next_page_token: String,
    pub page_size: u32,
    pub total_size: u32,
}

/// ISO 8601 UTC with milliseconds (`2026-01-02T03:04:05.678Z`), as spec 5.6.1 asks.
pub fn iso8601_ms(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let ms = unix_ms % 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

/// Reads an ISO 8601 UTC timestamp (`YYYY-MM-DDTHH:MM:SS[.fff…]Z`) back to unix ms.
pub fn parse_iso8601_ms(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z').or_else(|| s.strip_suffix('z'))?;
    let (date, time) = s.split_once(['T', 't'])?;
    let mut dp = date.splitn(3, '-');
    let y: i64 = dp.next()?.parse().ok()?;
    let m: i64 = dp.next()?.parse().ok()?;
    let d: i64 = dp.next()?.parse().ok()?;
    let (hms, frac) = match time.split_once('.') {
        Some((a, b)) => (a, b),
        None => (time, ""),
    };
    let mut tp = hms.splitn(3, ':');
    let hh: i64 = tp.next()?.parse().ok()?;
    let mm: i64 = tp.next()?.parse().ok()?;
    let ss: i64 = tp.next()?.parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    if !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let ms: i64 = format!("{frac:0<3}").get(..3)?.parse().ok()?;
    // Days from civil (the inverse of `civil_from_days`).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let total = days
        .checked_mul(86_400_000)?
        .checked_add((hh * 3600 + mm * 60 + ss) * 1000 + ms)?;
    u64::try_from(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_iso8601_utc_with_millis() {
        assert_eq!(iso8601_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601_ms(1_795_317_103_803), "2026-11-22T03:11:43.803Z");
        assert_eq!(
            parse_iso8601_ms("2026-11-22T03:11:43.803792Z"),
            Some(1_795_317_103_803)
        );
        assert_eq!(
            parse_iso8601_ms("2024-03-15T10:15:00Z"),
            Some(1_710_497_700_000)
        );
        assert_eq!(parse_iso8601_ms("yesterday"), None);
    }

    #[test]
    fn state_names_round_trip() {
        for s in TaskState::ALL {
            assert_eq!(TaskState::from_v1(s.v1_name()), Some(s));
            assert_eq!(TaskState::from_v03(s.v03_name()), Some(s));
        }
        assert!(TaskState::Canceled.is_terminal());
        assert!(!TaskState::InputRequired.is_terminal());
        assert!(TaskState::InputRequired.is_interrupted());
    }

    proptest::proptest! {
        #[test]
        fn iso8601_round_trips(ms in 0u64..8_000_000_000_000) {
            proptest::prop_assert_eq!(parse_iso8601_ms(&iso8601_ms(ms)), Some(ms));
        }
    }
}
