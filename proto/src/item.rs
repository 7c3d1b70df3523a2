//! History items: what a conversation remembers and what a prompt is made of.

use crate::tool::{ToolCall, ToolOutput};
use serde::{Deserialize, Serialize};

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
}

/// One entry of a conversation's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryItem {
    /// A plain message.
    Message { role: Role, text: String },
    /// The model asked for a tool.
    ToolCall(ToolCall),
    /// A tool's answer (or the observation that stands for it).
    ToolOutput(ToolOutput),
    /// Stands for `replaced_items` older items that were trimmed (S6).
    Summary { text: String, replaced_items: u64 },
}

impl HistoryItem {
    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        Self::Message {
            role: Role::User,
            text: text.into(),
        }
    }

    /// An assistant message.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::Message {
            role: Role::Assistant,
            text: text.into(),
        }
    }

    /// Size of the content in bytes: the basis of the approximate token count.
    pub fn content_len(&self) -> usize {
        match self {
            Self::Message { text, .. } | Self::Summary { text, .. } => text.len(),
            Self::ToolCall(c) => c.name.len() + c.arguments.0.to_string().len(),
            Self::ToolOutput(o) => o.output.len(),
        }
    }

    /// Approximate tokens: about four bytes a token, plus a small per-item overhead, which is
    /// what chat formats add around each message.
    pub fn approx_tokens(&self) -> usize {
        self.content_len().div_ceil(4) + 4
    }
}

/// Token usage, as reported by a provider (or estimated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    pub reasoning_tokens: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_tokens += other.cached_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }
}
