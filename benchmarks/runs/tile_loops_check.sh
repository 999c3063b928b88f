#!/usr/bin/env bash
# One GPU: the GEMM core's flattened tile loop (where a program has more than one tile) tested, and the
# fusion tax of the variants that run it (bulk_sync) next to fused_sequential.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/tile_loops_check.sh      (from the repository root)
# 1. The GEMM core's tests, and op, launcher and graph tests, ranks sharing the GPU (TESTS_S per
#    group, default 200 s).
# 2. The world-1 suite on the 8192-row shapes (Llama-3-8B set; gemm_all_reduce: 8192x4096x4096 and
#    8192x4096x14336): bulk_sync (the GEMM core) and fused_sequential against plain, with the
#    plain_again control, each op only if it fits in BUDGET_S (default 560 s).
# Files under $R: tests/, suite_w1.csv.
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${BUDGET_S:-560} ))
( OUT=$R/tests LIMIT_S=${TESTS_S:-200} PER_TEST=150 PYTEST_ADDOPTS='-m "not slow"' \
    GROUPS_SPEC="tests/test_gemm_core.py;tests/test_gemm_all_scatter.py;tests/test_gemm_all_reduce.py;\
tests/test_launcher.py tests/test_graphs.py;tests/test_gemm_reduce_scatter.py" \
    bash "$(dirname "$0")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
stamp tests $? >> "$R/tests.log"
V=bulk_sync,fused_sequential,plain_again
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter; do
    step "suite_$op" 60 "$PY" -m benchmarks world1 --ops "$op" --sets llama3-8b --variants "$V" \
        --csv "$R/suite_w1.csv" --append --no-progress
done
step suite_gar 45 "$PY" -m benchmarks world1 --ops gemm_all_reduce --shapes 8192x4096x4096,8192x4096x14336 \
    --variants "$V" --csv "$R/suite_w1.csv" --append --no-progress
pack
tail -n 14 "$R/tests/tests_summary.txt"
grep -h "^==" "$R"/*.log | cut -c1-200
"$PY" -m benchmarks summary "$R" 2>&1 | tail -n 30
