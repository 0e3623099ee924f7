#!/usr/bin/env bash
# Checkpoint save and resume time and size, for the tiny preset and a 54M-parameter Mixtral-shaped model
# (benchmarks/configs/mixtral-mid.json), one process; one JSON line per model into
# benchmarks/results/checkpoint.jsonl. Build first:
#   cargo build --release --example mixtral_train && benchmarks/checkpoint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${CARGO_TARGET_DIR:-target}/release/examples/mixtral_train"
OUT=benchmarks/results/checkpoint.jsonl
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: > "$OUT"
for model in tiny benchmarks/configs/mixtral-mid.json; do
  name=$(basename "$model" .json)
  common=(--preset "$model" --batch-size 8 --seq-len 63 --no-progress --log-every 0 --peak-tflops 1)
  "$BIN" "${common[@]}" --steps 2 --checkpoint-dir "$work/$name" --metrics "$work/$name.jsonl" > /dev/null
  resumed=$("$BIN" "${common[@]}" --steps 3 --resume "$work/$name" | sed -n 's/^resumed in \([0-9.]*\) s.*/\1/p')
  python3 - "$work/$name.jsonl" "$name" "$resumed" >> "$OUT" <<'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]["checkpoint"]
print(json.dumps({"model": sys.argv[2], "bytes": last["bytes"], "save_s": round(last["seconds"], 3),
                  "resume_s": float(sys.argv[3]), "ranks": 1}))
PY
done
cat "$OUT"
