//! Where ranks sit: world rank → node (and its position inside the node) → switch → group (rack), with
//! GPU→NIC affinity. Built from the running job (ranks sharing a host and network namespace form a node,
//! or Slurm's node ids), from `PIPER_RANKS_PER_NODE` (emulation), or from an explicit list.

use piper_planner::platform::Level;
use serde::{Deserialize, Serialize};

use crate::collectives::all_gather;
use crate::communicator::Communicator;
use crate::error::{CommError, Result};

/// The machine as the job sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Node index of each world rank (nodes numbered by their lowest rank).
    pub node_of: Vec<usize>,
    /// Nodes per switch (the fast single-hop domain) and switches per group (rack / dragonfly group).
    pub nodes_per_switch: usize,
    pub switches_per_group: usize,
    /// NICs per node and the NIC each local position uses.
    pub nics_per_node: usize,
    pub local_nic: Vec<usize>,
}

impl Topology {
    /// `node_of` as given; one switch for everything, one NIC per node.
    pub fn from_nodes(node_of: Vec<usize>) -> Result<Self> {
        if node_of.is_empty() {
            return Err(CommError::invalid("topology", "node_of", "needs at least one rank"));
        }
        // Renumber nodes by first appearance so node ids are dense.
        let mut seen: Vec<usize> = Vec::new();
        let node_of = node_of
            .iter()
            .map(|n| match seen.iter().position(|s| s == n) {
                Some(i) => i,
                None => {
                    seen.push(*n);
                    seen.len() - 1
                }
            })
            .collect::<Vec<_>>();
        let max_local = (0..seen.len()).map(|n| node_of.iter().filter(|x| **x == n).count()).max().unwrap_or(1);
        Ok(Topology {
            node_of,
            nodes_per_switch: usize::MAX,
            switches_per_group: 1,
            nics_per_node: 1,
            local_nic: vec![0; max_local],
        })
    }

    /// `world` ranks, `per_node` consecutive ranks per node (the last node may be smaller).
    pub fn uniform(world: usize, per_node: usize) -> Result<Self> {
        if per_node == 0 {
            return Err(CommError::invalid("topology", "ranks_per_node", "must be ≥ 1"));
        }
        Topology::from_nodes((0..world).map(|r| r / per_node).collect())
    }

    /// Sets the switch/group sizes and NIC affinity (e.g. from a planner platform).
    pub fn with_platform(mut self, platform: &piper_planner::platform::Platform) -> Self {
        self.nodes_per_switch = platform.topology.nodes_per_switch as usize;
        self.switches_per_group = platform.topology.switches_per_group as usize;
        self.nics_per_node = platform.topology.nics_per_node as usize;
        self.local_nic = platform.topology.gpu_to_nic.iter().map(|n| *n as usize).collect();
        self
    }

    /// Detects the topology of a running job. Precedence: `PIPER_RANKS_PER_NODE` (emulation and tests),
    /// Slurm's `SLURM_NODEID`, else (host name, network namespace) — so emulated nodes in separate
    /// network namespaces count as separate nodes.
    pub fn detect<C: Communicator + ?Sized>(world: &C) -> Result<Self> {
        if let Some(v) = std::env::var_os("PIPER_RANKS_PER_NODE") {
            let text = v.to_string_lossy();
            let per_node = text.trim().parse::<usize>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                CommError::invalid(
                    "topology",
                    "PIPER_RANKS_PER_NODE",
                    format!("is `{text}`; it must be a whole number ≥ 1 (ranks per emulated node), or unset"),
                )
            })?;
            return Topology::uniform(world.size(), per_node);
        }
        let key = match std::env::var("SLURM_NODEID").ok().and_then(|v| v.parse::<u64>().ok()) {
            Some(id) => id,
            None => host_key(),
        };
        let keys = all_gather(world, &[key], "topology detection")?;
        Topology::from_nodes(keys.iter().map(|k| k[0] as usize).collect())
    }

    pub fn world_size(&self) -> usize {
        self.node_of.len()
    }

    pub fn num_nodes(&self) -> usize {
        self.node_of.iter().max().map_or(0, |m| m + 1)
    }

    /// World ranks of each node, increasing.
    pub fn nodes(&self) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new(); self.num_nodes()];
        for (r, n) in self.node_of.iter().enumerate() {
            out[*n].push(r);
        }
        out
    }

    /// Position of a world rank inside its node.
    pub fn local_index(&self, rank: usize) -> usize {
        self.node_of[..rank].iter().filter(|n| **n == self.node_of[rank]).count()
    }

    /// NIC a world rank uses.
    pub fn nic(&self, rank: usize) -> usize {
        let local = self.local_index(rank);
        self.local_nic.get(local).copied().unwrap_or(local % self.nics_per_node.max(1))
    }

    /// Level crossed between two world ranks.
    pub fn level(&self, a: usize, b: usize) -> Level {
        let (na, nb) = (self.node_of[a], self.node_of[b]);
        let per_group = self.nodes_per_switch.saturating_mul(self.switches_per_group);
        if a == b {
            Level::SelfRank
        } else if na == nb {
            Level::Node
        } else if na / self.nodes_per_switch == nb / self.nodes_per_switch {
            Level::Switch
        } else if na / per_group == nb / per_group {
            Level::Group
        } else {
            Level::System
        }
    }
}

/// A communicator's members grouped by node, in group-rank terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupNodes {
    /// Group ranks on each node the group touches (nodes ordered by their lowest member).
    pub nodes: Vec<Vec<usize>>,
    /// Node (index into `nodes`) and position inside it, per group rank.
    pub place: Vec<(usize, usize)>,
}

impl GroupNodes {
    pub fn new<C: Communicator + ?Sized>(comm: &C, topo: &Topology) -> Result<Self> {
        let world = comm.world_ranks();
        if let Some(r) = world.iter().find(|r| **r >= topo.world_size()) {
            return Err(CommError::invalid(
                "topology",
                "world_size",
                format!("world rank {r} is outside a topology of {} ranks", topo.world_size()),
            ));
        }
        let mut node_ids: Vec<usize> = Vec::new();
        let mut nodes: Vec<Vec<usize>> = Vec::new();
        let mut place = Vec::with_capacity(world.len());
        for (g, w) in world.iter().enumerate() {
            let n = topo.node_of[*w];
            let i = match node_ids.iter().position(|x| *x == n) {
                Some(i) => i,
                None => {
                    node_ids.push(n);
                    nodes.push(Vec::new());
                    node_ids.len() - 1
                }
            };
            place.push((i, nodes[i].len()));
            nodes[i].push(g);
        }
        Ok(GroupNodes { nodes, place })
    }

    /// The member of `node` that relays traffic from group rank `src` (same position, wrapped: "rails").
    pub fn relay(&self, src: usize, node: usize) -> usize {
        let pos = self.place[src].1;
        let members = &self.nodes[node];
        members[pos % members.len()]
    }
}

/// Identity of this process's node: host name and network namespace.
fn host_key() -> u64 {
    use std::hash::{Hash, Hasher};
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net").map(|p| p.display().to_string()).unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (host.trim(), netns).hash(&mut h);
    h.finish() >> 1 // fits in usize on 64-bit
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::LocalWorld;

    #[test]
    fn uniform_nodes_and_levels() {
        let t = Topology::uniform(10, 4).unwrap();
        assert_eq!(t.nodes(), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
        assert_eq!(t.local_index(9), 1);
        assert_eq!(t.level(0, 3), Level::Node);
        assert_eq!(t.level(0, 4), Level::Switch);
        let f = t.clone().with_platform(&piper_planner::platform::preset("frontier").unwrap());
        assert_eq!(f.nic(5), 0);
        assert_eq!(f.nic(2), 1);
    }

    #[test]
    fn group_relays_wrap_on_uneven_nodes() {
        let comms = LocalWorld::new(5);
        let t = Topology::from_nodes(vec![0, 0, 0, 1, 1]).unwrap();
        let g = GroupNodes::new(&comms[0], &t).unwrap();
        assert_eq!(g.nodes, vec![vec![0, 1, 2], vec![3, 4]]);
        assert_eq!(g.relay(2, 1), 3); // position 2 wraps to position 0 of a 2-rank node
        assert_eq!(g.relay(4, 0), 1);
    }
}
