//! Authorization tokens at a tool call (A5): a tool a layer lists as `authorizationRequired`
//! runs only when a token presented with the task's message is valid for it.

use super::*;
use troupe_proto::governance::PolicyLayer;

/// Consumes one use of a valid token for `call`; `Err` says why none was.
pub(super) async fn authorize(
    _ctx: &TaskContext,
    gov: &TaskGovernance,
    call: &ToolCall,
    layer: PolicyLayer,
) -> Result<(), String> {
    let asked = format!(
        "tool `{}` needs an authorization token (the {layer} layer requires one)",
        call.name
    );
    if gov.authorization.is_empty() {
        return Err(format!("{asked} and none was presented"));
    }
    Err(format!("{asked}: this session has no token book"))
}
