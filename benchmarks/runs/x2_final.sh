#!/usr/bin/env bash
# One device call on nvidia-h200-x2 (2026-11-29, run 4): the GPU tests not yet run on both GPUs (nn,
# tuning, benchmarks, the fixed bounded-wait test); the tuner again at W = 2 (plain path now timed
# interleaved with the finalists) and gemm_reduce_scatter at W = 1 (its plain path fixed); the suite
# at W = 2 with methods timed in alternating order, with the GPUs' clocks logged; the TP MLP at W = 2.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/x2_final.sh
. "$(dirname "$0")/prelude.sh"
OUT=$R LIMIT_S=150 PER_TEST=140 GROUPS_SPEC="tests/test_runtime.py -k bounded_wait;tests/test_tuning.py \
tests/test_benchmarks.py;tests/test_nn.py::test_hf_llama_mlp tests/test_nn.py::test_layers_every_variant \
tests/test_nn.py::test_saved_input_survives_workspace_reuse;tests/test_nn.py::test_layers_match_nn_linear \
tests/test_nn.py::test_init_is_sharded_nn_linear tests/test_nn.py::test_parallelize_plan_with_globs \
tests/test_nn.py::test_bad_inputs" \
    bash benchmarks/gpu_tests.sh > "$R/tests_stdout.txt" 2>&1
stamp tests $?
SETS=llama3-8b,iris
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter; do
    timeout -k 10 55 torchrun --nproc-per-node 2 -m tilefuse.tune --op "$op" --shapes "$SETS" --quick \
        --out tilefuse/configs >> "$R/tune.log" 2>&1
    stamp "tune ws2 $op" $? | tee -a "$R/tune.log"
done
CUDA_VISIBLE_DEVICES=0 timeout -k 10 45 python3 -m tilefuse.tune --op gemm_reduce_scatter \
    --shapes llama3-8b,llama3-70b,iris,decode --quick --out tilefuse/configs >> "$R/tune.log" 2>&1
stamp "tune ws1 gemm_reduce_scatter" $? | tee -a "$R/tune.log"
cp -r tilefuse/configs "$R/configs"
nvidia-smi dmon -s pc -d 1 > "$R/dmon.log" 2>&1 &
DMON=$!
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter; do
    timeout -k 10 60 python3 -m benchmarks.suite --world 2 --ops "$op" --sets "$SETS" \
        --csv "$R/suite_w2.csv" --append --no-progress >> "$R/suite_w2.log" 2>&1
    stamp "suite $op" $? | tee -a "$R/suite_w2.log"
done
kill $DMON 2>/dev/null
timeout -k 10 60 python3 -m benchmarks.tp_mlp --size 8b --world 2 --csv "$R/tp_mlp_w2.csv" > "$R/tp_mlp.log" 2>&1
stamp "tp_mlp w2" $? | tee -a "$R/tp_mlp.log"
timeout 40 python3 -m benchmarks.plots "$R/suite_w2.csv" --out "$R/plots" > "$R/plots.log" 2>&1
tar czf "$OUT/run.tar.gz" -C "$R" .
cat "$R/tests_summary.txt"
grep -E "^==|plain|Error" "$R/tune.log" | cut -c1-150 | tail -n 32
tail -n 4 "$R/tp_mlp.log"
awk 'NR<=2 || NR%15==0' "$R/dmon.log" | head -n 14
python3 -m benchmarks.summary "$R" 2>&1 | tail -n 30
