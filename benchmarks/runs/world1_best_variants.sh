#!/usr/bin/env bash
# One GPU, world 1: the fusion tax of every op on its two 8192-row Llama-3-8B shapes, in one run of
# one commit (the figures the README's world-1 row cites): every variant, gemm_reduce_scatter's and
# gemm_all_reduce's epilogue-sum form, and the plain_again control, interleaved calls; gemm_all_scatter
# through its default call (its result off the heap, --no-heap-out). SUITE_S seconds an op (default 60).
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world1_best_variants.sh      (from the repository root)
# Files under $R: suite_w1.csv, clocks.csv.
source "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${LIMIT_S:-300} ))
SMI=$(clocks "$R/clocks.csv")
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter gemm_all_reduce; do
    V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,plain_again
    S=8192x6144x4096,8192x28672x4096
    extra=()
    [[ $op == gemm_all_scatter ]] && extra=(--no-heap-out)
    [[ $op == gemm_reduce_scatter || $op == gemm_all_reduce ]] && { S=8192x4096x4096,8192x4096x14336; }
    step "suite_$op" "${SUITE_S:-60}" "$PY" -m benchmarks world1 --ops "$op" --shapes "$S" --variants "$V" \
        "${extra[@]}" --csv "$R/suite_w1.csv" --append --no-progress
done
[[ -n $SMI ]] && kill "$SMI"
pack
grep -h "^==" "$R"/*.log
"$PY" -m benchmarks summary --markdown "$R/suite_w1.csv" 2>&1 | tail -n 40
