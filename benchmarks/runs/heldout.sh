#!/usr/bin/env bash
# variant="auto" on held-out shapes (benchmarks/heldout.py): first-call tuning included (a fresh
# decision cache), then plain, auto and torch's fused op (W > 1) timed interleaved; per-shape ratios
# and the worst/median summaries in $R/heldout_ws$W.csv. W = 1 on nvidia-h200, W = 2 on
# nvidia-h200-x2 (one rank per GPU, NCCL); about 150 s each.
#   TILEFUSE_COMMIT=<sha> WORLD=1 bash benchmarks/runs/heldout.sh
# Knobs: WORLD (default 1), N (shapes per op, default 8), BUDGET_S (default 110: no shape starts that
# would end past it; start-up and the last shape come on top), OPS (default all).
. "$(dirname "$0")/prelude.sh"
W=${WORLD:-1}
if (( $(gpus) < W )); then echo "world $W needs $W GPUs (have $(gpus)): ranks sharing a GPU prove nothing about speed" >&2; exit 2; fi
SMI=$(clocks "$R/clocks.csv")
timeout -k 10 $(( ${BUDGET_S:-110} + 120 )) "$PY" -m benchmarks heldout --world "$W" --ops "${OPS:-all}" --n "${N:-8}" \
    --budget-s "${BUDGET_S:-110}" --out "$R/heldout_ws$W.csv" > "$R/heldout_ws$W.log" 2>&1
stamp "heldout w$W" $? | tee -a "$R/heldout_ws$W.log"
[[ -n $SMI ]] && kill "$SMI"
pack
grep -v "Warning\|warn(" "$R/heldout_ws$W.log" | tail -n 40
