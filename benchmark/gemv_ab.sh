#!/usr/bin/env bash
# One device call (repo root, $OUT set, carry .cache/upstream and .cache/triton.tgz): the
# linears and the MoE without the tensor cores at 1-2 rows against the MMA form. The GPU test
# of both forms against the reference, then tiling_probe's GEMV variants in the layer.
set -u
source benchmark/device_env.sh
timeout 150 python3 -m pytest test/srt/kernels -q -k "tensor_cores" > "$L/pytest_gemv.log" 2>&1
echo "pytest rc=$?"; tail -3 "$L/pytest_gemv.log"
variants=$(python3 -c "from benchmark.tiling_probe import VARIANTS as V; print(','.join(['baseline'] + [n for n in V if n.startswith(('moe_', 'linear_gemv'))]))")
timeout 330 python3 -m benchmark.tiling_probe --kinds moe,dense --ms 1,2 --variants "$variants" \
  --out "$OUT" > "$L/tiling_gemv.log" 2>&1
echo "tiling_probe rc=$?"; grep -E "M=" "$L/tiling_gemv.log" | tail -100
timeout 90 python3 -m benchmark.tiling_probe --kinds moe_idx --ms 1,2 \
  --variants baseline,moe_dot --out "$OUT" > "$L/tiling_gemv_idx.log" 2>&1
echo "tiling_probe moe_idx rc=$?"; grep -E "M=" "$L/tiling_gemv_idx.log" | tail -10
tar czf "$OUT/logs.tgz" -C .cache logs
tar czf "$OUT/triton.tgz" -C .cache triton 2>/dev/null
