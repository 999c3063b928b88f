#!/usr/bin/env bash
# One GPU: the one-kernel calls that begin beside their K loops (gemm_all_reduce's one-shot
# fused_sequential and wg_specialized, gemm_all_scatter's fused_sequential), against the same calls
# begun before them (TILEFUSE_BEGIN_BEFORE_GEMM=1), world 1 at decode sizes, in CUDA graphs and
# eagerly; then the tests that cover the change, ranks sharing the GPU. About nine minutes.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/begin_aside_check.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${LIMIT_S:-570} ))
METHODS=fused_sequential,fused_sequential+begin_before_gemm,wg_specialized,wg_specialized+begin_before_gemm,plain,gemm
for NK in ${SHAPES:-4096x8192 4096x4096}; do
    step "allreduce_decode_w1_$NK" 120 "$PY" -m benchmarks.allreduce_decode --world 1 --M 1,16,64,256 \
        --N "${NK%x*}" --K "${NK#*x}" --methods "$METHODS" \
        --rounds 7 --calls 100 --csv "$R/allreduce_decode_w1_$NK.csv"
done
step host_overhead_w1 150 "$PY" -m benchmarks host_overhead --world 1 --ops gemm_all_scatter,gemm_all_reduce \
    --M 1,16,128 --begin-before-gemm --calls 200 --replays 200 --csv "$R/host_overhead_w1.csv"
tests_in_rest "tests/test_protocol.py;tests/test_gemm_all_reduce.py;tests/test_gemm_all_scatter.py tests/test_graphs.py;tests/test_styles.py"
pack
grep -h "^==\|Error\|FAIL" "$R"/*.log | cut -c1-200
tail -5 "$R/tests/tests_summary.txt" 2>/dev/null
