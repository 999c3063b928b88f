#!/usr/bin/env bash
# One GPU, world 1: where gemm_all_reduce's one-kernel variants lose time against cuBLAS at decode and
# small-M sizes (benchmarks/breakdown.py: cuBLAS, the GEMM core with the variant's tiles, the fused
# kernel without its sum, the stores alone, the sum pass, the begin, the whole variants; device time
# behind a GPU sleep). M = 1, 16, 128 with N = 4096, K = 8192, bf16. About two minutes.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/decode_parts_w1.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
CSV=$R/breakdown_w1_decode.csv
timeout -k 5 ${PARTS_S:-170} "$PY" -m benchmarks breakdown --world 1 --ops gemm_all_reduce \
    --shapes ${SHAPES:-1x4096x8192,16x4096x8192,128x4096x8192} --variants fused_sequential,wg_specialized,bulk_sync \
    --push-programs 16 --rep-ms 10 --reps 3 --csv "$CSV" > "$R/breakdown.log" 2>&1
stamp breakdown $? >> "$R/breakdown.log"
pack
grep -h "^==\|Error\|FAIL" "$R"/breakdown.log | cut -c1-200
[[ -s $CSV ]] && "$PY" -m benchmarks breakdown --summarize "$CSV"
