#!/usr/bin/env bash
# One device call (repo root, $OUT set, carry .cache/upstream and .cache/triton.tgz): forms
# without the tensor cores at 1-2 rows against the MMA form. The GPU test of both forms of
# the FP8 linears and MoE against the reference, then tiling_probe's variants in the layer:
#   bash benchmark/gemv_ab.sh [variants]   # default: every moe_/linear_/bf16_ GEMV variant
set -u
source benchmark/device_env.sh
timeout 150 python3 -m pytest test/srt/kernels -q -k "tensor_cores" > "$L/pytest_gemv.log" 2>&1
echo "pytest rc=$?"; tail -3 "$L/pytest_gemv.log"
variants=${1:-$(python3 -c "from benchmark.tiling_probe import VARIANTS as V; print(','.join(['baseline'] + [n for n in V if n.startswith(('moe_', 'linear_gemv', 'bf16_'))]))")}
timeout 330 python3 -m benchmark.tiling_probe --kinds moe,dense,moe_idx --ms 1,2 \
  --variants "$variants" --out "$OUT" > "$L/tiling_gemv.log" 2>&1
echo "tiling_probe rc=$?"; grep -E "M=" "$L/tiling_gemv.log" | tail -100
tar czf "$OUT/logs.tgz" -C .cache logs
