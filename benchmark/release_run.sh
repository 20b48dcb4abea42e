#!/usr/bin/env bash
# The device calls that close a change (repo root, $OUT set, carry .cache/upstream and
# .cache/triton.tgz), in two parts that each fit one call:
#   bash benchmark/release_run.sh tests   # the GPU suite, compute-sanitizer memcheck and
#                                         # racecheck, the layer table (stock and fused)
#   bash benchmark/release_run.sh bench   # the 78-layer step, each kernel's share of the
#                                         # layer's critical path (graph_timeline)
# Logs go into $OUT/logs.tgz; JSON results into $OUT.
set -u
source benchmark/device_env.sh
case "${1:-}" in
  tests)
    timeout 280 python3 -m pytest test/srt/kernels -q -k "not sanitize" > "$L/pytest.log" 2>&1
    echo "pytest rc=$?"; tail -3 "$L/pytest.log"
    if command -v compute-sanitizer >/dev/null; then
      for tool in memcheck racecheck; do
        timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 \
          python3 test/srt/kernels/sanitize_fused_layer.py > "$L/sanitizer_$tool.log" 2>&1
        echo "compute-sanitizer $tool rc=$?"; tail -3 "$L/sanitizer_$tool.log"
      done
    else
      echo "compute-sanitizer not found"
    fi
    timeout 120 python3 -m benchmark.decode_layer --replays 10 --check --ls 2048 \
      --ms 1,2,4,8,16 --arms stock,fused --out "$OUT" > "$L/decode_layer.log" 2>&1
    echo "decode_layer rc=$?"; grep -E "check|^\|" "$L/decode_layer.log" | tail -40
    ;;
  bench)
    timeout 200 python3 -m benchmark.decode_step --out "$OUT" > "$L/decode_step.log" 2>&1
    echo "decode_step rc=$?"; tail -14 "$L/decode_step.log"
    timeout 90 python3 -m benchmark.graph_timeline --out "$OUT" --kinds moe dense --rows 1 16 \
      > "$L/graph_timeline.log" 2>&1
    echo "graph_timeline rc=$?"; tail -50 "$L/graph_timeline.log"
    ;;
  *) echo "usage: release_run.sh tests|bench" >&2; exit 2 ;;
esac
tar czf "$OUT/logs.tgz" -C .cache logs
tar czf "$OUT/triton.tgz" -C .cache triton 2>/dev/null
