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
fits() { (( $(date +%s) + $1 <= END )) || { echo "== skipped $2: $1 s do not fit" | tee -a "$R/skipped.txt"; return 1; }; }
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
( OUT=$R/tests LIMIT_S=140 PER_TEST=120 PYTEST_ADDOPTS='-m "not slow"' bash "$HERE/gpu_tests.sh" > "$R/tests.log" 2>&1 ) &
( timeout -k 10 150 "$PY" -m benchmarks soak --world 2 --calls 10000 --check-every 100 --variants all --heap-size 1G \
    --require-flat --budget-s 110 --csv "$R/soak_w2.csv" --no-progress > "$R/soak.log" 2>&1
  stamp soak $? >> "$R/soak.log" ) &
wait
fits 45 host_overhead && { CUDA_VISIBLE_DEVICES=0 timeout -k 5 45 "$PY" -m benchmarks host_overhead --world 1 \
    --M 1,16,128,1024 --csv "$R/host_overhead_ws1.csv" > "$R/host_overhead.log" 2>&1; stamp host_overhead $? >> "$R/host_overhead.log"; }
fits 60 bandwidth && { timeout -k 5 60 torchrun --nproc-per-node 2 -m benchmarks bandwidth --sizes default \
    --csv "$R/bandwidth_w2.csv" > "$R/bandwidth_w2.log" 2>&1; stamp bandwidth $? >> "$R/bandwidth_w2.log"; }
SMI=$(clocks "$R/clocks.csv")
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter gemm_all_reduce; do
    V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto
    [[ $op == all_gather_gemm ]] && V=$V,pc_copy_engines
    fits 50 "suite $op" && { timeout -k 5 50 "$PY" -m benchmarks suite --world 2 --ops "$op" --sets llama3-8b,iris \
        --variants "$V" --csv "$R/suite_w2.csv" --append --no-progress >> "$R/suite_w2.log" 2>&1
        stamp "suite w2 $op" $? >> "$R/suite_w2.log"; }
done
[[ -n $SMI ]] && kill "$SMI"
fits 95 heldout && WORLD=2 N=4 BUDGET_S=50 timeout -k 5 95 bash "$HERE/heldout.sh" > "$R/part_heldout_w2.log" 2>&1
pack
cat "$R/tests/tests_summary.txt" 2>/dev/null | tail -n 25
grep -h "^==\|^soak" "$R"/*.log | cut -c1-200
"$PY" -m benchmarks summary "$R" 2>&1 | tail -n 60
