//! Tool governance (A5) of an external ACP agent's tool calls, where troupe can see them.
//!
//! An ACP agent runs its own tools. troupe sees a call in two ways: a
//! `session/request_permission` (the agent waits for the answer: troupe can refuse it), and a
//! `tool_call` session update (the agent says what it runs: too late to stop it). Both are
//! named like troupe's own tools ([`qualified_tool`]) and decided by the policy the agent's
//! calls answer to (its layers and its dispatcher's, see
//! [`troupe_actors::governance::external_agent`]):
//!
//! - a permission request for a denied tool is refused (`reject_once`) without asking a
//!   human, with a `policy_rejected` event; one that needs an authorization token uses one
//!   (or is refused, `unauthorized`); an allowed one goes on to the approvals;
//! - a tool call that runs outside troupe's word is reported as [`ungoverned`]: a `warning`
//!   (`ungoverned_tool_call`), since troupe could not stop it: one of a denied tool (or of a
//!   tool that needs a token) that runs without having asked, or before the answer, and one
//!   that runs though its request was refused. A call's kind and input are those of its
//!   `tool_call` as its `tool_call_update`s change them.

use crate::client::command_in_input;
use crate::event::PermissionRequest;
use serde_json::Value;
use troupe_actors::governance::tokens::command_line;
use troupe_actors::governance::{Denial, ToolPolicy, ToolVerdict};

/// The troupe tool an ACP tool call of `kind` stands for: `execute` is `shell`; `edit`,
/// `delete` and `move` change files like `apply_patch`; `fetch` is `web_fetch`; any other
/// kind (`read`, `search`, `think`, `switch_mode`, `other`, one the protocol adds later) is
/// `acp__<kind>`, and a missing or malformed kind `acp__other`. Patterns name them as any
/// other tool (`acp__*`: every one of them).
pub fn qualified_tool(kind: Option<&str>) -> String {
    let kind = kind.unwrap_or_default().trim().to_ascii_lowercase();
    match kind.as_str() {
        "execute" => "shell".to_owned(),
        "edit" | "delete" | "move" => "apply_patch".to_owned(),
        "fetch" => "web_fetch".to_owned(),
        k if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => {
            format!("acp__{k}")
        }
        _ => "acp__other".to_owned(),
    }
}

/// What a permission request's tool call is to troupe's policy: its qualified name, and what
/// a token's argument patterns are matched against: a command's line (`bash -lc LINE` read
/// as `LINE`) for a token's `args`, the call's input for its `fields`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GovernedCall {
    pub tool: String,
    /// The command line of a `shell` call, read from its input alone (`None`: another tool,
    /// or an input that holds no command: the agent's free-text title is no command, and a
    /// token with a command-line pattern does not cover the call).
    pub command: Option<String>,
    /// The call's `rawInput` (`null` without one).
    pub arguments: Value,
}

/// The kind a tool call without one (or with `other`) stands for, read from its input: a
/// `command`/`cmd` runs a command (`execute`); a path with new content, a replacement or a
/// patch changes a file (`edit`); a `url` fetches (`fetch`). Agents that leave the kind out
/// of a permission request still answer to the policy for what they would run.
pub fn inferred_kind(raw_input: Option<&Value>) -> Option<&'static str> {
    let input = raw_input?.as_object()?;
    let has = |keys: &[&str]| keys.iter().any(|k| input.contains_key(*k));
    if has(&["command", "cmd"]) {
        Some("execute")
    } else if has(&["file_path", "path", "filePath"])
        && has(&[
            "content",
            "old_string",
            "new_string",
            "edits",
            "diff",
            "patch",
        ])
        || has(&["patch", "diff"])
    {
        Some("edit")
    } else if has(&["url"]) {
        Some("fetch")
    } else {
        None
    }
}

/// The troupe tool a tool call stands for: by its kind ([`qualified_tool`]), and when the
/// kind is missing or `other`, by what its input shows it would do ([`inferred_kind`]).
pub fn tool_of(kind: Option<&str>, raw_input: Option<&Value>) -> String {
    let vague = kind.is_none_or(|k| k.trim().is_empty() || k.trim().eq_ignore_ascii_case("other"));
    match (vague, inferred_kind(raw_input)) {
        (true, Some(inferred)) => qualified_tool(Some(inferred)),
        _ => qualified_tool(kind),
    }
}

impl GovernedCall {
    pub fn of(request: &PermissionRequest) -> Self {
        let tool = tool_of(request.kind.as_deref(), request.raw_input.as_ref());
        let command = (tool == "shell")
            .then(|| command_in_input(request.raw_input.as_ref()))
            .flatten()
            .map(|argv| command_line(&argv));
        let arguments = request.raw_input.clone().unwrap_or(Value::Null);
        Self {
            tool,
            command,
            arguments,
        }
    }
}

/// The policy's word on a permission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionVerdict {
    /// Allowed: ask as before (the approvals).
    Ask,
    /// Allowed with a token: the layer that requires one.
    NeedsToken(troupe_proto::governance::PolicyLayer),
    /// Refused without asking anyone.
    Refuse(Denial),
}

/// Decides a permission request for `call` under `policy`.
pub fn permission_verdict(policy: &ToolPolicy, call: &GovernedCall) -> PermissionVerdict {
    match policy.decide(&call.tool) {
        ToolVerdict::Allowed {
            authorization: None,
        } => PermissionVerdict::Ask,
        ToolVerdict::Allowed {
            authorization: Some(layer),
        } => PermissionVerdict::NeedsToken(layer),
        ToolVerdict::Denied(denial) => PermissionVerdict::Refuse(denial),
    }
}

/// The sentence a refusal of an ACP tool call carries: the policy's (naming the layer), and
/// which call of the agent it was.
pub fn refusal_message(agent_id: &str, request: &PermissionRequest, why: &str) -> String {
    let kind = request.kind.as_deref().unwrap_or("other");
    match request.title.as_deref().filter(|t| !t.is_empty()) {
        Some(title) => {
            format!(
                "{why}; ACP agent `{agent_id}` asked to run a tool call of kind `{kind}`: {title}"
            )
        }
        None => format!("{why}; ACP agent `{agent_id}` asked to run a tool call of kind `{kind}`"),
    }
}

/// What became of a tool call's permission request, as far as troupe saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// The agent never asked about the call.
    Never,
    /// It asked, and has no answer yet.
    Pending,
    /// It asked and was allowed (`allow_once`/`allow_always`).
    Allowed,
    /// It asked and was refused or its request cancelled.
    Refused,
}

/// A tool call the agent reports as running or done (`status` `in_progress` or
/// `completed`) that troupe's word did not cover, with why (troupe could not stop it: it
/// says so): one it ran though its permission request was refused (by policy or by a
/// human), or one it ran without asking (or before the answer) whose tool the policy denies
/// or lets run only with an authorization token (none was used). A call allowed when it
/// asked was decided then; a call still `pending` or `failed` did not run (yet).
pub fn ungoverned(
    policy: &ToolPolicy,
    (kind, raw_input): (Option<&str>, Option<&Value>),
    status: Option<&str>,
    asked: Asked,
) -> Option<String> {
    if !matches!(status, Some("in_progress" | "completed")) {
        return None;
    }
    let tool = tool_of(kind, raw_input);
    match asked {
        Asked::Allowed => None,
        Asked::Refused => Some(format!(
            "it ran tool `{tool}` after its permission request was refused"
        )),
        Asked::Never | Asked::Pending => match policy.decide(&tool) {
            ToolVerdict::Denied(denial) => Some(denial.message),
            ToolVerdict::Allowed {
                authorization: Some(layer),
            } => Some(format!(
                "tool `{tool}` needs an authorization token (the {layer} layer requires one), and no token was used for a call that did not ask"
            )),
            ToolVerdict::Allowed {
                authorization: None,
            } => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use troupe_actors::governance::task_policy;
    use troupe_proto::agent::ToolRules;
    use troupe_proto::governance::{PolicyLayer, ToolPolicyConfig};

    fn request(kind: Option<&str>, raw_input: Option<Value>) -> PermissionRequest {
        PermissionRequest {
            session_id: "s".into(),
            tool_call_id: "c1".into(),
            title: Some("touch x".into()),
            kind: kind.map(str::to_owned),
            raw_input,
            options: Vec::new(),
        }
    }

    fn policy(blacklist: &[&str], authorization: &[&str]) -> ToolPolicy {
        let request = ToolRules {
            blacklist: blacklist.iter().map(|s| (*s).to_owned()).collect(),
            authorization_required: authorization.iter().map(|s| (*s).to_owned()).collect(),
            ..ToolRules::default()
        };
        task_policy(&ToolPolicyConfig::default(), None, Some(&request), None)
    }

    #[test]
    fn acp_kinds_are_named_like_troupe_tools() {
        for (kind, tool) in [
            (Some("execute"), "shell"),
            (Some("edit"), "apply_patch"),
            (Some("delete"), "apply_patch"),
            (Some("move"), "apply_patch"),
            (Some("fetch"), "web_fetch"),
            (Some("read"), "acp__read"),
            (Some("search"), "acp__search"),
            (Some("think"), "acp__think"),
            (Some("other"), "acp__other"),
            (Some("switch_mode"), "acp__switch_mode"),
            (Some(" Execute "), "shell"),
            (Some("we!rd"), "acp__other"),
            (Some(""), "acp__other"),
            (None, "acp__other"),
        ] {
            assert_eq!(qualified_tool(kind), tool, "{kind:?}");
        }
    }

    #[test]
    fn a_command_is_matched_by_its_script() {
        let call = GovernedCall::of(&request(
            Some("execute"),
            Some(json!({"command": ["/bin/bash", "-lc", "git status"]})),
        ));
        assert_eq!(call.tool, "shell");
        assert_eq!(call.command.as_deref(), Some("git status"));
        let argv = GovernedCall::of(&request(
            Some("execute"),
            Some(json!({"command": ["git", "status"]})),
        ));
        assert_eq!(argv.command.as_deref(), Some("git status"));
        let edit = GovernedCall::of(&request(Some("edit"), Some(json!({"path": "a"}))));
        assert_eq!(edit.tool, "apply_patch");
        assert_eq!(edit.command, None);
        assert_eq!(edit.arguments, json!({"path": "a"}));
        assert_eq!(
            GovernedCall::of(&request(Some("read"), None)).arguments,
            Value::Null
        );
        let line = GovernedCall::of(&request(Some("execute"), Some(json!({"cmd": "make"}))));
        assert_eq!(line.command.as_deref(), Some("make"));
    }

    /// A command that cannot be read from the call's input is no command: the agent's title
    /// (free text) is not matched against a token's command-line pattern, and no such token
    /// covers the call.
    #[test]
    fn a_command_not_in_the_input_is_covered_by_no_command_pattern() {
        use troupe_actors::governance::tokens::{CallScope, check};
        use troupe_proto::governance::{AuthToken, TokenRefusal, TokenScope};
        let token = |args: Option<&str>| AuthToken {
            id: "t".into(),
            digest: "d".into(),
            scope: TokenScope {
                agent: "*".into(),
                tool: "shell".into(),
                args: args.map(str::to_owned),
                fields: Default::default(),
            },
            issued_by: "ann".into(),
            issued_ms: 0,
            expires_ms: 1_000,
            max_uses: 1,
            uses: 0,
            revoked_ms: None,
        };
        let decide = |call: &GovernedCall, t: &AuthToken| {
            check(
                t,
                &CallScope {
                    agent: Some("codex"),
                    tool: &call.tool,
                    command: call.command.as_deref(),
                    arguments: &call.arguments,
                },
                0,
            )
        };
        // The title says `touch x`; the input holds no command it can read.
        for input in [
            None,
            Some(json!({"command": ["touch", 5]})),
            Some(json!({"cmd": {"line": "touch x"}})),
        ] {
            let mut asked = request(Some("execute"), input.clone());
            asked.title = Some("touch x".into());
            let call = GovernedCall::of(&asked);
            assert_eq!(call.tool, "shell");
            assert_eq!(call.command, None, "{input:?}");
            assert_eq!(
                decide(&call, &token(Some("touch *"))),
                Err(TokenRefusal::OutOfScope),
                "{input:?}"
            );
            // A token for any command still covers it.
            assert_eq!(decide(&call, &token(None)), Ok(()));
        }
        let readable = GovernedCall::of(&request(
            Some("execute"),
            Some(json!({"command": ["touch", "x"]})),
        ));
        assert_eq!(decide(&readable, &token(Some("touch *"))), Ok(()));
    }

    #[test]
    fn a_denied_tool_is_refused_a_required_token_asked_for_and_others_asked() {
        let policy = policy(&["shell", "acp__*"], &["apply_patch"]);
        let call = |kind| GovernedCall::of(&request(Some(kind), None));
        match permission_verdict(&policy, &call("execute")) {
            PermissionVerdict::Refuse(denial) => {
                assert_eq!(denial.layer, PolicyLayer::Request);
                assert!(denial.message.contains("`shell`"), "{}", denial.message);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            permission_verdict(&policy, &call("think")),
            PermissionVerdict::Refuse(_)
        ));
        assert_eq!(
            permission_verdict(&policy, &call("edit")),
            PermissionVerdict::NeedsToken(PolicyLayer::Request)
        );
        assert_eq!(
            permission_verdict(&policy, &call("fetch")),
            PermissionVerdict::Ask
        );
        assert_eq!(
            permission_verdict(&ToolPolicy::open(), &call("execute")),
            PermissionVerdict::Ask
        );
    }

    #[test]
    fn a_refusal_names_the_policy_and_the_call() {
        let message = refusal_message(
            "codex",
            &request(Some("execute"), None),
            "tool `shell` is denied by agent `codex`'s blacklist (`shell`)",
        );
        assert_eq!(
            message,
            "tool `shell` is denied by agent `codex`'s blacklist (`shell`); ACP agent `codex` asked to run a tool call of kind `execute`: touch x"
        );
    }

    #[test]
    fn a_call_without_a_kind_is_named_by_what_its_input_would_do() {
        for (kind, input, tool) in [
            (None, json!({"command": "touch x"}), "shell"),
            (Some("other"), json!({"cmd": ["rm", "-rf", "x"]}), "shell"),
            (
                None,
                json!({"file_path": "a.rs", "old_string": "a", "new_string": "b"}),
                "apply_patch",
            ),
            (None, json!({"path": "a.rs", "content": "x"}), "apply_patch"),
            (None, json!({"patch": "*** Begin Patch"}), "apply_patch"),
            (None, json!({"url": "http://127.0.0.1/"}), "web_fetch"),
            (None, json!({"query": "x"}), "acp__other"),
            // A kind the agent gave stands, whatever the input.
            (Some("read"), json!({"command": "cat x"}), "acp__read"),
        ] {
            assert_eq!(tool_of(kind, Some(&input)), tool, "{kind:?} {input}");
        }
        assert_eq!(tool_of(None, None), "acp__other");
        // A denied shell is refused when the request leaves the kind out.
        let call = GovernedCall::of(&request(None, Some(json!({"command": "touch x"}))));
        assert_eq!(call.tool, "shell");
        assert!(matches!(
            permission_verdict(&policy(&["shell"], &[]), &call),
            PermissionVerdict::Refuse(_)
        ));
    }

    #[test]
    fn a_call_that_ran_outside_troupes_word_is_ungoverned() {
        let policy = policy(&["shell"], &["web_fetch"]);
        let run = |kind: Option<&str>, input: Option<Value>, status: Option<&str>, asked| {
            ungoverned(&policy, (kind, input.as_ref()), status, asked)
        };
        let denied = run(Some("execute"), None, Some("in_progress"), Asked::Never).unwrap();
        assert!(denied.contains("`shell`"), "{denied}");
        assert!(run(Some("execute"), None, Some("completed"), Asked::Never).is_some());
        assert!(run(Some("execute"), None, Some("completed"), Asked::Pending).is_some());
        assert!(run(Some("execute"), None, Some("completed"), Asked::Allowed).is_none());
        assert!(run(Some("execute"), None, Some("pending"), Asked::Never).is_none());
        assert!(run(Some("execute"), None, Some("failed"), Asked::Never).is_none());
        assert!(run(Some("execute"), None, None, Asked::Never).is_none());
        assert!(run(Some("read"), None, Some("completed"), Asked::Never).is_none());
        // Refused, then run anyway: whatever the policy says of the tool.
        let refused = run(Some("read"), None, Some("completed"), Asked::Refused).unwrap();
        assert!(refused.contains("was refused"), "{refused}");
        // A tool that needs a token, run without asking: no token was used.
        let unpaid = run(Some("fetch"), None, Some("completed"), Asked::Never).unwrap();
        assert!(unpaid.contains("authorization token"), "{unpaid}");
        assert!(run(Some("fetch"), None, Some("completed"), Asked::Allowed).is_none());
        // The kind left out: the input says what ran.
        let inferred = run(
            None,
            Some(json!({"command": ["rm", "x"]})),
            Some("completed"),
            Asked::Never,
        );
        assert!(inferred.is_some_and(|m| m.contains("`shell`")));
    }
}
