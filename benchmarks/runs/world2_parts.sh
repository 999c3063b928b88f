#!/usr/bin/env bash
# Two H200s: the GEMM core's parity grid on GPU 0 next to the world-1 held-out auto run on GPU 1
# (each alone on its GPU), then at one process per GPU: gemm_reduce_scatter / gemm_all_reduce taken
# apart (benchmarks/breakdown.py), the device-API bandwidth against NCCL's all-gather and torch's
# peer copies, and the world-2 held-out auto run. About nine minutes; all in $OUT/run.tar.gz.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world2_parts.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
HERE=$(dirname "$0")
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
( CUDA_VISIBLE_DEVICES=0 bash "$HERE/gemm_parity.sh" > "$R/part_gemm_parity.log" 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 WORLD=1 N=6 BUDGET_S=100 bash "$HERE/heldout.sh" > "$R/part_heldout_w1.log" 2>&1 ) &
wait
bash "$HERE/grs_breakdown.sh" > "$R/part_breakdown.log" 2>&1
stamp breakdown $? >> "$R/part_breakdown.log"
timeout -k 5 75 torchrun --nproc-per-node 2 -m benchmarks bandwidth --sizes default \
    --csv "$R/bandwidth_w2.csv" > "$R/bandwidth_w2.log" 2>&1
stamp bandwidth $? >> "$R/bandwidth_w2.log"
WORLD=2 N=6 BUDGET_S=100 bash "$HERE/heldout.sh" > "$R/part_heldout_w2.log" 2>&1
pack
for f in "$R"/part_*.log "$R/bandwidth_w2.log"; do echo "## $f"; grep -v "Warning\|warn(" "$f" | tail -n 14 | cut -c1-200; done
