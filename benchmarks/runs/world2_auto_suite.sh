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
fits() { (( $(date +%s) + $1 <= END )) || { echo "== skipped $2: $1 s do not fit" | tee -a "$R/skipped.txt"; return 1; }; }
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
SMI=$(clocks "$R/clocks.csv")
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter gemm_all_reduce; do
    V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto
    [[ $op == all_gather_gemm ]] && V=$V,pc_copy_engines
    fits 50 "suite $op" && { timeout -k 5 50 "$PY" -m benchmarks suite --world 2 --ops "$op" --sets llama3-8b,iris \
        --variants "$V" --csv "$R/suite_w2.csv" --append --no-progress >> "$R/suite_w2.log" 2>&1
        stamp "suite w2 $op" $? >> "$R/suite_w2.log"; }
done
[[ -n $SMI ]] && kill "$SMI"
fits 95 heldout && WORLD=2 N=4 BUDGET_S=50 timeout -k 5 95 bash "$HERE/heldout.sh" > "$R/part_heldout_w2.log" 2>&1
fits 75 tp_llama_decode && { timeout -k 5 75 torchrun --nproc-per-node 2 examples/tp_llama.py --layers 2 --layouts decode \
    --csv "$R/tp_llama_decode_w2.csv" > "$R/tp_llama.log" 2>&1; stamp tp_llama $? >> "$R/tp_llama.log"; }
fits 100 parity && CUDA_VISIBLE_DEVICES=0 timeout -k 5 100 "$PY" -m benchmarks gemm_sweep --grid parity --default-only \
    --dtypes bf16 --budget-s 85 --csv "$R/gemm_parity_default.csv" > "$R/gemm_parity.log" 2>&1
pack
grep -h "^==" "$R"/*.log | cut -c1-200
"$PY" -m benchmarks summary "$R" 2>&1 | tail -n 50
grep -E "tilefuse_graph|torch_graph" "$R/tp_llama.log" | tail -n 10; tail -n 6 "$R/gemm_parity.log" 2>/dev/null
