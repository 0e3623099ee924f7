//! The pipeline simulation when a node's ranks share its cores (more ranks than cores, as on a CPU
//! platform): an op's compute runs slower the more stages compute at the same moment, not by the step's
//! average. A four-stage 1F1B pipeline on two cores computes on one or two stages at a time while it
//! fills and drains (full speed) and on all four in its steady phase (each at a quarter of the node,
//! less the cost of switching); stretching every op by the mean busy share, as a whole-step model does,
//! charges the filling and draining too much and the steady phase too little.
//!
//! Processor sharing, event by event: at any moment the stages inside an op share the node, each
//! progressing at `rate(active)` seconds of work per second ([`simulate_shared`]); the stages waiting
//! for a neighbour's activations or gradients leave the cores to the others. With `rate ≡ 1` it is
//! [`simulate`](crate::schedule::simulate).

use crate::layout::Schedule;
use crate::schedule::{Op, Simulation, TimedOp, compute_ops, instructions};

/// An op a stage is running: what is left of its work (seconds at a whole rank's speed).
#[derive(Clone, Copy)]
struct Running {
    op: Op,
    start_s: f64,
    left_s: f64,
}

/// Where each stage is and what has finished, for the event loop.
struct State {
    lists: Vec<Vec<Op>>,
    next: Vec<usize>,
    running: Vec<Option<Running>>,
    fwd_done: Vec<Vec<f64>>,
    bwd_done: Vec<Vec<f64>>,
    timeline: Vec<Vec<TimedOp>>,
}

/// Simulates `schedule` with `m` micro-batches on stages that share cores, each stage's forward and
/// backward taking `fwd_s[s]` and `bwd_s[s]` seconds alone: `rate(k)` is the speed of each of `k`
/// stages inside an op at once (1 for `k` at most the stages' own cores). Dependencies as in
/// [`simulate`](crate::schedule::simulate): a forward waits for the previous stage's forward plus
/// `p2p_s[s − 1]`, a backward for the next stage's backward plus `p2p_s[s]`.
pub fn simulate_shared(
    schedule: Schedule,
    m: u64,
    fwd_s: &[f64],
    bwd_s: &[f64],
    p2p_s: &[f64],
    rate: &dyn Fn(usize) -> f64,
) -> Simulation {
    let pp = fwd_s.len();
    let lists: Vec<Vec<Op>> = (0..pp).map(|s| compute_ops(&instructions(schedule, s as u64, pp as u64, m))).collect();
    let total: usize = lists.iter().map(Vec::len).sum();
    let times = fwd_s.iter().chain(&bwd_s[..pp]).chain(p2p_s);
    if times.copied().any(|t| !t.is_finite()) {
        // A cost that is not a number makes no schedule: the makespan says so instead of a hang.
        return Simulation {
            makespan_s: f64::NAN,
            busy_s: vec![f64::NAN; pp],
            bubble_fraction: f64::NAN,
            timeline: vec![],
        };
    }
    let mut st = State {
        lists,
        next: vec![0; pp],
        running: vec![None; pp],
        fwd_done: vec![vec![f64::NAN; m as usize]; pp],
        bwd_done: vec![vec![f64::NAN; m as usize]; pp],
        timeline: vec![Vec::new(); pp],
    };
    let (mut now, mut done) = (0.0f64, 0usize);
    while done < total {
        start_ready_ops(&mut st, fwd_s, bwd_s, p2p_s, now);
        let active = st.running.iter().flatten().count();
        let speed = if active > 0 { rate(active) } else { 1.0 };
        // The next event: an op ends, or a stage's next op becomes ready.
        let finish = st.running.iter().flatten().map(|r| r.left_s / speed);
        let arrivals = (0..pp).filter(|s| st.running[*s].is_none()).filter_map(|s| ready_at(&st, s, p2p_s));
        let dt = finish.chain(arrivals.map(|t| t - now).filter(|dt| *dt > 0.0)).fold(f64::INFINITY, f64::min);
        assert!(dt.is_finite(), "pipeline op lists deadlocked (a schedule bug)");
        now += dt;
        done += advance(&mut st, dt, speed, now);
    }
    finish_simulation(st, m)
}

/// When stage `s`'s next op may start (`None`: it waits for an op not yet done, or has none left).
fn ready_at(st: &State, s: usize, p2p_s: &[f64]) -> Option<f64> {
    let last = st.lists.len() - 1;
    let ready = match *st.lists[s].get(st.next[s])? {
        Op::Forward(_) if s == 0 => 0.0,
        Op::Forward(i) => st.fwd_done[s - 1][i as usize] + p2p_s[s - 1],
        Op::Backward(i) if s == last => st.fwd_done[s][i as usize],
        Op::Backward(i) => st.bwd_done[s + 1][i as usize] + p2p_s[s],
    };
    (!ready.is_nan()).then_some(ready)
}

/// Starts the next op of every idle stage whose inputs have arrived by `now`.
fn start_ready_ops(st: &mut State, fwd_s: &[f64], bwd_s: &[f64], p2p_s: &[f64], now: f64) {
    for s in 0..st.running.len() {
        if st.running[s].is_some() || ready_at(st, s, p2p_s).is_none_or(|t| t > now) {
            continue;
        }
        let op = st.lists[s][st.next[s]];
        let left_s = match op {
            Op::Forward(_) => fwd_s[s],
            Op::Backward(_) => bwd_s[s],
        };
        st.running[s] = Some(Running { op, start_s: now, left_s });
    }
}

/// Moves every running op on by `dt` seconds at `speed`; records the ops that end at `now` and returns
/// how many.
fn advance(st: &mut State, dt: f64, speed: f64, now: f64) -> usize {
    // Round-off between an op's remaining time and the step taken.
    const EPS: f64 = 1e-12;
    let mut ended = 0;
    for s in 0..st.running.len() {
        let Some(r) = st.running[s].as_mut() else { continue };
        r.left_s -= dt * speed;
        if r.left_s <= EPS * (1.0 + now) {
            let r = st.running[s].take().expect("running");
            match r.op {
                Op::Forward(i) => st.fwd_done[s][i as usize] = now,
                Op::Backward(i) => st.bwd_done[s][i as usize] = now,
            }
            st.timeline[s].push(TimedOp { op: r.op, start_s: r.start_s, end_s: now });
            st.next[s] += 1;
            ended += 1;
        }
    }
    ended
}

/// The makespan, each stage's busy (wall) time inside its ops, and the idle fraction.
fn finish_simulation(st: State, m: u64) -> Simulation {
    let pp = st.timeline.len();
    let makespan_s = crate::limits::max_or_zero(st.timeline.iter().filter_map(|t| t.last().map(|o| o.end_s)));
    let busy_s: Vec<f64> = st.timeline.iter().map(|t| t.iter().map(|o| o.end_s - o.start_s).sum()).collect();
    debug_assert!(st.timeline.iter().all(|t| t.len() == 2 * m as usize));
    let bubble_fraction =
        if makespan_s > 0.0 { (1.0 - busy_s.iter().sum::<f64>() / (pp as f64 * makespan_s)).max(0.0) } else { 0.0 };
    Simulation { makespan_s, busy_s, bubble_fraction, timeline: st.timeline }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::simulate;
    use proptest::prelude::*;

    proptest! {
        /// At full speed whatever the sharing, it is the plain simulation.
        #[test]
        fn with_no_sharing_it_is_the_plain_simulation(
            pp in 1usize..6, m in 1u64..9, gpipe: bool,
            fwd in proptest::collection::vec(0.1f64..2.0, 6), bwd in proptest::collection::vec(0.1f64..3.0, 6),
            p2p in proptest::collection::vec(0.0f64..0.3, 6),
        ) {
            let sched = if gpipe { Schedule::GPipe } else { Schedule::OneFOneB };
            let plain = simulate(sched, m, &fwd[..pp], &bwd[..pp], &p2p[..pp]);
            let shared = simulate_shared(sched, m, &fwd[..pp], &bwd[..pp], &p2p[..pp], &|_| 1.0);
            prop_assert!((plain.makespan_s - shared.makespan_s).abs() < 1e-9 * plain.makespan_s.max(1.0));
            for (a, b) in plain.timeline.iter().flatten().zip(shared.timeline.iter().flatten()) {
                prop_assert_eq!(a.op, b.op);
                prop_assert!((a.end_s - b.end_s).abs() < 1e-9 * plain.makespan_s.max(1.0));
            }
        }
    }

    #[test]
    fn a_cost_that_is_not_a_number_gives_a_makespan_that_is_not_one() {
        let sim =
            simulate_shared(Schedule::OneFOneB, 2, &[1.0, f64::NAN], &[1.0, 1.0], &[0.0, 0.0], &|k| 1.0 / k as f64);
        assert!(sim.makespan_s.is_nan());
    }

    /// One core under a pipeline that never leaves it idle (no p2p): the makespan is all the stages'
    /// work, whatever the order.
    #[test]
    fn one_core_that_is_never_idle_takes_the_sum_of_the_work() {
        for (sched, pp, m) in [(Schedule::OneFOneB, 2, 8), (Schedule::OneFOneB, 4, 6), (Schedule::GPipe, 3, 5)] {
            let (f, b) = (vec![1.0; pp], vec![2.0; pp]);
            let sim = simulate_shared(sched, m, &f, &b, &vec![0.0; pp], &|k| 1.0 / k as f64);
            let work = (pp as u64 * m) as f64 * 3.0;
            assert!((sim.makespan_s - work).abs() < 1e-9 * work, "{sched:?} pp={pp}: {} vs {work}", sim.makespan_s);
        }
    }

    /// Two stages on one core, traced by hand. GPipe, one micro-batch: never two ops at once, so the
    /// plain makespan, 4 s. Two micro-batches of 1 s ops: F0 on stage 0 alone (0–1); F1 on 0 and F0 on 1
    /// together at half speed (1–3); F1 on 1 alone (3–4) while stage 0 waits for a gradient; B0 on 1
    /// (4–5); B1 on 1 and B0 on 0 together (5–7); B1 on 0 (7–8). Without sharing: 6 s.
    #[test]
    fn two_stages_on_one_core_follow_the_hand_trace() {
        let one_core = |k: usize| 1.0 / k as f64;
        let ones = [1.0, 1.0];
        assert_eq!(simulate_shared(Schedule::GPipe, 1, &ones, &ones, &[0.0, 0.0], &one_core).makespan_s, 4.0);
        let sim = simulate_shared(Schedule::GPipe, 2, &ones, &ones, &[0.0, 0.0], &one_core);
        assert!((sim.makespan_s - 8.0).abs() < 1e-9, "{}", sim.makespan_s);
        let ends: Vec<f64> = sim.timeline[1].iter().map(|o| o.end_s).collect();
        for (got, want) in ends.iter().zip([3.0, 4.0, 5.0, 7.0]) {
            assert!((got - want).abs() < 1e-9, "stage 1 ends {ends:?}");
        }
        assert_eq!(simulate(Schedule::GPipe, 2, &ones, &ones, &[0.0, 0.0]).makespan_s, 6.0);
    }
}
