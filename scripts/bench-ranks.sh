#!/usr/bin/env bash
# tokens/s of mixtral_train at 1, 2 and 4 ranks on this machine, with the planner's layout (--plan auto)
# and its predicted step time and pipeline bubble beside the measured ones. Writes JSON lines to bench-results/ranks.jsonl.
#   cargo build --release --example mixtral_train --features mpi && scripts/bench-ranks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/examples/mixtral_train}
OUT=bench-results/ranks.jsonl
: > "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for np in 1 2 4; do
  if [ "$np" = 1 ]; then run=("$BIN"); else run=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np "$np" "$BIN"); fi
  log=$("${run[@]}" --plan auto --steps 40 --batch-size 16 --seq-len 64 --no-progress --log-every 0 2>&1)
  plan=$(grep -m1 '^plan (' <<<"$log")
  vs=$(grep -m1 '^plan vs measured' <<<"$log")
  bubble=$(grep -m1 '^pipeline bubble' <<<"$log" || echo "pipeline bubble: 0.0% predicted, 0.0% measured")
  mean=$(grep -m1 '^mean ' <<<"$log")
  python3 - "$np" "$plan" "$vs" "$mean" "$bubble" >> "$OUT" <<'PY'
import json, re, sys
np_, plan, vs, mean, bubble = sys.argv[1:]
nums = lambda s: [float(x) for x in re.findall(r"[-+]?\d+\.?\d*", s)]
v = nums(vs)
b = nums(bubble)
print(json.dumps({"ranks": int(np_), "layout": re.search(r"PP=\d+ × EP=\d+ × DP=\d+, \d+ micro-batches \(\w+\)", plan).group(0),
                  "predicted_step_ms": v[0], "measured_step_ms": v[1], "predicted_tokens_per_s": v[3],
                  "measured_tokens_per_s": v[4], "mean_tokens_per_s": nums(mean)[0], "predicted_bubble": b[0] / 100, "measured_bubble": b[1] / 100}))
PY
done
cat "$OUT"
