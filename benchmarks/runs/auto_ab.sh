#!/usr/bin/env bash
# auto against the function it runs (benchmarks.auto_ab), round by round, with the kernels each
# launches and the GPU's clocks sampled: the diagnosis of an auto-vs-plain gap on one GPU.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/auto_ab.sh
# Knobs: SPECS (space-separated op:MxNxK, default the three ops at 8192x8192x28672), ROUNDS (default 8).
. "$(dirname "$0")/prelude.sh"
SMI=$(clocks "$R/clocks.csv")
for spec in ${SPECS:-all_gather_gemm:8192x8192x28672 gemm_reduce_scatter:8192x8192x28672 gemm_all_scatter:8192x8192x28672}; do
    echo "## $(date +%T.%N | cut -c1-12) $spec" >> "$R/auto_ab.log"
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout -k 10 60 "$PY" -m benchmarks auto-ab --op "${spec%%:*}" \
        --shape "${spec##*:}" --rounds "${ROUNDS:-8}" --profile >> "$R/auto_ab.log" 2>&1
    stamp "auto_ab $spec" $? | tee -a "$R/auto_ab.log"
done
[[ -n $SMI ]] && kill "$SMI"
pack
grep -v "^\s*$" "$R/auto_ab.log" | grep -v "Warning\|warn" | cut -c1-150 | head -n 70
