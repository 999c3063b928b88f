#!/usr/bin/env bash
# The tuner at world 2 (torchrun, one rank per GPU) for the three ops, written into the checkout's
# tables (tilefuse/configs/<op>/<arch>_ws2.json) and copied to $R/configs. For nvidia-h200-x2.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/tune_world2.sh
# Knobs: WORLD (default 2), OPS, SETS (default llama3-8b,iris), TUNE_S (cap per op, s).
. "$(dirname "$0")/prelude.sh"
W=${WORLD:-2}
if (( $(gpus) < W )); then echo "world $W needs $W GPUs (have $(gpus))" >&2; exit 2; fi
for op in ${OPS:-gemm_all_scatter all_gather_gemm gemm_reduce_scatter}; do
    timeout -k 10 "${TUNE_S:-85}" torchrun --nproc-per-node "$W" -m tilefuse.tune --op "$op" \
        --shapes "${SETS:-llama3-8b,iris}" --quick --out tilefuse/configs >> "$R/tune_w$W.log" 2>&1
    stamp "tune w$W $op" $? | tee -a "$R/tune_w$W.log"
done
cp -r tilefuse/configs "$R/configs"
timeout 60 "$PY" -m benchmarks plots --table tilefuse/configs/*/*_ws"$W".json --out "$R/plots" > "$R/plots.log" 2>&1
pack
grep -E "^==|plain|warn|Error" "$R/tune_w$W.log" | cut -c1-160 | tail -n 40
