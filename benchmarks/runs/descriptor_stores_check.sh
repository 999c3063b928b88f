#!/usr/bin/env bash
# One GPU, world 1: the GEMM core's tiles stored through a descriptor of C, whole or in two halves of
# their columns, against its default stores (by pointers), on the warp-specialized 128x256 loop the
# defaults run from M ~ 500 and on the unspecialized whole-tile loops; then the same for fp16 on the
# larger shapes.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/descriptor_stores_check.sh      (from the repository root)
# 1. The tests of the stores (the bits against the pointer stores, the warp-specialized loop included,
#    and the sm_90 compile check), TESTS_S seconds (default 150).
# 2. `gemm_sweep --grid parity --epilogue` (on the warp-specialized defaults: the whole-tile store, and
#    one stage fewer with and without it), bf16 (SWEEP_S, default 240 s), then fp16 at M >= 512 in
#    the rest of LIMIT_S (default 560 s).
# Files under $R: tests/, sweep_bf16.csv, sweep_fp16.csv, clocks.csv.
source "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${LIMIT_S:-560} ))
( OUT=$R/tests LIMIT_S=${TESTS_S:-150} PER_TEST=140 PYTEST_ADDOPTS='-m "not slow"' \
    GROUPS_SPEC="tests/test_gemm_core.py::test_matmul_flattened_loop_and_descriptor_stores_keep_the_bits \
tests/test_gemm_core.py::test_gemm_sweep_epilogue_candidates_change_the_default;tests/test_gemm_core.py -k warp;\
tests/test_warp_spec_compile.py" bash "$(dirname "$0")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
stamp tests $? >> "$R/tests.log"
SMI=$(clocks "$R/clocks.csv")
step sweep_bf16 "$(( ${SWEEP_S:-240} + 30 ))" "$PY" -m benchmarks gemm_sweep --grid parity --epilogue --dtypes bf16 \
    --budget-s "${SWEEP_S:-240}" --csv "$R/sweep_bf16.csv"
LEFT=$(( END - $(date +%s) - 20 ))
(( LEFT > 60 )) && step sweep_fp16 "$LEFT" "$PY" -m benchmarks gemm_sweep --grid parity --epilogue --dtypes fp16 \
    --ms 512,1000,1024,4096,8192 --budget-s "$(( LEFT - 30 ))" --csv "$R/sweep_fp16.csv"
[[ -n $SMI ]] && kill "$SMI"
pack
tail -n 6 "$R/tests/tests_summary.txt" 2>/dev/null
grep -h "^==" "$R"/*.log
tail -n 12 "$R/sweep_bf16.log"
tail -n 8 "$R/sweep_fp16.log" 2>/dev/null
