#!/usr/bin/env bash
# Session 3, call 6, on one H200: auto's host cost per call on the GPU host (benchmarks.dispatch_cost), and the
# GPU tests of the files changed since call 3 (ranks share the GPU).
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/s3_call6.sh
. "$(dirname "$0")/prelude.sh"
timeout -k 5 40 python3 -m benchmarks.dispatch_cost > "$R/dispatch_cost.log" 2>&1
stamp "dispatch_cost" $? | tee -a "$R/dispatch_cost.log"
OUT=$R LIMIT_S=180 PER_TEST=170 GROUPS_SPEC="tests/test_tuning.py tests/test_benchmarks.py;\
tests/test_gemm_all_scatter.py;tests/test_all_gather_gemm.py;tests/test_gemm_core.py" \
    bash benchmarks/gpu_tests.sh > "$R/tests_stdout.txt" 2>&1
stamp "gpu tests" $? | tee -a "$R/tests_stdout.txt"
tar czf "$OUT/run.tar.gz" -C "$R" .
grep -v "^\[W" "$R/dispatch_cost.log"
cat "$R/tests_summary.txt"
