#!/usr/bin/env bash
# One GPU: the op variants' 16-row decode tiles loaded through pointers (gemm.operand_path) against the
# same tiles through tensor descriptors (TILEFUSE_NO_POINTER_DECODE=1, the path before), A/B in the
# world-1 suite at M = 1 and 16 on Llama-3-8B layer shapes, op by op, the order of the two modes
# alternating from op to op; then the GEMM core's parity-grid shapes at M = 64-512 with the kernels
# torch.matmul launches there. First, on the GPU: the routing tests (every op, ranks sharing the GPU)
# and the GEMM core's decode-tile tests. About 9 minutes.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/variant_decode_tiles_ab.sh      (from the repository root)
# Files under $R: tests/, suite_ptr_on.csv, suite_ptr_off.csv, gemm_parity_mid_kernels.csv.
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${TOTAL_S:-570} ))
( OUT=$R/tests LIMIT_S=${TESTS_S:-150} PER_TEST=140 GROUPS_SPEC="tests/test_launcher.py::test_decode_tiles_load_through_pointers_in_every_op;\
tests/test_gemm_core.py::test_matmul_decode_tiles_load_through_pointers tests/test_gemm_core.py::test_matmul_default_split_k_config" \
    bash "$(dirname "$0")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
stamp tests $? >> "$R/tests.log"
SMI=$(clocks "$R/clocks.csv")
declare -A SHAPES=(
    [gemm_all_scatter]=1x28672x4096,16x28672x4096,16x6144x4096
    [all_gather_gemm]=1x28672x4096,16x28672x4096,16x6144x4096
    [gemm_reduce_scatter]=1x4096x14336,16x4096x14336,16x4096x4096
    [gemm_all_reduce]=1x4096x4096,1x4096x14336,16x4096x4096,16x4096x14336
)
run() {  # run MODE OP
    local flag=0
    [[ $1 == off ]] && flag=1
    fits 45 "suite $1 $2" && { TILEFUSE_NO_POINTER_DECODE=$flag timeout -k 5 45 "$PY" -m benchmarks world1 --ops "$2" \
        --shapes "${SHAPES[$2]}" --variants fused_sequential,producer_consumer,wg_specialized,plain_again \
        --csv "$R/suite_ptr_$1.csv" --append --no-progress >> "$R/suite_ptr.log" 2>&1
        stamp "suite $1 $2" $? >> "$R/suite_ptr.log"; }
}
run off gemm_all_reduce; run on gemm_all_reduce
run on gemm_reduce_scatter; run off gemm_reduce_scatter
run off gemm_all_scatter; run on gemm_all_scatter
run on all_gather_gemm; run off all_gather_gemm
step parity_mid 90 "$PY" -m benchmarks gemm_sweep --grid parity --default-only --torch-kernels --dtypes bf16 \
    --ms 64,333,512 --budget-s 75 --csv "$R/gemm_parity_mid_kernels.csv"
[[ -n $SMI ]] && kill "$SMI"
pack
tail -n 12 "$R/tests.log"
grep -h "^==\|rror" "$R"/suite_ptr.log | cut -c1-200
grep -h "x.*default\|budget" "$R/parity_mid.log" | cut -c1-200
