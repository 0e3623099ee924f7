#!/usr/bin/env bash
# Expert migration on a skewed workload, side by side: `mpirun -np 2 --ep 2 --hot-experts K:FACTOR`
# (experts 0..K−1 of every layer draw ~FACTOR× their share, all on rank 0 at first) with migration off
# and with the plan's policy, alternating for ROUNDS rounds, and the policy on the same job without the
# skew (`unskewed`: the main job never moves; without the load-balancing loss a router can collapse on
# its own, and that imbalance is real). Per run: median step time, the rank load max/mean per layer
# over the second half, and every migration's measured and predicted seconds and predicted gain, and what
# each check's moves saved per step (the window after against the window before) beside that prediction.
# JSON lines in $OUT (default benchmarks/results/migration.jsonl). PRESET picks the model (a preset name
# or a config.json; default: the main job's), EXTRA adds flags to every run. A skew that stays (the
# load-balancing loss would otherwise train the bias away) on a model whose step is mostly expert compute:
#   PRESET=benchmarks/configs/migration-experts.json HOT=2:2 EXTRA="--aux-loss-coef 0" \
#     OUT=benchmarks/results/migration-experts.jsonl benchmarks/migration.sh
#   cargo build --release --example mixtral_train --features mpi && benchmarks/migration.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/examples/mixtral_train}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-300}
HOT=${HOT:-2:4}
EVERY=${EVERY:-25}
case "$ROUNDS$STEPS$EVERY" in *[!0-9]*) echo "ROUNDS, STEPS and EVERY must be whole numbers" >&2; exit 2 ;; esac
OUT=${OUT:-benchmarks/results/migration.jsonl}
preset=(); [[ -n ${PRESET:-} ]] && preset=(--preset "$PRESET")
read -r -a extra <<<"${EXTRA:-}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for round in $(seq 1 "$ROUNDS"); do
  for mode in off plan unskewed; do
    skew=(--hot-experts "$HOT")
    policy=$mode
    if [[ $mode == unskewed ]]; then skew=(); policy=plan; fi
    mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np 2 "$BIN" "${preset[@]}" --ep 2 "${skew[@]}" "${extra[@]}" --steps "$STEPS" \
      --migration "$policy" --migration-every "$EVERY" --no-progress --log-every 0 --history off \
      --metrics "$tmp/m.jsonl" --summary "$tmp/s.json" > "$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
    python3 - "$round" "$mode" "$([[ $mode == unskewed ]] || echo "$HOT")" "$tmp/m.jsonl" "$tmp/s.json" >> "$OUT" <<'PY'
import json, statistics, sys
round_, mode, hot, metrics, summary = sys.argv[1:]
steps = [json.loads(l) for l in open(metrics)]
s = json.load(open(summary))
half = steps[len(steps) // 2:]
layers = len(half[0]["rank_load_max_mean"])
events = [dict(e, step=m["step"]) for m in steps for e in m.get("migration", [])]
print(json.dumps({
    "round": int(round_), "migration": mode, "hot_experts": hot, "steps": len(steps),
    "step_time_median_s": s["step_time_median_s"], "tokens_per_s": s["tokens_per_s"],
    "step_time_median_second_half_s": statistics.median(m["step_time_s"] for m in half),
    "rank_load_max_mean_second_half": [statistics.mean(m["rank_load_max_mean"][l] for m in half) for l in range(layers)],
    "migrations": len(events), "migration_seconds": s["migration_seconds"], "migration_share": s["migration_share"],
    "predicted_seconds": sum(e["predicted_seconds"] for e in events), "events": events,
    "outcomes": s.get("migration_outcomes", []), "final_loss": s["final_loss"],
}))
PY
  done
done
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    gain = sum(e.get("predicted_gain_per_step_s", 0) for e in r["events"])
    print(f"round {r['round']} migration {r['migration']:>8}: step {1e3 * r['step_time_median_s']:.2f} ms "
          f"(2nd half {1e3 * r['step_time_median_second_half_s']:.2f} ms), "
          f"rank load max/mean (2nd half) {['%.2f' % x for x in r['rank_load_max_mean_second_half']]}, "
          f"{r['migrations']} migrations, {1e3 * r['migration_seconds']:.1f} ms measured / {1e3 * r['predicted_seconds']:.1f} ms predicted "
          f"({100 * r['migration_share']:.2f}% of the run), predicted gain {1e3 * gain:.2f} ms/step, final loss {r['final_loss']:.4f}")
    for o in r.get("outcomes", []):
        print(f"    moves after step {o['moved_after_step']} (layers {o['layers']}): step {1e3 * o['step_time_before_s']:.2f} → "
              f"{1e3 * o['step_time_after_s']:.2f} ms, saved {1e3 * o['realised_gain_per_step_s']:.2f} ms/step, "
              f"predicted {1e3 * o['predicted_gain_per_step_s']:.2f}")
PY
