//! Tool descriptions and calls, as a model sees them.

use crate::json::Json;
use serde::{Deserialize, Serialize};

/// A tool offered to the model. Two specs with the same name are the same tool only if the
/// whole spec is equal (the signature check of S8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Qualified name: a built-in name, or `server__tool` for MCP tools (C5).
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Json,
}

/// A call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call, echoed back with its output.
    pub call_id: String,
    pub name: String,
    pub arguments: Json,
}

/// What a tool answered (or the observation that replaces it: a denial, an error).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    pub call_id: String,
    pub output: String,
    pub is_error: bool,
}

/// Where one step of a plan stands (`update_plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanStepStatus {
    Pending,
    InProgress,
    Completed,
}

impl PlanStepStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
        }
    }
}

/// One step of the plan a model records with the `update_plan` built-in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanStep {
    pub step: String,
    pub status: PlanStepStatus,
}
