#!/usr/bin/env bash
# One GPU, named parts in the order given, each a step bounded in seconds; results under $OUT/r,
# packed into $OUT/run.tar.gz (a device run returns few files).
#   bash benchmarks/runs/one_gpu.sh suite gemm          (from the repository root)
# TOTAL_S (default 570) bounds the whole run: a part that does not fit is skipped and says so.
# Parts (modes of `python -m benchmarks`; their CSVs and plots land in $R):
#   suite   every op x variant at W = 1 against torch.matmul on the Llama-3-8B set (the fusion tax),
#           eagerly and replayed in CUDA graphs
#   gemm    the GEMM core against torch.matmul on the parity grid, then in float8 against torch._scaled_mm
#   host    host µs per eager call (benchmarks host): every op x variant, plain and auto at W = 1 with
#           real launches (M = 1, 16, 128); torch, plain and auto on 24 random shapes with device µs
#           per call timed alone; at W = 2 with ranks sharing the GPU, host time
#   decode  gemm_all_reduce + residual add + RMSNorm at decode sizes, fused against cuBLAS + the
#           collective, eager and in CUDA graphs
#   tune    auto on held-out shapes against plain
#   tp      the tensor-parallel Llama-3-8B MLP forward + backward at W = 1 (the layers' overhead)
#   tables  the W = 1 tuner for the four ops, into tilefuse/configs (copied to $R/configs)
#   tests   the GPU test suite without the slow set, ranks sharing the GPU (gpu_tests.sh), in the time left
source "$(dirname "$0")/prelude.sh"
END=$(( T0 + ${TOTAL_S:-570} ))
for part in "$@"; do
    case $part in
    suite)
        step suite_w1 240 "$PY" -m benchmarks suite --world 1 --sets llama3-8b --csv "$R/suite_w1.csv" --graphs --no-progress
        plots "$R/suite_w1.csv"
        ;;
    gemm)
        step gemm_w1 270 "$PY" -m benchmarks gemm --grid parity --csv "$R/gemm_w1.csv"
        step gemm_fp8_w1 240 "$PY" -m benchmarks gemm --grid parity --fp8 tensorwise,rowwise --warmup-ms 10 --rep-ms 40 --csv "$R/gemm_fp8_w1.csv"
        ;;
    host)
        step host_path_w1 90 "$PY" -m benchmarks host --world 1 --real-launches \
            --shapes 1x4096x8192,16x4096x8192,128x4096x8192 --calls 100 --rounds 5 --out "$R/host_path"
        step host_random_w1 150 env TILEFUSE_AUTOTUNE=0 "$PY" -m benchmarks host --world 1 \
            --variants torch,plain,auto,plain_custom_op --out "$R/host_random"
        step host_w2 120 "$PY" -m benchmarks host --world 2 --calls 100 --out "$R/host_w2"
        ;;
    decode)
        step decode_w1 150 "$PY" -m benchmarks decode --world 1 --out "$R/decode_w1"
        plots "$R/decode_w1/decode.csv"
        ;;
    tune) step tune_w1 150 "$PY" -m benchmarks tune --world 1 --n 6 --budget-s 120 --out "$R/tune_w1.csv" ;;
    tp) step tp_w1 90 "$PY" -m benchmarks tp --world 1 --size 8b --csv "$R/tp_w1.csv" ;;
    tables)
        for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter gemm_all_reduce; do
            step "tables_w1_$op" 85 "$PY" -m tilefuse.tuning --op "$op" --shapes llama3-8b,llama3-70b,iris,decode \
                --quick --budget-s 65 --out tilefuse/configs ${TILEFUSE_COMMIT:+--commit "$TILEFUSE_COMMIT"}
        done
        cp -r tilefuse/configs "$R/configs"
        ;;
    tests) tests_in_rest "" ;;
    *) echo "unknown part: $part (suite, gemm, host, decode, tune, tp, tables, tests)" >&2; exit 2 ;;
    esac
done
pack
grep -h "^==" "$R"/*.log "$R"/tests/*.txt 2>/dev/null | cut -c1-160
