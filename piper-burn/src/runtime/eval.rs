//! Evaluation on the held-out split (`--eval-every N --eval-tokens T`): the held-out rows, in global
//! batches, go through the plan's layout forward only — each stage's micro-batches in order, receiving
//! from the stage before and sending to the one after, its expert exchanges as in training — on the
//! model without autodiff. Nothing a step keeps changes: no router-bias update, no load counts, no data
//! drawn, so a run trains the same with or without evaluations.
//!
//! Legend: b = sequences of the micro-batch, s = sequence length, d = model width.

use burn::prelude::*;
use piper_comm::communicator::wait_all;

use super::error::{Result, RuntimeError};
use super::job::Job;
use super::setup::RankRun;
use super::stage::{Stage, scalar, to_bytes};
use crate::model::StageModel;

impl<M: StageModel> RankRun<'_, M> {
    /// The mean next-token cross-entropy (nats) of the held-out `rows` (`seq_len + 1` ids each, whole
    /// global batches), the same on every rank.
    pub fn evaluate(&self, job: &Job, rows: &[i64]) -> Result<f64> {
        let (run, s) = (&job.run, &self.stage.shape);
        let batch_ids = run.global_batch * (run.seq_len + 1);
        if batch_ids == 0 || rows.is_empty() || !rows.len().is_multiple_of(batch_ids) {
            return Err(RuntimeError::Internal("evaluation: the held-out rows are not whole global batches"));
        }
        let frozen = self.stage.model.valid();
        let mut ce_sum = 0.0f64;
        for batch in rows.chunks(batch_ids) {
            ce_sum += self.stage.evaluate_batch(&frozen, batch, self.micro_batches)? as f64;
        }
        // Last-stage ranks hold the cross-entropy of their replica's micro-batches; the others add 0.
        let mut sums = [ce_sum as f32];
        job.world.all_reduce_sum_f32(&mut sums, "held-out loss all-reduce")?;
        let evaluated = (rows.len() / batch_ids * self.micro_batches * s.replicas) as f64;
        Ok(sums[0] as f64 / evaluated)
    }
}

impl<M: StageModel> Stage<'_, M> {
    /// One global batch forward through this stage (micro-batch i is the rows training would give it);
    /// returns the summed mean cross-entropy of its micro-batches (last stage) or 0.
    fn evaluate_batch(&self, frozen: &M, ids: &[i64], m: usize) -> Result<f32> {
        let s = &self.shape;
        let mut sends = Vec::new();
        let mut ce_sum = 0.0;
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
                ce_sum += scalar(frozen.head_loss(y_bsd, ids_bs.narrow(1, 1, s.seq)))?;
            } else {
                sends.push(self.world.isend(s.next, (2 * i) as u32, to_bytes(y_bsd)?)?);
            }
        }
        wait_all(self.world, sends, &format!("stage {} held-out sends", s.index))?;
        Ok(ce_sum)
    }
}
