#!/usr/bin/env bash
# Two builds of the trainer side by side: `benchmarks/runtime_ab.sh OLD NEW` runs OLD and NEW
# (`mixtral_train` executables, e.g. one copied aside before a runtime change) on the same layouts under
# mpirun, alternating OLD and NEW run by run over ROUNDS rounds (default 3), STEPS steps each (default 20,
# 2 warm-up), and prints each layout's median step time and largest peak RSS with NEW ÷ OLD. One JSON
# row per run goes to OUT (default benchmarks/results/runtime-ab.jsonl). MODELS: presets or config files
# (default the heldout11 pair). Nothing else may run meanwhile; name the CPU beside the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# == 2 && -x $1 && -x $2 ]] || { echo "usage: $0 OLD_MIXTRAL_TRAIN NEW_MIXTRAL_TRAIN (two executables)" >&2; exit 2; }
old=$1 new=$2
rounds=${ROUNDS:-3} steps=${STEPS:-20}
out=${OUT:-benchmarks/results/runtime-ab.jsonl}
read -r -a models <<<"${MODELS:-benchmarks/configs/heldout11-qwen3.json benchmarks/configs/heldout11-mixtral.json}"
source benchmarks/lib.sh
# ranks pp ep dp micro-batches schedule
layouts=("1 1 1 1 1 1f1b" "2 1 1 2 1 1f1b" "2 1 2 1 1 1f1b" "2 2 1 1 4 1f1b" "4 1 4 1 1 1f1b" "4 4 1 1 4 1f1b")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$out"
for round in $(seq 1 "$rounds"); do
    for model in "${models[@]}"; do
        for layout in "${layouts[@]}"; do
            read -r ranks pp ep dp m schedule <<<"$layout"
            for which in old new; do
                bin=$old; [[ $which == new ]] && bin=$new
                echo "round $round/$rounds: $which ${model##*/} $layout" >&2
                "${mpi[@]}" -np "$ranks" "$bin" --preset "$model" --steps "$steps" --batch-size 16 --seq-len 127 \
                    --warmup 2 --pp "$pp" --ep "$ep" --dp "$dp" --micro-batches "$m" --schedule "$schedule" \
                    --migration off --no-progress --log-every 0 --history off --summary "$tmp/summary.json" \
                    </dev/null >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log" >&2; exit 1; }
                python3 -c 'import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"v": sys.argv[2], "model": sys.argv[3].split("/")[-1], "layout": sys.argv[4],
                  "t": s["step_time_median_s"], "mem": s["peak_rss_bytes"]}))' \
                    "$tmp/summary.json" "$which" "$model" "$layout" >>"$out"
            done
        done
    done
done
python3 - "$out" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = list(dict.fromkeys((r["model"], r["layout"]) for r in rows))
print("%-24s %-16s %9s %9s %12s %9s %9s %7s" % ("model", "ranks pp ep dp m", "old ms", "new ms",
      "new/old", "old MiB", "new MiB", "memory"))
ratios = []
for key in keys:
    old = [r for r in rows if (r["model"], r["layout"]) == key and r["v"] == "old"]
    new = [r for r in rows if (r["model"], r["layout"]) == key and r["v"] == "new"]
    if len(old) != len(new):
        sys.exit(f"error: {key} has {len(old)} OLD runs and {len(new)} NEW runs")
    # Each round's NEW against the OLD run just before it, then the median over rounds.
    per_round = [b["t"] / a["t"] for a, b in zip(old, new)]
    ratios.append(st.median(per_round))
    m_old = st.median(max(r["mem"]) for r in old) / 2**20
    m_new = st.median(max(r["mem"]) for r in new) / 2**20
    print("%-24s %-16s %9.1f %9.1f %5.3f (%.2f-%.2f) %9.1f %9.1f %+6.1f%%" % (key[0], key[1],
          1e3 * st.median(r["t"] for r in old), 1e3 * st.median(r["t"] for r in new), ratios[-1],
          min(per_round), max(per_round), m_old, m_new, 100 * (m_new / m_old - 1)))
print("median over layouts of NEW / OLD step time: %.3f" % st.median(ratios))
PY
