#!/usr/bin/env bash
# tokens/s of mixtral_train at 1, 2 and 4 ranks on this machine, with the planner's layout (--plan auto)
# and its predicted step time and pipeline bubble beside the measured ones (from each run's --summary).
# Writes JSON lines to benchmarks/results/ranks.jsonl.
#   cargo build --release --example mixtral_train --features mpi && benchmarks/ranks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/examples/mixtral_train}
OUT=benchmarks/results/ranks.jsonl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for np in 1 2 4; do
  if [ "$np" = 1 ]; then run=("$BIN"); else run=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np "$np" "$BIN"); fi
  "${run[@]}" --plan auto --steps 40 --batch-size 16 --seq-len 63 --no-progress --log-every 0 \
    --summary "$tmp/$np.json" > "$tmp/$np.log" 2>&1 || { cat "$tmp/$np.log"; exit 1; }
  python3 - "$np" "$tmp/$np.json" >> "$OUT" <<'PY'
import json, sys
np_, path = sys.argv[1:]
s = json.load(open(path))
p = s["predicted"]
l = s["layout"]
print(json.dumps({"ranks": int(np_), "layout": f"PP={l['pp']} × EP={l['ep']} × DP={l['dp']}, {s['micro_batches']} micro-batches ({s['schedule']})",
                  "predicted_step_ms": 1e3 * p["step_time_s"], "measured_step_ms": 1e3 * s["step_time_median_s"],
                  "predicted_tokens_per_s": p["tokens_per_s"], "measured_tokens_per_s": s["tokens_per_s"],
                  "predicted_bubble": p["bubble_fraction"], "measured_bubble": s["bubble_measured"],
                  "peak_rss_bytes": s["peak_rss_bytes"], "predicted_peak_memory_bytes": s["predicted_peak_memory_bytes"]}))
PY
done
cat "$OUT"
