//! What a CPU runtime really pays per class of work, measured from its own profiled training steps.
//!
//! The time model prices GEMM-like work from efficiency tables (their shape dependence: a skinny expert
//! GEMM runs below a square one) and everything else by the unit it scales with. A runtime fuses and
//! reorders work (one routed-experts op for permute, SwiGLU experts and combine; attention as one op), so
//! counting its element-wise passes by hand goes stale with every kernel change. Instead `piper
//! calibrate`'s runs profile whole training steps of calibration models (`mixtral_train --profile`)
//! and book each of the runtime's operations into one [`WorkClass`]; [`fit_step_costs`] then takes, per
//! class, the measured seconds over what the tables (or the class's unit) predict, summed over the runs:
//! a factor on the tables for GEMM-like classes, a cost per unit for the others.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits;

use super::nnls::{Row, nnls};

/// Classes of a training step's work, as the runtime's profile books them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkClass {
    /// Non-expert GEMMs: attention projections, dense and shared MLPs, router gate, LM head.
    Linear,
    /// Routed experts: dispatch (permute), grouped SwiGLU GEMMs, combine, and under expert
    /// parallelism the expert all-to-all.
    Experts,
    /// The attention core (scores, softmax, context) and its head concatenation.
    Attention,
    /// The rest of a decoder layer: norms, rotary embedding, routing, residuals, autodiff bookkeeping.
    Layer,
    /// Softmax cross-entropy over the vocabulary.
    CrossEntropy,
    /// Gradient clipping and the optimizer step.
    Optimizer,
}

impl WorkClass {
    /// The class of a runtime profile row (`phase`, `op`); `other` is a phase's remainder.
    pub fn of(phase: &str, op: &str) -> Option<WorkClass> {
        match (phase, op) {
            ("gradients" | "optimizer", _) => Some(WorkClass::Optimizer),
            ("forward" | "backward", "linear") => Some(WorkClass::Linear),
            (
                "forward" | "backward",
                "routed experts" | "grouped experts" | "swiglu" | "dispatch" | "combine" | "expert exchange",
            ) => Some(WorkClass::Experts),
            ("forward" | "backward", "attention" | "concat heads") => Some(WorkClass::Attention),
            ("forward" | "backward", "cross-entropy") => Some(WorkClass::CrossEntropy),
            ("forward" | "backward", _) => Some(WorkClass::Layer),
            _ => None,
        }
    }
}

/// One step's work by class, for one rank and one micro-batch: seconds the efficiency tables give for
/// the GEMM-like classes, units for the others (token·hidden per decoder layer, token·vocabulary,
/// parameters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassWork {
    pub linear_table_s: f64,
    pub experts_table_s: f64,
    /// The routed experts' seconds at the peak rate (their FLOPs ÷ peak, whatever the tokens per
    /// expert): beside the tables' seconds, the part of their time that follows the FLOPs alone.
    #[serde(default)]
    pub experts_peak_s: f64,
    pub attention_table_s: f64,
    pub layer_token_dims: f64,
    /// Tokens × routed experts, summed over the MoE layers (routing: scores, selection, their gradient).
    pub routed_token_experts: f64,
    pub vocab_tokens: f64,
    pub params: f64,
    /// Seconds the links take for the step's expert all-to-alls (0 without expert parallelism).
    pub exchange_link_s: f64,
    /// Routed token copies × hidden width, summed over the MoE layers, under expert parallelism (0
    /// without): what the exchange path stages, permutes and combines.
    #[serde(default)]
    pub exchange_token_dims: f64,
    /// Decoder layers (and MTP modules): each pays its ops' fixed costs, whatever its size.
    #[serde(default)]
    pub layers: f64,
}

/// The measured costs of each class (forward + backward; see the module).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepCosts {
    /// Measured ÷ table time of the non-expert GEMMs.
    pub linear: f64,
    /// Measured ÷ table time of the routed experts…
    pub experts: f64,
    /// …plus measured ÷ peak-rate time: the runtime's grouped experts keep a steadier rate across
    /// tokens per expert than the micro-benchmarked tables say (on an Intel Xeon family 6 model 167,
    /// 136–200 GFLOP/s from 63 to 1016 tokens per expert where the tables' efficiency doubles), so
    /// their time is fitted on both. 0: tables alone.
    #[serde(default)]
    pub experts_peak: f64,
    /// Expert parallelism runs dispatch → all-to-all → grouped experts → all-to-all → combine instead
    /// of one fused op. What that path costs beyond the other classes and the links' all-to-all time is
    /// `exchange_experts` more seconds per table second of the experts (the unfused grouped GEMMs)…
    #[serde(default)]
    pub exchange_experts: f64,
    /// …plus `exchange_ns` per routed token copy × hidden unit of a MoE layer (host staging of the
    /// exchange, the permutes, the combine). Both 0: not measured.
    #[serde(default)]
    pub exchange_ns: f64,
    /// Measured ÷ table time of the attention core.
    pub attention: f64,
    /// The rest of a decoder layer, ns per token per hidden unit.
    pub layer_ns: f64,
    /// Routing beyond it, ns per token per routed expert of a MoE layer.
    #[serde(default)]
    pub routing_ns: f64,
    /// Cross-entropy, ns per token per vocabulary entry.
    pub cross_entropy_ns: f64,
    /// Clipping and the optimizer step, ns per parameter.
    pub optimizer_ns: f64,
    /// The gradient reduction of data-parallel replicas beyond the links' ring time, as a fraction of a
    /// replica's forward + backward seconds: replicas run on their own until they sum their gradients,
    /// so the reduction waits for the slowest (and stages each gradient through host memory). 0: not
    /// measured.
    #[serde(default)]
    pub replica_sync: f64,
    /// What each decoder layer pays whatever its size (dispatching its ops, autodiff's bookkeeping,
    /// waking the threads), per class. All 0: not measured.
    #[serde(default)]
    pub per_layer_us: PerLayerCosts,
}

/// The fixed cost of one decoder layer per class, µs: forward + backward per micro-batch, and the
/// optimizer's update of its tensors per step. A narrow model's step is mostly these.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerLayerCosts {
    pub linear: f64,
    pub experts: f64,
    pub attention: f64,
    /// The rest of the layer (norms, rotary, routing, residuals).
    pub layer: f64,
    pub optimizer: f64,
}

impl PerLayerCosts {
    /// Forward + backward µs of one layer and micro-batch.
    pub fn forward_backward(&self) -> f64 {
        self.linear + self.experts + self.attention + self.layer
    }
}

impl StepCosts {
    pub fn validate(&self, src: &str, field: &str) -> Result<()> {
        let values = [
            ("linear", self.linear, 1e3),
            ("experts", self.experts, 1e3),
            ("experts_peak", self.experts_peak, 1e3),
            ("exchange_experts", self.exchange_experts, 1e3),
            ("exchange_ns", self.exchange_ns, 1e6),
            ("attention", self.attention, 1e3),
            ("layer_ns", self.layer_ns, 1e6),
            ("routing_ns", self.routing_ns, 1e6),
            ("cross_entropy_ns", self.cross_entropy_ns, 1e6),
            ("optimizer_ns", self.optimizer_ns, 1e6),
            ("replica_sync", self.replica_sync, 10.0),
            ("per_layer_us.linear", self.per_layer_us.linear, 1e6),
            ("per_layer_us.experts", self.per_layer_us.experts, 1e6),
            ("per_layer_us.attention", self.per_layer_us.attention, 1e6),
            ("per_layer_us.layer", self.per_layer_us.layer, 1e6),
            ("per_layer_us.optimizer", self.per_layer_us.optimizer, 1e6),
        ];
        for (name, v, hi) in values {
            limits::number(src, &format!("{field}.{name}"), v, 0.0, hi)?;
        }
        Ok(())
    }

    /// Forward + backward seconds of `work` (without the optimizer) in an expert group of `ep` ranks.
    pub fn compute_s(&self, w: &ClassWork, ep: u64) -> f64 {
        let experts = if ep > 1 { self.experts + self.exchange_experts } else { self.experts };
        self.linear * w.linear_table_s
            + experts * w.experts_table_s
            + self.experts_peak * w.experts_peak_s
            + self.attention * w.attention_table_s
            + 1e-9
                * (self.layer_ns * w.layer_token_dims
                    + self.routing_ns * w.routed_token_experts
                    + self.cross_entropy_ns * w.vocab_tokens
                    + if ep > 1 { self.exchange_ns * w.exchange_token_dims } else { 0.0 })
            + 1e-6 * self.per_layer_us.forward_backward() * w.layers
    }

    /// Seconds of `work` on one rank holding every expert, class by class (forward + backward; the
    /// optimizer's per step): what a profiled run's rows of each class are set against.
    pub fn class_seconds(&self, w: &ClassWork) -> [(WorkClass, f64); 6] {
        let fixed = |us: f64| 1e-6 * us * w.layers;
        let pl = self.per_layer_us;
        [
            (WorkClass::Linear, self.linear * w.linear_table_s + fixed(pl.linear)),
            (
                WorkClass::Experts,
                self.experts * w.experts_table_s + self.experts_peak * w.experts_peak_s + fixed(pl.experts),
            ),
            (WorkClass::Attention, self.attention * w.attention_table_s + fixed(pl.attention)),
            (
                WorkClass::Layer,
                1e-9 * (self.layer_ns * w.layer_token_dims + self.routing_ns * w.routed_token_experts)
                    + fixed(pl.layer),
            ),
            (WorkClass::CrossEntropy, 1e-9 * self.cross_entropy_ns * w.vocab_tokens),
            (WorkClass::Optimizer, self.optimizer_s(w.params, w.layers)),
        ]
    }

    /// Optimizer seconds of a step updating `params` parameters of `layers` decoder layers.
    pub fn optimizer_s(&self, params: f64, layers: f64) -> f64 {
        1e-9 * self.optimizer_ns * params + 1e-6 * self.per_layer_us.optimizer * layers
    }
}

/// One profiled calibration run: the work the model counts for its step and the seconds per step the
/// runtime booked per class.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRun {
    pub work: ClassWork,
    pub measured: Vec<(WorkClass, f64)>,
    /// For an expert-parallel run: the forward + backward seconds per step of the same model and tokens
    /// per rank on one rank holding every expert (the fused path), measured just before it on the same
    /// cores. `None`: the fitted one-rank costs stand in for it.
    #[serde(default)]
    pub baseline_s: Option<f64>,
}

impl StepRun {
    fn seconds(&self, class: WorkClass) -> f64 {
        self.measured.iter().filter(|(c, _)| *c == class).map(|(_, s)| s).sum()
    }
}

/// Per class, by non-negative least squares over `runs` (one rank each) on relative errors, so a narrow
/// model's short step weighs as much as a wide one's: a factor on the tables (GEMM-like classes) or a
/// cost per unit (the others), plus a fixed cost per decoder layer; the experts under expert
/// parallelism from `exchange_runs` (ranks of an expert group), where given.
pub fn fit_step_costs(runs: &[StepRun], exchange_runs: &[StepRun]) -> Result<StepCosts> {
    let fit = |class: WorkClass, units: fn(&ClassWork) -> Vec<f64>, name: &str, fix: &str| {
        let rows: Vec<Row> = runs
            .iter()
            .map(|r| (units(&r.work), r.seconds(class)))
            .filter(|(_, y)| *y > 0.0)
            .map(|(units, y)| Row { units, y, weight: 1.0 / y })
            .collect();
        // A class no run measured, or whose first unit (the work itself) no run has.
        let measured = rows.iter().any(|r| r.units[0] > 0.0);
        nnls(&rows).filter(|_| measured).ok_or_else(|| Error::invalid("step-cost calibration", name, fix))
    };
    let profile_moe = "the runs have none of this work; profile runs of MoE models";
    let linear = fit(WorkClass::Linear, |w| vec![w.linear_table_s, 1e-6 * w.layers], "linear", profile_moe)?;
    let experts = fit(
        WorkClass::Experts,
        |w| vec![w.experts_table_s, 1e-6 * w.layers, w.experts_peak_s],
        "experts",
        profile_moe,
    )?;
    let attention =
        fit(WorkClass::Attention, |w| vec![w.attention_table_s, 1e-6 * w.layers], "attention", profile_moe)?;
    let layer = fit(
        WorkClass::Layer,
        |w| vec![1e-9 * w.layer_token_dims, 1e-9 * w.routed_token_experts, 1e-6 * w.layers],
        "layer",
        "the runs do not vary tokens × width and tokens × experts; add runs of other shapes",
    )?;
    let cross_entropy = fit(WorkClass::CrossEntropy, |w| vec![1e-9 * w.vocab_tokens], "cross_entropy", profile_moe)?;
    let optimizer = fit(WorkClass::Optimizer, |w| vec![1e-9 * w.params, 1e-6 * w.layers], "optimizer", profile_moe)?;
    let fitted = StepCosts {
        linear: linear[0],
        experts: experts[0],
        experts_peak: experts[2],
        exchange_experts: 0.0,
        exchange_ns: 0.0,
        attention: attention[0],
        layer_ns: layer[0],
        routing_ns: layer[1],
        cross_entropy_ns: cross_entropy[0],
        optimizer_ns: optimizer[0],
        replica_sync: 0.0,
        per_layer_us: PerLayerCosts {
            linear: linear[1],
            experts: experts[1],
            attention: attention[1],
            layer: layer[2],
            optimizer: optimizer[1],
        },
    };
    let (exchange_experts, exchange_ns) = fit_exchange(&fitted, exchange_runs)?;
    Ok(StepCosts { exchange_experts, exchange_ns, ..fitted })
}

/// The expert-parallel path's costs: of the expert-parallel runs' forward + backward seconds, what the
/// one-rank costs do not explain (beside the links' all-to-all time) — the whole step, not the experts'
/// rows alone: the exchange's staging and waits and the permutes around it are booked partly outside
/// them — by least squares over the experts' table seconds and the routed token·width (both ≥ 0).
fn fit_exchange(fitted: &StepCosts, exchange_runs: &[StepRun]) -> Result<(f64, f64)> {
    if exchange_runs.is_empty() {
        return Ok((0.0, 0.0));
    }
    let rows: Vec<Row> = exchange_runs
        .iter()
        .map(|r| {
            let compute: f64 = r.measured.iter().filter(|(c, _)| *c != WorkClass::Optimizer).map(|(_, s)| s).sum();
            // Set against its paired fused run where it has one: the machine's speed drifts between
            // the calibration's phases, and the difference of two runs made back to back does not.
            let fused = r.baseline_s.unwrap_or_else(|| fitted.compute_s(&r.work, 1));
            let residual = compute - fused - r.work.exchange_link_s;
            Row { units: vec![r.work.experts_table_s, 1e-9 * r.work.exchange_token_dims], y: residual, weight: 1.0 }
        })
        .collect();
    let total: f64 = rows.iter().map(|r| r.y).sum();
    match nnls(&rows) {
        Some(a) if total.is_finite() && total > 0.0 => Ok((a[0], a[1])),
        _ => Err(Error::invalid(
            "step-cost calibration",
            "exchange_experts",
            "the expert-parallel runs cost no more than one rank's fused experts; profile MoE models with --ep > 1",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_rows_fall_into_classes() {
        assert_eq!(WorkClass::of("forward", "linear"), Some(WorkClass::Linear));
        assert_eq!(WorkClass::of("backward", "routed experts"), Some(WorkClass::Experts));
        assert_eq!(WorkClass::of("backward", "rms norm"), Some(WorkClass::Layer));
        assert_eq!(WorkClass::of("forward", "other"), Some(WorkClass::Layer));
        assert_eq!(WorkClass::of("optimizer", "adamw"), Some(WorkClass::Optimizer));
        assert_eq!(WorkClass::of("p2p", "other"), None);
    }

    /// Runs made from known costs give them back; a class no run has is an error naming it.
    #[test]
    fn the_fit_recovers_the_costs_the_runs_were_made_with() {
        let truth = StepCosts {
            linear: 1.3,
            experts: 0.8,
            experts_peak: 0.4,
            exchange_experts: 0.5,
            exchange_ns: 7.0,
            attention: 2.0,
            layer_ns: 4.0,
            routing_ns: 6.0,
            cross_entropy_ns: 9.0,
            optimizer_ns: 3.0,
            replica_sync: 0.0,
            per_layer_us: PerLayerCosts { linear: 40.0, experts: 0.0, attention: 15.0, layer: 90.0, optimizer: 25.0 },
        };
        let fixed = truth.per_layer_us;
        let run = |scale: f64, experts: f64| {
            let work = ClassWork {
                linear_table_s: 0.01 * scale,
                experts_table_s: 0.02 * scale,
                // Tokens per expert that do not follow the work: the tables' efficiency differs.
                experts_peak_s: 0.005 * scale * [1.0, 2.5, 1.6, 0.7][(scale as usize) % 4],
                attention_table_s: 0.003 * scale,
                layer_token_dims: 1e6 * scale,
                routed_token_experts: 1e4 * scale * experts,
                vocab_tokens: 5e5 * scale,
                params: 2e6 * scale,
                exchange_link_s: 0.0,
                exchange_token_dims: 0.0,
                // Layer counts that do not follow the work (narrow deep models, wide shallow ones).
                layers: [2.0, 6.0, 3.0, 4.0][(scale as usize) % 4],
            };
            let us = 1e-6 * work.layers;
            let measured = vec![
                (WorkClass::Linear, truth.linear * work.linear_table_s * 0.5),
                (WorkClass::Linear, truth.linear * work.linear_table_s * 0.5 + fixed.linear * us),
                (
                    WorkClass::Experts,
                    truth.experts * work.experts_table_s
                        + truth.experts_peak * work.experts_peak_s
                        + fixed.experts * us,
                ),
                (WorkClass::Attention, truth.attention * work.attention_table_s + fixed.attention * us),
                (WorkClass::Layer, 1e-9 * truth.layer_ns * work.layer_token_dims + fixed.layer * us),
                (WorkClass::Layer, 1e-9 * truth.routing_ns * work.routed_token_experts),
                (WorkClass::CrossEntropy, 1e-9 * truth.cross_entropy_ns * work.vocab_tokens),
                (WorkClass::Optimizer, truth.optimizer_s(work.params, work.layers)),
            ];
            StepRun { work, measured, baseline_s: None }
        };
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-9;
        // Expert-parallel runs: the other classes as before, the links' time, and the exchange path's
        // cost (per experts' table second and per routed token·width) booked partly as experts and
        // partly outside them.
        let exchange = |scale: f64, token_dims: f64| {
            let mut r = run(scale, 8.0);
            r.work.exchange_link_s = 0.004;
            r.work.exchange_token_dims = token_dims;
            let path_s = (truth.experts + truth.exchange_experts) * r.work.experts_table_s
                + truth.experts_peak * r.work.experts_peak_s
                + 1e-9 * truth.exchange_ns * token_dims
                + r.work.exchange_link_s;
            r.measured.retain(|(c, _)| *c != WorkClass::Experts);
            r.measured.extend([(WorkClass::Experts, 0.7 * path_s), (WorkClass::Layer, 0.3 * path_s)]);
            r
        };
        let fit = fit_step_costs(
            &[run(1.0, 8.0), run(3.0, 64.0), run(2.0, 16.0)],
            &[exchange(2.0, 4e6), exchange(1.0, 8e6), exchange(3.0, 1e6)],
        )
        .unwrap();
        assert!(close(fit.exchange_experts, 0.5) && close(fit.exchange_ns, 7.0), "{fit:?}");
        let w = exchange(2.0, 4e6).work;
        assert!(close(fit.compute_s(&w, 2) - fit.compute_s(&w, 1), 0.5 * w.experts_table_s + 7e-9 * 4e6));
        assert!(close(fit.linear, 1.3) && close(fit.experts, 0.8) && close(fit.attention, 2.0), "{fit:?}");
        assert!(close(fit.experts_peak, 0.4), "{fit:?}");
        assert!(close(fit.layer_ns, 4.0) && close(fit.routing_ns, 6.0), "{fit:?}");
        assert!(close(fit.cross_entropy_ns, 9.0) && close(fit.optimizer_ns, 3.0));
        let f = fit.per_layer_us;
        assert!(f.experts.abs() < 1e-6, "{f:?}");
        for (got, want) in [(f.linear, 40.0), (f.attention, 15.0), (f.layer, 90.0), (f.optimizer, 25.0)] {
            assert!(close(got, want), "{f:?}");
        }
        assert!(close(fit.compute_s(&w, 1), truth.compute_s(&w, 1)));
        // Class by class, the classes of a step add up to its compute and its update.
        let classes = truth.class_seconds(&w);
        let compute: f64 = classes.iter().filter(|(c, _)| *c != WorkClass::Optimizer).map(|(_, s)| s).sum();
        assert!(close(compute, truth.compute_s(&w, 1)), "{classes:?}");
        assert_eq!(classes[5], (WorkClass::Optimizer, truth.optimizer_s(w.params, w.layers)));
        // The machine 30% slower while the expert-parallel runs ran: set against the fitted one-rank
        // costs, the slowdown reads as exchange cost; against paired fused runs measured at the same
        // speed, the exchange cost comes back.
        let slow = |scale: f64, token_dims: f64| {
            let mut r = exchange(scale, token_dims);
            for (_, s) in &mut r.measured {
                *s *= 1.3;
            }
            r
        };
        let drifted = [slow(2.0, 4e6), slow(1.0, 8e6), slow(3.0, 1e6)];
        let one_rank = [run(1.0, 8.0), run(3.0, 64.0), run(2.0, 16.0)];
        let unpaired = fit_step_costs(&one_rank, &drifted).unwrap();
        assert!(unpaired.exchange_experts > 0.6, "the drift is booked as exchange: {unpaired:?}");
        let paired: Vec<StepRun> = drifted
            .iter()
            .map(|r| {
                let mut r = r.clone();
                // The links slowed with the cores (one time base for the whole run).
                r.work.exchange_link_s *= 1.3;
                StepRun { baseline_s: Some(1.3 * truth.compute_s(&r.work, 1)), ..r }
            })
            .collect();
        let fit_paired = fit_step_costs(&one_rank, &paired).unwrap();
        assert!(
            close(fit_paired.exchange_experts, 1.3 * 0.5) && close(fit_paired.exchange_ns, 1.3 * 7.0),
            "{fit_paired:?}"
        );
        // Runs that do not tell the units apart: the better one-unit fit, never a negative cost.
        let same = fit_step_costs(&[run(1.0, 8.0), run(2.0, 8.0)], &[]).unwrap();
        assert_eq!((same.exchange_experts, same.exchange_ns), (0.0, 0.0));
        assert!(same.layer_ns >= 0.0 && same.routing_ns >= 0.0 && (same.layer_ns == 0.0 || same.routing_ns == 0.0));
        let mut dense = run(1.0, 8.0);
        dense.work.experts_table_s = 0.0;
        let err = fit_step_costs(&[dense], &[]).unwrap_err().to_string();
        assert!(err.contains("experts"), "{err}");
        // Expert-parallel runs whose step the other classes already explain: refused, naming the field.
        let mut idle = run(2.0, 8.0);
        idle.measured.retain(|(c, _)| *c != WorkClass::Experts);
        let err = fit_step_costs(&[run(1.0, 8.0), run(3.0, 64.0)], &[idle]).unwrap_err().to_string();
        assert!(err.contains("exchange_experts"), "{err}");
    }
}
