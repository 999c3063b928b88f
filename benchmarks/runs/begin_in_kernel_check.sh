#!/usr/bin/env bash
# One GPU: calls whose own kernels begin and end them (no begin kernel, no status copy) and the GEMM
# core's defaults, tested and measured.
#   bash benchmarks/runs/begin_in_kernel_check.sh     (from the repository root; OUT selects the output folder)
# 1. The GEMM-core, protocol, launch-plan, graph, hardening and op test files on the GPU, ranks sharing
#    it, in parallel groups (TEST_GROUPS: ';'-separated groups instead).
# 2. The GEMM core's parity grid with its default configs, bf16 (gemm_sweep --default-only; PARITY=0
#    skips it).
# 3. host_path with real launches and --begin-kernel: host us per call of every variant, and of
#    bulk_sync, fused_sequential and wg_specialized again with the begin kernel, methods interleaved
#    in 7 rounds, M = 1, 16, 128, N = 4096, K = 8192, bf16.
# 4. host_overhead at world 1 with --begin-kernel (eager and graph-replay us), M = HOST_M (default
#    1,128), if it fits in BUDGET_S (default 560 s).
# Files: $R/tests/, $R/gemm_parity_default_bf16.csv, $R/host_path_real.csv, $R/host_overhead_ws1.csv, logs.
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
( OUT=$R/tests LIMIT_S=${TESTS_S:-260} PER_TEST=150 PYTEST_ADDOPTS='-m "not slow"' \
    GROUPS_SPEC=${TEST_GROUPS:-"tests/test_gemm_core.py;tests/test_protocol.py tests/test_launcher.py;tests/test_graphs.py;\
tests/test_gemm_all_reduce.py;tests/test_gemm_all_scatter.py tests/test_runtime.py;tests/test_all_gather_gemm.py;\
tests/test_gemm_reduce_scatter.py tests/test_hardening.py"} \
    bash "$(dirname "$0")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
stamp tests $? >> "$R/tests.log"
END=$(( T0 + ${BUDGET_S:-560} ))
[[ ${PARITY:-1} == 1 ]] && step parity_default 85 "$PY" -m benchmarks gemm_sweep --grid parity --default-only --dtypes bf16 --budget-s 70 \
    --csv "$R/gemm_parity_default_bf16.csv"
step host_path 100 "$PY" -m benchmarks host_path --real-launches --begin-kernel --M 1,16,128 --N 4096 --K 8192 \
    --calls 100 --rounds 7 --csv "$R/host_path_real.csv"
step host_overhead 120 "$PY" -m benchmarks host_overhead --world 1 --M "${HOST_M:-1,128}" \
    --begin-kernel --calls 200 --replays 200 --csv "$R/host_overhead_ws1.csv"
pack
tail -n 30 "$R/tests.log"
grep -E "ratio_median|^== " "$R/parity_default.log" 2>/dev/null
grep -E " (plain|bulk_sync|fused_sequential|wg_specialized)" "$R/host_path.log" | cut -c1-110 | head -70
grep -E "ERROR" "$R/host_overhead.log" | cut -c1-140 | head -20
