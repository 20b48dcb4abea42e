"""Hopper (sm_90) kernels in CuTe DSL, where measurement shows the portable kernel falls short.

Importing this package imports no CuTe DSL: the kernels' modules do, when a caller opts in.
"""

from __future__ import annotations

import os
from typing import Optional

# "1": the fused layer's o_proj / q_a|kv_a run on fp8_mma (launched programmatically
# dependent, a RING_SLOTS ring) instead of the Triton fp8_linear (q_a|kv_a: in the steps
# where no row tails follow it, from 3 rows or in a layer with the indexer). Opt-in until
# they are timed in the layer. Read when a layer is built; benchmark/tiling_probe sets the
# module attributes (None: the environment decides).
O_PROJ_ENV = "SGL_KERNEL_EXT_SM90_O_PROJ"
QKV_A_ENV = "SGL_KERNEL_EXT_SM90_QKV_A"
O_PROJ: Optional[bool] = None
QKV_A: Optional[bool] = None
# "1": a MoE layer's experts run on fp8_moe (gate/up + SwiGLU + the down input's quant, then
# down) instead of triton.moe's gate_up and down; a dense MLP keeps Triton's. Opt-in: on an
# H200 the MoE layer is slower with it at every row count but 2: 64.0 / 74.7 / 98.4 / 135.1 /
# 197.9 us against Triton's 61.5 / 75.4 / 95.4 / 130.2 / 168.3 at 1 / 2 / 4 / 8 / 16 rows
# (results/tiling_probe_20261202T125957Z); alone, launched as the layer does, 1-10% slower
# at 1-16 rows (sm90_moe_probe_20261202T130222Z).
MOE_ENV = "SGL_KERNEL_EXT_SM90_MOE"
MOE: Optional[bool] = None
# with MOE: gate/up and down in one launch (fp8_moe.experts: down's weights stream while the
# activations are made) rather than two: on an H200 3.3-8.0 us faster a MoE layer at 2-16 rows,
# the same at one (tiling_probe_20261202T125957Z: sm90_moe_two_launches)
MOE_ONE_LAUNCH = True
# "1": the sparse attention runs on sparse_mla (the heads as wgmma's N, a warpgroup gathering
# KV rows) instead of triton.mla's kernel at ATTN_FROM_ROWS..ATTN_MAX_ROWS rows; the Triton
# combine or absorb_v's merge follows either. Opt-in. On an H200 (results/
# tiling_probe_20261202T171639Z, code at 9d37e48, 2 stages) a layer is 1.8-2.3 us faster at 4
# and 8 rows (MoE), 0.4-4.5 (dense), within noise at 1 and 12, 0.7-1.2 slower at 16 (again at
# 28b320a, tiling_probe_20261202T201751Z: -1.4 / -2.5 MoE, 0 / -4.5 dense at 4 / 8); alone
# (sm90_attn_probe_20261202T171634Z) the kernel is 15.7 / 21.1 us against Triton's 21.0 /
# 26.3 at 12 / 16 rows, 1.3-1.6 us slower at 1-2 (one 64-entry step a CTA: its three
# dependent loads and one step's MMAs are the whole kernel). Likely why the layer gains less
# (not measured): its CTA (155 KB of shared memory with 2 stages, 227 KB with 3) cannot start
# beside the previous kernel's, so the dependent launch's early gather buys little, where
# Triton's kernel asks L2 for its chunk's rows before its wait.
ATTN_ENV = "SGL_KERNEL_EXT_SM90_ATTN"
ATTN: Optional[bool] = None
ATTN_FROM_ROWS = 3
ATTN_MAX_ROWS = 8
# sparse_mla's KV tiles in flight (72 KB each): 2 against 3 within -1.0..+0.6 us a layer at
# 1-16 rows except dense 4 and 8 rows, 3.8 and 4.3 faster (same results)
ATTN_STAGES = 2
# sparse_mla's steps signalled by their copies' completion (SparseMla.noinc): not yet run on a
# GPU with the slot lookups that no longer wait
ATTN_NOINC = False
# sparse_mla launched programmatically dependent (with the layer's overlap); without it the
# layer is 2.5-3.6 us slower at 1-4 rows, the same at 12-16 (tiling_probe_20261202T201751Z)
ATTN_PDL = True
# fp8_mma's ring when launched dependent: about 90 KB, so the next launch's CTA fits beside it
# (H200, sm90_gemv_probe_20261202T081912Z: 10-12 slots fastest, the whole 200 KB slower)
RING_SLOTS = 10


def o_proj_enabled() -> bool:
    return O_PROJ if O_PROJ is not None else os.environ.get(O_PROJ_ENV, "0") == "1"


def qkv_a_enabled() -> bool:
    return QKV_A if QKV_A is not None else os.environ.get(QKV_A_ENV, "0") == "1"


def moe_enabled() -> bool:
    return MOE if MOE is not None else os.environ.get(MOE_ENV, "0") == "1"


def attn_enabled() -> bool:
    return ATTN if ATTN is not None else os.environ.get(ATTN_ENV, "0") == "1"


def refusal(device, what: str) -> Optional[str]:
    """Why the CuTe DSL kernels cannot run `what` (an opt-in's name) on `device` (None: they
    can)."""
    import torch

    if device.type != "cuda" or not torch.cuda.is_available():
        return f"{what} needs a CUDA device, the layer's weights are on {device}"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return (f"{what} needs a Hopper GPU (sm_90), this one is sm_"
                f"{''.join(map(str, torch.cuda.get_device_capability(device)))}")
    try:
        import cutlass.cute  # noqa: F401
    except ImportError as exc:
        return f"{what} needs CuTe DSL (nvidia-cutlass-dsl): {exc}"
    return None
