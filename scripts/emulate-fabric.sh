#!/usr/bin/env bash
# Emulated 2-level fabric on one machine: N "nodes" as network namespaces joined by a bridge through
# shaped veth links (tc tbf), so traffic between nodes crosses a slow link and traffic inside a node
# does not. Then runs the piper-comm benchmark across them.
#
#   scripts/emulate-fabric.sh up   --nodes 4 --rate 1gbit
#   scripts/emulate-fabric.sh run  --nodes 4 --ranks-per-node 2 [--sizes 1KiB,64KiB,1MiB] [--iters 10] [--json out.json]
#                                  [--algos flat,halo] [--dispatch-top-k 8]
#   scripts/emulate-fabric.sh down --nodes 4
#   scripts/emulate-fabric.sh bench --nodes 4 --ranks-per-node 2 --rate 1gbit --json out.json   # up + run + down
#
# Needs root (network namespaces), iproute2 and OpenMPI. `bench` tears everything down even on failure.
# Only bandwidth is shaped (tbf), not latency, so kernels without netem do. Inside a node, ranks talk
# over TCP loopback (OpenMPI's shared-memory transport is disabled so that nothing bypasses the links).
set -euo pipefail

cmd=${1:-}; shift || true
NODES=2; RPN=2; RATE=1gbit; SIZES=1KiB,16KiB,64KiB,256KiB,1MiB; ITERS=10; JSON=""; ALGOS=flat,halo; TOPK=0
BIN=${PIPER_COMM_BIN:-target/release/piper-comm}
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2 ;;
    --ranks-per-node) RPN=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --algos) ALGOS=$2; shift 2 ;;
    --json) JSON=$2; shift 2 ;;
    --dispatch-top-k) TOPK=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    *) echo "error: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
PREFIX=piperfab

down() {
  for k in $(seq 0 $((NODES - 1))); do ip netns del "$PREFIX-n$k" 2>/dev/null || true; done
  ip netns del "$PREFIX-sw" 2>/dev/null || true
}

up() {
  down
  ip netns add "$PREFIX-sw"
  ip -n "$PREFIX-sw" link add br0 type bridge
  ip -n "$PREFIX-sw" link set br0 up
  ip -n "$PREFIX-sw" link set lo up
  for k in $(seq 0 $((NODES - 1))); do
    ip netns add "$PREFIX-n$k"
    ip link add "pfn$k" type veth peer name "pfs$k"
    ip link set "pfn$k" netns "$PREFIX-n$k"
    ip link set "pfs$k" netns "$PREFIX-sw"
    ip -n "$PREFIX-sw" link set "pfs$k" master br0
    ip -n "$PREFIX-sw" link set "pfs$k" up
    ip -n "$PREFIX-n$k" addr add "10.78.0.$((k + 1))/24" dev "pfn$k"
    ip -n "$PREFIX-n$k" link set "pfn$k" up
    ip -n "$PREFIX-n$k" link set lo up
    # Shape both directions of the node's link.
    ip netns exec "$PREFIX-n$k" tc qdisc replace dev "pfn$k" root tbf rate "$RATE" burst 256kb latency 400ms
    ip netns exec "$PREFIX-sw" tc qdisc replace dev "pfs$k" root tbf rate "$RATE" burst 256kb latency 400ms
  done
  ip -n "$PREFIX-sw" addr add 10.78.0.254/24 dev br0
}

run() {
  [ -x "$BIN" ] || { echo "error: $BIN not built (cargo build --release -p piper-comm)" >&2; exit 2; }
  local apps=()
  for k in $(seq 0 $((NODES - 1))); do
    [ "$k" -gt 0 ] && apps+=(":")
    apps+=(-np "$RPN" ip netns exec "$PREFIX-n$k" "$BIN" --ranks-per-node "$RPN" bench --algos "$ALGOS" --sizes "$SIZES" --iters "$ITERS" --dispatch-top-k "$TOPK")
    [ -n "$JSON" ] && apps+=(--json "$JSON")
  done
  # mpirun runs in the switch namespace so PMIx (TCP) reaches every node namespace.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  ip netns exec "$PREFIX-sw" env PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=br0 \
    timeout 900 mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl tcp,self \
    --mca btl_tcp_if_include 10.78.0.0/24 "${apps[@]}"
}

case "$cmd" in
  up) up ;;
  down) down ;;
  run) run ;;
  bench) trap down EXIT; up; run ;;
  *) echo "usage: $0 up|run|down|bench [--nodes N] [--ranks-per-node R] [--rate 1gbit] [--sizes ...] [--iters N] [--json FILE]" >&2; exit 2 ;;
esac
