//! Recorded schedules of the all-to-all algorithms: each replays to the end with every message matched,
//! at message sizes it was not recorded at, and moves across nodes exactly what a uniform all-to-all
//! with known receive counts must (every block crosses the network once; HALO's relays also get each
//! block's 8-byte count in-band), in as many messages as the algorithm's design says: flat and pairwise
//! one per pair of ranks on different nodes, HALO two per rank and remote node (counts, then data).

use piper_comm::schedule::{Schedule, Size, Step, check, record_uniform, write_rank};
use piper_comm::{Algo, Topology};

fn topologies() -> Vec<Topology> {
    vec![
        Topology::uniform(4, 4).unwrap(),
        Topology::uniform(4, 2).unwrap(),
        Topology::uniform(16, 4).unwrap(),
        Topology::from_nodes(vec![0, 0, 0, 1, 1, 2]).unwrap(),
    ]
}

/// Ordered pairs of ranks on different nodes.
fn inter_pairs(t: &Topology) -> u64 {
    let n = t.world_size();
    (0..n).flat_map(|a| (0..n).map(move |b| (a, b))).filter(|(a, b)| t.node_of[*a] != t.node_of[*b]).count() as u64
}

#[test]
fn every_algorithm_replays_and_moves_each_block_across_the_network_once() {
    for topo in topologies() {
        let pairs = inter_pairs(&topo);
        let remote_nodes: u64 = (0..topo.world_size()).map(|_| topo.num_nodes() as u64 - 1).sum();
        for algo in Algo::ALL {
            let schedule = record_uniform(algo, &topo).unwrap();
            for bytes in [1u64, 3, 4096, 1 << 22] {
                let t = check(&schedule, bytes).unwrap();
                let what = format!("{algo:?} on {:?} at {bytes} B", topo.node_of);
                let (inter_bytes, messages) = match algo {
                    Algo::Flat | Algo::Pairwise => (pairs * bytes, pairs),
                    Algo::Halo => (pairs * (bytes + 8), 2 * remote_nodes),
                };
                assert_eq!(t.inter_bytes, inter_bytes, "{what}");
                assert_eq!(t.inter_messages, messages, "{what}");
            }
        }
    }
}

#[test]
fn halo_relays_inside_nodes_what_the_network_brought() {
    // 4 nodes of 4 ranks, 100 B per peer. Each rank receives 3 local blocks (phase I) and 9 remote
    // blocks from its 3 local peers, each relaying one source of each of the 3 remote nodes (phase III):
    // 12 blocks in 12 messages. The receive counts are known, so no count moves inside a node; each
    // relay's counts came with one vector per remote source, across the network.
    let topo = Topology::uniform(16, 4).unwrap();
    let t = check(&record_uniform(Algo::Halo, &topo).unwrap(), 100).unwrap();
    assert_eq!(t.intra_bytes, 16 * 12 * 100);
    assert_eq!(t.intra_messages, 16 * (3 + 9));
}

fn small() -> Schedule {
    let size = |fixed, per_byte| Size { fixed, per_byte };
    Schedule {
        algo: Algo::Halo,
        node_of: vec![0, 1],
        ranks: vec![
            vec![
                Step::Recv { id: 0, peer: 1, tag: 7, size: size(8, 0) },
                Step::Send { id: 1, peer: 1, tag: 7, size: size(0, 2) },
                Step::Wait { groups: vec![vec![0], vec![1]], then: vec![vec![], vec![]] },
            ],
            vec![
                Step::Send { id: 0, peer: 0, tag: 7, size: size(8, 0) },
                Step::Recv { id: 1, peer: 0, tag: 7, size: size(0, 2) },
                Step::Wait {
                    groups: vec![vec![0, 1]],
                    then: vec![vec![Step::Send { id: 2, peer: 0, tag: 9, size: size(1, 1) }]],
                },
            ],
        ],
    }
}

#[test]
fn a_message_nobody_receives_or_a_size_that_disagrees_is_an_error() {
    let mut s = small();
    // Rank 1's forwarded message has no receive.
    let err = check(&s, 10).unwrap_err().to_string();
    assert!(err.contains("never matched"), "{err}");
    s.ranks[0].push(Step::Recv { id: 2, peer: 1, tag: 9, size: Size { fixed: 1, per_byte: 1 } });
    s.ranks[0].push(Step::Wait { groups: vec![vec![2]], then: vec![vec![]] });
    let t = check(&s, 10).unwrap();
    assert_eq!((t.inter_messages, t.inter_bytes), (3, 8 + 20 + 11));
    s.ranks[0][3] = Step::Recv { id: 2, peer: 1, tag: 9, size: Size { fixed: 2, per_byte: 1 } };
    let err = check(&s, 10).unwrap_err().to_string();
    assert!(err.contains("sends 11 bytes") && err.contains("receives 12"), "{err}");
    // A wait for a message that never comes never ends.
    s.ranks[0][3] = Step::Recv { id: 2, peer: 1, tag: 10, size: Size { fixed: 1, per_byte: 1 } };
    let err = check(&s, 10).unwrap_err().to_string();
    assert!(err.contains("can never finish"), "{err}");
}

#[test]
fn the_text_form_lists_posts_waits_and_what_each_group_forwards() {
    let text = write_rank(&small(), 1);
    let expected = "piper-schedule 1 2 1 halo\nS 0 0 7 8 0\nR 1 0 7 0 2\nW 1\nG 2 0 1\nT 0 1\nS 2 0 9 1 1\nE\n";
    assert_eq!(text, expected);
}

#[test]
fn flat_is_the_native_all_to_all_alone() {
    // The receive counts are known (the dispatcher's one count exchange): no count messages.
    let topo = Topology::uniform(4, 2).unwrap();
    let s = record_uniform(Algo::Flat, &topo).unwrap();
    let [only] = s.ranks[0].as_slice() else { panic!("flat records {:?}", s.ranks[0]) };
    let Step::AllToAll { send, recv } = only else { panic!("flat records {only:?}") };
    let one = Size { fixed: 0, per_byte: 1 };
    assert_eq!((send.as_slice(), recv.as_slice()), (&[one; 4][..], &[one; 4][..]));
}
