//! Bounded names that travel as plain strings: the kind of an event ([`EventName`]) and the
//! code of a warning ([`WarningCode`]).
//!
//! Each is a `Copy` enum with one variant per name, and `Unknown` for a name this build does
//! not know (one written by a newer build). On every wire it is its snake_case string, in JSON
//! and in binary formats alike, so it reads and writes exactly what the `String` it replaced
//! did; a string it does not know reads as `Unknown` instead of failing the record around it.
//! `Unknown` is only ever read: nothing in troupe makes one, and it is written as `"unknown"`.

/// Declares a bounded name enum: its variants with their wire strings, `ALL`, `as_str`,
/// `parse`, `Display`, and serde as a string.
macro_rules! bounded_names {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A name this build does not know (written by a newer one); read, never made.
            Unknown,
        }

        impl $name {
            /// Every known name, in declaration order (`Unknown` is not one).
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The snake_case name, as serialised (a bounded metric label).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                    Self::Unknown => "unknown",
                }
            }

            /// Parses [`as_str`](Self::as_str); `None` for a name this build does not know.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($text => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
                Ok(Self::parse(&s).unwrap_or(Self::Unknown))
            }
        }
    };
}

bounded_names! {
    /// The kind of an event: one per [`EventKind`](crate::EventKind) variant
    /// ([`EventKind::name`](crate::EventKind::name)), and the `kind` of a rollout record.
    pub enum EventName {
        ConversationOpened = "conversation_opened",
        ConversationClosed = "conversation_closed",
        ConversationRestarted = "conversation_restarted",
        TaskStarted = "task_started",
        TaskFinished = "task_finished",
        TaskAborted = "task_aborted",
        StepStarted = "step_started",
        AssistantChunk = "assistant_chunk",
        AssistantMessage = "assistant_message",
        ToolCallStarted = "tool_call_started",
        ToolCallFinished = "tool_call_finished",
        ApprovalRequested = "approval_requested",
        ApprovalResolved = "approval_resolved",
        HistoryTrimmed = "history_trimmed",
        Warning = "warning",
        Error = "error",
        StepFinished = "step_finished",
        CompactionStarted = "compaction_started",
        Compacted = "compacted",
        PlanUpdated = "plan_updated",
        ToolProgress = "tool_progress",
        McpServerReady = "mcp_server_ready",
        MessageUpdated = "message_updated",
        HistoryCheckpoint = "history_checkpoint",
        SessionCreated = "session_created",
        SessionBound = "session_bound",
        SessionResumed = "session_resumed",
        RouteDecided = "route_decided",
        DispatchSent = "dispatch_sent",
        DispatchResult = "dispatch_result",
        PolicyRejected = "policy_rejected",
        AskHuman = "ask_human",
        AgentUpdate = "agent_update",
        GuardrailFailed = "guardrail_failed",
    }
}

bounded_names! {
    /// What a `warning` event is about
    /// ([`EventKind::Warning`](crate::EventKind::Warning)`::code`).
    pub enum WarningCode {
        /// A task was running when its conversation failed or the process restarted; it is
        /// not run again.
        TaskInterrupted = "task_interrupted",
        /// An allowlist entry uses a deprecated tool name.
        DeprecatedToolName = "deprecated_tool_name",
        /// A conversation asked for wider policies than its session's and got the session's.
        PolicyClamped = "policy_clamped",
        /// A conversation's MCP tools could not be reopened on a new pool.
        McpViewUnavailable = "mcp_view_unavailable",
        /// A task could not list its MCP tools and runs without them.
        McpToolsUnavailable = "mcp_tools_unavailable",
        /// Two tools share a name but not a signature.
        ToolConflict = "tool_conflict",
        /// The oldest history items were left out of a prompt to fit max-prompt-tokens.
        PromptTrimmed = "prompt_trimmed",
        /// A prompt is above warn-prompt-tokens.
        PromptTokensWarning = "prompt_tokens_warning",
        /// An MCP server of the session failed (and whether it is restarted).
        McpServerFailed = "mcp_server_failed",
        /// An MCP server's request could not be tied to a call in flight and was refused.
        McpRequestUnattributed = "mcp_request_unattributed",
        /// An allowlist entry names a tool its MCP server, once connected, does not offer.
        McpAllowlistUnknownTool = "mcp_allowlist_unknown_tool",
        /// A built-in tool was asked for that this session cannot run; it is not offered.
        ToolUnavailable = "tool_unavailable",
        /// A cancelled task did not end within the close timeout and was aborted.
        CancelIgnored = "cancel_ignored",
        /// The model could not summarize trimmed history; the local summary stays.
        SummaryFallback = "summary_fallback",
        /// An agent's binding could not be resumed; a new provider session replaces it (A1).
        BindingReplaced = "binding_replaced",
        /// A dispatch's lease expired: the child was cancelled and the lease reclaimed (A4).
        LeaseExpired = "lease_expired",
        /// An agent's answer did not match its output schema; the model is asked again with
        /// the errors (A8).
        GuardrailRetry = "guardrail_retry",
        /// An agent file or `[tools]` changed and did not load: the last good version stays
        /// (A7).
        ConfigRejected = "config_rejected",
        /// A reply could not be delivered to a module: a sync one did not acknowledge in
        /// time, or it failed (an async one after its retries) (A10).
        ModuleDeliveryFailed = "module_delivery_failed",
        /// An external agent ran a tool call its tool policy denies without asking troupe
        /// first (A5): troupe could not stop it, and says so.
        UngovernedToolCall = "ungoverned_tool_call",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_and_nothing_else_does() {
        for name in EventName::ALL {
            assert_eq!(EventName::parse(name.as_str()), Some(*name));
        }
        for code in WarningCode::ALL {
            assert_eq!(WarningCode::parse(code.as_str()), Some(*code));
        }
        assert_eq!(EventName::parse("unknown"), None);
        assert_eq!(WarningCode::parse("Task_Interrupted"), None);
    }

    #[test]
    fn a_name_is_its_string_on_every_wire() {
        let json = serde_json::to_string(&EventName::ToolCallFinished).unwrap();
        assert_eq!(json, r#""tool_call_finished""#);
        let config = bincode::config::standard();
        let as_enum = bincode::serde::encode_to_vec(WarningCode::PolicyClamped, config).unwrap();
        let as_string = bincode::serde::encode_to_vec("policy_clamped", config).unwrap();
        assert_eq!(as_enum, as_string);
        let (back, _): (WarningCode, usize) =
            bincode::serde::decode_from_slice(&as_string, config).unwrap();
        assert_eq!(back, WarningCode::PolicyClamped);
    }

    #[test]
    fn a_name_this_build_does_not_know_reads_as_unknown() {
        let kind: EventName = serde_json::from_str(r#""kind_of_a_newer_build""#).unwrap();
        assert_eq!(kind, EventName::Unknown);
        let code: WarningCode = serde_json::from_str(r#""code_of_a_newer_build""#).unwrap();
        assert_eq!(code, WarningCode::Unknown);
        assert!(serde_json::from_str::<EventName>("7").is_err());
    }
}
