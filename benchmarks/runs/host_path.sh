#!/usr/bin/env bash
# One H200: the host path of an op call (launchers, auto's lookup), measured and tested.
#   bash benchmarks/runs/host_path.sh          (from the repository root; results in $OUT/run.tar.gz)
# 1. host_overhead at world 1: eager host and wall us per call of plain, each variant and auto,
#    M = 1, 16, 128, 1024, N = 4096, K = 8192, bf16 (CSV host_overhead_ws1.csv).
# 2. host_path: Python host us per call with real launches and with no-op launches (the
#    Python alone), M = 1, 16, 128 (CSVs host_path_real.csv, host_path_noop.csv).
# 3. host_profile of all_gather_gemm wg_specialized at M = 16 (where the remaining time goes).
# 4. The GPU-only paths of the host path: launchers, streams of producer_consumer (events reused),
#    CUDA graphs, protocol faults (W = 2 ranks on this GPU).
# About four minutes with a cold Triton cache (compiles dominate), two with a warm one.
source "$(dirname "$0")/prelude.sh"
export TILEFUSE_TEST_DEVICE=cuda TILEFUSE_TEST_TIMEOUT=100
timeout -k 5 150 "$PY" -m benchmarks host-overhead --world 1 --M 1,16,128,1024 --no-graphs --calls 100 \
    --csv "$R/host_overhead_ws1.csv" > "$R/host_overhead.log" 2>&1
stamp host_overhead $? >> "$R/host_overhead.log"
timeout -k 5 60 "$PY" -m benchmarks.host_path --real-launches --M 1,16,128 --N 4096 --K 8192 --calls 100 \
    --csv "$R/host_path_real.csv" > "$R/host_path_real.log" 2>&1
stamp host_path_real $? >> "$R/host_path_real.log"
timeout -k 5 60 "$PY" -m benchmarks.host_path --M 1,16,128 --calls 200 --csv "$R/host_path_noop.csv" \
    > "$R/host_path_noop.log" 2>&1
stamp host_path_noop $? >> "$R/host_path_noop.log"
timeout -k 5 45 "$PY" -m benchmarks.host_profile --op all_gather_gemm --variant wg_specialized --M 16 \
    > "$R/host_profile.txt" 2>&1
stamp host_profile $? >> "$R/host_profile.txt"
timeout -k 5 240 "$PY" -m pytest -q -rfE -p no:cacheprovider tests/test_launcher.py tests/test_graphs.py \
    tests/test_protocol.py -m "not slow" > "$R/tests_launchers.log" 2>&1
stamp "tests launchers" $? >> "$R/tests_launchers.log"
timeout -k 5 240 "$PY" -m pytest -q -rfE -p no:cacheprovider tests/test_gemm_all_scatter.py \
    tests/test_gemm_reduce_scatter.py tests/test_gemm_all_reduce.py tests/test_all_gather_gemm.py \
    -k "producer_consumer or auto" -m "not slow" > "$R/tests_streams.log" 2>&1
stamp "tests streams" $? >> "$R/tests_streams.log"
pack
grep -h "^==\|passed\|failed" "$R"/*.log "$R/host_profile.txt" | cut -c1-160
grep -E "M=(1|16) " "$R/host_overhead.log" | grep -E "plain |wg_specialized|auto" | cut -c1-150
