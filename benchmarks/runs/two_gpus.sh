#!/usr/bin/env bash
# Two GPUs, one process per GPU: named parts in the order given, each a step bounded in seconds;
# results under $OUT/r, packed into $OUT/run.tar.gz (a device run returns few files).
#   bash benchmarks/runs/two_gpus.sh suite host          (from the repository root)
# TOTAL_S (default 570) bounds the whole run: a part that does not fit is skipped and says so.
# Parts (modes of `python -m benchmarks`; their CSVs and plots land in $R):
#   suite   every op x variant (all_gather_gemm's copy_engine form too) and auto against plain and
#           torch's fused ops on the llama3-8b and iris sets
#   fp8     all_gather_gemm and gemm_reduce_scatter in float8 (tensor-wise, then row-wise scales) on
#           llama3-8b and llama3-70b: every variant and auto against _scaled_mm + NCCL (plain) and
#           torch's fused_all_gather_scaled_matmul / fused_scaled_matmul_reduce_scatter
#   host    host µs per eager call and µs per CUDA-graph replay at M = 1, 16
#   decode  gemm_all_reduce + residual add + RMSNorm at decode sizes, fused against cuBLAS + NCCL and
#           cuBLAS + torch's symmetric-memory all-reduce, eager and in CUDA graphs
#   tune    auto on held-out shapes against plain and torch's fused ops
#   tp      Llama-3-8B decoder layers against torch's styles and its async-TP (examples/tp_llama.py), and
#           the TP MLP (benchmarks tp)
#   tables  the W = 2 tuner for the four ops on llama3-8b and iris, into tilefuse/configs
#   tests   the GPU test suite without the slow set (W = 2 puts one rank on each GPU; gpu_tests.sh)
source "$(dirname "$0")/prelude.sh"
END=$(( T0 + ${TOTAL_S:-570} ))
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
for part in "$@"; do
    case $part in
    suite)
        SMI=$(clocks "$R/clocks.csv")
        suite_w2 llama3-8b,iris "$R/suite_w2.csv"
        [[ -n $SMI ]] && kill "$SMI"
        plots "$R/suite_w2.csv"
        ;;
    fp8)
        for scaling in tensorwise rowwise; do
            step "fp8_w2_$scaling" 140 "$PY" -m benchmarks suite --world 2 --ops all_gather_gemm,gemm_reduce_scatter \
                --sets llama3-8b,llama3-70b --fp8 "$scaling" --csv "$R/fp8_w2.csv" --append --no-progress
        done
        plots "$R/fp8_w2.csv"
        ;;
    host)
        step host_w2 110 "$PY" -m benchmarks host --world 2 --wide-shapes 1x4096x8192,16x4096x8192 --calls 100 \
            --graphs --out "$R/host"
        plots "$R/host/host_w2.csv"
        ;;
    decode)
        step decode_w2 150 "$PY" -m benchmarks decode --world 2 --out "$R/decode_w2"
        plots "$R/decode_w2/decode.csv"
        ;;
    tune) step tune_w2 110 "$PY" -m benchmarks tune --world 2 --n 4 --budget-s 80 --out "$R/tune_w2.csv" ;;
    tp)
        step tp_llama 230 torchrun --nproc-per-node 2 examples/tp_llama.py --layers 2 --async-tp \
            --csv "$R/tp_llama_w2.csv"
        step tp_w2 80 "$PY" -m benchmarks tp --size 8b --world 2 --csv "$R/tp_w2.csv"
        ;;
    tables)
        for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter gemm_all_reduce; do
            step "tables_w2_$op" 75 torchrun --nproc-per-node 2 -m tilefuse.tuning --op "$op" --shapes llama3-8b,iris \
                --quick --budget-s 50 --out tilefuse/configs ${TILEFUSE_COMMIT:+--commit "$TILEFUSE_COMMIT"}
        done
        cp -r tilefuse/configs "$R/configs"
        plots tilefuse/configs/*/*_ws2.json
        ;;
    tests) tests_in_rest "" ;;
    *) echo "unknown part: $part (suite, fp8, host, decode, tune, tp, tables, tests)" >&2; exit 2 ;;
    esac
done
pack
tail -n 25 "$R/tests/tests_summary.txt" 2>/dev/null
grep -h "^==" "$R"/*.log 2>/dev/null | cut -c1-200
