# Sourced by every script in this folder (run them from the repository root): the environment of a
# GPU run, the output folder, and helpers.
#   OUT   where results go (default ./bench_out); the script's files go under $R = $OUT/r and are
#         packed into $OUT/run.tar.gz by `pack` (a device run returns few files).
#   TILEFUSE_COMMIT  the commit to record in CSVs and tables (a device's copy of the checkout may lack .git).
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off in NCCL, torch's symmetric memory and NVSHMEM: on a shared GPU host a
# program that uses it can put the host's GPUs out of service. Set here too, in case a caller's
# environment lacks them.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-$(command -v python3 || command -v python)}
OUT=${OUT:-./bench_out}
R=$OUT/r
mkdir -p "$R"
T0=$(date +%s)
# stamp NAME RC: one status line.
stamp() { echo "== $1 rc=$2 at $(( $(date +%s) - T0 ))s"; }
# gpus: how many GPUs torch sees (0 without one).
gpus() { "$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0; }
# clocks FILE: sample the GPUs' SM clock, power, temperature and throttle reasons every 200 ms into
# FILE in the background (the power-capped clock swing is what the timing method is built around);
# prints the sampler's pid (kill it when done), nothing without nvidia-smi.
clocks() {
    command -v nvidia-smi >/dev/null || return 0
    nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
        --format=csv,noheader -lms 200 > "$1" 2>&1 &
    echo $!
}
pack() { tar czf "$OUT/run.tar.gz" -C "$R" . && echo "packed $OUT/run.tar.gz"; }
