#!/usr/bin/env bash
# Two H200s, one process per GPU, under ten minutes: the GPU tests of the GEMM core, the four ops,
# graphs and the protocol (untimed, first); then timed one at a time: gemm_all_reduce at decode sizes
# eager and in CUDA graphs (plain, the variants, auto, torch's symmetric-memory one-shot), the host
# cost and graph-replay time of every op x variant at M = 1 and 16, and the tuner at world 2 for the
# four ops (benchmarks/runs/tune_world2.sh, a shorter budget per op), whose tables come back in
# $OUT/run.tar.gz (configs/) with everything else.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world2_decode_and_tune.sh   (from the repository root)
source "$(dirname "$0")/prelude.sh"
HERE=$(dirname "$0")
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
OUT=$R/tests LIMIT_S=150 PER_TEST=120 PYTEST_ADDOPTS='-m "not slow"' GROUPS_SPEC="tests/test_gemm_core.py;\
tests/test_gemm_all_scatter.py;tests/test_all_gather_gemm.py;tests/test_gemm_reduce_scatter.py;tests/test_gemm_all_reduce.py;\
tests/test_graphs.py tests/test_protocol.py" bash "$HERE/gpu_tests.sh" > "$R/tests.log" 2>&1
stamp tests $? >> "$R/tests.log"
SMI=$(clocks "$R/clocks.csv")
timeout -k 5 80 "$PY" -m benchmarks.allreduce_decode --world 2 --M 1,16,64,256,1024 \
    --csv "$R/allreduce_decode_w2.csv" > "$R/allreduce_decode.log" 2>&1
stamp allreduce_decode $? >> "$R/allreduce_decode.log"
timeout -k 5 70 "$PY" -m benchmarks host_overhead --world 2 --M 1,16 --calls 100 \
    --csv "$R/host_overhead_w2.csv" > "$R/host_overhead_w2.log" 2>&1
stamp host_overhead_w2 $? >> "$R/host_overhead_w2.log"
[[ -n $SMI ]] && kill "$SMI"
OUT=$OUT BUDGET_S=${BUDGET_S:-38} TUNE_S=${TUNE_S:-60} bash "$HERE/tune_world2.sh" > "$R/tune_run.log" 2>&1
pack
cat "$R/tests/tests_summary.txt" 2>/dev/null | tail -n 20
grep -h "^==" "$R"/*.log | cut -c1-200
grep -E "^M=(1|16|64) " "$R/allreduce_decode.log" | grep -E "plain|auto|fused_seq|symm" | grep graph
tail -n 30 "$R/tune_run.log"
