#!/usr/bin/env bash
# Everything in one device run: environment, the multi-rank test suite on the GPU, bandwidth, the world-1 suite,
# and a short summary printed LAST (the device tool returns only the tail of the output).
#
#   bash benchmarks/runs/check_all.sh [quick|full]        (run from the repository root)
#
# Everything goes under $OUT (default ./bench_out), at most 8 files:
#   env.txt  tests.log  bandwidth.csv  bandwidth.log  suite_w1.csv  suite_w1.log  summary.txt
#   (+ tp_mlp.csv when STAGES names "mlp", whose log goes to suite_w1.log; + demo.log for "demo")
# Every stage runs under `timeout`, against one deadline (BUDGET_S seconds from the start, default
# 560: the device tool's limit is 600); a stage that fails or times out does not stop the next.
# Knobs (environment):
#   OUT, BUDGET_S, PYTHON (default python3);
#   STAGES       default "env tests bandwidth ops mlp"; add "demo" to run examples/demo.py last;
#   TESTS_ARGS   extra pytest arguments, e.g. "tests/test_runtime.py" or "-k world";
#   TESTS_MAX_S  cap of the test stage (default 240 full / 180 quick; the whole budget when it is the
#                only stage left to run);
#   OPS_VARIANTS e.g. "auto,fused_sequential" (default: every registered variant but reference and
#                plain, and auto; the baselines always run);
#   TILEFUSE_COMMIT  the commit to record in the CSVs (the device's copy of the checkout may lack .git).
# Without a GPU the GPU test suite is skipped and the benchmarks run their tiny CPU smoke sets.
# Exit status: 1 when any stage failed or timed out (a wrong result makes a benchmark stage fail).
set -u -o pipefail

MODE=${1:-quick}
case "$MODE" in quick|full) ;; *) echo "usage: bash benchmarks/runs/check_all.sh [quick|full]" >&2; exit 2 ;; esac
OUT=${OUT:-./bench_out}
mkdir -p "$OUT"
rm -f "$OUT"/env.txt "$OUT"/tests.log "$OUT"/bandwidth.csv "$OUT"/bandwidth.log \
      "$OUT"/suite_w1.csv "$OUT"/suite_w1.log "$OUT"/summary.txt "$OUT"/demo.log "$OUT"/tp_mlp.csv
export PYTHONUNBUFFERED=1
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off (a program that uses it can put a shared host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-$(command -v python3 || command -v python)}
STAGES=${STAGES:-"env tests bandwidth ops mlp"}
BUDGET_S=${BUDGET_S:-560}
START=$(date +%s)
STATUS=()
ANY_FAILED=0

elapsed() { echo $(( $(date +%s) - START )); }

# stage_limit MAX RESERVE: seconds this stage may take: at most MAX, and leave RESERVE for later stages.
stage_limit() {
    local left=$(( BUDGET_S - $(elapsed) - $2 ))
    (( left > $1 )) && left=$1
    (( left < 15 )) && left=15
    echo "$left"
}

# run_stage NAME LIMIT LOG CMD...: run CMD under timeout, tee its output into LOG, record the outcome.
run_stage() {
    local name=$1 limit=$2 log=$3
    shift 3
    local t0 rc
    t0=$(date +%s)
    echo "=== $name: $* (limit ${limit}s) ===" | tee -a "$log"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log"
    rc=$?
    local took=$(( $(date +%s) - t0 ))
    local what="ok"
    if (( rc == 124 || rc == 137 )); then what="TIMED OUT"; elif (( rc != 0 )); then what="FAILED rc=$rc"; fi
    (( rc != 0 )) && ANY_FAILED=1
    STATUS+=("$(printf '%-34s %-14s %4ss' "$name" "$what" "$took")")
    echo "=== $name: $what after ${took}s ===" | tee -a "$log"
}

has_stage() { [[ " $STAGES " == *" $1 "* ]]; }

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    GPU=1
else
    GPU=0
fi

# Per-stage caps in seconds (a stage also stops at the shared deadline, keeping the caps of the
# enabled stages after it in reserve).
if [[ $MODE == full ]]; then
    TESTS_MAX=${TESTS_MAX_S:-240}; PER_TEST=150; BW_SIZES=default; BW_MAX=60
    OPS_SETS=llama3-8b,iris; OPS_REPS=2; OPS_MAX=(120 75 75)
else
    TESTS_MAX=${TESTS_MAX_S:-180}; PER_TEST=120; BW_SIZES=quick; BW_MAX=45
    OPS_SETS=llama3-8b; OPS_REPS=1; OPS_MAX=(90 60 60)
fi
DEMO_MAX=120
MLP_MAX=60
if (( GPU == 0 )); then
    BW_SIZES=small; OPS_SETS=tiny; OPS_REPS=1
fi

stage_max() {
    case $1 in
        tests) echo "$TESTS_MAX" ;;
        bandwidth) echo "$BW_MAX" ;;
        ops) echo $(( OPS_MAX[0] + OPS_MAX[1] + OPS_MAX[2] )) ;;
        mlp) echo "$MLP_MAX" ;;
        demo) echo "$DEMO_MAX" ;;
    esac
}

# reserve_after NAME: the caps of the enabled stages that run after NAME.
reserve_after() {
    local total=0 seen=0 s
    for s in tests bandwidth ops mlp demo; do
        if (( seen )) && has_stage "$s"; then total=$(( total + $(stage_max "$s") )); fi
        [[ $s == "$1" ]] && seen=1
    done
    echo "$total"
}

# ---------------------------------------------------------------- env
if has_stage env; then
    {
        echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  mode: $MODE  gpu: $GPU  host: $(hostname)"
        echo "commit: $("$PY" -c 'from benchmarks.results import commit_id; print(commit_id())' 2>&1)"
        echo "--- nvidia-smi"
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi 2>&1
            nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,memory.used,memory.total --format=csv 2>&1
        else
            echo "no nvidia-smi"
        fi
        echo "--- python"
        "$PY" - <<'EOF' 2>&1
import platform, torch, triton
print("python", platform.python_version(), "torch", torch.__version__, "triton", triton.__version__,
      "cuda", torch.version.cuda)
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"gpu {i}: {p.name}, {p.multi_processor_count} SMs, cc {p.major}.{p.minor}, "
              f"{p.total_memory / 2**30:.1f} GiB, L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB")
for name in ("pandas", "numpy", "pytest", "pytest_timeout"):
    try:
        mod = __import__(name)
        print(name, getattr(mod, "__version__", "?"))
    except ImportError as err:
        print(name, "MISSING", err)
EOF
        echo "--- environment"
        env | grep -E '^(TILEFUSE_|TRITON_|CUDA_|NCCL_|TORCH_)' | sort
    } > "$OUT/env.txt" 2>&1
    STATUS+=("$(printf '%-34s %-14s %4ss' env ok "$(elapsed)")")
    head -n 3 "$OUT/env.txt"
fi

# ---------------------------------------------------------------- tests (GPU only)
if has_stage tests; then
    if (( GPU == 1 )); then
        reserve=$(reserve_after tests)
        cap=$TESTS_MAX
        # Alone in the call (and no cap asked for): the tests may use the whole budget.
        (( reserve == 0 )) && [[ -z ${TESTS_MAX_S:-} ]] && cap=$BUDGET_S
        limit=$(stage_limit "$cap" "$reserve")
        per_test=()
        if "$PY" -c "import pytest_timeout" 2>/dev/null; then
            per_test=(--timeout "$PER_TEST")
        else
            echo "pytest-timeout missing: only the stage limit applies" | tee -a "$OUT/tests.log"
        fi
        # shellcheck disable=SC2086
        TILEFUSE_TEST_DEVICE=cuda run_stage "tests (cuda, W=1..4)" "$limit" "$OUT/tests.log" \
            "$PY" -m pytest tests -q -x ${per_test[@]+"${per_test[@]}"} -p no:cacheprovider --durations=15 ${TESTS_ARGS:-}
    else
        echo "no GPU: skipping the GPU test suite (the CPU suite is: python -m pytest tests)" | tee "$OUT/tests.log"
        STATUS+=("$(printf '%-34s %-14s' tests 'skipped (no GPU)')")
    fi
fi

# ---------------------------------------------------------------- bandwidth
if has_stage bandwidth; then
    limit=$(stage_limit "$BW_MAX" "$(reserve_after bandwidth)")
    run_stage "bandwidth (world 1)" "$limit" "$OUT/bandwidth.log" \
        "$PY" -m benchmarks bandwidth --world 1 --sizes "$BW_SIZES" --csv "$OUT/bandwidth.csv"
fi

# ---------------------------------------------------------------- the suite at world 1 (one process per op)
if has_stage ops; then
    ops=(gemm_all_scatter all_gather_gemm gemm_reduce_scatter)
    for i in 0 1 2; do
        reserve=$(reserve_after ops)
        for (( j = i + 1; j < 3; j++ )); do reserve=$(( reserve + OPS_MAX[j] )); done
        limit=$(stage_limit "${OPS_MAX[i]}" "$reserve")
        variants=()
        [[ -n ${OPS_VARIANTS:-} ]] && variants=(--variants "$OPS_VARIANTS")
        run_stage "suite w1 ${ops[i]}" "$limit" "$OUT/suite_w1.log" \
            "$PY" -m benchmarks world1 --ops "${ops[i]}" --sets "$OPS_SETS" --reps "$OPS_REPS" \
            --csv "$OUT/suite_w1.csv" --append --no-progress ${variants[@]+"${variants[@]}"}
    done
fi

# ---------------------------------------------------------------- TP MLP forward+backward
if has_stage mlp; then
    size=8b
    (( GPU == 0 )) && size=tiny
    run_stage "tp_mlp ($size, world 1)" "$(stage_limit "$MLP_MAX" "$(reserve_after mlp)")" "$OUT/suite_w1.log" \
        "$PY" -m benchmarks tp --size "$size" --world 1 --csv "$OUT/tp_mlp.csv"
fi

# ---------------------------------------------------------------- demo (only when STAGES names it)
if has_stage demo; then
    run_stage "demo (examples/demo.py)" "$(stage_limit "$DEMO_MAX" 0)" "$OUT/demo.log" "$PY" examples/demo.py
fi

# ---------------------------------------------------------------- summary, last
{
    echo "################ runs/check_all.sh $MODE: summary (gpu=$GPU, $(elapsed)s, OUT=$OUT)"
    printf '%s\n' "${STATUS[@]}"
    echo
    "$PY" -m benchmarks summary "$OUT" 2>&1
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"
exit "$ANY_FAILED"  # 1 when any stage failed or timed out
