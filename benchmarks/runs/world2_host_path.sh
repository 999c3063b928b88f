#!/usr/bin/env bash
# Two H200s: the host cost of every op call at world 1 (and where it goes), the protocol, graph and
# fault tests, the world-2 suite on the Llama-3-8B TP-2 shapes (all_gather_gemm with its copy-engine
# form too) and gemm_all_reduce at decode sizes. About seven minutes; results in $OUT/run.tar.gz.
#   bash benchmarks/runs/world2_host_path.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
export TILEFUSE_TEST_DEVICE=cuda TILEFUSE_TEST_TIMEOUT=100
group() {  # group NAME SECONDS PYTEST-ARGS...: one pytest process, its own log
    local name=$1 secs=$2; shift 2
    timeout "$secs" "$PY" -m pytest -v --tb=short -p no:cacheprovider "$@" > "$R/tests_$name.log" 2>&1
    stamp "tests $name" $? >> "$R/tests_$name.log"
}
timeout 45 "$PY" -m benchmarks.host_profile --op all_gather_gemm --variant wg_specialized --M 16 > "$R/host_profile.txt" 2>&1
stamp host_profile $? >> "$R/host_profile.txt"
timeout 75 "$PY" -m benchmarks.host_overhead --world 1 --M 1,16,128 --no-graphs --csv "$R/host_overhead_ws1.csv" > "$R/host_overhead.log" 2>&1
stamp host_overhead $? >> "$R/host_overhead.log"
group protocol 130 tests/test_protocol.py &
group graphs 130 tests/test_graphs.py &
group misc 130 tests/test_gemm_reduce_scatter.py tests/test_gemm_all_reduce.py tests/test_runtime.py tests/test_all_gather_gemm.py -k "ragged or one_sided or harness or bounded or bitwise or copy_engine or mismatched" &
wait
grep -h "FAILED\|== tests\|passed\|failed" "$R"/tests_*.log > "$R/tests_summary.txt"
SMI=$(clocks "$R/clocks.csv")
for op in all_gather_gemm gemm_all_scatter gemm_reduce_scatter; do
    V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto
    [[ $op == all_gather_gemm ]] && V=$V,copy_engine
    timeout -k 5 40 "$PY" -m benchmarks suite --world 2 --ops "$op" --sets llama3-8b --variants "$V" \
        --csv "$R/suite_w2.csv" --append --no-progress >> "$R/suite_w2.log" 2>&1
    stamp "suite w2 $op" $? >> "$R/suite_w2.log"
done
[[ -n $SMI ]] && kill "$SMI"
timeout 50 "$PY" -m benchmarks.allreduce_decode --world 2 --M 1,16,64 --csv "$R/allreduce_decode_ws2.csv" > "$R/allreduce_decode.log" 2>&1
stamp allreduce_decode $? >> "$R/allreduce_decode.log"
pack
cat "$R/tests_summary.txt"; grep -h "^==" "$R"/*.log "$R/host_profile.txt" | cut -c1-150; head -4 "$R/host_profile.txt"
