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
# decode_steps AR_S TP_S H1_S: gemm_all_reduce at M = 1-1024 eager and in CUDA graphs (AR_S seconds),
# the replicated decode step of examples/tp_llama.py in a graph with each rank's auto decisions logged
# (TP_S) and the host cost at world 1 on GPU 0 (H1_S; 0 skips it), each a step.
decode_steps() {
    step allreduce_decode "$1" "$PY" -m benchmarks.allreduce_decode --world 2 --M 1,16,64,256,1024 \
        --csv "$R/allreduce_decode_w2.csv"
    step tp_llama "$2" torchrun --nproc-per-node 2 examples/tp_llama.py --layers 2 --layouts decode \
        --log-level debug --csv "$R/tp_llama_decode_w2.csv"
    (( $3 > 0 )) && step host_overhead_w1 "$3" env CUDA_VISIBLE_DEVICES=0 "$PY" -m benchmarks host_overhead \
        --world 1 --M 1,16,128,1024 --csv "$R/host_overhead_w1.csv"
    return 0
}
# suite_w2 SETS CSV [SECONDS]: the world-2 suite of the four ops on SETS, every variant and auto (and
# the copy-engine forms of all_gather_gemm and gemm_all_scatter, the epilogue sums of
# gemm_reduce_scatter and gemm_all_reduce), at most SECONDS (default 50) an op,
# each op only if it fits; appends to CSV. SUITE_EXTRA: more methods for every op, e.g.
# bulk_sync.ws,fused_sequential.ws (the suite skips, saying so, those an op does not have).
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
# tests_beside_soak LIMIT_S SOAK_BUDGET_S [MARKERS]: the multi-rank tests (MARKERS, a pytest -m
# expression, default "not slow") and the 10,000-call soak at one process per GPU (ranks sharing the
# GPU on a machine of one) side by side (neither timed), into $R/tests and $R/soak_w2.csv.
tests_beside_soak() {
    ( OUT=$R/tests LIMIT_S=$1 PER_TEST=$(( $1 - 20 )) PYTEST_ADDOPTS="-m '${3:-not slow}'" \
        bash "$(dirname "${BASH_SOURCE[0]}")/gpu_tests.sh" > "$R/tests.log" 2>&1 ) &
    ( timeout -k 10 $(( $2 + 30 )) "$PY" -m benchmarks soak --world 2 --calls 10000 --check-every 100 --variants all \
        --heap-size 1G --require-flat --budget-s "$2" --csv "$R/soak_w2.csv" --no-progress > "$R/soak.log" 2>&1
      stamp soak $? >> "$R/soak.log" ) &
    wait
}
