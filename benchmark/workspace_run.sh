#!/usr/bin/env bash
# One device call (repo root, $OUT set, carry .cache/upstream and .cache/triton.tgz): the GPU
# tests of the shared workspace and of the reference match, compute-sanitizer memcheck (route
# per row is new), then the 78-layer step with the layers sharing one workspace. About 5
# minutes once the machine is up.
set -u
source benchmark/device_env.sh
timeout 90 python3 -m pytest test/srt/kernels -q -x -k "workspace or (matches_reference and moe and 16)" \
  > "$L/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$L/pytest.log"
if command -v compute-sanitizer >/dev/null; then
  timeout 45 compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 test/srt/kernels/sanitize_fused_layer.py > "$L/sanitizer_memcheck.log" 2>&1
  echo "compute-sanitizer memcheck rc=$?"; tail -2 "$L/sanitizer_memcheck.log"
fi
timeout 120 python3 -m benchmark.decode_step --out "$OUT" > "$L/decode_step.log" 2>&1
echo "decode_step rc=$?"; grep -E "^\| step|workspace" "$L/decode_step.log"
tar czf "$OUT/logs.tgz" -C .cache logs
