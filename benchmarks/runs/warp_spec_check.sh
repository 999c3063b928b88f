#!/usr/bin/env bash
# One GPU, world 1: the variants that honour Config.WARP_SPEC (bulk_sync, fused_sequential) on the
# warp-specialized 128x256 tile (`<variant>.ws` in the suite: their calls begun by the begin kernel, so
# that Triton specializes the tile loop) against their default tiles, the epilogue-sum forms and the
# plain_again control; then the tests that cover them, ranks sharing the GPU.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/warp_spec_check.sh      (from the repository root)
# 1. The world-1 suite, op by op, on each op's 8192-row shapes of docs/RESULTS.md's world-1 tables
#    (gemm_all_scatter and all_gather_gemm 8192x6144x4096 and 8192x28672x4096, gemm_reduce_scatter and
#    gemm_all_reduce 8192x4096x4096 and 8192x4096x14336), ROUNDS times (default 2), SUITE_S seconds an
#    op (default 45).
# 2. The tests of TESTS (default: the sm_90 compile check, the wide-tile bits, the ops' files) in the
#    rest of LIMIT_S (default 570 s).
# Files under $R: suite_w1.csv, tests/.
source "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${LIMIT_S:-570} ))
for round in $(seq 1 "${ROUNDS:-2}"); do
    for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter gemm_all_reduce; do
        V=bulk_sync,bulk_sync.ws,fused_sequential,fused_sequential.ws,plain_again
        S=8192x6144x4096,8192x28672x4096
        [[ $op == all_gather_gemm ]] && V=bulk_sync,bulk_sync.ws,fused_sequential,plain_again
        [[ $op == gemm_reduce_scatter || $op == gemm_all_reduce ]] && { S=8192x4096x4096,8192x4096x14336; }
        [[ $op == gemm_all_reduce ]] && V=bulk_sync,bulk_sync.ws,fused_sequential,plain_again
        step "suite_${op}_$round" "${SUITE_S:-45}" "$PY" -m benchmarks world1 --ops "$op" --shapes "$S" --variants "$V" \
            --csv "$R/suite_w1.csv" --append --no-progress
    done
done
tests_in_rest "${TESTS:-tests/test_warp_spec_compile.py tests/test_gemm_core.py::test_ops_wide_tile_bits_with_warp_specialization;tests/test_gemm_reduce_scatter.py;tests/test_gemm_all_scatter.py;tests/test_gemm_all_reduce.py}"
pack
grep -h "^==\|Error\|FAIL" "$R"/*.log | cut -c1-200
tail -5 "$R/tests/tests_summary.txt" 2>/dev/null
"$PY" -m benchmarks summary --markdown "$R/suite_w1.csv" 2>&1 | tail -n 40
