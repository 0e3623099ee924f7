#!/usr/bin/env bash
# A one-node Slurm cluster on this machine for the Slurm launch tests (tests/slurm_srun.rs):
#   scripts/slurm-local.sh start   installs Debian's slurm-wlm if missing (apt, as root or with sudo),
#                                  writes DIR/slurm.conf (this host, every core, PMIx as the MPI plugin,
#                                  no authentication daemon), starts slurmctld and slurmd, waits for the
#                                  node, and prints the `export SLURM_CONF=…` line to use it
#   scripts/slurm-local.sh stop    stops both daemons
# DIR is $PIPER_SLURM_DIR, default /tmp/piper-slurm. For tests only: auth/none trusts every local user.
set -euo pipefail
dir=${PIPER_SLURM_DIR:-/tmp/piper-slurm}
conf=$dir/slurm.conf

stop() {
  for d in slurmd slurmctld; do
    if [ -f "$dir/$d.pid" ]; then
      kill "$(cat "$dir/$d.pid")" 2>/dev/null || true
      rm -f "$dir/$d.pid"
    fi
  done
}

install() {
  command -v slurmctld >/dev/null && command -v srun >/dev/null && return
  echo "Slurm not found: installing slurm-wlm (apt)" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "error: Slurm is missing and this is not root: install slurm-wlm" >&2; exit 2; }
    sudo="sudo"
  fi
  command -v apt-get >/dev/null || { echo "error: Slurm is missing and apt-get is not available: install slurm-wlm" >&2; exit 2; }
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends slurm-wlm >/dev/null
}

start() {
  install
  stop
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  local host cores mem user
  host=$(hostname -s)
  cores=$(nproc)
  mem=$(awk '/MemTotal/ { print int($2 / 1024 / 2) }' /proc/meminfo)
  user=$(id -un)
  cat >"$conf" <<CONF
ClusterName=piper-local
SlurmctldHost=$host
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/none
CredType=cred/none
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cores RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  slurmctld -f "$conf"
  slurmd -f "$conf"
  for _ in $(seq 1 60); do
    if SLURM_CONF=$conf sinfo -h -o %t 2>/dev/null | grep -qx idle; then
      echo "export SLURM_CONF=$conf"
      return
    fi
    sleep 0.5
  done
  echo "error: the local Slurm node did not come up in 30 s; see $dir/log/" >&2
  tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
  exit 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
