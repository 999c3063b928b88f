#!/usr/bin/env bash
# The GEMM core's code paths on one GPU: warp-specialized tiles (Config.WARP_SPEC) and the aligned
# pointer path (rows of K that are not 16-byte multiples: gemm.pointer_align). First the GEMM-core
# tests of both (on the GPU), then the parity grid with the default configs (bf16, fp16), then the
# warp-specialized tiles against the same tiles without it, and the defaults, at the M of SWEEP_MS
# (bf16). About 9 minutes on an H200; BUDGET_S caps the whole script.
#   bash benchmarks/runs/gemm_core_paths.sh      (from the repository root; OUT selects the output folder)
# Files: $R/tests/, $R/gemm_parity_default.csv, $R/gemm_parity_warp_spec_bf16.csv, logs.
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${BUDGET_S:-570} ))
SMI=$(clocks "$R/clocks.csv")
( OUT=$R/tests LIMIT_S=60 PER_TEST=50 GROUPS_SPEC="tests/test_gemm_core.py" \
    PYTEST_ADDOPTS="-k 'aligned or warp_spec or column_major or test_matmul_default_config'" \
    bash "$(dirname "$0")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
stamp tests $? >> "$R/tests.log"
step parity_default 110 "$PY" -m benchmarks gemm_sweep --grid parity --default-only --dtypes bf16,fp16 \
    --budget-s 100 --csv "$R/gemm_parity_default.csv"
LEFT=$(( END - $(date +%s) - 10 ))
if (( LEFT > 60 )); then
    step parity_warp_spec "$LEFT" "$PY" -m benchmarks gemm_sweep --grid parity --warp-spec \
        --ms "${SWEEP_MS:-64,128,333,512,1000,1024,4096}" --dtypes bf16 --rep-ms 40 \
        --budget-s $(( LEFT - 10 )) --csv "$R/gemm_parity_warp_spec_bf16.csv"
fi
[[ -n $SMI ]] && kill "$SMI"
pack
tail -n 3 "$R/tests.log"
for f in "$R"/parity_*.log; do echo "-- $f"; tail -n 8 "$f"; done
