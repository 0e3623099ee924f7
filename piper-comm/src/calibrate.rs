//! The links and peak of a platform, the first measurement of `piper calibrate` (the paper's loop:
//! micro-benchmark → model → plan), run on every rank of the launch. Every rank runs the GEMMs at once
//! (as ranks would), so the table is the throughput a rank gets under full load; bandwidth and latency
//! come from ping-pongs inside a node and, with two or more nodes, between nodes (all ranks of node 0
//! with their rail peers at once). `piper calibrate` then replaces the compute tables with the runtime's.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::collectives::{all_gather, barrier};
use crate::communicator::{Communicator, wait_all};
use crate::launch::{host_cores, local_ranks, threads_per_rank};
use crate::topology::Topology;
use piper_planner::layout::{
    RUNTIME_EXPERT_ACTIVATION_RECOMPUTED, RUNTIME_FLASH_ATTENTION, RUNTIME_SHARED_EXPERT_OVERLAP,
};
use piper_planner::platform::{GemmTable, Link, Platform, Topology as PlatformTopology};

/// Seconds per call of `f`, the best of `reps` after one warm-up.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Threads one rank gets: the host's cores shared by the ranks on it (as the runtime sizes its pool).
fn rank_threads(ranks_on_node: usize) -> usize {
    threads_per_rank(host_cores(), local_ranks().unwrap_or(ranks_on_node))
}

/// FLOP/s of one f32 GEMM `[m × k] · [k × n]` on `threads` threads.
fn gemm_flops(m: usize, n: usize, k: usize, threads: usize) -> f64 {
    let a = vec![1.0f32; m * k];
    let b = vec![0.5f32; k * n];
    let mut c = vec![0.0f32; m * n];
    let reps = (2e9 / (2.0 * (m * n * k) as f64)).clamp(1.0, 50.0) as usize;
    let t = best_of(reps, || {
        // SAFETY: row-major buffers of exactly m·k, k·n and m·n elements, strides match.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                k as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None },
            )
        }
    });
    std::hint::black_box(&c);
    2.0 * (m * n * k) as f64 / t
}

/// Nominal f32 FLOP/s of one core: FLOPs per cycle from the vector extensions × the highest clock seen.
fn nominal_core_flops() -> (f64, String) {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let per_cycle = if has("avx512f") {
        64.0
    } else if has("avx2") && has("fma") {
        32.0
    } else if has("avx") {
        16.0
    } else {
        8.0
    };
    let mhz = info
        .lines()
        .filter(|l| l.starts_with("cpu MHz"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .max_by(f64::total_cmp)
        .unwrap_or(f64::NAN);
    let mhz = if mhz > 0.0 { mhz } else { 2000.0 };
    (per_cycle * mhz * 1e6, format!("{per_cycle} f32 FLOP/cycle × {mhz:.0} MHz"))
}

/// Round-trip ping-pong between group ranks `a` and `b` with `bytes`; returns one-way seconds (on `a`).
fn ping_pong(world: &dyn Communicator, a: usize, b: usize, bytes: usize, reps: usize) -> Result<f64, String> {
    let me = world.rank();
    let mut best = f64::INFINITY;
    for _ in 0..reps + 1 {
        let t = Instant::now();
        if me == a {
            wait_all(world, vec![world.isend(b, 7, vec![1u8; bytes]).map_err(|e| e.to_string())?], "ping")
                .map_err(|e| e.to_string())?;
            wait_all(world, vec![world.irecv(b, 8, bytes).map_err(|e| e.to_string())?], "pong")
                .map_err(|e| e.to_string())?;
        } else if me == b {
            let got = wait_all(world, vec![world.irecv(a, 7, bytes).map_err(|e| e.to_string())?], "ping")
                .map_err(|e| e.to_string())?;
            wait_all(
                world,
                vec![world.isend(a, 8, got.into_iter().next().unwrap_or_default()).map_err(|e| e.to_string())?],
                "pong",
            )
            .map_err(|e| e.to_string())?;
        }
        best = best.min(t.elapsed().as_secs_f64() / 2.0);
    }
    Ok(best)
}

fn memory_gbs() -> f64 {
    let src = vec![1u8; 64 << 20];
    let mut dst = vec![0u8; 64 << 20];
    let t = best_of(5, || dst.copy_from_slice(&src));
    std::hint::black_box(&dst);
    2.0 * src.len() as f64 / t / 1e9 // read + write
}

/// What [`measure_links`] found: the platform (on rank 0) and a one-line summary of it.
pub struct Links {
    pub platform: Platform,
    pub summary: String,
}

/// Measures the peak, GEMM and attention throughput per rank, the links inside a node and between
/// nodes, and the memory bandwidth, on every rank of `world` at once; rank 0 gets the platform named
/// `name`, the other ranks `None`.
pub fn measure_links(world: &dyn Communicator, topo: &Topology, name: &str) -> Result<Option<Links>, String> {
    let me = world.rank();
    let nodes = topo.nodes();
    let per_node = nodes[0].len();
    // GEMMs: every rank at once.
    barrier(world, "calibrate").map_err(|e| e.to_string())?;
    let ms = [1usize, 16, 64, 256, 1024, 4096];
    // The skinny per-expert and attention-width shapes of small models, and wide ones.
    let shapes = [(256usize, 256usize), (512, 256), (256, 512), (1024, 1024), (2048, 512)];
    let threads = rank_threads(per_node);
    let mut tables = Vec::new();
    for (n, k) in shapes {
        let points: Vec<f64> = ms.iter().map(|m| gemm_flops(*m, n, k, threads)).collect();
        tables.push((n, k, points));
    }
    let attention: Vec<f64> = [64usize, 512, 2048].iter().map(|s| gemm_flops(*s, *s, 64, threads)).collect();
    let (core_peak, core_how) = nominal_core_flops();
    let (peak, peak_how) = (core_peak * threads as f64, format!("{threads} core(s) per rank × {core_how}"));
    // Mean over ranks of each measurement.
    let mine: Vec<f64> = tables.iter().flat_map(|t| t.2.clone()).chain(attention.clone()).collect();
    let all = all_gather(world, &mine, "calibrate gather").map_err(|e| e.to_string())?;
    let mean = |i: usize| all.iter().map(|v| v[i]).sum::<f64>() / all.len() as f64;
    // Communication.
    let intra = if per_node > 1 {
        let (x, y) = (nodes[0][0], nodes[0][1]);
        Some((ping_pong(world, x, y, 8, 50)?, ping_pong(world, x, y, 4 << 20, 5)?))
    } else {
        None
    };
    let inter = if nodes.len() > 1 {
        let (x, y) = (nodes[0][0], nodes[1][0]);
        let lat = ping_pong(world, x, y, 8, 50)?;
        // All of node 0 against their rails on node 1 at once: node bandwidth.
        let bytes = 4 << 20;
        barrier(world, "calibrate").map_err(|e| e.to_string())?;
        let t = Instant::now();
        let rails = nodes[0].len().min(nodes[1].len());
        if let Some(pos) = nodes[0][..rails].iter().position(|r| *r == me) {
            ping_pong(world, me, nodes[1][pos], bytes, 3)?;
        } else if let Some(pos) = nodes[1][..rails].iter().position(|r| *r == me) {
            ping_pong(world, nodes[0][pos], me, bytes, 3)?;
        }
        let dt = t.elapsed().as_secs_f64() / 8.0; // 4 round trips = 8 one-way transfers
        let worst = all_gather(world, &[dt], "calibrate gather")
            .map_err(|e| e.to_string())?
            .iter()
            .map(|v| v[0])
            .max_by(f64::total_cmp)
            .unwrap_or(f64::NAN);
        Some((lat, rails as f64 * bytes as f64 / worst))
    } else {
        None
    };
    let mem = memory_gbs();
    if me != 0 {
        return Ok(None);
    }
    let (intra_lat, intra_bw) = match intra {
        Some((lat, t)) => (lat, (4 << 20) as f64 / t),
        None => (1e-6, mem * 1e9 / 2.0),
    };
    let (net_lat, net_bw, net_note) = match inter {
        Some((lat, bw)) => (lat, bw, "measured between nodes 0 and 1"),
        None => (intra_lat, intra_bw * per_node as f64, "single node: network levels copied from intra-node figures"),
    };
    let eff = |flops: f64| (flops / peak).clamp(1e-4, 1.0);
    let mut ms_points = ms.iter().map(|m| *m as f64).collect::<Vec<_>>();
    ms_points.dedup();
    let gemm_efficiency = tables
        .iter()
        .enumerate()
        .map(|(ti, (n, k, _))| GemmTable {
            n: *n as u64,
            k: *k as u64,
            points: ms_points.iter().enumerate().map(|(i, m)| [*m, eff(mean(ti * ms.len() + i))]).collect(),
        })
        .collect();
    let base = tables.len() * ms.len();
    let attention_efficiency =
        [64.0, 512.0, 2048.0].iter().enumerate().map(|(i, s)| [*s, eff(mean(base + i))]).collect();
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("MemTotal"))?.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(8.0, |kib| kib / 1024.0 / 1024.0);
    let link = Link { node_gbs: net_bw / 1e9, latency_us: net_lat * 1e6 };
    let platform = Platform {
        name: name.to_string(),
        description: format!(
            "calibrated by piper-comm on {} ranks ({} per node, {} nodes); peak {peak_how}; {net_note}",
            world.size(),
            per_node,
            nodes.len()
        ),
        gpus_per_node: per_node as u64,
        cores_per_node: None,
        gpu_memory_gib: (mem_total / per_node as f64 * 0.8).max(1.0),
        framework_overhead_gib: 0.5,
        memory_gbs: mem,
        attention_efficiency,
        peak_tflops: BTreeMap::from([("fp32".to_string(), peak / 1e12), ("bf16".to_string(), peak / 1e12)]),
        gemm_efficiency,
        experts_efficiency: Vec::new(),
        topology: PlatformTopology {
            intra_node_gbs: None,
            intra_node_default_gbs: intra_bw / 1e9,
            intra_node_latency_us: intra_lat * 1e6,
            nics_per_node: 1,
            nic_gbs: net_bw / 1e9,
            gpu_to_nic: vec![0; per_node],
            nodes_per_switch: nodes.len().max(1) as u64,
            switches_per_group: 1,
            half_bandwidth_bytes: net_lat * net_bw,
            message_cost_peers: None,
            switch: link,
            group: link,
            system: link,
        },
        runtime: None,
        threads: Vec::new(),
        step_costs: None,
        time_share_exponent: None,
        train_dtype: None,
        flash_attention: Some(RUNTIME_FLASH_ATTENTION),
        expert_activation_recomputed: Some(RUNTIME_EXPERT_ACTIVATION_RECOMPUTED),
        shared_expert_overlap: Some(RUNTIME_SHARED_EXPERT_OVERLAP),
        refinement: None,
    };
    platform.validate().map_err(|e| format!("calibration produced an invalid platform: {e}"))?;
    let summary = format!(
        "peak {:.1} GFLOP/s per rank ({peak_how}); GEMM 1024² at m=4096: {:.1} GFLOP/s ({:.0}%); intra-node {:.2} GB/s, {:.1} µs; network {:.3} GB/s per node, {:.1} µs ({net_note}); memory {:.1} GB/s",
        peak / 1e9,
        mean(ms.len() - 1) / 1e9,
        100.0 * eff(mean(ms.len() - 1)),
        intra_bw / 1e9,
        intra_lat * 1e6,
        net_bw / 1e9,
        net_lat * 1e6,
        mem
    );
    Ok(Some(Links { platform, summary }))
}
