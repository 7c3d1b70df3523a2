//! The hub's decisions, as plain functions of what it knows: who may dispatch to whom, what
//! a dispatch is refused for (A4), and how an agent's binding is found (A1).

use troupe_proto::StoragePolicy;
use troupe_proto::agent::{
    AgentBinding, AgentCatalog, BindingScope, ExecutionChain, PolicyReason, ProviderKind,
};

/// Which agents a dispatcher may dispatch to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visibility {
    /// Any agent (`/hub`, a human naming the agent; the built-in supervisor).
    Any,
    /// These only (an agent's `workers`, a defined supervisor's `workers` when it has any).
    Only(Vec<String>),
}

impl Visibility {
    pub fn sees(&self, agent_id: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Only(ids) => ids.iter().any(|id| id == agent_id),
        }
    }

    /// The ids visible in `catalog` (sorted), leaving out `except` (the dispatcher itself).
    pub fn ids(&self, catalog: &AgentCatalog, except: Option<&str>) -> Vec<String> {
        catalog
            .agents
            .keys()
            .filter(|id| self.sees(id) && Some(id.as_str()) != except)
            .cloned()
            .collect()
    }
}

/// What the dispatcher at the end of `chain` may see. The origin of a chain is the
/// supervisor: a defined one with workers sees them, the built-in one (or a defined one
/// without workers) every agent, a configured one that did not load none (it must not
/// widen into the built-in one). An agent sees its workers only.
pub fn visible_from(catalog: &AgentCatalog, chain: &ExecutionChain) -> Visibility {
    let Some(current) = chain.current() else {
        return Visibility::Any;
    };
    match catalog.get(current) {
        Some(def) if chain.depth() > 0 || !def.workers.is_empty() => {
            Visibility::Only(def.workers.clone())
        }
        // The origin: a defined supervisor without workers, or the built-in one.
        Some(_) if chain.depth() == 0 => Visibility::Any,
        None if chain.depth() == 0 && current == troupe_proto::agent::BUILTIN_SUPERVISOR_ID => {
            Visibility::Any
        }
        _ => Visibility::Only(Vec::new()),
    }
}

/// A dispatch refused before it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: PolicyReason,
    pub message: String,
}

/// Whether `chain` may dispatch to `agent_id`, checked in this order: the agent exists, the
/// dispatcher may see it (`visibility`), it is not already in the chain, the chain stays
/// within `max_depth`, and a provider of its kind is there (`has_provider`).
/// Whether a human's `/hub` names the agent a user's message starts from (the defined
/// supervisor): no dispatch to itself, so no cycle; the agent runs with the chain it
/// starts (its own dispatches nest from it).
pub fn names_origin(chain: &ExecutionChain, agent_id: &str, by_human: bool) -> bool {
    by_human && chain.depth() == 0 && chain.current() == Some(agent_id)
}

/// The chain a dispatch runs its agent under: one dispatch further, or the origin's own
/// chain when a human names the origin ([`names_origin`]).
pub fn dispatch_chain(chain: &ExecutionChain, agent_id: &str, by_human: bool) -> ExecutionChain {
    if names_origin(chain, agent_id, by_human) {
        chain.clone()
    } else {
        chain.then(agent_id)
    }
}

pub fn admit(
    catalog: &AgentCatalog,
    chain: &ExecutionChain,
    agent_id: &str,
    visibility: &Visibility,
    max_depth: usize,
    has_provider: impl Fn(&str) -> bool,
) -> Result<(), Refusal> {
    let refuse = |reason, message: String| Err(Refusal { reason, message });
    let Some(def) = catalog.get(agent_id) else {
        let known: Vec<&str> = catalog.agents.keys().map(String::as_str).collect();
        return refuse(
            PolicyReason::UnknownAgent,
            format!(
                "no agent `{agent_id}` is defined (agents: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ),
        );
    };
    if !visibility.sees(agent_id) {
        return refuse(
            PolicyReason::NotVisible,
            format!(
                "`{}` may not dispatch to `{agent_id}` (not among its workers)",
                chain.current().unwrap_or("the dispatcher")
            ),
        );
    }
    if chain.contains(agent_id) {
        return refuse(
            PolicyReason::Cycle,
            format!("`{agent_id}` is already in the execution chain {chain}: a cycle"),
        );
    }
    if chain.depth() + 1 > max_depth {
        return refuse(
            PolicyReason::Depth,
            format!(
                "dispatching to `{agent_id}` would nest {} deep, over the limit of {max_depth}",
                chain.depth() + 1
            ),
        );
    }
    if !has_provider(agent_id) {
        return refuse(
            PolicyReason::ProviderUnavailable,
            format!(
                "no {} provider is plugged in for `{agent_id}`",
                def.provider.kind()
            ),
        );
    }
    Ok(())
}

/// Whether a dispatch from a conversation kept under `dispatcher` may reach `agent_id`: an
/// in-process agent's conversation is recorded under `agent` (the session's root policy),
/// which must keep no more than the dispatcher allows; an external agent keeps nothing here.
pub fn storage_allows(
    kind: ProviderKind,
    agent_id: &str,
    agent: StoragePolicy,
    dispatcher: StoragePolicy,
) -> Result<(), Refusal> {
    if kind != ProviderKind::Model || !agent.keeps_more_than(dispatcher) {
        return Ok(());
    }
    Err(Refusal {
        reason: PolicyReason::StoragePolicy,
        message: format!(
            "`{agent_id}` records its conversation under the session's storage policy \
             ({}), which keeps more than this conversation's ({}) allows",
            policy_name(agent),
            policy_name(dispatcher)
        ),
    })
}

fn policy_name(policy: StoragePolicy) -> String {
    match policy {
        StoragePolicy::Full => "full".into(),
        StoragePolicy::HeadersOnly => "headers_only".into(),
        StoragePolicy::None => "none".into(),
        StoragePolicy::Ttl { secs } => format!("ttl:{secs}"),
    }
}

/// Where an agent's binding stands in this run of the session.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BindingEntry {
    /// The binding the store held (or this run wrote).
    pub stored: Option<AgentBinding>,
    /// The provider session this run opened or resumed: reused without asking.
    pub live: Option<String>,
    /// A dispatch is opening or resuming it now; others wait for it.
    pub opening: bool,
}

/// What a dispatch does to get its provider session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindPlan {
    /// This run already has it.
    Use(String),
    /// Take the stored binding up again (once per run); `created_ms`: when it was made.
    Resume {
        provider_session_id: String,
        created_ms: u64,
    },
    /// Open a new provider session and bind it. `previous`: the stored one it replaces;
    /// `alert`: why that is worth a warning (it could not be kept), `None` when replacing
    /// is what the definition asks (`resume = false`).
    Open {
        previous: Option<String>,
        alert: Option<String>,
    },
    /// A new provider session for this dispatch alone, never bound (`bindingScope =
    /// "dispatch"`).
    Fresh,
    /// Another dispatch is opening or resuming it: wait for that one.
    Wait,
}

/// How `entry` is bound for a dispatch to an agent of `kind` with `scope` and `resume`.
pub fn bind_plan(
    entry: &BindingEntry,
    scope: BindingScope,
    resume: bool,
    kind: ProviderKind,
) -> BindPlan {
    if scope == BindingScope::Dispatch {
        return BindPlan::Fresh;
    }
    if entry.opening {
        return BindPlan::Wait;
    }
    if let Some(live) = &entry.live {
        return BindPlan::Use(live.clone());
    }
    match &entry.stored {
        None => BindPlan::Open {
            previous: None,
            alert: None,
        },
        Some(b) if b.provider != kind => BindPlan::Open {
            previous: Some(b.provider_session_id.clone()),
            alert: Some(format!(
                "it was bound by a {} provider and the agent is now {kind}",
                b.provider
            )),
        },
        Some(b) if !resume => BindPlan::Open {
            previous: Some(b.provider_session_id.clone()),
            alert: None,
        },
        Some(b) => BindPlan::Resume {
            provider_session_id: b.provider_session_id.clone(),
            created_ms: b.created_ms,
        },
    }
}

/// Whether a dispatch to an agent of `kind` lends the dispatcher's scheduler slot to the
/// agent's task (an in-process agent, whose task needs one) rather than giving it back for
/// the wait (an external agent computes elsewhere and takes none).
pub fn slot_lent(kind: ProviderKind) -> bool {
    match kind {
        ProviderKind::Model => true,
        ProviderKind::Acp | ProviderKind::A2a => false,
    }
}

/// How an admitted dispatch reaches its agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchPath {
    /// Straight to the agent's conversation, its end straight back (`agents::direct`).
    Direct,
    /// Through a worker: the provider's initialization, the binding, its `handle`.
    Worker,
}

impl DispatchPath {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Worker => "worker",
        }
    }
}

/// How a dispatch to an agent of `kind` goes, given its bind plan (`None`: it waits for
/// another dispatch's binding, or has none) and the conversation the hub knows for the agent
/// (`known`: its provider session, and whether its actor is alive). Only an in-process agent
/// whose live binding is that conversation's goes direct; anything to open, resume or
/// reactivate takes the worker (which goes through the Session).
pub fn dispatch_path(
    kind: ProviderKind,
    plan: Option<&BindPlan>,
    known: Option<(&str, bool)>,
) -> DispatchPath {
    match (kind, plan, known) {
        (ProviderKind::Model, Some(BindPlan::Use(id)), Some((known, true))) if id == known => {
            DispatchPath::Direct
        }
        _ => DispatchPath::Worker,
    }
}

/// Whether the hub arms its lease timer for a new lease of `deadline_ms`: none is armed, or
/// the armed one comes later. One timer for the earliest deadline serves every lease: when it
/// fires, the hub reclaims what expired and arms it for the next deadline.
pub fn arm_lease_timer(armed_ms: Option<u64>, deadline_ms: u64) -> bool {
    armed_ms.is_none_or(|armed| deadline_ms < armed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use troupe_proto::SessionId;
    use troupe_proto::agent::{AgentDefinition, ProviderSpec};

    fn def(id: &str, workers: &[&str], kind: ProviderKind) -> AgentDefinition {
        AgentDefinition {
            id: id.into(),
            role: "r".into(),
            description: None,
            provider: match kind {
                ProviderKind::Model => ProviderSpec::Model {
                    model: None,
                    provider: None,
                    base_url: None,
                    instructions: None,
                },
                ProviderKind::Acp => ProviderSpec::Acp {
                    command: "x".into(),
                    args: Vec::new(),
                    env: Default::default(),
                    cwd: None,
                },
                ProviderKind::A2a => ProviderSpec::A2a {
                    url: "http://x".into(),
                    token_env: None,
                },
            },
            session: Default::default(),
            tools: Default::default(),
            workers: workers.iter().map(|w| (*w).to_owned()).collect(),
            governance: None,
            output: None,
        }
    }

    fn catalog(defs: Vec<AgentDefinition>) -> AgentCatalog {
        AgentCatalog {
            agents: defs.into_iter().map(|d| (d.id.clone(), d)).collect(),
            ..AgentCatalog::default()
        }
    }

    fn team() -> AgentCatalog {
        catalog(vec![
            def("a", &["b"], ProviderKind::Model),
            def("b", &["a", "c"], ProviderKind::Model),
            def("c", &["d"], ProviderKind::Model),
            def("d", &["e"], ProviderKind::Model),
            def("e", &[], ProviderKind::Model),
            def("ext", &[], ProviderKind::Acp),
        ])
    }

    fn chain(ids: &[&str]) -> ExecutionChain {
        ExecutionChain(ids.iter().map(|s| (*s).to_owned()).collect())
    }

    fn check(c: &AgentCatalog, ch: &[&str], to: &str) -> Result<(), PolicyReason> {
        let ch = chain(ch);
        let vis = visible_from(c, &ch);
        admit(c, &ch, to, &vis, 4, |id| {
            c.get(id)
                .is_some_and(|d| d.provider.kind() == ProviderKind::Model)
        })
        .map_err(|r| r.reason)
    }

    #[test]
    fn refusals_name_what_is_wrong_in_order() {
        let c = team();
        assert_eq!(check(&c, &["supervisor"], "a"), Ok(()));
        assert_eq!(
            check(&c, &["supervisor"], "ghost"),
            Err(PolicyReason::UnknownAgent)
        );
        assert_eq!(
            check(&c, &["supervisor", "a"], "c"),
            Err(PolicyReason::NotVisible)
        );
        assert_eq!(
            check(&c, &["supervisor", "a", "b"], "a"),
            Err(PolicyReason::Cycle)
        );
        assert_eq!(
            check(&c, &["supervisor", "a", "b", "c", "d"], "e"),
            Err(PolicyReason::Depth)
        );
        assert_eq!(check(&c, &["supervisor", "a", "b", "c"], "d"), Ok(()));
        assert_eq!(
            check(&c, &["supervisor"], "ext"),
            Err(PolicyReason::ProviderUnavailable)
        );
        let refusal = admit(
            &c,
            &chain(&["supervisor", "a", "b"]),
            "a",
            &Visibility::Any,
            4,
            |_| true,
        )
        .unwrap_err();
        assert!(
            refusal.message.contains("supervisor → a → b"),
            "{}",
            refusal.message
        );
    }

    #[test]
    fn a_defined_supervisor_with_workers_sees_only_them() {
        let mut c = team();
        c.agents
            .insert("boss".into(), def("boss", &["a"], ProviderKind::Model));
        assert_eq!(
            visible_from(&c, &chain(&["boss"])),
            Visibility::Only(vec!["a".into()])
        );
        c.agents
            .insert("lazy".into(), def("lazy", &[], ProviderKind::Model));
        assert_eq!(visible_from(&c, &chain(&["lazy"])), Visibility::Any);
        assert_eq!(visible_from(&c, &chain(&["supervisor"])), Visibility::Any);
        // A configured supervisor that did not load sees nobody: no widening into the
        // built-in one.
        assert_eq!(
            visible_from(&c, &chain(&["gone"])),
            Visibility::Only(Vec::new())
        );
        assert_eq!(
            Visibility::Any.ids(&c, Some("boss")),
            ["a", "b", "c", "d", "e", "ext", "lazy"]
        );
    }

    fn bound(kind: ProviderKind, psid: &str) -> AgentBinding {
        AgentBinding {
            session_id: SessionId::new(),
            agent_id: "a".into(),
            provider: kind,
            provider_session_id: psid.into(),
            created_ms: 1,
            updated_ms: 1,
        }
    }

    #[test]
    fn a_binding_is_used_resumed_opened_or_waited_for() {
        let m = ProviderKind::Model;
        let s = BindingScope::Session;
        let empty = BindingEntry::default();
        assert_eq!(
            bind_plan(&empty, s, true, m),
            BindPlan::Open {
                previous: None,
                alert: None
            }
        );
        let stored = BindingEntry {
            stored: Some(bound(m, "c1")),
            ..BindingEntry::default()
        };
        assert_eq!(
            bind_plan(&stored, s, true, m),
            BindPlan::Resume {
                provider_session_id: "c1".into(),
                created_ms: 1
            }
        );
        assert_eq!(
            bind_plan(&stored, s, false, m),
            BindPlan::Open {
                previous: Some("c1".into()),
                alert: None
            }
        );
        assert!(matches!(
            bind_plan(&stored, s, true, ProviderKind::Acp),
            BindPlan::Open {
                previous: Some(_),
                alert: Some(_)
            }
        ));
        let live = BindingEntry {
            live: Some("c2".into()),
            ..stored.clone()
        };
        assert_eq!(bind_plan(&live, s, true, m), BindPlan::Use("c2".into()));
        let opening = BindingEntry {
            opening: true,
            ..live
        };
        assert_eq!(bind_plan(&opening, s, true, m), BindPlan::Wait);
        assert_eq!(
            bind_plan(&opening, BindingScope::Dispatch, true, m),
            BindPlan::Fresh
        );
    }

    fn arb_chain() -> impl Strategy<Value = Vec<&'static str>> {
        proptest::collection::vec(
            prop::sample::select(vec!["a", "b", "c", "d", "e", "ext"]),
            0..7,
        )
    }

    proptest! {
        /// Whatever the chain, an admitted dispatch never repeats an agent and never nests
        /// deeper than the limit.
        #[test]
        fn an_admitted_dispatch_is_acyclic_and_shallow(
            tail in arb_chain(),
            to in prop::sample::select(vec!["a", "b", "c", "d", "e", "ext", "ghost"]),
            max in 0usize..6,
        ) {
            let c = team();
            let mut ids = vec!["supervisor"];
            ids.extend(tail);
            let ch = chain(&ids);
            if admit(&c, &ch, to, &Visibility::Any, max, |_| true).is_ok() {
                let next = ch.then(to);
                prop_assert!(!ch.contains(to), "a cycle was admitted: {}", next);
                prop_assert!(next.depth() <= max, "too deep: {}", next);
                prop_assert!(c.get(to).is_some());
            }
        }
    }

    #[test]
    fn only_an_in_process_agent_runs_on_its_dispatchers_slot() {
        assert!(slot_lent(ProviderKind::Model));
        assert!(!slot_lent(ProviderKind::Acp));
        assert!(!slot_lent(ProviderKind::A2a));
    }

    #[test]
    fn only_an_in_process_agent_in_its_known_live_conversation_goes_direct() {
        let used = BindPlan::Use("c1".into());
        let direct = dispatch_path;
        assert_eq!(
            direct(ProviderKind::Model, Some(&used), Some(("c1", true))),
            DispatchPath::Direct
        );
        // Its actor stopped (passivated, restarted): through the Session, which reactivates it.
        assert_eq!(
            direct(ProviderKind::Model, Some(&used), Some(("c1", false))),
            DispatchPath::Worker
        );
        // Bound elsewhere since, or not known yet.
        assert_eq!(
            direct(ProviderKind::Model, Some(&used), Some(("c0", true))),
            DispatchPath::Worker
        );
        assert_eq!(
            direct(ProviderKind::Model, Some(&used), None),
            DispatchPath::Worker
        );
        for plan in [
            BindPlan::Fresh,
            BindPlan::Open {
                previous: None,
                alert: None,
            },
            BindPlan::Resume {
                provider_session_id: "c1".into(),
                created_ms: 0,
            },
        ] {
            assert_eq!(
                direct(ProviderKind::Model, Some(&plan), Some(("c1", true))),
                DispatchPath::Worker
            );
        }
        assert_eq!(
            direct(ProviderKind::Model, None, Some(("c1", true))),
            DispatchPath::Worker
        );
        for kind in [ProviderKind::Acp, ProviderKind::A2a] {
            assert_eq!(
                direct(kind, Some(&used), Some(("c1", true))),
                DispatchPath::Worker
            );
        }
    }

    #[test]
    fn the_lease_timer_is_armed_for_the_earliest_deadline_only() {
        assert!(arm_lease_timer(None, 500));
        assert!(arm_lease_timer(Some(600), 500));
        assert!(!arm_lease_timer(Some(500), 500));
        assert!(!arm_lease_timer(Some(400), 500));
    }
}
