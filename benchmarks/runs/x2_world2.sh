#!/usr/bin/env bash
# One device call on nvidia-h200-x2 (2026-11-29, run 3): world 2, one rank per GPU over NVLink.
# 1. the tuner at W = 2 (quick search) for the three ops, written into the checkout's tables so that
#    variant="auto" in step 2 uses them; 2. the benchmark suite at W = 2 (every variant, auto, and the
#    baselines: GEMM alone, NCCL alone, torch.matmul + NCCL, torch's fused async-TP ops, ideal);
# 3. plots. Everything is packed into $OUT/run.tar.gz; summaries are printed last.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/x2_world2.sh
. "$(dirname "$0")/prelude.sh"
SETS=${SETS:-llama3-8b,iris}
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter; do
    timeout -k 10 "${TUNE_S:-85}" torchrun --nproc-per-node 2 -m tilefuse.tune --op "$op" --shapes "$SETS" --quick \
        --out tilefuse/configs >> "$R/tune_w2.log" 2>&1
    echo "== tune $op rc=$? at $(( $(date +%s) - T0 ))s" | tee -a "$R/tune_w2.log"
done
cp -r tilefuse/configs "$R/configs"
for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter; do
    timeout -k 10 "${SUITE_S:-95}" python3 -m benchmarks.suite --world 2 --ops "$op" --sets "$SETS" \
        --csv "$R/suite_w2.csv" --append --no-progress >> "$R/suite_w2.log" 2>&1
    echo "== suite $op rc=$? at $(( $(date +%s) - T0 ))s" | tee -a "$R/suite_w2.log"
done
timeout 40 python3 -m benchmarks.plots "$R/suite_w2.csv" --out "$R/plots" > "$R/plots.log" 2>&1
tar czf "$OUT/run.tar.gz" -C "$R" .
grep -E "^==|plain|Error" "$R/tune_w2.log" | cut -c1-160 | tail -n 40
grep -E "^==|Error|error" "$R/suite_w2.log" | cut -c1-160 | tail -n 20
python3 -m benchmarks.summary "$R" 2>&1 | tail -n 60
