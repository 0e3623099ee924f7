#!/usr/bin/env bash
# Calibrates the planner's `local` platform on this machine, for RANKS training ranks on it (default: one
# per core), through the binaries the runtime uses:
#   1. `mpirun -np RANKS piper-comm calibrate`: GEMM efficiency by shape (skinny expert shapes included)
#      on the threads a rank gets, attention GEMMs, p2p latency and bandwidth, memory bandwidth;
#   2. `mpirun -np RANKS calibrate_runtime measure`: every rank at once measures Burn's element-wise
#      passes (RMSNorm, RoPE, softmax, SwiGLU, adds and copies), the fixed cost of one tensor op, the
#      AdamW step, and its linear layers' and attention core's forward + backward efficiency by shape
#      (these replace step 1's raw GEMM tables: they include the runtime's transposes and copies);
#   3. eight short `mixtral_train` runs (one rank) whose peak RSS, against the parameters, layer
#      activations and logits the planner counts for them, fit the runtime's fixed memory, bytes per
#      parameter and the two activation factors;
#   4. `calibrate_runtime write` puts it all into the platform TOML.
#
#   scripts/calibrate.sh [--ranks N] [--out FILE]
# FILE defaults to the `local` preset's calibrated file ($PIPER_LOCAL_PLATFORM or ~/.config/piper/local.toml),
# which `--platform local` then reads. Needs OpenMPI (scripts/test-mpi.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=$(nproc)
out=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --ranks) ranks=${2:?--ranks needs a value}; shift 2 ;;
        --out) out=${2:?--out needs a value}; shift 2 ;;
        *) echo "error: unknown argument '$1' (expected --ranks N or --out FILE)" >&2; exit 2 ;;
    esac
done
if ! [[ $ranks =~ ^[1-9][0-9]*$ ]]; then
    echo "error: --ranks must be a positive integer (got '$ranks')" >&2
    exit 2
fi
if ! command -v mpirun >/dev/null; then
    echo "error: mpirun not found; install OpenMPI (scripts/test-mpi.sh does) and retry" >&2
    exit 2
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/piper-target}
cargo build --release --features mpi -p piper-comm --bin piper-comm >&2
cargo build --release --features mpi --example mixtral_train --example calibrate_runtime >&2
cargo build --release -p piper-planner --bin piper >&2
bin=$CARGO_TARGET_DIR/release
# No core binding: each rank sizes its own thread pool to the cores it shares (as training ranks do).
run_mpi=(mpirun --oversubscribe --bind-to none -np "$ranks")
if [[ $(id -u) == 0 ]]; then run_mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks"); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "1/4 GEMMs and communication on $ranks rank(s)" >&2
"${run_mpi[@]}" "$bin/piper-comm" calibrate --out "$tmp/base.toml" >&2
echo "2/4 the runtime's element-wise and per-op costs, every rank at once" >&2
"${run_mpi[@]}" sh -c "exec '$bin/examples/calibrate_runtime' measure --platform '$tmp/base.toml' --json '$tmp/costs-'\$OMPI_COMM_WORLD_RANK.json" >/dev/null
echo "3/4 memory of eight short runs" >&2
# (model, sequences, tokens per sequence): parameters (2.7M-16M), layer activations (longer sequences
# grow the s² attention scores) and logits (vocabularies of 256 and 4096) varied independently; none is
# a configuration bench-accuracy.sh checks.
c=benchmarks/configs
runs=("$c/train-mixtral-s.json 8 63" "$c/train-mixtral-s.json 32 127" "$c/train-mixtral-s.json 8 255"
      "$c/train-qwen3-s.json 8 63" "$c/train-qwen3-m.json 4 127" "$c/train-deepseek-m.json 8 63"
      "tiny-qwen3 32 127" "tiny-deepseek 32 255")
echo "[" >"$tmp/runs.json"
sep=""
for r in "${runs[@]}"; do
    read -r config batch seq <<<"$r"
    RAYON_NUM_THREADS=$(( $(nproc) / ranks > 0 ? $(nproc) / ranks : 1 )) "$bin/examples/mixtral_train" \
        --preset "$config" --steps 6 --batch-size "$batch" --seq-len "$seq" --warmup 1 --no-progress \
        --log-every 0 --summary "$tmp/summary.json" >/dev/null
    "$bin/piper" memory --model "$config" --platform "$tmp/base.toml" --pp 1 --ep 1 --dp 1 \
        --micro-batch-size "$batch" --num-micro-batches 1 --seq-len "$seq" --schedule 1f1b --recompute none \
        --dtype fp32 --weight-bytes 4 --grad-bytes 4 --optimizer-bytes 8 --no-flash-attention --json >"$tmp/memory.json"
    python3 - "$tmp/summary.json" "$tmp/memory.json" >>"$tmp/runs.json" <<PY
import json, sys
summary, memory = (json.load(open(p)) for p in sys.argv[1:3])
stage = memory["stages"][0]
logits = stage["activations"]["logits"]
print("$sep" + json.dumps({"params": stage["params"], "activation_bytes": stage["activation_bytes"] - logits,
                           "logits_bytes": logits, "peak_rss_bytes": max(summary["peak_rss_bytes"])}))
PY
    sep=","
done
echo "]" >>"$tmp/runs.json"
echo "4/4 writing the platform" >&2
if [[ -z $out ]]; then
    out=${PIPER_LOCAL_PLATFORM:-${XDG_CONFIG_HOME:-$HOME/.config}/piper/local.toml}
fi
mkdir -p "$(dirname "$out")"
"$bin/examples/calibrate_runtime" write --platform "$tmp/base.toml" --costs "$tmp"/costs-*.json \
    --memory-runs "$tmp/runs.json" --out "$out"
