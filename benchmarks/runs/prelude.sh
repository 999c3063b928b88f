# Sourced by the device-call scripts in this folder: environment, output folder $R under $OUT, stamp().
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-./bench_out}
R=$OUT/r
mkdir -p "$R"
T0=$(date +%s)
stamp() { echo "== $1 rc=$2 at $(( $(date +%s) - T0 ))s"; }
