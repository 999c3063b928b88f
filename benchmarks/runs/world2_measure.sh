#!/usr/bin/env bash
# Two H200s: the protocol, graph and fault tests at one process per GPU (and ranks sharing them), the
# host-path profile of one fused call, then the world-2 suite of all four ops on the Llama-3-8B TP-2
# shapes (all_gather_gemm also with its copy-engine form) and gemm_all_reduce at decode sizes. About
# nine minutes; everything lands in $OUT/run.tar.gz.
#   bash benchmarks/runs/world2_measure.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
export TILEFUSE_TEST_DEVICE=cuda TILEFUSE_TEST_TIMEOUT=120
group() {  # group NAME SECONDS PYTEST-ARGS...: one pytest process, its own log
    local name=$1 secs=$2; shift 2
    timeout "$secs" "$PY" -m pytest -v --tb=short -p no:cacheprovider "$@" > "$R/tests_$name.log" 2>&1
    stamp "tests $name" $? >> "$R/tests_$name.log"
}
group protocol 200 tests/test_protocol.py &
group graphs 200 tests/test_graphs.py &
group agg 200 tests/test_all_gather_gemm.py -k "non_default or copy_engine or mismatched or late" &
group misc 200 tests/test_gemm_reduce_scatter.py tests/test_gemm_all_reduce.py tests/test_runtime.py -k "ragged or one_sided or harness or bounded or bitwise" &
wait
grep -h "FAILED\|== tests\|passed\|failed" "$R"/tests_*.log > "$R/tests_summary.txt"
timeout 60 "$PY" -m benchmarks.host_profile --op all_gather_gemm --variant wg_specialized --M 16 > "$R/host_profile.txt" 2>&1
stamp host_profile $? >> "$R/host_profile.txt"
SMI=$(clocks "$R/clocks.csv")
for op in all_gather_gemm gemm_all_scatter gemm_reduce_scatter gemm_all_reduce; do
    V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto
    [[ $op == all_gather_gemm ]] && V=$V,copy_engine
    timeout -k 10 60 "$PY" -m benchmarks suite --world 2 --ops "$op" --sets llama3-8b --variants "$V" \
        --csv "$R/suite_w2.csv" --append --no-progress >> "$R/suite_w2.log" 2>&1
    stamp "suite w2 $op" $? >> "$R/suite_w2.log"
done
[[ -n $SMI ]] && kill "$SMI"
timeout 60 "$PY" -m benchmarks.allreduce_decode --world 2 --M 1,16,64,256 --csv "$R/allreduce_decode_ws2.csv" > "$R/allreduce_decode.log" 2>&1
stamp allreduce_decode $? >> "$R/allreduce_decode.log"
pack
cat "$R/tests_summary.txt"; grep "^==" "$R"/*.log "$R/host_profile.txt" | cut -c1-150
