#!/usr/bin/env bash
# Two H200s, under ten minutes: the multi-rank tests (not the slow set) on the GPUs next to the
# soak at one process per GPU (neither is timed), then timed one at a time: the host cost per call
# at world 1 on GPU 0, the device-API bandwidth against NCCL, the world-2 suite of the four ops on
# the Llama-3-8B and Iris sets, and the world-2 held-out auto run. A step that would not fit in the
# time left is skipped and says so. Everything lands in $OUT/run.tar.gz.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world2_check_and_measure.sh   (from the repository root)
source "$(dirname "$0")/prelude.sh"
HERE=$(dirname "$0")
END=$(( T0 + ${TOTAL_S:-570} ))
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
tests_beside_soak 140 110
fits 45 host_overhead && { CUDA_VISIBLE_DEVICES=0 timeout -k 5 45 "$PY" -m benchmarks host_overhead --world 1 \
    --M 1,16,128,1024 --csv "$R/host_overhead_ws1.csv" > "$R/host_overhead.log" 2>&1; stamp host_overhead $? >> "$R/host_overhead.log"; }
fits 60 bandwidth && { timeout -k 5 60 torchrun --nproc-per-node 2 -m benchmarks bandwidth --sizes default \
    --csv "$R/bandwidth_w2.csv" > "$R/bandwidth_w2.log" 2>&1; stamp bandwidth $? >> "$R/bandwidth_w2.log"; }
SMI=$(clocks "$R/clocks.csv")
suite_w2 llama3-8b,iris "$R/suite_w2.csv"
[[ -n $SMI ]] && kill "$SMI"
fits 95 heldout && WORLD=2 N=4 BUDGET_S=50 timeout -k 5 95 bash "$HERE/heldout.sh" > "$R/part_heldout_w2.log" 2>&1
pack
cat "$R/tests/tests_summary.txt" 2>/dev/null | tail -n 25
grep -h "^==\|^soak" "$R"/*.log | cut -c1-200
"$PY" -m benchmarks summary "$R" 2>&1 | tail -n 60
