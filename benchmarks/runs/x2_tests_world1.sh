#!/usr/bin/env bash
# One device call on nvidia-h200-x2 (2026-11-29, run 2): the GPU test suite over both GPUs, then
# world-1 work on each GPU at once: GPU 0 times the ops against torch.matmul (all shapes) and the
# Llama-3-8B TP MLP; GPU 1 runs the tuner at world 1 for the three ops. Everything is packed into
# $OUT/run.tar.gz (the device tool returns at most 8 files); summaries are printed last.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/x2_tests_world1.sh
. "$(dirname "$0")/prelude.sh"
OUT=$R LIMIT_S=${TESTS_LIMIT_S:-200} PER_TEST=180 bash benchmarks/gpu_tests.sh > "$R/tests_stdout.txt" 2>&1
echo "tests done after $(( $(date +%s) - T0 ))s"
(
    export CUDA_VISIBLE_DEVICES=0
    for spec in gemm_all_scatter:130 all_gather_gemm:100 gemm_reduce_scatter:100; do
        timeout -k 10 "${spec#*:}" python3 -m benchmarks.ops_world1 --ops "${spec%%:*}" --shapes full --reps 2 \
            --csv "$R/ops_world1.csv" --append
        echo "== ops_world1 ${spec%%:*} rc=$?"
    done
    timeout -k 10 60 python3 -m benchmarks.tp_mlp --size 8b --world 1 --csv "$R/tp_mlp.csv"
    echo "== tp_mlp rc=$?"
) > "$R/gpu0.log" 2>&1 &
(
    export CUDA_VISIBLE_DEVICES=1
    for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter; do
        timeout -k 10 120 python3 -m tilefuse.tune --op "$op" --shapes llama3-8b,llama3-70b,iris,decode --quick \
            --out "$R/configs"
        echo "== tune $op rc=$?"
    done
) > "$R/gpu1.log" 2>&1 &
wait
echo "all done after $(( $(date +%s) - T0 ))s"
tar czf "$OUT/run.tar.gz" -C "$R" .
cat "$R/tests_summary.txt"
tail -n 45 "$R/gpu0.log" | cut -c1-200
grep -E "^==|plain|wrote|Error" "$R/gpu1.log" | tail -n 40
