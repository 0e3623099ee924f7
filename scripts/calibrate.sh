#!/usr/bin/env bash
# Calibrates the planner's `local` platform on this machine, through the binaries the runtime uses:
#   1. `mpirun -np RANKS piper-comm calibrate`: p2p latency and bandwidth between ranks and memory
#      bandwidth (RANKS, default one per core, only sizes this link measurement);
#   2. `calibrate_runtime measure`: for every thread count a rank can get (1, 2, 4, …, cores), cores ÷
#      threads processes at once (every core busy, as that many ranks), Burn's element-wise passes (RMSNorm, RoPE, softmax, SwiGLU, adds
#      and copies), the fixed cost of one tensor op, the AdamW step, and its linear layers' and attention
#      core's forward + backward efficiency by shape — so one file serves any number of ranks;
#   3. eight short `mixtral_train --profile` runs of calibration models at every thread count (cores ÷
#      threads at once): their profiles, booked into classes of work (non-expert GEMMs, routed experts,
#      attention core, the rest of a layer, cross-entropy, optimizer), fit what the runtime really pays
#      per class against the tables; the peak RSS of the one-rank runs, against the parameters, layer
#      activations and logits the planner counts, fits the fixed memory, bytes per parameter and the
#      two activation factors;
#   4. `calibrate_runtime write` puts it all into the platform TOML, for up to RANKS_PER_NODE ranks on
#      the node (default 2 × cores).
#
#   scripts/calibrate.sh [--ranks N] [--ranks-per-node N] [--out FILE]
# FILE defaults to the `local` preset's calibrated file ($PIPER_LOCAL_PLATFORM or ~/.config/piper/local.toml),
# which `--platform local` then reads. Needs OpenMPI (scripts/test-mpi.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=$(nproc)
per_node=$((2 * $(nproc)))
out=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --ranks) ranks=${2:?--ranks needs a value}; shift 2 ;;
        --ranks-per-node) per_node=${2:?--ranks-per-node needs a value}; shift 2 ;;
        --out) out=${2:?--out needs a value}; shift 2 ;;
        *) echo "error: unknown argument '$1' (expected --ranks N, --ranks-per-node N or --out FILE)" >&2; exit 2 ;;
    esac
done
for v in "--ranks $ranks" "--ranks-per-node $per_node"; do
    if ! [[ ${v#* } =~ ^[1-9][0-9]*$ ]]; then
        echo "error: ${v% *} must be a positive integer (got '${v#* }')" >&2
        exit 2
    fi
done
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
mpi=(mpirun --oversubscribe --bind-to none)
if [[ $(id -u) == 0 ]]; then mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none); fi
run_mpi=("${mpi[@]}" -np "$ranks")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "1/4 links and memory bandwidth on $ranks rank(s)" >&2
"${run_mpi[@]}" "$bin/piper-comm" calibrate --out "$tmp/base.toml" >&2
echo "2/4 the runtime's costs per thread count, every core busy" >&2
for threads in $("$bin/examples/calibrate_runtime" threads); do
    # cores ÷ threads ranks at once, each a process with its own pool, as training ranks run.
    pids=()
    for copy in $(seq 1 $(( $(nproc) / threads ))); do
        "$bin/examples/calibrate_runtime" measure --platform "$tmp/base.toml" --threads "$threads" \
            --json "$tmp/costs-$threads-$copy.json" & pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
done
echo "3/4 eight short training runs, profiled, at every thread count" >&2
# (model, sequences, tokens per sequence): parameters (2.7M-16M), layer activations (longer sequences
# grow the s² attention scores) and logits (vocabularies of 256 and 4096) varied independently; none is
# a configuration benchmarks/accuracy.sh checks. Each run's profile books the runtime's operations into
# the step-cost classes; the runs of one rank alone (every core) also fit the memory.
c=benchmarks/configs
runs=("$c/train-mixtral-s.json 8 63" "$c/train-mixtral-s.json 32 127" "$c/train-mixtral-s.json 8 255"
      "$c/train-qwen3-s.json 8 63" "$c/train-qwen3-m.json 4 127" "$c/train-deepseek-m.json 8 63"
      "tiny-qwen3 32 127" "tiny-deepseek 32 255")
echo "[" >"$tmp/runs.json"
echo "[" >"$tmp/step-runs.json"
sep=""
step_sep=""
for i in "${!runs[@]}"; do
    read -r config batch seq <<<"${runs[$i]}"
    for threads in $("$bin/examples/calibrate_runtime" threads); do
        pids=()
        for copy in $(seq 1 $(( $(nproc) / threads ))); do
            RAYON_NUM_THREADS=$threads "$bin/examples/mixtral_train" \
                --preset "$config" --steps 8 --batch-size "$batch" --seq-len "$seq" --warmup 1 --no-progress \
                --log-every 0 --profile --summary "$tmp/summary-$i-$threads-$copy.json" >/dev/null & pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p"; done
        for copy in $(seq 1 $(( $(nproc) / threads ))); do
            printf '%s{"threads": %d, "model": "%s", "batch": %d, "seq": %d, "summary": "%s"}\n' "$step_sep" \
                "$threads" "$config" "$batch" "$seq" "$tmp/summary-$i-$threads-$copy.json" >>"$tmp/step-runs.json"
            step_sep=","
        done
    done
    "$bin/piper" memory --model "$config" --platform "$tmp/base.toml" --pp 1 --ep 1 --dp 1 \
        --micro-batch-size "$batch" --num-micro-batches 1 --seq-len "$seq" --schedule 1f1b --recompute none \
        --dtype fp32 --weight-bytes 4 --grad-bytes 4 --optimizer-bytes 8 --no-flash-attention --json >"$tmp/memory.json"
    python3 - "$tmp/summary-$i-$(nproc)-1.json" "$tmp/memory.json" >>"$tmp/runs.json" <<PY
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
# Expert parallelism runs another path (dispatch → all-to-all → grouped experts → combine): profiled
# expert-parallel runs, cores ÷ threads ranks of one expert group, for every thread count below the cores.
ep_runs=("$c/train-mixtral-s.json 32 127" "$c/train-qwen3-m.json 4 127" "$c/train-deepseek-m.json 8 63")
for i in "${!ep_runs[@]}"; do
    read -r config batch seq <<<"${ep_runs[$i]}"
    for threads in $("$bin/examples/calibrate_runtime" threads); do
        n=$(( $(nproc) / threads ))
        if ((n < 2)); then continue; fi
        "${mpi[@]}" -np "$n" "$bin/examples/mixtral_train" --preset "$config" --steps 8 --batch-size "$batch" \
            --seq-len "$seq" --warmup 1 --ep "$n" --no-progress --log-every 0 --profile \
            --summary "$tmp/summary-ep-$i-$threads.json" >/dev/null
        printf '%s{"threads": %d, "ep": %d, "model": "%s", "batch": %d, "seq": %d, "summary": "%s"}\n' "$step_sep" \
            "$threads" "$n" "$config" "$batch" "$seq" "$tmp/summary-ep-$i-$threads.json" >>"$tmp/step-runs.json"
    done
done
echo "]" >>"$tmp/step-runs.json"
echo "   time sharing: data-parallel runs on cores and on 2 × cores ranks, two rounds" >&2
share=()
for round in 1 2; do
    for n in $(nproc) $((2 * $(nproc))); do
        "${mpi[@]}" -np "$n" "$bin/examples/mixtral_train" --preset "$c/train-mixtral-s.json" --steps 10 \
            --batch-size 32 --seq-len 127 --warmup 1 --dp "$n" --no-progress --log-every 0 \
            --summary "$tmp/share-$n-$round.json" >/dev/null
    done
done
ratio=$(python3 - "$tmp" "$(nproc)" <<'PY'
import json, statistics, sys
tmp, c = sys.argv[1], int(sys.argv[2])
t = lambda n, r: json.load(open(f"{tmp}/share-{n}-{r}.json"))["step_time_median_s"]
print(statistics.median(t(2 * c, r) / t(c, r) for r in (1, 2)))
PY
)
echo "4/4 writing the platform" >&2
if [[ -z $out ]]; then
    out=${PIPER_LOCAL_PLATFORM:-${XDG_CONFIG_HOME:-$HOME/.config}/piper/local.toml}
fi
mkdir -p "$(dirname "$out")"
"$bin/examples/calibrate_runtime" write --platform "$tmp/base.toml" --costs "$tmp"/costs-*.json \
    --memory-runs "$tmp/runs.json" --step-runs "$tmp/step-runs.json" --time-share-ratio "$ratio" --ranks-per-node "$per_node" --out "$out"
