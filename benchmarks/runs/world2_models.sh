#!/usr/bin/env bash
# Two H200s, one process per GPU: what the world-2 Llama-3-8B suite does not cover. In parallel
# first (correctness, no timing): the compile tests under Inductor for gemm_all_reduce and the nn
# layers, and the 10,000-call soak with shapes changing every call. Then, timed one at a time:
# examples/tp_llama.py (sequence-parallel fwd+bwd and the replicated decode step in a CUDA graph,
# against torch's styles and torch's async-TP) and the suite of all four ops on the Llama-3-70B TP-2
# and Iris shape sets. About nine minutes; everything lands in $OUT/run.tar.gz.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world2_models.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
export TILEFUSE_TEST_DEVICE=cuda TILEFUSE_TEST_TIMEOUT=150
( timeout 170 "$PY" -m pytest -v --tb=short -p no:cacheprovider tests/test_compile.py \
    -k "gemm_all_reduce or layers or world3 or dispatch_modes" > "$R/tests_compile.log" 2>&1
  stamp "tests compile" $? >> "$R/tests_compile.log" ) &
( timeout 200 "$PY" -m benchmarks soak --world 2 --calls 10000 --check-every 100 --variants all \
    --heap-size 1G --require-flat --budget-s 170 --csv "$R/soak_w2.csv" --no-progress > "$R/soak.log" 2>&1
  stamp soak $? >> "$R/soak.log" ) &
wait
SMI=$(clocks "$R/clocks.csv")
timeout -k 10 170 torchrun --nproc-per-node 2 examples/tp_llama.py --layers 2 --async-tp \
    --csv "$R/tp_llama_w2.csv" > "$R/tp_llama.log" 2>&1
stamp tp_llama $? >> "$R/tp_llama.log"
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter gemm_all_reduce; do
    V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto
    [[ $op == all_gather_gemm ]] && V=$V,copy_engine
    timeout -k 10 55 "$PY" -m benchmarks suite --world 2 --ops "$op" --sets llama3-70b,iris --variants "$V" \
        --csv "$R/suite_w2_70b_iris.csv" --append --no-progress >> "$R/suite_w2.log" 2>&1
    stamp "suite w2 $op" $? >> "$R/suite_w2.log"
done
[[ -n $SMI ]] && kill "$SMI"
pack
grep -h "FAILED\|passed\|failed\|^==" "$R"/*.log | cut -c1-160
tail -n 15 "$R/soak.log"; tail -n 25 "$R/tp_llama.log"
