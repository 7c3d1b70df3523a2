//! Requests and replies of the session API: open, message, close, set-context, and the
//! observation types they return. Approvals are in [`crate::approval`], tasks in
//! [`crate::task`].

use crate::error::AgentError;
use crate::ids::{ConversationId, TaskId};
use crate::item::Usage;
use crate::policy::{ApprovalPolicy, SandboxPolicy, StoragePolicy};
use crate::task::{TaskStats, TaskStatus};
use serde::{Deserialize, Serialize};

/// Parameters of `conversation.open` (C6). Every field is optional on the wire; a field it
/// does not know is refused (a misspelt `storage_policy` must not open a conversation that
/// keeps what the caller meant to keep out).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenConversation {
    /// Replaces the built-in system prompt for this conversation (C3).
    pub base_instructions: Option<String>,
    /// Enters history once, as the earliest user message (C4).
    pub user_instructions: Option<String>,
    /// Qualified MCP tool names this conversation may see (C5); `None` = all.
    pub mcp_tool_allowlist: Option<Vec<String>>,
    pub include_plan_tool: bool,
    pub include_apply_patch_tool: bool,
    pub tools_web_search_request: bool,
    pub storage_policy: StoragePolicy,
    /// May only narrow the session's policy (C2).
    pub approval_policy: Option<ApprovalPolicy>,
    /// May only narrow the session's policy (C2).
    pub sandbox_policy: Option<SandboxPolicy>,
    /// The model this conversation asks (S1, C1), on the session's provider and endpoint;
    /// `None`: the session's model.
    pub model: Option<String>,
    /// The provider this conversation expects (`openai-responses`, `openai-chat`,
    /// `scripted`): it must be the session's (one endpoint per session); anything else is
    /// refused at open. `None`: the session's.
    pub provider: Option<String>,
}

impl OpenConversation {
    /// These parameters as a store keeps them under their own storage policy: under
    /// `headers_only` and `none` the instruction texts are content the policy forbids on disk,
    /// so both are left out; a conversation reopened from the store (after a restart) runs
    /// without them. `full` and `ttl` keep them.
    #[must_use]
    pub fn kept_by_policy(self) -> Self {
        if self.storage_policy.keeps_content() {
            self
        } else {
            self.without_instructions()
        }
    }

    /// Whether any instruction text is set.
    pub const fn has_instructions(&self) -> bool {
        self.base_instructions.is_some() || self.user_instructions.is_some()
    }

    /// These parameters without their instruction texts (what a Ttl sweep leaves once due).
    #[must_use]
    pub fn without_instructions(mut self) -> Self {
        self.base_instructions = None;
        self.user_instructions = None;
        self
    }

    /// These parameters as a store may hold them at `now_ms` for a conversation opened at
    /// `opened_ms`: under `Ttl { secs }`, once `secs` have passed since the opening (the
    /// instructions' expiry, saturating as the store's sweep computes it), without their
    /// instruction texts, which the sweep dropped or is due to drop; otherwise unchanged.
    /// A conversation written again later (a changed context) must not put them back.
    #[must_use]
    pub fn stored_at(self, opened_ms: u64, now_ms: u64) -> Self {
        match self.storage_policy {
            StoragePolicy::Ttl { secs }
                if opened_ms.saturating_add(secs.saturating_mul(1000)) <= now_ms =>
            {
                self.without_instructions()
            }
            _ => self,
        }
    }
}

/// Reply to `open`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Opened {
    pub conversation_id: ConversationId,
}

/// `conversation.message`: one user message, answered by one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SendMessage {
    pub conversation_id: ConversationId,
    pub text: String,
}

/// Reply to `message`: the final text and the task's statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageReply {
    pub conversation_id: ConversationId,
    pub task_id: TaskId,
    pub status: TaskStatus,
    pub text: String,
    pub stats: TaskStats,
    /// Set when `status` is `error` or `cancelled`.
    pub error: Option<AgentError>,
    /// What the task added to the history, in order (the user message, the model's text,
    /// its tool calls and their outputs): what the service stores as the exchange (P1).
    /// In-process only: never on the wire.
    #[serde(skip)]
    pub items: Vec<crate::item::HistoryItem>,
    /// When each of `items` happened (Unix ms, one per item; empty: not known), so that
    /// what is stored under `ttl` expires from when it happened. In-process only.
    #[serde(skip)]
    pub item_times_ms: Vec<u64>,
}

/// How a close went. Closing twice is not an error (S5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CloseOutcome {
    /// Closed now; any running task stopped when asked.
    Closed,
    /// Closed now; a task ignored cancellation and was aborted after the timeout.
    ForceAborted,
    /// Was already closed (or never existed in this session).
    AlreadyClosed,
}

/// Reply to `close`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Closed {
    pub conversation_id: ConversationId,
    pub outcome: CloseOutcome,
}

/// `conversation.setContext` (C6). Each field is a patch: `None` (absent on the wire) leaves
/// it unchanged, `Some(None)` (`null` on the wire) puts it back to its default (what `open`
/// gives when the field is not named: the built-in instructions, no user instructions, every
/// MCP tool, no plan/apply_patch/web-search tool, the session's model), `Some(Some(v))`
/// sets it. `refresh_mcp` asks for a fresh MCP view: the conversation opens a new view on the
/// session's current pool, which lists the tools of its ready servers again and starts again
/// at once the ones waiting to restart (see the McpPool).
///
/// In JSON an absent field and `null` differ; binary formats carry the patch as it is (see
/// `set_context_wire`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SetContext {
    pub base_instructions: Option<Option<String>>,
    pub user_instructions: Option<Option<String>>,
    pub mcp_tool_allowlist: Option<Option<Vec<String>>>,
    pub include_plan_tool: Option<Option<bool>>,
    pub include_apply_patch_tool: Option<Option<bool>>,
    pub tools_web_search_request: Option<Option<bool>>,
    /// Another model for the conversation's next tasks (the running one keeps its own).
    pub model: Option<Option<String>>,
    pub refresh_mcp: bool,
}

/// One field of a [`SetContext`] applied (C6): `None` leaves `current`, `Some(None)` puts
/// back `default`, `Some(Some(v))` sets `v`.
pub fn patched<T: Clone>(current: T, patch: Option<&Option<T>>, default: T) -> T {
    match patch {
        None => current,
        Some(None) => default,
        Some(Some(v)) => v.clone(),
    }
}

impl OpenConversation {
    /// Applies a context update (C6: fields the update leaves unset are unchanged, fields it
    /// names as `null` go back to their default, the value `open` gives an unnamed field).
    pub fn apply(&mut self, update: &SetContext) {
        // Every optional field defaults to `None`: `null` clears it.
        fn opt<T: Clone>(current: &mut Option<T>, patch: &Option<Option<T>>) {
            if let Some(v) = patch {
                current.clone_from(v);
            }
        }
        fn flag(current: &mut bool, patch: &Option<Option<bool>>) {
            *current = patched(*current, patch.as_ref(), false);
        }
        opt(&mut self.base_instructions, &update.base_instructions);
        opt(&mut self.user_instructions, &update.user_instructions);
        opt(&mut self.mcp_tool_allowlist, &update.mcp_tool_allowlist);
        flag(&mut self.include_plan_tool, &update.include_plan_tool);
        flag(
            &mut self.include_apply_patch_tool,
            &update.include_apply_patch_tool,
        );
        flag(
            &mut self.tools_web_search_request,
            &update.tools_web_search_request,
        );
        opt(&mut self.model, &update.model);
    }
}

/// How a [`SetContext`] travels: in human-readable formats (JSON) an absent field means
/// "unchanged" and `null` "back to the default", so `None` is skipped and `Some(None)` is
/// `null`; binary formats (bincode) cannot skip fields, so they carry every field as is.
mod set_context_wire {
    use super::SetContext;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// `null` → `Some(None)`, a value → `Some(Some(v))` (absent: the field's default, `None`).
    fn patch<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(d).map(Some)
    }

    macro_rules! wire {
        ($($field:ident: $ty:ty),* $(,)?) => {
            #[derive(Serialize, Deserialize, Default)]
            #[serde(default, deny_unknown_fields)]
            struct Text {
                $(
                    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "patch")]
                    $field: Option<Option<$ty>>,
                )*
                #[serde(alias = "refreshMcp")]
                refresh_mcp: bool,
            }

            #[derive(Serialize, Deserialize, Default)]
            struct Binary {
                $($field: Option<Option<$ty>>,)*
                refresh_mcp: bool,
            }

            impl From<&SetContext> for Text {
                fn from(v: &SetContext) -> Self {
                    Self { $($field: v.$field.clone(),)* refresh_mcp: v.refresh_mcp }
                }
            }

            impl From<&SetContext> for Binary {
                fn from(v: &SetContext) -> Self {
                    Self { $($field: v.$field.clone(),)* refresh_mcp: v.refresh_mcp }
                }
            }

            impl From<Text> for SetContext {
                fn from(v: Text) -> Self {
                    Self { $($field: v.$field,)* refresh_mcp: v.refresh_mcp }
                }
            }

            impl From<Binary> for SetContext {
                fn from(v: Binary) -> Self {
                    Self { $($field: v.$field,)* refresh_mcp: v.refresh_mcp }
                }
            }
        };
    }

    wire! {
        base_instructions: String,
        user_instructions: String,
        mcp_tool_allowlist: Vec<String>,
        include_plan_tool: bool,
        include_apply_patch_tool: bool,
        tools_web_search_request: bool,
        model: String,
    }

    impl Serialize for SetContext {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            if s.is_human_readable() {
                Text::from(self).serialize(s)
            } else {
                Binary::from(self).serialize(s)
            }
        }
    }

    impl<'de> Deserialize<'de> for SetContext {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            if d.is_human_readable() {
                Text::deserialize(d).map(Into::into)
            } else {
                Binary::deserialize(d).map(Into::into)
            }
        }
    }
}

/// Per-conversation statistics (S11).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConversationStats {
    pub conversation_id: Option<ConversationId>,
    pub tasks: u64,
    pub tasks_failed: u64,
    pub tasks_cancelled: u64,
    pub usage: Usage,
    pub tool_calls: u64,
    pub mcp_calls: u64,
    pub mcp_latency_ms_total: u64,
    pub history_items: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_are_stored_until_a_ttl_conversations_expiry_and_not_after() {
        let params = |policy| OpenConversation {
            base_instructions: Some("be brief".into()),
            user_instructions: Some("I am Ann".into()),
            storage_policy: policy,
            ..OpenConversation::default()
        };
        let ttl = StoragePolicy::Ttl { secs: 60 };
        assert!(params(ttl).stored_at(1_000, 60_999).has_instructions());
        assert!(!params(ttl).stored_at(1_000, 61_000).has_instructions());
        assert!(
            params(StoragePolicy::Full)
                .stored_at(0, u64::MAX)
                .has_instructions()
        );
        let forever = StoragePolicy::Ttl { secs: u64::MAX };
        assert!(
            params(forever)
                .stored_at(1_000, u64::MAX - 1)
                .has_instructions()
        );
    }
}
