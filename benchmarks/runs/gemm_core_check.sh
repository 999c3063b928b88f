#!/usr/bin/env bash
# The GEMM core's default configs on one GPU, and the tests that run them: the GEMM-core and op test
# files on the GPU (in parallel, before anything is timed; the GEMM core's single-process tests and its
# multi-rank op tests in two groups), then the parity grid with the configs
# default_config(..., split_k=True) picks (bf16, fp16). About 7 minutes on an H200 (TESTS_S: the
# tests' limit per group, default 300 s).
#   bash benchmarks/runs/gemm_core_check.sh      (from the repository root; OUT selects the output folder)
# Files: $R/tests/ (logs, summary), $R/gemm_parity_default.csv, $R/parity_default.log.
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
( OUT=$R/tests LIMIT_S=${TESTS_S:-300} PER_TEST=200 PYTEST_ADDOPTS='-m "not slow"' \
    GROUPS_SPEC="tests/test_gemm_core.py --deselect tests/test_gemm_core.py::test_ops_;\
tests/test_gemm_core.py -k test_ops_;tests/test_gemm_all_scatter.py;tests/test_all_gather_gemm.py;\
tests/test_gemm_reduce_scatter.py;tests/test_gemm_all_reduce.py" \
    bash "$(dirname "$0")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
stamp tests $? >> "$R/tests.log"
END=$(( T0 + ${BUDGET_S:-400} ))
SMI=$(clocks "$R/clocks.csv")
step parity_default 130 "$PY" -m benchmarks gemm_sweep --grid parity --default-only --dtypes bf16,fp16 \
    --budget-s 120 --csv "$R/gemm_parity_default.csv"
[[ -n $SMI ]] && kill "$SMI"
pack
tail -n 14 "$R/tests.log"
tail -n 8 "$R/parity_default.log"
