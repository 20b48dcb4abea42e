"""Hopper (sm_90) kernels in CuTe DSL, where measurement shows the portable kernel falls short.

Importing this package imports no CuTe DSL: the kernels' modules do, when a caller opts in.
"""

from __future__ import annotations

import os
from typing import Optional

# "1": the fused layer's o_proj / q_a|kv_a run on fp8_mma (launched programmatically
# dependent, a RING_SLOTS ring) instead of the Triton fp8_linear (q_a|kv_a: in the steps
# where no row tails follow it, from 3 rows or in a layer with the indexer). Opt-in: on an
# H200 with the defaults of 2026-12-04 (tiling_probe_20261204T033524Z; at 4e9af2d they were
# within +-2 us, T102054Z) a MoE layer is +3.1..+5.6 us with o_proj on it at 1-16 rows (with
# the indexer +3.7..+5.2), +4.0..+4.9 with q_a|kv_a from 4 rows (+3.0..+4.2 at 1-8 rows with
# the indexer, 0 at 16), +3.4..+10.3 with both. In the layer's timeline o_proj on it adds 9.4
# us at one row where Triton's adds 6.9, its CTAs resident only 3.7 us before absorb_v ends
# (graph_timeline_20261204T033710Z against T033653Z). Tried: o_proj launched before absorb_v's
# wait (absorb_v's programs letting it launch first, so its CTAs could fill their rings during
# the attention) and its ring in 4 or 6 slots: bitwise the same
# (results/pytest_o_proj_early_94f9730.log) and no faster, +2.9..+6.3 us a layer against
# Triton's o_proj as the plain opt-in's +3.2..+5.9 (tiling_probe_20261204T034329Z; code at
# 94f9730). Alone, launched dependent, fp8_mma is faster than Triton's o_proj at one row (5.0
# against 5.8 us, sm90_gemv_probe_20261202T081912Z): what costs in the layer is not its fill
# window, and is not yet known. Read when a layer is built; benchmark/tiling_probe sets the
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
# The sparse attention on sparse_mla (the heads as wgmma's N, a warpgroup gathering KV rows)
# instead of triton.mla's kernel at ATTN_FROM_ROWS..ATTN_MAX_ROWS rows; the Triton combine or
# absorb_v's merge follows either. On by default wherever it can run (a Hopper GPU, CuTe DSL,
# the stage kernels, 8 heads a rank; elsewhere the layer logs why it runs Triton's); "1"
# insists (a layer that cannot take it refuses to build, naming why), "0" turns it off. On an
# H200 (results/tiling_probe_20261202T204316Z, code at 9e54f0a, against Triton's beside it)
# a MoE layer is 1.3 / 1.8 / 4.2 / 1.7 / 2.4 us faster at 1 / 4 / 8 / 12 / 16 rows, a dense
# one 1.4 / 0.6 / 4.1 / 1.7 / 3.0; alone (sm90_attn_probe_20261202T204203Z) the kernel is
# 9.8 / 13.0 / 17.3 us against Triton's 12.7 / 20.5 / 26.1 at 8 / 12 / 16 rows, 0.8-1.0 us
# slower at 1-2 (the layer's dependent launch hides that: its gather starts before the wait).
ATTN_ENV = "SGL_KERNEL_EXT_SM90_ATTN"
ATTN: Optional[bool] = None
ATTN_FROM_ROWS = 1
ATTN_MAX_ROWS = 16
# sparse_mla's KV tiles in flight (72 KB each): 3 against 2 is up to 1.5 us slower a MoE layer
# at 4-16 rows (0.3 faster at one), 3.1 a dense one at 4-8 (tiling_probe_20261202T203715Z)
ATTN_STAGES = 2
# sparse_mla with two gathering warpgroups from this many rows, one below. On an H200 (code at
# ac3a1de, outputs bitwise the same) two are faster alone at every row count (15.1 / 12.4 /
# 9.4 / 5.4 / 4.8 us against 17.3 / 13.5 / 9.9 / 5.9 / 5.2 at 16 / 12 / 8 / 4 / 1 rows:
# sm90_attn_probe_20261203T042806Z) but in the layer only from 12 rows: a MoE layer -1.2 / -1.5
# us at 12 / 16 rows, a dense one -1.3 / -1.3; at 4-8 rows +0.2..+2.3 (tiling_probe_20261203T042925Z)
ATTN_GATHERERS_FROM_ROWS = 12
# sparse_mla launched programmatically dependent (with the layer's overlap); without it the
# layer is 2.5-3.6 us slower at 1-4 rows, the same at 12-16 (tiling_probe_20261202T201751Z)
ATTN_PDL = True
# q_a|kv_a, the latent step and q_b as attn_side's fixed-form launch (attn_side.py: one
# persistent launch, c_q's and c_kv's K chunks added as 64-bit integers, q_b's units norming
# c_q from the sums, the KV-cache rows written inside it) at 1..ATTN_SIDE_MAX_ROWS rows of a
# layer without the indexer, instead of fp8_linear + latent + fp8_linear. On by default
# wherever it can run (a Hopper GPU, CuTe DSL, the stage kernels; elsewhere the layer logs why
# it runs the stage kernels); "1" insists (refused by name where the device cannot), "0" turns
# it off; a layer with the indexer keeps the stage kernels (its wq_b shares q_b's launch).
# Alone on an H200 the launch is 10.3 us at one row against the three kernels' 11.1-11.4, level
# at two (results/attn_side_probe_20261204T182239Z, T182524Z).
ATTN_SIDE_ENV = "SGL_KERNEL_EXT_SM90_ATTN_SIDE"
ATTN_SIDE: Optional[bool] = None
# In a MoE layer (absorb's early w_kc tile after it, ATTN_SIDE_ABSORB_W_EARLY) -0.9 / -1.0 us
# at two rows and -0.2 / 0.0 at one (results/tiling_probe_20261204T200536Z, T200609Z:
# attn_side_off, attn_side_2); in a third run -0.3 at two rows in four pairs, +0.0..+0.5 at
# one (T202555Z): level at one row, a little faster at two. Its neighbours take what the
# launch saves: the first kernel adds ~1.6 us more while the launch streams q_a|kv_a's 16 MB
# before its wait, and sparse_mla ~1.3 more after absorb's early tile (graph_timeline_
# 20261204T202645Z against T200040Z, the stage kernels: the three stages 12.7 -> 8.8 us)
ATTN_SIDE_MAX_ROWS = 2
# attn_side launched programmatically dependent (its weights streaming before the previous
# kernel ends), and letting the next kernel launch as it starts (else as it ends)
ATTN_SIDE_PDL = True
ATTN_SIDE_EARLY_DEPENDENTS = True
# after attn_side, absorb's programs load their w_kc tile before the wait (up to
# mla.ABSORB_W_EARLY_MAX_ROWS rows) rather than prefetching it into L2: on an H200 a MoE layer
# at one row is 2.8-3.1 us faster with it than with the prefetch, 2.3-2.8 with neither
# (results/tiling_probe_20261204T200329Z: absorb_w_early, absorb_no_prefetch)
ATTN_SIDE_ABSORB_W_EARLY = True
# the weight slots each attn_side worker asks for before its programmatic wait (None: its
# ring's whole first lap, all of q_a|kv_a at a TP8 rank's shapes)
ATTN_SIDE_EARLY_SLOTS = None
# rows up to which attn_side also takes the layer's input add + RMSNorm (``AttnSide.norm_in``:
# each q_a|kv_a unit makes its x chunk from hidden + residual times the norm's weight, e4m3
# per 128 columns; c_q's and the KV row's consumers multiply by the row's rstd from the
# chunks' sums of squares, as norm_router does for the router), so the norm's launch is gone
# from the layer's one-row chain. The premise (H100 timeline at one row,
# graph_timeline_20261207T161253Z): the first norm adds 4.19 us there, attn_side 10.53, where
# attn_side alone takes ~10.3 on an H200. Off (0): correct (its kernel and layer tests pass
# on an H100 at ed40016; it rounds x as reference.quant.FOLDED_INPUT_NORM does, rstd out of
# the quantization) but slower, +1.4..+2.0 us a MoE layer at one row and +6.6 at two
# (tiling_probe_20261208T003124Z): attn_side grows 6.4 us for the norm's 4.2 (STATUS).
# The environment's ATTN_SIDE_NORM_IN_ENV ("0".."2") replaces it.
ATTN_SIDE_NORM_IN_ENV = "SGL_KERNEL_EXT_SM90_ATTN_SIDE_NORM_IN_ROWS"
ATTN_SIDE_NORM_IN_MAX_ROWS = int(os.environ.get(ATTN_SIDE_NORM_IN_ENV, "0") or 0)
# The indexer's top-k of rows wider than triton.topk.SPLIT_MIN_WIDTH as cluster_topk's one
# launch (a thread block cluster a row, its CTAs meeting in distributed shared memory between
# the radix passes) instead of the Triton split's six launches, in a table of any width (a
# server's is 1M wide). On by default wherever it can run (a Hopper GPU, CuTe DSL; elsewhere
# the layer logs why it runs Triton's); "1" insists, "0" turns it off. On an H100 (exact
# against a stable sort; results/topk_probe_20261206T024649Z, 1M-wide table): 12.9-14.0 us at
# 1-16 rows of 8K, 13.7-14.6 of 32K, 27.0-37.9 of 128K, 41.2-57.3 of 200K, against the split's
# 20.1-21.2, 23.9-30.8, 37.0-90.8 and 49.9-140.0; a MoE layer with the indexer in that table
# is 7.4-8.2 us faster at 1-16 rows of 8K, 10.6-25.1 of 32K, 3.0-96.3 of 128K
# (tiling_probe_20261206T024653Z, T024709Z, T024721Z: triton_topk). Since 5d62760 a context
# past 64K at up to 8 rows prefetches its next tile (cluster_topk.PREFETCH_ROWS): 114.0 /
# 169.1 us for that layer at 1 / 4 rows of 128K (tiling_probe_20261206T051052Z). Since
# 144e264 a held context's tally and write skip its empty key groups and the passes run as a
# loop up to 8 rows (cluster_topk.SKIP_WRITE, ROLL: half the code): 77.7 / 122.9 / 216.8 us at
# 1 / 4 / 16 rows of 8K, 105.1 / 162.7 / 344.8 of 128K (tiling_probe_20261206T074913Z,
# T075022Z); since 1727f5c a wide table's rows take 16 CTAs up to 7 rows, the first 8 alone
# up to 64K (cluster_topk.WIDE_CLUSTER): 93.6 / 151.6 us at 1 / 4 rows of 128K, 78.2 / 123.4
# of 8K against 77.7 / 123.2 with 8 (tiling_probe_20261206T080350Z, T080437Z, at 07a5bb0);
# since d9c04e2 (measured at 0d214db) the prefetching rolled form runs up to 15 rows, the
# clusters of 8 an H100 holds at one CTA an SM (cluster_topk.launch_form): 258.7-259.2 /
# 286.4-286.8 / 331.6-331.8 us at 9 / 12 / 15 rows of 128K against 269.2-270.7 / 296.3 /
# 343.7-343.9 (tiling_probe_20261206T103316Z, T103528Z).
TOPK_ENV = "SGL_KERNEL_EXT_SM90_TOPK"
TOPK: Optional[bool] = None
# fp8_mma's ring when launched dependent: about 90 KB, so the next launch's CTA fits beside it
# (H200, sm90_gemv_probe_20261202T081912Z: 10-12 slots fastest, the whole 200 KB slower)
RING_SLOTS = 10


def attn_gatherers(rows: int) -> int:
    """sparse_mla's gathering warpgroups for a step of `rows` rows."""
    return 2 if rows >= ATTN_GATHERERS_FROM_ROWS else 1


def o_proj_enabled() -> bool:
    return O_PROJ if O_PROJ is not None else os.environ.get(O_PROJ_ENV, "0") == "1"


def qkv_a_enabled() -> bool:
    return QKV_A if QKV_A is not None else os.environ.get(QKV_A_ENV, "0") == "1"


def moe_enabled() -> bool:
    return MOE if MOE is not None else os.environ.get(MOE_ENV, "0") == "1"


def _setting(attribute: Optional[bool], env: str) -> Optional[bool]:
    """A default-on kernel's setting: the module attribute where set, else True where `env` is
    "1" (insist), False where it is "0" (off), None where unset (wherever it can run)."""
    if attribute is not None:
        return attribute
    value = os.environ.get(env, "")
    return None if value == "" else value == "1"


def attn_setting() -> Optional[bool]:
    """The sparse attention on sparse_mla: True insists (ATTN_ENV=1), False is off (=0), None
    (unset) takes it wherever it can run."""
    return _setting(ATTN, ATTN_ENV)


def attn_side_setting() -> Optional[bool]:
    """q_a|kv_a + latent + q_b on attn_side: True insists (ATTN_SIDE_ENV=1), False is off
    (=0), None (unset) takes it wherever it can run."""
    return _setting(ATTN_SIDE, ATTN_SIDE_ENV)


def topk_setting() -> Optional[bool]:
    """The indexer's long-row top-k on cluster_topk: True insists (TOPK_ENV=1), False is off
    (=0), None (unset) takes it wherever it can run."""
    return _setting(TOPK, TOPK_ENV)


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
