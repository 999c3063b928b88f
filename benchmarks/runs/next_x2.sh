#!/usr/bin/env bash
# The next device call on nvidia-h200-x2 (planned in docs/PERF.md, "Next runs"; not yet run).
# 1. the W = 2 op tests with an NCCL process group; 2. the tuner at W = 2 for the three ops (four final
# rounds, 3 % margin; gemm_reduce_scatter with its input-dtype stage); 3. the suite at W = 2 (calls
# interleaved, plain_again control); 4. the TP MLP at W = 2 against plain tensor parallelism; 5. the GEMM
# core alone on the narrow per-rank shapes where gemm_all_scatter lost.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/next_x2.sh
. "$(dirname "$0")/prelude.sh"
TILEFUSE_TEST_DEVICE=cuda TILEFUSE_TEST_PG=nccl timeout -k 10 150 python3 -m pytest -q -p no:cacheprovider \
    tests/test_gemm_all_scatter.py tests/test_all_gather_gemm.py tests/test_gemm_reduce_scatter.py -k "2]" \
    > "$R/tests_nccl.log" 2>&1
stamp "tests nccl W=2" $? | tee -a "$R/tests_nccl.log"
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter; do
    timeout -k 10 70 torchrun --nproc-per-node 2 -m tilefuse.tune --op "$op" --shapes llama3-8b,iris --quick \
        --out tilefuse/configs >> "$R/tune.log" 2>&1
    stamp "tune ws2 $op" $? | tee -a "$R/tune.log"
done
mkdir -p "$R/configs"
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter; do
    cp "tilefuse/configs/$op/nvidia-h200_ws2.json" "$R/configs/${op}_ws2.json"
done
V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto,plain_again
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter; do
    timeout -k 10 70 python3 -m benchmarks.suite --world 2 --ops "$op" --sets llama3-8b,iris --variants "$V" \
        --csv "$R/suite_w2.csv" --append --no-progress >> "$R/suite_w2.log" 2>&1
    stamp "suite $op" $? | tee -a "$R/suite_w2.log"
done
timeout -k 10 80 python3 -m benchmarks.tp_mlp --size 8b --world 2 --csv "$R/tp_mlp.csv" > "$R/tp_mlp.log" 2>&1
stamp "tp_mlp w2" $? | tee -a "$R/tp_mlp.log"
CUDA_VISIBLE_DEVICES=0 timeout -k 10 60 python3 -m benchmarks.ops_world1 --ops gemm_all_scatter \
    --shapes 8192x2048x12288,8192x1792x14336,8192x3072x4096 --variants fused_sequential --reps 2 \
    --csv "$R/ops_world1.csv" > "$R/ops_narrow.log" 2>&1
stamp "ops narrow" $? | tee -a "$R/ops_narrow.log"
tar czf "$OUT/run.tar.gz" -C "$R" .
tail -n 3 "$R/tests_nccl.log"
grep -E "^==|plain|warning" "$R/tune.log" | cut -c1-150 | tail -n 30
tail -n 4 "$R/tp_mlp.log"
python3 -m benchmarks.summary "$R" 2>&1 | tail -n 40
