#!/usr/bin/env bash
# A device call (repo root, $OUT set, carry .cache/upstream and .cache/triton.tgz), kept as
# run at 9020fa4: the GPU tests, then the A/B of the layer-ahead L2 prefetch
# (overlap.LAYER_PREFETCH: a layer's first norm prefetches its dense weights;
# NEXT_LAYER_PREFETCH: its second norm prefetches the next layer's) at 1-16 rows, every kind.
# About 5 minutes once the machine is up.
set -u
source benchmark/device_env.sh
timeout 200 python3 -m pytest test/srt/kernels -q -x -k "not sanitize" > "$L/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$L/pytest.log"
timeout 200 python3 -m benchmark.tiling_probe --kinds dense,moe,moe_idx --ms 1,2,4,16 --out "$OUT" \
  --variants baseline,layer_prefetch,next_layer_prefetch,both_prefetch,baseline \
  > "$L/tiling_probe.log" 2>&1
echo "tiling_probe rc=$?"; grep " us$" "$L/tiling_probe.log" | cut -c12-
tar czf "$OUT/logs.tgz" -C .cache logs
