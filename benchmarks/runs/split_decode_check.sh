#!/usr/bin/env bash
# One GPU, world 1: gemm_all_reduce's fused_sequential on the GEMM core's split decode tiles (K split
# into slices, one a program) against the whole-K tiles it took before (fused_sequential.whole_k), at
# decode sizes in CUDA graphs and eagerly: on Linear weights (pointer loads), the same weight every
# call and 4 weights in turn (none left in L2), and at K = 8192 on a row-major b (descriptors); then
# the tests that cover it, ranks sharing the GPU. About nine minutes.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/split_decode_check.sh      (from the repository root)
#   MS=1,4,8,16 ROW_MAJOR=0 TESTS="tests/test_gemm_all_reduce.py;tests/test_launcher.py" ...
source "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${LIMIT_S:-570} ))
METHODS=fused_sequential,fused_sequential.whole_k,plain,gemm
MS=${MS:-1,16,64}
for NK in ${SHAPES:-4096x8192 4096x4096}; do
    step "allreduce_decode_w1_linear_$NK" 110 "$PY" -m benchmarks.allreduce_decode --world 1 --M "$MS" \
        --N "${NK%x*}" --K "${NK#*x}" --methods "$METHODS" --linear-weights \
        --rounds ${ROUNDS:-7} --calls 100 --csv "$R/allreduce_decode_w1_linear_$NK.csv"
    if [[ ${COLD:-1} == 1 ]]; then
        step "allreduce_decode_w1_linear_cold_$NK" 110 "$PY" -m benchmarks.allreduce_decode --world 1 --M "$MS" \
            --N "${NK%x*}" --K "${NK#*x}" --methods "$METHODS" --linear-weights --weights 4 \
            --rounds ${ROUNDS:-7} --calls 25 --csv "$R/allreduce_decode_w1_linear_cold_$NK.csv"
    fi
done
if [[ ${ROW_MAJOR:-1} == 1 ]]; then
    step allreduce_decode_w1_row_major_4096x8192 90 "$PY" -m benchmarks.allreduce_decode --world 1 --M 1,16 \
        --N 4096 --K 8192 --methods "$METHODS" --rounds 7 --calls 100 \
        --csv "$R/allreduce_decode_w1_row_major_4096x8192.csv"
fi
tests_in_rest "${TESTS:-tests/test_gemm_all_reduce.py;tests/test_protocol.py;tests/test_graphs.py}"
pack
grep -h "^==\|Error\|FAIL" "$R"/*.log | cut -c1-200
tail -5 "$R/tests/tests_summary.txt" 2>/dev/null
