#!/usr/bin/env bash
# One GPU, world 1: where the fusion tax and the GEMM core stand, and the sweeps the next defaults
# are chosen from. In order, each step only if it fits in BUDGET_S (default 560 s):
# 1. the GPU-only protocol tests of asynchronous error reports, ranks sharing the GPU;
# 2. the GEMM core's parity grid with its default configs (bf16);
# 3. the shapes with few tiles (N = 1000 and 5000 at M = 128-1024): split-K and narrower tiles,
#    then warp-specialized tiles;
# 4. the variants' tiles without split-K at M = 333 and 512 (N = 4096, 5000);
# 5. the world-1 suite, op by op: the Llama-3-8B and decode sets (gemm_all_reduce: decode and two
#    prefill shapes), every variant, auto and the plain_again control (SUITE_SETS, GAR_PREFILL=0: fewer).
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world1_fusion_tax.sh
# Files under $R: tests/, gemm_parity_default_bf16.csv, gemm_few_tiles{,_ws}_bf16.csv,
# gemm_no_split_mid_bf16.csv, suite_w1.csv, clocks.csv.
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${BUDGET_S:-560} ))
SMI=$(clocks "$R/clocks.csv")
( OUT=$R/tests LIMIT_S=${TESTS_S:-80} PER_TEST=70 GROUPS_SPEC="tests/test_protocol.py" \
    PYTEST_ARGS="-k async_error" bash "$(dirname "$0")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
stamp tests $? >> "$R/tests.log"
step parity_default 80 "$PY" -m benchmarks gemm_sweep --grid parity --default-only --dtypes bf16 --budget-s 65 \
    --csv "$R/gemm_parity_default_bf16.csv"
FEW=(--grid parity --ms 128,333,512,1000,1024 --ns 1000,5000 --dtypes bf16 --rep-ms 30)
step few_tiles 100 "$PY" -m benchmarks gemm_sweep "${FEW[@]}" --budget-s 85 --csv "$R/gemm_few_tiles_bf16.csv"
step few_tiles_ws 75 "$PY" -m benchmarks gemm_sweep "${FEW[@]}" --warp-spec --budget-s 60 \
    --csv "$R/gemm_few_tiles_ws_bf16.csv"
step no_split_mid 70 "$PY" -m benchmarks gemm_sweep --grid parity --no-split --ms 333,512 --ns 4096,5000 \
    --dtypes bf16 --rep-ms 30 --budget-s 60 --csv "$R/gemm_no_split_mid_bf16.csv"
V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto,plain_again
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter; do
    step "suite_$op" 55 "$PY" -m benchmarks world1 --ops "$op" --sets "${SUITE_SETS:-llama3-8b,decode}" --variants "$V" \
        --csv "$R/suite_w1.csv" --append --no-progress
done
step suite_gar_decode 45 "$PY" -m benchmarks world1 --ops gemm_all_reduce --sets decode --variants "$V" \
    --csv "$R/suite_w1.csv" --append --no-progress
(( ${GAR_PREFILL:-1} )) && step suite_gar_prefill 40 "$PY" -m benchmarks world1 --ops gemm_all_reduce --shapes 8192x4096x4096,8192x4096x14336 \
    --variants "$V" --csv "$R/suite_w1.csv" --append --no-progress
[[ -n $SMI ]] && kill "$SMI"
pack
tail -n 6 "$R/tests.log"
for f in "$R"/*.log; do echo "--- $f"; grep -E "^== |default .*x|best|ratio_median|vs_plain|^\| " "$f" | tail -n 40; done
