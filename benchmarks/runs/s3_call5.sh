#!/usr/bin/env bash
# Session 3, call 5, on one H200 (predictions in docs/PERF.md, "Session 3", call 5): the methods' calls are
# now interleaved one by one (benchmarks.common.bench_interleaved) after 1.5 s of settling.
# 1. the world-1 suite, every op, set and variant, auto and the plain_again control; 2. the Llama-3-8B MLP at
# world 1 (plain module, tilefuse layers, plain TP layers).
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/s3_call5.sh
. "$(dirname "$0")/prelude.sh"
V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto,plain_again
timeout -k 10 330 python3 -m benchmarks.suite --world 1 --ops all --sets iris,llama3-8b,llama3-70b,decode \
    --variants "$V" --csv "$R/suite_w1.csv" --no-progress > "$R/suite_w1.log" 2>&1
stamp "suite w1" $? | tee -a "$R/suite_w1.log"
timeout -k 10 80 python3 -m benchmarks.tp_mlp --size 8b --world 1 --csv "$R/tp_mlp.csv" > "$R/tp_mlp.log" 2>&1
stamp "tp_mlp w1" $? | tee -a "$R/tp_mlp.log"
tar czf "$OUT/run.tar.gz" -C "$R" .
tail -n 4 "$R/tp_mlp.log"
python3 -m benchmarks.summary "$R" 2>&1 | tail -n 45
