#!/usr/bin/env bash
# Two H200s, one process per GPU: what the open targets need measured, in two device calls of under
# ten minutes each (PART=1, then PART=2). A step that would not fit in the time left is skipped and
# says so; everything lands in $OUT/run.tar.gz.
#   TILEFUSE_COMMIT=<sha> PART=1 bash benchmarks/runs/world2_targets.sh      (from the repository root)
# PART=1: the op, protocol, launcher and graph tests with one rank per GPU (untimed, first; the
#   copy-engine forms, the two-launch calls and the one-kernel calls across the link); then timed one
#   at a time: the world-2 suite of the four ops on the Llama-3-8B TP-2 and Iris sets (every variant,
#   both copy-engine forms, auto, torch's fused ops, the ideal overlap; fusion targets), the
#   device-API bandwidth against NCCL's all-gather and torch's peer copies (all-peer put from 256 MiB),
#   and the host cost and graph replay of every op x variant at M = 1, 16 next to torch.matmul +
#   NCCL (the graph target at decode sizes).
# PART=2: examples/tp_llama.py (Llama-3-8B layers: sequence-parallel forward + backward at T = 8192
#   against torch's styles and async-TP, tilefuse's eager and compiled, the replicated decode step in
#   a CUDA graph), gemm_all_reduce at decode sizes eager and in graphs (its one-kernel calls also
#   begun before their K loops), gemm_all_scatter's default call (no heap out=) on the Llama-3-8B set,
#   the suite on the Llama-3-70B TP-2 set, and the held-out auto run.
. "$(dirname "$0")/prelude.sh"
END=$(( T0 + ${TOTAL_S:-570} ))
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
case ${PART:-1} in
1)
    ( OUT=$R/tests LIMIT_S=${TESTS_S:-170} PER_TEST=150 PYTEST_ADDOPTS='-m "not slow"' \
        GROUPS_SPEC="tests/test_gemm_all_scatter.py;tests/test_all_gather_gemm.py;tests/test_gemm_reduce_scatter.py;\
tests/test_gemm_all_reduce.py;tests/test_protocol.py tests/test_launcher.py;tests/test_graphs.py" \
        bash "$(dirname "$0")/gpu_tests.sh" > "$R/tests.log" 2>&1 )
    stamp tests $? >> "$R/tests.log"
    SMI=$(clocks "$R/clocks.csv")
    # 70 s an op: at 50 s the Llama-3-8B and Iris sets' last 1-2 shapes of each op were cut (commit
    # 6dba69a); the host-cost step at M = 1, 16 and 100 calls takes about 30 s, where M = 1, 16, 64
    # at 200 calls did not fit 90 s.
    suite_w2 llama3-8b,iris "$R/suite_w2.csv" 70
    [[ -n $SMI ]] && kill "$SMI"
    fits 70 bandwidth && { timeout -k 5 70 torchrun --nproc-per-node 2 -m benchmarks bandwidth --sizes default \
        --csv "$R/bandwidth_w2.csv" > "$R/bandwidth_w2.log" 2>&1; stamp bandwidth $? >> "$R/bandwidth_w2.log"; }
    step host_overhead_w2 60 "$PY" -m benchmarks host_overhead --world 2 --M 1,16 --calls 100 --replays 100 \
        --csv "$R/host_overhead_w2.csv"
    ;;
2)
    step tp_llama 230 torchrun --nproc-per-node 2 examples/tp_llama.py --layers 2 --async-tp --compile \
        --csv "$R/tp_llama_w2.csv"
    # With the one-kernel calls begun before their K loops beside them (the begin's cross-GPU round on
    # the critical path, as before commit 1875862).
    step allreduce_decode 85 "$PY" -m benchmarks.allreduce_decode --world 2 --M 1,16,64,256,1024 \
        --methods bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto,plain,symm_one_shot,gemm,\
fused_sequential+begin_before_gemm,wg_specialized+begin_before_gemm --csv "$R/allreduce_decode_w2.csv"
    # fused_sequential splitting K at M <= 16 against the whole-K tiles it took before, on Linear weights.
    step allreduce_decode_split_k 60 "$PY" -m benchmarks.allreduce_decode --world 2 --M 1,4,16 --linear-weights \
        --methods fused_sequential,fused_sequential.whole_k,plain,symm_one_shot --rounds 5 \
        --csv "$R/allreduce_decode_w2_split_k.csv"
    # gemm_all_scatter's default call (no heap out=: its own block stored into the result, the peer's
    # copied out of the heap), which ColwiseParallel(output_layouts=Replicate()) makes.
    step suite_gas_default 50 "$PY" -m benchmarks suite --world 2 --ops gemm_all_scatter --sets llama3-8b \
        --variants bulk_sync,fused_sequential,wg_specialized,auto,plain_again --no-heap-out \
        --csv "$R/suite_w2_gas_default.csv" --no-progress
    SMI=$(clocks "$R/clocks.csv")
    suite_w2 llama3-70b "$R/suite_w2_70b.csv"
    [[ -n $SMI ]] && kill "$SMI"
    fits 95 heldout && WORLD=2 N=4 BUDGET_S=50 timeout -k 5 95 bash "$(dirname "$0")/heldout.sh" \
        > "$R/part_heldout_w2.log" 2>&1
    ;;
*) echo "PART must be 1 or 2" >&2; exit 2 ;;
esac
pack
tail -n 20 "$R/tests/tests_summary.txt" 2>/dev/null
grep -h "^==" "$R"/*.log | cut -c1-200
"$PY" -m benchmarks summary "$R" 2>&1 | tail -n 60
