"""Run the tests against this checkout's overlay and extension, not a stale install.

Without a GPU, Triton kernels run in its CPU interpreter (TRITON_INTERPRET=1).

The fork installs the overlay (``python/sglang/...``) into the upstream ``sglang`` package.
Here the checkout's overlay directory is put first on ``sglang.__path__`` (``sglang.srt`` and
below are namespace packages upstream, so they merge), and ``sgl-kernel-ext`` first on
``sys.path``. Without an installed ``sglang`` (the GPU machine), ``python/`` goes on
``sys.path`` instead and ``sglang`` is a namespace package made of the overlay alone.
"""

import importlib.util
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

# Triton reads this when a kernel is defined: without a GPU, kernels run in its interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
OVERLAY = REPO / "python"

sys.path.insert(0, str(REPO / "sgl-kernel-ext"))
sys.path.insert(0, str(REPO))  # tools/ and benchmark/ import as packages

_spec = importlib.util.find_spec("sglang")
if _spec is None or _spec.origin in (None, "namespace"):
    sys.path.insert(0, str(OVERLAY))
else:
    import sglang

    if str(OVERLAY / "sglang") not in sglang.__path__:
        sglang.__path__.insert(0, str(OVERLAY / "sglang"))
