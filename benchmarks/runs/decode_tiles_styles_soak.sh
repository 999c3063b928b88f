#!/usr/bin/env bash
# Two H200s, about five minutes. First, timed alone on GPU 0: the GEMM core without SPLIT_K (as the
# fused variants run it) at decode sizes against torch.matmul, the default tiles and narrow-tile /
# deep-K candidates (benchmarks/gemm_sweep.py --grid decode --no-split). Then, untimed and side by side:
# tests/test_styles.py with NCCL process groups (one rank per GPU, as torch's DTensor styles run) and
# the 10,000-call soak at one process per GPU. Everything lands in $OUT/run.tar.gz.
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/decode_tiles_styles_soak.sh   (from the repository root)
source "$(dirname "$0")/prelude.sh"
if (( $(gpus) < 2 )); then echo "needs two GPUs (have $(gpus))" >&2; exit 2; fi
SMI=$(clocks "$R/clocks.csv")
CUDA_VISIBLE_DEVICES=0 timeout -k 5 175 "$PY" -m benchmarks gemm_sweep --grid decode --no-split --dtypes bf16 \
    --rep-ms 30 --budget-s 160 --csv "$R/gemm_decode_no_split_bf16.csv" > "$R/gemm_decode.log" 2>&1
stamp "gemm decode no-split" $? | tee -a "$R/gemm_decode.log"
[[ -n $SMI ]] && kill "$SMI"
( TILEFUSE_TEST_DEVICE=cuda TILEFUSE_TEST_PG=nccl TILEFUSE_TEST_TIMEOUT=120 timeout -k 10 170 "$PY" -m pytest \
    tests/test_styles.py -m "not slow" -q -rfE -p no:cacheprovider > "$R/tests_styles_nccl.log" 2>&1
  stamp "styles nccl" $? >> "$R/tests_styles_nccl.log" ) &
( timeout -k 10 150 "$PY" -m benchmarks soak --world 2 --calls 10000 --check-every 100 --variants all --heap-size 1G \
    --require-flat --budget-s 120 --csv "$R/soak_w2.csv" --no-progress > "$R/soak.log" 2>&1
  stamp soak $? >> "$R/soak.log" ) &
wait
pack
grep -v "^\s*$" "$R/gemm_decode.log" | tail -n 45
tail -n 8 "$R/tests_styles_nccl.log"; tail -n 12 "$R/soak.log"
