#!/usr/bin/env bash
# One GPU, world 1: fused_sequential summing each tile in its epilogue (Config.EPILOGUE_SUM: gemm_reduce_scatter,
# gemm_all_reduce) against its staged form, bulk_sync and plain; then the tests that cover it, ranks
# sharing the GPU.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/epilogue_sum_check.sh      (from the repository root)
# 1. Registers and spills of each op's two fused_sequential forms on the 8192x4096x4096 default tiles.
# 2. The world-1 suite on 8192x4096x4096 and 8192x4096x14336 (gemm_reduce_scatter: 8b-o, 8b-down):
#    bulk_sync, fused_sequential, fs_epilogue_sum, with the plain_again control.
# 3. gemm_all_reduce's split decode at N = 1024 (more slices than at N = 4096), if it fits.
# 4. The tests of TESTS (default: gemm_reduce_scatter, gemm_all_reduce, graphs and rules) in the rest.
# Files under $R: kernel_info_<op>.log, suite_w1.csv, allreduce_decode_w1_linear_1024x4096.csv, tests/.
source "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${LIMIT_S:-570} ))
for op in ${OPS:-gemm_reduce_scatter gemm_all_reduce}; do
    step "kernel_info_$op" 90 "$PY" -m benchmarks.kernel_regs --op "$op" --shape 8192x4096x4096
    step "suite_w1_$op" 150 "$PY" -m benchmarks world1 --ops "$op" --shapes 8192x4096x4096,8192x4096x14336 \
        --variants bulk_sync,fused_sequential,fs_epilogue_sum,plain_again --csv "$R/suite_w1.csv" --append --no-progress
done
[[ ${DECODE:-1} == 1 ]] && step allreduce_decode_w1_linear_1024x4096 90 "$PY" -m benchmarks.allreduce_decode --world 1 --M 1,16 --N 1024 \
    --K 4096 --methods fused_sequential,fused_sequential.whole_k,plain,gemm --linear-weights --rounds 5 --calls 100 \
    --csv "$R/allreduce_decode_w1_linear_1024x4096.csv"
tests_in_rest "${TESTS:-tests/test_gemm_reduce_scatter.py;tests/test_gemm_all_reduce.py;tests/test_graphs.py tests/test_rules.py}"
pack
grep -h "^==\|Error\|FAIL" "$R"/*.log | cut -c1-200
tail -n 4 "$R"/kernel_info_*.log
tail -5 "$R/tests/tests_summary.txt" 2>/dev/null
"$PY" -m benchmarks summary "$R" 2>&1 | tail -n 30
