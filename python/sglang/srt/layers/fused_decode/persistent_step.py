"""A FusedLayer step as one launch of the persistent layer kernel (sgl_kernel_ext.triton.persistent).

The same buffers, tilings and task bodies as the stage-kernel path in ``layer.py``; this file
only names every buffer and shape for the one launch. Per step the host work is building the
argument dict; nothing is allocated on the device and nothing synchronizes.
"""

from __future__ import annotations

import torch
import triton

from sgl_kernel_ext.triton import bf16_linear, fp8_linear, mla, moe, persistent
from sgl_kernel_ext.triton import indexer as ix_kernels

from . import layer as layer_mod
from .reference.batch import RowBatch

ROUTER_BLOCK_N = bf16_linear.BLOCK_N  # router / [wk; weights_proj] columns per task
SCORE_BLOCK = ix_kernels.SCORE_BLOCK  # index-cache positions per scores task
TOPK_BLOCK = 4096  # scores per step of the top-k's passes


def _ptr_or(t, fallback):
    return t if t is not None else fallback


def step(layer, hidden: torch.Tensor, residual, batch: RowBatch, topk_prev, m: int,
         reuse_topk: bool):
    """Run one step of m rows of `layer` (a FusedLayer); returns (y, residual, top-k)."""
    cfg, lw, a, b = layer.cfg, layer.lw, layer.lw.attn, layer.buf
    v = lambda name: layer._view(name, m)  # noqa: E731
    h, c, rope = cfg.hidden_size, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    nope, vd, ql = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.q_lora_rank
    nh = layer.heads
    indexer = layer.runs_indexer and not reuse_topk
    moe_layer = bool(layer.experts)
    pos, slots = batch.positions, batch.slot_table
    if hidden.dim() != 2 or not hidden.is_contiguous():
        raise ValueError("the persistent layer takes a contiguous [rows, hidden] bf16 input")
    res = v("residual")

    bn, groups, split_qkv = layer.tile_qkv_a
    qkv_tiles_a, qkv_tiles, qkv_chunk = fp8_linear.grid_shape(
        a.q_a.q.shape[0], a.kv_a.q.shape[0], h, split_qkv, bn, groups)
    _, _, split_qb = layer.tile_q_b
    nwqb = a.indexer.wq_b.q.shape[0] if indexer else 0
    qb_tiles_a, qb_tiles, qb_chunk = fp8_linear.grid_shape(
        a.q_b.q.shape[0], nwqb, ql, split_qb, bn, groups)
    _, _, split_o = layer.tile_o
    o_tiles, _, o_chunk = fp8_linear.grid_shape(h, 0, nh * vd, split_o, bn, groups)

    q, qi = v("q"), None
    if indexer:
        ix = a.indexer
        qi = v("q_index")
        nkw = layer.wk_proj.shape[0]
        kw_tiles = triton.cdiv(nkw, ROUTER_BLOCK_N)
        width = max(slots.shape[1], cfg.index_topk)
        if width > b["scores"].shape[1]:
            raise ValueError(f"context width {width} > the {b['scores'].shape[1]} built for")
        scores = b["scores"][:m, :width]
        topk = v("topk")
    else:
        if topk_prev is None:
            raise ValueError(f"layer {lw.layer_id} reuses the previous top-k but none was given")
        ix, nkw, kw_tiles, width, scores, topk = None, 1, 0, 1, q, topk_prev
    k = topk.shape[1]
    if topk.stride(1) != 1 or slots.stride(1) != 1:
        raise ValueError("top-k and token slots must be row-major")
    (_, _, slot_rows_ptr), slot_rows = mla.slot_args(
        slots, batch.slot_rows, pos, layer.kv_cache, *([layer.index_cache] if indexer else []))
    part_o, part_ml = layer._attention_parts(m)
    nsp = part_o.shape[1]
    block_t, blocks = mla.attention_step(k, nsp)

    mlp = lw.mlp
    if moe_layer:
        routed, shared, n_exp = mlp, mlp.shared, layer.experts
        router_tiles = triton.cdiv(n_exp, ROUTER_BLOCK_N)
        router_split = layer_mod.ROUTER_SPLIT
    else:
        routed = shared = mlp
        n_exp, router_tiles, router_split = 0, 0, 1
    gu_dq, gu_ds = moe.up_offsets(routed.gate.q, routed.gate.s, routed.up.q, routed.up.s)
    sgu_dq, sgu_ds = moe.up_offsets(shared.gate.q, shared.gate.s, shared.up.q, shared.up.s)
    act = v("act")
    n_slots, _, inter = act.shape
    dense = not layer.experts
    gu_bn, gu_groups, gu_split = moe.gate_up_tiling(m, dense)
    gu_parts = act
    if gu_split > 1:
        gu_parts = layer_mod._prefix(b["gu_parts"], gu_split, n_slots, m, 2, inter)
    gu_tiles = triton.cdiv(inter, gu_bn)
    gu_chunk = moe.gate_up_chunk(h, gu_split, gu_groups)
    down_bn = moe.down_shape(m, dense)[0]
    terms = v("terms")
    stack_stride = lambda t: t.stride(0) if t.dim() == 3 else 0  # noqa: E731
    kw_split = layer_mod.INDEX_KW_SPLIT

    n = dict(
        n_norm1=m, n_qkv_a=qkv_tiles * split_qkv, n_kw=kw_tiles * kw_split,
        n_latent=2 * m, n_q_b=qb_tiles * split_qb,
        n_prepare=m if indexer else 0,
        n_scores=m * triton.cdiv(width, SCORE_BLOCK) if indexer else 0,
        n_topk=m if indexer else 0,
        n_absorb=nh * triton.cdiv(c, mla.ABSORB_BLOCK_C), n_attn=m * nsp, n_combine=m * nh,
        n_absorb_v=nh * (vd // 128), n_o_proj=o_tiles * split_o, n_norm2=m,
        n_router=router_tiles * router_split, n_route=1 if moe_layer else 0,
        n_gate_up=gu_tiles * n_slots * gu_split,
        n_swiglu=n_slots * triton.cdiv(inter, moe.SWIGLU_BLOCK) if gu_split > 1 else 0,
        n_down=triton.cdiv(h, down_bn) * n_slots, n_sum=m * triton.cdiv(h, moe.SUM_BLOCK),
    )
    if not indexer:
        n["n_kw"] = 0
    x = v("x") if layer.runs_indexer else res
    wk_proj = layer.wk_proj if indexer else a.kv_b  # a bf16 stand-in: no kw tasks run
    args = dict(
        counters_ptr=b["counters"], M=m, pos_ptr=pos, slots_ptr=slots,
        stride_slots=slots.stride(0), slot_rows_ptr=slot_rows_ptr, inv_freq_ptr=layer.inv_freq,
        eps=float(cfg.rms_norm_eps),
        **n,
        hidden_ptr=hidden, res_in_ptr=_ptr_or(residual, res), in_norm_ptr=lw.input_norm,
        res_ptr=res, x_ptr=x, xq_ptr=v("xq"), xs_ptr=v("xs"), H=h,
        qa_w_ptr=a.q_a.q, qa_s_ptr=a.q_a.s, qa_ptr=v("qa"), NQA=a.q_a.q.shape[0],
        qkv_tiles_a=qkv_tiles_a, kva_w_ptr=a.kv_a.q, kva_s_ptr=a.kv_a.s, kva_ptr=v("kva"),
        NKVA=a.kv_a.q.shape[0], qkv_tiles=qkv_tiles, qkv_chunk=qkv_chunk,
        kw_w_ptr=wk_proj, kw_ptr=v("kw_parts") if indexer else q, NKW=nkw, kw_tiles=kw_tiles,
        kw_chunk=bf16_linear.chunk_cols(h, kw_split),
        qn_ptr=a.q_a_norm, kvn_ptr=a.kv_a_norm, cq_q_ptr=v("cq_q"), cq_s_ptr=v("cq_s"),
        kv_cache_ptr=layer.kv_cache, Q=ql,
        qb_w_ptr=a.q_b.q, qb_s_ptr=a.q_b.s, q_ptr=q, NQB=a.q_b.q.shape[0],
        qb_tiles_a=qb_tiles_a, wqb_w_ptr=ix.wq_b.q if indexer else a.q_b.q,
        wqb_s_ptr=ix.wq_b.s if indexer else a.q_b.s, qi_ptr=_ptr_or(qi, q),
        NWQB=max(nwqb, 1), qb_tiles=qb_tiles, qb_chunk=qb_chunk,
        ln_w_ptr=ix.k_norm_weight if indexer else lw.input_norm,
        ln_b_ptr=ix.k_norm_bias if indexer else lw.input_norm,
        ln_eps=float(cfg.index_k_norm_eps),
        index_cache_ptr=layer.index_cache if indexer else layer.kv_cache,
        q8_ptr=v("q8") if indexer else q, head_w_ptr=v("head_w") if indexer else q,
        head_scale=float(cfg.index_n_heads ** -0.5 * cfg.index_head_dim ** -0.5),
        scores_ptr=scores, stride_scores=scores.stride(0), width=width,
        topk_ptr=topk,
        stride_topk=topk.stride(0),
        kvb_ptr=a.kv_b, qcat_ptr=v("qcat"), NH=nh,
        sm_scale=float(cfg.softmax_scale), part_o_ptr=part_o, part_ml_ptr=part_ml, nsp=nsp,
        nblk=blocks, olat_ptr=v("olat"), oq_ptr=v("oq"), os_ptr=v("os"),
        o_w_ptr=a.o_proj.q, o_s_ptr=a.o_proj.s, y_attn_ptr=v("y_attn"), o_tiles=o_tiles,
        o_chunk=o_chunk, post_norm_ptr=lw.post_attention_norm, x2_ptr=v("x2"),
        x2q_ptr=v("x2q"), x2s_ptr=v("x2s"),
        router_w_ptr=mlp.router if moe_layer else a.kv_b,
        router_parts_ptr=v("router_parts") if moe_layer else q, E=n_exp,
        router_tiles=max(router_tiles, 1), router_chunk=bf16_linear.chunk_cols(h, router_split),
        bias_ptr=mlp.bias if moe_layer else q, route_scale=float(cfg.routed_scaling_factor),
        slot_expert_ptr=b["slot_expert"], slot_weight_ptr=v("slot_weight"),
        slot_rank_ptr=v("slot_rank"), num_slots_ptr=b["num_slots"],
        I=inter, gq_ptr=routed.gate.q, gs_ptr=routed.gate.s, uq_ptr=routed.up.q,
        us_ptr=routed.up.s, gu_q_stride=stack_stride(routed.gate.q),
        gu_s_stride=stack_stride(routed.gate.s), sgq_ptr=shared.gate.q, sgs_ptr=shared.gate.s,
        suq_ptr=shared.up.q, sus_ptr=shared.up.s, gu_dq=gu_dq, gu_ds=gu_ds, sgu_dq=sgu_dq,
        sgu_ds=sgu_ds, act_ptr=act, gu_parts_ptr=gu_parts,
        slots=n_slots, gu_tiles=gu_tiles, gu_chunk=gu_chunk,
        dq_ptr=routed.down.q, ds_ptr=routed.down.s, d_q_stride=stack_stride(routed.down.q),
        d_s_stride=stack_stride(routed.down.s), sdq_ptr=shared.down.q, sds_ptr=shared.down.s,
        terms_ptr=terms, down_tiles=triton.cdiv(h, down_bn), y_ptr=v("y"),
    )
    max_splits = mla.attention_splits(1, k)  # combine's block covers every step's chunks
    const = dict(
        BLOCK_M=fp8_linear.block_m(m), BLOCK_HID=triton.next_power_of_2(h),
        HAS_RES=residual is not None, INDEXER=indexer, MOE=moe_layer, BN=bn, GROUPS=groups,
        SPLIT_QKV=split_qkv, SPLIT_QB=split_qb, SPLIT_O=split_o, KW_SPLIT=kw_split,
        KW_BN=ROUTER_BLOCK_N, BLOCK_Q=triton.next_power_of_2(ql),
        C=c, BLOCK_C=triton.next_power_of_2(c), HALF_R=rope // 2, NI=cfg.index_n_heads,
        DI=cfg.index_head_dim, BLOCK_HI=max(16, cfg.index_n_heads), SCORE_BL=SCORE_BLOCK,
        TOPK=cfg.index_topk, TOPK_BLOCK=TOPK_BLOCK,
        TOPK_OUT=min(1024, triton.next_power_of_2(cfg.index_topk)),
        NOPE=nope, ROPE=rope, V=vd, BLOCK_D=triton.next_power_of_2(nope),
        ABSORB_BC=mla.ABSORB_BLOCK_C, BLOCK_HEADS=max(16, triton.next_power_of_2(nh)),
        BLOCK_T=block_t, ATTN_AHEAD=mla.ATTN_AHEAD,
        ATTN_PARTS=mla.attention_parts(c, triton.cdiv(blocks, nsp)),
        ATTN_QK_CHAINS=mla.ATTN_QK_CHAINS, BLOCK_S=triton.next_power_of_2(max(nsp, max_splits)),
        ROUTER_SPLIT=router_split, ROUTER_BN=ROUTER_BLOCK_N,
        BLOCK_E=triton.next_power_of_2(max(n_exp, 1)), TOPK_E=cfg.num_experts_per_tok,
        RENORM=bool(cfg.norm_topk_prob), GU_BN=gu_bn, GU_GROUPS=gu_groups, GU_SPLIT=gu_split,
        BLOCK_I=moe.SWIGLU_BLOCK, DOWN_BN=down_bn, TERMS=terms.shape[1],
        SUM_BLOCK=moe.SUM_BLOCK, SWAP=fp8_linear.swap(bn),
        DOWN_SWAP=moe.down_swap(down_bn, False),
        GU_SWAP=fp8_linear.swap(gu_bn, False, moe.GATE_UP_SWAP),
        GU_STACK=moe.gate_up_stack(gu_bn, False), ROWS=slot_rows,
    )
    persistent.launch(args, const, hidden.device)
    return v("y"), res, topk
