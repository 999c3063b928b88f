#!/usr/bin/env bash
# Two H200s, one process per GPU, under ten minutes. In parallel first (correctness, no timing): the
# multi-rank tests (not the slow set) and the 10,000-call soak with shapes changing every call. Then,
# timed one at a time: gemm_all_reduce at decode sizes (eager and in CUDA graphs, against NCCL and
# torch's symmetric-memory one-shot), the host cost and graph-replay time of every op x variant at
# decode sizes at world 2 (against torch.matmul + the NCCL collective), the replicated-layout decode
# step of examples/tp_llama.py in a CUDA graph, and the host cost at world 1 on GPU 0. A step that
# would not fit in the time left is skipped and says so. Everything lands in $OUT/run.tar.gz.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world2_soak_decode.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
END=$(( T0 + ${TOTAL_S:-575} ))
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
tests_beside_soak 170 190
SMI=$(clocks "$R/clocks.csv")
fits 90 allreduce_decode && { timeout -k 5 90 "$PY" -m benchmarks.allreduce_decode --world 2 --M 1,16,64,256,1024 \
    --csv "$R/allreduce_decode_w2.csv" > "$R/allreduce_decode.log" 2>&1; stamp allreduce_decode $? >> "$R/allreduce_decode.log"; }
fits 110 host_overhead_w2 && { timeout -k 5 110 "$PY" -m benchmarks host_overhead --world 2 --M 1,16,64,256,1024 \
    --calls 100 --csv "$R/host_overhead_w2.csv" > "$R/host_overhead_w2.log" 2>&1; stamp host_overhead_w2 $? >> "$R/host_overhead_w2.log"; }
fits 75 tp_llama_decode && { timeout -k 5 75 torchrun --nproc-per-node 2 examples/tp_llama.py --layers 2 --layouts decode \
    --csv "$R/tp_llama_decode_w2.csv" > "$R/tp_llama.log" 2>&1; stamp tp_llama $? >> "$R/tp_llama.log"; }
fits 45 host_overhead_w1 && { CUDA_VISIBLE_DEVICES=0 timeout -k 5 45 "$PY" -m benchmarks host_overhead --world 1 \
    --M 1,16,128,1024 --csv "$R/host_overhead_w1.csv" > "$R/host_overhead_w1.log" 2>&1; stamp host_overhead_w1 $? >> "$R/host_overhead_w1.log"; }
[[ -n $SMI ]] && kill "$SMI"
pack
cat "$R/tests/tests_summary.txt" 2>/dev/null | tail -n 30
grep -h "^==\|^soak" "$R"/*.log | cut -c1-200
tail -n 12 "$R/tp_llama.log" 2>/dev/null
