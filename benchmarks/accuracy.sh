#!/usr/bin/env bash
# Accuracy of the resource model on this machine: 12 layouts (1, 2 and 4 ranks; EP, DP, PP with GPipe
# and 1F1B, micro-batch counts) of two models (the `tiny` preset, d 64 × 2 layers; and
# benchmarks/configs/train-mixtral-m.json, d 256 × 4 layers) train for STEPS steps under mpirun; each run's
# median step time and largest peak RSS (its --summary) is set against `piper predict` for the same
# layout on the platform calibrated for that rank count (scripts/calibrate.sh, run here first unless
# the files exist). Writes benchmarks/results/accuracy.json and benchmarks/results/accuracy.png (predicted vs
# measured, with y = x).
#
#   PYTHON=/path/with/matplotlib [REPEATS=3] benchmarks/accuracy.sh [STEPS]
# REPEATS runs of each layout (default 1) give the median step time and peak memory: a virtual machine's speed
# varies by ~20% between runs of the same layout.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-12}
if ! [[ $steps =~ ^[1-9][0-9]*$ ]] || ((steps < 6)); then
    echo "error: STEPS must be an integer ≥ 6 (the median skips the first three steps); got '$steps'" >&2
    exit 2
fi
python=${PYTHON:-python3}
if ! "$python" -c 'import matplotlib' 2>/dev/null; then
    echo "error: $python cannot import matplotlib (for the plot); set PYTHON to one that can" >&2
    exit 2
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/piper-target}
cargo build --release --features mpi --example mixtral_train >&2
cargo build --release -p piper-planner --bin piper >&2
bin=$CARGO_TARGET_DIR/release
platforms=benchmarks/results/platforms
for r in 1 2 4; do
    [[ -f $platforms/local-$r.toml ]] || scripts/calibrate.sh --ranks "$r" --out "$platforms/local-$r.toml"
done
mpi=(mpirun --oversubscribe --bind-to none)
if [[ $(id -u) == 0 ]]; then mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none); fi
batch=16
seq=127
# model: ranks pp ep dp micro-batches schedule split
layouts=(
    "1 1 1 1 1 1f1b -" "1 1 1 1 2 1f1b -"
    "2 1 2 1 1 1f1b -" "2 1 1 2 1 1f1b -" "2 2 1 1 2 gpipe H" "2 2 1 1 4 1f1b H"
    "4 1 4 1 1 1f1b -" "4 2 2 1 2 1f1b H" "4 1 2 2 1 1f1b -" "4 2 1 2 2 gpipe H" "4 2 2 1 4 gpipe H"
    "4 4 1 1 4 1f1b Q"
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=benchmarks/results/accuracy.jsonl
: >"$out"
for model in tiny benchmarks/configs/train-mixtral-m.json; do
    layers=$("$bin/piper" model --model "$model" --spec-json | "$python" -c 'import json,sys; print(json.load(sys.stdin)["num_layers"])')
    for l in "${layouts[@]}"; do
        read -r ranks pp ep dp m schedule split <<<"$l"
        if ((pp > layers)); then continue; fi
        case $split in
            -) split_args=() ;;
            *) split_args=(--split "$("$python" -c "n,p=$layers,$pp; print(','.join([str(n//p)]*p))")") ;;
        esac
        mbs=$((batch / (m * ep * dp)))
        for rep in $(seq 1 "${REPEATS:-1}"); do
            "${mpi[@]}" -np "$ranks" "$bin/examples/mixtral_train" --preset "$model" --steps "$steps" \
                --batch-size "$batch" --seq-len "$seq" --warmup 2 --pp "$pp" --ep "$ep" --dp "$dp" \
                --micro-batches "$m" --schedule "$schedule" "${split_args[@]}" --platform "$platforms/local-$ranks.toml" \
                --migration off --no-progress --log-every 0 --summary "$tmp/summary-$rep.json" >"$tmp/run.log" 2>&1 ||
                { cat "$tmp/run.log" >&2; exit 1; }
        done
        "$bin/piper" predict --model "$model" --platform "$platforms/local-$ranks.toml" --pp "$pp" --ep "$ep" \
            --dp "$dp" --micro-batch-size "$mbs" --num-micro-batches "$m" --seq-len "$seq" --schedule "$schedule" \
            --recompute none --dtype fp32 --weight-bytes 4 --grad-bytes 4 --optimizer-bytes 8 \
            --no-flash-attention "${split_args[@]}" --json >"$tmp/predict.json"
        "$python" - "$model" "$l" "$tmp/predict.json" "$tmp"/summary-*.json >>"$out" <<'PY'
import json, statistics, sys
model, layout = sys.argv[1], sys.argv[2].split()
predict = json.load(open(sys.argv[3]))
summaries = [json.load(open(p)) for p in sys.argv[4:]]
measured_t = statistics.median(s["step_time_median_s"] for s in summaries)
measured_m = statistics.median(max(s["peak_rss_bytes"]) for s in summaries)
print(json.dumps({
    "model": model.split("/")[-1].removesuffix(".json"), "ranks": int(layout[0]), "pp": int(layout[1]),
    "ep": int(layout[2]), "dp": int(layout[3]), "micro_batches": int(layout[4]), "schedule": layout[5],
    "repeats": len(summaries),
    "step_time_s": {"predicted": predict["step_time_s"], "measured": measured_t,
                    "error": predict["step_time_s"] / measured_t - 1},
    "peak_memory_bytes": {"predicted": predict["peak_memory_bytes"], "measured": measured_m,
                          "error": predict["peak_memory_bytes"] / measured_m - 1},
}))
PY
        rm -f "$tmp"/summary-*.json
        tail -n 1 "$out" | "$python" -c 'import json,sys; d=json.loads(sys.stdin.read()); t,m=d["step_time_s"],d["peak_memory_bytes"]; print("%-16s R=%d PP=%d EP=%d DP=%d M=%d %-5s step %7.1f ms predicted %7.1f (%+5.1f%%)  memory %6.1f MiB predicted %6.1f (%+5.1f%%)" % (d["model"], d["ranks"], d["pp"], d["ep"], d["dp"], d["micro_batches"], d["schedule"], 1e3*t["measured"], 1e3*t["predicted"], 100*t["error"], m["measured"]/2**20, m["predicted"]/2**20, 100*m["error"]))' >&2
    done
done
"$python" - "$out" benchmarks/results/accuracy.json benchmarks/results/accuracy.png <<'PY'
import json, statistics, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [json.loads(l) for l in open(sys.argv[1])]
def stats(key):
    e = [abs(r[key]["error"]) for r in rows]
    return {"median_abs_error": statistics.median(e), "max_abs_error": max(e), "runs": len(e)}
doc = {"rows": rows, "step_time": stats("step_time_s"), "peak_memory": stats("peak_memory_bytes")}
with open(sys.argv[2], "w") as f:
    json.dump(doc, f, indent=1)
fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
for ax, key, unit, scale in [(axes[0], "step_time_s", "step time (ms)", 1e3), (axes[1], "peak_memory_bytes", "peak memory (MiB)", 2**-20)]:
    for model, marker in [("tiny", "o"), ("train-mixtral-m", "s")]:
        pts = [r for r in rows if r["model"] == model]
        ax.scatter([r[key]["measured"] * scale for r in pts], [r[key]["predicted"] * scale for r in pts],
                   marker=marker, label=model, alpha=0.8)
    lo = min(min(r[key]["measured"], r[key]["predicted"]) for r in rows) * scale * 0.8
    hi = max(max(r[key]["measured"], r[key]["predicted"]) for r in rows) * scale * 1.2
    ax.plot([lo, hi], [lo, hi], "k--", linewidth=1, label="y = x")
    ax.set_xscale("log"); ax.set_yscale("log"); ax.set_xlim(lo, hi); ax.set_ylim(lo, hi)
    ax.set_xlabel("measured " + unit); ax.set_ylabel("predicted " + unit)
    s = doc["step_time" if key == "step_time_s" else "peak_memory"]
    ax.set_title("median |error| %.1f%%, max %.1f%%" % (100 * s["median_abs_error"], 100 * s["max_abs_error"]))
    ax.legend()
fig.suptitle("piper predict vs mixtral_train on this machine (calibrated local platform per rank count)")
fig.tight_layout()
fig.savefig(sys.argv[3], dpi=110)
print(json.dumps({k: doc[k] for k in ("step_time", "peak_memory")}))
PY
