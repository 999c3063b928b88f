#!/usr/bin/env bash
# Two GPUs, one process per GPU: named parts in the order given, each a step bounded in seconds;
# results under $OUT/r, packed into $OUT/run.tar.gz (a device run returns few files).
#   bash benchmarks/runs/two_gpus.sh suite host          (from the repository root)
# Parts:
#   tests      the GPU test suite without the slow set (W = 2 puts one rank on each GPU; gpu_tests.sh)
#   suite      every op x variant (all_gather_gemm's copy_engine form too) and auto against plain and
#              torch's fused ops on the llama3-8b and iris sets, then its plots
#   decode     gemm_all_reduce at M = 1-1024, eager and in CUDA graphs (allreduce_decode)
#   host       host µs per eager call and µs per graph replay at M = 1, 16 (benchmarks host), plots
#   bandwidth  the device API's put / get against NCCL's all-gather
#   tune       the W = 2 tuner for the four ops on llama3-8b and iris, into tilefuse/configs
#   heldout    auto on held-out shapes against plain and torch's fused ops
#   tp         Llama-3-8B decoder layers against torch's styles and its async-TP (examples/tp_llama.py),
#              and the TP MLP (benchmarks tp)
#   soak       10,000 calls with the shape changing every call; memory must stay flat
# TOTAL_S (default 570) bounds the whole run: a part that does not fit is skipped and says so.
source "$(dirname "$0")/prelude.sh"
END=$(( T0 + ${TOTAL_S:-570} ))
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
OPS="gemm_all_scatter all_gather_gemm gemm_reduce_scatter gemm_all_reduce"
for part in "$@"; do
    case $part in
    tests) tests_in_rest "" ;;
    suite)
        SMI=$(clocks "$R/clocks.csv")
        suite_w2 llama3-8b,iris "$R/suite_w2.csv"
        [[ -n $SMI ]] && kill "$SMI"
        step suite_plots 60 "$PY" -m benchmarks plots "$R/suite_w2.csv" --out "$R/plots"
        ;;
    decode)
        step allreduce_decode 90 "$PY" -m benchmarks allreduce-decode --world 2 --M 1,16,64,256,1024 \
            --csv "$R/allreduce_decode_w2.csv"
        ;;
    host)
        step host_w2 110 "$PY" -m benchmarks host --world 2 --wide-shapes 1x4096x8192,16x4096x8192 --calls 100 \
            --graphs --out "$R/host"
        step host_plots 60 "$PY" -m benchmarks plots --host-overhead "$R/host/host_w2.csv" --out "$R/plots"
        ;;
    bandwidth)
        step bandwidth_w2 75 torchrun --nproc-per-node 2 -m benchmarks bandwidth --sizes default \
            --csv "$R/bandwidth_w2.csv"
        ;;
    tune)
        for op in $OPS; do
            step "tune_w2_$op" 75 torchrun --nproc-per-node 2 -m tilefuse.tuning --op "$op" --shapes llama3-8b,iris \
                --quick --budget-s 50 --out tilefuse/configs ${TILEFUSE_COMMIT:+--commit "$TILEFUSE_COMMIT"}
        done
        cp -r tilefuse/configs "$R/configs"
        step tune_plots 30 "$PY" -m benchmarks plots --table tilefuse/configs/*/*_ws2.json --out "$R/plots"
        ;;
    heldout)
        step heldout_w2 110 "$PY" -m benchmarks heldout --world 2 --n 4 --budget-s 50 --out "$R/heldout_w2.csv"
        ;;
    tp)
        step tp_llama 230 torchrun --nproc-per-node 2 examples/tp_llama.py --layers 2 --async-tp \
            --csv "$R/tp_llama_w2.csv"
        step tp_mlp 80 "$PY" -m benchmarks tp --size 8b --world 2 --csv "$R/tp_mlp_w2.csv"
        ;;
    soak)
        step soak_w2 230 "$PY" -m benchmarks soak --world 2 --calls 10000 --check-every 100 --variants all \
            --heap-size 1G --require-flat --budget-s 190 --csv "$R/soak_w2.csv" --no-progress
        ;;
    *) echo "unknown part: $part (tests, suite, decode, host, bandwidth, tune, heldout, tp, soak)" >&2; exit 2 ;;
    esac
done
pack
tail -n 25 "$R/tests/tests_summary.txt" 2>/dev/null
grep -h "^==" "$R"/*.log 2>/dev/null | cut -c1-200
"$PY" -m benchmarks summary "$R" 2>&1 | tail -n 60
