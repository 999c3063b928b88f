#!/usr/bin/env bash
# Session 3, call 2, on one H200 (predictions in docs/PERF.md, "Session 3"):
# 1. smoke: gemm_reduce_scatter's new input-dtype stage, all variants bit-identical at W = 2, 3 (ranks share the GPU);
# 2. the tuner at W = 1: gemm_reduce_scatter on every shape set (new stage), all_gather_gemm again on the two
#    shapes where call 1 chose fused_sequential by a margin inside the drift (now 4 final rounds, 3 % margin);
# 3. the world-1 suite: gemm_reduce_scatter on every set; all_gather_gemm's two shapes again;
# 4. gemm_reduce_scatter on run 2's three shapes (before/after the stage change).
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/s3_call2.sh
. "$(dirname "$0")/prelude.sh"
TILEFUSE_TEST_DEVICE=cuda TILEFUSE_TEST_TIMEOUT=100 timeout -k 10 110 python3 -m pytest -q -p no:cacheprovider \
    tests/test_gemm_reduce_scatter.py -k "bit_identical" > "$R/tests_grs_smoke.log" 2>&1
stamp "grs smoke" $? | tee -a "$R/tests_grs_smoke.log"
timeout -k 10 150 python3 -m tilefuse.tune --op gemm_reduce_scatter --shapes iris,llama3-8b,llama3-70b,decode --quick \
    --out tilefuse/configs > "$R/tune.log" 2>&1
stamp "tune ws1 gemm_reduce_scatter" $? | tee -a "$R/tune.log"
timeout -k 10 60 python3 -m tilefuse.tune --op all_gather_gemm --shapes "" --shape 8192x8192x28672 \
    --shape 8192x8192x30720 --quick --out tilefuse/configs >> "$R/tune.log" 2>&1
stamp "tune ws1 all_gather_gemm" $? | tee -a "$R/tune.log"
mkdir -p "$R/configs"
cp tilefuse/configs/all_gather_gemm/nvidia-h200_ws1.json "$R/configs/all_gather_gemm_ws1.json"
cp tilefuse/configs/gemm_reduce_scatter/nvidia-h200_ws1.json "$R/configs/gemm_reduce_scatter_ws1.json"
V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto,plain_again
timeout -k 10 150 python3 -m benchmarks.suite --world 1 --ops gemm_reduce_scatter \
    --sets iris,llama3-8b,llama3-70b,decode --variants "$V" --csv "$R/suite_w1.csv" --no-progress > "$R/suite_w1.log" 2>&1
stamp "suite w1 grs" $? | tee -a "$R/suite_w1.log"
timeout -k 10 60 python3 -m benchmarks.suite --world 1 --ops all_gather_gemm --sets iris \
    --shapes iris-8192x28672,iris-8192x30720 --variants fused_sequential,auto,plain_again --reps 4 \
    --csv "$R/suite_w1_agg2.csv" --no-progress > "$R/suite_w1_agg2.log" 2>&1
stamp "suite w1 agg two shapes" $? | tee -a "$R/suite_w1_agg2.log"
# Before/after of the stage change on run 2's three shapes (run 2: bulk_sync 0.85 / 0.67 / 0.95 of torch.matmul).
timeout -k 10 90 python3 -m benchmarks.ops_world1 --ops gemm_reduce_scatter \
    --shapes 8192x8192x3584,8192x4096x1792,8192x8192x8192 --reps 2 --csv "$R/ops_world1.csv" > "$R/ops_grs.log" 2>&1
stamp "ops grs run-2 shapes" $? | tee -a "$R/ops_grs.log"
tar czf "$OUT/run.tar.gz" -C "$R" .
tail -n 3 "$R/tests_grs_smoke.log"
grep -E "^==|ms \(plain|warn" "$R/tune.log" | cut -c1-150 | tail -n 20
python3 -m benchmarks.summary "$R" 2>&1 | tail -n 30
