#!/usr/bin/env bash
# Session 3, call 1, on one H200 (nvidia-h200; predictions in docs/PERF.md, "Session 3"):
# 1. the nn tests that hung on GPU ranks, with each rank's stacks printed before the harness timeout;
# 2. all_gather_gemm's tuner at W = 1 on the three shapes whose entries were removed (full heap);
# 3. auto vs plain at W = 1 with every call timed alone after a sync (the W > 1 method), host time logged;
# 4. the world-1 suite for gemm_all_scatter and all_gather_gemm on every shape set, plots.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/s3_call1.sh
. "$(dirname "$0")/prelude.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$R/gpu.txt" 2>&1
TILEFUSE_TEST_DEVICE=cuda TILEFUSE_TEST_TIMEOUT=50 TILEFUSE_TEST_VERBOSE=1 timeout -k 10 130 python3 -m pytest -s -q \
    -p no:cacheprovider --timeout 120 tests/test_nn.py -k "init_is_sharded or plan_with_globs or bad_inputs or needs_torch" \
    > "$R/tests_nn.log" 2>&1
stamp "nn tests" $? | tee -a "$R/tests_nn.log"
timeout -k 10 70 python3 -m tilefuse.tune --op all_gather_gemm --shapes "" --shape 8192x4608x36864 \
    --shape 8192x8192x28672 --shape 8192x8192x30720 --quick --out tilefuse/configs > "$R/tune.log" 2>&1
stamp "tune ws1 all_gather_gemm" $? | tee -a "$R/tune.log"
cp -r tilefuse/configs "$R/configs"
timeout -k 10 100 python3 -m benchmarks.suite --world 1 --sets llama3-8b --sync-each \
    --variants fused_sequential,auto,plain_again --csv "$R/suite_w1_sync.csv" --no-progress > "$R/suite_w1_sync.log" 2>&1
stamp "suite w1 sync-each" $? | tee -a "$R/suite_w1_sync.log"
V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto,plain_again
timeout -k 10 220 python3 -m benchmarks.suite --world 1 --ops gemm_all_scatter,all_gather_gemm \
    --sets iris,llama3-8b,llama3-70b,decode --variants "$V" --csv "$R/suite_w1.csv" --no-progress \
    > "$R/suite_w1.log" 2>&1
stamp "suite w1 gas+agg" $? | tee -a "$R/suite_w1.log"
tar czf "$OUT/run.tar.gz" -C "$R" .
grep -E "passed|failed|error|Timeout|^==" "$R/tests_nn.log" | tail -n 8
grep -E "^==|plain|warn" "$R/tune.log" | cut -c1-160 | tail -n 6
python3 -m benchmarks.summary "$R" 2>&1 | tail -n 60
