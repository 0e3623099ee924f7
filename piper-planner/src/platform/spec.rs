//! `Platform`: what a machine offers — GPUs per node, memory, peak FLOP/s per dtype, measured GEMM and
//! attention efficiency, and the network as levels (node, switch, group, system) with GPU→NIC affinity.
//!
//! Stored as TOML (serde). `piper calibrate` writes the same format for the machine it runs on.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use super::tables::GemmTable;
use crate::error::{Error, Result};
use crate::limits;

/// One training platform.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Platform {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// GPUs (ranks) per node.
    pub gpus_per_node: u64,
    /// Cores the node's ranks share, on a CPU platform (with `threads`; absent: every rank has its own
    /// device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores_per_node: Option<u64>,
    /// Memory of one GPU, GiB.
    pub gpu_memory_gib: f64,
    /// Memory a rank loses to the framework, runtime, communication buffers and workspace, GiB.
    pub framework_overhead_gib: f64,
    /// GPU memory bandwidth, GB/s (optimizer step).
    pub memory_gbs: f64,
    /// Attention-core efficiency (achieved / peak) by sequence length: `[[seq_len, efficiency], ...]`.
    pub attention_efficiency: Vec<[f64; 2]>,
    /// Dense matrix peak per GPU (per core on a CPU platform with `threads`), TFLOP/s, by dtype (`bf16`,
    /// `fp16`, `fp32`, ...).
    pub peak_tflops: BTreeMap<String, f64>,
    /// Measured GEMM efficiency tables, one per weight shape.
    pub gemm_efficiency: Vec<GemmTable>,
    /// Measured efficiency of the runtime's routed experts (n = expert width f, k = model width d, m =
    /// tokens per expert), a full grid over f and d; absent: the GEMM tables stand for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub experts_efficiency: Vec<GemmTable>,
    pub topology: Topology,
    /// The runtime's non-GEMM costs and real memory, where measured (CPU runtimes; see `runtime.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<super::runtime::RuntimeCosts>,
    /// A CPU platform's compute costs per thread count of a rank (see `threads.rs`); the top-level
    /// efficiency tables and runtime costs are then those of one thread.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<super::tables::ThreadCosts>,
    /// What the runtime pays per class of work, measured from its profiled steps (CPU platforms; see
    /// `step_costs.rs`); with `threads`, those of one thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_costs: Option<super::step_costs::StepCosts>,
    /// γ of [`Platform::time_share`] (absent: 1), measured by calibration on CPU platforms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_share_exponent: Option<f64>,
    /// The dtype the platform's runtime trains in, the planner's default `--dtype` (absent: bf16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_dtype: Option<String>,
    /// Whether the platform's runtime runs flash attention (absent: yes). Without it the s² attention
    /// scores are held for the backward, and the planner prices every plan so (`--no-flash-attention`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_attention: Option<bool>,
    /// Whether the platform's runtime recomputes the routed experts' activation in their backward
    /// instead of holding it (absent: no; Piper's fused routed-experts op does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_activation_recomputed: Option<bool>,
    /// Whether the platform's runtime computes the shared experts while the expert dispatch's rows
    /// travel (absent: no; Piper's runtime does, `--overlap on`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert_overlap: Option<bool>,
    /// Measured ÷ predicted of the runs in the history (`piper calibrate --refine`); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refinement: Option<super::refinement::Refinement>,
}

/// A network level's cost: per-node bandwidth and a per-message cost.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Bandwidth one node can sustain to peers at this level (all its NICs), GB/s per direction.
    pub node_gbs: f64,
    /// Cost of one message at the sender (software + wire latency), µs.
    pub latency_us: f64,
}

/// Ranks → nodes → switches → groups (racks / dragonfly groups) → system.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Bandwidth between GPU pairs inside a node, GB/s per direction (`gpus_per_node²`; the diagonal is
    /// ignored). Absent: `intra_node_default_gbs` for every pair.
    #[serde(default)]
    pub intra_node_gbs: Option<Vec<Vec<f64>>>,
    pub intra_node_default_gbs: f64,
    /// Per-message cost inside a node, µs.
    pub intra_node_latency_us: f64,
    pub nics_per_node: u64,
    /// One NIC's bandwidth, GB/s per direction.
    pub nic_gbs: f64,
    /// NIC index each GPU of a node uses (its affine NIC).
    pub gpu_to_nic: Vec<u64>,
    /// Nodes on one switch: the fast single-hop locality domain.
    pub nodes_per_switch: u64,
    /// Switches per group (rack or dragonfly group).
    pub switches_per_group: u64,
    /// Between nodes on one switch.
    pub switch: Link,
    /// Between switches of one group.
    pub group: Link,
    /// Between groups.
    pub system: Link,
    /// Message size at which a network link reaches half its bandwidth (bytes): achieved bandwidth is
    /// `bw · size / (size + half_bandwidth_bytes)`, i.e. each message costs its node
    /// `half_bandwidth_bytes / bw` of NIC time on top of its bytes (messages in flight at once share it).
    pub half_bandwidth_bytes: f64,
    /// Distinct peers one NIC serves at which that per-message cost doubles: connection state, proxy
    /// work and flow congestion grow with the peers an all-to-all talks to (the reason a flat
    /// all-to-all degrades with node count). Cost factor `1 + peers / message_cost_peers`; absent: no
    /// growth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_cost_peers: Option<f64>,
}

/// Where two ranks' traffic travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Same GPU.
    SelfRank,
    /// Same node, GPU to GPU.
    Node,
    /// Same switch, node to node.
    Switch,
    /// Same group, across switches.
    Group,
    /// Across groups.
    System,
}

impl Platform {
    /// Peak TFLOP/s per GPU for a dtype; the error lists what the platform has.
    pub fn peak_flops(&self, dtype: &str) -> Result<f64> {
        self.peak_tflops.get(dtype).map(|t| t * 1e12).ok_or_else(|| {
            let known: Vec<&str> = self.peak_tflops.keys().map(String::as_str).collect();
            Error::invalid(
                format!("platform `{}`", self.name),
                format!("peak_tflops.{dtype}"),
                format!("is not given; the platform has {}; add `{dtype} = <TFLOP/s>` under [peak_tflops] or pick another --dtype", known.join(", ")),
            )
        })
    }

    pub fn gpu_memory_bytes(&self) -> f64 {
        self.gpu_memory_gib * GIB
    }

    /// The history's correction of every prediction (none without `piper calibrate --refine`).
    pub fn refinement(&self) -> super::refinement::Refinement {
        self.refinement.unwrap_or(super::refinement::Refinement::NONE)
    }

    pub fn overhead_bytes(&self) -> f64 {
        self.framework_overhead_gib * GIB
    }

    /// Node holding global rank `rank` (ranks fill nodes in order).
    pub fn node_of(&self, rank: u64) -> u64 {
        rank / self.gpus_per_node
    }

    /// Level crossed between two global ranks.
    pub fn level(&self, a: u64, b: u64) -> Level {
        if a == b {
            return Level::SelfRank;
        }
        let (na, nb) = (self.node_of(a), self.node_of(b));
        let t = &self.topology;
        if na == nb {
            Level::Node
        } else if na / t.nodes_per_switch == nb / t.nodes_per_switch {
            Level::Switch
        } else if na / (t.nodes_per_switch * t.switches_per_group) == nb / (t.nodes_per_switch * t.switches_per_group) {
            Level::Group
        } else {
            Level::System
        }
    }

    /// GB/s between two GPUs of one node, by local index.
    pub fn intra_gbs(&self, local_a: u64, local_b: u64) -> f64 {
        let t = &self.topology;
        t.intra_node_gbs.as_ref().map_or(t.intra_node_default_gbs, |m| m[local_a as usize][local_b as usize])
    }

    /// The network link of a level above the node.
    pub fn link(&self, level: Level) -> Link {
        let t = &self.topology;
        match level {
            Level::SelfRank | Level::Node => {
                Link { node_gbs: t.intra_node_default_gbs, latency_us: t.intra_node_latency_us }
            }
            Level::Switch => t.switch,
            Level::Group => t.group,
            Level::System => t.system,
        }
    }

    /// Bandwidth a node injects into the network through all its NICs, GB/s.
    pub fn injection_gbs(&self) -> f64 {
        self.topology.nics_per_node as f64 * self.topology.nic_gbs
    }

    /// Fraction of link bandwidth a message of `bytes` achieves (one peer).
    pub fn message_efficiency(&self, bytes: f64) -> f64 {
        self.message_efficiency_among(bytes, 1.0)
    }

    /// Fraction of link bandwidth messages of `bytes` achieve when each NIC serves `peers` distinct
    /// peers (see `Topology::message_cost_peers`).
    pub fn message_efficiency_among(&self, bytes: f64, peers: f64) -> f64 {
        let t = &self.topology;
        let growth = t.message_cost_peers.map_or(1.0, |p| 1.0 + peers.max(0.0) / p);
        if bytes <= 0.0 { 1.0 } else { bytes / (bytes + t.half_bandwidth_bytes * growth) }
    }

    /// Nodes in the fast local domain (one switch).
    pub fn nodes_per_switch(&self) -> u64 {
        self.topology.nodes_per_switch
    }

    /// Checks every field (finite, sign, a range some real machine could have); errors name the field
    /// and the fix.
    pub fn validate(&self) -> Result<()> {
        let src = format!("platform `{}`", self.name.escape_debug());
        limits::printable(&src, "name", &self.name)?;
        limits::printable(&src, "description", &self.description)?;
        let bad = |field: &str, why: &str| Err(Error::invalid(src.clone(), field, why));
        const MAX_GBS: f64 = 1e6; // 1 PB/s
        let t = &self.topology;
        let rates = [
            ("gpu_memory_gib", self.gpu_memory_gib, 1e6),
            ("memory_gbs", self.memory_gbs, MAX_GBS),
            ("topology.intra_node_default_gbs", t.intra_node_default_gbs, MAX_GBS),
            ("topology.nic_gbs", t.nic_gbs, MAX_GBS),
            ("topology.switch.node_gbs", t.switch.node_gbs, MAX_GBS),
            ("topology.group.node_gbs", t.group.node_gbs, MAX_GBS),
            ("topology.system.node_gbs", t.system.node_gbs, MAX_GBS),
        ];
        for (field, v, hi) in rates {
            // At least 1 kB/s (and 1 MiB of memory): a slower link or a smaller GPU is a typo, and
            // dividing by a denormal would predict an infinite step.
            limits::number(&src, field, v, 1e-6, hi)?;
        }
        let costs = [
            ("topology.intra_node_latency_us", t.intra_node_latency_us, 1e6),
            ("topology.switch.latency_us", t.switch.latency_us, 1e6),
            ("topology.group.latency_us", t.group.latency_us, 1e6),
            ("topology.system.latency_us", t.system.latency_us, 1e6),
            ("topology.half_bandwidth_bytes", t.half_bandwidth_bytes, 1e12),
        ];
        for (field, v, hi) in costs {
            limits::number(&src, field, v, 0.0, hi)?;
        }
        if let Some(p) = t.message_cost_peers {
            limits::number(&src, "topology.message_cost_peers", p, 1.0, 1e9)?;
        }
        if let Some(r) = &self.runtime {
            r.validate(&src)?;
        }
        limits::number(&src, "framework_overhead_gib", self.framework_overhead_gib, 0.0, 1e6)?;
        if self.framework_overhead_gib >= self.gpu_memory_gib {
            return bad("framework_overhead_gib", "must be below gpu_memory_gib");
        }
        limits::count(&src, "gpus_per_node", self.gpus_per_node, 1, 1 << 12)?;
        if let Some(c) = self.cores_per_node {
            limits::count(&src, "cores_per_node", c, 1, 1 << 20)?;
            if self.threads.is_empty() {
                return bad(
                    "cores_per_node",
                    "comes with [[threads]] tables (compute costs per thread count); recalibrate with `piper calibrate`",
                );
            }
        }
        self.validate_threads(&src)?;
        if let Some(g) = self.time_share_exponent {
            limits::number(&src, "time_share_exponent", g, 0.5, 4.0)?;
        }
        if let Some(sc) = &self.step_costs {
            sc.validate(&src, "step_costs")?;
        }
        if let Some(r) = &self.refinement {
            r.validate(&src)?;
        }
        if let Some(d) = &self.train_dtype
            && !self.peak_tflops.contains_key(d)
        {
            return bad("train_dtype", "must be one of the dtypes under [peak_tflops]");
        }
        if self.peak_tflops.is_empty() {
            return bad("peak_tflops", "needs at least one dtype with a positive TFLOP/s value");
        }
        for (dtype, v) in &self.peak_tflops {
            limits::number(&src, &format!("peak_tflops.{dtype}"), *v, 1e-9, 1e9)?;
        }
        limits::count(&src, "topology.nics_per_node", t.nics_per_node, 1, 1 << 12)?;
        limits::count(&src, "topology.nodes_per_switch", t.nodes_per_switch, 1, 1 << 20)?;
        limits::count(&src, "topology.switches_per_group", t.switches_per_group, 1, 1 << 20)?;
        if t.gpu_to_nic.len() as u64 != self.gpus_per_node || t.gpu_to_nic.iter().any(|n| *n >= t.nics_per_node) {
            return bad(
                "topology.gpu_to_nic",
                "needs one NIC index < nics_per_node for each of the gpus_per_node GPUs",
            );
        }
        if let Some(m) = &t.intra_node_gbs {
            let g = self.gpus_per_node as usize;
            if m.len() != g || m.iter().any(|row| row.len() != g) {
                return bad("topology.intra_node_gbs", "must be a gpus_per_node × gpus_per_node matrix");
            }
            if m.iter().enumerate().any(|(i, row)| {
                row.iter().enumerate().any(|(j, v)| i != j && !(v.is_finite() && *v >= 1e-6 && *v <= MAX_GBS))
            }) {
                return bad("topology.intra_node_gbs", "off-diagonal entries must be finite positive GB/s");
            }
        }
        if self.gemm_efficiency.is_empty() {
            return bad("gemm_efficiency", "needs at least one measured table");
        }
        for (i, table) in self.gemm_efficiency.iter().enumerate() {
            check_curve(&src, &format!("gemm_efficiency[{i}].points"), &table.points)?;
            limits::count(&src, &format!("gemm_efficiency[{i}].n"), table.n, 1, limits::MAX_FFN)?;
            limits::count(&src, &format!("gemm_efficiency[{i}].k"), table.k, 1, limits::MAX_FFN)?;
        }
        check_experts_grid(&src, "experts_efficiency", &self.experts_efficiency)?;
        check_curve(&src, "attention_efficiency", &self.attention_efficiency)
    }
}

/// Experts tables: each curve valid, one table per (f, d) of a full grid.
pub(super) fn check_experts_grid(src: &str, field: &str, tables: &[GemmTable]) -> Result<()> {
    for (i, t) in tables.iter().enumerate() {
        check_curve(src, &format!("{field}[{i}].points"), &t.points)?;
    }
    let mut fs: Vec<u64> = tables.iter().map(|t| t.n).collect();
    let mut ds: Vec<u64> = tables.iter().map(|t| t.k).collect();
    fs.sort_unstable();
    fs.dedup();
    ds.sort_unstable();
    ds.dedup();
    let full = fs.iter().all(|f| ds.iter().all(|d| tables.iter().filter(|t| t.n == *f && t.k == *d).count() == 1));
    if full {
        Ok(())
    } else {
        Err(Error::invalid(src, field, "needs exactly one table for each pair of the measured f (n) and d (k) values"))
    }
}

/// A curve of `[x, efficiency]` points: non-empty, `x` increasing and positive, efficiency in (0, 1].
pub(super) fn check_curve(src: &str, field: &str, points: &[[f64; 2]]) -> Result<()> {
    let ok = !points.is_empty()
        && points.iter().all(|[x, e]| x.is_finite() && *x > 0.0 && *x <= 1e12 && *e >= 1e-6 && *e <= 1.0)
        && points.windows(2).all(|w| w[0][0] < w[1][0]);
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            src,
            field,
            "must list [x, efficiency] points with 0 < x ≤ 1e12 increasing and 1e-6 ≤ efficiency ≤ 1",
        ))
    }
}

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
