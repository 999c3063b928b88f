#!/usr/bin/env bash
# One GPU: the no-split tiles of 64 < M <= 256 (config._small_m_tiles), tested and measured.
#   bash benchmarks/runs/small_m_check.sh      (from the repository root; OUT selects the output folder)
# 1. The GEMM-core and op test files on the GPU, ranks sharing it, in parallel groups.
# 2. gemm_sweep --grid small --no-split --default-only: the default tiles against torch.matmul.
# 3. gemm_all_reduce's parts at M = 1, 16, 128, 256 (benchmarks/runs/decode_parts_w1.sh).
# About 5 minutes. Files: $R/tests/, $R/gemm_small_default_bf16.csv, $R/breakdown_w1_decode.csv.
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
( OUT=$R/tests LIMIT_S=${TESTS_S:-220} PER_TEST=150 PYTEST_ADDOPTS='-m "not slow"' \
    GROUPS_SPEC=${TEST_GROUPS:-"tests/test_gemm_core.py;tests/test_gemm_all_scatter.py;tests/test_all_gather_gemm.py;\
tests/test_gemm_reduce_scatter.py;tests/test_gemm_all_reduce.py"} \
    bash "$(dirname "$0")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
stamp tests $? >> "$R/tests.log"
END=$(( T0 + ${BUDGET_S:-330} ))
step sweep_default 60 "$PY" -m benchmarks gemm_sweep --grid small --no-split --default-only --dtypes bf16 \
    --rep-ms 30 --budget-s 50 --csv "$R/gemm_small_default_bf16.csv"
fits 60 parts && SHAPES=1x4096x8192,16x4096x8192,128x4096x8192,256x4096x8192 PARTS_S=55 OUT=$R/parts \
    bash "$(dirname "$0")/decode_parts_w1.sh" > "$R/parts.log" 2>&1
pack
tail -n 14 "$R/tests.log"
tail -n 12 "$R/sweep_default.log"
tail -n 20 "$R/parts.log"
