//! The effective tool policy of a task (A5), and its decision for one tool: pure functions.
//!
//! [`effective`] combines the layers (global, role, agent, request; see
//! [`troupe_proto::governance`]) and the policy of the task that dispatched this one, once
//! per task. [`ToolPolicy::decide`] answers for one qualified tool name, at every call: a
//! tool is denied when any clause's blacklist names it or any clause with a whitelist leaves
//! it out, so deny beats allow at every layer, a sub-agent's rights are the intersection of
//! its own and its parent's, and neither the order of the layers nor the order of their
//! patterns changes an answer (the clauses are kept sorted and without repeats).
//!
//! Patterns: a qualified name (`shell`, `apply_patch`, `server__tool`), where `*` matches any
//! run of characters (`server__*`, `*`). The seed's dotted names are read as troupe's: a
//! built-in's `shell.exec` is `shell`, `server.tool` is `server__tool`.

use troupe_proto::agent::ToolRules;
use troupe_proto::governance::PolicyLayer;

/// One layer of a task's policy, with where it comes from (for the refusal's message).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Clause {
    pub layer: PolicyLayer,
    /// The role of a role layer, the agent of an agent layer; empty otherwise.
    pub source: String,
    /// `None`: this layer restricts nothing (its whitelist is empty).
    pub whitelist: Option<Vec<String>>,
    pub blacklist: Vec<String>,
    pub authorization_required: Vec<String>,
}

impl Clause {
    /// A layer's clause, its patterns normalised and sorted; `None` when the layer says
    /// nothing (no clause to check).
    pub fn of(layer: PolicyLayer, source: &str, rules: &ToolRules) -> Option<Self> {
        if rules.is_empty() {
            return None;
        }
        let norm = |list: &[String]| {
            let mut out: Vec<String> = list.iter().map(|p| normalize(p)).collect();
            out.sort();
            out.dedup();
            out
        };
        Some(Self {
            layer,
            source: source.to_owned(),
            whitelist: (!rules.whitelist.is_empty()).then(|| norm(&rules.whitelist)),
            blacklist: norm(&rules.blacklist),
            authorization_required: norm(&rules.authorization_required),
        })
    }

    /// `the agent coder's blacklist`, `the global whitelist`.
    fn describe(&self, list: &str) -> String {
        match (self.layer, self.source.as_str()) {
            (PolicyLayer::Role, role) => format!("role `{role}`'s {list}"),
            (PolicyLayer::Agent, agent) => format!("agent `{agent}`'s {list}"),
            (layer, _) => format!("the {layer} {list}"),
        }
    }
}

/// A task's effective tool policy: the clauses every tool call must pass.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolPolicy {
    /// Sorted, without repeats.
    clauses: Vec<Clause>,
}

/// Why a tool is denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub layer: PolicyLayer,
    /// The sentence a refusal carries: `tool `shell` is denied by agent `coder`'s blacklist
    /// (`sh*`)`.
    pub message: String,
}

/// What the policy says of one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolVerdict {
    /// It may run; `authorization`: the lowest layer that asks for a token, if any does.
    Allowed {
        authorization: Option<PolicyLayer>,
    },
    Denied(Denial),
}

impl ToolVerdict {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::Allowed { .. })
    }

    pub fn needs_authorization(&self) -> bool {
        matches!(
            self,
            Self::Allowed {
                authorization: Some(_)
            }
        )
    }
}

/// The policy of a task: its layers' clauses and its parent's (the task that dispatched it).
pub fn effective(layers: &[Option<Clause>], parent: Option<&ToolPolicy>) -> ToolPolicy {
    let mut clauses: Vec<Clause> = layers
        .iter()
        .flatten()
        .cloned()
        .chain(parent.into_iter().flat_map(|p| p.clauses.iter().cloned()))
        .collect();
    clauses.sort();
    clauses.dedup();
    ToolPolicy { clauses }
}

impl ToolPolicy {
    /// The policy that restricts nothing.
    pub fn open() -> Self {
        Self::default()
    }

    /// Whether no clause restricts anything (every tool allowed, no token needed).
    pub fn is_open(&self) -> bool {
        self.clauses.is_empty()
    }

    /// Both policies at once: a tool passes when it passes each.
    #[must_use]
    pub fn intersect(&self, other: &Self) -> Self {
        effective(
            &[],
            Some(&Self {
                clauses: self
                    .clauses
                    .iter()
                    .chain(other.clauses.iter())
                    .cloned()
                    .collect(),
            }),
        )
    }

    pub fn clauses(&self) -> &[Clause] {
        &self.clauses
    }

    /// The decision for `tool`, a qualified name. The reported denial is the first in
    /// clause order (lowest layer first), so the same policy always gives the same message.
    pub fn decide(&self, tool: &str) -> ToolVerdict {
        let mut authorization = None;
        for clause in &self.clauses {
            if let Some(pattern) = clause.blacklist.iter().find(|p| glob(p, tool)) {
                return ToolVerdict::Denied(Denial {
                    layer: clause.layer,
                    message: format!(
                        "tool `{tool}` is denied by {} (`{pattern}`)",
                        clause.describe("blacklist")
                    ),
                });
            }
            if let Some(whitelist) = &clause.whitelist
                && !whitelist.iter().any(|p| glob(p, tool))
            {
                return ToolVerdict::Denied(Denial {
                    layer: clause.layer,
                    message: format!("tool `{tool}` is not in {}", clause.describe("whitelist")),
                });
            }
            if authorization.is_none()
                && clause.authorization_required.iter().any(|p| glob(p, tool))
            {
                authorization = Some(clause.layer);
            }
        }
        ToolVerdict::Allowed { authorization }
    }
}

/// A pattern in troupe's spelling: the seed's dotted names (`shell.exec`, `server.tool`)
/// become qualified names (`shell`, `server__tool`).
pub fn normalize(pattern: &str) -> String {
    match pattern.split_once('.') {
        Some((head, _)) if is_builtin(head) => head.to_owned(),
        Some((head, rest)) => format!("{head}__{}", rest.replace('.', "__")),
        None => pattern.to_owned(),
    }
}

fn is_builtin(name: &str) -> bool {
    !crate::tools::is_external(name)
}

/// [`glob`] for a command line a shell may run: a `*` takes none of the characters with which
/// a shell ends a command, chains another or substitutes one (`;`, `&`, `|`, a newline, a
/// backquote, `$`, `(`, `)`, `<`, `>`), so a pattern written for one command covers no other
/// command chained to it or run inside it; such a character matches only itself, written in
/// the pattern. Quadratic in the worst case (lines and patterns are short).
pub fn glob_command(pattern: &str, line: &str) -> bool {
    const CONTROL: &[u8] = b";&|\n`$()<>";
    let (p, n) = (pattern.as_bytes(), line.as_bytes());
    // reach[j]: the pattern read so far matches the line's first j bytes.
    let mut reach = vec![false; n.len() + 1];
    reach[0] = true;
    for &c in p {
        let mut next = vec![false; n.len() + 1];
        for j in 0..=n.len() {
            next[j] = if c == b'*' {
                reach[j] || (j > 0 && next[j - 1] && !CONTROL.contains(&n[j - 1]))
            } else {
                j > 0 && reach[j - 1] && n[j - 1] == c
            };
        }
        reach = next;
    }
    reach[n.len()]
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters (none too).
/// Linear in practice: the classic wildcard match that backtracks only to the last `*`.
pub fn glob(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(&c) if c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rules(white: &[&str], black: &[&str], auth: &[&str]) -> ToolRules {
        let v = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect();
        ToolRules {
            whitelist: v(white),
            blacklist: v(black),
            authorization_required: v(auth),
        }
    }

    #[test]
    fn globs_match_qualified_names() {
        assert!(glob("shell", "shell"));
        assert!(!glob("shell", "shells"));
        assert!(glob("files__*", "files__read_file"));
        assert!(!glob("files__*", "git__status"));
        assert!(glob("*", "anything"));
        assert!(glob("*__delete_*", "files__delete_file"));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXbYY"));
        assert!(glob("**", ""));
    }

    #[test]
    fn dotted_names_are_read_as_qualified_ones() {
        assert_eq!(normalize("shell.exec"), "shell");
        assert_eq!(normalize("files.read_file"), "files__read_file");
        assert_eq!(normalize("files.*"), "files__*");
        assert_eq!(normalize("server__tool"), "server__tool");
    }

    #[test]
    fn a_refusal_names_the_layer_and_the_pattern() {
        let policy = effective(
            &[
                Clause::of(
                    PolicyLayer::Global,
                    "",
                    &rules(&[], &["files__delete_*"], &[]),
                ),
                Clause::of(
                    PolicyLayer::Agent,
                    "coder",
                    &rules(&["shell", "files__*"], &[], &["shell"]),
                ),
            ],
            None,
        );
        assert_eq!(
            policy.decide("files__delete_file"),
            ToolVerdict::Denied(Denial {
                layer: PolicyLayer::Global,
                message: "tool `files__delete_file` is denied by the global blacklist (`files__delete_*`)".into()
            })
        );
        let ToolVerdict::Denied(d) = policy.decide("apply_patch") else {
            panic!()
        };
        assert_eq!(
            d.message,
            "tool `apply_patch` is not in agent `coder`'s whitelist"
        );
        assert_eq!(
            policy.decide("shell"),
            ToolVerdict::Allowed {
                authorization: Some(PolicyLayer::Agent)
            }
        );
        assert_eq!(
            policy.decide("files__read_file"),
            ToolVerdict::Allowed {
                authorization: None
            }
        );
        assert!(effective(&[], None).is_open());
        assert!(
            effective(
                &[Clause::of(PolicyLayer::Request, "", &ToolRules::default())],
                None
            )
            .is_open()
        );
    }

    #[test]
    fn a_request_cannot_widen_what_a_lower_layer_denies() {
        let policy = effective(
            &[
                Clause::of(PolicyLayer::Global, "", &rules(&["shell"], &[], &[])),
                Clause::of(
                    PolicyLayer::Request,
                    "",
                    &rules(&["shell", "apply_patch"], &[], &[]),
                ),
            ],
            None,
        );
        assert!(policy.decide("shell").is_allowed());
        assert!(!policy.decide("apply_patch").is_allowed());
    }

    const NAMES: [&str; 8] = [
        "shell",
        "apply_patch",
        "update_plan",
        "dispatch_agent",
        "files__read_file",
        "files__delete_file",
        "git__status",
        "git__push",
    ];
    const PATTERNS: [&str; 12] = [
        "shell",
        "apply_patch",
        "update_plan",
        "dispatch_agent",
        "files__*",
        "files__read_*",
        "*__delete_*",
        "git__*",
        "git__status",
        "*",
        "shell.exec",
        "files.read_file",
    ];

    fn pattern_list() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(prop::sample::select(&PATTERNS[..]), 0..4)
            .prop_map(|v| v.into_iter().map(str::to_owned).collect())
    }

    fn any_rules() -> impl Strategy<Value = ToolRules> {
        (pattern_list(), pattern_list(), pattern_list()).prop_map(|(w, b, a)| ToolRules {
            whitelist: w,
            blacklist: b,
            authorization_required: a,
        })
    }

    fn any_layers() -> impl Strategy<Value = Vec<Option<Clause>>> {
        prop::collection::vec(
            (
                prop::sample::select(&PolicyLayer::ALL[..]),
                prop::sample::select(&["", "coder", "reviewer"][..]),
                any_rules(),
            ),
            0..5,
        )
        .prop_map(|layers| {
            layers
                .into_iter()
                .map(|(layer, source, rules)| Clause::of(layer, source, &rules))
                .collect()
        })
    }

    fn matches_any(list: &[String], tool: &str) -> bool {
        list.iter().any(|p| glob(&normalize(p), tool))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A command pattern is the plain one with stars that stop at a shell's control
        /// characters: the same on a line without any, never wider on one with some.
        #[test]
        fn command_globs_are_plain_globs_that_stop_at_control_characters(
            pattern in "[ab*;&]{0,8}",
            line in "[ab;&]{0,10}",
        ) {
            let plain = glob(&pattern, &line);
            let command = glob_command(&pattern, &line);
            prop_assert!(!command || plain);
            if !line.contains([';', '&']) {
                prop_assert_eq!(command, plain);
            }
        }

        /// Deny wins at every layer: a tool any layer's blacklist names is denied, whatever
        /// every other layer allows; and a tool runs exactly when no blacklist names it and
        /// every whitelist does.
        #[test]
        fn deny_wins_at_every_layer(
            layers in prop::collection::vec((prop::sample::select(&PolicyLayer::ALL[..]), any_rules()), 0..5),
        ) {
            let clauses: Vec<Option<Clause>> =
                layers.iter().map(|(l, r)| Clause::of(*l, "a", r)).collect();
            let policy = effective(&clauses, None);
            for tool in NAMES {
                let denied_somewhere = layers.iter().any(|(_, r)| matches_any(&r.blacklist, tool));
                let left_out = layers
                    .iter()
                    .any(|(_, r)| !r.whitelist.is_empty() && !matches_any(&r.whitelist, tool));
                let verdict = policy.decide(tool);
                if denied_somewhere {
                    prop_assert!(!verdict.is_allowed(), "{tool} passed a blacklist");
                }
                prop_assert_eq!(verdict.is_allowed(), !denied_somewhere && !left_out);
                let asked = layers.iter().any(|(_, r)| matches_any(&r.authorization_required, tool));
                prop_assert_eq!(verdict.needs_authorization(), verdict.is_allowed() && asked);
            }
        }

        /// A sub-agent's policy is the intersection of its own and its parent's.
        #[test]
        fn a_sub_agent_gets_the_intersection_with_its_parent(
            own in any_layers(),
            parent in any_layers(),
        ) {
            let parent = effective(&parent, None);
            let alone = effective(&own, None);
            let child = effective(&own, Some(&parent));
            prop_assert_eq!(&child, &alone.intersect(&parent));
            for tool in NAMES {
                let (c, a, p) = (child.decide(tool), alone.decide(tool), parent.decide(tool));
                prop_assert_eq!(c.is_allowed(), a.is_allowed() && p.is_allowed());
                if c.is_allowed() {
                    prop_assert_eq!(
                        c.needs_authorization(),
                        a.needs_authorization() || p.needs_authorization()
                    );
                }
            }
        }

        /// Neither the order of the layers nor the order of their patterns changes the policy.
        #[test]
        fn the_order_of_layers_and_patterns_changes_nothing(
            layers in prop::collection::vec((prop::sample::select(&PolicyLayer::ALL[..]), any_rules()), 0..5),
            seed in any::<u64>(),
        ) {
            let forward: Vec<Option<Clause>> =
                layers.iter().map(|(l, r)| Clause::of(*l, "a", r)).collect();
            let mut shuffled = layers.clone();
            // A permutation chosen by the seed, patterns reversed too.
            let n = shuffled.len().max(1);
            shuffled.rotate_left(usize::try_from(seed).unwrap_or(0) % n);
            if seed % 2 == 0 {
                shuffled.reverse();
            }
            let backward: Vec<Option<Clause>> = shuffled
                .iter()
                .map(|(l, r)| {
                    let mut r = r.clone();
                    r.whitelist.reverse();
                    r.blacklist.reverse();
                    r.authorization_required.reverse();
                    Clause::of(*l, "a", &r)
                })
                .collect();
            let (a, b) = (effective(&forward, None), effective(&backward, None));
            prop_assert_eq!(&a, &b);
            for tool in NAMES {
                prop_assert_eq!(a.decide(tool), b.decide(tool));
            }
        }
    }
}
