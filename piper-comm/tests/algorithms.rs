//! Every all-to-all algorithm against the host-side reference, bit for bit, on in-process worlds with
//! emulated nodes: random, skewed, zero and empty counts; even and uneven nodes; one node.

// The benchmark binary's deduplicating dispatch (it needs `--features mpi` to build as a binary).
#[path = "../src/bin/piper-comm/dedup.rs"]
mod dedup;

use dedup::dispatch_dedup;
use piper_comm::alltoall::{Algo, all_to_all_v, all_to_all_v_bytes_known, post_all_to_all_v_bytes_known, reference};
use piper_comm::{Communicator, GroupNodes, LocalWorld, Topology};
use proptest::prelude::*;

/// Deterministic per-(src, dst, i) payload.
fn value(src: usize, dst: usize, i: usize) -> u64 {
    ((src as u64) << 40) ^ ((dst as u64) << 20) ^ (i as u64).wrapping_mul(0x9E37_79B9)
}

fn check_all_algorithms(node_of: Vec<usize>, counts: Vec<Vec<usize>>) {
    let n = node_of.len();
    let topo = Topology::from_nodes(node_of).unwrap();
    let sends: Vec<Vec<u64>> =
        (0..n).map(|s| (0..n).flat_map(|d| (0..counts[s][d]).map(move |i| value(s, d, i))).collect()).collect();
    let expect = reference(&sends, &counts);
    for algo in Algo::ALL {
        let got =
            LocalWorld::run(n, |c| all_to_all_v(algo, &c, &topo, &sends[c.rank()], &counts[c.rank()], "test").unwrap());
        for (d, (recv, recv_counts)) in got.into_iter().enumerate() {
            assert_eq!(recv, expect[d], "{} rank {d}", algo.name());
            assert_eq!(recv_counts, (0..n).map(|s| counts[s][d]).collect::<Vec<_>>(), "{} rank {d}", algo.name());
        }
        // With the receive counts known in advance (a dispatcher's handle): the same bytes.
        let got = LocalWorld::run(n, |c| {
            let me = c.rank();
            let bytes: Vec<u8> = sends[me].iter().flat_map(|v| v.to_le_bytes()).collect();
            let send_counts: Vec<usize> = counts[me].iter().map(|x| x * 8).collect();
            let recv_counts: Vec<usize> = (0..n).map(|s| counts[s][me] * 8).collect();
            all_to_all_v_bytes_known(algo, &c, &topo, &bytes, &send_counts, &recv_counts, "known").unwrap()
        });
        for (d, recv) in got.into_iter().enumerate() {
            let want: Vec<u8> = expect[d].iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(recv, want, "{} (known counts) rank {d}", algo.name());
        }
        // Posted, with other messages sent and received between posting and waiting: the same bytes.
        let got = LocalWorld::run(n, |c| {
            let me = c.rank();
            let bytes: Vec<u8> = sends[me].iter().flat_map(|v| v.to_le_bytes()).collect();
            let send_counts: Vec<usize> = counts[me].iter().map(|x| x * 8).collect();
            let recv_counts: Vec<usize> = (0..n).map(|s| counts[s][me] * 8).collect();
            let posted =
                post_all_to_all_v_bytes_known(algo, &c, &topo, &bytes, &send_counts, &recv_counts, "posted").unwrap();
            let meanwhile = all_to_all_v(Algo::Flat, &c, &topo, &vec![me as u64; n], &vec![1; n], "meanwhile").unwrap();
            assert_eq!(meanwhile.0, (0..n as u64).collect::<Vec<_>>());
            posted.wait(&c).unwrap()
        });
        for (d, recv) in got.into_iter().enumerate() {
            let want: Vec<u8> = expect[d].iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(recv, want, "{} (posted) rank {d}", algo.name());
        }
    }
}

#[test]
fn zero_counts_everywhere_and_to_one_rank() {
    check_all_algorithms(vec![0, 0, 1, 1], vec![vec![0; 4]; 4]);
    // Rank 3 receives nothing and sends nothing (X-MoE's RCCL deadlock case).
    let counts = (0..4).map(|s| (0..4).map(|d| if s == 3 || d == 3 { 0 } else { s + d + 1 }).collect()).collect();
    check_all_algorithms(vec![0, 0, 1, 1], counts);
}

#[test]
fn skewed_all_to_one() {
    let counts = (0..8).map(|_| (0..8).map(|d| if d == 5 { 300 } else { 0 }).collect()).collect();
    check_all_algorithms(vec![0, 0, 1, 1, 2, 2, 3, 3], counts);
}

#[test]
fn single_node_and_single_rank() {
    check_all_algorithms(vec![0; 4], (0..4).map(|s| (0..4).map(|d| s * 3 + d).collect()).collect());
    check_all_algorithms(vec![0], vec![vec![7]]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn random_counts_on_random_node_shapes(
        nodes in proptest::collection::vec(1usize..4, 1..4),
        seed in any::<u64>(),
        zero_prob in 0u64..4,
    ) {
        let node_of: Vec<usize> = nodes.iter().enumerate().flat_map(|(i, k)| std::iter::repeat_n(i, *k)).collect();
        let n = node_of.len();
        let mut x = seed | 1;
        let mut next = || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
        let counts: Vec<Vec<usize>> = (0..n).map(|_| (0..n).map(|_| if next() % 4 < zero_prob { 0 } else { (next() % 40) as usize }).collect()).collect();
        check_all_algorithms(node_of, counts);
    }

    #[test]
    fn dedup_dispatch_equals_flat_dispatch_of_the_copies(
        nodes in proptest::collection::vec(1usize..4, 1..4),
        tokens in 0usize..12,
        top_k in 1usize..5,
        seed in any::<u64>(),
    ) {
        let node_of: Vec<usize> = nodes.iter().enumerate().flat_map(|(i, k)| std::iter::repeat_n(i, *k)).collect();
        let n = node_of.len();
        let topo = Topology::from_nodes(node_of).unwrap();
        let row_bytes = 12;
        let mut x = seed | 1;
        let mut next = || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
        let dests: Vec<Vec<Vec<usize>>> = (0..n).map(|_| (0..tokens).map(|_| (0..top_k).map(|_| (next() % n as u64) as usize).collect()).collect()).collect();
        let rows: Vec<Vec<u8>> = (0..n).map(|s| (0..tokens * row_bytes).map(|i| (s * 31 + i * 7) as u8).collect()).collect();
        // Reference: the expanded copies sorted by destination (stable in token order).
        let sends: Vec<Vec<u8>> = (0..n).map(|s| (0..n).flat_map(|d| {
            let rows = &rows[s];
            dests[s].iter().enumerate().flat_map(move |(t, ds)| ds.iter().filter(move |x| **x == d).flat_map(move |_| rows[t * row_bytes..(t + 1) * row_bytes].to_vec())).collect::<Vec<_>>()
        }).collect()).collect();
        let counts: Vec<Vec<usize>> = (0..n).map(|s| (0..n).map(|d| row_bytes * dests[s].iter().flatten().filter(|x| **x == d).count()).collect()).collect();
        let expect = reference(&sends, &counts);
        let got = LocalWorld::run(n, |c| {
            let layout = GroupNodes::new(&c, &topo).unwrap();
            dispatch_dedup(&c, &layout, &rows[c.rank()], row_bytes, &dests[c.rank()], "dispatch").unwrap()
        });
        for (d, (recv, per_source, traffic)) in got.into_iter().enumerate() {
            prop_assert_eq!(&recv, &expect[d]);
            prop_assert_eq!(per_source, (0..n).map(|s| counts[s][d] / row_bytes).collect::<Vec<_>>());
            prop_assert!(traffic.dedup_inter_node_rows <= traffic.flat_inter_node_rows);
        }
    }
}

/// Gathering on one rank: the root holds every rank's bytes in rank order (empty ones included), the
/// others nothing; a root outside the group is refused.
#[test]
fn gather_on_a_root_holds_every_ranks_bytes_in_order() {
    use piper_comm::collectives::gather_bytes;
    let data = |r: usize| -> Vec<u8> { (0..r * 3).map(|i| (i * 7 + r) as u8).collect() };
    let got = LocalWorld::run(4, |c| gather_bytes(&c, &data(c.rank()), 2, "gather").unwrap());
    for (r, g) in got.into_iter().enumerate() {
        match g {
            Some(all) => {
                assert_eq!(r, 2);
                assert_eq!(all, (0..4).map(data).collect::<Vec<_>>());
            }
            None => assert_ne!(r, 2),
        }
    }
    let e = LocalWorld::run(2, |c| gather_bytes(&c, &[1], 5, "gather").unwrap_err().to_string());
    assert!(e[0].contains("root"), "{e:?}");
}

/// HALO with known receive counts trusts them for its receives: a relay whose known count from a
/// remote source disagrees with what that source announces stops with an error naming `recv_counts`
/// (its peers stop at their timeout), never with wrong bytes.
#[test]
fn halo_refuses_known_counts_that_disagree_with_the_senders() {
    let topo = Topology::uniform(4, 2).unwrap();
    let out = LocalWorld::run(4, |mut c| {
        c.set_timeout(std::time::Duration::from_secs(2));
        let me = c.rank();
        let mut recv_counts = vec![1usize; 4];
        if me == 0 {
            recv_counts[2] = 2; // rank 2 (the other node) sends 1 byte; rank 0 relays it to itself
        }
        all_to_all_v_bytes_known(Algo::Halo, &c, &topo, &[7u8; 4], &[1; 4], &recv_counts, "known")
            .map_err(|e| e.to_string())
    });
    let e = out[0].as_ref().unwrap_err();
    assert!(e.contains("recv_counts") && e.contains("rank 2"), "{e}");
    assert!(out.iter().all(|r| r.is_err()), "{out:?}");
}
