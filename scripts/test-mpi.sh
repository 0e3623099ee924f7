#!/usr/bin/env bash
# The multi-rank tests: installs OpenMPI when it is missing (Debian/Ubuntu apt, as root or with sudo),
# then builds with `--features mpi` and runs every test that needs `mpirun`:
#   tests/parallel_mpirun.rs     mixtral_train under mpirun equals one process (EP, DP, PP, HALO, plan
#                                file, migration, zero-token ranks, hung and dead ranks), and a model
#                                author's own crate (tests/author-crate) as PP=2 × EP=2
#   piper-comm/tests/mpirun.rs   every all-to-all algorithm against the reference on 4 and 8 ranks, a
#                                missing rank named
# `cargo test --workspace` (the README's test command) lists these as ignored when built without MPI.
# Usage: scripts/test-mpi.sh [extra cargo test args, e.g. --release]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
  echo "OpenMPI not found: installing libopenmpi-dev openmpi-bin libclang-dev pkg-config (apt)" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "error: OpenMPI is missing and this is not root: install libopenmpi-dev openmpi-bin libclang-dev" >&2; exit 2; }
    sudo="sudo"
  fi
  command -v apt-get >/dev/null || { echo "error: OpenMPI is missing and apt-get is not available: install OpenMPI (mpicc, mpirun) and libclang" >&2; exit 2; }
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    libopenmpi-dev openmpi-bin libclang-dev pkg-config >/dev/null
fi
mpirun --version | head -n 1

cargo test "$@" -p piper-comm --features mpi --test mpirun
# The binaries tests/parallel_mpirun.rs launches (`cargo test --test` builds no examples).
cargo build "$@" --features mpi --example mixtral_train
# A model author's crate outside the workspace (examples/custom_model.rs against the `piper` crate alone).
cargo build "$@" --manifest-path tests/author-crate/Cargo.toml --features mpi
cargo build "$@" -p piper-planner --bin piper
cargo test "$@" --features mpi --test parallel_mpirun
