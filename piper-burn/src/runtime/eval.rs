//! Evaluation on the held-out split (`--eval-every N --eval-tokens T`): the held-out rows, in global
//! batches, go through the plan's layout forward only — each stage's micro-batches in order, receiving
//! from the stage before and sending to the one after, its expert exchanges as in training — on the
//! model without autodiff. Nothing a step keeps changes: no router-bias update, no load counts, no data
//! drawn, so a run trains the same with or without evaluations. Besides the loss, the last stage measures
//! the model's own metrics ([`StageModel::eval_metrics`]), summed like the loss.
//!
//! Legend: b = sequences of the micro-batch, s = sequence length, d = model width.

use std::collections::BTreeMap;

use burn::prelude::*;
use piper_comm::communicator::wait_all;

use super::error::{Result, RuntimeError};
use super::job::Job;
use super::setup::RankRun;
use super::stage::{Stage, scalar, to_bytes};
use crate::model::StageModel;

impl<M: StageModel> RankRun<'_, M> {
    /// The mean next-token cross-entropy (nats) of the held-out `rows` (`seq_len + 1` ids each, whole
    /// global batches) and the model's own metrics ([`StageModel::EVAL_METRICS`]), the same on every rank.
    pub fn evaluate(&self, job: &Job, rows: &[i64]) -> Result<HeldOut> {
        let (run, s) = (&job.run, &self.stage.shape);
        let batch_ids = run.global_batch * (run.seq_len + 1);
        if batch_ids == 0 || rows.is_empty() || !rows.len().is_multiple_of(batch_ids) {
            return Err(RuntimeError::Internal("evaluation: the held-out rows are not whole global batches"));
        }
        let frozen = self.stage.model.valid();
        // [cross-entropy, then each metric's sum and count]; last-stage ranks hold their replica's
        // micro-batches', the others add 0.
        let mut sums = vec![0.0f64; 1 + 2 * M::EVAL_METRICS.len()];
        for batch in rows.chunks(batch_ids) {
            self.stage.evaluate_batch(&frozen, batch, self.micro_batches, &mut sums)?;
        }
        let mut sums_f32: Vec<f32> = sums.iter().map(|v| *v as f32).collect();
        job.world.all_reduce_sum_f32(&mut sums_f32, "held-out loss all-reduce")?;
        let evaluated = (rows.len() / batch_ids * self.micro_batches * s.replicas) as f64;
        Ok(HeldOut { loss: sums_f32[0] as f64 / evaluated, metrics: metric_means(M::EVAL_METRICS, &sums_f32[1..])? })
    }
}

/// What an evaluation measured.
pub struct HeldOut {
    /// Mean next-token cross-entropy, nats.
    pub loss: f64,
    /// The model's own metrics: sum ÷ count, leaving out a metric nothing counted.
    pub metrics: BTreeMap<String, f64>,
}

/// Each metric's reduced sum ÷ count (pairs in [`StageModel::EVAL_METRICS`]'s order).
fn metric_means(names: &[&str], sum_count: &[f32]) -> Result<BTreeMap<String, f64>> {
    let mut means = BTreeMap::new();
    for (name, pair) in names.iter().zip(sum_count.chunks(2)) {
        let (sum, count) = (pair[0] as f64, pair[1] as f64);
        if !sum.is_finite() || !count.is_finite() || count < 0.0 {
            return Err(RuntimeError::invalid(
                format!("eval metric `{}`", name.escape_debug()),
                format!(
                    "summed to {sum} over a count of {count}; StageModel::eval_metrics must give finite sums and counts ≥ 0"
                ),
            ));
        }
        if count > 0.0 {
            means.insert(name.to_string(), sum / count);
        }
    }
    Ok(means)
}

impl<M: StageModel> Stage<'_, M> {
    /// One global batch forward through this stage (micro-batch i is the rows training would give it);
    /// the last stage adds each micro-batch's mean cross-entropy to `sums[0]` and its metrics' sums and
    /// counts to the rest.
    fn evaluate_batch(&self, frozen: &M, ids: &[i64], m: usize, sums: &mut [f64]) -> Result<()> {
        let s = &self.shape;
        let mut sends = Vec::new();
        for i in 0..m {
            let first_row = (i * s.replicas + s.data_rank) * s.mbs;
            let rows = ids[first_row * (s.seq + 1)..(first_row + s.mbs) * (s.seq + 1)].to_vec();
            let ids_bs = Tensor::<2, Int>::from_data(TensorData::new(rows, [s.mbs, s.seq + 1]), &self.device);
            let x_bsd = if s.index == 0 {
                frozen.embed_tokens(ids_bs.clone().narrow(1, 0, s.seq))
            } else {
                self.receive(s.prev, 2 * i, "held-out activations", i)?.0
            };
            if let Some(d) = &self.dispatcher {
                d.begin_forward();
            }
            let (y_bsd, _) = frozen.forward_stage(x_bsd);
            if s.is_last {
                let targets_bs = ids_bs.narrow(1, 1, s.seq);
                sums[0] += scalar(frozen.head_loss(y_bsd.clone(), targets_bs.clone()))? as f64;
                add_metrics(M::EVAL_METRICS.len(), &mut sums[1..], frozen.eval_metrics(y_bsd, targets_bs))?;
            } else {
                sends.push(self.world.isend(s.next, (2 * i) as u32, to_bytes(y_bsd)?)?);
            }
        }
        wait_all(self.world, sends, &format!("stage {} held-out sends", s.index))?;
        Ok(())
    }
}

/// Adds one micro-batch's (sum, count) per metric, refusing a list of another length.
fn add_metrics(names: usize, sum_count: &mut [f64], measured: Vec<(f64, f64)>) -> Result<()> {
    if measured.len() != names {
        return Err(RuntimeError::invalid(
            "StageModel::eval_metrics",
            format!(
                "gave {} (sum, count) pairs for the {} metrics EVAL_METRICS names; give one per metric, in order",
                measured.len(),
                names
            ),
        ));
    }
    for (pair, (sum, count)) in sum_count.chunks_mut(2).zip(measured) {
        pair[0] += sum;
        pair[1] += count;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_its_sum_over_its_count_and_one_nothing_counted_is_left_out() {
        let means = metric_means(&["accuracy", "rare"], &[30.0, 40.0, 0.0, 0.0]).unwrap();
        assert_eq!(means.into_iter().collect::<Vec<_>>(), vec![("accuracy".to_string(), 0.75)]);
    }

    #[test]
    fn a_metric_that_is_not_finite_is_refused_naming_it() {
        for bad in [[f32::NAN, 4.0], [1.0, f32::INFINITY], [1.0, -1.0]] {
            let err = metric_means(&["acc\u{1b}[2J"], &bad).unwrap_err().to_string();
            assert!(err.starts_with("eval metric `acc\\u{1b}[2J` summed to"), "{err}");
        }
    }

    #[test]
    fn pairs_of_another_count_than_the_names_are_refused() {
        let mut sums = [0.0; 4];
        let err = add_metrics(2, &mut sums, vec![(1.0, 2.0)]).unwrap_err().to_string();
        assert!(err.contains("StageModel::eval_metrics gave 1 (sum, count) pairs for the 2 metrics"), "{err}");
        add_metrics(2, &mut sums, vec![(1.0, 2.0), (3.0, 4.0)]).unwrap();
        add_metrics(2, &mut sums, vec![(1.0, 2.0), (3.0, 4.0)]).unwrap();
        assert_eq!(sums, [2.0, 4.0, 6.0, 8.0]);
    }
}
