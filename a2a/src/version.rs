//! Protocol versions and method names (spec 5.3, and the 0.3 names): which name each
//! operation has under each version. The endpoint resolves names with it, the client picks
//! the name of the version it negotiated from the card.

/// A protocol version troupe speaks, as a server and as a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    V0_3,
    V1_0,
}

impl Version {
    /// As written in the card and as the metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::V0_3 => "0.3",
            Self::V1_0 => "1.0",
        }
    }
}

/// An A2A operation, whatever its name in either version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    SendMessage,
    SendStreamingMessage,
    GetTask,
    ListTasks,
    CancelTask,
    SubscribeToTask,
    CreatePushConfig,
    GetPushConfig,
    ListPushConfigs,
    DeletePushConfig,
    GetExtendedAgentCard,
}

impl Operation {
    pub const ALL: [Self; 11] = [
        Self::SendMessage,
        Self::SendStreamingMessage,
        Self::GetTask,
        Self::ListTasks,
        Self::CancelTask,
        Self::SubscribeToTask,
        Self::CreatePushConfig,
        Self::GetPushConfig,
        Self::ListPushConfigs,
        Self::DeletePushConfig,
        Self::GetExtendedAgentCard,
    ];

    /// Bounded metric label.
    pub const fn label(self) -> &'static str {
        match self {
            Self::SendMessage => "send_message",
            Self::SendStreamingMessage => "send_streaming_message",
            Self::GetTask => "get_task",
            Self::ListTasks => "list_tasks",
            Self::CancelTask => "cancel_task",
            Self::SubscribeToTask => "subscribe_to_task",
            Self::CreatePushConfig => "create_push_config",
            Self::GetPushConfig => "get_push_config",
            Self::ListPushConfigs => "list_push_configs",
            Self::DeletePushConfig => "delete_push_config",
            Self::GetExtendedAgentCard => "get_extended_agent_card",
        }
    }

    /// Answered over SSE.
    pub const fn is_streaming(self) -> bool {
        matches!(self, Self::SendStreamingMessage | Self::SubscribeToTask)
    }

    /// Its method name under `version`; `None` where that version has no such method (0.3
    /// had no ListTasks).
    pub fn method(self, version: Version) -> Option<&'static str> {
        let (_, v1, v03) = METHOD_NAMES.iter().find(|(op, _, _)| *op == self)?;
        match version {
            Version::V1_0 => Some(v1),
            Version::V0_3 => *v03,
        }
    }
}

/// (1.0 name, 0.3 name) of each operation. 0.3 had no ListTasks.
pub const METHOD_NAMES: [(Operation, &str, Option<&str>); 11] = [
    (Operation::SendMessage, "SendMessage", Some("message/send")),
    (
        Operation::SendStreamingMessage,
        "SendStreamingMessage",
        Some("message/stream"),
    ),
    (Operation::GetTask, "GetTask", Some("tasks/get")),
    (Operation::ListTasks, "ListTasks", None),
    (Operation::CancelTask, "CancelTask", Some("tasks/cancel")),
    (
        Operation::SubscribeToTask,
        "SubscribeToTask",
        Some("tasks/resubscribe"),
    ),
    (
        Operation::CreatePushConfig,
        "CreateTaskPushNotificationConfig",
        Some("tasks/pushNotificationConfig/set"),
    ),
    (
        Operation::GetPushConfig,
        "GetTaskPushNotificationConfig",
        Some("tasks/pushNotificationConfig/get"),
    ),
    (
        Operation::ListPushConfigs,
        "ListTaskPushNotificationConfigs",
        Some("tasks/pushNotificationConfig/list"),
    ),
    (
        Operation::DeletePushConfig,
        "DeleteTaskPushNotificationConfig",
        Some("tasks/pushNotificationConfig/delete"),
    ),
    (
        Operation::GetExtendedAgentCard,
        "GetExtendedAgentCard",
        Some("agent/getAuthenticatedExtendedCard"),
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_has_a_1_0_name_and_all_but_list_a_0_3_one() {
        for op in Operation::ALL {
            assert!(op.method(Version::V1_0).is_some(), "{op:?}");
            assert_eq!(
                op.method(Version::V0_3).is_none(),
                op == Operation::ListTasks,
                "{op:?}"
            );
        }
        assert_eq!(
            Operation::SubscribeToTask.method(Version::V0_3),
            Some("tasks/resubscribe")
        );
    }
}
