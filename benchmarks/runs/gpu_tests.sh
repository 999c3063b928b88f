#!/usr/bin/env bash
# The whole multi-rank test suite on the GPU(s) of one machine, its files split over parallel pytest
# processes (Triton compiles on the CPU, so one serial pytest spends most of a device call compiling).
#
#   bash benchmarks/runs/gpu_tests.sh       (run from the repository root; TILEFUSE_TEST_DEVICE=cuda)
#
# Rank r of every test world runs on GPU r % device_count (tests/harness.py): on a machine with two
# GPUs the W = 2 tests put one rank on each GPU and read and write each other's memory over the
# GPUs' link, W = 3 and 4 mix that with ranks sharing a GPU.
# Knobs: OUT (default ./bench_out), LIMIT_S (per group, default 480), PER_TEST (default 240 s),
# GROUPS_SPEC (';'-separated groups of test paths), PYTEST_ARGS (extra arguments, e.g. "-k world"),
# TILEFUSE_TEST_PG=nccl (NCCL process groups: needs a GPU per rank, e.g. PYTEST_ARGS="-k '2]'").
# Logs: $OUT/tests_<n>.log, one per group; the summary, printed last, is also $OUT/tests_summary.txt.
# Exit status 1 when any group failed or timed out.
set -u -o pipefail
OUT=${OUT:-./bench_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TILEFUSE_TEST_DEVICE=${TILEFUSE_TEST_DEVICE:-cuda}
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off (a program that uses it can put a shared host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-$(command -v python3 || command -v python)}
LIMIT_S=${LIMIT_S:-480}
PER_TEST=${PER_TEST:-240}
SPEC=${GROUPS_SPEC:-"tests/test_gemm_core.py;tests/test_launcher.py;\
tests/test_runtime.py tests/test_gemm_all_scatter.py;\
tests/test_all_gather_gemm.py;tests/test_gemm_reduce_scatter.py tests/test_workspaces.py;tests/test_gemm_all_reduce.py;\
tests/test_protocol.py tests/test_graphs.py;tests/test_compile.py tests/test_autograd.py tests/test_fp8.py;\
tests/test_nn.py tests/test_styles.py tests/test_program_counts.py;tests/test_tuning.py tests/test_autotune.py tests/test_rules.py;\
tests/test_hardening.py tests/test_benchmarks.py tests/test_warp_spec_compile.py tests/test_groups.py"}
IFS=';' read -r -a GROUPS_LIST <<< "$SPEC"

timeout_args=()
"$PY" -c "import pytest_timeout" 2>/dev/null && timeout_args=(--timeout "$PER_TEST")

START=$(date +%s)
pids=()
for i in "${!GROUPS_LIST[@]}"; do
    # shellcheck disable=SC2086
    # -v: each test's outcome on a line of its own as it ends, so a group cut off by LIMIT_S still
    # names the tests that failed before the cut (its summary never comes).
    timeout -k 10 "$LIMIT_S" "$PY" -m pytest ${GROUPS_LIST[i]} -v -rfE -p no:cacheprovider --durations=8 \
        ${timeout_args[@]+"${timeout_args[@]}"} ${PYTEST_ARGS:-} > "$OUT/tests_$i.log" 2>&1 &
    pids+=($!)
done
# torch's DTensor styles over NCCL, one rank per GPU (the sequence-parallel tests crash under gloo on
# CUDA tensors and skip there): with two GPUs or more, the W = 2 tests of tests/test_styles.py again.
if (( $("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0) >= 2 )) \
    && [[ $TILEFUSE_TEST_DEVICE == cuda && -z ${GROUPS_SPEC:-} ]]; then
    GROUPS_LIST+=("tests/test_styles.py (NCCL)")
    # shellcheck disable=SC2086
    TILEFUSE_TEST_PG=nccl timeout -k 10 "$LIMIT_S" "$PY" -m pytest tests/test_styles.py -q -rfE -p no:cacheprovider \
        ${timeout_args[@]+"${timeout_args[@]}"} -k "not 4" ${PYTEST_ARGS:-} > "$OUT/tests_$(( ${#GROUPS_LIST[@]} - 1 )).log" 2>&1 &
    pids+=($!)
fi
rc_all=0
codes=()
for i in "${!pids[@]}"; do
    wait "${pids[i]}"
    rc=$?
    codes+=("$rc")
    (( rc != 0 && rc != 5 )) && rc_all=1  # 5: pytest selected no test (e.g. -m slow on a file with none)
done
{
    echo "################ runs/gpu_tests.sh: $(( $(date +%s) - START ))s, device=$TILEFUSE_TEST_DEVICE, gpus=$(
        "$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null)"
    for i in "${!GROUPS_LIST[@]}"; do
        what=ok
        (( codes[i] == 124 || codes[i] == 137 )) && what="TIMED OUT"
        (( codes[i] != 0 && codes[i] != 124 && codes[i] != 137 )) && what="FAILED rc=${codes[i]}"
        (( codes[i] == 5 )) && what="no test selected (rc 5)"
        # pytest printed its summary with no failure, then the process died (SIGSEGV in CUDA IPC
        # teardown): say so rather than report the tests as failed.
        if (( codes[i] == 139 )) && grep -qE '^[0-9]+ passed' "$OUT/tests_$i.log" \
            && ! grep -qE '[0-9]+ (failed|errors?)' "$OUT/tests_$i.log"; then
            what="tests passed, then the process died at exit (rc 139, CUDA IPC teardown)"
        fi
        echo "--- group $i [${GROUPS_LIST[i]}]: $what"
        grep -E '^(FAILED|ERROR) |[0-9]+ (passed|failed|error)' "$OUT/tests_$i.log" | tail -n 25
        if [[ $what == "TIMED OUT" ]]; then
            echo "    before the cut: $(grep -cE ' PASSED' "$OUT/tests_$i.log") passed, $(grep -cE ' SKIPPED' \
                "$OUT/tests_$i.log") skipped; failed:"
            grep -E ' (FAILED|ERROR)( |$)' "$OUT/tests_$i.log" | grep -vE '^(FAILED|ERROR) ' | head -n 20
        fi
    done
} > "$OUT/tests_summary.txt"
cat "$OUT/tests_summary.txt"
exit "$rc_all"
