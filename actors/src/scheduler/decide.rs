//! The scheduler core, with no actor and no I/O: who holds a slot, who waits in which
//! conversation's queue, the round-robin between conversations, and the recovery of a new
//! Scheduler from the holders that report to it. Every transition returns the [`Effects`]
//! the actor carries out (grants to deliver, waiters to refuse, holders to watch).

use super::*;

/// Whether a waiting caller still wants its answer.
pub trait Waiter {
    /// True when nobody will read the reply any more; such a waiter is skipped at its turn.
    fn caller_gone(&self) -> bool;
}

/// A request as the core sees it. `waiter` is opaque to the core (the actor's reply port).
#[derive(Debug)]
pub struct QueueEntry<W> {
    pub task_id: TaskId,
    pub conversation_id: ConversationId,
    pub holder: ActorId,
    pub waiter: W,
}

/// A held slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Grant {
    pub(super) task_id: TaskId,
    pub(super) holder: ActorId,
}

/// The answer to a request.
#[derive(Debug)]
pub enum Decision<W> {
    /// A slot was free and nobody waited: the task runs now.
    GrantNow(QueueEntry<W>),
    /// The request waits for its turn.
    Queued,
    /// The wait queue is full; answer at once.
    Overloaded(QueueEntry<W>),
    /// The task already holds or awaits a slot.
    Duplicate(QueueEntry<W>),
}

/// What an operation changed, for the actor to execute.
#[derive(Debug)]
pub struct Effects<W> {
    /// Waiters that now hold a slot, in grant order.
    pub granted: Vec<QueueEntry<W>>,
    /// Waiting requests removed before their turn (by `release` or a holder's death).
    pub withdrawn: Vec<QueueEntry<W>>,
    /// Waiters dropped because their caller is gone.
    pub caller_gone: Vec<QueueEntry<W>>,
    /// Slots given back.
    pub released: usize,
}

impl<W> Default for Effects<W> {
    fn default() -> Self {
        Self {
            granted: Vec::new(),
            withdrawn: Vec::new(),
            caller_gone: Vec::new(),
            released: 0,
        }
    }
}

impl<W> Effects<W> {
    pub(super) fn absorb(&mut self, other: Self) {
        self.granted.extend(other.granted);
        self.withdrawn.extend(other.withdrawn);
        self.caller_gone.extend(other.caller_gone);
        self.released += other.released;
    }
}

/// The scheduler's decisions, free of actors and I/O.
///
/// Invariants after every method: at most `limit` grants (unless reinstated above it); when
/// fewer than `limit` are held and no holder of a failed scheduler's grants is awaited, nobody
/// waits; a conversation is in `rotation` exactly when its queue is non-empty.
#[derive(Debug)]
pub struct SchedulerCore<W> {
    pub(super) limit: usize,
    pub(super) queue_capacity: usize,
    /// Held slots, in grant order.
    pub(super) running: Vec<Grant>,
    /// Waiting requests per conversation, oldest first.
    pub(super) queues: HashMap<ConversationId, VecDeque<QueueEntry<W>>>,
    /// Conversations with waiting requests, in the order they will be served.
    pub(super) rotation: VecDeque<ConversationId>,
    /// Which conversation queue holds a waiting task.
    pub(super) waiting_in: HashMap<TaskId, ConversationId>,
    /// Grants plus waiting requests per holder; a holder is watched while it has any.
    pub(super) holder_refs: HashMap<ActorId, usize>,
    /// Holders that may hold grants of the scheduler this one replaced and were not heard
    /// from yet: nothing is granted while any is left (watched too).
    pub(super) recovering: HashSet<ActorId>,
}

impl<W: Waiter> SchedulerCore<W> {
    pub fn new(limit: usize, queue_capacity: usize) -> Self {
        Self {
            limit: limit.max(1),
            queue_capacity,
            running: Vec::new(),
            queues: HashMap::new(),
            rotation: VecDeque::new(),
            waiting_in: HashMap::new(),
            holder_refs: HashMap::new(),
            recovering: HashSet::new(),
        }
    }

    /// Waits for these holders of a failed scheduler's grants before granting anything.
    pub fn recover_from(&mut self, holders: impl IntoIterator<Item = ActorId>) {
        self.recovering.extend(holders);
    }

    /// Holders of a failed scheduler's grants not heard from yet.
    pub fn recovering_len(&self) -> usize {
        self.recovering.len()
    }

    /// `holder` told what it holds of a failed scheduler's grants (any message of it does);
    /// once nobody is left to hear from, waiters are granted.
    pub fn reported(&mut self, holder: ActorId) -> Effects<W> {
        let mut fx = Effects::default();
        if self.recovering.remove(&holder) {
            self.pump(&mut fx);
        }
        fx
    }

    /// Stops waiting for the holders not heard from; returns how many they were.
    pub fn end_recovery(&mut self) -> (usize, Effects<W>) {
        let unheard = self.recovering.len();
        self.recovering.clear();
        let mut fx = Effects::default();
        self.pump(&mut fx);
        (unheard, fx)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn queue_capacity(&self) -> usize {
        self.queue_capacity
    }

    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    /// Waiting requests, including any whose caller left and that have not been skipped yet.
    pub fn waiting_len(&self) -> usize {
        self.waiting_in.len()
    }

    /// The oldest waiting request of each conversation (its queue is in arrival order).
    pub fn queue_heads(&self) -> impl Iterator<Item = &QueueEntry<W>> {
        self.queues.values().filter_map(VecDeque::front)
    }

    /// Whether `holder` has a grant or a waiting request, or is awaited after a restart.
    pub fn holds(&self, holder: &ActorId) -> bool {
        self.holder_refs.contains_key(holder) || self.recovering.contains(holder)
    }

    pub(super) fn is_known(&self, task_id: TaskId) -> bool {
        self.waiting_in.contains_key(&task_id) || self.running.iter().any(|g| g.task_id == task_id)
    }

    /// Grants at once when a slot is free and nobody waits; else queues if there is room; else
    /// overloaded. A full queue is first purged of waiters whose caller left, so that callers
    /// who gave up do not turn away live ones; those come back in the effects.
    pub fn request(&mut self, entry: QueueEntry<W>) -> (Decision<W>, Effects<W>) {
        // Asking is how a holder whose task was waiting reports after a restart.
        let mut fx = self.reported(entry.holder);
        if self.is_known(entry.task_id) {
            return (Decision::Duplicate(entry), fx);
        }
        if self.running.len() < self.limit
            && self.waiting_in.is_empty()
            && self.recovering.is_empty()
        {
            self.hold(entry.holder);
            self.running.push(Grant {
                task_id: entry.task_id,
                holder: entry.holder,
            });
            return (Decision::GrantNow(entry), fx);
        }
        if self.waiting_in.len() >= self.queue_capacity {
            self.purge_gone(&mut fx);
            if self.waiting_in.len() >= self.queue_capacity {
                return (Decision::Overloaded(entry), fx);
            }
        }
        self.hold(entry.holder);
        self.waiting_in.insert(entry.task_id, entry.conversation_id);
        let queue = self.queues.entry(entry.conversation_id).or_default();
        if queue.is_empty() {
            self.rotation.push_back(entry.conversation_id);
        }
        queue.push_back(entry);
        (Decision::Queued, fx)
    }

    /// Frees `task_id`'s slot and grants the next waiters, or withdraws it if it waits.
    /// Unknown and already released tasks change nothing.
    pub fn release(&mut self, task_id: TaskId) -> Effects<W> {
        let mut fx = Effects::default();
        if let Some(pos) = self.running.iter().position(|g| g.task_id == task_id) {
            let grant = self.running.remove(pos);
            self.unhold(grant.holder);
            fx.released = 1;
            self.pump(&mut fx);
        } else if let Some(conversation_id) = self.waiting_in.remove(&task_id) {
            if let Some(queue) = self.queues.get_mut(&conversation_id)
                && let Some(pos) = queue.iter().position(|e| e.task_id == task_id)
                && let Some(entry) = queue.remove(pos)
            {
                self.unhold(entry.holder);
                fx.withdrawn.push(entry);
            }
            self.drop_if_empty(conversation_id);
        }
        fx
    }

    /// The holder stopped: frees all its slots, withdraws all its requests, grants the next.
    pub fn holder_died(&mut self, holder: ActorId) -> Effects<W> {
        let mut fx = Effects::default();
        let before = self.running.len();
        self.running.retain(|g| g.holder != holder);
        fx.released = before - self.running.len();
        for queue in self.queues.values_mut() {
            let (theirs, others): (VecDeque<_>, VecDeque<_>) =
                queue.drain(..).partition(|e| e.holder == holder);
            *queue = others;
            fx.withdrawn.extend(theirs);
        }
        for e in &fx.withdrawn {
            self.waiting_in.remove(&e.task_id);
        }
        self.queues.retain(|_, q| !q.is_empty());
        let queues = &self.queues;
        self.rotation.retain(|c| queues.contains_key(c));
        self.holder_refs.remove(&holder);
        self.recovering.remove(&holder);
        self.pump(&mut fx);
        fx
    }

    /// Counts a grant held from before a restart (false if the task is already known), and
    /// hears its holder (see [`Self::reported`]).
    pub fn reinstate(&mut self, task_id: TaskId, holder: ActorId) -> (bool, Effects<W>) {
        let added = !self.is_known(task_id);
        if added {
            self.hold(holder);
            self.running.push(Grant { task_id, holder });
        }
        (added, self.reported(holder))
    }

    /// Running tasks in grant order, waiting tasks in the order they would be granted if
    /// nothing changed (callers already gone left out), and the limit.
    pub fn snapshot(&self) -> SchedulerSnapshot {
        let mut lanes: Vec<_> = self
            .rotation
            .iter()
            .filter_map(|c| self.queues.get(c))
            .map(|q| q.iter().filter(|e| !e.waiter.caller_gone()))
            .collect();
        let mut waiting = Vec::with_capacity(self.waiting_in.len());
        loop {
            let before = waiting.len();
            for lane in &mut lanes {
                if let Some(e) = lane.next() {
                    waiting.push(e.task_id);
                }
            }
            if waiting.len() == before {
                break;
            }
        }
        SchedulerSnapshot {
            running: self.running.iter().map(|g| g.task_id).collect(),
            waiting,
            limit: self.limit,
            recovering: self.recovering.len(),
        }
    }

    /// Grants free slots round-robin: the conversation at the front of the rotation gets its
    /// oldest live waiter granted and goes to the back. Waiters whose caller left are dropped
    /// without costing their conversation its turn.
    pub(super) fn pump(&mut self, fx: &mut Effects<W>) {
        if !self.recovering.is_empty() {
            return;
        }
        while self.running.len() < self.limit {
            let Some(conversation_id) = self.rotation.pop_front() else {
                break;
            };
            let mut granted = None;
            let mut gone = Vec::new();
            let mut emptied = true;
            if let Some(queue) = self.queues.get_mut(&conversation_id) {
                while let Some(entry) = queue.pop_front() {
                    if entry.waiter.caller_gone() {
                        gone.push(entry);
                    } else {
                        granted = Some(entry);
                        break;
                    }
                }
                emptied = queue.is_empty();
            }
            if emptied {
                self.queues.remove(&conversation_id);
            } else {
                self.rotation.push_back(conversation_id);
            }
            for entry in gone {
                self.waiting_in.remove(&entry.task_id);
                self.unhold(entry.holder);
                fx.caller_gone.push(entry);
            }
            if let Some(entry) = granted {
                self.waiting_in.remove(&entry.task_id);
                self.running.push(Grant {
                    task_id: entry.task_id,
                    holder: entry.holder,
                });
                fx.granted.push(entry);
            }
        }
    }

    pub(super) fn purge_gone(&mut self, fx: &mut Effects<W>) {
        let mut gone = Vec::new();
        for queue in self.queues.values_mut() {
            let (left, stay): (VecDeque<_>, VecDeque<_>) =
                queue.drain(..).partition(|e| e.waiter.caller_gone());
            *queue = stay;
            gone.extend(left);
        }
        for entry in gone {
            self.waiting_in.remove(&entry.task_id);
            self.unhold(entry.holder);
            fx.caller_gone.push(entry);
        }
        self.queues.retain(|_, q| !q.is_empty());
        let queues = &self.queues;
        self.rotation.retain(|c| queues.contains_key(c));
    }

    pub(super) fn drop_if_empty(&mut self, conversation_id: ConversationId) {
        if self
            .queues
            .get(&conversation_id)
            .is_some_and(|q| q.is_empty())
        {
            self.queues.remove(&conversation_id);
            self.rotation.retain(|c| *c != conversation_id);
        }
    }

    pub(super) fn hold(&mut self, holder: ActorId) {
        *self.holder_refs.entry(holder).or_insert(0) += 1;
    }

    pub(super) fn unhold(&mut self, holder: ActorId) {
        if let Some(n) = self.holder_refs.get_mut(&holder) {
            *n -= 1;
            if *n == 0 {
                self.holder_refs.remove(&holder);
            }
        }
    }
}
