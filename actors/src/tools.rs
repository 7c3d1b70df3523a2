//! The tool list offered to the model (S8) and the tool preferences of a conversation (C1).
//!
//! Built-in tools come first in a fixed order, then external (MCP) tools sorted by qualified
//! name. A name offered twice with the same spec is one tool; with a different spec the first is
//! kept (a built-in always wins; among external tools the one whose canonical JSON sorts first)
//! and a `ToolConflict` is reported. The result depends only on the set of inputs, never on the
//! order the external tools arrived in, so prompts are stable across runs.

use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use troupe_proto::{AgentError, Json, ToolSpec};

/// Which built-in tools a conversation offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ToolPrefs {
    pub shell: bool,
    pub plan: bool,
    pub apply_patch: bool,
    pub web_search: bool,
}

pub const SHELL: &str = "shell";
pub const UPDATE_PLAN: &str = "update_plan";
pub const APPLY_PATCH: &str = "apply_patch";
pub const WEB_SEARCH: &str = "web_search";

/// Longest qualified tool name accepted by model APIs.
pub const MAX_TOOL_NAME_LEN: usize = 64;

/// Built-ins in their fixed order: shell, update_plan, apply_patch (each only if enabled).
/// Only tools troupe can run are offered: web search has no runner, so it is never offered,
/// whatever `prefs.web_search` asks (see [`unavailable_builtins`]).
pub fn builtin_tools(prefs: &ToolPrefs) -> Vec<ToolSpec> {
    [
        (prefs.shell, shell_tool as fn() -> ToolSpec),
        (prefs.plan, update_plan_tool),
        (prefs.apply_patch, apply_patch_tool),
    ]
    .into_iter()
    .filter(|(enabled, _)| *enabled)
    .map(|(_, build)| {
        let mut spec = build();
        spec.parameters.0 = sort_keys(std::mem::take(&mut spec.parameters.0));
        spec
    })
    .collect()
}

/// A tool list as a turn offers it: the specs, and each spec's parameter schema as JSON text
/// (what the prompt's token estimate counts). Cheap to clone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OfferedTools {
    pub specs: Arc<[ToolSpec]>,
    /// `specs[i].parameters` as JSON text.
    pub schemas: Arc<[String]>,
}

impl OfferedTools {
    pub fn new(specs: Vec<ToolSpec>) -> Self {
        let schemas = specs.iter().map(|t| t.parameters.0.to_string()).collect();
        Self {
            specs: specs.into(),
            schemas,
        }
    }

    /// These tools followed by `more` (their schema texts computed, these ones reused).
    pub fn with(&self, more: Vec<ToolSpec>) -> Self {
        self.joined(&Self::new(more))
    }

    /// These tools followed by `more`, the schema texts of both reused.
    fn joined(&self, more: &Self) -> Self {
        let specs = self
            .specs
            .iter()
            .chain(more.specs.iter())
            .cloned()
            .collect();
        let schemas = self
            .schemas
            .iter()
            .chain(more.schemas.iter())
            .cloned()
            .collect();
        Self { specs, schemas }
    }
}

/// Whether `more` names no tool twice and none of `these`: appended, nothing conflicts.
fn names_apart(these: &[ToolSpec], more: &[ToolSpec]) -> bool {
    more.iter().enumerate().all(|(i, t)| {
        !these.iter().any(|b| b.name == t.name) && !more[..i].iter().any(|m| m.name == t.name)
    })
}

/// [`builtin_tools`] for `prefs`, built once per process: the built-in specs never change, so
/// a turn shares them instead of building, sorting and serializing their schemas again.
pub fn shared_builtins(prefs: &ToolPrefs) -> OfferedTools {
    static SETS: [OnceLock<OfferedTools>; 8] = [const { OnceLock::new() }; 8];
    let index = usize::from(prefs.shell)
        | (usize::from(prefs.plan) << 1)
        | (usize::from(prefs.apply_patch) << 2);
    let build = || OfferedTools::new(builtin_tools(prefs));
    match SETS.get(index) {
        Some(set) => set.get_or_init(build).clone(),
        None => build(),
    }
}

/// The tools of a turn: the built-ins and `extra` (built-ins of this turn only, such as the
/// agents' dispatch tool and the capability tools), then the external tools merged in ([`merge_tools`]). Without extra
/// or external tools, the shared built-in set as is (their names differ, so they never
/// conflict among themselves).
pub fn offered_tools(
    builtins: &OfferedTools,
    extra: OfferedTools,
    external: Vec<ToolSpec>,
) -> (OfferedTools, Vec<AgentError>) {
    if extra.specs.is_empty() && external.is_empty() {
        return (builtins.clone(), Vec::new());
    }
    if external.is_empty() && names_apart(&builtins.specs, &extra.specs) {
        // Nothing to merge (the common case of a session with agents: the dispatch tool
        // beside the built-ins): the schema texts of both are reused as they are.
        return (builtins.joined(&extra), Vec::new());
    }
    let mut own = builtins.specs.to_vec();
    own.extend(extra.specs.iter().cloned());
    let merged = merge_tools(own, external);
    (OfferedTools::new(merged.tools), merged.conflicts)
}

/// `value` with every object's keys in sorted order: the same text whether serde_json keeps
/// insertion order (its `preserve_order` feature, which a dependency may turn on for the
/// whole build) or not, so a built-in schema reads the same to the model, to the token
/// counter's table of known texts, and to every snapshot.
fn sort_keys(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sort_keys).collect()),
        other => other,
    }
}

/// Whether `name` is an external (MCP) tool's: anything but a built-in's name.
pub fn is_external(name: &str) -> bool {
    !matches!(
        name,
        SHELL
            | UPDATE_PLAN
            | APPLY_PATCH
            | WEB_SEARCH
            | crate::agents::route::DISPATCH_TOOL
            | crate::agents::route::ROUTE_TOOL
    )
}

/// Built-ins the preferences ask for that are not offered because nothing runs them: the
/// conversation is warned instead of the model being told of a tool that would be refused.
pub fn unavailable_builtins(prefs: &ToolPrefs) -> Vec<&'static str> {
    if prefs.web_search {
        vec![WEB_SEARCH]
    } else {
        Vec::new()
    }
}

/// The tool list and the conflicts found while building it.
#[derive(Debug, Clone, PartialEq)]
pub struct MergedTools {
    pub tools: Vec<ToolSpec>,
    /// `AgentError::ToolConflict`, one per dropped distinct spec, in list order.
    pub conflicts: Vec<AgentError>,
}

/// Built-ins first (fixed order), then external tools sorted by name; identical duplicates
/// collapse to one; same name with a different spec -> the first kept (built-in wins; among
/// externals the one whose serialized spec sorts first, so the result is deterministic whatever
/// the input order) and a ToolConflict reported naming the tool.
pub fn merge_tools(builtins: Vec<ToolSpec>, external: Vec<ToolSpec>) -> MergedTools {
    let mut external: Vec<(String, ToolSpec)> = external
        .into_iter()
        .map(|spec| (canonical_text(&spec), spec))
        .collect();
    external.sort_by(|(a_key, a), (b_key, b)| a.name.cmp(&b.name).then_with(|| a_key.cmp(b_key)));

    let candidates = builtins
        .into_iter()
        .map(|spec| (Origin::BuiltIn, canonical_text(&spec), spec))
        .chain(
            external
                .into_iter()
                .map(|(key, spec)| (Origin::External, key, spec)),
        );

    let mut tools: Vec<ToolSpec> = Vec::new();
    // name -> (index in `tools`, where the kept spec came from)
    let mut kept: HashMap<String, (usize, Origin)> = HashMap::new();
    // Canonical texts of specs already reported, so identical losers are reported once.
    let mut reported: HashSet<String> = HashSet::new();
    let mut conflicts = Vec::new();
    for (origin, key, spec) in candidates {
        let Some(&(index, kept_origin)) = kept.get(&spec.name) else {
            kept.insert(spec.name.clone(), (tools.len(), origin));
            tools.push(spec);
            continue;
        };
        let Some(winner) = tools.get(index) else {
            continue;
        };
        if *winner == spec || !reported.insert(key) {
            continue;
        }
        let detail = conflict_detail(winner, kept_origin, &spec, origin);
        tracing::warn!(tool = %spec.name, %detail, "tool conflict");
        conflicts.push(AgentError::ToolConflict {
            name: spec.name,
            detail,
        });
    }
    MergedTools { tools, conflicts }
}

/// Valid qualified tool name: ^[a-zA-Z0-9_-]+$ and 1..=64 chars.
pub fn is_valid_tool_name(name: &str) -> bool {
    (1..=MAX_TOOL_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    BuiltIn,
    External,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Self::BuiltIn => "built-in",
            Self::External => "external",
        }
    }
}

fn conflict_detail(
    kept: &ToolSpec,
    kept_origin: Origin,
    dropped: &ToolSpec,
    origin: Origin,
) -> String {
    let differs = match (
        kept.description != dropped.description,
        kept.parameters != dropped.parameters,
    ) {
        (true, true) => "description and parameters differ",
        (true, false) => "description differs",
        _ => "parameters differ",
    };
    format!(
        "kept the {} definition; dropped an {} one whose {differs}",
        kept_origin.as_str(),
        origin.as_str(),
    )
}

/// The spec as JSON text with object keys sorted at every level: equal specs give equal text
/// whatever order their schema keys were written in.
fn canonical_text(spec: &ToolSpec) -> String {
    json!({
        "name": spec.name,
        "description": spec.description,
        "parameters": canonical(&spec.parameters.0),
    })
    .to_string()
}

fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), canonical(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

fn shell_tool() -> ToolSpec {
    ToolSpec {
        name: SHELL.into(),
        description: "Runs a command and returns its exit code, stdout and stderr. The command \
                      runs under the conversation's sandbox policy (read-only, workspace-write: \
                      writes only under the workspace, or full-access) and may need approval."
            .into(),
        parameters: Json(json!({
            "type": "object",
            "properties": {
                "command": {
                    "type": "array",
                    "items": { "type": "string" },
                    "minItems": 1,
                    "description": "The program and its arguments (argv), e.g. [\"ls\", \"-la\"]. \
                                    Not run through a shell: use [\"bash\", \"-lc\", \"...\"] for pipes."
                },
                "workdir": {
                    "type": "string",
                    "description": "Working directory; the conversation's directory if omitted."
                },
                "timeout_ms": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Stop the command after this many milliseconds."
                }
            },
            "required": ["command"],
            "additionalProperties": false
        })),
    }
}

fn update_plan_tool() -> ToolSpec {
    ToolSpec {
        name: UPDATE_PLAN.into(),
        description: "Records the plan for the current task: ordered steps, each pending, \
                      in_progress or completed. Keep at most one step in_progress."
            .into(),
        parameters: Json(json!({
            "type": "object",
            "properties": {
                "explanation": {
                    "type": "string",
                    "description": "Why the plan changed, if it did."
                },
                "plan": {
                    "type": "array",
                    "description": "The steps, in order.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "step": { "type": "string" },
                            "status": {
                                "type": "string",
                                "enum": ["pending", "in_progress", "completed"]
                            }
                        },
                        "required": ["step", "status"],
                        "additionalProperties": false
                    }
                }
            },
            "required": ["plan"],
            "additionalProperties": false
        })),
    }
}

fn apply_patch_tool() -> ToolSpec {
    ToolSpec {
        name: APPLY_PATCH.into(),
        description: "Edits files with a patch. The patch starts with `*** Begin Patch` and ends \
                      with `*** End Patch`; in between, sections `*** Add File: <path>` (lines \
                      prefixed with +), `*** Delete File: <path>`, or `*** Update File: <path>` \
                      (optionally `*** Move to: <path>`) with `@@` hunks of context ( ), removed \
                      (-) and added (+) lines. Paths are relative to the workspace root; a path \
                      outside the workspace is refused, as is any patch under a read-only \
                      sandbox. May need approval."
            .into(),
        parameters: Json(json!({
            "type": "object",
            "properties": {
                "input": {
                    "type": "string",
                    "description": "The whole patch, from `*** Begin Patch` to `*** End Patch`."
                }
            },
            "required": ["input"],
            "additionalProperties": false
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALL: ToolPrefs = ToolPrefs {
        shell: true,
        plan: true,
        apply_patch: true,
        web_search: true,
    };

    fn tool(name: &str, description: &str, parameters: Value) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            parameters: Json(parameters),
        }
    }

    fn query_schema() -> Value {
        json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]})
    }

    fn path_schema() -> Value {
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})
    }

    fn names(tools: &[ToolSpec]) -> Vec<&str> {
        tools.iter().map(|t| t.name.as_str()).collect()
    }

    fn conflict_names(conflicts: &[AgentError]) -> Vec<&str> {
        conflicts
            .iter()
            .map(|c| match c {
                AgentError::ToolConflict { name, .. } => name.as_str(),
                other => panic!("not a tool conflict: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn merged_tool_list_snapshot() {
        let external = vec![
            tool("github__search_issues", "Search issues.", query_schema()),
            tool("fs__write_file", "Write a file.", path_schema()),
            tool("fs__read_file", "Read a file.", path_schema()),
            tool("shell", "A different shell.", query_schema()),
            tool("fs__list_dir", "List a directory.", path_schema()),
            tool("fs__read_file", "Read a file.", path_schema()),
            tool("fs__write_file", "Write a file (v2).", path_schema()),
        ];
        let merged = merge_tools(builtin_tools(&ALL), external);
        // Keys sorted: the same snapshot whether or not serde_json keeps insertion order
        // (its `preserve_order` feature, which a dependency may turn on for the whole build).
        insta::with_settings!({sort_maps => true}, {
            insta::assert_json_snapshot!(json!({
                "tools": merged.tools,
                "conflicts": merged.conflicts,
            }));
        });
    }

    #[test]
    fn builtins_keep_fixed_order_and_follow_prefs() {
        assert_eq!(
            names(&builtin_tools(&ALL)),
            [SHELL, UPDATE_PLAN, APPLY_PATCH]
        );
        assert!(builtin_tools(&ToolPrefs::default()).is_empty());
        let some = ToolPrefs {
            shell: true,
            web_search: true,
            ..ToolPrefs::default()
        };
        // Web search has no runner: asked for, it is reported, never offered.
        assert_eq!(names(&builtin_tools(&some)), [SHELL]);
        assert_eq!(unavailable_builtins(&some), [WEB_SEARCH]);
        assert!(unavailable_builtins(&ToolPrefs::default()).is_empty());
    }

    #[test]
    fn shared_builtins_are_the_built_ins_and_merge_to_themselves() {
        for bits in 0..16u8 {
            let prefs = ToolPrefs {
                shell: bits & 1 != 0,
                plan: bits & 2 != 0,
                apply_patch: bits & 4 != 0,
                web_search: bits & 8 != 0,
            };
            let shared = shared_builtins(&prefs);
            assert_eq!(&shared.specs[..], builtin_tools(&prefs).as_slice());
            assert_eq!(
                shared,
                shared_builtins(&prefs),
                "built once, the same each time"
            );
            let texts: Vec<String> = shared
                .specs
                .iter()
                .map(|t| t.parameters.0.to_string())
                .collect();
            assert_eq!(&shared.schemas[..], texts.as_slice());
            // The shortcut without external tools is what the merge gives.
            let merged = merge_tools(builtin_tools(&prefs), Vec::new());
            assert!(merged.conflicts.is_empty());
            let (offered, conflicts) = offered_tools(&shared, OfferedTools::default(), Vec::new());
            assert_eq!(&offered.specs[..], merged.tools.as_slice());
            assert!(conflicts.is_empty());
        }
        let external = vec![tool("shell", "A different shell.", query_schema())];
        let (offered, conflicts) = offered_tools(
            &shared_builtins(&ALL),
            OfferedTools::default(),
            external.clone(),
        );
        let merged = merge_tools(builtin_tools(&ALL), external);
        assert_eq!(&offered.specs[..], merged.tools.as_slice());
        assert_eq!(
            conflict_names(&conflicts),
            conflict_names(&merged.conflicts)
        );
    }

    #[test]
    fn tools_with_more_keep_each_schema_text_beside_its_tool() {
        let first = vec![tool("a", "A.", query_schema())];
        let more = vec![
            tool("b", "B.", serde_json::json!({"type": "object"})),
            tool("c", "C.", query_schema()),
        ];
        let all: Vec<ToolSpec> = first.iter().chain(&more).cloned().collect();
        let expected = OfferedTools::new(all);
        assert_eq!(
            OfferedTools::new(first.clone()).with(more.clone()),
            expected
        );
        assert_eq!(
            OfferedTools::new(first).joined(&OfferedTools::new(more)),
            expected
        );
    }

    #[test]
    fn turn_only_tools_beside_the_shared_built_ins_are_what_the_merge_gives() {
        let dispatch = tool(
            crate::agents::route::DISPATCH_TOOL,
            "Dispatch to an agent.",
            query_schema(),
        );
        let other = tool("capability__search", "Search.", query_schema());
        for bits in 0..16u8 {
            let prefs = ToolPrefs {
                shell: bits & 1 != 0,
                plan: bits & 2 != 0,
                apply_patch: bits & 4 != 0,
                web_search: bits & 8 != 0,
            };
            let shared = shared_builtins(&prefs);
            for extra in [
                vec![dispatch.clone()],
                vec![dispatch.clone(), other.clone()],
            ] {
                let mut own = builtin_tools(&prefs);
                own.extend(extra.clone());
                let merged = merge_tools(own, Vec::new());
                let (offered, conflicts) =
                    offered_tools(&shared, OfferedTools::new(extra), Vec::new());
                assert_eq!(&offered.specs[..], merged.tools.as_slice());
                assert_eq!(offered, OfferedTools::new(merged.tools.clone()));
                assert!(conflicts.is_empty() && merged.conflicts.is_empty());
            }
        }
        // A turn-only tool named like a built-in, or twice: merged, the conflict said.
        let clash = tool("shell", "Another shell.", query_schema());
        let (offered, conflicts) = offered_tools(
            &shared_builtins(&ALL),
            OfferedTools::new(vec![clash]),
            Vec::new(),
        );
        assert_eq!(
            offered.specs.iter().filter(|t| t.name == "shell").count(),
            1
        );
        assert_eq!(conflict_names(&conflicts), ["shell"]);
        let (offered, _) = offered_tools(
            &shared_builtins(&ALL),
            OfferedTools::new(vec![dispatch.clone(), dispatch.clone()]),
            Vec::new(),
        );
        assert_eq!(
            offered
                .specs
                .iter()
                .filter(|t| t.name == crate::agents::route::DISPATCH_TOOL)
                .count(),
            1
        );
    }

    #[test]
    fn builtin_schemas_require_declared_properties() {
        for spec in builtin_tools(&ALL) {
            assert!(is_valid_tool_name(&spec.name));
            assert!(!spec.description.is_empty());
            let schema = &spec.parameters.0;
            assert_eq!(schema["type"], "object", "{}", spec.name);
            let required = schema["required"].as_array().cloned().unwrap_or_default();
            assert!(!required.is_empty(), "{}", spec.name);
            for field in required {
                let field = field.as_str().unwrap_or_default();
                assert!(
                    schema["properties"].get(field).is_some(),
                    "{}.{field}",
                    spec.name
                );
            }
        }
    }

    #[test]
    fn same_name_different_schema_keeps_one_and_reports_conflict() {
        let a = tool("srv__t", "T.", path_schema());
        let b = tool("srv__t", "T.", query_schema());
        let merged = merge_tools(vec![], vec![b.clone(), a.clone()]);
        assert_eq!(merged.tools.len(), 1);
        assert_eq!(conflict_names(&merged.conflicts), ["srv__t"]);
        // The kept one is the one whose canonical text sorts first, whatever the input order.
        let expected = if canonical_text(&a) < canonical_text(&b) {
            &a
        } else {
            &b
        };
        assert_eq!(&merged.tools[0], expected);
        assert_eq!(merge_tools(vec![], vec![a, b]), merged);

        // A built-in always wins against an external tool of the same name.
        let impostor = tool(SHELL, "Not the shell.", query_schema());
        let merged = merge_tools(builtin_tools(&ALL), vec![impostor]);
        assert_eq!(merged.tools[0], builtin_tools(&ALL)[0]);
        assert_eq!(merged.tools.len(), 3);
        assert_eq!(conflict_names(&merged.conflicts), [SHELL]);
        assert!(matches!(
            &merged.conflicts[0],
            AgentError::ToolConflict { detail, .. } if detail.contains("built-in")
        ));
    }

    #[test]
    fn identical_duplicates_collapse_without_conflict() {
        let t = tool("srv__t", "T.", path_schema());
        // Same schema written with its keys in another order is the same tool.
        let reordered = tool(
            "srv__t",
            "T.",
            json!({"required": ["path"], "properties": {"path": {"type": "string"}}, "type": "object"}),
        );
        let merged = merge_tools(
            builtin_tools(&ALL),
            vec![
                t.clone(),
                t.clone(),
                reordered,
                builtin_tools(&ALL)[2].clone(),
            ],
        );
        assert_eq!(
            names(&merged.tools),
            [SHELL, UPDATE_PLAN, APPLY_PATCH, "srv__t"]
        );
        assert!(merged.conflicts.is_empty());
    }

    #[test]
    fn tool_name_validation() {
        for ok in [
            "shell",
            "a",
            "A-b_9",
            "github__search_issues",
            &"x".repeat(64),
        ] {
            assert!(is_valid_tool_name(ok), "{ok}");
        }
        for bad in [
            "",
            "has space",
            "dot.ted",
            "slash/y",
            "é",
            "semi;colon",
            &"x".repeat(65),
        ] {
            assert!(!is_valid_tool_name(bad), "{bad}");
        }
    }

    fn arb_spec() -> impl Strategy<Value = ToolSpec> {
        (
            prop::sample::select(vec!["a__x", "a__y", "b__x", SHELL, WEB_SEARCH]),
            prop::sample::select(vec!["one", "two"]),
            prop::sample::select(vec![path_schema(), query_schema(), json!({})]),
        )
            .prop_map(|(name, description, parameters)| tool(name, description, parameters))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn merge_is_independent_of_external_order(
            (external, shuffled) in prop::collection::vec(arb_spec(), 0..16)
                .prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle())),
            shell in any::<bool>(),
            web_search in any::<bool>(),
        ) {
            let prefs = ToolPrefs { shell, web_search, ..ALL };
            let a = merge_tools(builtin_tools(&prefs), external);
            let b = merge_tools(builtin_tools(&prefs), shuffled);
            prop_assert_eq!(&a, &b);

            // Built-ins first, untouched; then externals sorted by name; names unique.
            let builtins = builtin_tools(&prefs);
            prop_assert_eq!(&a.tools[..builtins.len()], builtins.as_slice());
            let rest = names(&a.tools[builtins.len()..]);
            prop_assert!(rest.windows(2).all(|w| w[0] < w[1]));
            let unique: HashSet<&str> = names(&a.tools).into_iter().collect();
            prop_assert_eq!(unique.len(), a.tools.len());
        }
    }
}
