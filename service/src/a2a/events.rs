//! How troupe's states and events become A2A's: the state mapping, the events a troupe event
//! adds to a task's stream, and the SSE frame of each event in either version.
//!
//! ```text
//! troupe                               A2A
//! (accepted, waiting its turn)         TASK_STATE_SUBMITTED   (the stream's first event: the Task)
//! task_started                         statusUpdate WORKING
//! assistant_chunk                      artifactUpdate (a piece of the answer; not for JSON)
//! tool_call_started                    statusUpdate WORKING + agent message (tool name, arguments)
//! tool_call_finished (patch, shell)    artifactUpdate (a file: the patch, the output)
//! approval_requested                   statusUpdate INPUT_REQUIRED + agent message (command)
//! approval_resolved                    statusUpdate WORKING
//! task_finished ok                     artifactUpdate (the answer: text, data, links, files)
//!                                      + statusUpdate COMPLETED; or, as the reply form asks,
//!                                      message + statusUpdate COMPLETED (a plain Message),
//!                                      statusUpdate INPUT_REQUIRED (a question), or
//!                                      statusUpdate REJECTED (see `reply`)
//! task_finished error | max_steps      [artifactUpdate] + statusUpdate FAILED + agent message
//! task_finished cancelled, aborted     statusUpdate CANCELED
//! ```

use super::model::{StreamEvent, TaskState};
use super::version::Version;
use super::wire;
use serde_json::{Value, json};
use troupe_proto::TaskStatus;

/// A finished troupe task's A2A state. `max_steps` stopped short of an answer: failed.
pub const fn final_state(status: TaskStatus) -> TaskState {
    match status {
        TaskStatus::Ok => TaskState::Completed,
        TaskStatus::Error | TaskStatus::MaxSteps => TaskState::Failed,
        TaskStatus::Cancelled => TaskState::Canceled,
    }
}

/// A live troupe task's A2A state (a cancellation in progress is still work).
pub const fn live_state(state: troupe_proto::TaskState) -> TaskState {
    match state {
        troupe_proto::TaskState::Queued => TaskState::Submitted,
        troupe_proto::TaskState::Running | troupe_proto::TaskState::Cancelling => {
            TaskState::Working
        }
    }
}

/// Whether the stream ends after this event. 1.0 closes on a terminal state (spec 3.1.2);
/// 0.3 also ends an interaction that waits for input (its `final` flag).
pub fn closes_stream(version: Version, event: &StreamEvent) -> bool {
    if matches!(event, StreamEvent::Message(_)) {
        return true;
    }
    match (version, event.state()) {
        (_, Some(s)) if s.is_terminal() => true,
        (Version::V0_3, Some(s)) => s.is_interrupted() && matches!(event, StreamEvent::Status(_)),
        _ => false,
    }
}

/// One SSE frame's data: the JSON-RPC response carrying `event`, and whether it is the last.
pub fn frame(version: Version, rpc_id: &Value, event: &StreamEvent) -> (Value, bool) {
    let last = closes_stream(version, event);
    let result = wire::stream_event(version, event, last);
    (
        json!({ "jsonrpc": "2.0", "id": rpc_id, "result": result }),
        last,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn troupe_states_map_to_a2a_states() {
        assert_eq!(final_state(TaskStatus::Ok), TaskState::Completed);
        assert_eq!(final_state(TaskStatus::Error), TaskState::Failed);
        assert_eq!(final_state(TaskStatus::MaxSteps), TaskState::Failed);
        assert_eq!(final_state(TaskStatus::Cancelled), TaskState::Canceled);
        assert_eq!(
            live_state(troupe_proto::TaskState::Queued),
            TaskState::Submitted
        );
        assert_eq!(
            live_state(troupe_proto::TaskState::Running),
            TaskState::Working
        );
        assert_eq!(
            live_state(troupe_proto::TaskState::Cancelling),
            TaskState::Working
        );
    }
}
