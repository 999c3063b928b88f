#!/usr/bin/env bash
# One GPU each, side by side on a two-GPU machine (or one after the other on one GPU): the GEMM
# core's parity grid (benchmarks/runs/gemm_parity.sh) and the host cost per call of plain, every
# variant and auto at world 1 (benchmarks/host_overhead.py, eager). About three minutes.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world1_core_and_host.sh
source "$(dirname "$0")/prelude.sh"
HERE=$(dirname "$0")
host_cost() {
    timeout -k 5 "${HOST_S:-150}" "$PY" -m benchmarks host_overhead --world 1 --M 1,16,128,1024 --no-graphs \
        --calls 100 --csv "$R/host_overhead_ws1.csv" > "$R/host_overhead.log" 2>&1
    stamp host_overhead $? >> "$R/host_overhead.log"
}
if (( $(gpus) >= 2 )); then
    ( CUDA_VISIBLE_DEVICES=0 bash "$HERE/gemm_parity.sh" > "$R/part_gemm_parity.log" 2>&1 ) &
    ( export CUDA_VISIBLE_DEVICES=1; host_cost ) &
    wait
else
    host_cost
    bash "$HERE/gemm_parity.sh" > "$R/part_gemm_parity.log" 2>&1
fi
pack
grep -v "Warning\|warn(" "$R/host_overhead.log" | tail -n 45 | cut -c1-200
grep -h "ratio_median" -A3 "$R/gemm_parity_default.log"
