#!/usr/bin/env bash
# The all-to-all algorithms on a simulated machine, in SimGrid's SMPI, next to the planner's model.
#
#   scripts/simulate-alltoall.sh --platform frontier --nodes 4,16,64 --bytes 1024,65536 --json OUT
#                                [--algos flat,pairwise,halo2] [--network-model links|smpi] [--message-overhead-us 0]
#                                [--timeout-s 600] [--work DIR]
#
# For each node count and algorithm, piper-schedule records the algorithm's message schedule from
# piper-comm's own code (every rank sending the same bytes to every peer) and scripts/simgrid/replay.c
# replays it under smpirun on the platform scripts/simgrid/platform.py writes (frontier: 8 GCDs per
# node; emulated: scripts/emulate-fabric.sh's 2 ranks per node on 1 Gbit/s links). OUT is a JSON array,
# one row per (nodes, bytes_per_peer, algo) with `simulated_s` (simulated seconds from the last rank's start to the last end),
# `model_s` (the planner's all-to-all cost on the same platform preset; null for emulated) and `auto`
# (true on the algorithm the planner picks). A replay longer than --timeout-s (host seconds) gives a
# row with `simulated_s: null` and `skipped`. halo3 (a three-level HALO) is not implemented and is
# refused. --message-overhead-us X charges each send and each receive X us of its rank's time (SMPI's
# smpi/os and smpi/or; 0, SMPI's default, charges none): the per-message host cost that a flat all-to-all
# pays once per peer and HALO once per remote node. --network-model links (the default) shares the
# platform's links max-min fairly among the flows crossing them, each message paying its route's stated
# latency (SimGrid's CM02 model: the hardware figures alone); smpi is SMPI's default model, which also
# scales every message's latency (x2.0-11.6) and bandwidth (x0.34-0.94) by its size from piecewise tables
# (smpi/lat-factor, smpi/bw-factor) calibrated on a TCP/Ethernet cluster, not on Slingshot. Flows are simulated without TCP's acknowledgement
# traffic (network/crosstraffic:0: Slingshot is not TCP). Installs SimGrid (Debian's libsimgrid-dev) if smpirun is missing.
set -euo pipefail

PLATFORM=frontier; NODES=4,16; BYTES=1024,65536; ALGOS=flat,pairwise,halo2; JSON=""; TIMEOUT=600; WORK=""; OVERHEAD=0; NETWORK=links
while [ $# -gt 0 ]; do
  case "$1" in
    --platform) PLATFORM=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --bytes) BYTES=$2; shift 2 ;;
    --algos) ALGOS=$2; shift 2 ;;
    --json) JSON=$2; shift 2 ;;
    --timeout-s) TIMEOUT=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --message-overhead-us) OVERHEAD=$2; shift 2 ;;
    --network-model) NETWORK=$2; shift 2 ;;
    *) echo "error: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -n "$JSON" ] || { echo "error: --json OUT is required" >&2; exit 2; }
case "$PLATFORM" in
  frontier) RPN=8; MODEL=(--platform frontier) ;;
  emulated) RPN=2; MODEL=() ;;
  *) echo "error: --platform $PLATFORM: one of frontier, emulated" >&2; exit 2 ;;
esac
for a in ${ALGOS//,/ }; do
  case "$a" in
    flat|pairwise|halo2) ;;
    halo3) echo "error: --algos halo3: the three-level HALO is not implemented; use flat, pairwise, halo2" >&2; exit 2 ;;
    *) echo "error: --algos $a: one of flat, pairwise, halo2" >&2; exit 2 ;;
  esac
done
for v in ${NODES//,/ } ${BYTES//,/ } $TIMEOUT; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "error: '$v' in --nodes/--bytes/--timeout-s is not a positive integer" >&2; exit 2; }
done

[[ "$OVERHEAD" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "error: --message-overhead-us $OVERHEAD: a number of microseconds ≥ 0" >&2; exit 2; }
SMPI_CFG=(--cfg=smpi/simulate-computation:no --cfg=network/crosstraffic:0)
case "$NETWORK" in
  links) SMPI_CFG+=(--cfg=network/model:CM02) ;;
  smpi) ;;
  *) echo "error: --network-model $NETWORK: one of links, smpi" >&2; exit 2 ;;
esac
if [ "$OVERHEAD" != 0 ]; then
  s=$(python3 -c "import sys; print(float(sys.argv[1]) * 1e-6)" "$OVERHEAD")
  SMPI_CFG+=(--cfg=smpi/os:0:$s:0 --cfg=smpi/or:0:$s:0)
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v smpirun >/dev/null; then
  echo "SimGrid is missing: installing libsimgrid-dev" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi
  $SUDO apt-get install -y --no-install-recommends libsimgrid-dev >&2
fi
if [ -z "$WORK" ]; then WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT; fi
mkdir -p "$WORK"
BIN=${PIPER_SCHEDULE_BIN:-}
if [ -z "$BIN" ]; then
  TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
  (cd "$ROOT" && cargo build --release -q -p piper-comm --bin piper-schedule) >&2
  BIN=$TARGET/release/piper-schedule
fi
(cd "$WORK" && smpicc -O2 -o replay "$ROOT/scripts/simgrid/replay.c") >&2

ROWS=$WORK/rows.jsonl; : > "$ROWS"
for n in ${NODES//,/ }; do
  python3 "$ROOT/scripts/simgrid/platform.py" --platform "$PLATFORM" --nodes "$n" \
    --xml "$WORK/platform-$n.xml" --hostfile "$WORK/hosts-$n.txt"
  for a in ${ALGOS//,/ }; do
    algo=${a/halo2/halo}
    dir=$WORK/schedule-$n-$a
    "$BIN" --algo "$algo" --nodes "$n" --ranks-per-node $RPN --out "$dir" --bytes "$BYTES" ${MODEL[@]+"${MODEL[@]}"} \
      > "$WORK/model-$n-$a.jsonl"
    for b in ${BYTES//,/ }; do
      start=$(date +%s.%N)
      if out=$(timeout "$TIMEOUT" smpirun -np $((n * RPN)) -platform "$WORK/platform-$n.xml" \
                 -hostfile "$WORK/hosts-$n.txt" "${SMPI_CFG[@]}" \
                 "$WORK/replay" "$dir" "$b" 2>"$WORK/smpi-$n-$a-$b.log"); then
        sim=$(echo "$out" | awk '/^simulated_s/ {print $2}')
        [ -n "$sim" ] || { echo "error: the replay of $a on $n nodes at $b B printed no time (see $WORK/smpi-$n-$a-$b.log)" >&2; exit 1; }
        skipped=null
      else
        rc=$?
        [ $rc = 124 ] || { tail -5 "$WORK/smpi-$n-$a-$b.log" >&2; echo "error: the replay of $a on $n nodes at $b B failed ($rc)" >&2; exit 1; }
        sim=null; skipped="\"the replay took longer than ${TIMEOUT} s\""
      fi
      wall=$(python3 -c "import sys; print(round(float(sys.argv[1]) - float(sys.argv[2]), 2))" "$(date +%s.%N)" "$start")
      model=$(python3 -c "import json,sys
rows=[json.loads(l) for l in open(sys.argv[1])]
r=[r for r in rows if r['bytes_per_peer']==int(sys.argv[2])]
print(json.dumps({'model_s': r[0]['model_s'], 'auto': r[0]['auto']} if r else {'model_s': None, 'auto': None}))" \
        "$WORK/model-$n-$a.jsonl" "$b")
      echo "{\"platform\": \"$PLATFORM\", \"nodes\": $n, \"ranks\": $((n * RPN)), \"bytes_per_peer\": $b, \"algo\": \"$a\", \"network_model\": \"$NETWORK\", \"message_overhead_us\": $OVERHEAD, \"simulated_s\": $sim, \"skipped\": $skipped, \"host_s\": $wall, \"model\": $model}" >> "$ROWS"
      echo "$PLATFORM nodes=$n algo=$a bytes=$b simulated_s=$sim ($wall s)" >&2
    done
  done
done
python3 - "$ROWS" "$JSON" <<'EOF'
import json, sys
rows = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    r.update(r.pop("model"))
    rows.append(r)
tmp = sys.argv[2] + ".tmp"
with open(tmp, "w") as f:
    json.dump(rows, f, indent=1)
import os
os.replace(tmp, sys.argv[2])
EOF
