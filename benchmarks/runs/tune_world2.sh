#!/usr/bin/env bash
# The tuner at world 2 (torchrun, one rank per GPU) for the four ops, written into the checkout's
# tables (tilefuse/configs/<op>/<arch>_ws2.json) and copied to $R/configs, then plots. For nvidia-h200-x2.
# Each op's run starts no shape past BUDGET_S seconds (--budget-s, counted from the tuner's start, the
# ranks agreeing): its table gets the shapes done and the log names those left out. TUNE_S is the
# hard stop around each op (start-up, imports and the last shape's overrun fit in its slack). With
# the defaults the four ops and the plots end within about 4 x 75 + 30 = 330 s.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/tune_world2.sh
# Knobs: WORLD (default 2), OPS (default the four), SETS (default llama3-8b,iris), BUDGET_S (per op,
# default 50), TUNE_S (hard stop per op, default 75).
. "$(dirname "$0")/prelude.sh"
W=${WORLD:-2}
if (( $(gpus) < W )); then echo "world $W needs $W GPUs (have $(gpus))" >&2; exit 2; fi
for op in ${OPS:-gemm_all_scatter all_gather_gemm gemm_reduce_scatter gemm_all_reduce}; do
    timeout -k 10 "${TUNE_S:-75}" torchrun --nproc-per-node "$W" -m tilefuse.tune --op "$op" \
        --shapes "${SETS:-llama3-8b,iris}" --quick --budget-s "${BUDGET_S:-50}" --out tilefuse/configs ${TILEFUSE_COMMIT:+--commit "$TILEFUSE_COMMIT"} \
        >> "$R/tune_w$W.log" 2>&1
    stamp "tune w$W $op" $? | tee -a "$R/tune_w$W.log"
done
cp -r tilefuse/configs "$R/configs"
timeout 30 "$PY" -m benchmarks plots --table tilefuse/configs/*/*_ws"$W".json --out "$R/plots" > "$R/plots.log" 2>&1
pack
grep -E "^==|plain|budget|warn|Error" "$R/tune_w$W.log" | cut -c1-200 | tail -n 48
