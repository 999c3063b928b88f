#!/usr/bin/env bash
# The tuner at world 1 for the three ops on every shape set, written into the checkout's tables
# (tilefuse/configs/<op>/<arch>_ws1.json) and copied to $R/configs. About 6 min on an H200 with --quick.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/tune_world1.sh
# Knobs: OPS (default the three), SETS (default llama3-8b,llama3-70b,iris,decode), TUNE_S (cap per op, s).
. "$(dirname "$0")/prelude.sh"
for op in ${OPS:-gemm_all_scatter all_gather_gemm gemm_reduce_scatter}; do
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout -k 10 "${TUNE_S:-120}" "$PY" -m tilefuse.tune --op "$op" \
        --shapes "${SETS:-llama3-8b,llama3-70b,iris,decode}" --quick --out tilefuse/configs >> "$R/tune_w1.log" 2>&1
    stamp "tune w1 $op" $? | tee -a "$R/tune_w1.log"
done
cp -r tilefuse/configs "$R/configs"
timeout 60 "$PY" -m benchmarks plots --table tilefuse/configs/*/*_ws1.json --out "$R/plots" > "$R/plots.log" 2>&1
pack
grep -E "^==|plain|warn|Error" "$R/tune_w1.log" | cut -c1-160 | tail -n 40
