#!/usr/bin/env bash
# The world-2 suite on two GPUs (one rank per GPU, NCCL): each op in its own process, appending to
# one CSV, with the GPUs' clocks sampled; then the Llama-3-8B TP MLP at world 2 and the plots
# (docs/RESULTS.md, "Two H200s over NVLink, world 2"). For nvidia-h200-x2; about 5 min.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world2_suite.sh
# Knobs: WORLD (default 2), SETS (default llama3-8b,iris), VARIANTS, SUITE_S (cap per op, s).
. "$(dirname "$0")/prelude.sh"
W=${WORLD:-2}
if (( $(gpus) < W )); then echo "world $W needs $W GPUs (have $(gpus)): ranks sharing a GPU prove nothing about speed" >&2; exit 2; fi
V=${VARIANTS:-bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto,plain_again}
SMI=$(clocks "$R/clocks.csv")
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter; do
    timeout -k 10 "${SUITE_S:-80}" "$PY" -m benchmarks suite --world "$W" --ops "$op" \
        --sets "${SETS:-llama3-8b,iris}" --variants "$V" --csv "$R/suite_w$W.csv" --append --no-progress \
        >> "$R/suite_w$W.log" 2>&1
    stamp "suite w$W $op" $? | tee -a "$R/suite_w$W.log"
done
timeout -k 10 80 "$PY" -m benchmarks tp --size 8b --world "$W" --csv "$R/tp_mlp_w$W.csv" > "$R/tp_mlp.log" 2>&1
stamp "tp_mlp w$W" $? | tee -a "$R/tp_mlp.log"
[[ -n $SMI ]] && kill "$SMI"
timeout 60 "$PY" -m benchmarks plots "$R/suite_w$W.csv" --out "$R/plots" > "$R/plots.log" 2>&1
pack
grep -E "^==|Error" "$R/suite_w$W.log" | cut -c1-160 | tail -n 12
tail -n 4 "$R/tp_mlp.log"
"$PY" -m benchmarks summary "$R" 2>&1 | tail -n 40
