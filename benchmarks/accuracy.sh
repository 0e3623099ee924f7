#!/usr/bin/env bash
# Accuracy of the resource model on this machine, on models it is never calibrated on (MODELS, default
# configs/heldout{,2}-{mixtral,qwen3}.json; the heldout2 pair is kept out of every design decision): 12 layouts (1, 2 and 4 ranks;
# EP, DP, PP with GPipe and 1F1B, micro-batch counts) train for STEPS steps under mpirun, REPEATS rounds
# interleaved (every layout once per round); each layout's median step time and median of its ranks'
# largest peak RSS (its --summary), each with its spread over the rounds, is set against `piper predict`
# on ONE calibrated platform (`piper calibrate`, run first unless the file exists), whatever the rank
# count; the rows also keep the median of the ranks' largest heap peak (`peak_heap_bytes`, where the
# trainer's allocator counts it) with its spread. Per rank count it also reports the planner's regret
# (measured time of the layout the model ranks first ÷ the fastest measured) and the rank correlation.
# Writes OUT.jsonl, OUT.json and OUT.png (OUT defaults to benchmarks/results/accuracy). REPRICE=1 runs
# nothing: it prices the measurements already in OUT.jsonl again with this piper (after a change to the
# model, on the same platform file).
#
#   PYTHON=/path/with/matplotlib [REPEATS=3] [PLATFORM=FILE] [MODELS="a.json b.json"] [OUT=PREFIX] \
#       [REPRICE=1] [KEEP=DIR] benchmarks/accuracy.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-30}
if ! [[ $steps =~ ^[1-9][0-9]*$ ]] || ((steps < 6)); then
    echo "error: STEPS must be an integer ≥ 6 (the median skips the first three steps); got '$steps'" >&2
    exit 2
fi
repeats=${REPEATS:-3}
python=${PYTHON:-python3}
if ! "$python" -c 'import matplotlib' 2>/dev/null; then
    echo "error: $python cannot import matplotlib (for the plot); set PYTHON to one that can" >&2
    exit 2
fi
if [[ -n ${KEEP:-} ]] && ! mkdir -p "$KEEP"; then
    echo "error: KEEP=$KEEP: cannot create the folder for the runs' summaries; name a writable one" >&2
    exit 2
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/piper-target}
[[ -n ${REPRICE:-} ]] || cargo build --release --features mpi --example mixtral_train --example calibrate_runtime >&2
cargo build --release -p piper-planner --bin piper >&2
bin=$CARGO_TARGET_DIR/release
platform=${PLATFORM:-benchmarks/results/platforms/local.toml}
if [[ ! -f $platform && -n ${REPRICE:-} ]]; then
    echo "error: REPRICE prices on the platform the measurements were priced on; $platform is missing" >&2
    exit 2
fi
[[ -f $platform ]] || "$bin/piper" calibrate --out "$platform"
source benchmarks/lib.sh
batch=16
seq=127
read -r -a models <<<"${MODELS:-benchmarks/configs/heldout-mixtral.json benchmarks/configs/heldout-qwen3.json benchmarks/configs/heldout2-mixtral.json benchmarks/configs/heldout2-qwen3.json}"
# ranks pp ep dp micro-batches schedule
layouts=(
    "1 1 1 1 1 1f1b" "1 1 1 1 2 1f1b"
    "2 1 2 1 1 1f1b" "2 1 1 2 1 1f1b" "2 2 1 1 2 gpipe" "2 2 1 1 4 1f1b"
    "4 1 4 1 1 1f1b" "4 2 2 1 2 1f1b" "4 1 2 2 1 1f1b" "4 2 1 2 2 gpipe" "4 2 2 1 4 gpipe" "4 4 1 1 4 1f1b"
)
tmp=$(mktemp -d)
# KEEP=DIR keeps every run's summary (each rank's peak RSS, the profile) in DIR.
trap '[[ -n ${KEEP:-} ]] && cp "$tmp"/summary-*.json "$KEEP"/ 2>/dev/null; rm -rf "$tmp"' EXIT
prefix=${OUT:-benchmarks/results/accuracy}
out=$prefix.jsonl
if [[ -n ${REPRICE:-} ]]; then
    [[ -s $out ]] || { echo "error: REPRICE needs the measurements of $out; run without REPRICE first" >&2; exit 2; }
    cp "$out" "$tmp/measured.jsonl"
    repeats=0
fi
for rep in $(seq 1 "$repeats"); do
    for mi in "${!models[@]}"; do
        for li in "${!layouts[@]}"; do
            read -r ranks pp ep dp m schedule <<<"${layouts[$li]}"
            echo "round $rep/$repeats: ${models[$mi]##*/} ${layouts[$li]}" >&2
            "${mpi[@]}" -np "$ranks" "$bin/examples/mixtral_train" --preset "${models[$mi]}" --steps "$steps" \
                --batch-size "$batch" --seq-len "$seq" --warmup 2 --pp "$pp" --ep "$ep" --dp "$dp" \
                --micro-batches "$m" --schedule "$schedule" --platform "$platform" \
                --migration off --no-progress --log-every 0 --history off --summary "$tmp/summary-$mi-$li-$rep.json" >"$tmp/run.log" 2>&1 ||
                { cat "$tmp/run.log" >&2; exit 1; }
        done
    done
done
: >"$out"
for mi in "${!models[@]}"; do
    model=${models[$mi]}
    for li in "${!layouts[@]}"; do
        read -r ranks pp ep dp m schedule <<<"${layouts[$li]}"
        mbs=$((batch / (m * ep * dp)))
        "$bin/piper" predict --model "$model" --platform "$platform" --pp "$pp" --ep "$ep" \
            --dp "$dp" --micro-batch-size "$mbs" --num-micro-batches "$m" --seq-len "$seq" --schedule "$schedule" \
            --recompute none --dtype fp32 --json >"$tmp/predict.json"
        if [[ -n ${REPRICE:-} ]]; then measured=("--measured" "$tmp/measured.jsonl"); else measured=("$tmp"/summary-"$mi-$li"-*.json); fi
        "$python" - "$model" "${layouts[$li]}" "$tmp/predict.json" "${measured[@]}" >>"$out" <<'PY'
import json, statistics, sys
model, layout = sys.argv[1], sys.argv[2].split()
name = model.split("/")[-1].removesuffix(".json")
key = {"model": name, "ranks": int(layout[0]), "pp": int(layout[1]), "ep": int(layout[2]), "dp": int(layout[3]),
       "micro_batches": int(layout[4]), "schedule": layout[5]}
predict = json.load(open(sys.argv[3]))
if sys.argv[4] == "--measured":
    rows = [json.loads(l) for l in open(sys.argv[5])]
    row = next((r for r in rows if all(r[k] == v for k, v in key.items())), None)
    if row is None:
        sys.exit(f"error: {sys.argv[5]} has no measurement of {key}; run without REPRICE")
    measured_t, measured_m = row["step_time_s"]["measured"], row["peak_memory_bytes"]["measured"]
    repeats, spread, memory_spread = row["repeats"], row["step_time_spread"], row.get("peak_memory_spread")
    heap = {k: row[k] for k in ("peak_heap_bytes",) if k in row}
else:
    summaries = [json.load(open(p)) for p in sys.argv[4:]]
    times = [s["step_time_median_s"] for s in summaries]
    mems = [max(s["peak_rss_bytes"]) for s in summaries]
    measured_t, measured_m = statistics.median(times), statistics.median(mems)
    repeats, spread = len(summaries), (max(times) - min(times)) / measured_t
    memory_spread = (max(mems) - min(mems)) / measured_m
    # The heap's peak (largest rank), where the trainer's allocator counts it.
    heaps = [max(s["peak_heap_bytes"]) for s in summaries if s.get("peak_heap_bytes")]
    heap = {} if len(heaps) < len(summaries) or min(heaps) <= 0 else {"peak_heap_bytes": {
        "measured": statistics.median(heaps), "spread": (max(heaps) - min(heaps)) / statistics.median(heaps)}}
# Rows measured before the memory spread was kept have none.
noise = {} if memory_spread is None else {"peak_memory_spread": memory_spread}
print(json.dumps({
    **key, "repeats": repeats, "step_time_spread": spread, **noise,
    "step_time_s": {"predicted": predict["step_time_s"], "measured": measured_t,
                    "error": predict["step_time_s"] / measured_t - 1},
    "peak_memory_bytes": {"predicted": predict["peak_memory_bytes"], "measured": measured_m,
                          "error": predict["peak_memory_bytes"] / measured_m - 1},
    **heap,
}))
PY
        tail -n 1 "$out" | "$python" -c 'import json,sys; d=json.loads(sys.stdin.read()); t,m=d["step_time_s"],d["peak_memory_bytes"]; print("%-16s R=%d PP=%d EP=%d DP=%d M=%d %-5s step %7.1f ms (spread %4.1f%%) predicted %7.1f (%+5.1f%%)  memory %6.1f MiB (spread %5s) predicted %6.1f (%+5.1f%%)" % (d["model"], d["ranks"], d["pp"], d["ep"], d["dp"], d["micro_batches"], d["schedule"], 1e3*t["measured"], 100*d["step_time_spread"], 1e3*t["predicted"], 100*t["error"], m["measured"]/2**20, "%4.1f%%" % (100*d["peak_memory_spread"]) if "peak_memory_spread" in d else "n/a", m["predicted"]/2**20, 100*m["error"]))' >&2
    done
done
"$python" - "$out" "$prefix.json" "$prefix.png" <<'PY'
import json, statistics, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [json.loads(l) for l in open(sys.argv[1])]
def stats(key):
    e = [abs(r[key]["error"]) for r in rows]
    return {"median_abs_error": statistics.median(e), "max_abs_error": max(e), "runs": len(e)}
def ranks_of(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    for pos, i in enumerate(order):
        r[i] = pos
    return r
def spearman(a, b):
    ra, rb = ranks_of(a), ranks_of(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return num / den if den else float("nan")
choice = []
for model in sorted({r["model"] for r in rows}):
    for ranks in (2, 4):
        pts = [r for r in rows if r["model"] == model and r["ranks"] == ranks]
        pred = [r["step_time_s"]["predicted"] for r in pts]
        meas = [r["step_time_s"]["measured"] for r in pts]
        first = pts[pred.index(min(pred))]
        choice.append({"model": model, "ranks": ranks, "layouts": len(pts),
                       "first_choice": {k: first[k] for k in ("pp", "ep", "dp", "micro_batches", "schedule")},
                       "regret": first["step_time_s"]["measured"] / min(meas) - 1,
                       "rank_correlation": spearman(pred, meas)})
doc = {"rows": rows, "step_time": stats("step_time_s"), "peak_memory": stats("peak_memory_bytes"),
       "spread_median": statistics.median(r["step_time_spread"] for r in rows), "planner": choice}
memory_spreads = [r["peak_memory_spread"] for r in rows if "peak_memory_spread" in r]
if memory_spreads:
    doc["memory_spread_median"] = statistics.median(memory_spreads)
with open(sys.argv[2], "w") as f:
    json.dump(doc, f, indent=1)
fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
for ax, key, unit, scale in [(axes[0], "step_time_s", "step time (ms)", 1e3), (axes[1], "peak_memory_bytes", "peak memory (MiB)", 2**-20)]:
    for model, marker in zip(sorted({r["model"] for r in rows}), "os^v"):
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
fig.suptitle("piper predict vs mixtral_train, held-out models, one calibration for 1, 2 and 4 ranks")
fig.tight_layout()
fig.savefig(sys.argv[3], dpi=110)
print(json.dumps({k: doc[k] for k in ("step_time", "peak_memory", "spread_median", "memory_spread_median", "planner") if k in doc}, indent=1))
PY
