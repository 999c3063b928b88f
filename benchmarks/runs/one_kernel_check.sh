#!/usr/bin/env bash
# One GPU: calls made of one kernel that begins them (no begin kernel), tested and measured.
#   bash benchmarks/runs/one_kernel_check.sh     (from the repository root; OUT selects the output folder)
# 1. The protocol, launch-plan, graph and op test files on the GPU, ranks sharing it, in parallel groups
#    (TEST_GROUPS: ';'-separated groups instead).
# 2. host_path with real launches and --begin-kernel: host us per call, methods interleaved in 7
#    rounds (steadier than host_overhead's medians), M = 1, 16, 128.
# 3. host_profile of gemm_all_reduce wg_specialized at M = 16 (where a replayed call's host time goes).
# 4. host_overhead at world 1 with --begin-kernel: eager host us and graph-replay us of every op x
#    variant, and fused_sequential / wg_specialized again with the begin kernel (TILEFUSE_BEGIN_KERNEL=1)
#    in the same run, M = 1, 16, 128, 1024 (HOST_M), N = 4096, K = 8192, bf16.
# About 9 minutes with a cold Triton cache. Files: $R/tests/, $R/host_path_real.csv, $R/host_overhead_ws1.csv, logs.
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
( OUT=$R/tests LIMIT_S=${TESTS_S:-270} PER_TEST=150 PYTEST_ADDOPTS='-m "not slow"' \
    GROUPS_SPEC=${TEST_GROUPS:-"tests/test_gemm_core.py;tests/test_protocol.py tests/test_launcher.py;tests/test_graphs.py;\
tests/test_gemm_all_reduce.py;tests/test_gemm_all_scatter.py tests/test_runtime.py;tests/test_all_gather_gemm.py;\
tests/test_gemm_reduce_scatter.py tests/test_hardening.py;tests/test_compile.py tests/test_autograd.py;\
tests/test_nn.py tests/test_styles.py tests/test_workspaces.py"} \
    bash "$(dirname "$0")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
stamp tests $? >> "$R/tests.log"
END=$(( T0 + ${BUDGET_S:-540} ))
step host_path 90 "$PY" -m benchmarks host_path --real-launches --begin-kernel --M 1,16,128 --N 4096 --K 8192 \
    --calls 100 --rounds 7 --csv "$R/host_path_real.csv"
step host_profile 40 "$PY" -m benchmarks.host_profile --op gemm_all_reduce --variant wg_specialized --M 16 \
    --N 4096 --K 8192
step host_overhead 230 "$PY" -m benchmarks host_overhead --world 1 --M "${HOST_M:-1,16,128,1024}" \
    --begin-kernel --calls 200 --replays 200 --csv "$R/host_overhead_ws1.csv"
pack
tail -n 30 "$R/tests.log"
grep -E " (plain|wg_specialized|fused_sequential)" "$R/host_path.log" | cut -c1-110 | head -60
grep -E "ERROR" "$R/host_overhead.log" | cut -c1-140 | head -20
