# Sourced by the benchmark scripts, from the repository root.
# mpi: the launcher for ranks that share this machine's cores (no binding: each rank's threads follow
# the cores it is given; root needs its own flag).
mpi=(mpirun --oversubscribe --bind-to none)
if [[ $(id -u) == 0 ]]; then mpi+=(--allow-run-as-root); fi
