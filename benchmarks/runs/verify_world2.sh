#!/usr/bin/env bash
# The protocol and graph tests and every op's tests on GPUs (rank r on GPU r % the GPU count, gloo
# bootstrap; W = 1..4), then the world-1 GEMM core with its default configs against torch.matmul,
# gemm_all_reduce at decode sizes (eager and in CUDA graphs) and the host cost of every op call, at
# world 2. About nine minutes on two H200s.
#   bash benchmarks/runs/verify_world2.sh      (from the repository root; OUT selects the output folder)
source "$(dirname "$0")/prelude.sh"
export TILEFUSE_TEST_DEVICE=cuda TILEFUSE_TEST_TIMEOUT=150
group() {  # group NAME FILES...: one pytest process, its own log
    local name=$1; shift
    timeout 270 "$PY" -m pytest -v --tb=short -p no:cacheprovider "$@" > "$R/tests_$name.log" 2>&1
    stamp "tests $name" $? >> "$R/tests_$name.log"
}
group protocol tests/test_protocol.py tests/test_graphs.py &
group gas tests/test_gemm_all_scatter.py tests/test_workspaces.py &
group agg tests/test_all_gather_gemm.py &
group grs tests/test_gemm_reduce_scatter.py tests/test_runtime.py &
group gar tests/test_gemm_all_reduce.py tests/test_compile.py tests/test_autograd.py &
wait
grep -h "FAILED\|ERROR\|== tests" "$R"/tests_*.log > "$R/tests_summary.txt"
timeout 90 "$PY" -m benchmarks.gemm_sweep --default-only --out "$R/gemm_core_default_h200_bf16.csv" > "$R/gemm_core.log" 2>&1
stamp gemm_core $? >> "$R/gemm_core.log"
timeout 110 "$PY" -m benchmarks.allreduce_decode --world 2 --csv "$R/allreduce_decode_ws2.csv" > "$R/allreduce_decode.log" 2>&1
stamp allreduce_decode $? >> "$R/allreduce_decode.log"
timeout 90 "$PY" -m benchmarks.host_overhead --world 1,2 --csv "$R/host_overhead.csv" > "$R/host_overhead.log" 2>&1
stamp host_overhead $? >> "$R/host_overhead.log"
