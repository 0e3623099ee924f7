#!/usr/bin/env bash
# Shared experts overlapping the expert dispatch, side by side: two emulated nodes of one rank each
# (scripts/emulate-fabric.sh: network namespaces joined by links shaped to RATE, so every message
# crosses a slow link), LAYOUT (default `--ep 2`) on a DeepSeek-style model with shared experts,
# `--overlap on` and `--overlap off` alternating for ROUNDS rounds. Per run: the median step time and the step the planner
# predicted for it on PLATFORM (whose links should be the emulated RATE, so the prediction prices the
# same links). JSON lines in $OUT, then the per-round ratios and their median.
#
#   cargo build --release --example mixtral_train --features mpi
#   benchmarks/overlap.sh            # RATE=250mbit ROUNDS=3 STEPS=40, needs root, iproute2, OpenMPI
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/examples/mixtral_train}
RATE=${RATE:-250mbit}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-40}
PRESET=${PRESET:-benchmarks/configs/overlap-deepseek.json}
read -r -a layout <<<"${LAYOUT:---ep 2}"
PLATFORM=${PLATFORM:-}
OUT=${OUT:-benchmarks/results/overlap.jsonl}
read -r -a extra <<<"${EXTRA:-}"
read -r -a mpi_extra <<<"${MPI_EXTRA:-}"
case "$ROUNDS$STEPS" in *[!0-9]*) echo "ROUNDS and STEPS must be whole numbers" >&2; exit 2 ;; esac
[ -x "$BIN" ] || { echo "error: $BIN not built (cargo build --release --example mixtral_train --features mpi)" >&2; exit 2; }
platform=(); [[ -n $PLATFORM ]] && platform=(--platform "$PLATFORM")
tmp=$(mktemp -d)
trap 'scripts/emulate-fabric.sh down --nodes 2 >/dev/null 2>&1; rm -rf "$tmp"' EXIT
scripts/emulate-fabric.sh up --nodes 2 --rate "$RATE"
: > "$OUT"
for round in $(seq 1 "$ROUNDS"); do
  for overlap in on off; do
    args=("${platform[@]}" --preset "$PRESET" "${layout[@]}" --overlap "$overlap" --steps "$STEPS" --migration off "${extra[@]}"
      --no-progress --log-every 0 --history off --metrics "$tmp/m.jsonl" --summary "$tmp/s.json")
    apps=(-np 1 ip netns exec piperfab-n0 env RAYON_NUM_THREADS=1 "$BIN" "${args[@]}" :
          -np 1 ip netns exec piperfab-n1 env RAYON_NUM_THREADS=1 "$BIN" "${args[@]}")
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    ip netns exec piperfab-sw env PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=br0 \
      timeout 900 mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl tcp,self \
      --mca btl_tcp_if_include 10.78.0.0/24 "${mpi_extra[@]}" "${apps[@]}" > "$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
    python3 - "$round" "$overlap" "$RATE" "$tmp/s.json" >> "$OUT" <<'PY'
import json, sys
round_, overlap, rate, summary = sys.argv[1:]
s = json.load(open(summary))
print(json.dumps({
    "round": int(round_), "overlap": overlap, "rate": rate, "layout": s["layout"],
    "step_time_median_s": s["step_time_median_s"], "predicted_step_s": s["predicted"]["step_time_s"],
    "final_loss": s["final_loss"],
}))
PY
  done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["round"], r["overlap"]): r for r in rows}
ratios = []
for k in sorted({r["round"] for r in rows}):
    on, off = by[(k, "on")], by[(k, "off")]
    ratios.append(on["step_time_median_s"] / off["step_time_median_s"])
    print(f"round {k}: on {1e3 * on['step_time_median_s']:.1f} ms (predicted {1e3 * on['predicted_step_s']:.1f}), "
          f"off {1e3 * off['step_time_median_s']:.1f} ms (predicted {1e3 * off['predicted_step_s']:.1f}), "
          f"on/off {ratios[-1]:.3f}, final loss on {on['final_loss']:.6f} off {off['final_loss']:.6f}")
print(f"on/off: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")
PY
