#!/usr/bin/env bash
# One device call (repo root, $OUT set): the persistent layer kernel's MoE layer (decode_layer's
# fused arm, SGL_KERNEL_EXT_PERSISTENT=1) beside the stage kernels (fused_stages) for several
# (warps per program, programs per SM), with the compiled kernel's registers and spills
# logged. Rows: $MS (default 1,16).
# Usage: bash benchmark/persistent_probe.sh "8:1 4:1 4:2 16:1"
set -u
export PYTHONPATH=python:sgl-kernel-ext:. SGL_KERNEL_EXT_PERSISTENT=1
for cfg in ${1:-8:1 4:1 4:2 16:1}; do
  IFS=: read -r warps per_sm <<< "$cfg"
  export SGL_KERNEL_EXT_PERSISTENT_WARPS=$warps SGL_KERNEL_EXT_PERSISTENT_PER_SM=$per_sm
  log="$OUT/probe_w${warps}_c${per_sm}.log"
  timeout "${PROBE_S:-280}" python3 -c "import logging, runpy, sys; logging.basicConfig(level=logging.INFO); sys.argv = ['decode_layer', '--kinds', 'moe', '--ms', sys.argv[2], '--ls', '2048', '--replays', '10', '--arms', 'fused,fused_stages', '--out', sys.argv[1]]; runpy.run_module('benchmark.decode_layer', run_name='__main__')" "$OUT" "${MS:-1,16}" > "$log" 2>&1
  echo "== warps $warps per_sm $per_sm rc=$?"
  grep -E "persistent layer kernel|\| moe" "$log" | cut -c1-250
done
