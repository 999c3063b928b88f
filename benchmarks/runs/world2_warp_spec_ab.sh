#!/usr/bin/env bash
# Two H200s, one process per GPU, about six minutes: warp specialization on and off, A/B, in the
# world-2 suite of the ops whose fused_sequential specializes its default 128x256 tile at W = 2
# (gemm_all_scatter, gemm_reduce_scatter), bulk_sync and fused_sequential against plain, on the
# Llama-3-8B TP-2 and Iris sets. Order off, on, on, off (TILEFUSE_NO_WARP_SPEC=1 is off), 40 s a run,
# so that drift reaches both alike. CSVs: $R/suite_ws_off.csv and $R/suite_ws_on.csv (appended).
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world2_warp_spec_ab.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
END=$(( T0 + ${TOTAL_S:-420} ))
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
SMI=$(clocks "$R/clocks.csv")
run() {  # run MODE OP
    local flag=0
    [[ $1 == off ]] && flag=1
    fits 40 "suite $1 $2" && { TILEFUSE_NO_WARP_SPEC=$flag timeout -k 5 40 "$PY" -m benchmarks suite --world 2 \
        --ops "$2" --sets llama3-8b,iris --variants bulk_sync,fused_sequential --csv "$R/suite_ws_$1.csv" \
        --append --no-progress >> "$R/suite_ws.log" 2>&1; stamp "suite $1 $2" $? >> "$R/suite_ws.log"; }
}
for op in gemm_all_scatter gemm_reduce_scatter; do run off "$op"; run on "$op"; done
for op in gemm_all_scatter gemm_reduce_scatter; do run on "$op"; run off "$op"; done
[[ -n $SMI ]] && kill "$SMI"
pack
grep "^==" "$R/suite_ws.log"
