#!/usr/bin/env bash
# One GPU: stream-K after whole waves of tiles, and split-K, tested and timed against whole tiles.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/stream_k_check.sh      (from the repository root)
# 1. The GEMM core's stream-K and split-K tests (TESTS_S, default 150 s).
# 2. gemm_sweep --stream-k on the parity grid's M = MS (default 128,333,512,1000) and N = NS
#    (default 1000,4096,6144,14336): each 128-row tile whole, as stream-K after whole waves, and
#    split-K, with each kernel's registers and spills (SWEEP_S, default 330 s).
# Files under $R: tests/, gemm_stream_k_bf16.csv.
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
mkdir -p "$R/tests"
TILEFUSE_TEST_DEVICE=cuda timeout -k 5 "${TESTS_S:-150}" "$PY" -m pytest tests/test_gemm_core.py -q -rfE \
    -p no:cacheprovider -k "stream or split" > "$R/tests/tests_summary.txt" 2>&1
stamp tests $? >> "$R/tests.log"
SMI=$(clocks "$R/clocks.csv")
timeout -k 5 $(( ${SWEEP_S:-330} + 20 )) "$PY" -m benchmarks gemm_sweep --grid parity --stream-k \
    --ms "${MS:-128,333,512,1000}" --ns "${NS:-1000,4096,6144,14336}" --dtypes bf16 --budget-s "${SWEEP_S:-330}" \
    --csv "$R/gemm_stream_k_bf16.csv" > "$R/gemm_stream_k.log" 2>&1
stamp "stream-k sweep" $? | tee -a "$R/gemm_stream_k.log"
[[ -n $SMI ]] && kill "$SMI"
pack
tail -n 6 "$R/tests/tests_summary.txt"
grep -v '^gemm_sweep: compiling\|^gemm_sweep: ran' "$R/gemm_stream_k.log" | tail -n 30
