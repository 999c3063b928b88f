#!/usr/bin/env bash
# One GPU, world 1: all_gather_gemm's tile loops without flags (fused_sequential's, the push variants'
# local shard read from `a`) on the GEMM core's flattened loop, timed twice; then the tests that
# cover them, ranks sharing the GPU. With OPS and BASE it is the world-1 A/B of any op against a
# copy of the package at another commit (gemm_all_scatter's result off the heap was measured so).
#   TILEFUSE_COMMIT=<sha> bash benchmarks/runs/agg_flatten_check.sh      (from the repository root)
# 1. The world-1 suite of all_gather_gemm on SHAPES (default 8192x6144x4096 and 8192x28672x4096, the
#    Llama-3-8B qkv and gate-up shapes at 8192 tokens): every variant, the copy-engine form and the
#    plain_again control, flattened, twice (with BASE: the base package between the two)
#    (SUITE_S seconds each, default 100).
#    BASE=<dir>: the middle run imports tilefuse from <dir> instead (a copy of the package at another
#    commit: `mkdir <dir> && git archive <sha> tilefuse | tar x -C <dir>`; BASE_COMMIT=<sha> records
#    it), with CSV suite_w1_base.csv.
#    VARIANTS: the methods (default every variant, the copy-engine form and plain_again); OPS: the
#    ops (default all_gather_gemm); SUITE_ARGS: more suite arguments (e.g. --no-heap-out).
# HOST_OPS=<ops>: then the host cost of their calls at M = 1, 16, 128 (N = 4096, K = 8192; HOST_S
#    seconds, default 60), here and, with BASE, from the copy: host_path.csv, host_path_base.csv.
# 2. The tests of TESTS (default: all_gather_gemm, program counts, the GEMM core's flattened-loop test)
#    in the rest of LIMIT_S (default 570 s).
# Files under $R: suite_w1_flat.csv (and suite_w1_base.csv), tests/.
source "$(dirname "$0")/prelude.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
END=$(( T0 + ${LIMIT_S:-570} ))
SHAPES=${SHAPES:-8192x6144x4096,8192x28672x4096}
V=${VARIANTS:-bulk_sync,producer_consumer,copy_engine,fused_sequential,wg_specialized,plain_again}
suite() {  # suite NAME CSV [env ARGUMENTS...]
    local name=$1 csv=$2
    shift 2
    step "$name" "${SUITE_S:-100}" env "$@" "$PY" -m benchmarks world1 --ops "${OPS:-all_gather_gemm}" \
        --shapes "$SHAPES" --variants "$V" --csv "$csv" --append --no-progress ${SUITE_ARGS:-}
}
host() {  # host NAME CSV [env ARGUMENTS...]
    local name=$1 csv=$2
    shift 2
    step "$name" "${HOST_S:-60}" env "$@" "$PY" -m benchmarks host_path --real-launches --ops "$HOST_OPS" \
        --M 1,16,128 --N 4096 --K 8192 --calls 100 --rounds 7 --csv "$csv"
}
suite suite_flat_1 "$R/suite_w1_flat.csv"
if [[ -n ${BASE:-} ]]; then
    # Run from inside BASE: a Python started with -m puts its working directory first on the path.
    B=$(cd "$BASE" && pwd)
    [[ $PY == */* && $PY != /* ]] && PY=$(pwd)/$PY
    IN_BASE=(-C "$B" PYTHONPATH="$B:$(pwd)" TILEFUSE_COMMIT="${BASE_COMMIT:-${TILEFUSE_COMMIT:-}}")
    suite suite_base "$(cd "$R" && pwd)/suite_w1_base.csv" "${IN_BASE[@]}"
fi
suite suite_flat_2 "$R/suite_w1_flat.csv"
if [[ -n ${HOST_OPS:-} ]]; then
    host host_path "$R/host_path.csv"
    [[ -n ${BASE:-} ]] && host host_path_base "$(cd "$R" && pwd)/host_path_base.csv" "${IN_BASE[@]}"
fi
tests_in_rest "${TESTS:-tests/test_all_gather_gemm.py;tests/test_program_counts.py tests/test_gemm_core.py::test_matmul_flattened_loop_and_descriptor_stores_keep_the_bits}"
pack
grep -h "^==\|Error\|FAIL" "$R"/*.log | cut -c1-200
tail -5 "$R/tests/tests_summary.txt" 2>/dev/null
for f in "$R"/suite_w1_*.csv; do echo "# $f"; "$PY" -m benchmarks summary --markdown "$f" 2>&1 | tail -n 20; done
