#!/usr/bin/env bash
# One GPU: the GEMM core's default configs at M = 64 and 128 of the parity grid, with split-K (the core's
# own default, default_config(..., split_k=True)) and without (the variants' small-M tiles), in one
# run. About two minutes. Files: $R/parity_small_m_split.csv, $R/parity_small_m_no_split.csv.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/small_m_parity.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${BUDGET_S:-150} ))
step split 70 "$PY" -m benchmarks gemm_sweep --grid parity --ms "${MS:-64,128}" --default-only --dtypes bf16 \
    --rep-ms 30 --budget-s 60 --csv "$R/parity_small_m_split.csv"
step no_split 70 "$PY" -m benchmarks gemm_sweep --grid parity --ms "${MS:-64,128}" --no-split --default-only \
    --dtypes bf16 --rep-ms 30 --budget-s 60 --csv "$R/parity_small_m_no_split.csv"
pack
tail -n 20 "$R/split.log" "$R/no_split.log"
