#!/usr/bin/env bash
# Two H200s, one process per GPU, about eight minutes, timed one step at a time: the suite of the four
# ops on the Llama-3-8B TP-2 and Iris sets with every variant and variant="auto" (on the shipped
# world-2 tables), the held-out set with auto against plain and torch's fused ops, the replicated
# decode step of examples/tp_llama.py in a CUDA graph, and, if time is left, the GEMM-core parity grid
# on GPU 0. A step that would not fit is skipped and says so. Everything lands in $OUT/run.tar.gz.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world2_auto_suite.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
HERE=$(dirname "$0")
END=$(( T0 + ${TOTAL_S:-500} ))
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
SMI=$(clocks "$R/clocks.csv")
suite_w2 llama3-8b,iris "$R/suite_w2.csv"
[[ -n $SMI ]] && kill "$SMI"
fits 95 heldout && WORLD=2 N=4 BUDGET_S=50 timeout -k 5 95 bash "$HERE/heldout.sh" > "$R/part_heldout_w2.log" 2>&1
step tp_llama 75 torchrun --nproc-per-node 2 examples/tp_llama.py --layers 2 --layouts decode \
    --csv "$R/tp_llama_decode_w2.csv"
step gemm_parity 100 env CUDA_VISIBLE_DEVICES=0 "$PY" -m benchmarks gemm_sweep --grid parity --default-only \
    --dtypes bf16 --budget-s 85 --csv "$R/gemm_parity_default.csv"
pack
grep -h "^==" "$R"/*.log | cut -c1-200
"$PY" -m benchmarks summary "$R" 2>&1 | tail -n 50
grep -E "tilefuse_graph|torch_graph" "$R/tp_llama.log" | tail -n 10; tail -n 6 "$R/gemm_parity.log" 2>/dev/null
