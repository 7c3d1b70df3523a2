//! The capability registry as the model sees it (A6): progressive disclosure within a
//! context budget, and a capability's command turned into an argv. All pure: the task
//! ([`crate::task`]) asks these functions, then runs what they decided.
//!
//! - The prompt carries one line per capability the tool policy lets the task use
//!   (`id: description`), within the budget's `prompt_tokens`; what does not fit is
//!   counted on a last `+N more` line.
//! - `capability_inspect {id, level}` answers level 1 (the description and the command
//!   list), 2 (`README.md`) or 3 (`cli.md` and the probe's output), each bounded by
//!   its `inspect_tokens` with a visible truncation marker; without an id it
//!   lists every capability.
//! - `capability_run {id, command, args}` fills the command's argv template with the
//!   model's arguments; the task runs it as it runs the shell tool (sandbox, approval).
//!
//! A capability is governed under its qualified name `capability__<id>`: a `[tools]`
//! blacklist entry `capability__git` (or `capability__*`) hides it from the prompt and
//! refuses both tools for it with `policy_rejected`.

pub mod metrics;

use crate::governance::ToolPolicy;
use serde_json::{Value, json};
use troupe_proto::capability::{Capability, CapabilityCatalog};
use troupe_proto::{Json, ToolSpec};

pub const INSPECT: &str = "capability_inspect";
pub const RUN: &str = "capability_run";
/// The prefix of a capability's qualified name, which tool policies match.
pub const PREFIX: &str = "capability__";

/// The name the tool policy knows capability `id` by.
pub fn qualified(id: &str) -> String {
    format!("{PREFIX}{id}")
}

/// Whether `name` is one of the registry's two tools.
pub fn is_capability_tool(name: &str) -> bool {
    name == INSPECT || name == RUN
}

/// The capability a call of one of the registry's tools is about (`None`: another tool,
/// or no id given).
pub fn called_id(name: &str, args: &Value) -> Option<String> {
    if !is_capability_tool(name) {
        return None;
    }
    args.get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
}

/// The one name a call is governed by, so that the policy decides it once (one decision
/// counted, one token use at most): for a call of the registry's tools about a capability,
/// the stricter of the tool's own name and the capability's qualified name (denied over
/// needing a token over allowed; on a tie the qualified name, which tokens name); any other
/// call, its own name.
pub fn governed_name(policy: &ToolPolicy, name: &str, args: &Value) -> String {
    let Some(id) = called_id(name, args) else {
        return name.to_owned();
    };
    crate::governance::stricter_name(policy, name, qualified(&id))
}

/// The capabilities `policy` lets a task use, by id.
pub fn visible<'a>(catalog: &'a CapabilityCatalog, policy: &ToolPolicy) -> Vec<&'a Capability> {
    catalog
        .capabilities
        .values()
        .filter(|c| policy.decide(&qualified(&c.module.id)).is_allowed())
        .collect()
}

/// The prompt's section: a header, one `- id: description` line per capability in id
/// order, as many as fit in `budget` tokens (by `count`), then `+N more` for the rest.
/// `None` when there is nothing to show.
pub fn summary(
    capabilities: &[&Capability],
    budget: usize,
    count: &dyn Fn(&str) -> usize,
) -> Option<String> {
    if capabilities.is_empty() {
        return None;
    }
    let mut text = format!(
        "Capabilities (programs you can run with `{RUN}`; `{INSPECT}` with an id and a level \
         1-3 tells how):\n"
    );
    for (shown, capability) in capabilities.iter().enumerate() {
        let line = format!(
            "- {}: {}\n",
            capability.module.id,
            one_line(&capability.module.description)
        );
        let left = capabilities.len() - shown - 1;
        let tail = if left > 0 {
            more_line(left)
        } else {
            String::new()
        };
        if count(&format!("{text}{line}{tail}")) > budget {
            text.push_str(&more_line(capabilities.len() - shown));
            return Some(text);
        }
        text.push_str(&line);
    }
    Some(text)
}

fn more_line(n: usize) -> String {
    format!("+{n} more, use {INSPECT} without an id to list them all\n")
}

fn one_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default().trim()
}

/// What `capability_inspect` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InspectRequest {
    /// No id: every capability the task may use, one line each.
    List,
    /// One capability at a level of detail.
    One { id: String, level: Level },
}

/// How much of a capability `capability_inspect` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The description and the commands.
    Summary = 1,
    /// `README.md`.
    Usage = 2,
    /// `cli.md` and the probe's output.
    Full = 3,
}

impl Level {
    pub const ALL: [Self; 3] = [Self::Summary, Self::Usage, Self::Full];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Summary => "summary",
            Self::Usage => "usage",
            Self::Full => "full",
        }
    }
}

/// Reads a `capability_inspect` call's arguments (`level` defaults to 1).
pub fn inspect_request(args: &Value) -> Result<InspectRequest, String> {
    let id = args.get("id").and_then(Value::as_str).unwrap_or_default();
    if id.is_empty() {
        return Ok(InspectRequest::List);
    }
    let level = match args.get("level") {
        None | Some(Value::Null) => Level::Summary,
        Some(level) => match level.as_u64() {
            Some(1) => Level::Summary,
            Some(2) => Level::Usage,
            Some(3) => Level::Full,
            _ => return Err(format!("`level` must be 1, 2 or 3, not {level}")),
        },
    };
    Ok(InspectRequest::One {
        id: id.to_owned(),
        level,
    })
}

/// The answer to `capability_inspect` on no id: every visible capability, one line each,
/// bounded by `budget`.
pub fn list(capabilities: &[&Capability], budget: usize, count: &dyn Fn(&str) -> usize) -> String {
    let mut text = String::new();
    for capability in capabilities {
        text.push_str(&format!(
            "- {}: {}\n",
            capability.module.id,
            one_line(&capability.module.description)
        ));
    }
    if text.is_empty() {
        text.push_str("No capabilities are available.\n");
    }
    bounded(&text, budget, count)
}

/// The answer to `capability_inspect` on one capability at `level`, bounded by `budget`.
/// `probe` is the probe's output for level 3 (what its run gave, or why it could not run).
pub fn inspect(
    capability: &Capability,
    level: Level,
    probe: Option<&str>,
    budget: usize,
    count: &dyn Fn(&str) -> usize,
) -> String {
    let module = &capability.module;
    let text = match level {
        Level::Summary => {
            let mut text = format!("{}: {}\n\nCommands", module.id, module.description.trim());
            text.push_str(&format!(
                " (run with {RUN} {{\"id\": \"{}\", \"command\": <name>, \"args\": {{...}}}}):\n",
                module.id
            ));
            for command in &module.commands {
                text.push_str(&format!(
                    "- {}: {} (argv: {}",
                    command.name,
                    one_line(&command.description),
                    command.argv.join(" ")
                ));
                for (key, allowed) in &command.choices {
                    text.push_str(&format!("; {key}: one of {}", allowed.join(", ")));
                }
                text.push_str(")\n");
            }
            text.push_str(&format!(
                "\nLevel 2 is its README.md (usage), level 3 its cli.md (full detail) and the output of `{}`.\n",
                module.probe.join(" ")
            ));
            text
        }
        Level::Usage => capability.readme.clone(),
        Level::Full => {
            let mut text = capability.cli.clone();
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!(
                "\n$ {}\n{}",
                module.probe.join(" "),
                probe.unwrap_or("(not run)")
            ));
            text
        }
    };
    bounded(&text, budget, count)
}

/// `text` if it fits in `budget` tokens, else its longest start (cut at a character) that
/// fits with a marker saying what was left out.
pub fn bounded(text: &str, budget: usize, count: &dyn Fn(&str) -> usize) -> String {
    if count(text) <= budget {
        return text.to_owned();
    }
    let total = text.len();
    let marker = |kept: usize| {
        format!(
            "\n[truncated: {} of {total} bytes shown, the context budget is {budget} tokens]",
            kept
        )
    };
    // The longest prefix (at a character boundary) whose text and marker fit.
    let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let fits = |at: usize| count(&format!("{}{}", &text[..at], marker(at))) <= budget;
    let (mut lo, mut hi) = (0usize, bounds.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if bounds.get(mid).copied().is_some_and(fits) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let kept = bounds.get(lo).copied().unwrap_or(0);
    format!("{}{}", &text[..kept], marker(kept))
}

/// A `capability_run` call, read: the capability, its command, and the argv to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPlan {
    pub id: String,
    pub command: String,
    pub argv: Vec<String>,
    pub timeout_ms: Option<u64>,
}

/// The argv of `capability_run {id, command, args}` on `capability`: each `{name}` of the
/// command's template is replaced by `args.name` (a string, a number or a boolean; a list
/// of strings when the element is exactly `{name}`, which then stands for several). A
/// missing or unknown argument is an error naming it.
///
/// A value starting with `-` would be read by the program as an option (`rg --pre=sh`,
/// `git diff --output=FILE`): it is refused unless its placeholder is listed in the
/// command's `options` or its element comes after a literal `--` element of the template.
/// A placeholder with `choices` takes only the values listed there (whatever they start
/// with).
pub fn run_plan(capability: &Capability, args: &Value) -> Result<RunPlan, String> {
    let module = &capability.module;
    let name = args.get("command").and_then(Value::as_str).ok_or_else(|| {
        format!(
            "{RUN} needs `command`: the name of one of `{}`'s commands",
            module.id
        )
    })?;
    let command = module
        .commands
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| {
            let names: Vec<&str> = module.commands.iter().map(|c| c.name.as_str()).collect();
            format!(
                "capability `{}` has no command `{name}` (it has: {})",
                module.id,
                names.join(", ")
            )
        })?;
    let given = match args.get("args") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(other) => return Err(format!("`args` must be an object, not {other}")),
    };
    let wanted = placeholders(&command.argv);
    if let Some(unknown) = given.keys().find(|k| !wanted.contains(k)) {
        return Err(format!(
            "command `{name}` of `{}` takes no argument `{unknown}` (it takes: {})",
            module.id,
            if wanted.is_empty() {
                "none".to_owned()
            } else {
                wanted.join(", ")
            }
        ));
    }
    let mut argv = Vec::with_capacity(command.argv.len());
    let mut after_dashes = false;
    for element in &command.argv {
        if element == "--" {
            after_dashes = true;
        }
        let value_of = |key: &str, value: &Value| {
            let text = scalar(key, value)?;
            if let Some(allowed) = command.choices.get(key) {
                if allowed.contains(&text) {
                    return Ok(text);
                }
                return Err(format!(
                    "argument `{key}` of command `{}` of `{}` must be one of: {} (not `{text}`)",
                    command.name,
                    module.id,
                    allowed.join(", ")
                ));
            }
            if text.starts_with('-') && !after_dashes && !command.options.iter().any(|o| o == key) {
                return Err(format!(
                    "argument `{key}` must not start with `-` (`{text}` would be read as an \
                     option); command `{}` of `{}` takes no options there",
                    command.name, module.id
                ));
            }
            Ok(text)
        };
        if let Some(key) = whole_placeholder(element) {
            match given.get(key) {
                Some(Value::Array(items)) => {
                    for item in items {
                        argv.push(value_of(key, item)?);
                    }
                }
                Some(value) => argv.push(value_of(key, value)?),
                None => return Err(missing(&command.name, key)),
            }
            continue;
        }
        let mut out = String::new();
        let mut rest = element.as_str();
        while let Some(start) = rest.find('{') {
            let Some(len) = rest[start..].find('}') else {
                break;
            };
            let key = &rest[start + 1..start + len];
            if !is_key(key) {
                out.push_str(&rest[..=start]);
                rest = &rest[start + 1..];
                continue;
            }
            out.push_str(&rest[..start]);
            let value = given.get(key).ok_or_else(|| missing(&command.name, key))?;
            out.push_str(&value_of(key, value)?);
            rest = &rest[start + len + 1..];
        }
        out.push_str(rest);
        argv.push(out);
    }
    Ok(RunPlan {
        id: module.id.clone(),
        command: command.name.clone(),
        argv,
        timeout_ms: module.timeout_ms,
    })
}

fn missing(command: &str, key: &str) -> String {
    format!("command `{command}` needs the argument `{key}`")
}

fn scalar(key: &str, value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!(
            "argument `{key}` must be a string, a number or a boolean (or a list of them where it stands alone), not {other}"
        )),
    }
}

/// The `{name}` placeholders of a template, in order, without repeats.
pub fn placeholders(argv: &[String]) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for element in argv {
        let mut rest = element.as_str();
        while let Some(start) = rest.find('{') {
            let Some(len) = rest[start..].find('}') else {
                break;
            };
            let key = &rest[start + 1..start + len];
            if is_key(key) && !keys.iter().any(|k| k == key) {
                keys.push(key.to_owned());
            }
            rest = &rest[start + 1..];
        }
    }
    keys
}

fn whole_placeholder(element: &str) -> Option<&str> {
    element
        .strip_prefix('{')
        .and_then(|e| e.strip_suffix('}'))
        .filter(|k| is_key(k))
}

/// A placeholder's name: letters, digits, `_` and `-`, starting with a letter.
pub fn is_key(key: &str) -> bool {
    key.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The registry's two tools, offered when the task may use at least one capability.
pub fn tool_specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: INSPECT.into(),
            description: "Tells how to use a capability listed in the instructions: level 1 \
                          its commands, 2 its usage guide, 3 its full reference. Without an id, \
                          lists every capability."
                .into(),
            parameters: Json(json!({
                "additionalProperties": false,
                "properties": {
                    "id": {"description": "The capability's id.", "type": "string"},
                    "level": {"description": "1, 2 or 3 (default 1).", "enum": [1, 2, 3], "type": "integer"}
                },
                "type": "object"
            })),
        },
        ToolSpec {
            name: RUN.into(),
            description: "Runs one command of a capability under the conversation's sandbox \
                          (it may need approval) and returns its exit code, stdout and stderr."
                .into(),
            parameters: Json(json!({
                "additionalProperties": false,
                "properties": {
                    "args": {"description": "The command's {placeholders} by name: a string, number or boolean, or a list of strings for a placeholder that stands alone.", "type": "object"},
                    "command": {"description": "The command's name, as capability_inspect lists it.", "type": "string"},
                    "id": {"description": "The capability's id.", "type": "string"}
                },
                "required": ["id", "command"],
                "type": "object"
            })),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::governance::{AgentLayer, task_policy};
    use troupe_proto::agent::ToolRules;
    use troupe_proto::capability::{CapabilityCommand, CapabilityModule};
    use troupe_proto::governance::ToolPolicyConfig;

    /// Four bytes a token, as the `approx` counter.
    fn approx(text: &str) -> usize {
        text.len().div_ceil(4)
    }

    fn capability(id: &str, description: &str) -> Capability {
        Capability {
            module: CapabilityModule {
                id: id.into(),
                description: description.into(),
                commands: vec![
                    CapabilityCommand {
                        name: "status".into(),
                        argv: vec!["git".into(), "status".into(), "--short".into()],
                        description: "Short status.".into(),
                        options: vec![],
                        choices: Default::default(),
                    },
                    CapabilityCommand {
                        name: "log".into(),
                        argv: vec![
                            "git".into(),
                            "log".into(),
                            "-n{count}".into(),
                            "--".into(),
                            "{paths}".into(),
                        ],
                        description: "Recent commits touching paths.".into(),
                        options: vec![],
                        choices: Default::default(),
                    },
                ],
                probe: vec!["git".into(), "--version".into()],
                timeout_ms: Some(5000),
            },
            readme: "# git\nUse status first.\n".into(),
            cli: "# git reference\n".to_owned() + &"detail line\n".repeat(200),
            version: "v1".into(),
        }
    }

    fn catalog(ids: &[&str]) -> CapabilityCatalog {
        CapabilityCatalog {
            capabilities: ids
                .iter()
                .map(|id| ((*id).to_owned(), capability(id, &format!("The {id} tool."))))
                .collect(),
            ..CapabilityCatalog::default()
        }
    }

    #[test]
    fn the_summary_lists_one_line_per_capability() {
        let c = catalog(&["git", "jq"]);
        let all: Vec<&Capability> = c.capabilities.values().collect();
        let text = summary(&all, 1000, &approx).unwrap();
        assert!(
            text.contains("- git: The git tool.\n- jq: The jq tool.\n"),
            "{text}"
        );
        assert!(!text.contains("more"), "{text}");
        assert_eq!(summary(&[], 1000, &approx), None);
    }

    #[test]
    fn the_summary_stays_within_its_budget_and_counts_the_rest() {
        let ids: Vec<String> = (0..50).map(|i| format!("tool{i:02}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let c = catalog(&refs);
        let all: Vec<&Capability> = c.capabilities.values().collect();
        for budget in [40, 80, 150, 300] {
            let text = summary(&all, budget, &approx).unwrap();
            let shown = text.lines().filter(|l| l.starts_with("- ")).count();
            assert!(shown < 50, "{budget}: {text}");
            assert!(
                text.ends_with(&format!(
                    "+{} more, use capability_inspect without an id to list them all\n",
                    50 - shown
                )),
                "{text}"
            );
            // The header and the `+N more` line are always there; within the budget
            // whenever at least one line fits.
            if shown > 0 {
                assert!(approx(&text) <= budget, "{budget}: {}", approx(&text));
            }
        }
    }

    #[test]
    fn a_capability_call_is_governed_by_one_name() {
        let policy = |config: ToolPolicyConfig| task_policy(&config, None, None, None);
        let run = |id: &str| json!({"id": id, "command": "status"});
        // Both names need a token: decided once, under the capability's name.
        let both = policy(ToolPolicyConfig {
            authorization_required: vec!["capability_*".into()],
            ..ToolPolicyConfig::default()
        });
        assert_eq!(governed_name(&both, RUN, &run("git")), "capability__git");
        // Only the tool needs one: the tool's name.
        let tool = policy(ToolPolicyConfig {
            authorization_required: vec![RUN.into()],
            ..ToolPolicyConfig::default()
        });
        assert_eq!(governed_name(&tool, RUN, &run("git")), RUN);
        // A denial wins over a token.
        let denied = policy(ToolPolicyConfig {
            blacklist: vec!["capability__git".into()],
            authorization_required: vec![RUN.into()],
            ..ToolPolicyConfig::default()
        });
        assert_eq!(governed_name(&denied, RUN, &run("git")), "capability__git");
        assert_eq!(governed_name(&denied, RUN, &run("jq")), RUN);
        // Without an id, and for other tools, the call's own name.
        assert_eq!(governed_name(&both, INSPECT, &json!({})), INSPECT);
        assert_eq!(governed_name(&both, "shell", &run("git")), "shell");
    }

    #[test]
    fn a_denied_capability_is_not_visible() {
        let c = catalog(&["git", "jq", "kubectl"]);
        let config = ToolPolicyConfig {
            blacklist: vec!["capability__kube*".into()],
            ..ToolPolicyConfig::default()
        };
        let policy = task_policy(&config, None, None, None);
        let ids: Vec<&str> = visible(&c, &policy)
            .iter()
            .map(|c| c.module.id.as_str())
            .collect();
        assert_eq!(ids, ["git", "jq"]);
        // An agent's whitelist narrows it further.
        let rules = ToolRules {
            whitelist: vec!["capability_*".into(), "capability__jq".into()],
            ..ToolRules::default()
        };
        let policy = task_policy(
            &config,
            Some(AgentLayer {
                id: "a",
                role: "r",
                tools: &rules,
            }),
            None,
            None,
        );
        let ids: Vec<&str> = visible(&c, &policy)
            .iter()
            .map(|c| c.module.id.as_str())
            .collect();
        assert_eq!(
            ids,
            ["git", "jq"],
            "capability_* matches capability__git too"
        );
    }

    #[test]
    fn inspect_levels_show_more_and_more() {
        let c = capability("git", "Version control.");
        let one = inspect(&c, Level::Summary, None, 2000, &approx);
        assert!(
            one.contains("- status: Short status. (argv: git status --short)"),
            "{one}"
        );
        assert!(
            one.contains(
                "- log: Recent commits touching paths. (argv: git log -n{count} -- {paths})"
            ),
            "{one}"
        );
        let two = inspect(&c, Level::Usage, None, 2000, &approx);
        assert_eq!(two, "# git\nUse status first.\n");
        let three = inspect(
            &c,
            Level::Full,
            Some("git version 2.39.5\n"),
            100_000,
            &approx,
        );
        assert!(three.starts_with("# git reference\n"));
        assert!(
            three.ends_with("$ git --version\ngit version 2.39.5\n"),
            "{three}"
        );
    }

    #[test]
    fn inspect_is_bounded_with_a_marker() {
        let c = capability("git", "Version control.");
        let three = inspect(&c, Level::Full, Some("git version 2\n"), 100, &approx);
        assert!(approx(&three) <= 100, "{}", approx(&three));
        assert!(three.starts_with("# git reference\ndetail line\n"));
        assert!(
            three.contains("[truncated: ") && three.ends_with("the context budget is 100 tokens]"),
            "{three}"
        );
    }

    #[test]
    fn bounded_cuts_at_a_character_boundary() {
        let text = "é".repeat(300);
        let cut = bounded(&text, 50, &approx);
        assert!(approx(&cut) <= 50);
        assert!(cut.starts_with("éé"));
        assert_eq!(bounded("short", 50, &approx), "short");
        // A budget smaller than the marker keeps nothing of the text, and says so.
        assert!(bounded(&text, 1, &approx).starts_with("\n[truncated: 0 of 600 bytes"));
    }

    #[test]
    fn run_plans_fill_the_template() {
        let c = capability("git", "Version control.");
        let plan = run_plan(
            &c,
            &json!({"id": "git", "command": "log", "args": {"count": 3, "paths": ["src", "README.md"]}}),
        )
        .unwrap();
        assert_eq!(plan.argv, ["git", "log", "-n3", "--", "src", "README.md"]);
        assert_eq!(plan.timeout_ms, Some(5000));
        let plan = run_plan(&c, &json!({"id": "git", "command": "status"})).unwrap();
        assert_eq!(plan.argv, ["git", "status", "--short"]);
    }

    #[test]
    fn run_plans_refuse_what_does_not_fit() {
        let c = capability("git", "Version control.");
        let err = |args: Value| run_plan(&c, &args).unwrap_err();
        assert!(err(json!({"id": "git"})).contains("needs `command`"));
        assert!(
            err(json!({"id": "git", "command": "push"}))
                .contains("no command `push` (it has: status, log)")
        );
        assert!(
            err(json!({"id": "git", "command": "log", "args": {"count": 1}}))
                .contains("needs the argument `paths`")
        );
        assert!(
            err(json!({"id": "git", "command": "status", "args": {"x": "1"}}))
                .contains("takes no argument `x` (it takes: none)")
        );
        assert!(
            err(json!({"id": "git", "command": "log", "args": {"count": [1], "paths": "a"}}))
                .contains("argument `count` must be")
        );
        assert!(
            err(json!({"id": "git", "command": "log", "args": 3}))
                .contains("`args` must be an object")
        );
    }

    fn command(argv: &[&str], options: &[&str]) -> Capability {
        let mut c = capability("rg", "Search.");
        c.module.commands = vec![CapabilityCommand {
            name: "search".into(),
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            description: "Search.".into(),
            options: options.iter().map(|o| (*o).to_owned()).collect(),
            choices: Default::default(),
        }];
        c
    }

    #[test]
    fn run_plans_refuse_values_that_would_be_options() {
        let rg = command(&["rg", "{pattern}", "src"], &[]);
        let plan = |c: &Capability, args: Value| {
            run_plan(c, &json!({"id": "rg", "command": "search", "args": args}))
        };
        // A scalar, an item of a list, and a value inside a larger element.
        for pattern in [json!("--pre=sh"), json!(["ok", "-e"]), json!(-1)] {
            let err = plan(&rg, json!({"pattern": pattern})).unwrap_err();
            assert!(
                err.contains("argument `pattern` must not start with `-`"),
                "{err}"
            );
        }
        let inside = command(&["git", "diff", "{rev}..HEAD"], &[]);
        assert!(
            plan(&inside, json!({"rev": "--output=/tmp/x"}))
                .unwrap_err()
                .contains("`rev` must not start with `-`")
        );
        assert_eq!(
            plan(&rg, json!({"pattern": "a-b"})).unwrap().argv,
            ["rg", "a-b", "src"]
        );
        // After a literal `--`, the program reads no options.
        let dashes = command(&["rg", "-e", "x", "--", "{paths}"], &[]);
        assert_eq!(
            plan(&dashes, json!({"paths": ["-weird-name"]}))
                .unwrap()
                .argv,
            ["rg", "-e", "x", "--", "-weird-name"]
        );
        // A placeholder declared as taking options.
        let flags = command(&["rg", "{flags}", "{pattern}"], &["flags"]);
        assert_eq!(
            plan(&flags, json!({"flags": ["-i", "-w"], "pattern": "x"}))
                .unwrap()
                .argv,
            ["rg", "-i", "-w", "x"]
        );
        assert!(
            plan(&flags, json!({"flags": "-i", "pattern": "-x"}))
                .unwrap_err()
                .contains("`pattern` must not start with `-`")
        );
    }

    /// A placeholder with `choices` takes only the values listed (options among them), and
    /// the model reads them in the level-1 summary; `git grep -O<cmd>` (a pager run through
    /// a shell) is not one of them.
    #[test]
    fn choices_restrict_a_placeholder_to_the_values_listed() {
        let mut grep = command(&["git", "grep", "{flags}", "-e", "{pattern}"], &[]);
        grep.module.commands[0].choices.insert(
            "flags".into(),
            vec!["-i".into(), "-w".into(), "--count".into()],
        );
        let plan = |args: Value| {
            run_plan(
                &grep,
                &json!({"id": "rg", "command": "search", "args": args}),
            )
        };
        assert_eq!(
            plan(json!({"flags": ["-i", "--count"], "pattern": "x"}))
                .unwrap()
                .argv,
            ["git", "grep", "-i", "--count", "-e", "x"]
        );
        for flags in [
            json!("-Osh -c id"),
            json!(["-i", "-O/bin/sh"]),
            json!("plain"),
        ] {
            let err = plan(json!({"flags": flags, "pattern": "x"})).unwrap_err();
            assert!(
                err.contains(
                    "argument `flags` of command `search` of `rg` must be one of: -i, -w, --count"
                ),
                "{err}"
            );
        }
        // The other placeholders still refuse options.
        assert!(
            plan(json!({"flags": "-i", "pattern": "--no-index"}))
                .unwrap_err()
                .contains("`pattern` must not start with `-`")
        );
        let summary = inspect(&grep, Level::Summary, None, 10_000, &approx);
        assert!(
            summary.contains("flags: one of -i, -w, --count"),
            "{summary}"
        );
    }

    #[test]
    fn placeholders_are_named_keys_only() {
        let argv: Vec<String> = ["jq", "{filter}", "-n{n}", "{}", "{not a key}", "{filter}"]
            .map(str::to_owned)
            .to_vec();
        assert_eq!(placeholders(&argv), ["filter", "n"]);
    }

    #[test]
    fn inspect_requests_read_their_level() {
        assert_eq!(inspect_request(&json!({})), Ok(InspectRequest::List));
        assert_eq!(
            inspect_request(&json!({"id": "git"})),
            Ok(InspectRequest::One {
                id: "git".into(),
                level: Level::Summary
            })
        );
        assert_eq!(
            inspect_request(&json!({"id": "git", "level": 3})),
            Ok(InspectRequest::One {
                id: "git".into(),
                level: Level::Full
            })
        );
        assert!(inspect_request(&json!({"id": "git", "level": 4})).is_err());
        assert_eq!(
            called_id(RUN, &json!({"id": "git"})).as_deref(),
            Some("git")
        );
        assert_eq!(called_id("shell", &json!({"id": "git"})), None);
    }

    #[test]
    fn the_tools_snapshot() {
        insta::with_settings!({sort_maps => true}, {
            insta::assert_json_snapshot!(tool_specs());
        });
    }
}
