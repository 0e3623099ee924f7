//! Multi-rank correctness: every algorithm against a host-side reference that each rank computes on its
//! own from the shared seed (no communication), bit for bit.

use crate::dedup::dispatch_dedup;
use piper_comm::alltoall::{Algo, all_to_all_v};
use piper_comm::collectives::{all_gather, barrier};
use piper_comm::communicator::wait_all;
use piper_comm::{Communicator, GroupNodes, Topology};

#[derive(clap::Args)]
pub struct Args {
    /// Seed shared by all ranks.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Random-count cases per algorithm (besides the fixed skewed, zero and empty ones).
    #[arg(long, default_value_t = 6)]
    cases: u64,
    /// Test the failure path instead: this world rank never joins a barrier; the others must report it.
    #[arg(long)]
    absent_rank: Option<usize>,
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Elements rank `s` sends to rank `d` in case `case`.
fn count(kind: &str, seed: u64, case: u64, n: usize, s: usize, d: usize) -> usize {
    let r = mix(seed ^ (case << 32) ^ ((s as u64) << 16) ^ d as u64);
    match kind {
        "random" => (r % 97) as usize * usize::from(!r.is_multiple_of(5)), // some zeros
        "skewed" => {
            if d == case as usize % n {
                257
            } else {
                0
            }
        }
        "zeros" => 0,
        "empty-rank" => {
            if s == case as usize % n || d == case as usize % n {
                0
            } else {
                1 + (r % 31) as usize
            }
        }
        "large" => 65536, // 512 KiB per peer: MPI's rendezvous protocol
        _ => unreachable!(),
    }
}

fn value(seed: u64, s: usize, d: usize, i: usize) -> u64 {
    mix(seed ^ ((s as u64) << 48) ^ ((d as u64) << 32) ^ i as u64)
}

pub fn run<C: Communicator>(world: &C, topo: &Topology, a: Args) -> Result<(), String> {
    let n = world.size();
    let me = world.rank();
    if let Some(absent) = a.absent_rank {
        if me == absent {
            // Stay away longer than the others wait, then leave quietly.
            std::thread::sleep(world.timeout() * 3);
            return Ok(());
        }
        return barrier(world, "barrier (failure test)").map_err(|e| e.to_string());
    }
    let mut checks = 0;
    let kinds: Vec<(&str, u64)> = (0..a.cases)
        .map(|c| ("random", c))
        .chain([("skewed", 1), ("zeros", 0), ("empty-rank", 2), ("large", 0)])
        .collect();
    for (kind, case) in &kinds {
        let send_counts: Vec<usize> = (0..n).map(|d| count(kind, a.seed, *case, n, me, d)).collect();
        let send: Vec<u64> = (0..n).flat_map(|d| (0..send_counts[d]).map(move |i| value(a.seed, me, d, i))).collect();
        let expect: Vec<u64> = (0..n)
            .flat_map(|s| (0..count(kind, a.seed, *case, n, s, me)).map(move |i| value(a.seed, s, me, i)))
            .collect();
        for algo in Algo::ALL {
            let op = format!("{} all-to-all ({kind} case {case})", algo.name());
            let (got, counts) = all_to_all_v(algo, world, topo, &send, &send_counts, &op).map_err(|e| e.to_string())?;
            if got != expect {
                return Err(format!("{op}: received data differs from the reference"));
            }
            if counts != (0..n).map(|s| count(kind, a.seed, *case, n, s, me)).collect::<Vec<_>>() {
                return Err(format!("{op}: received counts differ from the reference"));
            }
            checks += 1;
        }
    }
    // Deduplicating dispatch: top-4 routing of 16 tokens of 64 bytes, against the flat dispatch.
    let tokens = 16;
    let row_bytes = 64;
    let dests_of = |s: usize| -> Vec<Vec<usize>> {
        (0..tokens)
            .map(|t| (0..4).map(|k| (mix(a.seed ^ ((s * 1000 + t * 10 + k) as u64)) % n as u64) as usize).collect())
            .collect()
    };
    let rows_of = |s: usize| -> Vec<u8> {
        (0..tokens * row_bytes).map(|i| (mix((s * 100_000 + i) as u64) & 0xff) as u8).collect()
    };
    let layout = GroupNodes::new(world, topo).map_err(|e| e.to_string())?;
    let (got, _, traffic) = dispatch_dedup(world, &layout, &rows_of(me), row_bytes, &dests_of(me), "dedup dispatch")
        .map_err(|e| e.to_string())?;
    let expect: Vec<u8> = (0..n)
        .flat_map(|s| {
            let rows = rows_of(s);
            dests_of(s)
                .iter()
                .enumerate()
                .flat_map(|(t, ds)| {
                    ds.iter()
                        .filter(|d| **d == me)
                        .flat_map(|_| rows[t * row_bytes..(t + 1) * row_bytes].to_vec())
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    if got != expect {
        return Err("dedup dispatch: received rows differ from the flat dispatch reference".into());
    }
    checks += 1;
    // Split by node, all-reduce and all-gather.
    let node = topo.node_of[me];
    let node_comm = world.split(node as u64, me as u64, &format!("node {node}")).map_err(|e| e.to_string())?;
    let mut v = [me as f32, 1.0];
    node_comm.all_reduce_sum_f32(&mut v, "node all-reduce").map_err(|e| e.to_string())?;
    let members: Vec<usize> = topo.nodes()[node].clone();
    if v != [members.iter().sum::<usize>() as f32, members.len() as f32]
        || node_comm.world_ranks() != members.as_slice()
    {
        return Err(format!(
            "node split/all-reduce: got {v:?} over {:?}, expected members {members:?}",
            node_comm.world_ranks()
        ));
    }
    let gathered = all_gather(world, &[me as u32 * 3], "all-gather").map_err(|e| e.to_string())?;
    if gathered.iter().enumerate().any(|(r, g)| g != &[r as u32 * 3]) {
        return Err("all-gather: wrong contents".into());
    }
    checks += 2;
    // A message shorter or longer than the posted receive is an error naming the sizes, never silent
    // zero padding or truncation (and never an abort of the job).
    if n >= 2 && me < 2 {
        for (sent, posted) in [(8usize, 16usize), (16, 8)] {
            let reply = if me == 0 {
                let p = world.isend(1, 77, vec![7u8; sent]).map_err(|e| e.to_string())?;
                wait_all(world, vec![p], "length check send").map(|_| ())
            } else {
                let p = world.irecv(0, 77, posted).map_err(|e| e.to_string())?;
                match wait_all(world, vec![p], "length check receive") {
                    Ok(_) => return Err(format!("a {sent}-byte message into a {posted}-byte receive passed")),
                    Err(e) if e.to_string().contains(&format!("expected {posted} bytes")) => Ok(()),
                    Err(e) => return Err(format!("length check: unexpected error {e}")),
                }
            };
            reply.map_err(|e| e.to_string())?;
            checks += 1;
        }
    }
    let totals =
        all_gather(world, &[traffic.flat_inter_node_rows as u64, traffic.dedup_inter_node_rows as u64], "traffic")
            .map_err(|e| e.to_string())?;
    barrier(world, "final barrier").map_err(|e| e.to_string())?;
    println!("OK rank {me}/{n} node {node} checks {checks}");
    if me == 0 {
        let flat: u64 = totals.iter().map(|t| t[0]).sum();
        let dedup: u64 = totals.iter().map(|t| t[1]).sum();
        println!("dedup dispatch (top-4): {dedup} inter-node rows instead of {flat}");
        println!("ALL CHECKS PASSED size={n} nodes={} checks_per_rank={checks}", topo.num_nodes());
    }
    Ok(())
}
