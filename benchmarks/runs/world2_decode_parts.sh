#!/usr/bin/env bash
# Two H200s, one process per GPU, about five minutes: where gemm_all_reduce's fused variants lose at
# decode sizes, and the decode measurements after the graph-pick rule. First gemm_all_reduce taken
# apart at M = 1, 16, 64 (benchmarks/breakdown.py: cuBLAS, NCCL, the GEMM core, the fused kernel with
# and without peer traffic, the stores alone, the reduction, the begin kernel alone (empty_call), each
# whole variant; device time behind a GPU sleep as well as the call on an idle GPU); then
# gemm_all_reduce at M = 1-1024 eager and in CUDA graphs (allreduce_decode), the replicated decode step
# of examples/tp_llama.py in a CUDA graph, and the host cost at world 1 on GPU 0 (eager and graphs).
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world2_decode_parts.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
END=$(( T0 + ${TOTAL_S:-560} ))
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
SMI=$(clocks "$R/clocks.csv")
fits 90 breakdown && { timeout -k 5 90 "$PY" -m benchmarks breakdown --world 2 --ops gemm_all_reduce \
    --shapes 1x8192x4096,16x8192x4096,64x8192x4096 --variants bulk_sync,producer_consumer,fused_sequential,wg_specialized \
    --rep-ms 10 --reps 3 --csv "$R/breakdown_decode_w2.csv" > "$R/breakdown.log" 2>&1; stamp breakdown $? >> "$R/breakdown.log"; }
fits 80 allreduce_decode && { timeout -k 5 80 "$PY" -m benchmarks.allreduce_decode --world 2 --M 1,16,64,256,1024 \
    --csv "$R/allreduce_decode_w2.csv" > "$R/allreduce_decode.log" 2>&1; stamp allreduce_decode $? >> "$R/allreduce_decode.log"; }
fits 75 tp_llama_decode && { timeout -k 5 75 torchrun --nproc-per-node 2 examples/tp_llama.py --layers 2 --layouts decode \
    --csv "$R/tp_llama_decode_w2.csv" > "$R/tp_llama.log" 2>&1; stamp tp_llama $? >> "$R/tp_llama.log"; }
fits 60 host_overhead_w1 && { CUDA_VISIBLE_DEVICES=0 timeout -k 5 60 "$PY" -m benchmarks host_overhead --world 1 \
    --M 1,16,128,1024 --csv "$R/host_overhead_w1.csv" > "$R/host_overhead_w1.log" 2>&1; stamp host_overhead_w1 $? >> "$R/host_overhead_w1.log"; }
[[ -n $SMI ]] && kill "$SMI"
pack
grep -h "^==" "$R"/*.log | cut -c1-200
[[ -s $R/breakdown_decode_w2.csv ]] && "$PY" -m benchmarks breakdown --summarize "$R/breakdown_decode_w2.csv" | tail -n 40
grep -E "tilefuse_graph|torch_graph" "$R/tp_llama.log" | tail -n 10
