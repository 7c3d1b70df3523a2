//! The pool's decisions, with no actor and no I/O: which servers a view references, when a
//! connection starts, is reclaimed or restarted, which tools a view sees and whether a call may
//! go through. Every transition returns the [`Effect`]s the actor must carry out (spawn a
//! connect, arm or disarm a timer, close a connection, announce something).
//!
//! Per server:
//!
//! ```text
//!            first reference                   connected + listed
//!   Idle ───────────────────────▶ Connecting ─────────────────────▶ Ready
//!    ▲                              │  ▲   failed, refs > 0           │ closed (died)
//!    │ refs = 0 (idle timeout,      │  └──── Backoff ◀────────────────┘ refs > 0
//!    │ failure or death)            │          │ RestartDue (base · 2^n, capped)
//!    └──────────────────────────────┴──────────┘
//! ```
//!
//! Every phase entered gets a fresh generation; messages from spawned work carry the
//! generation they were started for and are ignored once it is stale, so a late connect, a
//! late death notice or a fired timer never acts on a newer connection.

use super::metrics::{CloseReason, LeftOut};
use crate::ports::{McpConnection, McpServerConfig, McpTool, ToolFailure};
use crate::tools::is_valid_tool_name;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use troupe_proto::{AgentError, ConversationId, ToolSpec};

mod routing;
mod rules;
mod state;

pub use rules::{
    backoff_delay, offered_tools, qualify, root_uris, split_qualified, validate_servers, visible,
};
pub use state::{
    Effect, Live, Phase, PoolSnapshot, Route, RouteTable, ServerSlot, ServerSnapshot, ViewId,
    ViewRecord, ViewScope,
};

/// Every decision of the pool.
pub struct PoolCore {
    servers: BTreeMap<String, ServerSlot>,
    views: HashMap<ViewId, ViewRecord>,
    /// Source of generations, idle epochs and view ids (one counter: all are just unique).
    counter: u64,
    backoff_base: Duration,
    backoff_max: Duration,
}

/// How an allowlist is checked when a view opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// A new allowlist (a conversation opened, its allowlist changed): every entry must be a
    /// configured server's, and of a tool it offers once its tools are known.
    Strict,
    /// An allowlist accepted before, opened again (a restart, a reactivation, a refresh, a new
    /// pool): entries of servers no longer configured, or of tools no longer offered, are
    /// not seen rather than refused.
    AcceptedBefore,
}

impl PoolCore {
    /// A pool of `servers`, all idle. Fails when a name is illegal or repeated.
    pub fn new(
        servers: Vec<McpServerConfig>,
        backoff_base: Duration,
        backoff_max: Duration,
    ) -> Result<Self, AgentError> {
        validate_servers(&servers)?;
        let servers = servers
            .into_iter()
            .map(|config| {
                (
                    config.name.clone(),
                    ServerSlot {
                        config,
                        phase: Phase::Idle,
                        generation: 0,
                        refs: 0,
                        idle_epoch: None,
                        failures: 0,
                        streak: 0,
                    },
                )
            })
            .collect();
        Ok(Self {
            servers,
            views: HashMap::new(),
            counter: 0,
            backoff_base,
            backoff_max,
        })
    }

    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// Opens a view with a new allowlist ([`Check::Strict`]).
    #[cfg(test)]
    pub fn open_view(
        &mut self,
        conversation_id: ConversationId,
        allowlist: Option<Vec<String>>,
    ) -> Result<(ViewId, Vec<Effect>), AgentError> {
        self.open_view_checked(conversation_id, allowlist, Check::Strict)
    }

    /// Opens a view: checks its allowlist as `check` says, takes a reference on every server
    /// it can see (starting those that are idle). Nothing waits for a connection.
    pub fn open_view_checked(
        &mut self,
        conversation_id: ConversationId,
        allowlist: Option<Vec<String>>,
        check: Check,
    ) -> Result<(ViewId, Vec<Effect>), AgentError> {
        let (allowlist, servers) = match allowlist {
            None => (None, self.servers.keys().cloned().collect()),
            Some(list) => {
                let servers = match check {
                    Check::Strict => self.check_allowlist(&list)?,
                    // Accepted before: the servers it names that are configured now.
                    Check::AcceptedBefore => list
                        .iter()
                        .filter_map(|entry| split_qualified(entry))
                        .map(|(server, _)| server)
                        .filter(|server| self.servers.contains_key(*server))
                        .map(str::to_owned)
                        .collect(),
                };
                (Some(list.into_iter().collect()), servers)
            }
        };
        let id = ViewId(self.next());
        let mut fx = Vec::new();
        for server in &servers {
            self.acquire(server, &mut fx);
        }
        self.views.insert(
            id,
            ViewRecord {
                conversation_id,
                allowlist,
                servers,
            },
        );
        Ok((id, fx))
    }

    /// Drops a view's references. `None` when the view is unknown (already released).
    pub fn release_view(&mut self, id: ViewId) -> Option<(ConversationId, Vec<Effect>)> {
        let view = self.views.remove(&id)?;
        let mut fx = Vec::new();
        for server in &view.servers {
            self.release(server, &mut fx);
        }
        Some((view.conversation_id, fx))
    }

    /// Checks a new allowlist against the configuration: every entry must be a qualified
    /// `server__tool` name of a configured server, and of a tool that server offers once its
    /// tools are known (entries of servers still starting are accepted). Returns the servers
    /// it names; the error names every bad entry.
    pub fn check_allowlist(&self, list: &[String]) -> Result<BTreeSet<String>, AgentError> {
        let mut servers = BTreeSet::new();
        let mut problems = Vec::new();
        for entry in list {
            let Some((server, tool)) = split_qualified(entry).filter(|_| is_valid_tool_name(entry))
            else {
                problems.push(format!("`{entry}` (not a qualified `server__tool` name)"));
                continue;
            };
            let Some(slot) = self.servers.get(server) else {
                problems.push(format!(
                    "`{entry}` (no MCP server `{server}` is configured)"
                ));
                continue;
            };
            if let Phase::Ready(live) = &slot.phase
                && !live.tools.contains_key(tool)
            {
                problems.push(match live.left_out.get(tool) {
                    Some(LeftOut::RequiresTask) => {
                        format!("`{entry}` (needs MCP task augmentation, which is not supported)")
                    }
                    _ => format!("`{entry}` (server `{server}` has no tool `{tool}`)"),
                });
                continue;
            }
            servers.insert(server.to_owned());
        }
        if problems.is_empty() {
            Ok(servers)
        } else {
            Err(AgentError::invalid(format!(
                "MCP tool allowlist rejected: {}",
                problems.join(", ")
            )))
        }
    }

    fn acquire(&mut self, server: &str, fx: &mut Vec<Effect>) {
        let generation = self.next();
        let Some(slot) = self.servers.get_mut(server) else {
            return;
        };
        slot.refs += 1;
        if slot.idle_epoch.take().is_some() {
            fx.push(Effect::CancelTimer {
                server: server.to_owned(),
            });
        }
        if matches!(slot.phase, Phase::Idle) {
            slot.phase = Phase::Connecting;
            slot.generation = generation;
            fx.push(Effect::Connect {
                server: server.to_owned(),
                generation,
                config: slot.config.clone(),
            });
        }
    }

    fn release(&mut self, server: &str, fx: &mut Vec<Effect>) {
        let epoch = self.next();
        let Some(slot) = self.servers.get_mut(server) else {
            return;
        };
        slot.refs = slot.refs.saturating_sub(1);
        if slot.refs > 0 {
            return;
        }
        match slot.phase {
            Phase::Connecting | Phase::Ready(_) => {
                slot.idle_epoch = Some(epoch);
                fx.push(Effect::ScheduleIdle {
                    server: server.to_owned(),
                    epoch,
                });
            }
            // Nobody wants it restarted any more.
            Phase::Backoff => {
                slot.phase = Phase::Idle;
                slot.generation = epoch;
                fx.push(Effect::CancelTimer {
                    server: server.to_owned(),
                });
            }
            Phase::Idle => {}
        }
    }

    /// The idle timer of `server` fired.
    pub fn idle_timeout(&mut self, server: &str, epoch: u64, now: Instant) -> Vec<Effect> {
        let generation = self.next();
        let stable = self.backoff_max;
        let Some(slot) = self.servers.get_mut(server) else {
            return Vec::new();
        };
        if slot.idle_epoch != Some(epoch) || slot.refs > 0 {
            return Vec::new(); // reopened meanwhile, or an older timer
        }
        slot.idle_epoch = None;
        slot.generation = generation;
        match std::mem::replace(&mut slot.phase, Phase::Idle) {
            Phase::Ready(live) => {
                live.closed.cancel();
                // Up long enough before nobody needed it: the run of failures is over.
                if now.saturating_duration_since(live.up_since) >= stable {
                    slot.streak = 0;
                }
                vec![Effect::Close {
                    server: server.to_owned(),
                    conn: live.conn,
                    reason: CloseReason::Idle,
                }]
            }
            // A connect still under way: its result is now stale and gets closed on arrival.
            _ => Vec::new(),
        }
    }

    /// A connect attempt succeeded and listed `tools`, at `now`.
    pub fn connected(
        &mut self,
        server: &str,
        generation: u64,
        conn: Arc<dyn McpConnection>,
        tools: Vec<McpTool>,
        now: Instant,
    ) -> Vec<Effect> {
        let Some(slot) = self.servers.get_mut(server) else {
            return vec![stale_close(server, conn)];
        };
        if slot.generation != generation || !matches!(slot.phase, Phase::Connecting) {
            return vec![stale_close(server, conn)];
        }
        let (tools, left_out) = offered_tools(server, tools);
        let count = tools.len();
        slot.phase = Phase::Ready(Live {
            conn,
            tools,
            left_out,
            closed: CancellationToken::new(),
            refresh_asked: 0,
            refresh_applied: 0,
            up_since: now,
        });
        slot.failures = 0;
        let mut fx = vec![Effect::Ready {
            server: server.to_owned(),
            tools: count,
        }];
        fx.extend(self.unknown_allowlisted(server));
        fx
    }

    /// The allowlist entries of `server` that its views name but it does not offer, once its
    /// tools are known: one effect per view with any (C5). Entries of a server still starting
    /// were accepted at open; this is where they are found wanting.
    pub fn unknown_allowlisted(&self, server: &str) -> Vec<Effect> {
        let Some(Phase::Ready(live)) = self.servers.get(server).map(|s| &s.phase) else {
            return Vec::new();
        };
        self.views
            .values()
            .filter_map(|view| {
                let entries: Vec<String> = view
                    .allowlist
                    .iter()
                    .flatten()
                    .filter(|entry| {
                        split_qualified(entry)
                            .is_some_and(|(s, tool)| s == server && !live.tools.contains_key(tool))
                    })
                    .cloned()
                    .collect();
                (!entries.is_empty()).then(|| Effect::AllowlistUnknown {
                    conversation_id: view.conversation_id,
                    server: server.to_owned(),
                    entries,
                })
            })
            .collect()
    }

    /// A connect attempt failed.
    pub fn connect_failed(&mut self, server: &str, generation: u64, reason: String) -> Vec<Effect> {
        match self.servers.get(server) {
            Some(slot)
                if slot.generation == generation && matches!(slot.phase, Phase::Connecting) =>
            {
                self.fail(server, reason)
            }
            _ => Vec::new(),
        }
    }

    /// The connection of `generation` ended (the server died or the stream closed) at `now`.
    /// A connection that stayed up for the backoff's maximum resets the backoff; one that
    /// died sooner counts as one more failure in a row.
    pub fn closed(
        &mut self,
        server: &str,
        generation: u64,
        reason: String,
        now: Instant,
    ) -> Vec<Effect> {
        let stable = self.backoff_max;
        let Some(slot) = self.servers.get_mut(server) else {
            return Vec::new();
        };
        if slot.generation != generation {
            return Vec::new();
        }
        match std::mem::replace(&mut slot.phase, Phase::Idle) {
            Phase::Ready(live) => {
                live.closed.cancel();
                if now.saturating_duration_since(live.up_since) >= stable {
                    slot.streak = 0;
                }
                let mut fx = vec![Effect::Close {
                    server: server.to_owned(),
                    conn: live.conn,
                    reason: CloseReason::Died,
                }];
                fx.extend(self.fail(server, reason));
                fx
            }
            Phase::Connecting => {
                slot.phase = Phase::Connecting;
                self.fail(server, reason)
            }
            other => {
                slot.phase = other;
                Vec::new()
            }
        }
    }

    /// Records a failure: a restart after the backoff when views still reference the
    /// server, else idle.
    fn fail(&mut self, server: &str, reason: String) -> Vec<Effect> {
        let generation = self.next();
        let (base, max) = (self.backoff_base, self.backoff_max);
        let Some(slot) = self.servers.get_mut(server) else {
            return Vec::new();
        };
        slot.failures = slot.failures.saturating_add(1);
        slot.streak = slot.streak.saturating_add(1);
        slot.generation = generation;
        let mut fx = Vec::new();
        if slot.refs > 0 {
            let delay = backoff_delay(base, max, slot.streak - 1);
            slot.phase = Phase::Backoff;
            fx.push(Effect::ScheduleRestart {
                server: server.to_owned(),
                generation,
                delay,
            });
            fx.push(Effect::Failed {
                server: server.to_owned(),
                reason,
                retry_in: Some(delay),
            });
        } else {
            slot.phase = Phase::Idle;
            if slot.idle_epoch.take().is_some() {
                fx.push(Effect::CancelTimer {
                    server: server.to_owned(),
                });
            }
            fx.push(Effect::Failed {
                server: server.to_owned(),
                reason,
                retry_in: None,
            });
        }
        fx
    }

    /// The restart timer fired.
    pub fn restart_due(&mut self, server: &str, generation: u64) -> Vec<Effect> {
        let next = self.next();
        let Some(slot) = self.servers.get_mut(server) else {
            return Vec::new();
        };
        if slot.generation != generation || !matches!(slot.phase, Phase::Backoff) || slot.refs == 0
        {
            return Vec::new();
        }
        slot.phase = Phase::Connecting;
        slot.generation = next;
        vec![Effect::Connect {
            server: server.to_owned(),
            generation: next,
            config: slot.config.clone(),
        }]
    }

    /// The server said its tools changed.
    pub fn tools_changed(&mut self, server: &str, generation: u64) -> Vec<Effect> {
        match self.servers.get_mut(server) {
            Some(ServerSlot {
                phase: Phase::Ready(live),
                generation: g,
                ..
            }) if *g == generation => {
                live.refresh_asked += 1;
                vec![Effect::Refresh {
                    server: server.to_owned(),
                    generation,
                    seq: live.refresh_asked,
                    conn: live.conn.clone(),
                }]
            }
            _ => Vec::new(),
        }
    }

    /// A view asked for its tools to be read again: its ready servers are listed again, its
    /// servers in backoff start now. Nothing for an unknown view.
    pub fn refresh(&mut self, id: ViewId) -> Vec<Effect> {
        let Some(view) = self.views.get(&id) else {
            return Vec::new();
        };
        let servers: Vec<String> = view.servers.iter().cloned().collect();
        let mut fx = Vec::new();
        for server in servers {
            let Some(slot) = self.servers.get(&server) else {
                continue;
            };
            let generation = slot.generation;
            match slot.phase {
                Phase::Ready(_) => fx.extend(self.tools_changed(&server, generation)),
                Phase::Backoff => fx.extend(self.restart_due(&server, generation)),
                Phase::Idle | Phase::Connecting => {}
            }
        }
        fx
    }

    /// A refresh listed `tools`. Returns `Some(count)` when the list was replaced.
    pub fn tools_listed(
        &mut self,
        server: &str,
        generation: u64,
        seq: u64,
        tools: Vec<McpTool>,
    ) -> Option<usize> {
        match self.servers.get_mut(server) {
            Some(ServerSlot {
                phase: Phase::Ready(live),
                generation: g,
                ..
            }) if *g == generation && seq > live.refresh_applied => {
                let (tools, left_out) = offered_tools(server, tools);
                live.tools = tools;
                live.left_out = left_out;
                live.refresh_applied = seq;
                Some(live.tools.len())
            }
            _ => None,
        }
    }

    /// Stops everything: every live connection is to be closed.
    pub fn shutdown(&mut self) -> Vec<Effect> {
        let mut fx = Vec::new();
        let mut generation = self.counter;
        for (name, slot) in &mut self.servers {
            generation += 1;
            slot.generation = generation;
            slot.idle_epoch = None;
            if let Phase::Ready(live) = std::mem::replace(&mut slot.phase, Phase::Idle) {
                live.closed.cancel();
                fx.push(Effect::Close {
                    server: name.clone(),
                    conn: live.conn,
                    reason: CloseReason::Shutdown,
                });
            }
        }
        self.counter = generation;
        fx
    }

    /// Live connections.
    #[cfg(test)]
    pub fn live_connections(&self) -> usize {
        self.servers
            .values()
            .filter(|s| matches!(s.phase, Phase::Ready(_)))
            .count()
    }

    /// Names of the servers with a live connection.
    pub fn connected_servers(&self) -> impl Iterator<Item = &str> {
        self.servers
            .iter()
            .filter(|(_, s)| matches!(s.phase, Phase::Ready(_)))
            .map(|(name, _)| name.as_str())
    }

    pub fn views_len(&self) -> usize {
        self.views.len()
    }

    #[cfg(test)]
    pub fn server(&self, name: &str) -> Option<&ServerSlot> {
        self.servers.get(name)
    }

    pub fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            servers: self
                .servers
                .iter()
                .map(|(name, slot)| {
                    let (tools, process_id) = match &slot.phase {
                        Phase::Ready(live) => (
                            live.tools.keys().map(|t| qualify(name, t)).collect(),
                            live.conn.process_id(),
                        ),
                        _ => (Vec::new(), None),
                    };
                    let mut tools: Vec<String> = tools;
                    tools.sort();
                    ServerSnapshot {
                        name: name.clone(),
                        phase: slot.phase.name(),
                        refs: slot.refs,
                        tools,
                        failures: slot.failures,
                        process_id,
                    }
                })
                .collect(),
            views: self.views.len(),
            // The call registry is the pool's, not this core's: the pool fills it in.
            calls_held: 0,
        }
    }
}

fn stale_close(server: &str, conn: Arc<dyn McpConnection>) -> Effect {
    Effect::Close {
        server: server.to_owned(),
        conn,
        reason: CloseReason::Stale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::{McpCall, McpTransport, ToolFailureKind};
    use troupe_proto::ToolOutput;

    struct NullConn;

    #[async_trait::async_trait]
    impl McpConnection for NullConn {
        async fn list_tools(&self) -> Result<Vec<McpTool>, AgentError> {
            Ok(Vec::new())
        }
        async fn call_tool(&self, _call: McpCall<'_>) -> Result<ToolOutput, AgentError> {
            Err(AgentError::internal("null"))
        }
        fn process_id(&self) -> Option<u32> {
            None
        }
        async fn close(&self) {}
    }

    fn config(name: &str) -> McpServerConfig {
        McpServerConfig {
            name: name.to_owned(),
            transport: McpTransport::StreamableHttp {
                url: format!("http://127.0.0.1/{name}"),
                headers: Default::default(),
                oauth: None,
            },
        }
    }

    fn tool(name: &str) -> McpTool {
        McpTool {
            name: name.to_owned(),
            description: format!("{name} tool"),
            input_schema: empty_schema(),
            requires_task: false,
        }
    }

    fn core(names: &[&str]) -> PoolCore {
        PoolCore::new(
            names.iter().map(|n| config(n)).collect(),
            Duration::from_secs(1),
            Duration::from_secs(8),
        )
        .unwrap()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Completes the pending connect of `server` with `tools`.
    fn connect(core: &mut PoolCore, server: &str, tools: &[&str]) -> Vec<Effect> {
        let generation = core.server(server).unwrap().generation;
        core.connected(
            server,
            generation,
            Arc::new(NullConn),
            tools.iter().map(|t| tool(t)).collect(),
            Instant::now(),
        )
    }

    fn empty_schema() -> troupe_proto::Json {
        troupe_proto::Json(serde_json::json!({"type": "object", "properties": {}}))
    }

    fn names(fx: &[Effect]) -> Vec<String> {
        fx.iter().map(|e| format!("{e:?}")).collect()
    }

    #[test]
    fn server_names_are_validated() {
        let ok = [config("fs"), config("git-hub"), config("a_b")];
        assert!(validate_servers(&ok).is_ok());
        let bad = [
            config("a__b"),
            config("x"),
            config("x"),
            config("bad name"),
            config("end_"),
            config(""),
        ];
        let err = validate_servers(&bad).unwrap_err().to_string();
        for needle in [
            "`a__b` (must not contain `__`)",
            "`x` (configured twice)",
            "`bad name`",
            "`end_`",
            "``",
        ] {
            assert!(err.contains(needle), "{needle} missing from {err}");
        }
    }

    #[test]
    fn qualified_names_split_at_the_first_double_underscore() {
        assert_eq!(split_qualified("fs__read"), Some(("fs", "read")));
        assert_eq!(split_qualified("fs__read__all"), Some(("fs", "read__all")));
        assert_eq!(split_qualified("fs___x"), Some(("fs", "_x")));
        assert_eq!(split_qualified("fs"), None);
        assert_eq!(split_qualified("__x"), None);
        assert_eq!(split_qualified("fs__"), None);
    }

    #[test]
    fn backoff_doubles_up_to_the_max() {
        let base = Duration::from_millis(500);
        let max = Duration::from_secs(5);
        let schedule: Vec<u64> = (0..8)
            .map(|n| backoff_delay(base, max, n).as_millis() as u64)
            .collect();
        assert_eq!(schedule, [500, 1000, 2000, 4000, 5000, 5000, 5000, 5000]);
        assert_eq!(backoff_delay(base, max, 400), max);
    }

    #[test]
    fn the_first_reference_connects_and_later_ones_share() {
        let mut core = core(&["a", "b"]);
        let c = ConversationId::new();
        let (_, fx) = core.open_view(c, None).unwrap();
        assert_eq!(names(&fx).len(), 2);
        assert!(matches!(fx[0], Effect::Connect { .. }));
        for _ in 0..10 {
            let (_, fx) = core.open_view(ConversationId::new(), None).unwrap();
            assert!(fx.is_empty(), "{fx:?}");
        }
        assert_eq!(core.server("a").unwrap().refs, 11);
        // A view limited to `b` references only `b`.
        let (_, fx) = core
            .open_view(ConversationId::new(), Some(strings(&["b__x"])))
            .unwrap();
        assert!(fx.is_empty());
        assert_eq!(
            (
                core.server("a").unwrap().refs,
                core.server("b").unwrap().refs
            ),
            (11, 12)
        );
    }

    #[test]
    fn the_last_release_arms_the_reclaim_and_a_reopen_disarms_it() {
        let mut core = core(&["a"]);
        let (v, _) = core.open_view(ConversationId::new(), None).unwrap();
        connect(&mut core, "a", &["t"]);
        let (_, fx) = core.release_view(v).unwrap();
        let Some(Effect::ScheduleIdle { epoch, .. }) = fx.first() else {
            panic!("expected a reclaim, got {fx:?}");
        };
        let epoch = *epoch;
        assert!(core.release_view(v).is_none(), "release is idempotent");
        // Reopened before the timer: disarmed, and the old timer does nothing.
        let (v2, fx) = core.open_view(ConversationId::new(), None).unwrap();
        assert_eq!(names(&fx), ["CancelTimer(a)"]);
        assert!(core.idle_timeout("a", epoch, Instant::now()).is_empty());
        assert_eq!(core.server("a").unwrap().phase.name(), "ready");
        // Released again: its own timer reclaims it.
        let (_, fx) = core.release_view(v2).unwrap();
        let Some(Effect::ScheduleIdle { epoch, .. }) = fx.first() else {
            panic!("expected a reclaim, got {fx:?}");
        };
        let fx = core.idle_timeout("a", *epoch, Instant::now());
        assert_eq!(names(&fx), ["Close(a, Idle)"]);
        assert_eq!(core.server("a").unwrap().phase.name(), "idle");
        // The next view connects again.
        let (_, fx) = core.open_view(ConversationId::new(), None).unwrap();
        assert!(matches!(fx[..], [Effect::Connect { .. }]));
    }

    #[test]
    fn a_reclaim_during_connect_makes_the_connect_stale() {
        let mut core = core(&["a"]);
        let (v, _) = core.open_view(ConversationId::new(), None).unwrap();
        let generation = core.server("a").unwrap().generation;
        let (_, fx) = core.release_view(v).unwrap();
        let Some(Effect::ScheduleIdle { epoch, .. }) = fx.first() else {
            panic!("{fx:?}");
        };
        assert!(core.idle_timeout("a", *epoch, Instant::now()).is_empty());
        let fx = core.connected(
            "a",
            generation,
            Arc::new(NullConn),
            vec![tool("t")],
            Instant::now(),
        );
        assert_eq!(names(&fx), ["Close(a, Stale)"]);
        assert_eq!(core.server("a").unwrap().phase.name(), "idle");
    }

    #[test]
    fn deaths_back_off_and_a_connection_that_stays_up_resets_the_schedule() {
        let mut core = core(&["a"]);
        core.open_view(ConversationId::new(), None).unwrap();
        connect(&mut core, "a", &["t"]);
        let g = core.server("a").unwrap().generation;
        let fx = core.closed("a", g, "exit 1".into(), Instant::now());
        assert_eq!(
            names(&fx),
            [
                "Close(a, Died)",
                "ScheduleRestart(a, 1s)",
                "Failed(a, Some(1s))"
            ]
        );
        // A stale death report of the same generation does nothing.
        assert!(
            core.closed("a", g, "again".into(), Instant::now())
                .is_empty()
        );
        let mut delays = Vec::new();
        for _ in 0..5 {
            let g = core.server("a").unwrap().generation;
            let fx = core.restart_due("a", g);
            assert!(matches!(fx[..], [Effect::Connect { .. }]));
            let g = core.server("a").unwrap().generation;
            let fx = core.connect_failed("a", g, "refused".into());
            let Some(Effect::ScheduleRestart { delay, .. }) = fx.first() else {
                panic!("{fx:?}");
            };
            delays.push(delay.as_secs());
        }
        assert_eq!(delays, [2, 4, 8, 8, 8]);
        // A connect is reported as a success, but does not reset the schedule by itself.
        let g = core.server("a").unwrap().generation;
        core.restart_due("a", g);
        let up = Instant::now();
        let g = core.server("a").unwrap().generation;
        core.connected("a", g, Arc::new(NullConn), vec![tool("t")], up);
        assert_eq!(core.server("a").unwrap().failures, 0);
        // Up for the backoff's maximum (8s here): the next death restarts at the base.
        let g = core.server("a").unwrap().generation;
        let fx = core.closed("a", g, "exit 1".into(), up + Duration::from_secs(8));
        assert_eq!(names(&fx)[1], "ScheduleRestart(a, 1s)");
    }

    #[test]
    fn a_connection_closed_for_idleness_after_staying_up_ends_the_run_of_failures() {
        let mut core = core(&["a"]);
        let (v, _) = core.open_view(ConversationId::new(), None).unwrap();
        let start = Instant::now();
        for _ in 0..3 {
            let g = core.server("a").unwrap().generation;
            core.connected("a", g, Arc::new(NullConn), vec![tool("t")], start);
            let g = core.server("a").unwrap().generation;
            core.closed("a", g, "exit 1".into(), start);
            let g = core.server("a").unwrap().generation;
            core.restart_due("a", g);
        }
        assert_eq!(core.server("a").unwrap().streak, 3);
        // Up for the backoff's maximum (8s), then closed because nobody used it.
        let g = core.server("a").unwrap().generation;
        core.connected("a", g, Arc::new(NullConn), vec![tool("t")], start);
        let (_, fx) = core.release_view(v).unwrap();
        let Some(Effect::ScheduleIdle { epoch, .. }) = fx.first() else {
            panic!("{fx:?}");
        };
        let up = start + Duration::from_secs(8);
        assert!(matches!(
            core.idle_timeout("a", *epoch, up)[..],
            [Effect::Close { .. }]
        ));
        assert_eq!(core.server("a").unwrap().streak, 0);
        // Used again, it dies at once: restarted after the base delay.
        core.open_view(ConversationId::new(), None).unwrap();
        let g = core.server("a").unwrap().generation;
        core.connected("a", g, Arc::new(NullConn), vec![tool("t")], up);
        let g = core.server("a").unwrap().generation;
        let fx = core.closed("a", g, "exit 1".into(), up);
        assert_eq!(names(&fx)[1], "ScheduleRestart(a, 1s)");
    }

    #[test]
    fn a_server_that_dies_soon_after_each_connect_keeps_backing_off() {
        let mut core = core(&["a"]);
        core.open_view(ConversationId::new(), None).unwrap();
        let start = Instant::now();
        let mut now = start;
        let mut delays = Vec::new();
        for _ in 0..5 {
            // Connects and lists its tools, then dies a little before the maximum has passed.
            let g = core.server("a").unwrap().generation;
            core.connected("a", g, Arc::new(NullConn), vec![tool("t")], now);
            now += Duration::from_millis(7_900);
            let g = core.server("a").unwrap().generation;
            let fx = core.closed("a", g, "exit 1".into(), now);
            let Some(Effect::ScheduleRestart { delay, .. }) = fx.get(1) else {
                panic!("{fx:?}");
            };
            delays.push(delay.as_secs());
            now += *delay;
            let g = core.server("a").unwrap().generation;
            assert!(matches!(
                core.restart_due("a", g)[..],
                [Effect::Connect { .. }]
            ));
        }
        assert_eq!(delays, [1, 2, 4, 8, 8]);
        assert_eq!(core.server("a").unwrap().streak, 5);
    }

    #[test]
    fn nobody_referencing_a_dead_server_means_no_restart() {
        let mut core = core(&["a"]);
        let (v, _) = core.open_view(ConversationId::new(), None).unwrap();
        connect(&mut core, "a", &["t"]);
        // In backoff, the last release stops the restart.
        let g = core.server("a").unwrap().generation;
        let fx = core.closed("a", g, "exit".into(), Instant::now());
        let Some(Effect::ScheduleRestart { generation, .. }) = fx.get(1) else {
            panic!("{fx:?}");
        };
        let restart = *generation;
        let (_, fx) = core.release_view(v).unwrap();
        assert_eq!(names(&fx), ["CancelTimer(a)"]);
        assert!(core.restart_due("a", restart).is_empty());
        assert_eq!(core.server("a").unwrap().phase.name(), "idle");
    }

    #[test]
    fn an_unreferenced_death_goes_idle_and_disarms_the_reclaim() {
        let mut core = core(&["a"]);
        let (v, _) = core.open_view(ConversationId::new(), None).unwrap();
        connect(&mut core, "a", &["t"]);
        core.release_view(v).unwrap();
        let g = core.server("a").unwrap().generation;
        let fx = core.closed("a", g, "exit".into(), Instant::now());
        assert_eq!(
            names(&fx),
            ["Close(a, Died)", "CancelTimer(a)", "Failed(a, None)"]
        );
    }

    #[test]
    fn an_allowlist_accepted_before_opens_again_with_what_is_there() {
        let mut core = core(&["a", "b"]);
        core.open_view(ConversationId::new(), None).unwrap();
        connect(&mut core, "a", &["t"]);
        let list = strings(&["a__t", "a__gone", "removed__x"]);
        assert!(
            core.open_view(ConversationId::new(), Some(list.clone()))
                .is_err()
        );
        let (v, _) = core
            .open_view_checked(ConversationId::new(), Some(list), Check::AcceptedBefore)
            .unwrap();
        let tools: Vec<String> = core
            .list_tools(v)
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(tools, ["a__t"]);
    }

    #[test]
    fn allowlists_are_checked_against_the_configuration_and_known_tools() {
        let mut core = core(&["fs", "web"]);
        core.open_view(ConversationId::new(), None).unwrap();
        connect(&mut core, "fs", &["read", "write"]);
        // `web` is still connecting: any of its tools is accepted for now.
        let servers = core
            .check_allowlist(&strings(&["fs__read", "web__anything"]))
            .unwrap();
        assert_eq!(
            servers.into_iter().collect::<Vec<_>>(),
            strings(&["fs", "web"])
        );
        let err = core
            .check_allowlist(&strings(&[
                "fs__read",
                "fs__delete",
                "git__log",
                "plain",
                "fs/read",
            ]))
            .unwrap_err();
        let AgentError::InvalidInput { message } = err else {
            panic!("{err:?}");
        };
        for needle in [
            "`fs__delete` (server `fs` has no tool `delete`)",
            "`git__log` (no MCP server `git` is configured)",
            "`plain` (not a qualified",
            "`fs/read` (not a qualified",
        ] {
            assert!(message.contains(needle), "{needle} missing from {message}");
        }
        assert!(!message.contains("`fs__read`"));
    }

    #[test]
    fn entries_a_server_turns_out_not_to_offer_are_reported_when_it_is_ready() {
        let mut core = core(&["fs", "web"]);
        let (a, b) = (ConversationId::new(), ConversationId::new());
        // Both accepted while nothing is connected.
        core.open_view(a, Some(strings(&["fs__read", "fs__nope", "web__x"])))
            .unwrap();
        core.open_view(b, Some(strings(&["fs__read"]))).unwrap();
        let fx = connect(&mut core, "fs", &["read", "write"]);
        let reported: Vec<(ConversationId, String, Vec<String>)> = fx
            .into_iter()
            .filter_map(|e| match e {
                Effect::AllowlistUnknown {
                    conversation_id,
                    server,
                    entries,
                } => Some((conversation_id, server, entries)),
                _ => None,
            })
            .collect();
        // Only `a`, only its `fs` entry: `web` is not up yet, `b` names what `fs` offers.
        assert_eq!(reported, [(a, "fs".to_owned(), strings(&["fs__nope"]))]);
        assert!(core.unknown_allowlisted("web").is_empty(), "not ready");
    }

    #[test]
    fn views_see_sorted_qualified_tools_through_their_allowlist() {
        let mut core = core(&["b", "a-b", "a"]);
        let (all, _) = core.open_view(ConversationId::new(), None).unwrap();
        connect(&mut core, "a", &["z", "m"]);
        connect(&mut core, "a-b", &["c"]);
        connect(&mut core, "b", &["x"]);
        let listed: Vec<String> = core
            .list_tools(all)
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        // Sorted by qualified name: `-` sorts before `_`.
        assert_eq!(listed, strings(&["a-b__c", "a__m", "a__z", "b__x"]));
        let (some, _) = core
            .open_view(ConversationId::new(), Some(strings(&["a__z", "b__x"])))
            .unwrap();
        let listed: Vec<String> = core
            .list_tools(some)
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(listed, strings(&["a__z", "b__x"]));
        assert!(core.resolve(some, "a__z").is_ok());
        for hidden in ["a__m", "a-b__c", "nope", "zz__x"] {
            let err = core.resolve(some, hidden).err().unwrap();
            assert_eq!(err, ToolFailure::unknown_tool(hidden), "{hidden}");
            assert!(!err.retryable());
        }
        let route = core.resolve(all, "a__m").unwrap();
        assert_eq!((route.server.as_str(), route.tool.as_str()), ("a", "m"));
    }

    /// The published table never lets a view call what the actor would refuse: wherever it
    /// answers, `resolve` answers the same route; a closed connection or a server that is not
    /// ready falls back to the actor.
    #[test]
    fn the_route_table_agrees_with_resolve() {
        let mut core = core(&["b", "a-b", "a"]);
        let (all, _) = core.open_view(ConversationId::new(), None).unwrap();
        let (some, _) = core
            .open_view(ConversationId::new(), Some(strings(&["a__z", "b__x"])))
            .unwrap();
        connect(&mut core, "a", &["z", "m"]);
        connect(&mut core, "a-b", &["c"]);
        let names = [
            "a__z", "a__m", "a-b__c", "b__x", "nope", "zz__x", "a__", "__z",
        ];
        let check = |core: &PoolCore, table: &RouteTable| {
            for view in [all, some] {
                let scope = core.view_scope(view).unwrap();
                for name in names {
                    if let Some(fast) = table.fast_route(&scope, name) {
                        let exact = core.resolve(view, name).unwrap();
                        assert_eq!((&fast.server, &fast.tool), (&exact.server, &exact.tool));
                    }
                }
            }
        };
        let table = core.route_table();
        assert_eq!(table.len(), 3, "b is not ready: its tools are not routed");
        check(&core, &table);
        assert!(
            table
                .fast_route(&core.view_scope(all).unwrap(), "a__m")
                .is_some()
        );
        assert!(
            table
                .fast_route(&core.view_scope(some).unwrap(), "a__m")
                .is_none()
        );
        assert!(
            table
                .fast_route(&core.view_scope(some).unwrap(), "b__x")
                .is_none()
        );

        connect(&mut core, "b", &["x"]);
        let table = core.route_table();
        check(&core, &table);
        assert!(
            table
                .fast_route(&core.view_scope(some).unwrap(), "b__x")
                .is_some()
        );

        // A connection that closed is never routed to, even from an old table.
        let route = table
            .fast_route(&core.view_scope(all).unwrap(), "a__z")
            .unwrap()
            .clone();
        route.closed.cancel();
        assert!(
            table
                .fast_route(&core.view_scope(all).unwrap(), "a__z")
                .is_none()
        );
    }

    #[test]
    fn a_call_to_a_server_that_is_not_ready_is_an_mcp_error() {
        let mut core = core(&["a"]);
        let (v, _) = core.open_view(ConversationId::new(), None).unwrap();
        let err = core.resolve(v, "a__t").err().unwrap();
        assert!(matches!(err.error, AgentError::McpError { ref server, .. } if server == "a"));
        assert_eq!(err.kind, ToolFailureKind::Failed);
        core.release_view(v);
        assert!(matches!(
            core.resolve(v, "a__t").err().unwrap().error,
            AgentError::NotFound { .. }
        ));
    }

    #[test]
    fn task_augmented_and_illegal_tools_are_left_out() {
        let long = "x".repeat(70);
        let mut tools = vec![tool("ok"), tool("has.dot"), tool(&long)];
        tools.push(McpTool {
            requires_task: true,
            ..tool("slow")
        });
        let (offered, left) = offered_tools("s", tools);
        assert_eq!(offered.keys().collect::<Vec<_>>(), ["ok"]);
        assert_eq!(left.get("slow"), Some(&LeftOut::RequiresTask));
        assert_eq!(left.get("has.dot"), Some(&LeftOut::InvalidName));
        assert_eq!(left.get(long.as_str()), Some(&LeftOut::InvalidName));
    }

    #[test]
    fn a_refresh_lists_ready_servers_again_and_restarts_waiting_ones_now() {
        let mut core = core(&["a", "b", "c", "d"]);
        let (v, _) = core
            .open_view(
                ConversationId::new(),
                Some(strings(&["a__t", "b__t", "c__t"])),
            )
            .unwrap();
        connect(&mut core, "a", &["t"]);
        let gb = core.server("b").unwrap().generation;
        let failed = core.connect_failed("b", gb, "not there yet".into());
        let stale = failed
            .iter()
            .find_map(|fx| match fx {
                Effect::ScheduleRestart { generation, .. } => Some(*generation),
                _ => None,
            })
            .unwrap();
        // c is still connecting; d is not the view's.
        let fx = core.refresh(v);
        assert!(
            matches!(&fx[..], [Effect::Refresh { server: a, .. }, Effect::Connect { server: b, .. }]
                if a == "a" && b == "b"),
            "{fx:?}"
        );
        assert!(matches!(core.server("b").unwrap().phase, Phase::Connecting));
        assert!(
            core.restart_due("b", stale).is_empty(),
            "the restart it replaced no longer acts"
        );
        assert!(core.refresh(ViewId(u64::MAX)).is_empty(), "an unknown view");
    }

    #[test]
    fn a_late_refresh_never_replaces_a_newer_one() {
        let mut core = core(&["a"]);
        let (v, _) = core.open_view(ConversationId::new(), None).unwrap();
        connect(&mut core, "a", &["t"]);
        let g = core.server("a").unwrap().generation;
        core.tools_changed("a", g);
        core.tools_changed("a", g);
        assert_eq!(core.tools_listed("a", g, 2, vec![tool("new")]), Some(1));
        assert_eq!(core.tools_listed("a", g, 1, vec![tool("old")]), None);
        let listed: Vec<String> = core
            .list_tools(v)
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(listed, ["a__new"]);
        assert!(core.tools_changed("a", g + 100).is_empty());
    }

    #[test]
    fn shutdown_closes_every_live_connection() {
        let mut core = core(&["a", "b"]);
        core.open_view(ConversationId::new(), None).unwrap();
        connect(&mut core, "a", &["t"]);
        let token = core.resolve_any_closed("a");
        let fx = core.shutdown();
        assert_eq!(names(&fx), ["Close(a, Shutdown)"]);
        assert!(token.is_cancelled());
        assert_eq!(core.live_connections(), 0);
    }

    #[test]
    fn roots_become_file_uris_once() {
        let roots = strings(&["/work/a b", "/work/x", "/work/x", "file:///srv"]);
        assert_eq!(
            root_uris(&roots).unwrap(),
            strings(&["file:///srv", "file:///work/a%20b", "file:///work/x"])
        );
        assert!(root_uris(&strings(&["relative/dir"])).is_err());
    }

    impl PoolCore {
        fn resolve_any_closed(&self, server: &str) -> CancellationToken {
            match &self.servers[server].phase {
                Phase::Ready(live) => live.closed.clone(),
                _ => panic!("not ready"),
            }
        }
    }
}
