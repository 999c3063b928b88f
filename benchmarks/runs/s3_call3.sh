#!/usr/bin/env bash
# Session 3, call 3, on one H200 (predictions in docs/PERF.md, "Session 3"):
# 1. auto against the function it runs, 8 alternating rounds, kernels listed (benchmarks/auto_ab.py), with the
#    GPU's clocks, power and throttle reasons sampled every 100 ms;
# 2. the GPU tests of the changed code: gemm_reduce_scatter (new stage), nn, runtime, tuning (ranks share the GPU).
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/s3_call3.sh
. "$(dirname "$0")/prelude.sh"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv,noheader -lms 100 > "$R/smi.csv" 2>&1 &
SMI=$!
for spec in all_gather_gemm:8192x8192x28672 gemm_reduce_scatter:8192x8192x28672 gemm_all_scatter:8192x8192x28672 \
            gemm_reduce_scatter:8192x4096x4096; do
    echo "## $(date +%T.%N | cut -c1-12) $spec" >> "$R/auto_ab.log"
    timeout -k 10 60 python3 -m benchmarks.auto_ab --op "${spec%%:*}" --shape "${spec##*:}" --rounds 8 --profile \
        >> "$R/auto_ab.log" 2>&1
    stamp "auto_ab $spec" $? | tee -a "$R/auto_ab.log"
done
kill $SMI
OUT=$R LIMIT_S=260 PER_TEST=200 GROUPS_SPEC="tests/test_gemm_reduce_scatter.py;tests/test_nn.py;\
tests/test_runtime.py tests/test_tuning.py" bash benchmarks/gpu_tests.sh > "$R/tests_stdout.txt" 2>&1
stamp "gpu tests" $? | tee -a "$R/tests_stdout.txt"
tar czf "$OUT/run.tar.gz" -C "$R" .
grep -v "^\s*$" "$R/auto_ab.log" | grep -v "Warning\|warn" | cut -c1-150 | head -n 70
cat "$R/tests_summary.txt"
