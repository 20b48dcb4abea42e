"""Compile every Triton kernel of the fused layer for sm_90 on a machine without a GPU.

The CPU interpreter runs kernels as Python, so it cannot catch what only the compiler
rejects (a loop-carried value changing type, an unsupported op or layout). This runs in two
processes: ``record`` drives the tiny-config fused layer (and the top-k kernel) under the
interpreter and writes each distinct launch's kernel, argument types and compile-time
constants; ``compile`` (no interpreter) compiles each one for an H100/H200 target with
Triton's own compiler and bundled ptxas.

    TRITON_INTERPRET=1 python sm90_compile.py record specs.json
    python sm90_compile.py compile specs.json [sm90|sm100|gfx950]

The same sources must serve the next backends' GPUs: ``compile`` takes a target (``TARGETS``:
B200's sm_100, and MI355X's gfx950 without the overlap, as an AMD build runs them), each with
its own per-block shared memory limit.

``record-real`` records the launches of real-shape layers (one GLM-5.3 TP8 rank, every kind,
1-16 rows) without running them (``record-real-stages``: the stage kernels only, not the
slow-to-compile persistent kernel); ``compile`` of those also checks each kernel's shared
memory against the block limit at real tile sizes, and ``resources`` compiles each and prints
ptxas' registers and spills for sm_90a, spilling kernels first (a CPU view of what
benchmark/kernel_resources.py reads on the GPU; Triton here may differ from the GPU
machine's). Pointers compile as 16-byte aligned, as the GPU's JIT sees torch's tensors.

    TRITON_INTERPRET=1 python sm90_compile.py record-real real.json
    python sm90_compile.py resources real.json

``resident real.json [sm90|sm100]`` says of every recorded form of attn_out's one launch
(whose programs wait for each other inside it) whether it fits an H200 (or a B200) all at
once, from ptxas' counts, and which is the form its knobs launch. Run it with the GPU's
Triton: the venv's newer one compiles some forms to far fewer registers.

``loops`` (optionally ``loops real.json _sparse_attn_kernel``) disassembles each launch's
sm_90a cubin with Triton's bundled nvdisasm and prints, for every loop, its instructions a
warp per iteration by class (MMAs, asynchronous copies, global loads, barriers, integer
work): a CPU measure of a kernel's per-step cost where the GPU is latency- or issue-bound.

``sass specs.json DIR`` writes each launch's instructions (addresses dropped) to DIR, one
file a launch: run it from two checkouts on the same specs and ``diff -r`` the folders to
show that a refactor leaves the kernels instruction for instruction as they were measured.
Any of these modes compiles with the Triton first on PYTHONPATH, e.g. the GPU machine's
(``.cache/triton-3.6.0``, which .ci/run installs), one launch a worker process on every core
(``SM90_COMPILE_JOBS`` to choose how many), the output in the specs' order.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import sys
from typing import NamedTuple

# worker processes that compile (``each_compiled``): every core unless SM90_COMPILE_JOBS says
JOBS = int(os.environ.get("SM90_COMPILE_JOBS", "0")) or os.cpu_count() or 1

_TYPES = {
    "torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16",
    "torch.float8_e4m3fn": "fp8e4nv", "torch.int64": "i64", "torch.int32": "i32",
    "torch.uint8": "u8", "torch.bool": "i1",
}


def _describe(value):
    import torch

    if isinstance(value, torch.Tensor):
        return "*" + _TYPES[str(value.dtype)]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot describe a launch argument of type {type(value).__name__}")


def record(path: str, real: bool = False, persistent_too: bool = True) -> None:
    """Record every distinct launch of the tiny-config layer run under the interpreter; with
    real, of real-shape layers (one GLM-5.3 TP8 rank) whose launches are recorded, not run."""
    import triton.runtime.interpreter as interp

    specs = {}
    original = interp.InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        params = inspect.signature(fn).parameters
        names = list(params)
        options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "maxnreg") if k in kwargs}
        kwargs.pop("launch_pdl", None)
        defaults = {n: p.default for n, p in params.items()
                    if p.default is not inspect.Parameter.empty}
        bound = defaults | dict(zip(names, args)) | kwargs
        constexprs = {n: v for n, v in bound.items() if "constexpr" in str(params[n].annotation)}
        signature = {n: ("constexpr" if n in constexprs else _describe(bound[n])) for n in names}
        # integers the GPU's JIT would specialize as multiples of 16
        divisible = sorted(n for n in names if n not in constexprs and type(bound[n]) is int
                           and bound[n] % 16 == 0)
        key = json.dumps([fn.__module__, fn.__name__, signature, constexprs, options, divisible],
                         sort_keys=True, default=str)
        specs[key] = {"module": fn.__module__, "name": fn.__name__, "signature": signature,
                      "constexprs": constexprs, "options": options, "divisible": divisible}
        if real:
            return None
        return original(self, *args, grid=grid, warmup=warmup, **kwargs, **options)

    interp.InterpretedFunction.run = run
    try:
        _drive_real(persistent_too) if real else _drive()
    finally:
        interp.InterpretedFunction.run = original
    with open(path, "w") as f:
        json.dump(list(specs.values()), f, indent=1)
    print(f"recorded {len(specs)} distinct launches")


def _drive() -> None:
    import torch

    from sgl_kernel_ext.triton import topk
    from sglang.srt.layers.fused_decode.layer import FusedLayer
    from sglang.srt.layers.fused_decode.reference.config import tiny_config
    from sglang.srt.layers.fused_decode.testing import make_case

    cfg = tiny_config()
    for layer_id, contexts in ((0, [30, 0, 12, 40]), (1, [30, 0, 12, 40]), (2, [30, 12]),
                               (1, [40]), (1, [40] * 9)):
        for persistent in (False, True):  # the stage kernels, then the one-launch layer
            case = make_case(cfg, layer_id, contexts, seed=layer_id, tp_size=2)
            FusedLayer(cfg, case.lw, case.caches, len(contexts), case.batch.token_slots.shape[1],
                       persistent_launch=persistent)(
                case.hidden, case.residual, case.batch, case.topk_prev)
    from sgl_kernel_ext.triton import overlap

    from sglang.srt.layers.fused_decode.layer import chain_prefetch

    from sgl_kernel_ext.triton import mla

    # the knobs' other forms at 2 and 3 rows: both norms with a prefetch table (the layer's
    # own, the next layer's), absorb_v merging the attention's chunks at 3 rows, absorb
    # without the tensor cores, the attention's latent in column tiles with independent score
    # chains
    overlap.LAYER_PREFETCH = overlap.NEXT_LAYER_PREFETCH = True
    merge_rows0, gemv_rows0 = mla.ABSORB_V_MERGE_MAX_ROWS, mla.ABSORB_GEMV_MAX_ROWS
    parts0 = mla.ATTN_PARTS, mla.ATTN_QK_CHAINS, mla.ATTN_PARTS_FROM_STEPS
    mla.ABSORB_GEMV_MAX_ROWS = 3
    mla.ATTN_PARTS, mla.ATTN_QK_CHAINS, mla.ATTN_PARTS_FROM_STEPS = 8, 2, 1
    for contexts in ([30, 12], [30, 12, 40]):
        mla.ABSORB_V_MERGE_MAX_ROWS = 3 if len(contexts) == 3 else 0
        case = make_case(cfg, 1, contexts, seed=1, tp_size=2)
        layer = FusedLayer(cfg, case.lw, case.caches, len(contexts),
                           case.batch.token_slots.shape[1], persistent_launch=False)
        chain_prefetch([layer])
        layer(case.hidden, case.residual, case.batch, case.topk_prev)
    overlap.LAYER_PREFETCH = overlap.NEXT_LAYER_PREFETCH = False
    mla.ABSORB_V_MERGE_MAX_ROWS, mla.ABSORB_GEMV_MAX_ROWS = merge_rows0, gemv_rows0
    mla.ATTN_PARTS, mla.ATTN_QK_CHAINS, mla.ATTN_PARTS_FROM_STEPS = parts0
    scores = torch.randn(2, 3000)
    topk.topk_positions(scores, torch.tensor([2999, 100]), 2048,
                        torch.empty(2, 2048, dtype=torch.int64))
    wide = torch.randn(2, 9000)  # the split top-k (six launches)
    p = topk.split_chunks(9000)
    i32 = torch.int32
    topk.topk_positions_split(wide, torch.tensor([8999, 100]), 2048,
                              torch.empty(2, 2048, dtype=torch.int64),
                              torch.empty(2, 2 * p * 256, dtype=i32),
                              torch.empty(2, 4, dtype=i32), torch.empty(2 * p * 2, dtype=i32))
    # the same with its first pass in the index scores (topk.SCORES_HISTOGRAM: five launches)
    case = make_case(cfg, 1, [9000, 100], seed=1, tp_size=2)
    topk.SCORES_HISTOGRAM = True
    FusedLayer(cfg, case.lw, case.caches, 2, case.batch.token_slots.shape[1],
               persistent_launch=False)(case.hidden, case.residual, case.batch, case.topk_prev)
    topk.SCORES_HISTOGRAM = False
    # absorb letting the attention launch as its programs start (a layer reusing the top-k)
    early0 = mla.ABSORB_EARLY_DEPENDENTS_FROM_ROWS
    mla.ABSORB_EARLY_DEPENDENTS_FROM_ROWS = 1
    case = make_case(cfg, 2, [30, 12, 40], seed=2, tp_size=2)
    FusedLayer(cfg, case.lw, case.caches, 3, case.batch.token_slots.shape[1],
               persistent_launch=False)(case.hidden, case.residual, case.batch, case.topk_prev)
    mla.ABSORB_EARLY_DEPENDENTS_FROM_ROWS = early0
    # the kernels reading their slots in place from a server's pool table (slot_rows)
    from sglang.srt.layers.fused_decode.testing import in_a_pool

    for layer_id, contexts in ((0, [30, 0, 12, 40]), (2, [30, 12]), (2, [30, 0, 12])):
        for persistent in (False, True):
            case = make_case(cfg, layer_id, contexts, seed=layer_id, tp_size=2)
            FusedLayer(cfg, case.lw, case.caches, len(contexts), case.batch.token_slots.shape[1],
                       persistent_launch=persistent)(
                case.hidden, case.residual, in_a_pool(case.batch), case.topk_prev)


def _drive_real(persistent_too: bool = True) -> None:
    """Real-shape layers of each kind at 1, 2, 4 and 16 rows (L = 2048), stage kernels and
    (persistent_too) the persistent kernel, with uninitialized weights and caches: only the
    launches matter."""
    import torch

    from sglang.srt.layers.fused_decode.layer import FusedLayer
    from sglang.srt.layers.fused_decode.reference import weights
    from sglang.srt.layers.fused_decode.reference.batch import RowBatch
    from sglang.srt.layers.fused_decode.reference.cache import alloc_caches
    from sglang.srt.layers.fused_decode.reference.config import glm53_config

    def empty(seed, name, shape, index, device):
        dims = [e - a for a, e in index] if index is not None else list(shape)
        return torch.empty(dims, dtype=torch.float32, device=device)

    weights.uniform = empty
    cfg = glm53_config()
    ids = range(cfg.num_hidden_layers)
    kinds = {"dense": next(i for i in ids if not cfg.is_moe(i)),
             "moe_idx": next(i for i in ids if cfg.is_moe(i) and cfg.runs_indexer(i)),
             "moe": next(i for i in ids if cfg.is_moe(i) and not cfg.runs_indexer(i))}
    from sgl_kernel_ext.triton import bf16_linear, fp8_linear, mla, moe, norm_router

    ctx, rows = 2048, 16
    knobs = ((mla, "ABSORB_V_SPLIT_C"), (mla, "ABSORB_V_MERGE_MAX_ROWS"),
             (mla, "ABSORB_GEMV_MAX_ROWS"), (moe, "GEMV_MAX_ROWS"), (fp8_linear, "GEMV_MAX_ROWS"),
             (bf16_linear, "GEMV_MAX_ROWS"), (mla, "ATTN_AHEAD"), (mla, "ATTN_PRELOAD_MAX_STEPS"),
             (mla, "ATTN_PARTS"), (mla, "ATTN_QK_CHAINS"), (mla, "ATTN_PARTS_FROM_STEPS"),
             (moe, "DOWN_TABLE_EARLY"), (mla, "ABSORB_V_W_EARLY"),
             (moe, "SUM_POS_EARLY"), (mla, "ABSORB_PE_OWN_FROM_ROWS"),
             (mla, "KV_SLOT_EARLY"), (mla, "Q_FIXED_FROM_ROWS"),
             (moe, "DOWN_SLOT_WAIT_FROM_ROWS"), (norm_router, "ROWS"),
             (norm_router, "FIXED_FROM_ROWS"), (norm_router, "QUANT_IN_PRODUCTS_MAX_ROWS"))
    default = tuple(getattr(mod, name) for mod, name in knobs)
    # the stage kernels also with absorb_v in one latent chunk, and in the most chunks merging
    # the attention's at every row count (mla.ABSORB_V_SPLIT_C, _MERGE_MAX_ROWS); absorb's dot
    # form at every row count, its GEMV form up to 4 rows (mla.ABSORB_GEMV_MAX_ROWS); the MoE's
    # and the linears' GEMV forms (GEMV_MAX_ROWS) up to 2 rows in one, at none in the other;
    # the attention loading one step ahead (mla.ATTN_AHEAD) its slots in one, its rows too in
    # the other; the attention preloading its first step in no program in one, in every one
    # in the other (mla.ATTN_PRELOAD_MAX_STEPS); the latent KV in 8 column tiles with
    # independent score chains in one, in 4 with one chain in the other, at every step count
    # (ATTN_PARTS, _QK_CHAINS, _PARTS_FROM_STEPS); down's table, absorb_v's w_vc and the
    # sum's positions read after the wait in the other (DOWN_TABLE_EARLY, ABSORB_V_W_EARLY,
    # SUM_POS_EARLY); absorb's q_pe in programs of its own at every row count in one, in the
    # head's first program in the other (ABSORB_PE_OWN_FROM_ROWS); q_b's fixed-point sums for
    # absorb (Q_FIXED_FROM_ROWS) at every row count in one, from 3 rows in the other; down
    # after all of gate/up in the other (DOWN_SLOT_WAIT_FROM_ROWS: by default per slot); a
    # MoE layer's router on the un-normed row at every row count in one (norm_router.ROWS),
    # its products into fixed-point sums from 3 rows there (FIXED_FROM_ROWS) and its
    # quantization in the products' programs up to 2 (QUANT_IN_PRODUCTS_MAX_ROWS)
    other_forms = ((1, 0, 0, 2, 2, 2, 1, 0, 8, 2, 1, True, True, True, 1, True, 1, 3,
                    frozenset(range(1, 17)), 3, 2),
                   (8, 16, 4, 0, 0, 0, 2, 1 << 30, 4, 1, 1, False, False, False, 1 << 30, False,
                    3, 1 << 30, frozenset(), 17, 0))
    for kind, lid in kinds.items():
        lw = weights.gen_layer(cfg, 0, lid, tp_size=8, tp_rank=0)
        caches = alloc_caches(cfg, rows * ctx, "cpu", torch.bfloat16, layers=[lid])
        for persistent in (False, True) if persistent_too else (False,):
            layer = FusedLayer(cfg, lw, caches, rows, ctx, persistent_launch=persistent)
            for values in (default,) if persistent else (default, *other_forms):
                for (mod, name), value in zip(knobs, values):
                    setattr(mod, name, value)
                for m in (1, 2, 4, 16):
                    slots = torch.arange(m * ctx).view(m, ctx)
                    batch = RowBatch(torch.full((m,), ctx - 1), slots)
                    hid = torch.zeros(m, cfg.hidden_size, dtype=torch.bfloat16)
                    topk = torch.zeros(m, cfg.index_topk, dtype=torch.int64)
                    layer(hid, hid.clone(), batch, topk)
            for (mod, name), value in zip(knobs, default):
                setattr(mod, name, value)
        print(f"recorded {kind} (layer {lid})", flush=True)
    # absorb_v and o_proj as one launch (attn_out), in its GPU form, on a MoE layer: its
    # default tile, a wider and a narrower one, the weights early and late, 8 latent slices,
    # after the merge kernel (launched early) from 2 rows
    from sgl_kernel_ext.triton import attn_out

    lw = weights.gen_layer(cfg, 0, kinds["moe"], tp_size=8, tp_rank=0)
    caches = alloc_caches(cfg, rows * ctx, "cpu", torch.bfloat16, layers=[kinds["moe"]])
    layer = FusedLayer(cfg, lw, caches, rows, ctx, persistent_launch=False)
    vo_knobs = ("BLOCK_N", "W_EARLY", "MAX_LATENT_SLICES", "MERGE_MAX_ROWS")
    vo_default = [getattr(attn_out, k) for k in vo_knobs]
    attn_out.MAX_ROWS, attn_out.INTERPRETER_PHASES = 16, (3,)
    for values in ((256, True, 16, 16), (512, True, 16, 16), (128, True, 16, 16),
                   (256, False, 16, 16), (256, True, 8, 16), (256, True, 16, 1)):
        for k, value in zip(vo_knobs, values):
            setattr(attn_out, k, value)
        for m in (1, 2, 16):
            slots = torch.arange(m * ctx).view(m, ctx)
            hid = torch.zeros(m, cfg.hidden_size, dtype=torch.bfloat16)
            layer(hid, hid.clone(), RowBatch(torch.full((m,), ctx - 1), slots),
                  torch.zeros(m, cfg.index_topk, dtype=torch.int64))
    for k, value in zip(vo_knobs, vo_default):
        setattr(attn_out, k, value)
    attn_out.MAX_ROWS, attn_out.INTERPRETER_PHASES = 0, (1, 2)
    print("recorded absorb_v and o_proj as one launch", flush=True)
    _record_peer_norm(cfg.hidden_size)
    # the one-launch split top-k (the layers above stop at a 2048 context): 1 row at 32K, 16
    # rows at 8K (16 and 4 chunks a row) on 132 multiprocessors
    from sgl_kernel_ext.triton import topk as topk_kernel

    i32 = torch.int32
    for m, width in ((1, 32768), (16, 8192)):
        chunk = topk_kernel.one_launch_chunk(m, width, 132)
        assert chunk, (m, width)
        p = topk_kernel.split_chunks(width)
        topk_kernel.topk_one_launch(
            torch.empty(m, width), torch.full((m,), width - 1), cfg.index_topk,
            torch.empty(m, cfg.index_topk, dtype=torch.int64), torch.empty(2, m * p * 256, dtype=i32),
            torch.zeros(2 * m, dtype=i32), chunk)
    print("recorded the one-launch top-k", flush=True)
    # the index scores adding up the top-k's first pass, and the five launches after them
    # (topk.SCORES_HISTOGRAM), at 16 rows of 32K
    from sgl_kernel_ext.triton import indexer

    m, width = 16, 32768
    p = topk_kernel.split_chunks(width)
    pos, first_hist = torch.full((m,), width - 1), torch.zeros(m * p * 256, dtype=i32)
    scores, nh, d = torch.empty(m, width), cfg.index_n_heads, cfg.index_head_dim
    q8 = torch.empty(m, nh, d, dtype=torch.float8_e4m3fn)
    index_cache = torch.empty(m * width // 64, 64 * 132, dtype=torch.uint8)
    indexer.scores(q8, torch.empty(m, nh), index_cache, pos, torch.arange(m * width).view(m, width),
                   scores, first_hist=first_hist)
    topk_kernel.topk_positions_split(
        scores, pos, cfg.index_topk, torch.empty(m, cfg.index_topk, dtype=torch.int64),
        torch.empty(2, m * p * 256, dtype=i32), torch.empty(2, m * 2, dtype=i32),
        torch.empty(m * p * 2, dtype=i32), first_hist=first_hist)
    print("recorded the scores' first-digit histograms and the five-launch top-k", flush=True)
    # the six launches loading 16 chunks at once (SPLIT_SUM_BLOCK), the five without the count
    # pass (SKIP_COUNT_PASS), and the four with the scores' histograms too
    for sum_block, skip_count, hist in ((32, False, None), (1, True, None), (32, True, first_hist)):
        topk_kernel.SPLIT_SUM_BLOCK, topk_kernel.SKIP_COUNT_PASS = sum_block, skip_count
        topk_kernel.topk_positions_split(
            scores, pos, cfg.index_topk, torch.empty(m, cfg.index_topk, dtype=torch.int64),
            torch.empty(2, m * p * 256, dtype=i32), torch.empty(2, m * 2, dtype=i32),
            torch.empty(m * p * 2, dtype=i32), first_hist=hist)
    topk_kernel.SPLIT_SUM_BLOCK, topk_kernel.SKIP_COUNT_PASS = 1, False
    print("recorded the split top-k's other forms", flush=True)
    indexer.SCORE_SWAP = False  # the scores as q x keys^T (the default: keys x q^T, FP8 wgmma)
    indexer.scores(q8, torch.empty(m, nh), index_cache, pos, torch.arange(m * width).view(m, width),
                   scores)
    indexer.SCORE_SWAP = True
    print("recorded the index scores as q x keys^T", flush=True)
    programs = indexer.SCORE_MAX_ROW_PROGRAMS  # fewer programs than blocks: the looping form
    indexer.SCORE_MAX_ROW_PROGRAMS = 128
    for hist in (None, first_hist):
        indexer.scores(q8, torch.empty(m, nh), index_cache, pos,
                       torch.arange(m * width).view(m, width), scores, first_hist=hist)
    indexer.SCORE_MAX_ROW_PROGRAMS = programs
    print("recorded the looping index scores", flush=True)
    programs = topk_kernel.SPLIT_MAX_PROGRAMS
    topk_kernel.SPLIT_MAX_PROGRAMS = 4 * m  # fewer programs than chunks: the looping top-k
    for skip_count, hist in ((False, None), (True, first_hist)):
        topk_kernel.SKIP_COUNT_PASS = skip_count
        topk_kernel.topk_positions_split(
            scores, pos, cfg.index_topk, torch.empty(m, cfg.index_topk, dtype=torch.int64),
            torch.empty(2, m * p * 256, dtype=i32), torch.empty(2, m * 2, dtype=i32),
            torch.empty(m * p * 2, dtype=i32), first_hist=hist)
    topk_kernel.SKIP_COUNT_PASS = False
    topk_kernel.SPLIT_MAX_PROGRAMS = programs
    print("recorded the looping split top-k", flush=True)
    # the stage kernels reading their slots in place from a server's int32 pool table
    # (runtime.step_rows: slot_rows), each kind at 1 and 16 rows, the persistent kernel too
    from sglang.srt.layers.fused_decode.runtime import StepRows

    for kind, lid in kinds.items():
        lw = weights.gen_layer(cfg, 0, lid, tp_size=8, tp_rank=0)
        caches = alloc_caches(cfg, rows * ctx, "cpu", torch.bfloat16, layers=[lid])
        for persistent in (False, True) if persistent_too else (False,):
            layer = FusedLayer(cfg, lw, caches, rows, ctx, persistent_launch=persistent)
            for m in (1, 16):
                pool = torch.arange(2 * m * (ctx + 64), dtype=i32).view(2 * m, ctx + 64)
                batch = StepRows(torch.full((m,), ctx - 1), pool[:, :ctx], torch.arange(m) * 2)
                hid = torch.zeros(m, cfg.hidden_size, dtype=torch.bfloat16)
                layer(hid, hid.clone(), batch, torch.zeros(m, cfg.index_topk, dtype=torch.int64))
    print("recorded the layers on a pool's slot table", flush=True)


def _record_peer_norm(h: int) -> None:
    """The TP all-reduce fused with the norm after it (peer_norm), in its GPU form: 8 ranks of
    one node at 1 and 16 rows, bf16 and FP8 out (the post-attention norm), bf16 alone without
    a residual (a first layer's)."""
    import torch

    from sgl_kernel_ext.triton import peer_norm

    world = 8
    recv, flags, state = peer_norm.buffers(world, 16, h, "cpu")
    ptrs = torch.zeros(world, dtype=torch.int64)
    peers = peer_norm.PeerRows(3, world, recv, flags, ptrs, ptrs, state)
    peer_norm.INTERPRETER_PHASES = (3,)
    w = torch.ones(h, dtype=torch.bfloat16)
    for m in (1, 16):
        rows = torch.zeros(m, h, dtype=torch.bfloat16)
        xq = torch.empty(m, h, dtype=torch.float8_e4m3fn)
        peer_norm.run_ranks_interpreted([(rows, peers, rows, w, 1e-5, rows, rows, xq,
                                          torch.empty(m, h // 128))])
        peer_norm.run_ranks_interpreted([(rows, peers, None, w, 1e-5, rows, rows)])
    peer_norm.INTERPRETER_PHASES = (1, 2)
    print("recorded the all-reduce with its norm", flush=True)


def resource_rows(path: str, name: str = "", target: str = "sm90") -> list:
    """(bytes spilled, registers, shared memory, kernel, options, constexprs) of each recorded
    launch (of the kernel `name`, or every one) compiled for an NVIDIA target (sm_90a unless
    named) as the GPU's JIT would (pointers 16-byte aligned), ptxas' counts."""
    return each_compiled(_specs(path, name), target, _resource_row)


def _resource_row(spec, target: str) -> tuple:
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    binary, gpu_name = TARGETS[target].ptxas
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / binary
    kernel, options = compile_for(spec, target)
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(kernel.asm["ptx"])
        out = subprocess.run([str(ptxas), "-v", "--gpu-name", gpu_name, str(ptx), "-o",
                              str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
    info = " ".join(out.stderr.split())
    regs = int(info.split("Used ")[1].split(" registers")[0])
    spill = int(info.split("bytes spill stores")[0].split(",")[-1].strip().split()[-1])
    return (spill, regs, kernel.metadata.shared, spec["name"], options, {
        k: v for k, v in spec["constexprs"].items() if k not in ("INTERPRET", "PDL", "PF")})


def resources(path: str) -> None:
    """Print ``resource_rows``, spilling kernels first."""
    rows = resource_rows(path)
    rows.sort(key=lambda r: (-r[0], r[3]))
    for spill, regs, shared, name, options, consts in rows:
        opts = " ".join(f"{k}={options[k]}" for k in ("num_warps", "num_stages", "maxnreg")
                        if options.get(k) is not None)
        print(f"{spill:6d} B spilled  {regs:3d} regs  {shared // 1024:3d} KB shared  {opts}  {name} "
              f"{consts}")


def resident(path: str, target: str = "sm90") -> None:
    """attn_out's one launch at one GLM-5.3 TP8 rank's shapes, each recorded form against the
    target's GPU (an H200: 132 multiprocessors, 64K registers, 228 KB of shared memory, 2048
    threads each; a B200: 148 of the same): whether its programs can all be resident at once
    (``attn_out._check_resident``, which refuses a form that cannot at its first launch on the
    GPU). Prints one line a form, "fits" or "refused", each with the form's constants and
    whether it is the one the module's defaults launch at its row count ("default"), then
    "resident K of N"."""
    from types import SimpleNamespace

    import torch

    from sgl_kernel_ext.triton import attn_out
    from sglang.srt.layers.fused_decode.reference.config import glm53_config

    hidden = glm53_config().hidden_size
    attn_out._multiprocessors = lambda index: TARGETS[target].multiprocessors
    rows = resource_rows(path, "_vo_kernel", target)
    fits = 0
    for spill, regs, shared, name, options, consts in rows:
        programs = consts["NH"] * (hidden // consts["BLOCK_N"])
        kernel = SimpleNamespace(n_regs=regs, metadata=SimpleNamespace(shared=shared),
                                 _init_handles=lambda: None)
        # the GPU's one launch (PHASE 3) in the knobs' form, at a row count they launch it
        default = (consts["PHASE"] == 3 and consts["BLOCK_N"] == attn_out.BLOCK_N
                   and consts["W_EARLY"] == attn_out.W_EARLY
                   and consts["LS"] == attn_out.latent_slices(
                       hidden // consts["BLOCK_N"], consts["C"], attn_out.MAX_LATENT_SLICES)
                   and consts["MERGE"] == attn_out.merges(attn_out.MAX_ROWS)
                   and 1 <= consts["MERGE_ROWS"] <= max(1, attn_out.MAX_ROWS))
        try:
            attn_out._check_resident(kernel, programs, options["num_warps"], torch.device("cpu"))
            verdict = "fits"
            fits += 1
        except RuntimeError:
            verdict = "refused"
        print(f"{verdict}{' default' if default else ''}: {programs} programs of {regs} "
              f"registers and {shared // 1024} KB: {consts}")
    print(f"resident {fits} of {len(rows)}")


# SASS opcodes by class, for ``loops``
SASS_CLASSES = {
    "mma": ("HMMA", "HGMMA", "IMMA", "QGMMA"),
    "async_copy": ("LDGSTS", "UTMALDG", "UBLKCP"),
    "global_load": ("LDG",),
    "global_store": ("STG", "RED", "ATOM", "ATOMG"),
    "shared": ("LDS", "LDSM", "STS", "STSM"),
    "barrier": ("BAR", "DEPBAR", "LDGDEPBAR", "WARPGROUP", "SYNCS"),
    "integer": ("IMAD", "IADD3", "ISETP", "LOP3", "SEL", "LEA", "SHF", "PLOP3", "IABS",
                "VIADD", "IMNMX", "SGXT", "PRMT", "UIADD3", "UISETP", "ULEA", "USHF", "USEL",
                "ULOP3", "UIMAD", "IMUL"),
    "float": ("FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "FSETP", "FSEL", "F2FP", "F2F", "FCHK"),
}
_OPCODE = re.compile(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+`\((\.L_x_\d+)\)")


def sass_loops(sass: str) -> list:
    """Every loop of nvdisasm's listing (a branch back to an earlier label), innermost
    first: {"lines": (first, last), "instructions": n, class: count, ..., "other": n}."""
    lines = sass.splitlines()
    labels, loops = {}, []
    for i, line in enumerate(lines):
        label = _LABEL.match(line.strip())
        if label:
            labels[label.group(1)] = i
            continue
        branch = _BRANCH.search(line)
        if branch and branch.group(1) in labels:
            start = labels[branch.group(1)]
            ops = [m.group(1) for m in map(_OPCODE.search, lines[start:i + 1]) if m]
            row = {"lines": (start, i), "instructions": len(ops)}
            for name, prefixes in SASS_CLASSES.items():
                row[name] = sum(op in prefixes for op in ops)
            row["other"] = len(ops) - sum(row[name] for name in SASS_CLASSES)
            loops.append(row)
    return sorted(loops, key=lambda r: r["instructions"])


def loops(path: str, name: str = "") -> None:
    """Print ``sass_loops`` of each recorded launch (of kernel `name` when given)."""
    for text in each_compiled(_specs(path, name), "sm90", _loops_text):
        print(text)


def _loops_text(spec, target: str) -> str:
    kernel, options = compile_for(spec, target)
    consts = {k: v for k, v in spec["constexprs"].items() if k not in ("INTERPRET", "PDL")}
    lines = [f"{spec['name']} {options} {consts}"]
    for row in sass_loops(_disassemble(kernel)):
        counts = " ".join(f"{k}={row[k]}" for k in (*SASS_CLASSES, "other") if row[k])
        lines.append(f"    loop at SASS lines {row['lines'][0]}-{row['lines'][1]}: "
                     f"{row['instructions']} instructions a warp an iteration: {counts}")
    return "\n".join(lines)


def sass_instructions(sass: str) -> list:
    """The instruction lines of an nvdisasm listing, without their addresses."""
    return [re.sub(r"/\*[0-9a-f]+\*/", "", line).strip() for line in sass.splitlines()
            if _OPCODE.search(line)]


def _disassemble(kernel) -> str:
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        return subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True,
                              text=True, check=True).stdout


def write_sass(path: str, out_dir: str) -> None:
    """``sass_instructions`` of each recorded launch into out_dir/<index>_<kernel>.sass."""
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = _specs(path)
    listings = each_compiled(specs, "sm90", _sass_lines)
    for i, (spec, lines) in enumerate(zip(specs, listings)):
        (out / f"{i:03d}_{spec['name']}.sass").write_text("\n".join(lines) + "\n")
        print(f"{i:03d} {spec['name']}: {len(lines)} instructions")


def _sass_lines(spec, target: str) -> list:
    return sass_instructions(_disassemble(compile_for(spec, target)[0]))


class Target(NamedTuple):
    gpu: tuple  # Triton's GPUTarget (backend, arch, warp size)
    shared_bytes: int  # the most shared memory (LDS) one block may use
    nvidia: bool  # compiled with the overlap (PDL) and the persistent kernel's prefetch
    ptxas: tuple = ()  # (Triton's bundled ptxas for it, its --gpu-name): register counts
    # a named GPU's multiprocessors: (count, 32-bit registers, shared memory, threads) each
    multiprocessors: tuple = ()


# H100/H200 (this project's GPUs); B200, where the portable Triton path runs as it is (the
# sm90 CuTe DSL kernels are Hopper-only); MI355X, the declared AMD target (amd/gfx950), where
# the overlap is off (``overlap.enabled``): the same sources, no vendor-only intrinsic
TARGETS = {
    "sm90": Target(("cuda", 90, 32), 232448, True, ("ptxas", "sm_90a"),
                   (132, 65536, 233472, 2048)),  # an H200
    "sm100": Target(("cuda", 100, 32), 232448, True, ("ptxas-blackwell", "sm_100a"),
                    (148, 65536, 233472, 2048)),  # a B200
    "gfx950": Target(("hip", "gfx950", 64), 163840, False),
}


def compile_for(spec, target: str = "sm90") -> tuple:
    """(Triton's compiled kernel, its options) of one recorded launch, for a TARGETS GPU as its
    JIT would compile it."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as triton_compile

    fn = getattr(importlib.import_module(spec["module"]), spec["name"])
    constexprs, options = _gpu_constexprs(spec, TARGETS[target].nvidia)
    src = ASTSource(fn=fn, signature=spec["signature"], constexprs=constexprs,
                    attrs=_aligned_pointers(fn, spec))
    return triton_compile(src, target=GPUTarget(*TARGETS[target].gpu), options=options), options


def _aligned_pointers(fn, spec) -> dict:
    """Every pointer argument 16-byte aligned, as the GPU's JIT specializes torch's tensors:
    with it loads become asynchronous copies that a loop may pipeline through shared memory
    (a kernel that needs 24 KB compiled without it asked 290 KB on the H200); and every
    integer recorded as a multiple of 16 known as one, as the JIT specializes them (without
    it a mask against K keeps loads one element wide)."""
    divisible = set(spec.get("divisible", ()))
    return {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
            if spec["signature"].get(n, "constexpr").startswith("*") or n in divisible}


def _gpu_constexprs(spec, nvidia: bool = True) -> tuple:
    """The recorded compile-time constants and options as the GPU compiles them (off NVIDIA
    the overlap and the prefetch stay off, as recorded under the interpreter)."""
    constexprs = dict(spec["constexprs"])
    options = dict(spec["options"])
    if "INTERPRET" in constexprs:  # recorded under the interpreter: compile the GPU path
        constexprs["INTERPRET"] = False
    if not nvidia:
        return constexprs, options
    if "PDL" in constexprs:  # and with the overlap the GPU turns on (overlap.enabled)
        constexprs["PDL"] = True
        options["launch_pdl"] = True
    if "PF" in constexprs:  # the persistent layer's L2 prefetch, on for sm_90
        constexprs["PF"] = True
        options["launch_cooperative_grid"] = True
    return constexprs, options


def compile_all(path: str, target: str = "sm90") -> int:
    """Compile every recorded launch for the target, each refused as its launch would be
    where it asks more shared memory than a block may use; prints a line each and returns
    the failures."""
    specs = _specs(path)
    verdicts = each_compiled(specs, target, _compile_verdict)
    for line in verdicts:
        print(line)
    failures = sum(line.startswith("FAIL") for line in verdicts)
    import triton

    print(f"compiled {len(specs) - failures} of {len(specs)} for {target} with Triton "
          f"{triton.__version__}")
    return failures


def _compile_verdict(spec, target: str) -> str:
    limit = TARGETS[target].shared_bytes
    try:
        kernel, _ = compile_for(spec, target)
        if kernel.metadata.shared > limit:  # the launch would be refused
            raise RuntimeError(f"{kernel.metadata.shared} B of shared memory > {limit} "
                               f"per block on {target}")
        return f"ok   {spec['name']} {spec['constexprs']}"
    except Exception as exc:  # noqa: BLE001 - every failure is reported by name
        return f"FAIL {spec['name']} {spec['constexprs']}: {type(exc).__name__}: {exc}"


def _specs(path: str, name: str = "") -> list:
    """The recorded launches in path (of the kernel `name` when given)."""
    with open(path) as f:
        return [s for s in json.load(f) if not name or s["name"] == name]


def each_compiled(specs: list, target: str, work) -> list:
    """[work(spec, target) for spec in specs], in that order, in JOBS worker processes (forked:
    they share this process's imports and sys.path, the chosen Triton's included). Compiling
    is one core's work a kernel, so on CI's two cores the compile tests take about half as
    long. work must be a module-level function returning something picklable."""
    if JOBS <= 1 or len(specs) <= 1:
        return [work(spec, target) for spec in specs]
    import concurrent.futures
    import functools
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(
            min(JOBS, len(specs)), mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(functools.partial(work, target=target), specs))


def _use_checkout() -> None:
    """Import this checkout's overlay and extension, as test/conftest.py does for pytest."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    sys.path.insert(0, str(repo / "sgl-kernel-ext"))
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin in (None, "namespace"):
        sys.path.insert(0, str(repo / "python"))
    else:
        import sglang

        sglang.__path__.insert(0, str(repo / "python" / "sglang"))


if __name__ == "__main__":
    import importlib.util

    _use_checkout()
    mode, path = sys.argv[1], sys.argv[2]
    if mode in ("record", "record-real", "record-real-stages"):
        record(path, real=mode != "record", persistent_too=mode == "record-real")
    elif mode == "resources":
        resources(path)
    elif mode == "resident":
        resident(path, sys.argv[3] if len(sys.argv) > 3 else "sm90")
    elif mode == "loops":
        loops(path, sys.argv[3] if len(sys.argv) > 3 else "")
    elif mode == "sass":
        write_sass(path, sys.argv[3])
    elif mode == "compile":
        sys.exit(1 if compile_all(path, sys.argv[3] if len(sys.argv) > 3 else "sm90") else 0)
    else:
        sys.exit(f"unknown mode {mode!r}")
