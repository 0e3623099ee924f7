//! Pipeline schedules as explicit op lists — the same lists the runtime executes — and a simulator that
//! turns per-stage op times into the step's makespan and bubble.

use serde::Serialize;

use crate::layout::Schedule;

/// One unit of pipeline work on a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "op", content = "micro_batch", rename_all = "snake_case")]
pub enum Op {
    /// Forward of a micro-batch (receive its activations from the previous stage first).
    Forward(u64),
    /// Backward of a micro-batch (receive its output gradient from the next stage first).
    Backward(u64),
}

/// The ops stage `stage` of `pp` runs, in order, for `m` micro-batches.
///
/// GPipe: all forwards, then all backwards. 1F1B: `min(pp − stage − 1, m)` warm-up forwards, then
/// alternate one forward and one backward, then the remaining backwards.
pub fn ops(schedule: Schedule, stage: u64, pp: u64, m: u64) -> Vec<Op> {
    match schedule {
        Schedule::GPipe => (0..m).map(Op::Forward).chain((0..m).map(Op::Backward)).collect(),
        Schedule::OneFOneB => {
            let warmup = (pp - stage - 1).min(m);
            let mut list: Vec<Op> = (0..warmup).map(Op::Forward).collect();
            for i in 0..m - warmup {
                list.push(Op::Forward(warmup + i));
                list.push(Op::Backward(i));
            }
            list.extend((m - warmup..m).map(Op::Backward));
            list
        }
    }
}

/// One instruction of a stage's training step, in the spirit of DeepSpeed's pipeline schedules: the
/// runtime runs each with one handler, and the simulator prices the same stream (its compute
/// instructions, with the receives as the dependencies between stages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "instr", content = "micro_batch", rename_all = "snake_case")]
pub enum Instr {
    /// Take micro-batch `i`'s token ids (first stage: inputs; last stage: targets).
    LoadMicroBatch(u64),
    /// Receive micro-batch `i`'s activations from the previous stage.
    RecvActivation(u64),
    /// Forward of micro-batch `i` through the stage's layers.
    Forward(u64),
    /// Send micro-batch `i`'s output activations to the next stage.
    SendActivation(u64),
    /// Receive the gradient of micro-batch `i`'s output from the next stage.
    RecvGrad(u64),
    /// Backward of micro-batch `i` (gradients accumulate over micro-batches).
    Backward(u64),
    /// Send the gradient of micro-batch `i`'s input to the previous stage.
    SendGrad(u64),
    /// Sum the accumulated gradients over the ranks that hold the same weights.
    ReduceGrads,
    /// Clip, update the weights, and step the learning-rate schedule.
    OptimizerStep,
}

/// The instruction stream of stage `stage` of `pp` for one step with `m` micro-batches: the schedule's
/// op list with the loads, receives and sends around each op, then the gradient reduction and the
/// optimizer step. A single process is the stream of `pp = m = 1`.
pub fn instructions(schedule: Schedule, stage: u64, pp: u64, m: u64) -> Vec<Instr> {
    let (first, last) = (stage == 0, stage + 1 == pp);
    let mut out = Vec::with_capacity(6 * m as usize + 2);
    for op in ops(schedule, stage, pp, m) {
        match op {
            Op::Forward(i) => {
                if first || last {
                    out.push(Instr::LoadMicroBatch(i));
                }
                if !first {
                    out.push(Instr::RecvActivation(i));
                }
                out.push(Instr::Forward(i));
                if !last {
                    out.push(Instr::SendActivation(i));
                }
            }
            Op::Backward(i) => {
                if !last {
                    out.push(Instr::RecvGrad(i));
                }
                out.push(Instr::Backward(i));
                if !first {
                    out.push(Instr::SendGrad(i));
                }
            }
        }
    }
    out.extend([Instr::ReduceGrads, Instr::OptimizerStep]);
    out
}

/// The compute ops of an instruction stream, in order (what the simulator prices).
pub fn compute_ops(stream: &[Instr]) -> Vec<Op> {
    stream
        .iter()
        .filter_map(|i| match *i {
            Instr::Forward(m) => Some(Op::Forward(m)),
            Instr::Backward(m) => Some(Op::Backward(m)),
            _ => None,
        })
        .collect()
}

/// Most micro-batches whose activations a stage holds at once (forwards done, backwards not yet).
pub fn peak_in_flight(schedule: Schedule, stage: u64, pp: u64, m: u64) -> u64 {
    match schedule {
        // Closed forms of the op lists above (`in_flight_of` counts them; tests check both agree).
        Schedule::GPipe => m,
        Schedule::OneFOneB => m.min(pp - stage),
    }
}

/// Peak in-flight count of an explicit op list.
pub fn in_flight_of(ops: &[Op]) -> u64 {
    let (mut live, mut peak) = (0i64, 0i64);
    for op in ops {
        live += if matches!(op, Op::Forward(_)) { 1 } else { -1 };
        peak = peak.max(live);
    }
    peak as u64
}

/// Result of simulating one step's pipeline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Simulation {
    /// Time from the first forward to the last backward, seconds.
    pub makespan_s: f64,
    /// Busy time of each stage.
    pub busy_s: Vec<f64>,
    /// Idle fraction of the stages over the makespan: 1 − Σ busy / (PP · makespan).
    pub bubble_fraction: f64,
    /// Every stage's compute ops in the order it runs them, with their start and end, seconds.
    #[serde(skip)]
    pub timeline: Vec<Vec<TimedOp>>,
}

/// One compute op of the simulated step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TimedOp {
    pub op: Op,
    pub start_s: f64,
    pub end_s: f64,
}

/// Simulates the op lists: stage `s` runs its ops in order, each forward of stage `s > 0` waits for the
/// same micro-batch's forward on `s − 1` plus `p2p_s[s − 1]`, each backward waits for the same
/// micro-batch's backward on `s + 1` plus `p2p_s[s]` (the last stage's backward waits for its forward).
pub fn simulate(schedule: Schedule, m: u64, forward_s: &[f64], backward_s: &[f64], p2p_s: &[f64]) -> Simulation {
    let pp = forward_s.len();
    // The compute ops of the very instruction streams the runtime executes.
    let lists: Vec<Vec<Op>> = (0..pp).map(|s| compute_ops(&instructions(schedule, s as u64, pp as u64, m))).collect();
    let mut fwd_done = vec![vec![f64::NAN; m as usize]; pp];
    let mut bwd_done = vec![vec![f64::NAN; m as usize]; pp];
    let mut next = vec![0usize; pp];
    let mut clock = vec![0.0f64; pp];
    let mut timeline: Vec<Vec<TimedOp>> = vec![Vec::new(); pp];
    let total: usize = lists.iter().map(Vec::len).sum();
    let mut done = 0;
    while done < total {
        let before = done;
        for s in 0..pp {
            while let Some(op) = lists[s].get(next[s]) {
                let ready = match *op {
                    Op::Forward(_) if s == 0 => Some(0.0),
                    Op::Forward(i) => Some(fwd_done[s - 1][i as usize] + p2p_s[s - 1]),
                    Op::Backward(i) if s == pp - 1 => Some(fwd_done[s][i as usize]),
                    Op::Backward(i) => Some(bwd_done[s + 1][i as usize] + p2p_s[s]),
                };
                let Some(ready) = ready.filter(|r| !r.is_nan()) else { break };
                let start = clock[s].max(ready);
                let end = match *op {
                    Op::Forward(i) => {
                        fwd_done[s][i as usize] = start + forward_s[s];
                        start + forward_s[s]
                    }
                    Op::Backward(i) => {
                        bwd_done[s][i as usize] = start + backward_s[s];
                        start + backward_s[s]
                    }
                };
                clock[s] = end;
                timeline[s].push(TimedOp { op: *op, start_s: start, end_s: end });
                next[s] += 1;
                done += 1;
            }
        }
        assert!(done > before, "pipeline op lists deadlocked (a schedule bug)");
    }
    let makespan_s = crate::limits::max_or_zero(clock.iter().copied());
    let busy_s: Vec<f64> = (0..pp).map(|s| m as f64 * (forward_s[s] + backward_s[s])).collect();
    // Clamped: with no idle time, round-off in the sums can leave −2e-16.
    let bubble_fraction =
        if makespan_s > 0.0 { (1.0 - busy_s.iter().sum::<f64>() / (pp as f64 * makespan_s)).max(0.0) } else { 0.0 };
    Simulation { makespan_s, busy_s, bubble_fraction, timeline }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_f_one_b_list_for_four_stages() {
        use Op::*;
        assert_eq!(
            ops(Schedule::OneFOneB, 0, 4, 5),
            vec![
                Forward(0),
                Forward(1),
                Forward(2),
                Forward(3),
                Backward(0),
                Forward(4),
                Backward(1),
                Backward(2),
                Backward(3),
                Backward(4)
            ]
        );
        assert_eq!(ops(Schedule::OneFOneB, 3, 4, 2), vec![Forward(0), Backward(0), Forward(1), Backward(1)]);
    }

    proptest! {
        #[test]
        fn every_micro_batch_runs_forward_then_backward_once(pp in 1u64..9, m in 1u64..20, gpipe: bool) {
            let sched = if gpipe { Schedule::GPipe } else { Schedule::OneFOneB };
            for s in 0..pp {
                let list = ops(sched, s, pp, m);
                prop_assert_eq!(list.len() as u64, 2 * m);
                for i in 0..m {
                    let f = list.iter().position(|o| *o == Op::Forward(i)).unwrap();
                    let b = list.iter().position(|o| *o == Op::Backward(i)).unwrap();
                    prop_assert!(f < b);
                }
                prop_assert_eq!(in_flight_of(&list), peak_in_flight(sched, s, pp, m));
            }
        }

        #[test]
        fn equal_stages_give_the_textbook_bubble(pp in 1u64..12, m in 1u64..40, tf in 0.1f64..3.0, ratio in 1.0f64..3.0, gpipe: bool) {
            // With equal stages and free p2p: makespan (m + p − 1)(t_f + t_b), bubble (p − 1)/(m + p − 1).
            let sched = if gpipe { Schedule::GPipe } else { Schedule::OneFOneB };
            let tb = tf * ratio;
            let sim = simulate(sched, m, &vec![tf; pp as usize], &vec![tb; pp as usize], &vec![0.0; pp as usize]);
            let expect = (pp - 1) as f64 / (m + pp - 1) as f64;
            prop_assert!((sim.bubble_fraction - expect).abs() < 1e-9, "{} vs {}", sim.bubble_fraction, expect);
            prop_assert!((sim.makespan_s - (m + pp - 1) as f64 * (tf + tb)).abs() < 1e-9 * sim.makespan_s.max(1.0));
        }

        #[test]
        fn one_f_one_b_never_holds_more_than_gpipe(pp in 1u64..16, m in 1u64..64) {
            // Counted from the op lists themselves, not from the closed forms.
            for s in 0..pp {
                let one_f = in_flight_of(&ops(Schedule::OneFOneB, s, pp, m));
                let gpipe = in_flight_of(&ops(Schedule::GPipe, s, pp, m));
                prop_assert!(one_f <= gpipe && gpipe == m, "stage {}: 1F1B {} GPipe {}", s, one_f, gpipe);
                prop_assert_eq!(one_f, m.min(pp - s));
            }
        }

        #[test]
        fn the_instruction_stream_wraps_the_op_list(pp in 1u64..9, m in 1u64..12, gpipe: bool) {
            let sched = if gpipe { Schedule::GPipe } else { Schedule::OneFOneB };
            for s in 0..pp {
                let stream = instructions(sched, s, pp, m);
                prop_assert_eq!(compute_ops(&stream), ops(sched, s, pp, m));
                prop_assert_eq!(&stream[stream.len() - 2..], &[Instr::ReduceGrads, Instr::OptimizerStep]);
                let pos = |x: Instr| stream.iter().position(|y| *y == x);
                for i in 0..m {
                    let f = pos(Instr::Forward(i)).unwrap();
                    let b = pos(Instr::Backward(i)).unwrap();
                    // Receives come right before their compute, sends right after; the ends have none.
                    prop_assert_eq!(pos(Instr::RecvActivation(i)), (s > 0).then(|| f - 1));
                    prop_assert_eq!(pos(Instr::SendActivation(i)), (s + 1 < pp).then_some(f + 1));
                    prop_assert_eq!(pos(Instr::RecvGrad(i)), (s + 1 < pp).then(|| b - 1));
                    prop_assert_eq!(pos(Instr::SendGrad(i)), (s > 0).then_some(b + 1));
                    let loads = stream.iter().filter(|x| **x == Instr::LoadMicroBatch(i)).count();
                    prop_assert_eq!(loads, usize::from(s == 0 || s + 1 == pp));
                }
            }
        }
    }

    #[test]
    fn a_single_process_runs_one_forward_and_backward() {
        use Instr::*;
        assert_eq!(
            instructions(Schedule::OneFOneB, 0, 1, 1),
            vec![LoadMicroBatch(0), Forward(0), Backward(0), ReduceGrads, OptimizerStep]
        );
    }

    #[test]
    fn p2p_latency_adds_to_the_critical_path() {
        let free = simulate(Schedule::OneFOneB, 4, &[1.0; 3], &[2.0; 3], &[0.0; 3]);
        let slow = simulate(Schedule::OneFOneB, 4, &[1.0; 3], &[2.0; 3], &[0.5; 3]);
        // The first micro-batch crosses 2 links forward and 2 backward before stage 0 can finish.
        assert!(slow.makespan_s >= free.makespan_s + 4.0 * 0.5 - 1e-12);
    }
}
