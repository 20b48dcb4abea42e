"""Hopper (sm_90) kernels in CuTe DSL, where measurement shows the portable kernel falls short.

Importing this package imports no CuTe DSL: the kernels' modules do, when a caller opts in.
"""

from __future__ import annotations

import os
from typing import Optional

# "1": the fused layer's o_proj runs on fp8_mma (launched programmatically dependent, a
# RING_SLOTS ring) instead of the Triton fp8_linear. Opt-in until it is timed in the layer.
O_PROJ_ENV = "SGL_KERNEL_EXT_SM90_O_PROJ"
O_PROJ: Optional[bool] = None  # None: the environment decides; set by benchmark/tiling_probe
# fp8_mma's ring when launched dependent: about 90 KB, so the next launch's CTA fits beside it
# (H200, sm90_gemv_probe_20261202T081912Z: 10-12 slots fastest, the whole 200 KB slower)
RING_SLOTS = 10


def o_proj_enabled() -> bool:
    """Read when a layer is built."""
    return O_PROJ if O_PROJ is not None else os.environ.get(O_PROJ_ENV, "0") == "1"


def refusal(device) -> Optional[str]:
    """Why the CuTe DSL kernels cannot run on `device` (None: they can)."""
    import torch

    if device.type != "cuda" or not torch.cuda.is_available():
        return f"{O_PROJ_ENV}=1 needs a CUDA device, the layer's weights are on {device}"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return (f"{O_PROJ_ENV}=1 needs a Hopper GPU (sm_90), this one is sm_"
                f"{''.join(map(str, torch.cuda.get_device_capability(device)))}")
    try:
        import cutlass.cute  # noqa: F401
    except ImportError as exc:
        return f"{O_PROJ_ENV}=1 needs CuTe DSL (nvidia-cutlass-dsl): {exc}"
    return None
