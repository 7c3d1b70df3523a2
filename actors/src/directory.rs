//! The live directory of a session's service actors (O2).
//!
//! The Session owns a [`DirectoryWriter`]; everything that calls a service holds a
//! [`Directory`] (or one [`ServiceRef`] of it, or an [`EventSink`]) and reads the reference
//! at the moment of use, never a copy taken earlier. When the Session replaces a service that
//! stopped, it publishes the new actor here with that service's generation one higher, and
//! readers find it on their next use. Whoever must re-declare something to a new actor (a
//! conversation its running task, to a new Scheduler or TaskRegistry) compares the
//! generations with the ones it dealt with last ([`Generations::replaced_since`]) when the
//! Session tells it the directory changed.
//!
//! One directory, one `watch` channel per service: a reader of one service is not woken by
//! the restart of another, and the ApprovalStore can be handed its event sink (the Rollout's
//! channel) before the rest of the directory exists.
//!
//! Events and a replaced Rollout: an `Emit` that a stopped Rollout refuses is parked, under
//! the read lock of the Rollout's channel; [`DirectoryWriter::replace_rollout`] hands every
//! parked event to the new Rollout under the write lock, before anyone can see it. So parked
//! events reach it in the order they were emitted and before anything emitted after the
//! switch. What is still lost is said on [`EventSink::emit`].

use crate::agents::hub::{AgentHubMsg, HubRef};
use crate::approval_store::ApprovalMsg;
use crate::events::{EventDraft, EventSink};
use crate::ports::McpPort;
use crate::rollout::RolloutMsg;
use crate::scheduler::SchedulerMsg;
use crate::task_registry::TaskRegistryMsg;
use ractor::{ActorId, ActorRef, Message, MessagingErr};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// A published service: what to call now and how many times it was replaced.
#[derive(Clone)]
pub(crate) struct Slot<T> {
    pub(crate) current: T,
    /// 0 at the session's start, one more per replacement.
    pub(crate) generation: u64,
}

impl<T> Slot<T> {
    fn first(current: T) -> Self {
        Self {
            current,
            generation: 0,
        }
    }
}

/// Where events go: the current Rollout, and where an event waits while it is replaced.
#[derive(Clone)]
pub(crate) struct RolloutTarget {
    pub(crate) actor: ActorRef<RolloutMsg>,
    pub(crate) parked: mpsc::UnboundedSender<EventDraft>,
}

/// References to a session's service actors at one moment (observation, tests, the handle).
#[derive(Clone)]
pub struct ServiceRefs {
    pub rollout: ActorRef<RolloutMsg>,
    pub scheduler: ActorRef<SchedulerMsg>,
    pub registry: ActorRef<TaskRegistryMsg>,
    pub approvals: ActorRef<ApprovalMsg>,
    /// The MCP port conversations open their views on (the session's McpPool or a port
    /// plugged in as is); `None` without MCP.
    pub mcp: Option<Arc<dyn McpPort>>,
    /// The session's AgentHub; `None` without agents.
    pub agents: Option<ActorRef<AgentHubMsg>>,
    pub generations: Generations,
}

/// How many times each service was replaced since the session started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Generations {
    pub rollout: u64,
    pub scheduler: u64,
    pub registry: u64,
    pub approvals: u64,
    pub mcp: u64,
}

/// Which services were replaced between two readings of the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Replaced {
    pub rollout: bool,
    pub scheduler: bool,
    pub registry: bool,
    pub approvals: bool,
    pub mcp: bool,
}

impl Generations {
    /// What changed since `seen` was read.
    pub fn replaced_since(&self, seen: &Self) -> Replaced {
        Replaced {
            rollout: self.rollout != seen.rollout,
            scheduler: self.scheduler != seen.scheduler,
            registry: self.registry != seen.registry,
            approvals: self.approvals != seen.approvals,
            mcp: self.mcp != seen.mcp,
        }
    }
}

/// One service of the directory, read at each use. Cheap to clone.
pub struct ServiceRef<M: Message> {
    rx: watch::Receiver<Slot<ActorRef<M>>>,
}

impl<M: Message> Clone for ServiceRef<M> {
    fn clone(&self) -> Self {
        Self {
            rx: self.rx.clone(),
        }
    }
}

impl<M: Message> From<ActorRef<M>> for ServiceRef<M> {
    fn from(actor: ActorRef<M>) -> Self {
        Self::fixed(actor)
    }
}

impl<M: Message> ServiceRef<M> {
    /// A reference nobody replaces (a service outside a session, tests): `replaced` answers
    /// `None` at once.
    pub fn fixed(actor: ActorRef<M>) -> Self {
        let (_, rx) = watch::channel(Slot::first(actor));
        Self { rx }
    }

    /// The actor to call now.
    pub fn get(&self) -> ActorRef<M> {
        self.rx.borrow().current.clone()
    }

    pub fn generation(&self) -> u64 {
        self.rx.borrow().generation
    }

    /// Waits until the directory names another actor than `gone` (the one that failed a
    /// call) and returns it; `None` when nobody will replace it (the session is gone).
    pub async fn replaced(&self, gone: ActorId) -> Option<ActorRef<M>> {
        let mut rx = self.rx.clone();
        let slot = rx.wait_for(|s| s.current.get_id() != gone).await.ok()?;
        Some(slot.current.clone())
    }
}

/// The current MCP port and its generation.
#[derive(Clone)]
pub struct McpNow {
    pub port: Option<Arc<dyn McpPort>>,
    pub generation: u64,
}

/// A reader of the session's directory. Cheap to clone.
#[derive(Clone)]
pub struct Directory {
    rollout: watch::Receiver<Slot<RolloutTarget>>,
    scheduler: ServiceRef<SchedulerMsg>,
    registry: ServiceRef<TaskRegistryMsg>,
    approvals: ServiceRef<ApprovalMsg>,
    mcp: watch::Receiver<Slot<Option<Arc<dyn McpPort>>>>,
    agents: watch::Receiver<Slot<Option<HubRef>>>,
}

impl Directory {
    /// The session's AgentHub now; `None` without agents.
    pub fn agents(&self) -> Option<ActorRef<AgentHubMsg>> {
        self.agents
            .borrow()
            .current
            .as_ref()
            .map(|h| h.actor.clone())
    }

    /// The session's AgentHub now with the views its tasks read; `None` without agents.
    pub fn hub(&self) -> Option<HubRef> {
        self.agents.borrow().current.clone()
    }

    pub fn rollout(&self) -> ActorRef<RolloutMsg> {
        self.rollout.borrow().current.actor.clone()
    }

    pub fn scheduler(&self) -> ActorRef<SchedulerMsg> {
        self.scheduler.get()
    }

    pub fn registry(&self) -> ActorRef<TaskRegistryMsg> {
        self.registry.get()
    }

    pub fn approvals(&self) -> ServiceRef<ApprovalMsg> {
        self.approvals.clone()
    }

    /// A sink of events to the current Rollout (see [`EventSink::emit`]).
    pub fn events(&self) -> EventSink {
        EventSink::live(self.rollout.clone())
    }

    pub fn mcp(&self) -> McpNow {
        let slot = self.mcp.borrow();
        McpNow {
            port: slot.current.clone(),
            generation: slot.generation,
        }
    }

    /// Waits until the MCP port's generation is another than `generation`; `None` when the
    /// session is gone.
    pub async fn mcp_after(&self, generation: u64) -> Option<McpNow> {
        let mut rx = self.mcp.clone();
        let slot = rx.wait_for(|s| s.generation != generation).await.ok()?;
        Some(McpNow {
            port: slot.current.clone(),
            generation: slot.generation,
        })
    }

    pub fn generations(&self) -> Generations {
        Generations {
            rollout: self.rollout.borrow().generation,
            scheduler: self.scheduler.generation(),
            registry: self.registry.generation(),
            approvals: self.approvals.generation(),
            mcp: self.mcp.borrow().generation,
        }
    }

    pub fn snapshot(&self) -> ServiceRefs {
        ServiceRefs {
            rollout: self.rollout(),
            scheduler: self.scheduler(),
            registry: self.registry(),
            approvals: self.approvals.get(),
            mcp: self.mcp().port,
            agents: self.agents(),
            generations: self.generations(),
        }
    }
}

/// The Rollout's channel, made first: the ApprovalStore needs its event sink before the rest
/// of the directory exists.
pub struct RolloutChannel {
    tx: watch::Sender<Slot<RolloutTarget>>,
    parked: mpsc::UnboundedReceiver<EventDraft>,
}

impl RolloutChannel {
    pub fn new(actor: ActorRef<RolloutMsg>) -> Self {
        let (parked_tx, parked) = mpsc::unbounded_channel();
        let tx = watch::Sender::new(Slot::first(RolloutTarget {
            actor,
            parked: parked_tx,
        }));
        Self { tx, parked }
    }

    pub fn events(&self) -> EventSink {
        EventSink::live(self.tx.subscribe())
    }
}

/// The writing side of the directory, owned by the Session.
pub struct DirectoryWriter {
    rollout: RolloutChannel,
    scheduler: watch::Sender<Slot<ActorRef<SchedulerMsg>>>,
    registry: watch::Sender<Slot<ActorRef<TaskRegistryMsg>>>,
    approvals: watch::Sender<Slot<ActorRef<ApprovalMsg>>>,
    mcp: watch::Sender<Slot<Option<Arc<dyn McpPort>>>>,
    agents: watch::Sender<Slot<Option<HubRef>>>,
}

impl DirectoryWriter {
    pub fn new(
        rollout: RolloutChannel,
        scheduler: ActorRef<SchedulerMsg>,
        registry: ActorRef<TaskRegistryMsg>,
        approvals: ActorRef<ApprovalMsg>,
        mcp: Option<Arc<dyn McpPort>>,
    ) -> Self {
        Self {
            rollout,
            scheduler: watch::Sender::new(Slot::first(scheduler)),
            registry: watch::Sender::new(Slot::first(registry)),
            approvals: watch::Sender::new(Slot::first(approvals)),
            mcp: watch::Sender::new(Slot::first(mcp)),
            agents: watch::Sender::new(Slot::first(None)),
        }
    }

    /// A new reader; it sees every later replacement as a change.
    pub fn directory(&self) -> Directory {
        Directory {
            rollout: self.rollout.tx.subscribe(),
            scheduler: ServiceRef {
                rx: self.scheduler.subscribe(),
            },
            registry: ServiceRef {
                rx: self.registry.subscribe(),
            },
            approvals: ServiceRef {
                rx: self.approvals.subscribe(),
            },
            mcp: self.mcp.subscribe(),
            agents: self.agents.subscribe(),
        }
    }

    pub fn events(&self) -> EventSink {
        self.rollout.events()
    }

    pub fn snapshot(&self) -> ServiceRefs {
        self.directory().snapshot()
    }

    /// Publishes a new Rollout, after handing it every event parked while there was none
    /// (in order). Returns how many were handed over.
    pub fn replace_rollout(&mut self, actor: ActorRef<RolloutMsg>) -> usize {
        let parked = &mut self.rollout.parked;
        let mut handed = 0;
        self.rollout.tx.send_modify(|slot| {
            let mut drafts = Vec::new();
            while let Ok(draft) = parked.try_recv() {
                drafts.push(draft);
            }
            let mut rest = drafts.into_iter();
            for draft in rest.by_ref() {
                match actor.cast(RolloutMsg::Emit { draft }) {
                    Ok(()) => handed += 1,
                    Err(MessagingErr::SendErr(RolloutMsg::Emit { draft })) => {
                        // The new one is gone already: keep the rest for the next, in order.
                        let _ = slot.current.parked.send(draft);
                        break;
                    }
                    Err(_) => {}
                }
            }
            for draft in rest {
                let _ = slot.current.parked.send(draft);
            }
            slot.current.actor = actor;
            slot.generation += 1;
        });
        handed
    }

    pub fn replace_scheduler(&self, actor: ActorRef<SchedulerMsg>) {
        replace(&self.scheduler, actor);
    }

    pub fn replace_registry(&self, actor: ActorRef<TaskRegistryMsg>) {
        replace(&self.registry, actor);
    }

    pub fn replace_approvals(&self, actor: ActorRef<ApprovalMsg>) {
        replace(&self.approvals, actor);
    }

    /// Publishes the session's MCP port: a new pool, or `None` when none could start again.
    pub fn replace_mcp(&self, port: Option<Arc<dyn McpPort>>) {
        replace(&self.mcp, port);
    }

    /// Publishes the session's AgentHub (a new one after a failure).
    pub fn replace_agents(&self, hub: Option<HubRef>) {
        replace(&self.agents, hub);
    }
}

fn replace<T>(tx: &watch::Sender<Slot<T>>, current: T) {
    tx.send_modify(|slot| {
        slot.current = current;
        slot.generation += 1;
    });
}

/// A live reference and the means to replace its actor, for tests of its readers.
#[cfg(test)]
pub(crate) struct TestSlot<M: Message>(watch::Sender<Slot<ActorRef<M>>>);

#[cfg(test)]
impl<M: Message> TestSlot<M> {
    pub(crate) fn new(actor: ActorRef<M>) -> (Self, ServiceRef<M>) {
        let (tx, rx) = watch::channel(Slot::first(actor));
        (Self(tx), ServiceRef { rx })
    }

    pub(crate) fn replace(&self, actor: ActorRef<M>) {
        replace(&self.0, actor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};
    use tokio::sync::mpsc::UnboundedSender;
    use troupe_proto::{EventKind, WarningCode};

    #[test]
    fn replaced_names_exactly_the_services_whose_generation_moved() {
        let seen = Generations::default();
        assert_eq!(seen.replaced_since(&seen), Replaced::default());
        let now = Generations {
            scheduler: 1,
            mcp: 2,
            ..seen
        };
        assert_eq!(
            now.replaced_since(&seen),
            Replaced {
                scheduler: true,
                mcp: true,
                ..Replaced::default()
            }
        );
    }

    /// Stands in for a Rollout: reports every event's warning message, in arrival order.
    struct Recorder;

    #[ractor::async_trait]
    impl Actor for Recorder {
        type Msg = RolloutMsg;
        type State = UnboundedSender<String>;
        type Arguments = UnboundedSender<String>;

        async fn pre_start(
            &self,
            _myself: ActorRef<RolloutMsg>,
            out: UnboundedSender<String>,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(out)
        }

        async fn handle(
            &self,
            _myself: ActorRef<RolloutMsg>,
            msg: RolloutMsg,
            out: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            if let RolloutMsg::Emit { draft } = msg
                && let EventKind::Warning { message, .. } = draft.event
            {
                let _ = out.send(message);
            }
            Ok(())
        }
    }

    /// A warning whose message is `marker`, so its arrival can be told apart.
    fn event(marker: &str) -> EventDraft {
        EventDraft::session(EventKind::Warning {
            code: WarningCode::McpServerFailed,
            message: marker.into(),
        })
    }

    async fn recorder() -> (ActorRef<RolloutMsg>, mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (actor, _) = Actor::spawn(None, Recorder, tx).await.unwrap();
        (actor, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn events_emitted_while_the_rollout_is_replaced_reach_the_next_one_in_order() {
        let (first, mut first_seen) = recorder().await;
        let channel = RolloutChannel::new(first.clone());
        let sink = channel.events();
        sink.emit(event("a"));
        assert_eq!(first_seen.recv().await.unwrap(), "a");

        first.kill_and_wait(None).await.unwrap();
        sink.emit(event("b"));
        sink.emit(event("c"));

        let (second, mut second_seen) = recorder().await;
        let mut writer =
            DirectoryWriter::new(channel, idle().await, idle().await, idle().await, None);
        assert_eq!(writer.replace_rollout(second.clone()), 2);
        sink.emit(event("d"));
        for want in ["b", "c", "d"] {
            assert_eq!(second_seen.recv().await.unwrap(), want);
        }
        assert_eq!(writer.directory().generations().rollout, 1);
        assert_eq!(writer.snapshot().rollout.get_id(), second.get_id());
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_sink_drops_what_its_stopped_rollout_refuses() {
        let (rollout, mut seen) = recorder().await;
        let sink = EventSink::new(rollout.clone());
        rollout.kill_and_wait(None).await.unwrap();
        sink.emit(event("lost"));
        assert!(seen.recv().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_service_ref_follows_its_replacement_and_a_fixed_one_does_not_wait() {
        let (a, _) = recorder().await;
        let (b, _) = recorder().await;
        let (tx, rx) = watch::channel(Slot::first(a.clone()));
        let live = ServiceRef { rx };
        let waiting = {
            let live = live.clone();
            let gone = a.get_id();
            tokio::spawn(async move { live.replaced(gone).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        replace(&tx, b.clone());
        assert_eq!(waiting.await.unwrap().map(|r| r.get_id()), Some(b.get_id()));
        assert_eq!(live.get().get_id(), b.get_id());
        assert_eq!(live.generation(), 1);
        drop(tx);
        // Nobody replaces a fixed reference, nor one whose session is gone.
        assert!(
            ServiceRef::fixed(a.clone())
                .replaced(a.get_id())
                .await
                .is_none()
        );
        assert!(live.replaced(b.get_id()).await.is_none());
    }

    /// An actor of any message type, for where a test calls nobody.
    async fn idle<M: Message>() -> ActorRef<M> {
        struct Nothing<M>(std::marker::PhantomData<fn() -> M>);
        #[ractor::async_trait]
        impl<M: Message> Actor for Nothing<M> {
            type Msg = M;
            type State = ();
            type Arguments = ();
            async fn pre_start(
                &self,
                _myself: ActorRef<M>,
                _args: (),
            ) -> Result<(), ActorProcessingErr> {
                Ok(())
            }
        }
        Actor::spawn(None, Nothing::<M>(std::marker::PhantomData), ())
            .await
            .unwrap()
            .0
    }
}
