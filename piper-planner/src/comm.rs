//! Communication cost model: expert all-to-all (flat and HALO), pipeline p2p and data-parallel ring
//! all-reduce, on a platform's topology levels.
//!
//! Link model (LogGP-like, messages in flight at once): an exchange pays the latency `α` of the highest
//! level it crosses once, and every message costs its node's NICs `n½ · (1 + P / P½) / bw` on top of its
//! bytes — n½ the platform's half-bandwidth message size, P the distinct peers each NIC serves and P½ the
//! platform's `message_cost_peers` (connection state, proxy work and flow congestion grow with the peers;
//! it is what makes a flat all-to-all degrade with node count). Concurrent messages of a node share its
//! NICs; traffic leaving a switch or a group is also bounded by that level's per-node bandwidth (taper).
//!
//! - **flat** (MPI_Alltoallv / RCCL): every rank sends one message of `B` bytes to each peer: a NIC
//!   serving `c` ranks talks to `c · (ranks − 1)` peers in messages of `B`.
//! - **HALO**: phase I, the intra-node exchange, runs concurrently with phase II, one packed message per
//!   (rank, remote node) of `c·B` bytes (c = group members on the destination node) sent through the
//!   rank's affine NIC to one rank there — `g` times fewer, `g` times larger messages to `g` times fewer
//!   peers — and phase III, the intra-node redistribution of what phase II brought. Phase III follows
//!   phase II: a remote node's data is forwarded as soon as it arrives, but the phase II flows share
//!   the NICs fairly and finish together near the end (as simulated in SimGrid), so little overlaps.
//!   Before its data, HALO sends each remote node's relay this rank's counts to the members there (one
//!   round, one latency); flat and pairwise move only the data. Every rank's receive counts come from
//!   the dispatcher's one count exchange, common to all three.
//!
//! So inside one switch, where messages are few, both cost the same bytes and HALO's extra hop makes it
//! no faster; as nodes are added the flat exchange's peers per NIC grow `g` times faster than HALO's and
//! the gain grows towards `g` for small messages (Piper: ≈ 1 inside a switch group, 1.2–9× at 16–512
//! nodes). Large messages are bandwidth-bound either way (gain → 1).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::platform::{Level, Platform};

/// All-to-all algorithm: the one enum the planner prices, `piper-comm` runs and the runtime's plan
/// names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum A2aAlgo {
    /// The backend's native variable all-to-all (MPI_Alltoallv).
    Flat,
    /// One point-to-point message to every peer at once (priced as flat: the same messages).
    Pairwise,
    /// Hierarchical, topology-aware (Piper §VI).
    Halo,
}

impl A2aAlgo {
    pub const ALL: [A2aAlgo; 3] = [A2aAlgo::Flat, A2aAlgo::Pairwise, A2aAlgo::Halo];

    pub fn name(&self) -> &'static str {
        match self {
            A2aAlgo::Flat => "flat",
            A2aAlgo::Pairwise => "pairwise",
            A2aAlgo::Halo => "halo",
        }
    }

    /// Parses `flat`, `pairwise` or `halo`; the error names `field`.
    pub fn parse(text: &str, field: &str) -> crate::Result<A2aAlgo> {
        A2aAlgo::ALL.into_iter().find(|a| a.name() == text).ok_or_else(|| {
            crate::Error::invalid("all-to-all", field, format!("`{text}` is not one of flat, pairwise, halo"))
        })
    }
}

/// How a group of consecutive ranks sits on the machine, seen from its most loaded node.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupShape {
    /// Group members per node, for each node the group touches.
    nodes: Vec<NodeView>,
}

#[derive(Clone, Debug, PartialEq)]
struct NodeView {
    /// Local indices (0..gpus_per_node) of the members on this node.
    locals: Vec<u64>,
    /// Remote group members and remote group nodes by level: [switch, group, system].
    remote_ranks: [u64; 3],
    remote_nodes: [u64; 3],
    /// Fraction of the node's NICs the members' affine NICs cover.
    nic_fraction: f64,
}

const NET_LEVELS: [Level; 3] = [Level::Switch, Level::Group, Level::System];

impl GroupShape {
    /// Ranks `first, first + stride, …` (`size` of them).
    pub fn new(platform: &Platform, first: u64, size: u64, stride: u64) -> Self {
        let g = platform.gpus_per_node;
        // Members grouped by node (ranks increase, so each node's members are consecutive).
        let mut members: Vec<(u64, Vec<u64>)> = Vec::new();
        for r in (0..size).map(|i| first + i * stride) {
            match members.last_mut() {
                Some((n, locals)) if *n == r / g => locals.push(r % g),
                _ => members.push((r / g, vec![r % g])),
            }
        }
        // Member nodes and ranks per switch and per group, so each node's remote counts by level are
        // differences of totals: linear in the nodes (a pairwise scan took minutes at 10⁵ nodes).
        let t = &platform.topology;
        let switch_of = |n: u64| n / t.nodes_per_switch;
        let group_of = |n: u64| n / (t.nodes_per_switch * t.switches_per_group);
        let mut per_switch: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut per_group: HashMap<u64, (u64, u64)> = HashMap::new();
        let (mut all_nodes, mut all_ranks) = (0u64, 0u64);
        for (n, locals) in &members {
            let r = locals.len() as u64;
            for (map, key) in [(&mut per_switch, switch_of(*n)), (&mut per_group, group_of(*n))] {
                let e = map.entry(key).or_default();
                e.0 += 1;
                e.1 += r;
            }
            all_nodes += 1;
            all_ranks += r;
        }
        let nodes = members
            .iter()
            .map(|(n, locals)| {
                let mine = locals.len() as u64;
                let sw = per_switch[&switch_of(*n)];
                let gr = per_group[&group_of(*n)];
                let remote_nodes = [sw.0 - 1, gr.0 - sw.0, all_nodes - gr.0];
                let remote_ranks = [sw.1 - mine, gr.1 - sw.1, all_ranks - gr.1];
                let mut nics: Vec<u64> = locals.iter().map(|l| t.gpu_to_nic[*l as usize]).collect();
                nics.sort_unstable();
                nics.dedup();
                NodeView {
                    locals: locals.clone(),
                    remote_ranks,
                    remote_nodes,
                    nic_fraction: nics.len() as f64 / t.nics_per_node as f64,
                }
            })
            .collect();
        GroupShape { nodes }
    }

    /// Nodes the group spans.
    pub fn num_nodes(&self) -> u64 {
        self.nodes.len() as u64
    }

    /// Highest level the group crosses.
    pub fn top_level(&self) -> Level {
        let top = self.nodes.iter().flat_map(|n| (0..3).filter(|&l| n.remote_nodes[l] > 0)).max();
        top.map_or(Level::Node, |l| NET_LEVELS[l])
    }
}

/// Time for the members of one node to exchange `bytes` with each other member (concurrently, one
/// message per peer, all in flight at once over their own GPU links; the slowest pair bounds it).
fn intra_exchange_s(platform: &Platform, locals: &[u64], bytes: f64) -> f64 {
    if locals.len() < 2 || bytes <= 0.0 {
        return 0.0;
    }
    let mut slowest = f64::INFINITY;
    for &a in locals {
        for &b in locals.iter().filter(|b| **b != a) {
            slowest = slowest.min(platform.intra_gbs(a, b));
        }
    }
    platform.topology.intra_node_latency_us * 1e-6 + bytes / (slowest * 1e9)
}

/// Time for a node to push its network traffic: `bytes_by_level` ([switch, group, system]) in messages
/// of `msg_bytes` to `peers` distinct peers in all, through the fraction `nic_fraction` of its NICs.
fn network_s(platform: &Platform, bytes_by_level: [f64; 3], msg_bytes: f64, peers: f64, nic_fraction: f64) -> f64 {
    let nics = (platform.topology.nics_per_node as f64 * nic_fraction).max(1.0);
    let eff = platform.message_efficiency_among(msg_bytes, peers / nics);
    let inject = platform.injection_gbs().min(platform.topology.switch.node_gbs) * nic_fraction;
    // Traffic at level ≥ ℓ is bounded by level ℓ's per-node bandwidth (the injection bounds it all).
    let bounds = [inject, platform.topology.group.node_gbs.min(inject), platform.topology.system.node_gbs.min(inject)];
    crate::limits::max_or_zero((0..3).map(|l| bytes_by_level[l..].iter().sum::<f64>() / (bounds[l] * 1e9 * eff)))
}

/// Latency of an exchange whose messages (all in flight at once) reach `count_by_level` peers: the
/// highest level crossed, once.
fn latency_s(platform: &Platform, count_by_level: [u64; 3]) -> f64 {
    let crossed = NET_LEVELS.iter().zip(count_by_level).filter(|(_, n)| *n > 0);
    crate::limits::max_or_zero(crossed.map(|(l, _)| platform.link(*l).latency_us * 1e-6))
}

/// Cost of one all-to-all where every member sends `bytes_per_peer` to every other member.
pub fn all_to_all_s(platform: &Platform, shape: &GroupShape, bytes_per_peer: f64, algo: A2aAlgo) -> f64 {
    if bytes_per_peer <= 0.0 {
        return 0.0;
    }
    let b = bytes_per_peer;
    crate::limits::max_or_zero(shape.nodes.iter().map(|node| {
        let c = node.locals.len() as f64;
        let phase_1 = intra_exchange_s(platform, &node.locals, b);
        let total_remote_nodes: u64 = node.remote_nodes.iter().sum();
        if total_remote_nodes == 0 {
            return phase_1;
        }
        let bytes: [f64; 3] = std::array::from_fn(|l| c * node.remote_ranks[l] as f64 * b);
        match algo {
            A2aAlgo::Flat | A2aAlgo::Pairwise => {
                let peers = c * node.remote_ranks.iter().sum::<u64>() as f64;
                let inter =
                    latency_s(platform, node.remote_ranks) + network_s(platform, bytes, b, peers, node.nic_fraction);
                phase_1.max(inter)
            }
            A2aAlgo::Halo => {
                let remote_ranks: u64 = node.remote_ranks.iter().sum();
                let packed = b * remote_ranks as f64 / total_remote_nodes as f64; // c_dest · B on average
                let peers = c * total_remote_nodes as f64;
                let phase_2 = latency_s(platform, node.remote_nodes)
                    + network_s(platform, bytes, packed, peers, node.nic_fraction);
                // Each member forwards to each local peer the B-sized pieces of every remote source it
                // relays for: remote_ranks / c sources per member.
                let phase_3 = intra_exchange_s(platform, &node.locals, b * remote_ranks as f64 / c);
                // The relays' counts first: one vector per remote node, one latency.
                latency_s(platform, node.remote_nodes) + phase_1.max(phase_2) + phase_3
            }
        }
    }))
}

/// Point-to-point transfer of `bytes` between two ranks while every rank of the node does the same.
pub fn p2p_s(platform: &Platform, from: u64, to: u64, bytes: f64) -> f64 {
    let g = platform.gpus_per_node;
    match platform.level(from, to) {
        Level::SelfRank => 0.0,
        Level::Node => {
            platform.topology.intra_node_latency_us * 1e-6 + bytes / (platform.intra_gbs(from % g, to % g) * 1e9)
        }
        level => {
            let link = platform.link(level);
            let per_rank = link.node_gbs.min(platform.injection_gbs()) / g as f64;
            link.latency_us * 1e-6 + bytes / (per_rank * 1e9 * platform.message_efficiency(bytes))
        }
    }
}

/// Ring all-reduce of `bytes` over a group: 2(n−1)/n · bytes over the ring's slowest link, plus
/// 2(n−1) message latencies. Across nodes the ring(s) use the NICs the members' affinity gives them.
pub fn all_reduce_s(platform: &Platform, shape: &GroupShape, members: u64, bytes: f64) -> f64 {
    if members < 2 || bytes <= 0.0 {
        return 0.0;
    }
    let n = members as f64;
    let steps = 2.0 * (n - 1.0);
    let level = shape.top_level();
    let (gbs, alpha_us) = if level == Level::Node {
        let node = &shape.nodes[0];
        let ring = node.locals.iter().zip(node.locals.iter().cycle().skip(1)).map(|(a, b)| platform.intra_gbs(*a, *b));
        (ring.fold(f64::INFINITY, f64::min), platform.topology.intra_node_latency_us)
    } else {
        let link = platform.link(level);
        let frac = shape.nodes.iter().map(|n| n.nic_fraction).fold(1.0, f64::min);
        (link.node_gbs.min(platform.injection_gbs()) * frac, link.latency_us)
    };
    steps / n * bytes / (gbs * 1e9) + steps * alpha_us * 1e-6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::preset;

    fn level_index(level: Level) -> usize {
        match level {
            Level::Switch => 0,
            Level::Group => 1,
            _ => 2,
        }
    }

    /// The linear count of remote nodes and ranks by level equals the pairwise scan over member nodes
    /// (the independent reference), on a small hierarchy (2 nodes per switch, 3 switches per group)
    /// crossed by aligned, offset, strided and uneven groups.
    #[test]
    fn group_shapes_equal_the_pairwise_count() {
        let mut p = preset("frontier").unwrap();
        p.topology.nodes_per_switch = 2;
        p.topology.switches_per_group = 3;
        let g = p.gpus_per_node;
        for (first, size, stride) in
            [(0, 8, 1), (0, 64, 1), (4, 100, 1), (3, 40, 5), (8, 130, 8), (0, 7, 24), (17, 211, 3)]
        {
            let shape = GroupShape::new(&p, first, size, stride);
            let ranks: Vec<u64> = (0..size).map(|i| first + i * stride).collect();
            let mut nodes: Vec<u64> = ranks.iter().map(|r| r / g).collect();
            nodes.dedup();
            assert_eq!(shape.nodes.len(), nodes.len());
            for (view, n) in shape.nodes.iter().zip(&nodes) {
                let (mut rn, mut rr) = ([0u64; 3], [0u64; 3]);
                for m in nodes.iter().filter(|m| *m != n) {
                    let li = level_index(p.level(n * g, m * g));
                    rn[li] += 1;
                    rr[li] += ranks.iter().filter(|r| *r / g == *m).count() as u64;
                }
                assert_eq!(
                    (view.remote_nodes, view.remote_ranks),
                    (rn, rr),
                    "group ({first}, {size}, {stride}), node {n}"
                );
            }
        }
    }

    #[test]
    fn single_node_halo_equals_flat() {
        let p = preset("frontier").unwrap();
        let shape = GroupShape::new(&p, 0, 8, 1);
        for b in [1e3, 1e6, 1e8] {
            assert_eq!(all_to_all_s(&p, &shape, b, A2aAlgo::Flat), all_to_all_s(&p, &shape, b, A2aAlgo::Halo));
        }
        // 7 messages in flight at once: one latency of 5 µs, then the slowest pair (50 GB/s).
        assert!((all_to_all_s(&p, &shape, 1e8, A2aAlgo::Flat) - (5e-6 + 1e8 / 50e9)).abs() < 1e-12);
    }

    #[test]
    fn flat_inter_node_matches_the_bandwidth_bound() {
        // 2 nodes × 8 ranks, big messages: each node sends 8·8·B bytes over 100 GB/s of NICs.
        let p = crate::paper::with_papers_message_costs(&preset("frontier").unwrap());
        let shape = GroupShape::new(&p, 0, 16, 1);
        let b = 64e6;
        let t = all_to_all_s(&p, &shape, b, A2aAlgo::Flat);
        let bound = 64.0 * b / 100e9;
        // 64 peers (8 ranks × 8 remote ranks) over 4 NICs: 16 per NIC.
        let growth = 1.0 + 16.0 / p.topology.message_cost_peers.unwrap();
        let eff = b / (b + p.topology.half_bandwidth_bytes * growth);
        assert!((t - (10e-6 + bound / eff)).abs() < 1e-12, "{t} vs {bound}");
        // Piper's lower bound T ≥ bytes leaving the node / node injection holds for both algorithms.
        assert!(all_to_all_s(&p, &shape, b, A2aAlgo::Halo) >= bound);
    }

    #[test]
    fn with_the_papers_message_costs_halo_wins_for_small_messages_across_many_nodes() {
        let p = crate::paper::with_papers_message_costs(&preset("frontier").unwrap());
        let shape = GroupShape::new(&p, 0, 8 * 64, 1); // 64 nodes
        let flat = all_to_all_s(&p, &shape, 4096.0, A2aAlgo::Flat);
        let halo = all_to_all_s(&p, &shape, 4096.0, A2aAlgo::Halo);
        assert!(halo < flat / 1.5, "halo {halo} flat {flat}");
        assert_eq!(shape.top_level(), Level::Group);
    }

    fn halo_gain(p: &Platform, nodes: u64, bytes: f64) -> f64 {
        let shape = GroupShape::new(p, 0, nodes * p.gpus_per_node, 1);
        all_to_all_s(p, &shape, bytes, A2aAlgo::Flat) / all_to_all_s(p, &shape, bytes, A2aAlgo::Halo)
    }

    /// On Frontier with the per-message cost fitted to the paper: inside one switch (2–4 nodes) HALO
    /// does not beat flat (its count round and the extra hop cost more than the messages it saves) and
    /// comes within 10% for bandwidth-bound messages; across more nodes its gain for small messages grows
    /// with the nodes (Piper: 1.2–9× at 16–512 nodes), and for bandwidth-bound messages it stays ≈ 1.
    #[test]
    fn with_the_papers_message_costs_halo_gain_grows_with_the_nodes_for_small_messages_only() {
        let p = crate::paper::with_papers_message_costs(&preset("frontier").unwrap());
        for nodes in [2, 4] {
            for b in [4096.0, 65536.0, 1048576.0, 16.0 * 1048576.0] {
                let g = halo_gain(&p, nodes, b);
                assert!(g <= 1.0, "inside one switch: {nodes} nodes, {b} B: gain {g}");
                assert!(b < 1e6 || g >= 0.9, "inside one switch, bandwidth-bound: {nodes} nodes, {b} B: gain {g}");
            }
        }
        let small: Vec<f64> = [16, 32, 64, 128, 256, 512].iter().map(|n| halo_gain(&p, *n, 4096.0)).collect();
        assert!(small.windows(2).all(|w| w[1] > w[0] * 1.1), "gain must grow with nodes: {small:?}");
        assert!((5.0..=10.0).contains(&small[5]), "512 nodes: {}", small[5]);
        for nodes in [16, 512] {
            let g = halo_gain(&p, nodes, 16.0 * 1048576.0);
            assert!((0.9..=1.1).contains(&g), "16 MiB at {nodes} nodes: gain {g}");
        }
    }

    /// On the preset's own figures (no per-message cost) HALO never beats flat on Frontier: the same
    /// bytes leave each node, and HALO adds a count round and an intra-node hop (at 2 nodes and 1 KiB,
    /// where latency is all, it takes 2.4× as long).
    #[test]
    fn on_the_links_alone_halo_never_beats_flat() {
        let p = preset("frontier").unwrap();
        assert_eq!((p.topology.half_bandwidth_bytes, p.topology.message_cost_peers), (0.0, None));
        for nodes in [2, 4, 16, 64, 512] {
            for b in [1024.0, 65536.0, 1048576.0, 16.0 * 1048576.0] {
                let g = halo_gain(&p, nodes, b);
                assert!(g <= 1.0 && g > 0.4, "{nodes} nodes, {b} B: gain {g}");
            }
        }
    }

    #[test]
    fn all_reduce_ring_closed_form_inside_a_node() {
        let p = preset("nvlink-8").unwrap();
        let shape = GroupShape::new(&p, 0, 8, 1);
        let t = all_reduce_s(&p, &shape, 8, 1e9);
        assert!((t - (2.0 * 7.0 / 8.0 * 1e9 / 450e9 + 14.0 * 3e-6)).abs() < 1e-12);
    }

    #[test]
    fn one_member_per_node_uses_one_nic() {
        let p = preset("frontier").unwrap();
        let strided = GroupShape::new(&p, 0, 4, 8); // ranks 0, 8, 16, 24: one per node, same switch
        let t = all_reduce_s(&p, &strided, 4, 1e9);
        assert!((t - (1.5 * 1e9 / 25e9 + 6.0 * 10e-6)).abs() < 1e-12, "{t}");
    }
}
