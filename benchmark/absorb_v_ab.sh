#!/usr/bin/env bash
# The next device call, prepared and not yet run (repo root, $OUT set, carry .cache/upstream
# and .cache/triton.tgz): the GPU tests (absorb_v in latent chunks against the reference among
# them), the A/B of absorb_v over 2/4/8 latent chunks (mla.ABSORB_V_SPLIT_C, a last-arrival
# sum), with and without those programs merging the attention's chunks (ABSORB_V_MERGES), at
# 1-16 rows on every kind, then compute-sanitizer racecheck of the layer with both on.
# About 6 minutes once the machine is up.
set -u
source benchmark/device_env.sh
export PYTHONUNBUFFERED=1
timeout 150 python3 -m benchmark.tiling_probe --kinds moe,moe_idx,dense --ms 1,2,4,16 --out "$OUT" \
  --variants baseline,absorb_v_split_2,absorb_v_split_4,absorb_v_split_8,absorb_v_split_4_merge,absorb_v_split_8_merge,baseline \
  > "$L/tiling_probe.log" 2>&1
echo "tiling_probe rc=$?"; grep " us$" "$L/tiling_probe.log" | cut -c12-
timeout 300 python3 -m pytest test/srt/kernels -q -x -k "not sanitize" > "$L/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$L/pytest.log"
if command -v compute-sanitizer >/dev/null; then
  timeout 80 compute-sanitizer --tool racecheck --error-exitcode 9 \
    python3 test/srt/kernels/sanitize_fused_layer.py 4 merge > "$L/sanitizer_racecheck.log" 2>&1
  echo "racecheck rc=$?"; tail -2 "$L/sanitizer_racecheck.log"
fi
tar czf "$OUT/logs.tgz" -C .cache logs
