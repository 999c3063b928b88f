#!/usr/bin/env bash
# Two H200s, one process per GPU: where gemm_reduce_scatter and gemm_all_reduce lose time at world 2
# (benchmarks/breakdown.py). Each op's parts (cuBLAS GEMM, NCCL collective, plain, tilefuse's GEMM core,
# the fused kernel with and without peer traffic, the stores alone from all or 16/33/66 programs, the
# reduction pass, the host path + begin kernel) and its whole variants (gemm_reduce_scatter also in the
# epilogue-sum form), calls interleaved, each timed on an idle GPU and behind a GPU sleep (device time).
# gemm_reduce_scatter on the Llama-3-8B/70B TP-2 o and down shapes and two Iris shapes, gemm_all_reduce
# on three of them. Under 120 s; the CSV and logs land in $OUT/run.tar.gz.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/grs_breakdown.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
SMI=$(clocks "$R/clocks.csv")
CSV=$R/breakdown_w2.csv
timeout -k 5 64 "$PY" -m benchmarks breakdown --world 2 --ops gemm_reduce_scatter \
    --shapes 8b-down,70b-o,iris-4096x12288,8b-o,70b-down,iris-3584x14336 --rep-ms 15 --reps 2 \
    --csv "$CSV" --append > "$R/breakdown_grs.log" 2>&1
stamp "breakdown gemm_reduce_scatter" $? >> "$R/breakdown_grs.log"
timeout -k 5 38 "$PY" -m benchmarks breakdown --world 2 --ops gemm_all_reduce \
    --shapes 8b-down,70b-o,iris-4096x12288 --variants bulk_sync,producer_consumer,fused_sequential,wg_specialized \
    --rep-ms 15 --reps 2 --csv "$CSV" --append > "$R/breakdown_gar.log" 2>&1
stamp "breakdown gemm_all_reduce" $? >> "$R/breakdown_gar.log"
[[ -n $SMI ]] && kill "$SMI"
pack
grep -h "^==\|Error\|FAIL" "$R"/breakdown_*.log | cut -c1-200
[[ -s $CSV ]] && "$PY" -m benchmarks breakdown --summarize "$CSV"
