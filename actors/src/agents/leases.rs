//! The leases of the dispatches in flight (A4): every dispatch holds one (its id and a
//! deadline) from the moment it is admitted until it ends or the lease expires, whichever
//! comes first. A lease is also an edge of the "waits for" graph: the dispatcher's node waits
//! for the agent's node. A new dispatch whose agent already waits, through leases in flight,
//! for the dispatcher would never end (each side waits for the other's one-at-a-time
//! conversation), so it is refused before it runs.
//!
//! Pure bookkeeping: the hub holds the timer (armed for the earliest deadline, see
//! [`super::decide::arm_lease_timer`]), the cancel tokens and the callers' reply ports beside
//! it.

use std::collections::BTreeMap;
use troupe_proto::{ConversationId, DispatchId};

/// Who waits, or is waited for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    /// A conversation that is nobody's agent (a user's, the supervisor's).
    Conversation(ConversationId),
    /// An agent bound per session: its one provider session runs one input at a time.
    Agent(String),
    /// An agent bound per dispatch: a provider session of its own, nobody else's.
    Dispatch(DispatchId),
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Conversation(id) => write!(f, "conversation {id}"),
            Self::Agent(id) => f.write_str(id),
            Self::Dispatch(id) => write!(f, "dispatch {id}"),
        }
    }
}

/// One dispatch in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub id: DispatchId,
    pub agent_id: String,
    /// The dispatcher.
    pub from: Node,
    /// The agent's node.
    pub to: Node,
    /// Unix ms after which it is reclaimed.
    pub deadline_ms: u64,
}

/// The leases in flight.
#[derive(Debug, Clone, Default)]
pub struct LeaseBook {
    leases: BTreeMap<DispatchId, Lease>,
}

impl LeaseBook {
    /// Holds `lease` until it is finished or expires.
    pub fn issue(&mut self, lease: Lease) {
        self.leases.insert(lease.id, lease);
    }

    /// Ends a lease; `None` if it already ended (finished, or reclaimed on expiry).
    pub fn finish(&mut self, id: DispatchId) -> Option<Lease> {
        self.leases.remove(&id)
    }

    /// Whether `id` is still held and its deadline passed at `now_ms`.
    pub fn is_expired(&self, id: DispatchId, now_ms: u64) -> bool {
        self.leases
            .get(&id)
            .is_some_and(|l| l.deadline_ms <= now_ms)
    }

    /// The leases past their deadline at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> Vec<DispatchId> {
        self.leases
            .values()
            .filter(|l| l.deadline_ms <= now_ms)
            .map(|l| l.id)
            .collect()
    }

    /// The first deadline of the leases in flight.
    pub fn earliest(&self) -> Option<u64> {
        self.leases.values().map(|l| l.deadline_ms).min()
    }

    pub fn get(&self, id: DispatchId) -> Option<&Lease> {
        self.leases.get(&id)
    }

    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// If `to` already waits for `from` through leases in flight, the nodes of that wait,
    /// from `to` to `from`: a dispatch `from` -> `to` would close the loop. `None`: it would
    /// not.
    pub fn wait_cycle(&self, from: &Node, to: &Node) -> Option<Vec<Node>> {
        if from == to {
            return Some(vec![to.clone()]);
        }
        // Depth-first from `to` along "waits for" edges, remembering how each node was
        // reached.
        let mut came_from: BTreeMap<Node, Node> = BTreeMap::new();
        let mut stack = vec![to.clone()];
        let mut seen = std::collections::BTreeSet::from([to.clone()]);
        while let Some(node) = stack.pop() {
            for lease in self.leases.values().filter(|l| l.from == node) {
                if seen.insert(lease.to.clone()) {
                    came_from.insert(lease.to.clone(), node.clone());
                    if lease.to == *from {
                        let mut path = vec![from.clone()];
                        let mut at = from.clone();
                        while let Some(prev) = came_from.get(&at) {
                            path.push(prev.clone());
                            at = prev.clone();
                        }
                        path.reverse();
                        return Some(path);
                    }
                    stack.push(lease.to.clone());
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn agent(id: &str) -> Node {
        Node::Agent(id.into())
    }

    fn lease(from: Node, to: Node, deadline_ms: u64) -> Lease {
        Lease {
            id: DispatchId::new(),
            agent_id: match &to {
                Node::Agent(a) => a.clone(),
                _ => "x".into(),
            },
            from,
            to,
            deadline_ms,
        }
    }

    #[test]
    fn a_lease_ends_once_and_expires_at_its_deadline() {
        let mut book = LeaseBook::default();
        let l = lease(agent("a"), agent("b"), 100);
        let id = l.id;
        book.issue(l);
        assert!(!book.is_expired(id, 99));
        assert!(book.is_expired(id, 100));
        assert!(book.finish(id).is_some());
        assert!(book.finish(id).is_none(), "a late end finds nothing");
        assert!(!book.is_expired(id, 1000));
        assert!(book.is_empty());
    }

    #[test]
    fn the_earliest_deadline_and_the_expired_leases_are_those_in_flight() {
        let mut book = LeaseBook::default();
        assert_eq!(book.earliest(), None);
        let (a, b) = (
            lease(agent("u"), agent("a"), 300),
            lease(agent("u"), agent("b"), 100),
        );
        let (ida, idb) = (a.id, b.id);
        book.issue(a);
        book.issue(b);
        assert_eq!(book.earliest(), Some(100));
        assert_eq!(book.expired(99), Vec::<DispatchId>::new());
        assert_eq!(book.expired(100), vec![idb]);
        book.finish(idb);
        assert_eq!(book.earliest(), Some(300));
        assert_eq!(book.expired(1000), vec![ida]);
    }

    #[test]
    fn a_wait_that_would_close_a_loop_is_found_with_its_path() {
        let mut book = LeaseBook::default();
        let user = Node::Conversation(ConversationId::new());
        book.issue(lease(user.clone(), agent("a"), 1));
        book.issue(lease(agent("a"), agent("b"), 1));
        book.issue(lease(agent("b"), agent("c"), 1));
        // c -> a: a waits for b waits for c.
        assert_eq!(
            book.wait_cycle(&agent("c"), &agent("a")),
            Some(vec![agent("a"), agent("b"), agent("c")])
        );
        assert_eq!(
            book.wait_cycle(&agent("a"), &agent("a")),
            Some(vec![agent("a")])
        );
        // Nobody waits for a user's conversation; a fresh dispatch node waits for nobody.
        assert_eq!(book.wait_cycle(&agent("c"), &agent("d")), None);
        assert_eq!(book.wait_cycle(&user, &agent("b")), None);
        assert_eq!(
            book.wait_cycle(&agent("c"), &Node::Dispatch(DispatchId::new())),
            None
        );
    }

    proptest! {
        /// Issuing only what `wait_cycle` allows keeps the graph free of loops, whatever the
        /// order of dispatches and ends.
        #[test]
        fn admitted_waits_never_form_a_loop(
            steps in proptest::collection::vec((0usize..5, 0usize..5, any::<bool>()), 0..40),
        ) {
            let names = ["a", "b", "c", "d", "e"];
            let mut book = LeaseBook::default();
            let mut ids = Vec::new();
            for (from, to, end) in steps {
                if end && !ids.is_empty() {
                    let id = ids.remove(from % ids.len());
                    book.finish(id);
                    continue;
                }
                let (f, t) = (agent(names[from]), agent(names[to]));
                if book.wait_cycle(&f, &t).is_none() {
                    let l = lease(f, t, 0);
                    ids.push(l.id);
                    book.issue(l);
                }
            }
            for n in names {
                // A node that reaches itself would be a loop: every edge out of it, followed,
                // never comes back.
                for l in book.leases.values().filter(|l| l.from == agent(n)) {
                    prop_assert!(book.wait_cycle(&agent(n), &l.to).is_none(), "loop through {n}");
                }
            }
        }
    }
}
