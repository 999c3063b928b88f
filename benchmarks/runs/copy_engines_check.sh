#!/usr/bin/env bash
# One GPU: all_gather_gemm's copy_engine form next to gemm_all_scatter's and all_gather_gemm's
# variants, and all_gather_gemm's two-launch fused_sequential, tested and measured.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/copy_engines_check.sh     (from the repository root)
# 1. Test files on the GPU, ranks sharing it (copy-engine forms eager, replayed and in CUDA graphs;
#    the protocol and launch-count tests), in parallel groups (TEST_GROUPS: ';'-separated instead).
# 2. The world-1 suite of gemm_all_scatter and all_gather_gemm on the Llama-3-8B set: the copy-engine
#    form's cost at world 1 next to the other variants (SUITE_SETS: other sets).
# 3. host_path with real launches at M = 1, 16, 128 (host us per call).
# 4. The GEMM core's parity grid in fp16, if it fits in BUDGET_S (default 565 s).
# Files under $R: tests/, suite_w1.csv, host_path_real.csv, gemm_parity_default_fp16.csv, logs.
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${BUDGET_S:-565} ))
( OUT=$R/tests LIMIT_S=${TESTS_S:-240} PER_TEST=150 PYTEST_ADDOPTS='-m "not slow"' \
    GROUPS_SPEC=${TEST_GROUPS:-"tests/test_gemm_all_scatter.py;tests/test_graphs.py -k copy_engine;\
tests/test_launcher.py tests/test_protocol.py;tests/test_all_gather_gemm.py;tests/test_rules.py tests/test_runtime.py"} \
    bash "$(dirname "$0")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
stamp tests $? >> "$R/tests.log"
for op in gemm_all_scatter all_gather_gemm; do
    step "suite_$op" 75 "$PY" -m benchmarks suite --world 1 --ops "$op" --sets "${SUITE_SETS:-llama3-8b}" \
        --variants bulk_sync,producer_consumer,copy_engine,fused_sequential --csv "$R/suite_w1.csv" --append \
        --no-progress
done
step host_path 90 "$PY" -m benchmarks host_path --real-launches --M 1,16,128 --N 4096 --K 8192 \
    --calls 100 --rounds 7 --csv "$R/host_path_real.csv"
step parity_fp16 80 "$PY" -m benchmarks gemm_sweep --grid parity --default-only --dtypes fp16 --budget-s 65 \
    --csv "$R/gemm_parity_default_fp16.csv"
pack
tail -n 25 "$R/tests.log"
grep -hE "vs_plain|pc_copy|producer_consumer|fused_sequential|bulk_sync|^== " "$R"/suite_*.log | cut -c1-130 | head -60
grep -E " (plain|bulk_sync|fused_sequential|producer_consumer)" "$R/host_path.log" | cut -c1-110 | head -50
grep -E "ratio_median|^== " "$R/parity_fp16.log"
