#!/usr/bin/env bash
# Two H200s, one process per GPU, about eight minutes: the GEMM-core and op tests (W = 2 puts one rank
# on each GPU; the wide-tile test checks that every variant gives the same bits when bulk_sync and
# the flag-free fused loops run the default 128x256 tile warp-specialized), then the suite of the
# four ops on the Llama-3-8B TP-2 and Iris sets with every variant and variant="auto", where those
# tiles are the defaults. TEST_GROUPS: the test groups (gpu_tests.sh's GROUPS_SPEC). Everything lands
# in $OUT/run.tar.gz.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world2_wide_tiles.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
HERE=$(dirname "$0")
END=$(( T0 + ${TOTAL_S:-560} ))
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
( OUT=$R/tests LIMIT_S=210 PER_TEST=180 PYTEST_ADDOPTS='-m "not slow"' \
    GROUPS_SPEC=${TEST_GROUPS:-"tests/test_gemm_core.py;tests/test_gemm_all_scatter.py;tests/test_gemm_reduce_scatter.py;\
tests/test_gemm_all_reduce.py;tests/test_all_gather_gemm.py"} \
    bash "$HERE/gpu_tests.sh" > "$R/tests.log" 2>&1 )
stamp tests $? >> "$R/tests.log"
SMI=$(clocks "$R/clocks.csv")
suite_w2 llama3-8b,iris "$R/suite_w2.csv"
[[ -n $SMI ]] && kill "$SMI"
pack
tail -n 12 "$R/tests.log"
grep -h "^==" "$R"/*.log | cut -c1-200
"$PY" -m benchmarks summary "$R" 2>&1 | tail -n 40
