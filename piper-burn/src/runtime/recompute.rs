//! Full activation recompute (`--recompute full`, or a plan's `recompute = "full"`): a stage's forward
//! keeps only each decoder layer's input, computed without an autodiff graph; its backward rebuilds one
//! layer at a time from its input, last layer first, and takes that layer's vector-Jacobian product with
//! the gradient of its output. This is what the planner's memory model counts for full recompute
//! (`piper_planner::memory`: e·T·d per layer and micro-batch, plus one layer's working set), and the
//! time model's extra forward and its all-to-alls (an MoE layer's dispatch and combine run again in its
//! recompute, on every rank of the expert group in the same order).
//!
//! The embedding (first stage) and the final norm, LM head and loss (last stage) keep their graphs, as
//! the planner counts their activations outside the layers. Gradients equal those without recompute bit
//! for bit on one process: every weight's gradient comes from the same operations on the same values;
//! only a tied embedding, whose two uses are summed across two backward passes, may differ in the last bit.
//!
//! Legend: b = sequences of the micro-batch, s = sequence length, d = model width.

use burn::optim::GradientsParams;
use burn::prelude::*;

use super::error::{Result, RuntimeError};
use super::grads::accumulate;
use super::stage::{LayerInputs, Saved, Stage, StepState};
use crate::model::StageModel;

impl<M: StageModel> Stage<'_, M> {
    /// The forward of micro-batch i's layers without a graph, keeping their inputs. `x_bsd` is the
    /// stage's input (received, or embedded with its graph). Returns the stage's output (no graph), the
    /// layers' MoE statistics and what the backward needs.
    pub(crate) fn forward_keeping_inputs(
        &self,
        st: &mut StepState<M>,
        x_bsd: Tensor<3>,
    ) -> (Tensor<3>, Vec<crate::MoeStats>, LayerInputs) {
        let frozen = st.frozen.get_or_insert_with(|| self.model.valid());
        let embedded_bsd = (self.shape.index == 0).then(|| x_bsd.clone());
        let mut h_bsd = x_bsd.without_autodiff();
        let mut inputs_bsd = Vec::with_capacity(frozen.num_layers());
        let mut moe = Vec::new();
        for l in 0..frozen.num_layers() {
            inputs_bsd.push(h_bsd.clone());
            let (y_bsd, stats) = frozen.layer_forward(l, h_bsd);
            h_bsd = y_bsd;
            moe.extend(stats);
        }
        let head_input_bsd = self.shape.is_last.then(|| h_bsd.clone().autodiff().require_grad());
        (h_bsd, moe, LayerInputs { inputs_bsd, embedded_bsd, head_input_bsd })
    }

    /// The backward of a micro-batch whose forward kept only its layers' inputs: the head's graph (last
    /// stage), then each layer rebuilt from its input, last first, then the embedding (first stage).
    /// Leaves the gradient of the stage's input in `st.in_grads[i]` (other than the first stage).
    pub(crate) fn backward_recomputing(&self, st: &mut StepState<M>, i: usize, saved: Saved) -> Result<()> {
        let kept = saved.recompute.ok_or(RuntimeError::Internal("recompute: the forward kept no layer inputs"))?;
        let mut g_bsd = match (st.out_grads[i].take(), saved.local_loss, &kept.head_input_bsd) {
            (Some(g), _, _) => g,
            (None, Some(loss), Some(head_in)) => {
                let grads = loss.backward();
                let g =
                    head_in.grad(&grads).ok_or(RuntimeError::Internal("recompute: the head input got no gradient"))?;
                accumulate(&mut st.acc, GradientsParams::from_grads(grads, &self.model), &st.params)?;
                g
            }
            _ => return Err(RuntimeError::Internal("schedule bug: a backward without an output gradient")),
        };
        for (l, x_bsd) in kept.inputs_bsd.into_iter().enumerate().rev() {
            g_bsd = self.layer_backward(st, l, x_bsd, g_bsd)?;
        }
        match kept.embedded_bsd {
            Some(e_bsd) => {
                let grads = (e_bsd * g_bsd).sum().backward();
                accumulate(&mut st.acc, GradientsParams::from_grads(grads, &self.model), &st.params)?;
            }
            None => st.in_grads[i] = Some(g_bsd),
        }
        Ok(())
    }

    /// Layer l rebuilt from its input `x_bsd` with its graph; the vector-Jacobian product with `g_bsd`
    /// (the gradient of its output) plus its router-loss terms. Returns the gradient of its input.
    fn layer_backward(&self, st: &mut StepState<M>, l: usize, x_bsd: Tensor<3>, g_bsd: Tensor<3>) -> Result<Tensor<3>> {
        let s = &self.shape;
        if let Some(d) = &self.dispatcher {
            d.begin_forward();
        }
        let x_bsd = x_bsd.autodiff().require_grad();
        let (y_bsd, stats) = self.model.layer_forward(l, x_bsd.clone());
        let vjp = (y_bsd * g_bsd).sum();
        let objective = match stats.and_then(|m| self.router_loss.terms(&[m], s.num_moe_total)) {
            Some(r) => vjp + r * s.scale,
            None => vjp,
        };
        let grads = objective.backward();
        let gx = x_bsd.grad(&grads).ok_or(RuntimeError::Internal("recompute: a layer input got no gradient"))?;
        accumulate(&mut st.acc, GradientsParams::from_grads(grads, &self.model), &st.params)?;
        Ok(gx)
    }
}
