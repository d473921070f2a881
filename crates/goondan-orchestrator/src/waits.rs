//! Who waits for whom: one edge per synchronous request in flight, from the
//! caller's instance to the target's.
//!
//! An agent instance runs one turn at a time, so an instance with a
//! synchronous request in flight is blocked until it is answered. A new
//! synchronous request from `caller` to `target` therefore deadlocks exactly
//! when `target` already waits, directly or through others, for `caller`
//! (A → B → A, A → A, or A → B → C → A): it is refused at once with the
//! cycle in the message, instead of hanging until its timeout.

use std::collections::{BTreeMap, BTreeSet};

use goondan_ipc::AgentInstance;

/// The edges of synchronous requests in flight, by correlation id.
#[derive(Debug, Default)]
pub struct WaitGraph {
    edges: BTreeMap<String, (AgentInstance, AgentInstance)>,
}

impl WaitGraph {
    /// The cycle a request from `caller` to `target` would close, as the
    /// path `caller → target → … → caller`; `None` if it closes none.
    pub fn cycle(&self, caller: &AgentInstance, target: &AgentInstance) -> Option<Vec<AgentInstance>> {
        if caller == target {
            return Some(vec![caller.clone(), target.clone()]);
        }
        // Depth-first from the target along "waits for" edges, looking for the caller.
        let mut path = vec![target.clone()];
        let mut seen = BTreeSet::from([target.clone()]);
        if self.reach(caller, &mut path, &mut seen) {
            let mut cycle = vec![caller.clone()];
            cycle.extend(path);
            return Some(cycle);
        }
        None
    }

    fn reach(&self, goal: &AgentInstance, path: &mut Vec<AgentInstance>, seen: &mut BTreeSet<AgentInstance>) -> bool {
        let Some(from) = path.last().cloned() else { return false };
        for (waiter, waited) in self.edges.values() {
            if *waiter != from {
                continue;
            }
            if waited == goal {
                path.push(waited.clone());
                return true;
            }
            if seen.insert(waited.clone()) {
                path.push(waited.clone());
                if self.reach(goal, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }

    /// A synchronous request is in flight.
    pub fn add(&mut self, correlation_id: &str, caller: AgentInstance, target: AgentInstance) {
        self.edges.insert(correlation_id.to_owned(), (caller, target));
    }

    /// It was answered, timed out or dropped.
    pub fn remove(&mut self, correlation_id: &str) {
        self.edges.remove(correlation_id);
    }
}

/// `a@k → b@k → a@k`.
pub fn describe(cycle: &[AgentInstance]) -> String {
    cycle.iter().map(ToString::to_string).collect::<Vec<_>>().join(" → ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> AgentInstance {
        AgentInstance::new(name, "k")
    }

    #[test]
    fn direct_and_indirect_cycles_are_found_and_named() {
        let mut graph = WaitGraph::default();
        assert_eq!(graph.cycle(&node("a"), &node("a")).map(|c| describe(&c)).as_deref(), Some("a@k → a@k"));
        graph.add("1", node("a"), node("b"));
        assert_eq!(graph.cycle(&node("b"), &node("a")).map(|c| describe(&c)).as_deref(), Some("b@k → a@k → b@k"));
        graph.add("2", node("b"), node("c"));
        assert_eq!(graph.cycle(&node("c"), &node("a")).map(|c| describe(&c)).as_deref(), Some("c@k → a@k → b@k → c@k"));
        // Another instance of the same agent is another node.
        assert_eq!(graph.cycle(&node("c"), &AgentInstance::new("a", "other")), None);
        graph.remove("1");
        assert_eq!(graph.cycle(&node("c"), &node("a")), None);
        assert_eq!(graph.cycle(&node("a"), &node("b")), None, "parallel requests to one target are fine");
    }
}
