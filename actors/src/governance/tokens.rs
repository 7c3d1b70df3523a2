//! Authorization tokens (A5): whether a token covers a call, pure; the secret's shape.
//!
//! A person issues a token for one agent (or `*`) and one tool pattern, optionally only for
//! calls whose arguments match patterns (a shell call's command line; named arguments, each
//! matched on its own), with a TTL and a number of uses. The secret is
//! shown once; what is kept is its SHA-256 ([`super::token_digest`]). A message presents
//! secrets; a call of a tool that needs a token consumes one use of the first presented token
//! that covers it, counted by the [`TokenBook`](crate::token_book).

use super::policy::{glob, glob_command, normalize};
use serde_json::Value;
use std::collections::BTreeMap;
use troupe_proto::ToolCall;
use troupe_proto::governance::{AuthToken, TokenRefusal, TokenScope};

/// The call a token must cover.
#[derive(Debug, Clone, Copy)]
pub struct CallScope<'a> {
    /// The agent whose task calls (`None`: the session's own conversation).
    pub agent: Option<&'a str>,
    pub tool: &'a str,
    /// The command line of a shell call ([`shell_command_line`]), which a token's `args`
    /// pattern is matched against; `None` for another tool, or when the command cannot be
    /// read (then no token with an `args` pattern covers the call).
    pub command: Option<&'a str>,
    /// The call's arguments, whose top-level fields a token's `fields` patterns name.
    pub arguments: &'a Value,
}

/// Most field patterns a token may have.
pub const MAX_FIELDS: usize = 32;

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
    if !(agent && tool) {
        return Err(TokenRefusal::OutOfScope);
    }
    // A pattern over another tool's whole arguments (what tokens once had): neither read as
    // a command line nor dropped, which would widen the token.
    if scope.args.is_some() && !is_shell(&scope.tool) {
        return Err(TokenRefusal::Obsolete);
    }
    // A command line's pattern covers that command, not one chained to it (an agent's
    // `bash -lc` script is run by a shell).
    let command = scope
        .args
        .as_deref()
        .is_none_or(|p| call.command.is_some_and(|line| glob_command(p, line)));
    let fields = covers_fields(&scope.fields, call.arguments);
    if command && fields {
        Ok(())
    } else {
        Err(TokenRefusal::OutOfScope)
    }
}

/// Whether a tool pattern names the shell tool alone.
fn is_shell(tool: &str) -> bool {
    normalize(tool) == crate::tools::SHELL
}

/// Whether every field pattern covers its field of `arguments`: the field is there (the
/// arguments are an object) and its value matches ([`covers_value`]).
pub fn covers_fields(fields: &BTreeMap<String, String>, arguments: &Value) -> bool {
    fields.iter().all(|(name, pattern)| {
        arguments
            .as_object()
            .and_then(|object| object.get(name))
            .is_some_and(|value| covers_value(pattern, value))
    })
}

/// Whether a field pattern covers one argument's value: a string as it is, any other value
/// as compact JSON, matched by [`glob`]. A `*` takes no `..` segment of a path: a value
/// with more `..` segments (between `/` or `\`) than the pattern writes is not covered, so
/// `notes/*` covers `notes/a.md` but not `notes/../.bashrc`.
pub fn covers_value(pattern: &str, value: &Value) -> bool {
    let text = match value {
        Value::String(s) => std::borrow::Cow::Borrowed(s.as_str()),
        other => std::borrow::Cow::Owned(other.to_string()),
    };
    let parents = |t: &str| t.split(['/', '\\']).filter(|s| *s == "..").count();
    parents(&text) <= parents(pattern) && glob(pattern, &text)
}

/// Whether a token may be issued with `scope`'s argument patterns; what is wrong if not. A
/// command-line pattern (`args`) scopes the shell tool alone: another tool's arguments are
/// scoped field by field, never by one pattern over their JSON, whose `*` could take their
/// quotes and braces (and whose keys and their order the model chooses).
pub fn validate_arguments(scope: &TokenScope) -> Result<(), String> {
    if scope.args.is_some() && !is_shell(&scope.tool) {
        return Err(format!(
            "an arguments pattern (`args`) is a command line, for tool `shell` only; scope the arguments of `{}` by name instead: `fields` (`--field NAME=PATTERN`, e.g. `path=notes/*`)",
            scope.tool
        ));
    }
    if scope.fields.len() > MAX_FIELDS {
        return Err(format!("at most {MAX_FIELDS} field patterns"));
    }
    for name in scope.fields.keys() {
        if name.is_empty() || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(format!(
                "`{}` is not an argument's name (no spaces, not empty)",
                name.escape_debug()
            ));
        }
        if is_shell(&scope.tool) && name == "command" {
            return Err(
                "a shell call's `command` is scoped by its command line: `args` (`--args 'git status*'`)"
                    .to_owned(),
            );
        }
    }
    Ok(())
}

/// Reads `NAME=PATTERN` (a field pattern as `--field` writes it) into `fields`; a name given
/// twice, or no `=`, is an error.
pub fn parse_field(fields: &mut BTreeMap<String, String>, text: &str) -> Result<(), String> {
    let Some((name, pattern)) = text.split_once('=') else {
        return Err(format!(
            "`{text}` is not NAME=PATTERN (an argument's name and the pattern its value must match)"
        ));
    };
    let name = name.trim();
    if fields.contains_key(name) {
        return Err(format!("argument `{name}` has two patterns"));
    }
    fields.insert(name.to_owned(), pattern.to_owned());
    Ok(())
}

/// The command line a token's `args` pattern is matched against, for a call of the shell
/// tool: its argv read by [`command_line`] (`None`: another tool, or a command that is not
/// an array of strings).
pub fn shell_command_line(call: &ToolCall) -> Option<String> {
    if call.name != crate::tools::SHELL {
        return None;
    }
    let argv = call.arguments.0.get("command")?.as_array()?;
    let words: Option<Vec<String>> = argv.iter().map(|w| w.as_str().map(str::to_owned)).collect();
    Some(command_line(&words?))
}

/// The shells whose `-c` runs its argument as a script.
const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh", "mksh", "ash"];

/// A command's line as token patterns read it, the same for troupe's shell tool and an ACP
/// agent's command: the script of `sh -c` / `bash -lc` (what is meant to run: `["bash",
/// "-lc", "git status"]` is `git status`), else the words joined by spaces. Only a known
/// shell with a flag cluster of single letters that holds `c` (`-c`, `-lc`, `-ec`) runs its
/// argument as a script: `ssh -c ...` or `bash --norc file` do not (`bash --norc FILE` runs
/// a file of that name).
pub fn command_line(argv: &[String]) -> String {
    let runs_script = |shell: &str, flag: &str| {
        let name = shell.rsplit('/').next().unwrap_or(shell);
        let letters = flag.strip_prefix('-').unwrap_or("");
        SHELLS.contains(&name)
            && !letters.is_empty()
            && letters.chars().all(|c| c.is_ascii_alphabetic())
            && letters.contains('c')
    };
    match argv {
        [shell, flag, script] if runs_script(shell, flag) => script.clone(),
        _ => argv.join(" "),
    }
}

/// Why a call of `tool` that needs a token (the `layer` requires one) did not get one, as
/// the refusal says it: with the command line the token patterns were matched against, when
/// none covered it.
pub fn refusal_message(
    tool: &str,
    layer: troupe_proto::governance::PolicyLayer,
    refusal: TokenRefusal,
    command: Option<&str>,
) -> String {
    let why = format!(
        "tool `{tool}` needs an authorization token (the {layer} layer requires one): {}",
        refusal.explain()
    );
    match command {
        Some(line) if refusal == TokenRefusal::OutOfScope => {
            format!("{why} (the command line matched: {line:?})")
        }
        _ => why,
    }
}

/// Of the refusals of every presented token, the one worth telling: a token that covered the
/// call but is spent, expired or revoked says more than one for something else.
pub fn most_telling(refusals: &[TokenRefusal]) -> TokenRefusal {
    const ORDER: [TokenRefusal; 7] = [
        TokenRefusal::Exhausted,
        TokenRefusal::Expired,
        TokenRefusal::Revoked,
        TokenRefusal::Obsolete,
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
    use serde_json::json;
    use troupe_proto::Json;

    fn token(agent: &str, tool: &str, args: Option<&str>) -> AuthToken {
        AuthToken {
            id: "t".into(),
            digest: "d".into(),
            scope: TokenScope {
                agent: agent.into(),
                tool: tool.into(),
                args: args.map(str::to_owned),
                fields: BTreeMap::new(),
            },
            issued_by: "ann".into(),
            issued_ms: 0,
            expires_ms: 1_000,
            max_uses: 2,
            uses: 0,
            revoked_ms: None,
        }
    }

    fn with_fields(tool: &str, fields: &[(&str, &str)]) -> AuthToken {
        let mut t = token("*", tool, None);
        t.scope.fields = fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        t
    }

    const NO_ARGS: &Value = &Value::Null;

    fn call<'a>(agent: Option<&'a str>, tool: &'a str, line: &'a str) -> CallScope<'a> {
        CallScope {
            agent,
            tool,
            command: Some(line),
            arguments: NO_ARGS,
        }
    }

    fn call_with<'a>(tool: &'a str, arguments: &'a Value) -> CallScope<'a> {
        CallScope {
            agent: None,
            tool,
            command: None,
            arguments,
        }
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
        // A command that cannot be read is covered by no command pattern.
        let unread = CallScope {
            command: None,
            ..call(None, "shell", "")
        };
        assert_eq!(check(&t, &unread, 0), Err(TokenRefusal::OutOfScope));
        assert_eq!(check(&token("*", "shell", None), &unread, 0), Ok(()));
    }

    #[test]
    fn a_field_pattern_covers_only_its_own_fields_value() {
        let t = with_fields("files__write", &[("path", "notes/*")]);
        let covers = |args: Value| check(&t, &call_with("files__write", &args), 0);
        assert_eq!(
            covers(json!({"path": "notes/a.md", "content": "x"})),
            Ok(())
        );
        let out = Err(TokenRefusal::OutOfScope);
        // The review's escape: the right text elsewhere in the JSON covers nothing.
        assert_eq!(
            covers(json!({"path": "/home/u/.bashrc", "x": {"path": "notes/"}})),
            out
        );
        assert_eq!(covers(json!({"x": "\"path\":\"notes/a"})), out);
        assert_eq!(covers(json!({"content": "x"})), out, "the field is missing");
        assert_eq!(covers(json!("notes/a")), out, "not an object");
        assert_eq!(covers(Value::Null), out);
        // A `*` takes no `..` segment; a pattern that writes one covers as many.
        assert_eq!(covers(json!({"path": "notes/../.bashrc"})), out);
        assert_eq!(covers(json!({"path": "notes/a/..\\..\\x"})), out);
        assert_eq!(covers(json!({"path": "notes/a..b"})), Ok(()));
        let up = with_fields("files__write", &[("path", "../shared/*")]);
        assert!(
            check(
                &up,
                &call_with("files__write", &json!({"path": "../shared/a"})),
                0
            )
            .is_ok()
        );
        assert!(
            check(
                &up,
                &call_with("files__write", &json!({"path": "../shared/../../x"})),
                0
            )
            .is_err()
        );
        // Every named field must match; a value that is not a string is matched as JSON.
        let two = with_fields("db__query", &[("db", "main"), ("limit", "1*")]);
        let covers = |args: Value| check(&two, &call_with("db__query", &args), 0).is_ok();
        assert!(covers(
            json!({"db": "main", "limit": 10, "sql": "select 1"})
        ));
        assert!(!covers(json!({"db": "main", "limit": 5})));
        assert!(!covers(json!({"db": "other", "limit": 10})));
        assert!(!covers(json!({"limit": 10})));
        // A shell token may scope fields besides its command line.
        let mut shell = token("*", "shell", Some("make*"));
        shell.scope.fields = BTreeMap::from([("workdir".to_owned(), "/repo*".to_owned())]);
        let args = json!({"command": ["make"], "workdir": "/repo/a"});
        let covered = CallScope {
            command: Some("make"),
            ..call_with("shell", &args)
        };
        assert_eq!(check(&shell, &covered, 0), Ok(()));
        let elsewhere = json!({"command": ["make"], "workdir": "/tmp"});
        let not = CallScope {
            command: Some("make"),
            ..call_with("shell", &elsewhere)
        };
        assert_eq!(check(&shell, &not, 0), Err(TokenRefusal::OutOfScope));
    }

    #[test]
    fn a_pattern_over_another_tools_whole_arguments_is_refused() {
        // As issued: the form cannot be a scope.
        let scope = |tool: &str, args: Option<&str>| token("*", tool, args).scope;
        let why =
            validate_arguments(&scope("files__write", Some("*\"path\":\"notes/*"))).unwrap_err();
        assert!(why.contains("--field"), "{why}");
        assert!(validate_arguments(&scope("*", Some("git status*"))).is_err());
        assert!(validate_arguments(&scope("shell", Some("git status*"))).is_ok());
        assert!(validate_arguments(&scope("shell.exec", Some("git status*"))).is_ok());
        assert!(validate_arguments(&with_fields("files__*", &[("path", "notes/*")]).scope).is_ok());
        for bad in ["", "a b", "a\nb"] {
            assert!(
                validate_arguments(&with_fields("x", &[(bad, "p")]).scope).is_err(),
                "{bad:?}"
            );
        }
        assert!(validate_arguments(&with_fields("shell", &[("command", "*")]).scope).is_err());
        // As stored before: refused for what it is, never read as any arguments.
        let old = token("*", "files__write", Some("*\"path\":\"notes/*"));
        let args = json!({"path": "notes/a"});
        assert_eq!(
            check(&old, &call_with("files__write", &args), 0),
            Err(TokenRefusal::Obsolete)
        );
        assert_eq!(
            check(&old, &call_with("other", &args), 0),
            Err(TokenRefusal::OutOfScope)
        );
        let any = token("*", "*", Some("git status*"));
        assert_eq!(
            check(&any, &call(None, "shell", "git status"), 0),
            Err(TokenRefusal::Obsolete)
        );
    }

    #[test]
    fn field_patterns_are_read_as_name_equals_pattern() {
        let mut fields = BTreeMap::new();
        parse_field(&mut fields, "path=notes/*").unwrap();
        parse_field(&mut fields, "q=a=b").unwrap();
        assert_eq!(fields["path"], "notes/*");
        assert_eq!(fields["q"], "a=b");
        assert!(parse_field(&mut fields, "path=x").is_err());
        assert!(parse_field(&mut fields, "no-equals").is_err());
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
        assert_eq!(
            check(&any, &call_with("files__write", &json!({})), 10),
            Ok(())
        );
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
    fn only_a_shells_dash_c_is_read_as_a_script() {
        let line =
            |argv: &[&str]| command_line(&argv.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(line(&["bash", "-lc", "git status"]), "git status");
        assert_eq!(line(&["/bin/sh", "-c", "ls"]), "ls");
        assert_eq!(line(&["zsh", "-ec", "make"]), "make");
        // Not a script: `--norc FILE` runs a file; ssh's `-c` names a cipher.
        assert_eq!(
            line(&["bash", "--norc", "git status"]),
            "bash --norc git status"
        );
        assert_eq!(line(&["ssh", "-c", "aes128-ctr"]), "ssh -c aes128-ctr");
        assert_eq!(line(&["bash", "-l", "script.sh"]), "bash -l script.sh");
        assert_eq!(line(&["git", "status"]), "git status");
        assert_eq!(
            line(&["bash", "-c", "git status", "extra"]),
            "bash -c git status extra"
        );
    }

    #[test]
    fn a_shell_calls_command_line_is_read_as_a_shell_runs_it() {
        let c = ToolCall {
            call_id: "c".into(),
            name: "shell".into(),
            arguments: Json(json!({"command": ["git", "status", "-s"]})),
        };
        assert_eq!(shell_command_line(&c).as_deref(), Some("git status -s"));
        // The script a shell runs is what a `git status*` token covers, and only as a
        // command pattern covers a line: nothing chained to it.
        let t = token("*", "shell", Some("git status*"));
        for (argv, covered) in [
            (json!(["bash", "-lc", "git status"]), true),
            (json!(["/bin/sh", "-c", "git status -s"]), true),
            (json!(["bash", "-lc", "git status; rm -rf ~"]), false),
            (json!(["bash", "-lc", "git push"]), false),
        ] {
            let call = ToolCall {
                arguments: Json(json!({ "command": argv })),
                ..c.clone()
            };
            let line = shell_command_line(&call).unwrap();
            let scope = CallScope {
                agent: None,
                tool: "shell",
                command: Some(&line),
                arguments: &call.arguments.0,
            };
            assert_eq!(check(&t, &scope, 0).is_ok(), covered, "{argv}");
        }
        let malformed = ToolCall {
            arguments: Json(json!({"command": "git status"})),
            ..c.clone()
        };
        assert_eq!(shell_command_line(&malformed), None);
        let other = ToolCall {
            name: "files__read".into(),
            ..c
        };
        assert_eq!(shell_command_line(&other), None);
    }

    #[test]
    fn a_refusal_for_want_of_scope_names_the_command_line_it_matched() {
        use troupe_proto::governance::PolicyLayer;
        let out = refusal_message(
            "shell",
            PolicyLayer::Agent,
            TokenRefusal::OutOfScope,
            Some("git push"),
        );
        assert_eq!(
            out,
            "tool `shell` needs an authorization token (the agent layer requires one): no token presented covers this agent, tool and arguments (the command line matched: \"git push\")"
        );
        let missing = refusal_message(
            "shell",
            PolicyLayer::Agent,
            TokenRefusal::Missing,
            Some("git push"),
        );
        assert!(!missing.contains("git push"), "{missing}");
        let other = refusal_message("x", PolicyLayer::Global, TokenRefusal::OutOfScope, None);
        assert!(other.ends_with("tool and arguments"), "{other}");
    }

    #[test]
    fn the_most_telling_refusal_is_reported_and_secrets_differ() {
        use TokenRefusal::*;
        assert_eq!(most_telling(&[Unknown, Exhausted, OutOfScope]), Exhausted);
        assert_eq!(most_telling(&[Unknown, OutOfScope]), OutOfScope);
        assert_eq!(most_telling(&[OutOfScope, Obsolete]), Obsolete);
        assert_eq!(most_telling(&[]), Missing);
        let (a, b) = (new_secret(), new_secret());
        assert_ne!(a, b);
        assert!(a.starts_with("tat_") && a.len() == 68, "{a}");
    }
}
