#!/usr/bin/env bash
# The next device call on nvidia-h200-x2 (planned in docs/PERF.md, "Next runs"; not yet run).
# 1. the nn tests that did not finish on GPUs (test_init_is_sharded_nn_linear hung before the seed
#    broadcast became a tensor broadcast); 2. the tuner at W = 2 for all_gather_gemm again (its heap
#    filled last time) and gemm_reduce_scatter at W = 1 on the shapes its 45 s cap missed; 3. the suite
#    at W = 2 with a plain_again control timed last; 4. the TP MLP at W = 2 against plain tensor
#    parallelism; 5. the GEMM core alone on the narrow per-rank shapes where gemm_all_scatter lost.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/next_x2.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-./bench_out}
R=$OUT/r
mkdir -p "$R"
T0=$(date +%s)
stamp() { echo "== $1 rc=$2 at $(( $(date +%s) - T0 ))s"; }
OUT=$R LIMIT_S=150 PER_TEST=140 GROUPS_SPEC="tests/test_nn.py::test_init_is_sharded_nn_linear \
tests/test_nn.py::test_parallelize_plan_with_globs tests/test_nn.py::test_bad_inputs" \
    bash benchmarks/gpu_tests.sh > "$R/tests_stdout.txt" 2>&1
stamp tests $?
# The W = 2 op tests with an NCCL process group (one rank per GPU), as users run them.
TILEFUSE_TEST_DEVICE=cuda TILEFUSE_TEST_PG=nccl timeout -k 10 150 python3 -m pytest -q -p no:cacheprovider \
    tests/test_gemm_all_scatter.py tests/test_all_gather_gemm.py tests/test_gemm_reduce_scatter.py -k "2]" \
    > "$R/tests_nccl.log" 2>&1
stamp "tests nccl W=2" $? | tee -a "$R/tests_nccl.log"
timeout -k 10 60 torchrun --nproc-per-node 2 -m tilefuse.tune --op all_gather_gemm --shapes llama3-8b,iris --quick \
    --out tilefuse/configs >> "$R/tune.log" 2>&1
stamp "tune ws2 all_gather_gemm" $? | tee -a "$R/tune.log"
CUDA_VISIBLE_DEVICES=0 timeout -k 10 60 python3 -m tilefuse.tune --op gemm_reduce_scatter --shapes decode,llama3-70b \
    --quick --out tilefuse/configs >> "$R/tune.log" 2>&1
stamp "tune ws1 gemm_reduce_scatter" $? | tee -a "$R/tune.log"
cp -r tilefuse/configs "$R/configs"
V=bulk_sync,producer_consumer,fused_sequential,wg_specialized,auto,plain_again
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter; do
    timeout -k 10 60 python3 -m benchmarks.suite --world 2 --ops "$op" --sets llama3-8b,iris --variants "$V" \
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
cat "$R/tests_summary.txt"
tail -n 3 "$R/tests_nccl.log"
grep -E "^==|plain|warning" "$R/tune.log" | cut -c1-150 | tail -n 20
tail -n 4 "$R/tp_mlp.log"
python3 -m benchmarks.summary "$R" 2>&1 | tail -n 40
