# Sourced by the device-call scripts (repo root, $OUT set): the import path the GPU machine
# needs (no SGLang there), a Triton cache restored from a carried .cache/triton.tgz (a previous
# call's), and $L, a folder for logs that a script tars into $OUT at its end (a call brings
# back at most 8 files).
export PYTHONPATH=python:sgl-kernel-ext:.
export TRITON_CACHE_DIR="$PWD/.cache/triton"
L="$PWD/.cache/logs"
mkdir -p "$TRITON_CACHE_DIR" "$L"
if [ -f .cache/triton.tgz ]; then tar xzf .cache/triton.tgz -C .cache && echo "triton cache restored"; fi
