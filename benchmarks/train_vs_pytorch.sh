#!/usr/bin/env bash
# Whole-model training, side by side: `mixtral_train` (Flex, the default CPU backend) and Hugging Face
# transformers on PyTorch CPU (benchmarks/pytorch/hf_train_bench.py) on the same config.json, alternated ROUNDS
# times per config so both see the same machine state: f32, AdamW β 0.9/0.95 ε 1e-8 weight decay 0.1,
# global-norm clipping at 1.0, load-balancing loss 0.01, BATCH × SEQ tokens per step, THREADS threads.
# Each framework reports the dense GEMM rate it measures in the same process; GFLOP/s use the
# planner's FLOPs per token (Megatron convention) for both. One JSON line per (config, round) in OUT.
#
#   PYTHON=/path/to/venv/bin/python benchmarks/train_vs_pytorch.sh [ROUNDS] [OUT.jsonl]
# The Python environment needs torch and transformers ≥ 5 (pip install torch transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "error: ROUNDS must be a positive integer (got '$rounds')" >&2
    exit 2
fi
out=${2:-benchmarks/results/train_vs_pytorch.jsonl}
python=${PYTHON:-python3}
if ! "$python" -c 'import torch, transformers' 2>/dev/null; then
    echo "error: $python cannot import torch and transformers; set PYTHON to a venv with both" >&2
    exit 2
fi
configs=${CONFIGS:-"mixtral-s mixtral-m deepseek-s deepseek-m qwen3-s qwen3-m"}
threads=${THREADS:-2}
batch=${BATCH:-16}
seq=${SEQ:-128}
steps=${STEPS:-12}
export RAYON_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
cargo build --release --example mixtral_train -p piper >&2
cargo build --release -p piper-planner --bin piper >&2
target=${CARGO_TARGET_DIR:-target}/release
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$out"
for c in $configs; do
    config=benchmarks/configs/train-$c.json
    "$target/piper" model --hf-config "$config" --seq-len "$seq" --json >"$tmp/model.json"
    for r in $(seq 1 "$rounds"); do
        "$target/examples/mixtral_train" --preset "$config" --steps "$steps" --batch-size "$batch" \
            --seq-len "$seq" --lr 3e-4 --warmup 2 --grad-clip 1 --aux-loss-coef 0.01 --no-progress \
            --log-every 0 --summary "$tmp/piper.json" >"$tmp/piper.log" 2>&1 ||
            { cat "$tmp/piper.log" >&2; exit 1; }
        "$python" benchmarks/pytorch/hf_train_bench.py --config "$config" --batch "$batch" --seq "$seq" --steps "$steps" \
            --threads "$threads" --json "$tmp/hf.json" >/dev/null
        "$python" - "$c" "$r" "$tmp/model.json" "$tmp/piper.json" "$tmp/hf.json" >>"$out" <<'PY'
import json, sys
name, rnd = sys.argv[1], int(sys.argv[2])
model, piper, hf = (json.load(open(p)) for p in sys.argv[3:6])
fpt = model["flops_per_token"]
p_gflops = piper["tokens_per_s"] * fpt / 1e9
# mixtral_train's MFU against the peak it measured at start-up gives that peak back.
p_gemm = p_gflops / piper["mfu_measured_peak"]
h_gflops = hf["tokens_per_s"] * fpt / 1e9
print(json.dumps({
    "config": name, "round": rnd, "flops_per_token": fpt, "total_params": model["total_params"],
    "piper": {"tokens_per_s": piper["tokens_per_s"], "step_time_s": piper["step_time_median_s"],
              "gflops": p_gflops, "dense_gemm_gflops": p_gemm, "gemm_fraction": p_gflops / p_gemm},
    "pytorch": {"impl": hf["impl"], "tokens_per_s": hf["tokens_per_s"], "step_time_s": hf["step_time_median_s"],
                "gflops": h_gflops, "dense_gemm_gflops": hf["dense_gemm_gflops"],
                "gemm_fraction": h_gflops / hf["dense_gemm_gflops"]},
    "piper_over_pytorch": piper["tokens_per_s"] / hf["tokens_per_s"],
}))
PY
        tail -n 1 "$out" | "$python" -c 'import json,sys; d=json.loads(sys.stdin.read()); p,h=d["piper"],d["pytorch"]; print("%-10s round %d: piper %6.0f tok/s (%.0f%% of its GEMM), pytorch %6.0f tok/s (%.0f%%), piper/pytorch %.2f" % (d["config"], d["round"], p["tokens_per_s"], 100*p["gemm_fraction"], h["tokens_per_s"], 100*h["gemm_fraction"], d["piper_over_pytorch"]))' >&2
    done
done
