# Sourced by the device-call scripts (repo root, $OUT set): the import path the GPU machine
# needs (no SGLang there; CuTe DSL where sm90_run.sh installed it), a Triton cache restored
# from a carried .cache/triton.tgz (a previous call's), $L, a folder for logs that a script
# tars into $OUT at its end (a call brings back at most 8 files), and sanitize /
# sanitize_fused_layer (compute-sanitizer's two tools).
export PYTHONPATH=python:sgl-kernel-ext:.
# CuTe DSL where benchmark/sm90_run.sh installed it (the layer then takes its kernels)
if [ -d /tmp/site/nvidia_cutlass_dsl ]; then
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
fi
export TRITON_CACHE_DIR="$PWD/.cache/triton"
L="$PWD/.cache/logs"
mkdir -p "$TRITON_CACHE_DIR" "$L"
# the device's copy of the tree may carry a stale .git: results name BENCH_COMMIT when set
if [ -z "${BENCH_COMMIT:-}" ]; then
  echo "warning: BENCH_COMMIT unset; results will name this copy's HEAD, which may be stale" >&2
fi
if [ -f .cache/triton.tgz ]; then tar xzf .cache/triton.tgz -C .cache && echo "triton cache restored"; fi

# compute-sanitizer memcheck and racecheck on a python command, each within $1 seconds, logs
# in $L named by $2
sanitize() {  # seconds a tool, a log tag, the python3 command's arguments
  if ! command -v compute-sanitizer >/dev/null; then echo "compute-sanitizer not found"; return; fi
  local tool
  local limit=$1 tag=$2
  shift 2
  for tool in memcheck racecheck; do
    # --report-api-errors no: CuTe DSL's driver bindings (cuda-python) probe cuGetProcAddress
    # for symbols this driver lacks, host API errors that are not the kernels' (34 of them
    # made memcheck's rc 9 at 7c3d111, no device error among them)
    local log="$L/sanitizer_$tool${tag:+_$tag}.log"
    timeout "$limit" compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 \
      python3 "$@" > "$log" 2>&1
    echo "compute-sanitizer $tool ${tag:-} rc=$?"; grep -v "^$" "$log" | tail -3
  done
}

# the fused layer at small shapes (sanitize_fused_layer.py's arguments, also the log's tag)
sanitize_fused_layer() {  # seconds a tool [, the script's arguments]
  local limit=$1
  shift
  local tag="$*"
  sanitize "$limit" "${tag// /_}" test/srt/kernels/sanitize_fused_layer.py "$@"
}
