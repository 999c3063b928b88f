#!/usr/bin/env bash
# Session 3, call 4, on one H200 (predictions in docs/PERF.md, "Session 3", call 4): every timing now starts
# after 1.5 s of the shape's GEMM (steady, power-capped clocks).
# 1. auto_ab again (agg 8192x8192x28672), clocks sampled; 2. the world-1 suite, every op, set and variant,
# auto and the plain_again control; 3. the Llama-3-8B MLP at world 1 (plain module, tilefuse layers, plain TP layers).
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/s3_call4.sh
. "$(dirname "$0")/prelude.sh"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv,noheader -lms 200 > "$R/smi.csv" 2>&1 &
SMI=$!
timeout -k 10 60 python3 -m benchmarks.auto_ab --op all_gather_gemm --shape 8192x8192x28672 --rounds 8 \
    > "$R/auto_ab.log" 2>&1
stamp "auto_ab" $? | tee -a "$R/auto_ab.log"
V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto,plain_again
timeout -k 10 400 python3 -m benchmarks.suite --world 1 --ops all --sets iris,llama3-8b,llama3-70b,decode \
    --variants "$V" --csv "$R/suite_w1.csv" --no-progress > "$R/suite_w1.log" 2>&1
stamp "suite w1" $? | tee -a "$R/suite_w1.log"
timeout -k 10 90 python3 -m benchmarks.tp_mlp --size 8b --world 1 --csv "$R/tp_mlp.csv" > "$R/tp_mlp.log" 2>&1
stamp "tp_mlp w1" $? | tee -a "$R/tp_mlp.log"
kill $SMI
tar czf "$OUT/run.tar.gz" -C "$R" .
grep -E "median|auto runs|^==" "$R/auto_ab.log" | cut -c1-150
tail -n 4 "$R/tp_mlp.log"
python3 -m benchmarks.summary "$R" 2>&1 | tail -n 48
