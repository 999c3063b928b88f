#!/usr/bin/env bash
# The GEMM core against torch.matmul on one GPU: the parity grid (M 16..8192, small M with large K,
# N and K not multiples of 128) with the configs default_config(..., split_k=True) picks, bf16 and
# fp16; then, in the time left, a sweep of candidate configs (tiles x SPLIT_K, copying
# misaligned operands or not) in bf16 at the M of SWEEP_MS (default 128,333,512,1000: where the
# defaults are furthest from torch.matmul), the data the defaults are chosen from. At most 150 s on
# an H200; for the whole sweep: python -m benchmarks gemm_sweep --grid parity --max-m 1024 --budget-s 500.
#   bash benchmarks/runs/gemm_parity.sh      (from the repository root; OUT selects the output folder)
# CSVs: $R/gemm_parity_default.csv, $R/gemm_parity_sweep_bf16.csv (benchmarks/gemm_sweep.py).
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
SMI=$(clocks "$R/clocks.csv")
timeout -k 5 105 "$PY" -m benchmarks gemm_sweep --grid parity --default-only --dtypes bf16,fp16 \
    --budget-s 95 --csv "$R/gemm_parity_default.csv" > "$R/gemm_parity_default.log" 2>&1
stamp "parity default" $? | tee -a "$R/gemm_parity_default.log"
LEFT=$(( 140 - ($(date +%s) - T0) ))
if (( LEFT > 25 )); then
    timeout -k 5 "$LEFT" "$PY" -m benchmarks gemm_sweep --grid parity --ms "${SWEEP_MS:-128,333,512,1000}" --dtypes bf16 \
        --budget-s $(( LEFT - 15 )) --csv "$R/gemm_parity_sweep_bf16.csv" > "$R/gemm_parity_sweep.log" 2>&1
    stamp "parity sweep" $? | tee -a "$R/gemm_parity_sweep.log"
fi
[[ -n $SMI ]] && kill "$SMI"
pack
tail -n 12 "$R/gemm_parity_default.log"
