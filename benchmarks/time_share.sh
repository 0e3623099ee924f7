#!/usr/bin/env bash
# Time sharing against the work of a rank: the same batch trained data-parallel on C ranks (one per core)
# and on 2C ranks (two per core), for every model of MODELS and batch of BATCHES, ROUNDS interleaved
# rounds (default 2) of STEPS steps (default 30). Per run it records the median step and the step the
# PLATFORM predicts (`--platform`, default `local`); per case it prints the measured ratio t(2C) ÷ t(C),
# the predicted one, and the exponent γ the measured ratio implies if sharing only stretched compute
# (2C ranks of half the work each: ratio = 2^γ ÷ 2). One JSON row per run goes to OUT (default
# benchmarks/results/time-share.jsonl). Nothing else may run meanwhile; name the CPU beside the figures.
#
#   [MODELS="a.json b.json"] [BATCHES="8 16 32"] [PLATFORM=FILE] [ROUNDS=2] [STEPS=30] [OUT=FILE] \
#       benchmarks/time_share.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-2} steps=${STEPS:-30}
out=${OUT:-benchmarks/results/time-share.jsonl}
platform=${PLATFORM:-local}
read -r -a models <<<"${MODELS:-benchmarks/configs/heldout12-mixtral.json benchmarks/configs/heldout12-qwen3.json}"
read -r -a batches <<<"${BATCHES:-8 16 32 64}"
cores=$(nproc)
for v in "$rounds" "$steps"; do
    [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "error: ROUNDS and STEPS must be positive integers; got '$v'" >&2; exit 2; }
done
((steps >= 6)) || { echo "error: STEPS must be ≥ 6 (the median skips the first three steps); got $steps" >&2; exit 2; }
for b in "${batches[@]}"; do
    if ! [[ $b =~ ^[1-9][0-9]*$ ]] || ((b % (2 * cores))); then
        echo "error: BATCHES: $b is not a multiple of 2 × $cores cores (each of 2C ranks takes an equal share)" >&2
        exit 2
    fi
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/piper-target}
cargo build --release --features mpi --example mixtral_train >&2
bin=$CARGO_TARGET_DIR/release/examples/mixtral_train
source benchmarks/lib.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$out"
for round in $(seq 1 "$rounds"); do
    for model in "${models[@]}"; do
        for batch in "${batches[@]}"; do
            for ranks in "$cores" $((2 * cores)); do
                echo "round $round/$rounds: ${model##*/} batch $batch on $ranks ranks" >&2
                "${mpi[@]}" -np "$ranks" "$bin" --preset "$model" --steps "$steps" --batch-size "$batch" \
                    --seq-len 127 --warmup 2 --dp "$ranks" --platform "$platform" --migration off --no-progress \
                    --log-every 0 --history off --summary "$tmp/summary.json" </dev/null >"$tmp/run.log" 2>&1 ||
                    { cat "$tmp/run.log" >&2; exit 1; }
                python3 -c 'import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"model": sys.argv[2].split("/")[-1], "batch": int(sys.argv[3]), "ranks": int(sys.argv[4]),
                  "measured_s": s["step_time_median_s"], "predicted_s": s["predicted"]["step_time_s"]}))' \
                    "$tmp/summary.json" "$model" "$batch" "$ranks" >>"$out"
            done
        done
    done
done
python3 - "$out" "$cores" <<'PY'
import json, math, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cores = int(sys.argv[2])
def median(v):
    if not v or any(math.isnan(x) for x in v):
        raise SystemExit(f"no measurement, or a NaN, in {v}")
    return statistics.median(v)
print(f"{'model':20} {'batch':>5} {'seqs/rank C→2C':>15} {'t(C) ms':>8} {'t(2C) ms':>8} {'ratio':>6} {'predicted':>9} {'γ implied':>9}")
for model in dict.fromkeys(r["model"] for r in rows):
    for batch in dict.fromkeys(r["batch"] for r in rows if r["model"] == model):
        pick = lambda ranks, key: median([r[key] for r in rows if (r["model"], r["batch"], r["ranks"]) == (model, batch, ranks)])
        one, two = pick(cores, "measured_s"), pick(2 * cores, "measured_s")
        ratio, predicted = two / one, pick(2 * cores, "predicted_s") / pick(cores, "predicted_s")
        print(f"{model:20} {batch:5} {batch // cores:>7} → {batch // (2 * cores):<5} {one * 1e3:8.1f} {two * 1e3:8.1f} "
              f"{ratio:6.3f} {predicted:9.3f} {math.log2(2 * ratio):9.2f}")
PY
