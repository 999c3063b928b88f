#!/usr/bin/env bash
# One GPU, named parts in the order given, each a step bounded in seconds; results under $OUT/r,
# packed into $OUT/run.tar.gz (a device run returns few files).
#   bash benchmarks/runs/one_gpu.sh host tests          (from the repository root)
# TOTAL_S (default 570) bounds the whole run: a part that does not fit is skipped and says so.
# Parts:
#   host    host µs per eager call (benchmarks host): every op x variant, plain and auto at W = 1 with
#           real launches (M = 1, 16, 128); torch, plain and auto on 24 random shapes with device µs
#           per call timed alone; at W = 2 with ranks sharing the GPU, host time
#   tests   the GPU test suite without the slow set, ranks sharing the GPU (gpu_tests.sh)
#   parity  the GEMM core against torch.matmul on the parity grid (gemm_sweep)
#   suite   every op x variant at W = 1 against torch.matmul on the Llama-3-8B set
#   tune    the W = 1 tuner for the four ops on llama3-8b, llama3-70b, iris, decode, into tilefuse/configs
#   heldout auto on held-out shapes against plain at W = 1
source "$(dirname "$0")/prelude.sh"
END=$(( T0 + ${TOTAL_S:-570} ))
for part in "$@"; do
    case $part in
    host)
        step host_path_w1 90 "$PY" -m benchmarks host --world 1 --real-launches \
            --shapes 1x4096x8192,16x4096x8192,128x4096x8192 --calls 100 --rounds 5 --out "$R/host_path"
        step host_random_w1 150 env TILEFUSE_AUTOTUNE=0 "$PY" -m benchmarks host --world 1 \
            --variants torch,plain,auto,plain_entry --out "$R/host_random"
        step host_w2 120 "$PY" -m benchmarks host --world 2 --calls 100 --out "$R/host_w2"
        ;;
    tests) tests_in_rest "" ;;
    parity) step gemm_parity 240 "$PY" -m benchmarks.gemm_sweep --grid parity --csv "$R/gemm_parity.csv" ;;
    suite) step suite_w1 240 "$PY" -m benchmarks suite --world 1 --sets llama3-8b --csv "$R/suite_w1.csv" ;;
    tune)
        for op in gemm_all_scatter all_gather_gemm gemm_reduce_scatter gemm_all_reduce; do
            step "tune_w1_$op" 85 "$PY" -m tilefuse.tuning --op "$op" --shapes llama3-8b,llama3-70b,iris,decode \
                --quick --budget-s 65 --out tilefuse/configs ${TILEFUSE_COMMIT:+--commit "$TILEFUSE_COMMIT"}
        done
        cp -r tilefuse/configs "$R/configs"
        ;;
    heldout) step heldout_w1 150 "$PY" -m benchmarks heldout --world 1 --n 6 --budget-s 65 --out "$R/heldout_w1.csv" ;;
    *) echo "unknown part: $part (host, tests, parity, suite, tune, heldout)" >&2; exit 2 ;;
    esac
done
pack
grep -h "^==" "$R"/*.log "$R"/tests/*.txt 2>/dev/null | cut -c1-160
