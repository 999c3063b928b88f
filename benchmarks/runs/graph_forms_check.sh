#!/usr/bin/env bash
# One H200: launch plans replayed as one CUDA graph (graph forms, on by default), measured and tested.
#   bash benchmarks/runs/graph_forms_check.sh   (from the repository root; results in $OUT/run.tar.gz)
# 1. host_path at world 1: every op x variant with graph forms (the default) and launch by launch
#    (<variant>+no_relaunch), interleaved with plain, M = 1, 16, 128, N = 4096, K = 8192, bf16; every
#    method then checked once on new operands against the reference (CSV host_path.csv).
# 2. PART=1 (default): the whole test suite without the slow set (benchmarks/runs/gpu_tests.sh: ranks
#    sharing the GPU at worlds 2-4; tests/test_relaunch.py expects a graph form for every op x
#    variant). PART=2: the slow set beside the 10,000-call soak at world 2 (shapes changing
#    every call: graph forms made, retired and refused at their limit; memory must stay flat).
#    PART=3 instead of both steps: host_overhead (eager host and wall us per call, and CUDA-graph
#    replay, next to torch.matmul + the collective) at world 1, M = 1-1024, and at world 2 with the
#    ranks sharing the GPU (gloo: host times only), M = 1, 16.
#    PART=4 instead: gemm_all_scatter's copy of the peers' blocks as a kernel (its plans' graph forms at
#    world >= 2): peer_block_copy (the kernel against torch's copies), its tests, the launcher's,
#    the graph and hardening tests (ranks sharing the GPU), then host_overhead for it at world 2.
# About nine minutes with a cold Triton cache.
source "$(dirname "$0")/prelude.sh"
END=$(( T0 + ${BUDGET_S:-570} ))
if [[ ${PART:-1} == 3 ]]; then
    step host_overhead_w1 240 "$PY" -m benchmarks host_overhead --world 1 --M 1,16,128,1024 --calls 200 \
        --replays 200 --csv "$R/host_overhead_w1.csv"
    step host_overhead_w2 240 "$PY" -m benchmarks host_overhead --world 2 --M 1,16 --calls 200 --replays 100 \
        --csv "$R/host_overhead_w2_shared_gpu.csv"
    pack
    grep -h "^== \|ERROR\|error" "$R"/*.log | cut -c1-200 | tail -40
    exit 0
fi
if [[ ${PART:-1} == 4 ]]; then
    step peer_block_copy 100 "$PY" -m benchmarks peer_block_copy --world-sizes 2,4 --M 1,16,128,1024,8192 \
        --N 4096,14336 --csv "$R/peer_block_copy.csv"
    OUT=$R/tests LIMIT_S=260 PER_TEST=240 PYTEST_ADDOPTS="-m 'not slow'" GROUPS_SPEC="tests/test_gemm_all_scatter.py;\
tests/test_launcher.py tests/test_relaunch.py;tests/test_graphs.py;tests/test_hardening.py" \
        bash benchmarks/runs/gpu_tests.sh > "$R/tests.log" 2>&1
    step host_overhead_gas_w2 90 "$PY" -m benchmarks host_overhead --world 2 --ops gemm_all_scatter --M 1,16 \
        --calls 200 --no-graphs --csv "$R/host_overhead_gas_w2_shared_gpu.csv"
    pack
    tail -n 20 "$R/tests/tests_summary.txt"
    grep -h "^== \|kernel/torch" "$R"/*.log | cut -c1-200 | tail -40
    grep -v "ERROR" "$R/host_overhead_gas_w2.log" | grep "host" | cut -c1-150 | tail -20
    exit 0
fi
step host_path 200 "$PY" -m benchmarks host_path --real-launches --no-relaunch --ops all --M 1,16,128 \
    --N 4096 --K 8192 --calls 200 --rounds 7 --csv "$R/host_path.csv"
left=$(( END - $(date +%s) - 15 ))
if [[ ${PART:-1} == 2 ]]; then
    tests_beside_soak "$left" $(( left - 60 )) slow
    stamp "slow set beside the soak" 0 >> "$R/soak.log"
    tail -n 30 "$R/tests/tests_summary.txt"
    grep -h "^soak: [0-9]*/" "$R/soak.log" | cut -c1-900
else
    OUT=$R LIMIT_S=$left PER_TEST=$(( left - 20 )) PYTEST_ADDOPTS="-m 'not slow'" bash benchmarks/runs/gpu_tests.sh \
        > "$R/gpu_tests.log" 2>&1
    stamp gpu_tests $? >> "$R/gpu_tests.log"
fi
pack
grep -h "^== \|^--- group\|passed\|failed" "$R"/*.log | cut -c1-200 | tail -60
