#!/usr/bin/env bash
# Side by side: Piper's MoE block (moe_layer_bench, Flex) and Hugging Face's MixtralSparseMoeBlock on
# PyTorch CPU, alternated ROUNDS times at the same shapes and thread count, so both see the same machine
# state. Shapes: the coarse Mixtral-style one (8 experts, top-2) and, with SHAPES=all, three fine-grained
# ones (64 experts, top-6/8, expert FFN 128-512). One JSON line per (shape, round):
# {"shape": name, "piper": {...}, "pytorch": {...}, "pytorch_over_piper_time": r}.
#
#   PYTHON=/path/to/venv/bin/python benchmarks/moe_vs_pytorch.sh [ROUNDS] [OUT.jsonl]
# The Python environment needs torch and transformers (pip install torch transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-4}
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "error: ROUNDS must be a positive integer (got '$rounds')" >&2
    exit 2
fi
out=${2:-benchmarks/results/moe_vs_pytorch.jsonl}
python=${PYTHON:-python3}
declare -A shapes=(
    [coarse]="--tokens 2048 --hidden 512 --ffn 1024 --experts 8 --top-k 2 --iters 20"
    [fine-64x6-f256]="--tokens 2048 --hidden 512 --ffn 256 --experts 64 --top-k 6 --iters 20"
    [fine-64x8-f128]="--tokens 2048 --hidden 512 --ffn 128 --experts 64 --top-k 8 --iters 20"
    [fine-64x8-f512]="--tokens 2048 --hidden 512 --ffn 512 --experts 64 --top-k 8 --iters 20"
)
names=(coarse)
if [[ ${SHAPES:-coarse} == all ]]; then names=(coarse fine-64x6-f256 fine-64x8-f128 fine-64x8-f512); fi
threads=${THREADS:-2}
export RAYON_NUM_THREADS=$threads
cargo build --release --example moe_layer_bench >&2
bin=${CARGO_TARGET_DIR:-target}/release/examples/moe_layer_bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$out"
for name in "${names[@]}"; do
    read -r -a shape <<<"${shapes[$name]}"
    for r in $(seq 1 "$rounds"); do
        "$bin" "${shape[@]}" --json "$tmp/piper.json" >/dev/null
        "$python" benchmarks/pytorch/hf_moe_block_bench.py "${shape[@]}" --threads "$threads" --json "$tmp/hf.json" >/dev/null
        "$python" - "$name" "$tmp/piper.json" "$tmp/hf.json" >>"$out" <<'PY'
import json, sys
piper, hf = (json.load(open(p)) for p in sys.argv[2:4])
print(json.dumps({"shape": sys.argv[1], "piper": piper, "pytorch": hf, "pytorch_over_piper_time": hf["median_s"] / piper["median_s"]}))
PY
        tail -n 1 "$out" | "$python" -c 'import json,sys; d=json.loads(sys.stdin.read()); print("%s round %s: piper %.3f s (%.2fx of dense GEMM), pytorch %.3f s, pytorch/piper time %.2f" % (d["shape"], '"$r"', d["piper"]["median_s"], d["piper"]["ratio_to_dense"], d["pytorch"]["median_s"], d["pytorch_over_piper_time"]))' >&2
    done
done
