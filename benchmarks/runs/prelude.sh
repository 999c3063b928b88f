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
# fits SECONDS NAME: whether SECONDS more fit before $END (a script sets END); says so when not.
fits() { (( $(date +%s) + $1 <= END )) || { echo "== skipped $2: $1 s do not fit" | tee -a "$R/skipped.txt"; return 1; }; }
# step NAME SECONDS COMMAND...: run COMMAND (at most SECONDS) if it fits, output in $R/NAME.log,
# its status line appended there.
step() {
    local name=$1 limit=$2
    shift 2
    fits "$limit" "$name" || return 0
    timeout -k 5 "$limit" "$@" > "$R/$name.log" 2>&1
    stamp "$name" $? >> "$R/$name.log"
}
# plots FILE...: the PNGs of results CSVs (or tuner tables) into $R/plots, stamped with their run facts.
plots() { step "plots_$(basename "$1" | cut -d. -f1)" 30 "$PY" -m benchmarks plot "$@" --out "$R/plots"; }
# suite_w2 SETS CSV [SECONDS]: the world-2 suite of the four ops on SETS, every variant and auto (and
# all_gather_gemm's copy_engine form), at most SECONDS (default 50) an op, each op only if it fits;
# appends to CSV. SUITE_EXTRA: more methods for every op (the suite skips, saying so, those an op
# does not have).
suite_w2() {
    local op V limit=${3:-50}
    for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter gemm_all_reduce; do
        V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto
        [[ $op == all_gather_gemm ]] && V=$V,copy_engine
        [[ -n ${SUITE_EXTRA:-} ]] && V=$V,$SUITE_EXTRA
        fits "$limit" "suite $op" && { timeout -k 5 "$limit" "$PY" -m benchmarks suite --world 2 --ops "$op" --sets "$1" \
            --variants "$V" --csv "$2" --append --no-progress >> "$R/suite_w2.log" 2>&1
            stamp "suite w2 $op" $? >> "$R/suite_w2.log"; }
    done
}
# tests_in_rest SPEC: the GPU tests of SPEC (gpu_tests.sh's GROUPS_SPEC; not the slow set unless
# TESTS_ADDOPTS says otherwise: '' runs it) in the time left before $END, if a minute or more is; into
# $R/tests and $R/tests.log.
tests_in_rest() {
    local left=$(( END - $(date +%s) - 10 ))
    local addopts=${TESTS_ADDOPTS-'-m "not slow"'}  # TESTS_ADDOPTS='' runs the slow set of those files too
    (( left > 60 )) || { echo "== skipped tests: ${left} s left" | tee -a "$R/skipped.txt"; return 0; }
    ( OUT=$R/tests LIMIT_S=$left PER_TEST=$(( left - 10 )) PYTEST_ADDOPTS="$addopts" GROUPS_SPEC="$1" \
        bash "$(dirname "${BASH_SOURCE[0]}")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
}
