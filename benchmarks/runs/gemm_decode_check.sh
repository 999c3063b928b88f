#!/usr/bin/env bash
# One GPU: decode-size GEMMs against the read of their weight (torch.matmul, the GEMM core, split-K
# candidates), the GEMM-core parity grid with the current default configs (bf16), and the replicated
# decode step of examples/tp_llama.py with two ranks sharing the GPU (gloo: tilefuse's styles against
# the unsharded layers, eager and in a CUDA graph; the timings mean nothing). The sequence-parallel
# layout and its compiled form need one GPU per rank (world2_targets.sh PART=2). About 6 minutes.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/gemm_decode_check.sh      (from the repository root)
. "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${TOTAL_S:-560} ))
step decode_gemm 120 "$PY" -m benchmarks.decode_gemm --ms 1,16 --budget-s 100 --csv "$R/decode_gemm_m1_m16.csv"
step decode_gemm_mid 80 "$PY" -m benchmarks.decode_gemm --ms 64,128 --shapes 4096x4096,6144x4096,1000x8000 \
    --budget-s 60 --csv "$R/decode_gemm_m64_m128.csv"
SMI=$(clocks "$R/clocks.csv")
step parity_default 140 "$PY" -m benchmarks gemm_sweep --grid parity --default-only --dtypes bf16 \
    --budget-s 125 --csv "$R/gemm_parity_default.csv"
[[ -n $SMI ]] && kill "$SMI"
step tp_llama_decode 120 "$PY" examples/tp_llama.py --world 2 --layers 2 --layouts decode --decode 1,16 \
    --variant fused_sequential \
    --warmup-ms 20 --rep-ms 100 --csv "$R/tp_llama_decode_shared_gpu.csv"
pack
grep -h "^==\|^M=\|budget" "$R"/*.log | cut -c1-220
tail -n 8 "$R/parity_default.log"
tail -n 25 "$R/tp_llama_decode.log"
