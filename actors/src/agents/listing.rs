//! What a listing shows of the agents (`troupe agents list`, `agents.list`), and which
//! agent is the supervisor. Pure functions of the catalog.

use troupe_proto::agent::{
    AgentBinding, AgentCatalog, AgentDefinition, AgentHealth, AgentInfo, ProviderKind,
};

/// The id the built-in supervisor goes by in execution chains and listings.
pub const BUILTIN_SUPERVISOR: &str = troupe_proto::agent::BUILTIN_SUPERVISOR_ID;

/// A supervisor the configuration means that cannot route: its id and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    /// The id of the supervisor meant (it stays the origin of routing chains).
    pub id: String,
    pub why: String,
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// The agent that routes the session's input: `configured` (`[agents] supervisor`), else
/// the first agent (by id) whose role is `supervisor`; `Ok(None)`: the built-in one. A
/// supervisor that is not a loaded model agent is an error saying which and why: a configured
/// one that did not load or is of another kind, a role-chosen one of another kind, or a file
/// whose role is `supervisor` that did not load and sorts before every loaded one (it was
/// meant to be the supervisor; the built-in one must not stand in for it). So is one with an
/// `output` schema (A8): a supervisor's answers are its routing decisions and direct
/// replies, which no schema checks, and a schema that would not apply must not seem to.
pub fn supervisor_of<'a>(
    catalog: &'a AgentCatalog,
    configured: Option<&str>,
) -> Result<Option<&'a AgentDefinition>, Unusable> {
    let chosen = match configured {
        Some(id) => Some(catalog.get(id).ok_or_else(|| Unusable {
            id: id.to_owned(),
            why: format!("[agents] supervisor names `{id}`, which is not a loaded agent"),
        })?),
        None => {
            let loaded = catalog.agents.values().find(|d| d.role == "supervisor");
            let unloaded = catalog.unloaded_supervisors.iter().find(|id| {
                !catalog.agents.contains_key(id.as_str())
                    && loaded.is_none_or(|d| id.as_str() < d.id.as_str())
            });
            if let Some(id) = unloaded {
                return Err(Unusable {
                    id: id.clone(),
                    why: format!(
                        "the agent `{id}`, whose role is `supervisor`, did not load (its file, or a worker's, is broken)"
                    ),
                });
            }
            loaded
        }
    };
    match chosen {
        Some(d) if d.provider.kind() != ProviderKind::Model => Err(Unusable {
            id: d.id.clone(),
            why: format!(
                "the supervisor `{}` must be a model agent (its decision is a tool call of its model), not {}",
                d.id,
                d.provider.kind()
            ),
        }),
        Some(d) if d.output.is_some() => Err(Unusable {
            id: d.id.clone(),
            why: format!(
                "the supervisor `{}` must not have `output`: a supervisor's routing and direct \
                 replies are not checked against a schema (give the schema to the agent it \
                 dispatches to)",
                d.id
            ),
        }),
        other => Ok(other),
    }
}

/// Whether `unusable` is about the supervisor's own `output` (an error of its file).
pub fn refused_for_output(catalog: &AgentCatalog, unusable: &Unusable) -> bool {
    catalog
        .get(&unusable.id)
        .is_some_and(|d| d.provider.kind() == ProviderKind::Model && d.output.is_some())
}

/// One listing line per agent, sorted by id: its health as `health` says and its bindings
/// among `bindings`.
pub fn agent_infos(
    catalog: &AgentCatalog,
    health: impl Fn(&AgentDefinition) -> AgentHealth,
    bindings: &[AgentBinding],
    supervisor: Option<&str>,
) -> Vec<AgentInfo> {
    catalog
        .agents
        .values()
        .map(|d| AgentInfo {
            id: d.id.clone(),
            role: d.role.clone(),
            provider: d.provider.kind(),
            health: health(d),
            bindings: bindings
                .iter()
                .filter(|b| b.agent_id == d.id)
                .cloned()
                .collect(),
            workers: d.workers.clone(),
            supervisor: supervisor == Some(d.id.as_str()),
            version: catalog.versions.get(&d.id).cloned(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::SessionId;
    use troupe_proto::agent::{HealthStatus, ProviderSpec};

    fn def(id: &str, role: &str, provider: ProviderSpec) -> AgentDefinition {
        AgentDefinition {
            id: id.into(),
            role: role.into(),
            description: None,
            provider,
            session: Default::default(),
            tools: Default::default(),
            workers: Vec::new(),
            governance: None,
            output: None,
        }
    }

    fn model() -> ProviderSpec {
        ProviderSpec::Model {
            model: None,
            provider: None,
            base_url: None,
            instructions: None,
        }
    }

    fn acp() -> ProviderSpec {
        ProviderSpec::Acp {
            command: "x".into(),
            args: Vec::new(),
            env: Default::default(),
            cwd: None,
        }
    }

    fn catalog(defs: Vec<AgentDefinition>) -> AgentCatalog {
        AgentCatalog {
            agents: defs.into_iter().map(|d| (d.id.clone(), d)).collect(),
            ..AgentCatalog::default()
        }
    }

    #[test]
    fn the_supervisor_is_named_or_found_by_role_and_must_be_a_model_agent() {
        let c = catalog(vec![
            def("boss", "supervisor", model()),
            def("coder", "executor", model()),
            def("ext", "supervisor", acp()),
        ]);
        assert_eq!(supervisor_of(&c, None).unwrap().unwrap().id, "boss");
        assert_eq!(
            supervisor_of(&c, Some("coder")).unwrap().unwrap().id,
            "coder"
        );
        let ghost = supervisor_of(&c, Some("ghost")).unwrap_err();
        assert_eq!(ghost.id, "ghost");
        assert!(ghost.why.contains("ghost"), "{ghost}");
        let ext = supervisor_of(&c, Some("ext")).unwrap_err();
        assert_eq!(ext.id, "ext");
        assert!(ext.why.contains("model agent"), "{ext}");
        let none = catalog(vec![def("coder", "executor", model())]);
        assert!(supervisor_of(&none, None).unwrap().is_none());
    }

    /// An output schema on the supervisor would never be applied (its routing and direct
    /// replies are not an agent's answers): it is refused, whether the supervisor is
    /// configured or chosen by role, and the agent stays usable as a worker.
    #[test]
    fn a_supervisor_with_an_output_schema_is_refused() {
        let shaped = |id: &str, role: &str| AgentDefinition {
            output: Some(troupe_proto::agent::OutputSpec {
                schema: serde_json::json!({"type": "object"}),
                on_failure: Default::default(),
                max_retries: 2,
            }),
            ..def(id, role, model())
        };
        let c = catalog(vec![
            shaped("boss", "supervisor"),
            shaped("profiler", "executor"),
        ]);
        let by_role = supervisor_of(&c, None).unwrap_err();
        assert_eq!(by_role.id, "boss");
        assert!(by_role.why.contains("must not have `output`"), "{by_role}");
        assert!(refused_for_output(&c, &by_role));
        let configured = supervisor_of(&c, Some("profiler")).unwrap_err();
        assert_eq!(configured.id, "profiler");
        assert!(refused_for_output(&c, &configured));
        assert!(!refused_for_output(
            &c,
            &supervisor_of(&c, Some("ghost")).unwrap_err()
        ));
    }

    #[test]
    fn a_supervisor_by_role_that_did_not_load_is_not_replaced() {
        // Alone: the built-in supervisor does not stand in for it.
        let mut c = catalog(vec![def("coder", "executor", model())]);
        c.unloaded_supervisors = vec!["boss".into()];
        let boss = supervisor_of(&c, None).unwrap_err();
        assert_eq!(boss.id, "boss");
        assert!(boss.why.contains("did not load"), "{boss}");
        // Nor does a loaded one that sorts after it ("the first by id" was the broken one).
        c.agents
            .insert("chief".into(), def("chief", "supervisor", model()));
        assert_eq!(supervisor_of(&c, None).unwrap_err().id, "boss");
        // One that sorts before it is the supervisor, as it would be with both loaded.
        c.agents
            .insert("aide".into(), def("aide", "supervisor", model()));
        assert_eq!(supervisor_of(&c, None).unwrap().unwrap().id, "aide");
        // A configured supervisor decides alone.
        assert_eq!(
            supervisor_of(&c, Some("coder")).unwrap().unwrap().id,
            "coder"
        );
        // A broken duplicate of a loaded id is not missing: the loaded file stands.
        let mut dup = catalog(vec![def("boss", "supervisor", model())]);
        dup.unloaded_supervisors = vec!["boss".into()];
        assert_eq!(supervisor_of(&dup, None).unwrap().unwrap().id, "boss");
    }

    #[test]
    fn a_listing_line_has_its_health_and_only_its_bindings() {
        let c = catalog(vec![def("a", "x", model()), def("b", "y", acp())]);
        let session_id = SessionId::new();
        let binding = AgentBinding {
            session_id,
            agent_id: "b".into(),
            provider: ProviderKind::Acp,
            provider_session_id: "s1".into(),
            created_ms: 1,
            updated_ms: 2,
        };
        let lines = agent_infos(
            &c,
            |d| match d.provider.kind() {
                ProviderKind::Model => AgentHealth::ok(),
                _ => AgentHealth::unavailable("no provider"),
            },
            std::slice::from_ref(&binding),
            Some("a"),
        );
        assert_eq!(lines.len(), 2);
        assert!(lines[0].supervisor && lines[0].bindings.is_empty());
        assert_eq!(lines[1].health.status, HealthStatus::Unavailable);
        assert_eq!(lines[1].bindings, [binding]);
    }
}
