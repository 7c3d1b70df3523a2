//! Authorization tokens (A5): whether a token covers a call, pure; the secret's shape.
//!
//! A person issues a token for one agent (or `*`) and one tool pattern, optionally only for
//! calls whose arguments match a pattern, with a TTL and a number of uses. The secret is
//! shown once; what is kept is its SHA-256 ([`super::token_digest`]). A message presents
//! secrets; a call of a tool that needs a token consumes one use of the first presented token
//! that covers it, counted by the [`TokenBook`](crate::token_book).

use super::policy::{glob, glob_command, normalize};
use troupe_proto::ToolCall;
use troupe_proto::governance::{AuthToken, TokenRefusal};

/// The call a token must cover.
#[derive(Debug, Clone, Copy)]
pub struct CallScope<'a> {
    /// The agent whose task calls (`None`: the session's own conversation).
    pub agent: Option<&'a str>,
    pub tool: &'a str,
    /// [`args_text`] of the call.
    pub args: &'a str,
}

/// Whether `token` may authorize `call` at `now_ms`; the refusal when not.
pub fn check(token: &AuthToken, call: &CallScope<'_>, now_ms: u64) -> Result<(), TokenRefusal> {
    if token.revoked_ms.is_some() {
        return Err(TokenRefusal::Revoked);
    }
    if now_ms >= token.expires_ms {
        return Err(TokenRefusal::Expired);
    }
    if token.uses >= token.max_uses {
        return Err(TokenRefusal::Exhausted);
    }
    let scope = &token.scope;
    let agent = scope.agent == "*" || call.agent == Some(scope.agent.as_str());
    let tool = glob(&normalize(&scope.tool), call.tool);
    // A command line's pattern covers that command, not one chained to it (an agent's
    // `bash -lc` script is run by a shell).
    let args = scope.args.as_deref().is_none_or(|p| {
        if call.tool == crate::tools::SHELL {
            glob_command(p, call.args)
        } else {
            glob(p, call.args)
        }
    });
    if agent && tool && args {
        Ok(())
    } else {
        Err(TokenRefusal::OutOfScope)
    }
}

/// The text an argument pattern is matched against: a shell call's command line (its argv
/// joined by spaces), any other call's arguments as compact JSON.
pub fn args_text(call: &ToolCall) -> String {
    if call.name == crate::tools::SHELL
        && let Some(argv) = call.arguments.0.get("command").and_then(|c| c.as_array())
    {
        return argv
            .iter()
            .map(|a| a.as_str().map_or_else(|| a.to_string(), str::to_owned))
            .collect::<Vec<_>>()
            .join(" ");
    }
    call.arguments.0.to_string()
}

/// Of the refusals of every presented token, the one worth telling: a token that covered the
/// call but is spent, expired or revoked says more than one for something else.
pub fn most_telling(refusals: &[TokenRefusal]) -> TokenRefusal {
    const ORDER: [TokenRefusal; 6] = [
        TokenRefusal::Exhausted,
        TokenRefusal::Expired,
        TokenRefusal::Revoked,
        TokenRefusal::OutOfScope,
        TokenRefusal::Unknown,
        TokenRefusal::Unavailable,
    ];
    ORDER
        .into_iter()
        .find(|r| refusals.contains(r))
        .unwrap_or(TokenRefusal::Missing)
}

/// A new secret: `tat_` and 244 random bits in hex.
pub fn new_secret() -> String {
    format!(
        "tat_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::Json;
    use troupe_proto::governance::TokenScope;

    fn token(agent: &str, tool: &str, args: Option<&str>) -> AuthToken {
        AuthToken {
            id: "t".into(),
            digest: "d".into(),
            scope: TokenScope {
                agent: agent.into(),
                tool: tool.into(),
                args: args.map(str::to_owned),
            },
            issued_by: "ann".into(),
            issued_ms: 0,
            expires_ms: 1_000,
            max_uses: 2,
            uses: 0,
            revoked_ms: None,
        }
    }

    fn call<'a>(agent: Option<&'a str>, tool: &'a str, args: &'a str) -> CallScope<'a> {
        CallScope { agent, tool, args }
    }

    #[test]
    fn a_command_pattern_covers_that_command_and_none_chained_to_it() {
        let t = token("*", "shell", Some("git status*"));
        let covers = |line: &str| check(&t, &call(None, "shell", line), 0).is_ok();
        assert!(covers("git status"));
        assert!(covers("git status -s --porcelain"));
        for escape in [
            "git status; rm -rf ~",
            "git status && rm -rf ~",
            "git status || rm -rf ~",
            "git status | sh",
            "git status & rm -rf ~",
            "git status\nrm -rf ~",
            "git status `rm -rf ~`",
            "git status $(rm -rf ~)",
            "git status > ~/.bashrc",
        ] {
            assert!(!covers(escape), "{escape:?}");
        }
        // Written in the pattern, a chain is covered as written.
        let chained = token("*", "shell", Some("make && make install*"));
        assert!(
            check(
                &chained,
                &call(None, "shell", "make && make install -j4"),
                0
            )
            .is_ok()
        );
        assert!(
            check(
                &chained,
                &call(None, "shell", "make && make install; rm x"),
                0
            )
            .is_err()
        );
        // Other tools' arguments (JSON) are matched as before.
        let json = token("*", "files__write", Some("*\"path\":\"a;b\"*"));
        assert!(check(&json, &call(None, "files__write", r#"{"path":"a;b"}"#), 0).is_ok());
    }

    #[test]
    fn a_token_covers_its_agent_tool_and_arguments_while_valid() {
        let t = token("coder", "shell", Some("git status*"));
        assert_eq!(
            check(&t, &call(Some("coder"), "shell", "git status -s"), 10),
            Ok(())
        );
        let out = Err(TokenRefusal::OutOfScope);
        assert_eq!(
            check(&t, &call(Some("coder"), "shell", "git push"), 10),
            out
        );
        assert_eq!(
            check(&t, &call(Some("other"), "shell", "git status"), 10),
            out
        );
        assert_eq!(check(&t, &call(None, "shell", "git status"), 10), out);
        assert_eq!(
            check(&t, &call(Some("coder"), "apply_patch", "git status"), 10),
            out
        );
        let any = token("*", "files.*", None);
        assert_eq!(check(&any, &call(None, "files__write", "{}"), 10), Ok(()));
        assert_eq!(
            check(&t, &call(Some("coder"), "shell", "git status"), 1_000),
            Err(TokenRefusal::Expired)
        );
        let spent = AuthToken {
            uses: 2,
            ..t.clone()
        };
        assert_eq!(
            check(&spent, &call(Some("coder"), "shell", "git status"), 10),
            Err(TokenRefusal::Exhausted)
        );
        let revoked = AuthToken {
            revoked_ms: Some(5),
            ..t
        };
        assert_eq!(
            check(&revoked, &call(Some("coder"), "shell", "git status"), 10),
            Err(TokenRefusal::Revoked)
        );
    }

    #[test]
    fn a_shell_calls_arguments_are_its_command_line() {
        let c = ToolCall {
            call_id: "c".into(),
            name: "shell".into(),
            arguments: Json(serde_json::json!({"command": ["git", "status", "-s"]})),
        };
        assert_eq!(args_text(&c), "git status -s");
        let other = ToolCall {
            name: "files__read".into(),
            arguments: Json(serde_json::json!({"path": "a"})),
            ..c
        };
        assert_eq!(args_text(&other), r#"{"path":"a"}"#);
    }

    #[test]
    fn the_most_telling_refusal_is_reported_and_secrets_differ() {
        use TokenRefusal::*;
        assert_eq!(most_telling(&[Unknown, Exhausted, OutOfScope]), Exhausted);
        assert_eq!(most_telling(&[Unknown, OutOfScope]), OutOfScope);
        assert_eq!(most_telling(&[]), Missing);
        let (a, b) = (new_secret(), new_secret());
        assert_ne!(a, b);
        assert!(a.starts_with("tat_") && a.len() == 68, "{a}");
    }
}
