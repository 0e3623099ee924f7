#!/usr/bin/env bash
# What activation recompute buys and costs, measured against what the planner predicts: each model
# (MODELS) and layout trains STEPS steps under mpirun with `--recompute none` and each mode of MODES
# (default `full`; `selective`, `full selective`),
# REPEATS rounds interleaved (every run once per round). Per model and layout: the peak RSS of the largest
# rank and the median step time of each mode (medians over the rounds), the memory recompute saves
# measured and predicted, and the time it costs measured and predicted, the predictions those the run
# prints (`--platform PLATFORM`, default the calibrated benchmarks/results/platforms/local.toml).
# Writes OUT.jsonl (one line per model, layout and mode) and OUT.json (the saving and cost per model and
# layout); OUT defaults to benchmarks/results/recompute.
#
#   [REPEATS=3] [PLATFORM=FILE] [MODELS="a.json b.json"] [MODES="full selective"] [OUT=PREFIX] \
#       benchmarks/recompute.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
if ! [[ $steps =~ ^[1-9][0-9]*$ ]] || ((steps < 6)); then
    echo "error: STEPS must be an integer ≥ 6 (the median skips the first three steps); got '$steps'" >&2
    exit 2
fi
repeats=${REPEATS:-3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/piper-target}
cargo build --release --features mpi --example mixtral_train >&2
bin=$CARGO_TARGET_DIR/release
platform=${PLATFORM:-benchmarks/results/platforms/local.toml}
[[ -f $platform ]] || { echo "error: $platform is missing; run piper calibrate --out $platform first" >&2; exit 2; }
source benchmarks/lib.sh
batch=16
seq=255
read -r -a models <<<"${MODELS:-benchmarks/configs/heldout3-mixtral.json benchmarks/configs/heldout3-deepseek.json benchmarks/configs/mixtral-mid.json}"
# ranks pp ep dp micro-batches schedule
layouts=("1 1 1 1 2 1f1b" "2 1 2 1 1 1f1b" "2 2 1 1 4 gpipe")
read -r -a recomputing <<<"${MODES:-full}"
for mode in "${recomputing[@]}"; do
    [[ $mode == full || $mode == selective ]] ||
        { echo "error: MODES holds 'full' and/or 'selective'; got '$mode'" >&2; exit 2; }
done
modes=(none "${recomputing[@]}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=${OUT:-benchmarks/results/recompute}
for rep in $(seq 1 "$repeats"); do
    for mi in "${!models[@]}"; do
        for li in "${!layouts[@]}"; do
            read -r ranks pp ep dp m schedule <<<"${layouts[$li]}"
            for mode in "${modes[@]}"; do
                echo "round $rep/$repeats: ${models[$mi]##*/} ${layouts[$li]} --recompute $mode" >&2
                "${mpi[@]}" -np "$ranks" "$bin/examples/mixtral_train" --preset "${models[$mi]}" --steps "$steps" \
                    --batch-size "$batch" --seq-len "$seq" --warmup 2 --pp "$pp" --ep "$ep" --dp "$dp" \
                    --micro-batches "$m" --schedule "$schedule" --recompute "$mode" --platform "$platform" \
                    --migration off --no-progress --log-every 0 --history off \
                    --summary "$tmp/summary-$mi-$li-$mode-$rep.json" >"$tmp/run.log" 2>&1 ||
                    { cat "$tmp/run.log" >&2; exit 1; }
            done
        done
    done
done
: >"$prefix.jsonl"
for mi in "${!models[@]}"; do
    for li in "${!layouts[@]}"; do
        for mode in "${modes[@]}"; do
            python3 - "${models[$mi]}" "${layouts[$li]}" "$mode" "$tmp"/summary-"$mi-$li-$mode"-*.json >>"$prefix.jsonl" <<'PY'
import json, statistics, sys
model, layout, mode = sys.argv[1], sys.argv[2].split(), sys.argv[3]
runs = [json.load(open(p)) for p in sys.argv[4:]]
times = [r["step_time_median_s"] for r in runs]
mems = [max(r["peak_rss_bytes"]) for r in runs]
print(json.dumps({
    "model": model.split("/")[-1].removesuffix(".json"), "ranks": int(layout[0]), "pp": int(layout[1]),
    "ep": int(layout[2]), "dp": int(layout[3]), "micro_batches": int(layout[4]), "schedule": layout[5],
    "recompute": mode, "repeats": len(runs),
    "step_time_s": {"measured": statistics.median(times), "spread": (max(times) - min(times)) / statistics.median(times),
                    "predicted": runs[0]["predicted"]["step_time_s"]},
    "peak_memory_bytes": {"measured": statistics.median(mems), "predicted": runs[0]["predicted_peak_memory_bytes"]},
    "loss": {"first": runs[0]["first_loss"], "final": runs[0]["final_loss"]},
}))
PY
        done
    done
done
python3 - "$prefix.jsonl" "$prefix.json" "$platform" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = []
mib = 2.0 ** 20
for none in (r for r in rows if r["recompute"] == "none"):
    key = {k: none[k] for k in ("model", "ranks", "pp", "ep", "dp", "micro_batches", "schedule")}
    for kept in (r for r in rows if r["recompute"] != "none" and all(r[k] == v for k, v in key.items())):
        mode = kept["recompute"]
        saved = {w: (none["peak_memory_bytes"][w] - kept["peak_memory_bytes"][w]) / mib for w in ("measured", "predicted")}
        cost = {w: kept["step_time_s"][w] / none["step_time_s"][w] - 1 for w in ("measured", "predicted")}
        same_loss = kept["loss"] == none["loss"]
        out.append({**key, "recompute": mode, "memory_saved_mib": saved,
                    "saved_error": saved["predicted"] / saved["measured"] - 1 if saved["measured"] > 0 else None,
                    "time_cost": cost, "same_losses": same_loss,
                    "peak_mib": {"none": none["peak_memory_bytes"]["measured"] / mib,
                                 mode: kept["peak_memory_bytes"]["measured"] / mib}})
        print("%-18s R=%d PP=%d EP=%d M=%d %-5s %-9s peak %6.1f → %6.1f MiB: saved %6.1f MiB, predicted %6.1f (%s); "
              "time %+5.1f%%, predicted %+5.1f%%; losses %s" % (
            key["model"], key["ranks"], key["pp"], key["ep"], key["micro_batches"], key["schedule"], mode,
            out[-1]["peak_mib"]["none"], out[-1]["peak_mib"][mode], saved["measured"], saved["predicted"],
            "%+.0f%%" % (100 * out[-1]["saved_error"]) if out[-1]["saved_error"] is not None else "n/a",
            100 * cost["measured"], 100 * cost["predicted"], "equal" if same_loss else "DIFFER"), file=sys.stderr)
errs = [abs(o["saved_error"]) for o in out if o["saved_error"] is not None]
summary = {"platform": sys.argv[3], "runs": out,
           "saved_error_median": statistics.median(errs) if errs else None, "saved_error_max": max(errs) if errs else None}
json.dump(summary, open(sys.argv[2], "w"), indent=1)
PY
