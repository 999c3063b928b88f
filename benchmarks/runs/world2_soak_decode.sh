#!/usr/bin/env bash
# Two H200s, one process per GPU, under ten minutes. In parallel first (correctness, no timing): the
# multi-rank tests (not the slow set) and the 10,000-call soak with shapes changing every call. Then,
# timed one at a time: the host cost and graph-replay time of every op x variant at decode sizes at
# world 2 (against torch.matmul + the NCCL collective), gemm_all_reduce at decode sizes (eager and in
# CUDA graphs, against NCCL and torch's symmetric-memory one-shot), the replicated-layout decode step
# of examples/tp_llama.py in a CUDA graph, and the host cost at world 1 on GPU 0. A step that
# would not fit in the time left is skipped and says so. Everything lands in $OUT/run.tar.gz.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/world2_soak_decode.sh      (from the repository root)
source "$(dirname "$0")/prelude.sh"
END=$(( T0 + ${TOTAL_S:-575} ))
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
tests_beside_soak 170 190
SMI=$(clocks "$R/clocks.csv")
step host_overhead_w2 110 "$PY" -m benchmarks host_overhead --world 2 --M 1,16,64,256,1024 --calls 100 \
    --csv "$R/host_overhead_w2.csv"
decode_steps 90 75 45
[[ -n $SMI ]] && kill "$SMI"
pack
cat "$R/tests/tests_summary.txt" 2>/dev/null | tail -n 30
grep -h "^==\|^soak" "$R"/*.log | cut -c1-200
tail -n 12 "$R/tp_llama.log" 2>/dev/null
