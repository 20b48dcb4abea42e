#!/usr/bin/env bash
# One device call (repo root, $OUT set, carry .cache/upstream and .cache/triton.tgz): the GPU
# tests, compute-sanitizer on the fused layer (overlap and tails on), where each kernel's time
# goes (eager, overlap off), the down tile A/B, the layer table at 2K and at 8K/32K.
# Logs go into one tarball ($OUT keeps few files). Under 10 minutes once the machine is up.
set -u
source benchmark/device_env.sh
timeout 200 python3 -m pytest test/srt/kernels -q -x -k "not sanitize" > "$L/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$L/pytest.log"
sanitize_fused_layer 70
SGL_KERNEL_EXT_PDL=0 timeout 60 python3 benchmark/fused_stages.py --out "$OUT" --rows 1 16 \
  > "$L/stages.log" 2>&1
echo "stages rc=$?"
timeout 40 python3 -m benchmark.tiling_probe --kinds moe --ms 1,4,16 --out "$OUT" \
  --variants baseline,down_block_256,baseline > "$L/tiling_probe.log" 2>&1
echo "tiling_probe rc=$?"; grep " us$" "$L/tiling_probe.log"
timeout 60 python3 -m benchmark.decode_layer --replays 10 --check --ls 2048 --ms 1,2,4,8,16 \
  --arms stock,fused --out "$OUT" > "$L/decode_layer.log" 2>&1
echo "decode_layer rc=$?"; grep -E "^\|" "$L/decode_layer.log"
timeout 60 python3 -m benchmark.decode_layer --replays 10 --kinds moe_idx,dense --ls 8192,32768 \
  --ms 1,16 --arms stock,fused --out "$OUT" > "$L/decode_layer_long.log" 2>&1
echo "decode_layer long rc=$?"; grep -E "^\| (moe_idx|dense)" "$L/decode_layer_long.log"
tar czf "$OUT/logs.tgz" -C .cache logs
