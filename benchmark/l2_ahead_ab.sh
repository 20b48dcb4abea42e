#!/usr/bin/env bash
# A device call (repo root, $OUT set): the L2-ahead hints' GPU test (bitwise the layer
# without them), then their A/B in the layer at 4-16 rows, every kind: mla's whole-chunk KV
# prefetch (ATTN_L2_AHEAD_FROM_STEPS) and the linears' weight-tile prefetch without the
# overlap (fp8_linear.L2_AHEAD_UNOVERLAPPED). About 6 minutes once the machine is up.
set -u
source benchmark/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest test/srt/kernels/test_fused_layer.py -q -x \
  -k "l2_prefetch_ahead or column_tiles" > "$L/pytest_l2_ahead.log" 2>&1
echo "pytest rc=$?"; tail -3 "$L/pytest_l2_ahead.log"
timeout 320 python3 -m benchmark.tiling_probe --kinds moe,moe_idx,dense --ms ${1:-4,8,12,16} \
  --out "$OUT" --variants baseline,attn_l2_ahead,attn_l2_ahead_from_2,linear_l2_ahead,l2_ahead_both,baseline \
  > "$L/tiling_probe.log" 2>&1
echo "tiling_probe rc=$?"; grep " us$" "$L/tiling_probe.log" | cut -c12-
tar czf "$OUT/logs.tgz" -C .cache logs
