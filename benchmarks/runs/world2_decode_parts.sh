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
step breakdown 90 "$PY" -m benchmarks breakdown --world 2 --ops gemm_all_reduce \
    --shapes 1x8192x4096,16x8192x4096,64x8192x4096 --variants bulk_sync,producer_consumer,fused_sequential,wg_specialized \
    --rep-ms 10 --reps 3 --csv "$R/breakdown_decode_w2.csv"
decode_steps 80 75 150
[[ -n $SMI ]] && kill "$SMI"
pack
grep -h "^==" "$R"/*.log | cut -c1-200
[[ -s $R/breakdown_decode_w2.csv ]] && "$PY" -m benchmarks breakdown --summarize "$R/breakdown_decode_w2.csv" | tail -n 40
grep -E "tilefuse_graph|torch_graph" "$R/tp_llama.log" | tail -n 10
