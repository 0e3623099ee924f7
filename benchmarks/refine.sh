#!/usr/bin/env bash
# Does refining from the history help on runs it was not fitted on? On a copy of a calibrated platform
# (PLATFORM, default the committed benchmarks/results/platforms/local.toml):
#   1. the history: the main job and 6 layouts (1 and 2 ranks) of each FIT model train STEPS steps, each
#      appending its line to a fresh history file;
#   2. `piper calibrate --refine` refits the platform copy from that history;
#   3. held out: 6 layouts of each HELD model and the main job again train on the refined platform; their
#      own history lines hold the refined predictions (the unrefined ones are those ÷ the scales).
# Prints and writes OUT (default benchmarks/results/refine.json): median and worst |error| of step time
# and peak memory on the held-out runs before and after refining, and the main job's line.
#
#   [PLATFORM=FILE] [FIT="a.json b.json"] [HELD="c.json d.json"] [OUT=FILE] benchmarks/refine.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
if ! [[ $steps =~ ^[1-9][0-9]*$ ]] || ((steps < 6)); then
    echo "error: STEPS must be an integer ≥ 6 (the median skips the first three steps); got '$steps'" >&2
    exit 2
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/piper-target}
cargo build --release --features mpi --example mixtral_train >&2
cargo build --release -p piper-planner --bin piper >&2
bin=$CARGO_TARGET_DIR/release
read -r -a fit <<<"${FIT:-benchmarks/configs/heldout-mixtral.json benchmarks/configs/heldout-qwen3.json}"
read -r -a held <<<"${HELD:-benchmarks/configs/heldout3-mixtral.json benchmarks/configs/heldout3-deepseek.json}"
out=${OUT:-benchmarks/results/refine.json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "${PLATFORM:-benchmarks/results/platforms/local.toml}" "$work/local.toml"
source benchmarks/lib.sh
# ranks pp ep dp micro-batches schedule
layouts=("1 1 1 1 1 1f1b" "1 1 1 1 2 1f1b" "2 1 2 1 1 1f1b" "2 1 1 2 1 1f1b" "2 2 1 1 2 gpipe" "2 2 1 1 4 1f1b")

# train HISTORY MODEL LAYOUT: one run appending to HISTORY.
train() {
    read -r ranks pp ep dp m schedule <<<"$3"
    echo "${1##*/}: ${2##*/} $3" >&2
    "${mpi[@]}" -np "$ranks" "$bin/examples/mixtral_train" --preset "$2" --steps "$steps" --batch-size 16 \
        --seq-len 127 --warmup 2 --pp "$pp" --ep "$ep" --dp "$dp" --micro-batches "$m" --schedule "$schedule" \
        --platform "$work/local.toml" --migration off --no-progress --log-every 0 --history "$1" \
        >"$work/run.log" 2>&1 || { cat "$work/run.log" >&2; exit 1; }
}
# The main job as the README runs it.
main_job() {
    echo "${1##*/}: the main job" >&2
    PIPER_LOCAL_PLATFORM=$work/local.toml "$bin/examples/mixtral_train" --no-progress --log-every 0 \
        --history "$1" >"$work/run.log" 2>&1 || { cat "$work/run.log" >&2; exit 1; }
}

main_job "$work/history.jsonl"
for model in "${fit[@]}"; do for l in "${layouts[@]}"; do train "$work/history.jsonl" "$model" "$l"; done; done
"$bin/piper" calibrate --refine --out "$work/local.toml" --history "$work/history.jsonl" | tee "$work/refine.txt" >&2
for model in "${held[@]}"; do for l in "${layouts[@]}"; do train "$work/held.jsonl" "$model" "$l"; done; done
main_job "$work/held.jsonl"

python3 - "$work/local.toml" "$work/held.jsonl" "$work/refine.txt" "$out" "$steps" <<'EOF'
import json, statistics, sys, tomllib, platform
plat_path, held_path, refine_txt, out_path, steps = sys.argv[1:]
r = tomllib.load(open(plat_path, "rb"))["refinement"]
runs = [json.loads(line) for line in open(held_path)]
rows = []
for h in runs:
    p = h["plan"]
    refined_t, refined_m = p["predicted"]["step_time_s"], max(p["predicted"]["stage_memory_bytes"])
    rows.append({
        "model": h["model"]["name"], "pp": p["pp"], "ep": p["ep"], "dp": p["dp"],
        "micro_batches": p["num_micro_batches"], "schedule": p["schedule"],
        "measured_step_s": h["step_time_median_s"], "measured_peak_bytes": h["peak_rss_bytes"],
        "before_step_s": refined_t / r["time_scale"], "after_step_s": refined_t,
        "before_peak_bytes": refined_m / r["memory_scale"], "after_peak_bytes": refined_m,
        "steal_share": h["steal_share"],
    })
def err(row, when, what):
    measured = row[f"measured_{what}"]
    return abs(row[f"{when}_{what}"] - measured) / measured
summary = {}
for when in ("before", "after"):
    for what in ("step_s", "peak_bytes"):
        errs = [err(x, when, what) for x in rows]
        summary[f"{when}_{what}"] = {"median": statistics.median(errs), "worst": max(errs)}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
doc = {"cpu": cpu, "steps": int(steps), "refinement": r, "refine_output": open(refine_txt).read().splitlines(),
       "held_out": summary, "main_job": rows[-1], "runs": rows}
json.dump(doc, open(out_path, "w"), indent=1)
print(f"refinement: time ×{r['time_scale']:.3f}, memory ×{r['memory_scale']:.3f} from {r['runs']} runs ({cpu})")
for what, name in (("step_s", "step time"), ("peak_bytes", "peak memory")):
    b, a = summary[f"before_{what}"], summary[f"after_{what}"]
    print(f"held out, {len(rows)} runs, {name}: median |error| {100*b['median']:.1f}% → {100*a['median']:.1f}%, worst {100*b['worst']:.1f}% → {100*a['worst']:.1f}%")
m = rows[-1]
for what, name in (("step_s", "step"), ("peak_bytes", "memory")):
    print(f"main job {name}: {100*(m['before_'+what]/m['measured_'+what]-1):+.1f}% → {100*(m['after_'+what]/m['measured_'+what]-1):+.1f}%")
EOF
echo "wrote $out" >&2
