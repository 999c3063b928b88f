#!/usr/bin/env bash
# The tuner at world 1 for the four ops on every shape set, written into the checkout's tables
# (tilefuse/configs/<op>/<arch>_ws1.json) and copied to $R/configs, then plots. For nvidia-h200.
# Each op's run starts no shape past BUDGET_S seconds (--budget-s, counted from the tuner's start):
# its table gets the shapes done and the log names those left out. TUNE_S is the hard stop around
# each op. With the defaults the four ops and the plots end within about 4 x 85 + 30 = 370 s.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/tune_world1.sh
# Knobs: OPS (default the four), SETS (default llama3-8b,llama3-70b,iris,decode), BUDGET_S (per op,
# default 65), TUNE_S (hard stop per op, default 85).
. "$(dirname "$0")/prelude.sh"
for op in ${OPS:-gemm_all_scatter all_gather_gemm gemm_reduce_scatter gemm_all_reduce}; do
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout -k 10 "${TUNE_S:-85}" "$PY" -m tilefuse.tune --op "$op" \
        --shapes "${SETS:-llama3-8b,llama3-70b,iris,decode}" --quick --budget-s "${BUDGET_S:-65}" \
        --out tilefuse/configs ${TILEFUSE_COMMIT:+--commit "$TILEFUSE_COMMIT"} >> "$R/tune_w1.log" 2>&1
    stamp "tune w1 $op" $? | tee -a "$R/tune_w1.log"
done
cp -r tilefuse/configs "$R/configs"
timeout 30 "$PY" -m benchmarks plots --table tilefuse/configs/*/*_ws1.json --out "$R/plots" > "$R/plots.log" 2>&1
pack
grep -E "^==|plain|budget|warn|Error" "$R/tune_w1.log" | cut -c1-200 | tail -n 48
