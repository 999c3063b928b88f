#!/usr/bin/env bash
# One GPU: GEMM tiles of two blocks (widths 192, 160, 96; benchmarks/composite_tiles.py) against
# torch.matmul and the GEMM core's default on the parity grid's mid-size shapes, then the multi-rank
# test suite without the slow set, ranks sharing the GPU (gpu_tests.sh, every group in parallel, with
# the time left). About 9 minutes.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/composite_tiles_check.sh      (from the repository root)
# Files under $R: composite_tiles.csv, composite.log, clocks.csv, tests/.
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${TOTAL_S:-570} ))
SMI=$(clocks "$R/clocks.csv")
step composite ${COMPOSITE_S:-230} "$PY" -m benchmarks.composite_tiles --budget-s $(( ${COMPOSITE_S:-230} - 40 )) \
    --csv "$R/composite_tiles.csv"
[[ -n $SMI ]] && kill "$SMI"
LEFT=$(( END - $(date +%s) - 15 ))
if (( LEFT > 120 )); then
    ( OUT=$R/tests LIMIT_S=$LEFT PER_TEST=$(( LEFT - 20 )) PYTEST_ADDOPTS='-m "not slow"' \
        bash "$(dirname "$0")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
    stamp tests $? >> "$R/tests.log"
else
    echo "== skipped tests: $LEFT s left" | tee -a "$R/skipped.txt"
fi
pack
grep -h "^==\|x.*: torch" "$R/composite.log" | cut -c1-220
[[ -f $R/tests.log ]] && tail -n 45 "$R/tests.log"
