#!/usr/bin/env bash
# The world-1 suite on one GPU: every op, shape set and variant, auto and the plain_again control,
# with the GPU's clocks sampled; then the Llama-3-8B TP MLP at world 1 and the plots. About 5 min on
# an H200 (docs/RESULTS.md, "One H200, world 1").
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world1_suite.sh
# Knobs: OPS (default all), SETS (default iris,llama3-8b,llama3-70b,decode), VARIANTS, SUITE_S (cap, s).
. "$(dirname "$0")/prelude.sh"
V=${VARIANTS:-bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto,plain_again}
SMI=$(clocks "$R/clocks.csv")
CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout -k 10 "${SUITE_S:-330}" "$PY" -m benchmarks world1 \
    --ops "${OPS:-all}" --sets "${SETS:-iris,llama3-8b,llama3-70b,decode}" --variants "$V" \
    --csv "$R/suite_w1.csv" --no-progress > "$R/suite_w1.log" 2>&1
stamp "suite w1" $? | tee -a "$R/suite_w1.log"
timeout -k 10 80 "$PY" -m benchmarks tp --size 8b --world 1 --csv "$R/tp_mlp_w1.csv" > "$R/tp_mlp.log" 2>&1
stamp "tp_mlp w1" $? | tee -a "$R/tp_mlp.log"
[[ -n $SMI ]] && kill "$SMI"
timeout 60 "$PY" -m benchmarks plots "$R/suite_w1.csv" --out "$R/plots" > "$R/plots.log" 2>&1
pack
tail -n 4 "$R/tp_mlp.log"
"$PY" -m benchmarks summary "$R" 2>&1 | tail -n 50
