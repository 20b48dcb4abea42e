#!/usr/bin/env bash
# One device call (repo root, $OUT set): the persistent layer kernel's MoE layer at M=1 and 16
# for several (warps per program, programs per SM), with the compiled kernel's registers and
# spills logged. Usage: bash benchmark/persistent_probe.sh "8:1 4:1 4:2 16:1"
set -u
export PYTHONPATH=python:sgl-kernel-ext:. SGL_KERNEL_EXT_PERSISTENT=1
for cfg in ${1:-8:1 4:1 4:2 16:1}; do
  export SGL_KERNEL_EXT_PERSISTENT_WARPS=${cfg%:*} SGL_KERNEL_EXT_PERSISTENT_PER_SM=${cfg#*:}
  log="$OUT/probe_w${cfg%:*}_c${cfg#*:}.log"
  timeout 150 python3 -c "import logging, runpy, sys; logging.basicConfig(level=logging.INFO); sys.argv = ['decode_layer', '--kinds', 'moe', '--ms', '1,16', '--ls', '2048', '--replays', '10', '--arms', 'fused', '--out', sys.argv[1]]; runpy.run_module('benchmark.decode_layer', run_name='__main__')" "$OUT" > "$log" 2>&1
  echo "== warps ${cfg%:*} per_sm ${cfg#*:} rc=$?"; grep -E "persistent layer kernel|\| moe" "$log" | cut -c1-250
done
